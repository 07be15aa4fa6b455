"""The ``Split`` container and the embedded digits dataset (no download).

A ``Split`` is what every part of dml_jax consumes: images ``[N, H, W, C]`` float32, the
primary labels ``[N]`` int32 (contiguous ``0..C-1``; the labels used for training or for
the primary evaluation) and further label views in ``label_sets`` (e.g. ``'digit'`` and
``'parity'``), so one split can be evaluated under several labelings.

The digits data are scikit-learn's ``load_digits``: 1797 real 8x8 handwritten digits
(about 180 per digit) shipped with scikit-learn. ``load_digits_evenodd`` reproduces the
MNIST even/odd experiment of the EPS paper (section 5.1) at this small scale: the model is
trained on digits 0-5 with even/odd labels only and evaluated on the unseen digits 6-9 by
digit.

The registry of all datasets is ``data.datasets.DATASETS``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
from collections.abc import Mapping, Sequence

import numpy as np

from dml_jax.data.images import LazyImages, take


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
  """One split of a dataset.

  Attributes:
    images: float32 ``[N, H, W, C]``: a numpy array, or a ``LazyImages`` view (real image
      datasets: decoded and transformed on access, see ``data.images``).
    labels: int32 ``[N]``, contiguous class ids ``0..C-1`` (every id in the range occurs).
      The labels used for training (train split) or the primary evaluation (test split).
    label_sets: other label views, ``name -> int32 [N]`` (e.g. ``{'digit': ..,
      'parity': ..}``); any integer values. Stored read-only.
    name: a readable name used in error messages and logs, e.g. ``'digits_evenodd:train'``.

  ``__post_init__`` converts ``images`` to float32 and the labels to int32, and raises
  ``ValueError`` (naming the split) for a non-rank-4 image array, an empty split, label
  arrays of the wrong rank, length or dtype, or non-contiguous ``labels``.
  """

  images: np.ndarray
  labels: np.ndarray
  label_sets: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
  name: str = "split"

  def __post_init__(self):
    lazy = isinstance(self.images, LazyImages)
    images = self.images if lazy else np.asarray(self.images)
    if images.ndim != 4:
      raise ValueError(f"Split {self.name!r}: images must have rank 4 [N, H, W, C], got "
                       f"shape {images.shape}.")
    n = images.shape[0]
    if n == 0:
      raise ValueError(f"Split {self.name!r} is empty (0 images).")
    if not lazy and not (np.issubdtype(images.dtype, np.floating) or
                         np.issubdtype(images.dtype, np.integer)):
      raise ValueError(f"Split {self.name!r}: images must be numeric, got dtype {images.dtype}.")
    labels = _as_int32_labels(self.labels, n, f"Split {self.name!r}: labels")
    classes = np.unique(labels)
    if classes[0] != 0 or classes[-1] != len(classes) - 1:
      raise ValueError(f"Split {self.name!r}: labels must be contiguous ids 0..C-1, got the "
                       f"classes {classes.tolist()[:20]}{' ...' if len(classes) > 20 else ''}.")
    label_sets = {}
    for key, values in dict(self.label_sets).items():
      if not isinstance(key, str):
        raise ValueError(f"Split {self.name!r}: label_sets keys must be strings, got {key!r}.")
      label_sets[key] = _as_int32_labels(values, n, f"Split {self.name!r}: label_sets[{key!r}]")
    if not lazy:
      images = images.astype(np.float32, copy=False)
    object.__setattr__(self, "images", images)
    object.__setattr__(self, "labels", labels)
    object.__setattr__(self, "label_sets", types.MappingProxyType(label_sets))

  def __len__(self) -> int:
    return self.images.shape[0]

  @property
  def num_classes(self) -> int:
    """Number of classes ``C`` of ``labels``."""
    return int(self.labels.max()) + 1

  def __repr__(self) -> str:
    return (f"Split(name={self.name!r}, images={self.images.shape}, "
            f"num_classes={self.num_classes}, label_sets={sorted(self.label_sets)})")


def _as_int32_labels(values, n: int, what: str) -> np.ndarray:
  """Validates an integer label array of shape ``[n]`` and returns it as int32."""
  values = np.asarray(values)
  if values.ndim != 1 or values.shape[0] != n:
    raise ValueError(f"{what} must have shape [{n}] (one per image), got {values.shape}.")
  if not np.issubdtype(values.dtype, np.integer):
    raise ValueError(f"{what} must be integers, got dtype {values.dtype}.")
  if values.size and (values.min() < np.iinfo(np.int32).min or
                      values.max() > np.iinfo(np.int32).max):
    raise ValueError(f"{what} do not fit in int32.")
  return values.astype(np.int32)


def class_split(images: np.ndarray, labels: np.ndarray, *, train_classes: Sequence[int],
                test_classes: Sequence[int], min_per_class: int = 2,
                name: str = "dataset") -> dict[str, Split]:
  """Class-disjoint train/test split (zero-shot protocol: test classes are never trained on).

  Example ``i`` goes to ``'train'`` if ``labels[i]`` is in ``train_classes``, to ``'test'``
  if it is in ``test_classes``, and nowhere otherwise; the original order is kept. Each
  split's ``labels`` are the rank of the original label in the *sorted* class list of that
  split (``sorted(train_classes)[k] -> k``), and ``label_sets['class']`` keeps the original
  label.

  Args:
    images: ``[N, H, W, C]`` array or ``LazyImages`` (kept lazy).
    labels: int ``[N]`` original class ids.
    train_classes: the class ids of the train split (non-empty, no duplicates).
    test_classes: the class ids of the test split (non-empty, disjoint from train).
    min_per_class: every requested class must have at least this many examples (2: a
      retrieval query needs another example of its class).
    name: prefix of the split names (``'{name}:train'``, ``'{name}:test'``).

  Returns:
    ``{'train': Split, 'test': Split}``.

  Raises:
    ValueError: an empty or duplicated class list, overlapping classes, or a class with
      fewer than ``min_per_class`` examples (naming the class).
  """
  if not isinstance(images, LazyImages):
    images = np.asarray(images)
  labels = np.asarray(labels)
  if images.ndim != 4:
    raise ValueError(f"images must have rank 4 [N, H, W, C], got shape {images.shape}.")
  if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
    raise ValueError(f"labels must have shape [{images.shape[0]}], got {labels.shape}.")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
  train_classes = _check_classes(train_classes, "train_classes")
  test_classes = _check_classes(test_classes, "test_classes")
  overlap = sorted(set(train_classes) & set(test_classes))
  if overlap:
    raise ValueError(f"train_classes and test_classes overlap in {overlap}; a class-disjoint "
                     "split needs disjoint class lists.")
  counts = {c: int(np.sum(labels == c)) for c in train_classes + test_classes}
  too_small = {c: k for c, k in counts.items() if k < min_per_class}
  if too_small:
    raise ValueError(f"classes with fewer than min_per_class={min_per_class} examples "
                     f"(class: count): {too_small}.")
  splits = {}
  for split, classes in (("train", train_classes), ("test", test_classes)):
    classes = np.asarray(sorted(classes))
    keep = np.isin(labels, classes)
    original = labels[keep]
    splits[split] = Split(images=take(images, np.flatnonzero(keep)),
                          labels=np.searchsorted(classes, original),
                          label_sets={"class": original}, name=f"{name}:{split}")
  return splits


def _check_classes(classes: Sequence[int], what: str) -> list[int]:
  """Validates a list of distinct integer class ids and returns it as a list of ints."""
  try:
    values = [int(c) for c in classes]
  except (TypeError, ValueError):
    raise ValueError(f"{what} must be a sequence of integers, got {classes!r}.") from None
  if any(v != c for v, c in zip(values, classes)):
    raise ValueError(f"{what} must be integers, got {classes!r}.")
  if not values:
    raise ValueError(f"{what} is empty; the split would contain no examples.")
  duplicates = sorted({v for v in values if values.count(v) > 1})
  if duplicates:
    raise ValueError(f"{what} lists {duplicates} more than once.")
  return values


def check_digits(train_digits: Sequence[int], test_digits: Sequence[int], *,
                 parity: bool) -> tuple[list[int], list[int]]:
  """Validates the digit lists of a digits protocol and returns them as lists of ints.

  Raises:
    ValueError: a digit outside 0..9, an empty or duplicated list, overlapping lists, or
      (``parity``: even/odd training) train digits of a single parity.
  """
  lists = []
  for what, digits in (("train_digits", train_digits), ("test_digits", test_digits)):
    values = _check_classes(digits, what)
    bad = [d for d in values if not 0 <= d <= 9]
    if bad:
      raise ValueError(f"{what} contains {bad}; digits must be in 0..9.")
    lists.append(values)
  overlap = sorted(set(lists[0]) & set(lists[1]))
  if overlap:
    raise ValueError(f"train_digits and test_digits overlap in {overlap}; the protocol "
                     "evaluates on unseen digits.")
  if parity and len({d % 2 for d in lists[0]}) < 2:
    raise ValueError(f"train_digits {tuple(train_digits)} are all of one parity; even/odd "
                     "training needs both even and odd digits.")
  return lists[0], lists[1]


@functools.lru_cache(maxsize=1)
def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
  """scikit-learn's digits: images float32 ``[1797, 8, 8, 1]`` in [0, 1], labels int32."""
  from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
  data = load_digits()
  images = (data.images / 16.0).astype(np.float32)[..., None]
  images.setflags(write=False)
  labels = data.target.astype(np.int32)
  labels.setflags(write=False)
  return images, labels


