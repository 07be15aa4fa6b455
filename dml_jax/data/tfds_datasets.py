"""The standard DML benchmarks from TensorFlow Datasets, read with ``tfds.data_source``.

``tfds.data_source`` reads a dataset prepared in the ArrayRecord format with random access
and no TensorFlow at run time; images are decoded here (Pillow, JPEG draft mode) when a batch
needs them, so nothing is held in memory but the labels. ``TFDS_DATASETS`` names the TFDS
builder of each benchmark; the builder's splits are the *parts* from which
``split_protocols.make_splits`` makes the DML splits (docs/datasets.md; the table
is in ``split_protocols``), the same function the readers of the official files
(``official``) use:

=================  =========================  ===========================================
name               TFDS builder               parts
=================  =========================  ===========================================
``cub``            ``caltech_birds2011``      train, test
``cars196``        ``cars196``                train, test
``sop``            ``stanford_online_         train, test
                   products``
``omniglot``       ``omniglot``               train (background), test (evaluation)
``mnist_evenodd``  ``mnist``                  train, test
``mnist``          ``mnist``                  train, test
``flowers102``     ``oxford_flowers102``      train, validation, test
=================  =========================  ===========================================

Every split keeps the protocol's label feature in ``label_sets['class']``.

A dataset that is not prepared raises ``DatasetNotPreparedError`` with the command that
prepares it. Preparing (once, on a machine with internet) needs TensorFlow, which training
does not: ``pip install tensorflow-cpu tensorflow-datasets`` then
``tfds build caltech_birds2011 --file_format=array_record [--data_dir=DIR]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import Sequence

import numpy as np

from dml_jax.data import split_protocols
from dml_jax.data.images import DatasetNotPreparedError, FieldView


@dataclasses.dataclass(frozen=True)
class TfdsSpec:
  """The TFDS builder of one benchmark (its split protocol: ``split_protocols.PROTOCOLS``).

  Attributes:
    builder: the TFDS builder name.
    splits: the TFDS split names that exist (validated here: TFDS's mock accepts any).
    load_splits: the TFDS splits loaded, the protocol's parts (default: all of ``splits``).
    skip_decoding: image-like features left encoded when the labels are read.
    manual: extra preparation advice for the error message and the README.
  """

  builder: str
  splits: tuple[str, ...]
  skip_decoding: tuple[str, ...] = ("image",)
  load_splits: tuple[str, ...] = ()
  manual: str = ""

  def __post_init__(self):
    if not self.load_splits:
      object.__setattr__(self, "load_splits", self.splits)


TFDS_DATASETS: dict[str, TfdsSpec] = {
    "cub": TfdsSpec("caltech_birds2011", ("train", "test"),
                    skip_decoding=("image", "segmentation_mask")),
    "cars196": TfdsSpec(
        "cars196", ("train", "test"),
        manual="The Stanford Cars download URL used by the TFDS builder has been offline; if "
        "`tfds build` fails to download, get the official files from a mirror and read them "
        "with --config.data.options.root=DIR (docs/datasets.md 'Datasets from "
        "their official files'), or use the image-list loader (data.name='image_list')."),
    "sop": TfdsSpec("stanford_online_products", ("train", "test")),
    "omniglot": TfdsSpec("omniglot", ("train", "test", "small1", "small2"),
                         load_splits=("train", "test")),
    "mnist_evenodd": TfdsSpec("mnist", ("train", "test")),
    "mnist": TfdsSpec("mnist", ("train", "test")),
    "flowers102": TfdsSpec("oxford_flowers102", ("train", "validation", "test")),
}


def prepare_command(builder: str, data_dir: str = "") -> str:
  """The shell command that prepares ``builder`` for ``tfds.data_source``."""
  target = f" --data_dir={data_dir}" if data_dir else ""
  return (f"pip install tensorflow-cpu tensorflow-datasets && "
          f"tfds build {builder} --file_format=array_record{target}")


def open_source(builder: str, split: str, *, data_dir: str = "", known_splits: Sequence[str],
                skip_decoding: Sequence[str] = ()):
  """``tfds.data_source(builder, split)`` without downloading; clear errors otherwise.

  Raises:
    ValueError: ``split`` is not one of ``known_splits``.
    DatasetNotPreparedError: the dataset is not prepared (in the ArrayRecord format) under
      ``data_dir``; the message has the command that prepares it.
  """
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  if split not in known_splits:
    raise ValueError(f"TFDS dataset {builder!r} has no split {split!r}; its splits are "
                     f"{', '.join(known_splits)}.")
  decoders = {f: tfds.decode.SkipDecoding() for f in skip_decoding} or None
  try:
    return tfds.data_source(builder, split=split, data_dir=data_dir or None, download=False,
                            decoders=decoders)
  except Exception as e:  # TFDS raises several types (NotImplementedError, AssertionError...)
    where = data_dir or "the default TFDS data_dir (~/tensorflow_datasets or $TFDS_DATA_DIR)"
    raise DatasetNotPreparedError(
        f"TFDS dataset {builder!r} (split {split!r}) is not prepared in the ArrayRecord format "
        f"under {where}. Prepare it once with:\n  {prepare_command(builder, data_dir)}\n"
        f"{TFDS_MANUAL.get(builder, '')}"
        f"(TFDS said: {type(e).__name__}: {' '.join(str(e).split())[:400]})") from e


TFDS_MANUAL = {spec.builder: spec.manual + "\n" for spec in TFDS_DATASETS.values() if spec.manual}


def _open_split(spec: TfdsSpec, split: str, data_dir: str):
  """The split's data source with images left encoded where TFDS allows it.

  TFDS's test mock (``tfds.testing.mock_data``) can only produce *decoded* images without
  TensorFlow installed (it encodes its random examples), so when reading an encoded record
  fails the source is reopened with decoding (real prepared data does not take this path;
  if it did, records would only be decoded by TFDS instead of by us).
  """
  source = open_source(spec.builder, split, data_dir=data_dir, known_splits=spec.splits,
                       skip_decoding=spec.skip_decoding)
  if len(source) == 0:
    raise ValueError(f"TFDS dataset {spec.builder!r} split {split!r} is empty.")
  try:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
      source[0]  # TFDS prints a "Failed to import TensorFlow" banner before raising
  except Exception:  # pylint: disable=broad-except  (the mock's encoding needs TensorFlow)
    source = open_source(spec.builder, split, data_dir=data_dir, known_splits=spec.splits)
  return source


def _read_labels(source, keys: Sequence[str]) -> dict[str, np.ndarray]:
  """The integer features ``keys`` of every record, ``{key: int64 [N]}``. One record at a
  time: on a prepared JPEG dataset this measured 66 us a record (SOP's 120k: ~8 s), faster
  than ArrayRecord's batched ``__getitems__`` (115 us) since the images stay encoded."""
  values = {k: np.empty(len(source), np.int64) for k in keys}
  for i in range(len(source)):
    record = source[i]
    for k in keys:
      values[k][i] = record[k]
  return values


def read_parts(name: str, *, data_dir: str = "") -> dict[str, split_protocols.Part]:
  """The TFDS splits of ``TFDS_DATASETS[name]`` as protocol parts: records
  ``FieldView(source, 'image')`` and the protocol's features (``split_protocols.PROTOCOLS``).

  Raises:
    ValueError: unknown name (listing the valid ones).
    DatasetNotPreparedError: the dataset is not prepared (message: the command to run).
  """
  if name not in TFDS_DATASETS:
    raise ValueError(f"Unknown TFDS dataset {name!r}; valid: {', '.join(TFDS_DATASETS)}.")
  spec = TFDS_DATASETS[name]
  keys = split_protocols.PROTOCOLS[name].features
  parts = {}
  for split in spec.load_splits:
    source = _open_split(spec, split, data_dir)
    parts[split] = split_protocols.Part(FieldView(source, "image"), _read_labels(source, keys))
  return parts
