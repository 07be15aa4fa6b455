"""Image-list datasets: In-Shop, Hotels-50K style lists, CSV / TSV lists and class folders.

Every loader returns ``dict[str, Split]`` whose ``images`` are ``LazyImages`` over the
*absolute file paths* of the split's rows (``images.records[i]`` is the file of row ``i``;
decoding happens on access or in the training pipeline). Each split's ``labels`` are
contiguous ``0..C-1`` (``Split`` requires it) and the original ids are kept in
``label_sets['class']`` (plus a dataset-specific alias: ``'item'`` for In-Shop, ``'hotel'``
for Hotels).

Shared label spaces across splits
---------------------------------
The evaluation protocol ``'query@gallery'`` (``evaluation.protocols``) compares the *primary*
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

Formats
-------
``load_inshop`` -- the DeepFashion In-shop Clothes Retrieval Benchmark (``Img/img.zip``
unzipped into ``root`` so that ``root/img/...`` exists, and ``Eval/list_eval_partition.txt``
copied to ``root``). The partition file: line 1 the number of images, line 2 the header,
then whitespace-separated ``image_name item_id evaluation_status``::

    52712
    image_name item_id evaluation_status
    img/WOMEN/Dresses/id_00000002/02_1_front.jpg   id_00000002   train
    img/WOMEN/Dresses/id_00000080/01_1_front.jpg   id_00000080   query
    img/WOMEN/Dresses/id_00000080/01_2_side.jpg    id_00000080   gallery

-> ``{'train', 'query', 'gallery'}``, ``label_sets['item'] = label_sets['class'] = 80`` for
``id_00000080``; evaluate with ``eval.splits=('query@gallery',)``.

``load_image_list`` -- a CSV (``.csv``: ``,``), TSV (``.tsv`` / ``.txt``: tab) or any
``delimiter`` (``' '``: runs of whitespace) with columns ``path,label[,split]``; ``label``
an integer, ``path`` relative to ``root`` (default: the list file's folder) or absolute::

    path,label,split
    birds/001.jpg,0,train
    birds/002.jpg,0,train
    birds/107.jpg,7,test

With a split column the splits are named by its values (any names: ``train``, ``test``,
``val``, ``query``, ``gallery``...). Without one, the classes are split class-disjointly:
the first ``train_classes`` of the sorted label values (a count, or a fraction, default
one half: the CUB / Cars convention) form ``'train'`` and the rest ``'test'``.

``load_image_folder`` -- a folder per class, ``root/<class>/<image>`` (classes split into
``'train'`` / ``'test'`` by sorted folder name, like lists without a split column), or a
folder per split, ``root/<split>/<class>/<image>`` (e.g. ``train/`` and ``test/``)::

    root/train/cat/1.jpg  root/train/dog/7.png  root/test/owl/3.jpeg

Images are the files directly in a class folder with an extension in ``IMAGE_EXTENSIONS``
(any case), sorted by name; classes are sorted by folder name, ``label_sets['class']`` is
the rank of the folder name among all class folders (``sorted`` of the names).

``load_hotels`` -- Hotels-50K style: a list as above whose split column holds ``train`` and
``test``; test images are retrieved from the training set (``eval.splits=('test@train',)``),
so test and train share the hotel label space (``label_sets['hotel']``). It is
``load_image_list`` with that split check and the shared-label check made strict.

``LOADERS`` is the plain-dict registry of these loaders.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from absl import logging

from dml_jax.data import augment
from dml_jax.data.digits import Split
from dml_jax.data.images import DatasetNotPreparedError, ImageOptions, LazyImages

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
INSHOP_STATUSES = ("train", "query", "gallery")
HOTELS_SPLITS = ("train", "test")
_INT32 = np.iinfo(np.int32)
_INSHOP_HELP = (
    "In-Shop is the 'In-shop Clothes Retrieval Benchmark' of DeepFashion "
    "(https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html): download "
    "Img/img.zip and Eval/list_eval_partition.txt, unzip img.zip into the root folder and copy "
    "the partition file there, so that ROOT/img/... and ROOT/list_eval_partition.txt exist.")


# ----------------------------------------------------------------------------- In-Shop


def load_inshop(*, root: str, partition_file: str = "list_eval_partition.txt",
                image_size: int = 224, resize_size: int = 256, channels: int = 3,
                mean=augment.IMAGENET_MEAN, std=augment.IMAGENET_STD,
                check_files: bool = True, num_threads: int | None = None,
                name: str = "inshop") -> dict[str, Split]:
  """The In-Shop clothes retrieval benchmark with its official partition.

  Reads ``root/partition_file`` (format in the module docstring): line 1 the image count,
  line 2 the header ``image_name item_id evaluation_status``, then one image per line. Item
  ids ``id_00000080`` (or plain integers) become the integer ``80``.

  * ``'train'``: the ``train`` images; ``labels`` = rank of the item id among the train items.
  * ``'query'``, ``'gallery'``: one label space (module docstring): with the official file
    (the same 3985 items on both sides) ``labels`` = rank of the item id in the sorted union
    of query and gallery items, so ``'query@gallery'`` compares items correctly.

  All splits carry ``label_sets['item']`` and ``label_sets['class']``: the integer item id
  (``'query:item@gallery'`` gives the same result as ``'query@gallery'``). Rows keep the
  file's order; ``images`` are ``LazyImages`` ``[N, S, S, C]`` over the absolute paths.

  Args:
    root: the folder holding ``img/`` and the partition file.
    partition_file: the partition file, relative to ``root`` (or absolute).
    image_size, resize_size, channels, mean, std: the ``ImageOptions`` of the images.
    check_files: verify that every listed image exists (one ``stat`` per image).
    num_threads: decoding threads of ``LazyImages``.
    name: the dataset part of the split names (``'inshop:query'``).

  Returns:
    ``{'train': Split, 'query': Split, 'gallery': Split}``.

  Raises:
    FileNotFoundError: ``root`` or the partition file is missing (the message says how to get
      In-Shop), or listed images are missing (the first one, its line, and how many).
    ValueError: a malformed partition file, naming the file, the line and the value: a bad
      count or header, a line without 3 fields, an unknown status, an item id that is not
      ``id_<digits>``, a count that differs from the number of lines, a missing status, or
      query and gallery items that cannot share a label space.
  """
  options = _options(image_size, resize_size, channels, mean, std)
  root = os.path.abspath(os.path.expanduser(root))
  if not os.path.isdir(root):
    raise DatasetNotPreparedError(f"In-Shop root folder {root!r} does not exist. {_INSHOP_HELP}")
  list_path = os.path.join(root, partition_file)
  if not os.path.isfile(list_path):
    raise DatasetNotPreparedError(f"In-Shop partition file {list_path!r} does not exist. "
                            f"{_INSHOP_HELP}")
  rows = []  # (line number, path, item id, status)
  count, count_line = None, 0
  with open(list_path, encoding="utf-8-sig") as f:
    for lineno, line in enumerate(f, start=1):
      fields = line.split()
      if not fields:
        continue
      where = f"{list_path}:{lineno}"
      if count is None:
        if len(fields) != 1 or not _is_int(fields[0]) or int(fields[0]) < 0:
          raise ValueError(f"{where}: the first line of an In-Shop partition file is the "
                           f"number of images, got {line.strip()!r}.")
        count, count_line = int(fields[0]), lineno
        continue
      if not rows and fields[0] == "image_name":
        if fields != ["image_name", "item_id", "evaluation_status"]:
          raise ValueError(f"{where}: expected the header 'image_name item_id "
                           f"evaluation_status', got {line.strip()!r}.")
        continue
      if len(fields) != 3:
        raise ValueError(f"{where}: expected 3 whitespace-separated fields 'image_name item_id "
                         f"evaluation_status', got {len(fields)}: {line.strip()!r}.")
      image, item, status = fields
      if status not in INSHOP_STATUSES:
        raise ValueError(f"{where}: unknown evaluation_status {status!r}; valid: "
                         f"{', '.join(INSHOP_STATUSES)}.")
      match = re.fullmatch(r"(?:id_)?(\d+)", item)
      if match is None or int(match.group(1)) > _INT32.max:
        raise ValueError(f"{where}: item_id {item!r} is not of the form 'id_<digits>'.")
      rows.append((lineno, image, int(match.group(1)), status))
  if count is None:
    raise ValueError(f"In-Shop partition file {list_path!r} is empty. {_INSHOP_HELP}")
  if count != len(rows):
    raise ValueError(f"{list_path}:{count_line}: the file announces {count} images but lists "
                     f"{len(rows)}; is it truncated?")
  missing = [s for s in INSHOP_STATUSES if not any(r[3] == s for r in rows)]
  if missing:
    raise ValueError(f"In-Shop partition file {list_path!r} has no {', '.join(missing)} "
                     f"images; the benchmark needs {', '.join(INSHOP_STATUSES)}.")
  paths = [_join(root, r[1]) for r in rows]
  if check_files:
    _check_files(paths, [r[0] for r in rows], list_path,
                 hint=f" Is img.zip unzipped into {root!r}? {_INSHOP_HELP}")
  items = np.asarray([r[2] for r in rows], np.int64)
  statuses = np.asarray([r[3] for r in rows])
  groups = {s: np.flatnonzero(statuses == s) for s in INSHOP_STATUSES}
  values = {s: items[idx] for s, idx in groups.items()}
  # The train items are numbered on their own; query and gallery share one numbering.
  labels = {"train": np.searchsorted(np.unique(values["train"]), values["train"])}
  test_labels, unshared = _label_spaces({s: values[s] for s in ("query", "gallery")})
  _require_shared(unshared, "query", "gallery", values, f"In-Shop partition file "
                  f"{list_path!r}", "items")
  labels.update(test_labels)
  out = {}
  for split, idx in groups.items():
    out[split] = _split([paths[i] for i in idx], labels[split],
                        {"item": items[idx], "class": items[idx]}, options, num_threads,
                        f"{name}:{split}")
  return out


# ------------------------------------------------------------------------ list files


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
  options = _options(image_size, resize_size, channels, mean, std)
  list_path, root = _list_and_root(path, root)
  rows = _read_list(list_path, delimiter=delimiter, has_header=has_header)
  name = name or os.path.splitext(os.path.basename(list_path))[0]
  paths = [_join(root, r[1]) for r in rows]
  if check_files:
    _check_files(paths, [r[0] for r in rows], list_path)
  labels = np.asarray([r[2] for r in rows], np.int64)
  has_split = rows[0][3] is not None
  if not has_split:
    return _class_disjoint(paths, labels, train_classes, options, num_threads, name,
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
  primary, unshared = _label_spaces(values)
  for a, b in unshared:
    logging.warning("%s: splits %r and %r share classes but neither holds all classes of the "
                    "other, so their primary labels are numbered separately; compare them "
                    "with the 'class' label set (e.g. '%s:class@%s').", list_path, a, b, a, b)
  return {s: _split([paths[i] for i in idx], primary[s], {"class": values[s]}, options,
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
  list_path, _ = _list_and_root(path, root)
  rows = _read_list(list_path, delimiter=delimiter, has_header=has_header)
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
  _, unshared = _label_spaces(labels)
  _require_shared(unshared, "test", "train", labels, f"The Hotels list {list_path!r}",
                  "hotels")
  splits = load_image_list(path=list_path, root=root, delimiter=delimiter,
                           has_header=has_header, train_split="train", image_size=image_size,
                           resize_size=resize_size, channels=channels, mean=mean, std=std,
                           check_files=check_files, num_threads=num_threads, name=name)
  return {s: Split(images=sp.images, labels=sp.labels,
                   label_sets={"class": sp.label_sets["class"],
                               "hotel": sp.label_sets["class"]}, name=sp.name)
          for s, sp in splits.items()}


# --------------------------------------------------------------------- class folders


def load_image_folder(*, root: str, layout: str = "auto",
                      train_classes: int | float | None = None, image_size: int = 224,
                      resize_size: int = 256, channels: int = 3, mean=augment.IMAGENET_MEAN,
                      std=augment.IMAGENET_STD, num_threads: int | None = None,
                      name: str = "") -> dict[str, Split]:
  """A dataset from class folders (module docstring).

  * ``layout='classes'``: ``root/<class>/<image>``. Classes sorted by folder name; the first
    ``K`` form ``'train'`` and the rest ``'test'``, with ``K`` from ``train_classes`` as in
    ``load_image_list`` (default: half, at least 1; ``K = C`` returns only ``'train'``).
  * ``layout='splits'``: ``root/<split>/<class>/<image>``; one ``Split`` per split folder,
    primary labels numbered as in "Shared label spaces" (module docstring).
  * ``layout='auto'``: ``'splits'`` when ``root/train`` or ``root/test`` is a folder that
    holds sub-folders and no image file directly, else ``'classes'``.

  ``label_sets['class']`` is the rank of the class folder name in the sorted list of all
  class folder names (over all splits). Rows: classes in sorted order, files sorted by name
  within a class. Folders starting with ``.`` are ignored, and so are files without an image
  extension (``IMAGE_EXTENSIONS``, any case).

  Args:
    root: the dataset folder.
    layout: ``'auto'``, ``'classes'`` or ``'splits'``.
    train_classes: the train class count (int) or fraction (float in ``(0, 1]``), layout
      ``'classes'`` only.
    image_size, resize_size, channels, mean, std: the ``ImageOptions`` of the images.
    num_threads: decoding threads of ``LazyImages``.
    name: the dataset part of the split names ('' = the name of ``root``).

  Returns:
    ``{'train': Split, 'test': Split}`` (layout ``'classes'``) or one ``Split`` per split
    folder.

  Raises:
    FileNotFoundError: ``root`` does not exist.
    ValueError: an unknown layout, no class folder, a class folder without images (named),
      a split folder holding image files directly, or a bad ``train_classes``.
  """
  options = _options(image_size, resize_size, channels, mean, std)
  root = os.path.abspath(os.path.expanduser(root))
  if not os.path.isdir(root):
    raise DatasetNotPreparedError(f"Image folder {root!r} does not exist; expected "
                            "ROOT/<class>/<image> or ROOT/<split>/<class>/<image>.")
  layouts = ("auto", "classes", "splits")
  if layout not in layouts:
    raise ValueError(f"Unknown layout {layout!r}; valid: {', '.join(layouts)}.")
  name = name or os.path.basename(root)
  if layout == "auto":
    layout = "splits" if any(_only_folders(os.path.join(root, s)) for s in ("train", "test")) \
        else "classes"
  if layout == "classes":
    files = _class_folders(root)
    classes = sorted(files)
    paths = [p for c in classes for p in files[c]]
    labels = np.concatenate([np.full(len(files[c]), k, np.int64)
                             for k, c in enumerate(classes)])
    return _class_disjoint(paths, labels, train_classes, options, num_threads, name,
                           f"the image folder {root!r}")
  if train_classes is not None:
    raise ValueError(f"train_classes={train_classes!r} applies to layout 'classes'; {root!r} "
                     "has split folders (used as they are).")
  split_names = _subfolders(root)
  if not split_names:
    raise ValueError(f"Image folder {root!r} has no split folder (ROOT/<split>/<class>/...).")
  per_split = {}
  for s in split_names:
    folder = os.path.join(root, s)
    stray = [f for f in os.listdir(folder) if _is_image(os.path.join(folder, f))]
    if stray:
      raise ValueError(f"Split folder {folder!r} holds image files directly (e.g. "
                       f"{stray[0]!r}); expected {folder}/<class>/<image>.")
    per_split[s] = _class_folders(folder)
  all_classes = sorted({c for files in per_split.values() for c in files})
  class_id = {c: k for k, c in enumerate(all_classes)}
  data = {}
  for s, files in per_split.items():
    classes = sorted(files)
    data[s] = ([p for c in classes for p in files[c]],
               np.asarray([class_id[c] for c in classes for _ in files[c]], np.int64))
  primary, unshared = _label_spaces({s: labels for s, (_, labels) in data.items()})
  for a, b in unshared:
    logging.warning("%s: split folders %r and %r share classes but neither holds all classes "
                    "of the other, so their primary labels are numbered separately; compare "
                    "them with the 'class' label set (e.g. '%s:class@%s').", root, a, b, a, b)
  return {s: _split(paths, primary[s], {"class": labels}, options, num_threads, f"{name}:{s}")
          for s, (paths, labels) in data.items()}


# ---------------------------------------------------------------------------- helpers


def _options(image_size, resize_size, channels, mean, std) -> ImageOptions:
  return ImageOptions(image_size=image_size, resize_size=resize_size, channels=channels,
                      mean=mean, std=std)


def _split(paths: list[str], labels: np.ndarray, label_sets: Mapping[str, np.ndarray],
           options: ImageOptions, num_threads: int | None, name: str) -> Split:
  """A ``Split`` whose images are ``LazyImages`` over ``paths`` (its own records list)."""
  images = LazyImages(list(paths), options, num_threads=num_threads, name=name)
  return Split(images=images, labels=labels, label_sets=label_sets, name=name)


def _is_int(text: str) -> bool:
  return re.fullmatch(r"[+-]?\d+", text) is not None


def _is_image(path: str) -> bool:
  return path.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(path)


def _join(root: str, path: str) -> str:
  """The absolute, normalised path of ``path`` relative to ``root`` (absolute kept)."""
  return os.path.normpath(os.path.join(root, os.path.expanduser(path)))


def _list_and_root(path: str, root: str) -> tuple[str, str]:
  """The absolute list file and image root; FileNotFoundError if either is missing."""
  list_path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isfile(list_path):
    raise DatasetNotPreparedError(f"Image list file {list_path!r} does not exist.")
  root = os.path.abspath(os.path.expanduser(root)) if root else os.path.dirname(list_path)
  if not os.path.isdir(root):
    raise FileNotFoundError(f"Image root folder {root!r} (the folder the paths of "
                            f"{list_path!r} are relative to) does not exist.")
  return list_path, root


def _read_list(list_path: str, *, delimiter: str,
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
          header = (len(fields) >= 2 and not _is_int(fields[1]) and
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
      if not _is_int(label):
        raise ValueError(f"{where}: label {label!r} is not an integer.")
      if not _INT32.min <= int(label) <= _INT32.max:
        raise ValueError(f"{where}: label {label!r} does not fit in int32.")
      if split is not None and not split:
        raise ValueError(f"{where}: the split is empty.")
      rows.append((lineno, image, int(label), split))
  if not rows:
    raise ValueError(f"Image list {list_path!r} has no rows.")
  return rows


def _check_files(paths: Sequence[str], lines: Sequence[int], list_path: str,
                 hint: str = "") -> None:
  """FileNotFoundError naming the first missing file, its line, and the number missing."""
  missing = [k for k, p in enumerate(paths) if not os.path.isfile(p)]
  if missing:
    k = missing[0]
    raise FileNotFoundError(f"{len(missing)} of the {len(paths)} images listed in "
                            f"{list_path!r} are missing; the first is {paths[k]!r} (line "
                            f"{lines[k]}).{hint}")


def _num_train_classes(train_classes, num_classes: int, where: str) -> int:
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


def _class_disjoint(paths: list[str], labels: np.ndarray, train_classes, options, num_threads,
                    name: str, where: str) -> dict[str, Split]:
  """The first ``K`` sorted classes -> ``'train'``, the rest -> ``'test'`` (file order)."""
  classes = np.unique(labels)
  k = _num_train_classes(train_classes, len(classes), where)
  out = {}
  for split, chosen in (("train", classes[:k]), ("test", classes[k:])):
    if len(chosen) == 0:
      continue
    rows = np.flatnonzero(np.isin(labels, chosen))
    out[split] = _split([paths[i] for i in rows], np.searchsorted(chosen, labels[rows]),
                        {"class": labels[rows]}, options, num_threads, f"{name}:{split}")
  return out


def _label_spaces(values: Mapping[str, np.ndarray]
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


def _require_shared(unshared: Sequence[tuple[str, str]], query: str, gallery: str,
                    values: Mapping[str, np.ndarray], what: str, kind: str) -> None:
  """ValueError unless ``query`` and ``gallery`` got one label space (``_label_spaces``)."""
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


def _subfolders(folder: str) -> list[str]:
  return sorted(e for e in os.listdir(folder)
                if not e.startswith(".") and os.path.isdir(os.path.join(folder, e)))


def _only_folders(folder: str) -> bool:
  """``folder`` exists, has a sub-folder, and holds no image file directly."""
  if not os.path.isdir(folder) or not _subfolders(folder):
    return False
  return not any(_is_image(os.path.join(folder, e)) for e in os.listdir(folder))


def _class_folders(folder: str) -> dict[str, list[str]]:
  """``class name -> sorted absolute image paths`` of ``folder/<class>/<image>``."""
  classes = _subfolders(folder)
  if not classes:
    raise ValueError(f"Image folder {folder!r} has no class folder ({folder}/<class>/<image>).")
  out = {}
  for c in classes:
    d = os.path.join(folder, c)
    files = sorted(os.path.join(d, e) for e in os.listdir(d) if _is_image(os.path.join(d, e)))
    if not files:
      raise ValueError(f"Class folder {d!r} has no image (extensions: "
                       f"{' '.join(IMAGE_EXTENSIONS)}, any case).")
    out[c] = files
  return out


def load_digits_png(*, root: str = "data/digits_png", **image_options) -> dict[str, Split]:
  """scikit-learn's digits written as PNG files by ``digits.write_digit_images(root)``:
  ``image_folder`` with ``layout='splits'``, and an error that says how to write them.

  Raises:
    DatasetNotPreparedError: ``root`` does not exist (the message has the command).
  """
  if not os.path.isdir(os.path.expanduser(root)):
    raise DatasetNotPreparedError(
        f"{root} does not exist; write the digits as PNG files first: python -c \"from "
        f"dml_jax.data import digits; digits.write_digit_images('{root}')\"")
  return load_image_folder(root=root, layout="splits", **image_options)


LOADERS: dict[str, Callable[..., dict[str, Split]]] = {
    "digits_png": load_digits_png,
    "inshop": load_inshop,
    "image_list": load_image_list,
    "image_folder": load_image_folder,
    "hotels": load_hotels,
}
