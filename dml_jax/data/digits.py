"""The embedded digits dataset (no download); ``Split`` and ``class_split`` live in ``splits``
(importable from here too).

The digits data are scikit-learn's ``load_digits``: 1797 real 8x8 handwritten digits
(about 180 per digit) shipped with scikit-learn. ``load_digits_evenodd`` reproduces the
MNIST even/odd experiment of the EPS paper (section 5.1) at this small scale: the model is
trained on digits 0-5 with even/odd labels only and evaluated on the unseen digits 6-9 by
digit.

The registry of all datasets is ``data.datasets.DATASETS``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import numpy as np

from dml_jax.data.splits import Split, check_classes, class_split  # pylint: disable=unused-import


def check_digits(train_digits: Sequence[int], test_digits: Sequence[int], *,
                 parity: bool) -> tuple[list[int], list[int]]:
  """Validates the digit lists of a digits protocol and returns them as lists of ints.

  Raises:
    ValueError: a digit outside 0..9, an empty or duplicated list, overlapping lists, or
      (``parity``: even/odd training) train digits of a single parity.
  """
  lists = []
  for what, digits in (("train_digits", train_digits), ("test_digits", test_digits)):
    values = check_classes(digits, what)
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
    digits = check_classes(digits, f"{split}_digits")
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
