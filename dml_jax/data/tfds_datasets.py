"""The standard DML benchmarks from TensorFlow Datasets, read with ``tfds.data_source``.

``tfds.data_source`` reads a dataset prepared in the ArrayRecord format with random access
and no TensorFlow at run time; images are decoded here (Pillow, JPEG draft mode) when a batch
needs them, so nothing is held in memory but the labels. The split protocols
(DESIGN.md section 4) are in ``TFDS_DATASETS``:

=================  =======================  ==================================================
name               TFDS builder             splits
=================  =======================  ==================================================
``cub``            ``caltech_birds2011``    TFDS train+test merged; classes 0-99 train,
                                            100-199 test
``cars196``        ``cars196``              merged; classes 0-97 train, 98-195 test
``sop``            ``stanford_online_       official train / test (``class_id``, relabelled);
                   products``               ``label_sets['super_class']``
``omniglot``       ``omniglot``             train = background set (30 alphabets) labelled by
                                            ``alphabet``; test = evaluation set (20
                                            alphabets) labelled by character; both carry
                                            ``label_sets`` ``'alphabet'`` and ``'character'``
``mnist_evenodd``  ``mnist``                train = TFDS train digits 0-5 labelled even/odd;
                                            test = TFDS test digits 6-9 by digit; val = TFDS
                                            test digits 0-5 by digit (the "train digits" of
                                            EPS Table 1); ``label_sets`` ``'digit'``,
                                            ``'parity'``
``flowers102``     ``oxford_flowers102``    train+validation+test merged; classes 0-50 train,
                                            51-101 test (the papers do not state a split;
                                            this is the usual zero-shot halving)
=================  =======================  ==================================================

Every split keeps the TFDS label in ``label_sets['class']``.

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

from dml_jax.data import augment
from dml_jax.data.digits import Split
from dml_jax.data.images import DatasetNotPreparedError, FieldView, ImageOptions, LazyImages


@dataclasses.dataclass(frozen=True)
class TfdsSpec:
  """How one TFDS builder becomes DML splits.

  Attributes:
    builder: the TFDS builder name.
    splits: the TFDS split names that exist (validated here: TFDS's mock accepts any).
    label: the feature holding the class id.
    extra_labels: ``label_set name -> feature`` kept in ``Split.label_sets``.
    test_label: the feature of the primary labels of the non-train splits ('' = ``label``).
    load_splits: the TFDS splits loaded (default: all of ``splits``).
    train_classes, test_classes: ``(first, last)`` inclusive class ranges of a class-disjoint
      split over all ``splits`` merged; ``None`` keeps the TFDS splits as they are.
    skip_decoding: image-like features left encoded when the labels are read.
    manual: extra preparation advice for the error message and the README.
  """

  builder: str
  splits: tuple[str, ...]
  label: str = "label"
  extra_labels: tuple[tuple[str, str], ...] = ()
  train_classes: tuple[int, int] | None = None
  test_classes: tuple[int, int] | None = None
  skip_decoding: tuple[str, ...] = ("image",)
  test_label: str = ""
  load_splits: tuple[str, ...] = ()
  manual: str = ""

  def __post_init__(self):
    if not self.load_splits:
      object.__setattr__(self, "load_splits", self.splits)


TFDS_DATASETS: dict[str, TfdsSpec] = {
    "cub": TfdsSpec("caltech_birds2011", ("train", "test"), train_classes=(0, 99),
                    test_classes=(100, 199), skip_decoding=("image", "segmentation_mask")),
    "cars196": TfdsSpec(
        "cars196", ("train", "test"), train_classes=(0, 97), test_classes=(98, 195),
        manual="The Stanford Cars download URL used by the TFDS builder has been offline; if "
        "`tfds build` fails to download, use the image-list loader (data.name='image_list') "
        "with a CSV of path,label for the 16,185 images from a mirror."),
    "sop": TfdsSpec("stanford_online_products", ("train", "test"), label="class_id",
                    extra_labels=(("super_class", "super_class_id"),)),
    "omniglot": TfdsSpec("omniglot", ("train", "test", "small1", "small2"), label="alphabet",
                         extra_labels=(("alphabet", "alphabet"), ("character", "label")),
                         test_label="label", load_splits=("train", "test")),
    "mnist_evenodd": TfdsSpec("mnist", ("train", "test")),
    "flowers102": TfdsSpec("oxford_flowers102", ("train", "validation", "test"),
                           train_classes=(0, 50), test_classes=(51, 101)),
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


class _Concat(Sequence):
  """Random-access concatenation of sequences (picklable)."""

  def __init__(self, parts: Sequence):
    self.parts = list(parts)
    self.offsets = np.cumsum([0] + [len(p) for p in self.parts])

  def __len__(self) -> int:
    return int(self.offsets[-1])

  def __getitem__(self, i):
    i = int(i)
    if not 0 <= i < len(self):
      raise IndexError(i)
    k = int(np.searchsorted(self.offsets, i, side="right")) - 1
    return self.parts[k][i - int(self.offsets[k])]


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


def load_tfds(name: str, *, data_dir: str = "", image_size: int = 224, resize_size: int = 256,
              channels: int = 3, mean=augment.IMAGENET_MEAN, std=augment.IMAGENET_STD,
              num_threads: int | None = None) -> dict[str, Split]:
  """Loads ``TFDS_DATASETS[name]`` as lazily decoded splits (see the module docstring).

  Args:
    name: a key of ``TFDS_DATASETS``.
    data_dir: TFDS data directory ('' = TFDS's default).
    image_size, resize_size, channels, mean, std: the ``ImageOptions`` of the images.
    num_threads: decoding threads of ``LazyImages``.

  Returns:
    ``dict[str, Split]`` with ``LazyImages`` images.

  Raises:
    ValueError: unknown name (listing the valid ones) or bad image options.
    DatasetNotPreparedError: the dataset is not prepared (message: the command to run).
  """
  if name not in TFDS_DATASETS:
    raise ValueError(f"Unknown TFDS dataset {name!r}; valid: {', '.join(TFDS_DATASETS)}.")
  spec = TFDS_DATASETS[name]
  options = ImageOptions(image_size=image_size, resize_size=resize_size, channels=channels,
                         mean=mean, std=std)
  keys = [spec.label] + [feature for _, feature in spec.extra_labels]

  def lazy(records, split_name):
    return LazyImages(records, options, num_threads=num_threads, name=f"{name}:{split_name}")

  if name == "mnist_evenodd":
    return _mnist_evenodd(spec, data_dir, lazy)
  sources = {split: _open_split(spec, split, data_dir) for split in spec.load_splits}
  values = {split: _read_labels(src, keys) for split, src in sources.items()}
  if spec.train_classes is not None:  # class-disjoint split of all TFDS splits merged
    records = _Concat([FieldView(src, "image") for src in sources.values()])
    merged = {k: np.concatenate([v[k] for v in values.values()]) for k in keys}
    parts = {}
    for split, (first, last) in (("train", spec.train_classes), ("test", spec.test_classes)):
      rows = np.flatnonzero((merged[spec.label] >= first) & (merged[spec.label] <= last))
      parts[split] = (lazy(records, split).take(rows), {k: merged[k][rows] for k in keys})
  else:
    parts = {split: (lazy(FieldView(src, "image"), split), values[split])
             for split, src in sources.items()}
  out = {}
  for split, (images, v) in parts.items():
    primary = spec.label if split == "train" else spec.test_label or spec.label
    if len(images) == 0:
      raise ValueError(f"{name}:{split} has no examples; is the TFDS dataset complete?")
    _, labels = np.unique(v[primary], return_inverse=True)
    label_sets = {"class": v[spec.label]}
    label_sets.update({label_set: v[feature] for label_set, feature in spec.extra_labels})
    out[split] = Split(images=images, labels=labels.reshape(-1), label_sets=label_sets,
                       name=f"{name}:{split}")
  return out


def _mnist_evenodd(spec: TfdsSpec, data_dir: str, lazy) -> dict[str, Split]:
  train_src = _open_split(spec, "train", data_dir)
  test_src = _open_split(spec, "test", data_dir)
  train_digits = _read_labels(train_src, ["label"])["label"]
  test_digits = _read_labels(test_src, ["label"])["label"]
  out = {}
  for split, src, digits, keep_digits, by_parity in (
      ("train", train_src, train_digits, range(0, 6), True),
      ("test", test_src, test_digits, range(6, 10), False),
      ("val", test_src, test_digits, range(0, 6), False)):
    rows = np.flatnonzero(np.isin(digits, list(keep_digits)))
    d = digits[rows]
    _, labels = np.unique(d % 2 if by_parity else d, return_inverse=True)
    images = lazy(FieldView(src, "image"), split).take(rows)
    out[split] = Split(images=images, labels=labels,
                       label_sets={"digit": d, "parity": d % 2, "class": d},
                       name=f"mnist_evenodd:{split}")
  return out
