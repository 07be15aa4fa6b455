"""The split protocols of the standard benchmarks, shared by every route that reads them.

A benchmark is read (from TFDS, ``tfds_datasets``, or from its official files, ``official``)
into *parts*: its published splits, each a random-access sequence of image records and the
integer features of every record (named as the TFDS features, e.g. ``'label'``,
``'class_id'``, ``'alphabet'``). ``make_splits`` turns the parts into the DML splits below
(docs/datasets.md), so both routes give the same splits, labels, label sets and names:

=================  ===========================  ============================================
name               parts (features)             DML splits
=================  ===========================  ============================================
``cub``            any (``label`` 0-199)        all parts merged; classes 0-99 train,
                                                100-199 test
``cars196``        train, test (``label``       merged; classes 0-97 train, 98-195 test
                   0-195)
``sop``            train, test (``class_id``,   the official train / test, by ``class_id``;
                   ``super_class_id``)          ``label_sets['super_class']``
``omniglot``       train = background, test =   train by ``alphabet``; test by character;
                   evaluation (``alphabet``     ``label_sets`` ``'alphabet'``, ``'character'``
                   0-49, ``label`` 0-1622)
``mnist_evenodd``  train, test (``label`` =     train = train digits 0-5 by parity; test =
                   digit)                       test digits 6-9 by digit; val = test digits
                                                0-5 by digit; ``label_sets`` ``'digit'``,
                                                ``'parity'``
``mnist``          train, test (``label``)      train = train digits 0-7, test = test digits
                                                8-9, val = test digits 0-7, all by digit
``flowers102``     train, validation, test      merged; classes 0-50 train, 51-101 test
                   (``label`` 0-101)
=================  ===========================  ============================================

Primary ``labels`` are the rank of the original value among the split's classes; every split
keeps the protocol's label feature in ``label_sets['class']`` (the digit for MNIST).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dml_jax.data import digits as digits_lib
from dml_jax.data.splits import Split


@dataclasses.dataclass(frozen=True)
class Part:
  """One published split of a benchmark.

  Attributes:
    records: random-access image records (``records[i]``: a uint8 array, encoded bytes or a
      file path; see ``augment``), ``N`` of them.
    values: ``feature -> int [N]``, the integer features of the records.
  """

  records: Sequence
  values: Mapping[str, np.ndarray]

  def __len__(self) -> int:
    return len(self.records)


@dataclasses.dataclass(frozen=True)
class Protocol:
  """How a benchmark's parts become DML splits (module docstring).

  Attributes:
    label: the feature of the train split's primary labels (and ``label_sets['class']``).
    extra_labels: ``label_set name -> feature`` kept in ``Split.label_sets``.
    test_label: the feature of the other splits' primary labels ('' = ``label``).
    train_classes, test_classes: ``(first, last)`` inclusive ranges of ``label`` of a
      class-disjoint split of all parts merged; ``None`` keeps the parts as they are.
    digits: ``'parity'`` or ``'digit'``: the MNIST protocols (``digit_splits``); the default
      digit lists are ``train_digits`` and ``test_digits``.
  """

  label: str = "label"
  extra_labels: tuple[tuple[str, str], ...] = ()
  test_label: str = ""
  train_classes: tuple[int, int] | None = None
  test_classes: tuple[int, int] | None = None
  digits: str = ""
  train_digits: tuple[int, ...] = ()
  test_digits: tuple[int, ...] = ()

  @property
  def features(self) -> tuple[str, ...]:
    """The features a reader must provide."""
    return tuple(dict.fromkeys([self.label] + [f for _, f in self.extra_labels]
                               + ([self.test_label] if self.test_label else [])))


PROTOCOLS: dict[str, Protocol] = {
    "cub": Protocol(train_classes=(0, 99), test_classes=(100, 199)),
    "cars196": Protocol(train_classes=(0, 97), test_classes=(98, 195)),
    "sop": Protocol(label="class_id", extra_labels=(("super_class", "super_class_id"),)),
    "omniglot": Protocol(label="alphabet", extra_labels=(("alphabet", "alphabet"),
                                                         ("character", "label")),
                         test_label="label"),
    "mnist_evenodd": Protocol(digits="parity", train_digits=(0, 1, 2, 3, 4, 5),
                              test_digits=(6, 7, 8, 9)),
    "mnist": Protocol(digits="digit", train_digits=(0, 1, 2, 3, 4, 5, 6, 7),
                      test_digits=(8, 9)),
    "flowers102": Protocol(train_classes=(0, 50), test_classes=(51, 101)),
}

# records, split name -> the split's images (e.g. a ``LazyImages``)
MakeImages = Callable[[Sequence, str], object]


class Concat(Sequence):
  """Random-access concatenation of sequences (picklable if the parts are)."""

  def __init__(self, parts: Sequence[Sequence]):
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


def make_splits(name: str, parts: Mapping[str, Part], make_images: MakeImages, *,
                train_digits: Sequence[int] | None = None,
                test_digits: Sequence[int] | None = None) -> dict[str, Split]:
  """The DML splits of benchmark ``name`` (``PROTOCOLS[name]``) from its ``parts``.

  Args:
    name: a key of ``PROTOCOLS``.
    parts: ``part name -> Part`` (the names the protocol expects, module docstring).
    make_images: ``(records, split name) -> images`` of a split; rows are taken with
      ``images.take(rows)``.
    train_digits, test_digits: the MNIST protocols' digit lists (None: the protocol's).

  Returns:
    ``dict[str, Split]`` named ``'{name}:{split}'``.

  Raises:
    ValueError: an unknown name, a missing part or feature, digit lists given to a non-MNIST
      protocol or invalid ones, or an empty split.
  """
  if name not in PROTOCOLS:
    raise ValueError(f"Unknown benchmark {name!r}; valid: {', '.join(PROTOCOLS)}.")
  protocol = PROTOCOLS[name]
  for part_name, part in parts.items():
    missing = [f for f in protocol.features if f not in part.values]
    if missing:
      raise ValueError(f"{name}: part {part_name!r} lacks the features {missing}.")
  if protocol.digits:
    return digit_splits(name, parts, make_images, by_parity=protocol.digits == "parity",
                        train_digits=protocol.train_digits if train_digits is None
                        else train_digits,
                        test_digits=protocol.test_digits if test_digits is None
                        else test_digits)
  check_digit_options(name, train_digits, test_digits)
  keys = protocol.features
  if protocol.train_classes is not None:  # class-disjoint split of all parts merged
    records = Concat([p.records for p in parts.values()])
    merged = {k: np.concatenate([np.asarray(p.values[k]) for p in parts.values()])
              for k in keys}
    selected = {}
    for split, (first, last) in (("train", protocol.train_classes),
                                 ("test", protocol.test_classes)):
      label = merged[protocol.label]
      rows = np.flatnonzero((label >= first) & (label <= last))
      selected[split] = (make_images(records, split).take(rows),
                         {k: merged[k][rows] for k in keys})
  else:
    selected = {split: (make_images(p.records, split), p.values) for split, p in parts.items()}
  out = {}
  for split, (images, values) in selected.items():
    primary = protocol.label if split == "train" else protocol.test_label or protocol.label
    if len(images) == 0:
      raise ValueError(f"{name}:{split} has no examples; is the dataset complete?")
    _, labels = np.unique(values[primary], return_inverse=True)
    label_sets = {"class": values[protocol.label]}
    label_sets.update({label_set: values[f] for label_set, f in protocol.extra_labels})
    out[split] = Split(images=images, labels=labels.reshape(-1), label_sets=label_sets,
                       name=f"{name}:{split}")
  return out


def check_digit_options(name: str, train_digits, test_digits) -> None:
  """ValueError if digit lists are given for benchmark ``name`` that has no digits."""
  if name not in PROTOCOLS:
    raise ValueError(f"Unknown benchmark {name!r}; valid: {', '.join(PROTOCOLS)}.")
  if not PROTOCOLS[name].digits and (train_digits is not None or test_digits is not None):
    raise ValueError(f"train_digits / test_digits apply to mnist and mnist_evenodd, not "
                     f"{name!r}.")


def digit_splits(name: str, parts: Mapping[str, Part], make_images: MakeImages, *,
                 by_parity: bool, train_digits: Sequence[int],
                 test_digits: Sequence[int]) -> dict[str, Split]:
  """The MNIST protocols from the parts ``'train'`` and ``'test'`` (feature ``'label'`` =
  the digit).

  * ``'train'``: the train part's images of ``train_digits``; labels = parity (0 even, 1 odd)
    if ``by_parity``, else the rank of the digit in ``sorted(train_digits)``.
  * ``'test'``: the test part's images of ``test_digits``; labels = rank of the digit.
  * ``'val'``: the test part's images of ``train_digits`` (unseen images of the training
    digits, EPS Table 1's "train digits"); labels = rank of the digit.

  Every split has ``label_sets`` ``'digit'``, ``'parity'`` and ``'class'`` (= digit).

  Raises:
    ValueError: a missing part, or invalid digit lists (``digits.check_digits``).
  """
  train_digits, test_digits = digits_lib.check_digits(train_digits, test_digits,
                                                      parity=by_parity)
  missing = [p for p in ("train", "test") if p not in parts]
  if missing:
    raise ValueError(f"{name}: the parts {missing} are missing; MNIST needs train and test.")
  out = {}
  for split, part, keep, parity in (("train", "train", train_digits, by_parity),
                                    ("test", "test", test_digits, False),
                                    ("val", "test", train_digits, False)):
    digit = np.asarray(parts[part].values["label"])
    rows = np.flatnonzero(np.isin(digit, keep))
    d = digit[rows]
    if len(rows) == 0:
      raise ValueError(f"{name}:{split} has no image of the digits {list(keep)}.")
    _, labels = np.unique(d % 2 if parity else d, return_inverse=True)
    images = make_images(parts[part].records, split).take(rows)
    out[split] = Split(images=images, labels=labels.reshape(-1),
                       label_sets={"digit": d, "parity": d % 2, "class": d},
                       name=f"{name}:{split}")
  return out
