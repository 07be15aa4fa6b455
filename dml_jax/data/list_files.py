"""Datasets given as a list file (CSV / TSV / whitespace: ``path,label[,split]``) and the
Hotels-50K style list whose test images are retrieved from the training set (formats in
``image_lists``)."""

from __future__ import annotations

import os

from absl import logging
import numpy as np

from dml_jax.data import augment
from dml_jax.data import image_files
from dml_jax.data import splits as splits_lib
from dml_jax.data.splits import Split


HOTELS_SPLITS = ("train", "test")


def load_image_list(*, path: str, root: str = "", delimiter: str = "",
                    has_header: bool | None = None, train_split: str | None = "train",
                    train_classes: int | float | None = None, image_size: int = 224,
                    resize_size: int = 256, channels: int = 3, mean=augment.IMAGENET_MEAN,
                    std=augment.IMAGENET_STD, check_files: bool = True,
                    num_threads: int | None = None, name: str = "") -> dict[str, Split]:
  """A dataset from a list file with columns ``path,label[,split]`` (module docstring).

  * With a split column: one ``Split`` per distinct value (rows in file order); ``labels``
    number the classes as in "Shared label spaces" (module docstring), ``label_sets['class']``
    keeps the original label.
  * Without one: a class-disjoint ``'train'`` / ``'test'`` split: the sorted distinct labels
    ``c_0 < c_1 < ...`` (``C`` of them), the first ``K`` to train, the rest to test, where
    ``K = train_classes`` if it is an int, ``max(1, floor(train_classes * C))`` if it is a
    float in ``(0, 1]``, and ``floor(C / 2)`` (at least 1) by default. ``labels`` = rank among
    the split's classes; ``label_sets['class']`` = the original label. ``K = C`` returns only
    ``'train'``.

  The first row is a header when ``has_header`` is True, or, when it is None, when its label
  field is not an integer and its path field has no image extension (``path,label,split``).

  Args:
    path: the list file.
    root: the folder the image paths are relative to ('' = the list file's folder).
    delimiter: one character; '' picks ``,`` for ``.csv`` and tab for ``.tsv`` / ``.txt``;
      ``' '`` splits on runs of whitespace. Fields are stripped of surrounding spaces.
    has_header: whether the first row is a header (None: detect it).
    train_split: the split that training uses; with a split column it must occur in it
      (None skips the check, e.g. for an evaluation-only list).
    train_classes: the train class count / fraction for lists without a split column.
    image_size, resize_size, channels, mean, std: the ``ImageOptions`` of the images.
    check_files: verify that every listed image exists.
    num_threads: decoding threads of ``LazyImages``.
    name: the dataset part of the split names ('' = the list file's name without extension).

  Returns:
    ``dict[str, Split]``: the split column's splits, or ``{'train', 'test'}``.

  Raises:
    FileNotFoundError: the list file or ``root`` is missing, or listed images are missing
      (the first one, its line, and how many).
    ValueError: a malformed list, naming the file, the line and the value: a wrong number of
      columns, an empty path or split, a label that is not an integer (or outside int32), an
      empty list, ``train_split`` absent from the split column, a bad ``train_classes``.
  """
  options = image_files.image_options(image_size, resize_size, channels, mean, std)
  list_path, root = image_files.list_and_root(path, root)
  rows = image_files.read_list(list_path, delimiter=delimiter, has_header=has_header)
  name = name or os.path.splitext(os.path.basename(list_path))[0]
  paths = [image_files.join(root, r[1]) for r in rows]
  if check_files:
    image_files.check_files(paths, [r[0] for r in rows], list_path)
  labels = np.asarray([r[2] for r in rows], np.int64)
  has_split = rows[0][3] is not None
  if not has_split:
    return image_files.class_disjoint(paths, labels, train_classes, options, num_threads, name,
                           f"the list {list_path!r}")
  if train_classes is not None:
    raise ValueError(f"train_classes={train_classes!r} applies to lists without a split "
                     f"column; {list_path!r} has one (its splits are used as they are).")
  split_of = np.asarray([r[3] for r in rows])
  names = list(dict.fromkeys(split_of.tolist()))  # first-occurrence order
  if train_split is not None and train_split not in names:
    raise ValueError(f"{list_path!r}: the split column has no {train_split!r} rows (splits "
                     f"found: {', '.join(names)}); name the training rows {train_split!r} or "
                     "pass train_split=None for a list without training rows.")
  groups = {s: np.flatnonzero(split_of == s) for s in names}
  values = {s: labels[idx] for s, idx in groups.items()}
  primary, unshared = splits_lib.label_spaces(values)
  for a, b in unshared:
    logging.warning("%s: splits %r and %r share classes but neither holds all classes of the "
                    "other, so their primary labels are numbered separately; compare them "
                    "with the 'class' label set (e.g. '%s:class@%s').", list_path, a, b, a, b)
  return {s: image_files.lazy_split([paths[i] for i in idx], primary[s], {"class": values[s]}, options,
                    num_threads, f"{name}:{s}")
          for s, idx in groups.items()}