def load_digits_evenodd(*, train_digits: Sequence[int] = (0, 1, 2, 3, 4, 5),
                        test_digits: Sequence[int] = (6, 7, 8, 9)) -> dict[str, Split]:
  """The even/odd digits experiment (EPS paper, section 5.1) on scikit-learn's 8x8 digits.

  Images are ``[N, 8, 8, 1]`` float32 scaled to [0, 1] (raw values are 0..16), in
  scikit-learn's order.

  * ``'train'``: the examples of ``train_digits``; ``labels`` = parity (0 even, 1 odd).
  * ``'test'``: the examples of ``test_digits``; ``labels`` = the digit's rank in
    ``sorted(test_digits)``, so the default 6, 7, 8, 9 map to 0, 1, 2, 3.

  Both splits carry ``label_sets['digit']`` (the raw digit 0..9) and
  ``label_sets['parity']`` (digit % 2), so the train split can also be evaluated by digit
  (the class-collapse measurement) and the test split by parity.

  Args:
    train_digits: digits used for training; must contain an even and an odd digit.
    test_digits: unseen digits used for evaluation; disjoint from ``train_digits``.

  Returns:
    ``{'train': Split, 'test': Split}`` (about 1080 and 714 examples with the defaults).

  Raises:
    ValueError: a digit outside 0..9, an empty or duplicated digit list, overlapping train
      and test digits, or train digits of a single parity.
  """
  check_digits(train_digits, test_digits, parity=True)
  images, digits = _sklearn_digits()
  splits = class_split(images, digits, train_classes=train_digits, test_classes=test_digits,
                       name="digits_evenodd")
  out = {}
  for split, s in splits.items():
    digit = s.label_sets["class"]
    parity = digit % 2
    out[split] = Split(images=s.images, labels=parity if split == "train" else s.labels,
                       label_sets={"digit": digit, "parity": parity}, name=s.name)
  return out


