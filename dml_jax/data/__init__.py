"""Datasets (``Split``, loaders, registry), batch samplers and the input pipeline."""

from dml_jax.data.datasets import DATASETS, IMAGE_DATASETS, load
from dml_jax.data.digits import load_digits_evenodd, load_digits_split
from dml_jax.data.splits import Split, class_split
from dml_jax.data.images import ImageOptions, LazyImages, take
from dml_jax.data.samplers import EPOCH_MODES, SMALL_CLASS_MODES, NPerClassSampler
from dml_jax.data.images import DatasetNotPreparedError

__all__ = ["DATASETS", "DatasetNotPreparedError", "EPOCH_MODES", "IMAGE_DATASETS", "ImageOptions",
           "LazyImages", "NPerClassSampler", "SMALL_CLASS_MODES", "Split", "class_split", "load",
           "load_digits_evenodd", "load_digits_split", "take"]