def load_hotels(*, path: str, root: str = "", delimiter: str = "",
                has_header: bool | None = None, image_size: int = 224, resize_size: int = 256,
                channels: int = 3, mean=augment.IMAGENET_MEAN, std=augment.IMAGENET_STD,
                check_files: bool = True, num_threads: int | None = None,
                name: str = "hotels") -> dict[str, Split]:
  """Hotels-50K style retrieval: test images retrieved from the training set.

  A thin wrapper of ``load_image_list``: the list (``path,hotel_id,split``) must have a split
  column whose values are ``train`` and ``test`` (both present). The test hotels and the
  training hotels share one label space (module docstring: the smaller set's hotels first),
  so the protocol ``'test@train'`` compares hotels correctly; ``'test'`` is retrieval within
  the test set. Both splits carry ``label_sets['hotel']`` (= ``label_sets['class']``, the
  hotel id of the file).

  Args:
    path, root, delimiter, has_header, check_files, num_threads: as ``load_image_list``.
    image_size, resize_size, channels, mean, std: the ``ImageOptions`` of the images.
    name: the dataset part of the split names.

  Returns:
    ``{'train': Split, 'test': Split}``.

  Raises:
    FileNotFoundError: as ``load_image_list``.
    ValueError: as ``load_image_list``; also a list without a split column, a split other
      than train / test (naming the file, line and value), a missing train or test split,
      and test hotels that cannot share the training label space (no common hotel, or both
      sides with hotels the other lacks).
  """
  list_path, _ = image_files.list_and_root(path, root)
  rows = image_files.read_list(list_path, delimiter=delimiter, has_header=has_header)
  if rows[0][3] is None:
    raise ValueError(f"{list_path}:{rows[0][0]}: a Hotels list needs a third column 'split' "
                     f"({' or '.join(HOTELS_SPLITS)}), got 2 columns.")
  for lineno, _, _, split in rows:
    if split not in HOTELS_SPLITS:
      raise ValueError(f"{list_path}:{lineno}: unknown split {split!r}; a Hotels list has "
                       f"only {' and '.join(HOTELS_SPLITS)}.")
  found = {r[3] for r in rows}
  if found != set(HOTELS_SPLITS):
    raise ValueError(f"{list_path!r} has no {', '.join(sorted(set(HOTELS_SPLITS) - found))} "
                     "rows; Hotels retrieval needs both train and test images.")
  labels = {s: np.asarray([r[2] for r in rows if r[3] == s], np.int64) for s in HOTELS_SPLITS}
  _, unshared = splits_lib.label_spaces(labels)
  splits_lib.require_shared(unshared, "test", "train", labels, f"The Hotels list {list_path!r}",
                  "hotels")
  splits = load_image_list(path=list_path, root=root, delimiter=delimiter,
                           has_header=has_header, train_split="train", image_size=image_size,
                           resize_size=resize_size, channels=channels, mean=mean, std=std,
                           check_files=check_files, num_threads=num_threads, name=name)
  return {s: Split(images=sp.images, labels=sp.labels,
                   label_sets={"class": sp.label_sets["class"],
                               "hotel": sp.label_sets["class"]}, name=sp.name)
          for s, sp in splits.items()}