def load_digits_split(*, train_digits: Sequence[int] = (0, 1, 2, 3, 4, 5, 6, 7),
                      test_digits: Sequence[int] = (8, 9)) -> dict[str, Split]:
  """All-digit class-disjoint protocol on scikit-learn's 8x8 digits: labels = the digit.

  For sweeps that need more training classes than the even/odd protocol's two (e.g. the
  EPHN paper's group-size sweep, Fig. 4, or the label-noise paper's experiments).

  * ``'train'``: the examples of ``train_digits``; ``labels`` = rank of the digit in
    ``sorted(train_digits)``.
  * ``'test'``: the examples of ``test_digits``; ``labels`` = rank in ``sorted(test_digits)``.

  Both splits carry ``label_sets['digit']`` (the raw digit 0..9) and
  ``label_sets['parity']`` (digit % 2).

  Args:
    train_digits: digits used for training (default 0-7, 8 classes).
    test_digits: unseen digits used for evaluation (default 8, 9); disjoint from train.

  Returns:
    ``{'train': Split, 'test': Split}``.

  Raises:
    ValueError: a digit outside 0..9, an empty or duplicated list, or overlapping lists.
  """
  check_digits(train_digits, test_digits, parity=False)
  images, digits = _sklearn_digits()
  splits = class_split(images, digits, train_classes=train_digits, test_classes=test_digits,
                       name="digits")
  return {split: Split(images=s.images, labels=s.labels,
                       label_sets={"digit": s.label_sets["class"],
                                   "parity": s.label_sets["class"] % 2}, name=s.name)
          for split, s in splits.items()}


def write_digit_images(root: str, *, train_digits: Sequence[int] = (0, 1, 2, 3, 4, 5),
                       test_digits: Sequence[int] = (6, 7, 8, 9), size: int = 32) -> dict:
  """Writes scikit-learn's digits as PNG files ``root/<split>/<digit>/<index>.png``.

  A real image-file dataset without a download, for trying the image pipeline
  (``data.name='image_folder'``: decoding, augmentation, grain) on a CPU: ``'train'`` holds
  ``train_digits``, ``'test'`` holds ``test_digits``; images are grey, upscaled from 8x8 to
  ``size`` x ``size`` (nearest neighbour). Returns ``{split: number of files}``.
  """
  from PIL import Image  # pylint: disable=import-outside-toplevel
  images, labels = _sklearn_digits()
  counts = {}
  for split, digits in (("train", train_digits), ("test", test_digits)):
    digits = _check_classes(digits, f"{split}_digits")
    counts[split] = 0
    for d in digits:
      folder = os.path.join(root, split, str(d))
      os.makedirs(folder, exist_ok=True)
      for i in np.flatnonzero(labels == d):
        pixels = np.round(images[i, :, :, 0] * 255).astype(np.uint8)
        Image.fromarray(pixels).resize((size, size), Image.NEAREST).save(
            os.path.join(folder, f"{i:04d}.png"))
        counts[split] += 1
  return counts
