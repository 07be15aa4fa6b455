"""The DeepFashion In-shop Clothes Retrieval Benchmark from its partition file (format in
``image_lists``): train / query / gallery, one item label space for query and gallery."""

from __future__ import annotations

import os
import re

import numpy as np

from dml_jax.data import augment
from dml_jax.data import image_files
from dml_jax.data import splits as splits_lib
from dml_jax.data.images import DatasetNotPreparedError, not_there
from dml_jax.data.splits import Split


INSHOP_STATUSES = ("train", "query", "gallery")


_INSHOP_HELP = (
    "In-Shop is the 'In-shop Clothes Retrieval Benchmark' of DeepFashion "
    "(https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html): download "
    "Img/img.zip and Eval/list_eval_partition.txt, unzip img.zip into the root folder and copy "
    "the partition file there, so that ROOT/img/... and ROOT/list_eval_partition.txt exist.")


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
  options = image_files.image_options(image_size, resize_size, channels, mean, std)
  root = os.path.abspath(os.path.expanduser(root))
  if not os.path.isdir(root):
    raise DatasetNotPreparedError(f"In-Shop root folder {root!r} {not_there(root)}. "
                                  f"{_INSHOP_HELP}")
  list_path = os.path.join(root, partition_file)
  if not os.path.isfile(list_path):
    raise DatasetNotPreparedError(f"In-Shop partition file {list_path!r} "
                                  f"{not_there(list_path, 'file')}. "
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
        if len(fields) != 1 or not image_files.is_int(fields[0]) or int(fields[0]) < 0:
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
      if match is None or int(match.group(1)) > image_files.INT32.max:
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
  paths = [image_files.join(root, r[1]) for r in rows]
  if check_files:
    image_files.check_files(paths, [r[0] for r in rows], list_path,
                 hint=f" Is img.zip unzipped into {root!r}? {_INSHOP_HELP}")
  items = np.asarray([r[2] for r in rows], np.int64)
  statuses = np.asarray([r[3] for r in rows])
  groups = {s: np.flatnonzero(statuses == s) for s in INSHOP_STATUSES}
  values = {s: items[idx] for s, idx in groups.items()}
  # The train items are numbered on their own; query and gallery share one numbering.
  labels = {"train": np.searchsorted(np.unique(values["train"]), values["train"])}
  test_labels, unshared = splits_lib.label_spaces({s: values[s] for s in ("query", "gallery")})
  splits_lib.require_shared(unshared, "query", "gallery", values, f"In-Shop partition file "
                  f"{list_path!r}", "items")
  labels.update(test_labels)
  out = {}
  for split, idx in groups.items():
    out[split] = image_files.lazy_split([paths[i] for i in idx], labels[split],
                        {"item": items[idx], "class": items[idx]}, options, num_threads,
                        f"{name}:{split}")
  return out
