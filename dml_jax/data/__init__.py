"""Datasets (``Split``, loaders, registry) and batch samplers."""

from dml_jax.data.digits import (DATASETS, Split, class_split, load, load_digits_evenodd,
                                 load_digits_split)
from dml_jax.data.samplers import SMALL_CLASS_MODES, NPerClassSampler

__all__ = ["DATASETS", "NPerClassSampler", "SMALL_CLASS_MODES", "Split", "class_split", "load",
           "load_digits_evenodd", "load_digits_split"]
