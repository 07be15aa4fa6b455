"""What the image-file datasets share (``inshop``, ``list_files``, ``image_folders``): image
options, ``Split`` over lazily decoded files, reading list files, checking that the listed files
exist, and the class-disjoint split of lists without a split column. The formats are described in
``image_lists``."""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Mapping, Sequence

import numpy as np

from dml_jax.data.images import DatasetNotPreparedError, ImageOptions, LazyImages, not_there
from dml_jax.data.splits import Split


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
INT32 = np.iinfo(np.int32)


def image_options(image_size, resize_size, channels, mean, std) -> ImageOptions:
  return ImageOptions(image_size=image_size, resize_size=resize_size, channels=channels,
                      mean=mean, std=std)


def lazy_split(paths: list[str], labels: np.ndarray, label_sets: Mapping[str, np.ndarray],
           options: ImageOptions, num_threads: int | None, name: str) -> Split:
  """A ``Split`` whose images are ``LazyImages`` over ``paths`` (its own records list)."""
  images = LazyImages(list(paths), options, num_threads=num_threads, name=name)
  return Split(images=images, labels=labels, label_sets=label_sets, name=name)


def is_int(text: str) -> bool:
  return re.fullmatch(r"[+-]?\d+", text) is not None


def is_image(path: str) -> bool:
  return path.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(path)


def join(root: str, path: str) -> str:
  """The absolute, normalised path of ``path`` relative to ``root`` (absolute kept)."""
  return os.path.normpath(os.path.join(root, os.path.expanduser(path)))


def list_and_root(path: str, root: str) -> tuple[str, str]:
  """The absolute list file and image root; FileNotFoundError if either is missing."""
  list_path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isfile(list_path):
    raise DatasetNotPreparedError(f"Image list file {list_path!r} "
                                  f"{not_there(list_path, 'file')}.")
  root = os.path.abspath(os.path.expanduser(root)) if root else os.path.dirname(list_path)
  if not os.path.isdir(root):
    raise FileNotFoundError(f"Image root folder {root!r} (the folder the paths of "
                            f"{list_path!r} are relative to) {not_there(root)}.")
  return list_path, root


def read_list(list_path: str, *, delimiter: str,
               has_header: bool | None) -> list[tuple[int, str, int, str | None]]:
  """Rows ``(line number, path, label, split or None)`` of a ``path,label[,split]`` list."""
  if not delimiter:
    ext = os.path.splitext(list_path)[1].lower()
    if ext == ".csv":
      delimiter = ","
    elif ext in (".tsv", ".txt"):
      delimiter = "\t"
    else:
      raise ValueError(f"Cannot tell the delimiter of {list_path!r} from its extension "
                       f"{ext!r} (.csv: ',', .tsv / .txt: tab); pass delimiter=.")
  if len(delimiter) != 1:
    raise ValueError(f"delimiter must be one character, got {delimiter!r}.")
  shown = {"\t": "tab", " ": "whitespace"}.get(delimiter, repr(delimiter))
  rows, num_columns, first = [], None, True
  with open(list_path, encoding="utf-8-sig", newline="") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      if delimiter == " ":
        fields = line.split()
      else:
        fields = [x.strip() for x in next(csv.reader([line], delimiter=delimiter))]
      where = f"{list_path}:{lineno}"
      if first:
        first = False
        header = has_header
        if header is None:
          header = (len(fields) >= 2 and not is_int(fields[1]) and
                    not fields[0].lower().endswith(IMAGE_EXTENSIONS))
        if header:
          continue
      if num_columns is None:
        if len(fields) not in (2, 3):
          raise ValueError(f"{where}: expected 2 or 3 {shown}-separated columns "
                           f"'path,label[,split]', got {len(fields)}: {line.strip()!r}.")
        num_columns = len(fields)
      elif len(fields) != num_columns:
        raise ValueError(f"{where}: expected {num_columns} {shown}-separated columns like the "
                         f"first row, got {len(fields)}: {line.strip()!r}.")
      image, label = fields[0], fields[1]
      split = fields[2] if num_columns == 3 else None
      if not image:
        raise ValueError(f"{where}: the path is empty.")
      if not is_int(label):
        raise ValueError(f"{where}: label {label!r} is not an integer.")
      if not INT32.min <= int(label) <= INT32.max:
        raise ValueError(f"{where}: label {label!r} does not fit in int32.")
      if split is not None and not split:
        raise ValueError(f"{where}: the split is empty.")
      rows.append((lineno, image, int(label), split))
  if not rows:
    raise ValueError(f"Image list {list_path!r} has no rows.")
  return rows


def check_files(paths: Sequence[str], lines: Sequence[int], list_path: str,
                 hint: str = "") -> None:
  """FileNotFoundError naming the first missing file, its line, and the number missing."""
  missing = [k for k, p in enumerate(paths) if not os.path.isfile(p)]
  if missing:
    k = missing[0]
    raise FileNotFoundError(f"{len(missing)} of the {len(paths)} images listed in "
                            f"{list_path!r} are missing; the first is {paths[k]!r} (line "
                            f"{lines[k]}).{hint}")


def num_train_classes(train_classes, num_classes: int, where: str) -> int:
  """``K`` of a class-disjoint split: an int count, a float fraction, None = half."""
  if train_classes is None:
    return max(1, num_classes // 2)
  if isinstance(train_classes, (bool, np.bool_)):
    raise ValueError(f"train_classes must be an int count or a float fraction, got "
                     f"{train_classes!r}.")
  if isinstance(train_classes, (int, np.integer)):
    if not 1 <= train_classes <= num_classes:
      raise ValueError(f"train_classes={train_classes} must be in 1..{num_classes} (the "
                       f"number of classes of {where}).")
    return int(train_classes)
  if isinstance(train_classes, (float, np.floating)):
    if not 0 < train_classes <= 1:
      raise ValueError(f"train_classes={train_classes} as a fraction must be in (0, 1]; pass "
                       "an int for a class count.")
    return max(1, math.floor(round(train_classes * num_classes, 6)))
  raise ValueError(f"train_classes must be an int count or a float fraction, got "
                   f"{train_classes!r}.")


def class_disjoint(paths: list[str], labels: np.ndarray, train_classes, options, num_threads,
                    name: str, where: str) -> dict[str, Split]:
  """The first ``K`` sorted classes -> ``'train'``, the rest -> ``'test'`` (file order)."""
  classes = np.unique(labels)
  k = num_train_classes(train_classes, len(classes), where)
  out = {}
  for split, chosen in (("train", classes[:k]), ("test", classes[k:])):
    if len(chosen) == 0:
      continue
    rows = np.flatnonzero(np.isin(labels, chosen))
    out[split] = lazy_split([paths[i] for i in rows], np.searchsorted(chosen, labels[rows]),
                        {"class": labels[rows]}, options, num_threads, f"{name}:{split}")
  return out
