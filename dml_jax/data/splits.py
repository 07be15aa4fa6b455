"""Splits: the ``Split`` container every part of dml_jax consumes, class-disjoint splitting,
and the label spaces that splits share.

A ``Split`` holds images ``[N, H, W, C]`` (an array, ``LazyImages`` or ``DecodedImages``), the
primary labels ``[N]`` int32 (contiguous ``0..C-1``; the labels used for training or for the
primary evaluation) and further label views in ``label_sets`` (e.g. ``'digit'`` and
``'parity'``), so one split can be evaluated under several labelings.

Shared label spaces. The evaluation protocol ``'query@gallery'`` (``evaluation.protocols``) compares the *primary*
labels of two splits, so those must mean the same class on both sides. Whenever the class
sets of splits that share classes are nested (each contained in the next bigger one: In-Shop
query and gallery, Hotels test and train, a ``val`` of training classes), the loaders give
them one label space: classes are numbered in the order "classes of the smallest split
(sorted by original id), then the classes the next bigger split adds (sorted), ...", so every
split's labels are a prefix ``0..C-1`` of that numbering and equal labels are equal classes
across those splits. When all such splits have the same classes (the official In-Shop
query / gallery) this is the rank in the sorted union. Splits with disjoint classes (the usual
class-disjoint train / test) each number their classes from 0: their primary labels are not
comparable, and ``'test:class@train'`` compares original ids. Splits that overlap without
nesting cannot share contiguous labels; a generic list then logs a warning (use
``':class'`` protocols), In-Shop and Hotels raise ``ValueError``.
``label_spaces`` numbers the classes of a loader's splits so; ``check_shared_label_space``
refuses, at evaluation time, a ``query@gallery`` protocol whose splits number their classes
separately.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence

import numpy as np

from dml_jax.data.images import is_image_view, take


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
  """One split of a dataset.

  Attributes:
    images: float32 ``[N, H, W, C]``: a numpy array, or a ``LazyImages`` view (real image
      datasets: decoded and transformed on access, see ``data.images``) or a
      ``DecodedImages`` view (the evaluation cache's decoded pixels, ``data.eval_cache``).
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
    lazy = is_image_view(self.images)
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


def relabel(split: Split, label_set: str, *, key: str = "label_set") -> Split:
  """``split`` with its primary labels taken from ``label_sets[label_set]`` (ranked to
  ``0..C-1``), e.g. Omniglot's training alphabets by ``'character'`` (train by letter);
  ``label_sets`` and images unchanged. ``''`` returns ``split`` itself.

  Args:
    split: any split.
    label_set: ``''`` or a key of ``split.label_sets``.
    key: the name of the setting in messages (e.g. ``'config.data.train_label_set'``).

  Returns:
    A ``Split`` of the same images whose ``labels`` int32 ``[N]`` are the label set's ranks.

  Raises:
    ValueError: ``label_set`` is not a string or not a label set of ``split``.
  """
  if not isinstance(label_set, str):
    raise ValueError(f"{key} must be a label set's name (a string), got {label_set!r}.")
  if not label_set:
    return split
  if label_set not in split.label_sets:
    have = ", ".join(sorted(split.label_sets)) or "none"
    raise ValueError(f"{key}={label_set!r} is not a label set of {split.name!r}; it has: "
                     f"{have}.")
  _, labels = np.unique(split.label_sets[label_set], return_inverse=True)
  return Split(images=split.images, labels=labels.reshape(-1), label_sets=split.label_sets,
               name=split.name)


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
    images: ``[N, H, W, C]`` array, ``LazyImages`` or ``DecodedImages`` (kept a view).
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
  if not is_image_view(images):
    images = np.asarray(images)
  labels = np.asarray(labels)
  if images.ndim != 4:
    raise ValueError(f"images must have rank 4 [N, H, W, C], got shape {images.shape}.")
  if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
    raise ValueError(f"labels must have shape [{images.shape[0]}], got {labels.shape}.")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
  train_classes = check_classes(train_classes, "train_classes")
  test_classes = check_classes(test_classes, "test_classes")
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


def check_classes(classes: Sequence[int], what: str) -> list[int]:
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


def label_spaces(values: Mapping[str, np.ndarray]
                  ) -> tuple[dict[str, np.ndarray], list[tuple[str, str]]]:
  """Primary labels of each split (module docstring, "Shared label spaces").

  Splits are grouped by shared classes (connected components of "has a class in common").
  In a group whose class sets are nested, classes are numbered smallest set first (sorted
  original ids within each added part), one numbering for the whole group; otherwise each
  split of the group ranks its own sorted classes.

  Args:
    values: ``split -> int [N_split]`` original class ids.

  Returns:
    ``(labels, unshared)``: ``split -> int [N_split]`` contiguous labels, and the pairs of
    splits that share classes but got separate numberings.
  """
  names = list(values)
  sets = {s: set(np.unique(values[s]).tolist()) for s in names}
  group = {s: s for s in names}

  def find(s):
    while group[s] != s:
      s = group[s]
    return s

  for i, a in enumerate(names):
    for b in names[i + 1:]:
      if sets[a] & sets[b]:
        group[find(a)] = find(b)
  labels, unshared = {}, []
  for g in dict.fromkeys(find(s) for s in names):
    members = sorted((s for s in names if find(s) == g), key=lambda s: (len(sets[s]), s))
    nested = all(sets[a] <= sets[b] for a, b in zip(members, members[1:]))
    if nested:
      order, seen = [], set()
      for s in members:
        order += sorted(sets[s] - seen)
        seen |= sets[s]
      rank = {c: k for k, c in enumerate(order)}
      for s in members:
        labels[s] = np.asarray([rank[c] for c in values[s].tolist()], np.int64)
    else:
      for s in members:
        labels[s] = np.searchsorted(np.unique(values[s]), values[s])
      unshared += [(a, b) for i, a in enumerate(members) for b in members[i + 1:]
                   if sets[a] & sets[b]]
  return labels, unshared


def require_shared(unshared: Sequence[tuple[str, str]], query: str, gallery: str,
                    values: Mapping[str, np.ndarray], what: str, kind: str) -> None:
  """ValueError unless ``query`` and ``gallery`` got one label space (``label_spaces``)."""
  q, g = set(values[query].tolist()), set(values[gallery].tolist())
  if not q & g:
    raise ValueError(f"{what}: no {kind} occurs in both {query!r} and {gallery!r}; "
                     f"'{query}@{gallery}' retrieval would have nothing to find.")
  if (query, gallery) in unshared or (gallery, query) in unshared:
    only_q, only_g = sorted(q - g), sorted(g - q)
    raise ValueError(f"{what}: {len(only_q)} {kind} occur only in {query!r} (e.g. "
                     f"{only_q[0]}) and {len(only_g)} only in {gallery!r} (e.g. {only_g[0]}), "
                     f"so '{query}@{gallery}' cannot compare contiguous labels; one side's "
                     f"{kind} must include all of the other's.")


def relabelling(split) -> dict | None:
  """``{primary label: original class}`` when ``labels`` relabel ``label_sets['class']``
  one to one, else ``None`` (no ``'class'`` set, or labels that group classes)."""
  if "class" not in split.label_sets:
    return None
  pairs = np.unique(np.stack([split.labels, split.label_sets["class"]]), axis=1)
  if len(np.unique(pairs[0])) != pairs.shape[1] or len(np.unique(pairs[1])) != pairs.shape[1]:
    return None
  return dict(zip(pairs[0].tolist(), pairs[1].tolist()))


def check_shared_label_space(protocol: str, query, gallery) -> None:
  """A query@gallery protocol compares primary labels: they must name the same classes on
  both sides (e.g. In-Shop query / gallery), not two separate numberings."""
  a, b = relabelling(query), relabelling(gallery)
  if a is None or b is None:
    return
  clash = [k for k in a.keys() & b.keys() if a[k] != b[k]]
  if clash:
    k = clash[0]
    raise ValueError(
        f"Evaluation protocol {protocol!r}: label {k} is class {a[k]} in {query.name!r} but "
        f"class {b[k]} in {gallery.name!r} ({len(clash)} such labels): the two splits number "
        "their classes separately. Compare the original classes with a label set, e.g. "
        f"{protocol.split('@')[0]}:class@{protocol.split('@')[1]}.")
