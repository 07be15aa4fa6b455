"""CUB-200-2011 from the extracted ``CUB_200_2011/`` folder of ``CUB_200_2011.tgz``.

Files used (ROOT is ``CUB_200_2011/`` or the folder holding it)::

    images.txt              <image_id> <path relative to images/>, e.g.
                            1 001.Black_footed_Albatross/Black_Footed_Albatross_0046_18.jpg
    image_class_labels.txt  <image_id> <class_id 1..200>
    classes.txt             <class_id> <class name>
    images/<path>

``read`` returns one part ``'all'`` (the rows of ``images.txt`` in order) with ``'label'`` =
``class_id - 1`` (TFDS's label); the protocol merges everything and splits classes 0-99 /
100-199. Records are the absolute image paths (decoded on access).
"""

from __future__ import annotations

import os

import numpy as np

from dml_jax.data import split_protocols
from dml_jax.data.official import files

FOLDER = "CUB_200_2011"


def read_classes(path: str) -> dict[int, str]:
  """``class_id -> name`` of ``classes.txt`` (ids 1..); ValueError with file:line."""
  classes = {}
  with open(path, encoding="utf-8-sig") as f:
    for lineno, line in enumerate(f, start=1):
      fields = line.split(maxsplit=1)
      if not fields:
        continue
      where = f"{path}:{lineno}"
      if len(fields) != 2:
        raise ValueError(f"{where}: expected '<class_id> <name>', got {line.strip()!r}.")
      class_id = files.to_int(fields[0], where, "the class id", low=1)
      if class_id in classes:
        raise ValueError(f"{where}: class id {class_id} is listed twice.")
      classes[class_id] = fields[1].strip()
  if not classes:
    raise ValueError(f"{path}: no class listed.")
  return classes


def read_id_table(path: str, what: str, *, num_classes: int | None = None
                  ) -> dict[int, tuple[str, str]]:
  """``image_id -> (value, 'file:line')`` of a two-column file keyed by image id
  (``images.txt``: value = path; ``image_class_labels.txt``: value = class id, checked to be
  in ``1..num_classes``).

  Raises:
    ValueError: a line without two fields (e.g. an id without image), a bad id, an id listed
      twice, or a class id out of range (file and line).
  """
  table = {}
  for where, (image_id, value) in files.rows(path, num_fields=2):
    key = files.to_int(image_id, where, "the image id", low=1)
    if key in table:
      raise ValueError(f"{where}: image id {key} is listed twice (first at {table[key][1]}).")
    if num_classes is not None:
      files.to_int(value, where, what, low=1, high=num_classes)
    table[key] = (value, where)
  if not table:
    raise ValueError(f"{path}: no line.")
  return table


def read(name: str, root: str) -> dict[str, split_protocols.Part]:
  """The part ``'all'`` of CUB-200-2011 (module docstring); ``name`` is ``'cub'``.

  Raises:
    DatasetNotPreparedError: a list file or a listed image is missing.
    ValueError: a malformed list (file and line), or an image without a class.
  """
  folder = files.dataset_folder(files.check_root(name, root), FOLDER, "images.txt")
  paths = {f: files.find(name, folder, (f,)) for f in ("images.txt", "image_class_labels.txt",
                                                       "classes.txt")}
  num_classes = len(read_classes(paths["classes.txt"]))
  images = read_id_table(paths["images.txt"], "the image path")
  labels = read_id_table(paths["image_class_labels.txt"], "the class id",
                         num_classes=num_classes)
  without = sorted(set(images) - set(labels))
  if without:
    raise ValueError(f"{images[without[0]][1]}: image id {without[0]} has no class in "
                     f"{paths['image_class_labels.txt']!r} ({len(without)} such images).")
  ids = list(images)
  image_paths = [os.path.join(folder, "images", images[i][0]) for i in ids]
  files.check_images(name, image_paths, [images[i][1] for i in ids])
  label = np.asarray([int(labels[i][0]) - 1 for i in ids], np.int64)
  return {"all": split_protocols.Part(image_paths, {"label": label})}
