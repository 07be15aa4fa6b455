"""Stanford Online Products from the extracted ``Stanford_Online_Products/`` folder.

Files used (ROOT is ``Stanford_Online_Products/`` or the folder holding it)::

    Ebay_train.txt, Ebay_test.txt   header 'image_id class_id super_class_id path', then
                                    e.g. '1 1 1 bicycle_final/111085122871_0.JPG'
    <super class>_final/<image>     the images

``read`` returns the parts ``'train'`` and ``'test'`` (the official split) with TFDS's
features ``'class_id'`` = class_id - 1 and ``'super_class_id'`` = super_class_id - 1 (0..11).
Records are the absolute image paths.
"""

from __future__ import annotations

import os

import numpy as np

from dml_jax.data import split_protocols
from dml_jax.data.official import files

FOLDER = "Stanford_Online_Products"
LISTS = {"train": "Ebay_train.txt", "test": "Ebay_test.txt"}
HEADER = ("image_id", "class_id", "super_class_id", "path")
NUM_SUPER_CLASSES = 12


def read_list(name: str, path: str, folder: str) -> split_protocols.Part:
  """One ``Ebay_*.txt`` list as a part.

  Raises:
    ValueError: a line without the four fields, a bad id, a super class outside 1..12 (file
      and line), or a list without rows.
    DatasetNotPreparedError: a listed image is missing.
  """
  class_ids, super_ids, image_paths, wheres = [], [], [], []
  for where, (image_id, class_id, super_id, rel) in files.rows(path, num_fields=4,
                                                                header=HEADER):
    files.to_int(image_id, where, "the image_id", low=1)
    class_ids.append(files.to_int(class_id, where, "the class_id", low=1) - 1)
    super_ids.append(files.to_int(super_id, where, "the super_class_id", low=1,
                                  high=NUM_SUPER_CLASSES) - 1)
    image_paths.append(os.path.join(folder, rel))
    wheres.append(where)
  if not image_paths:
    raise ValueError(f"{path}: no image listed.")
  files.check_images(name, image_paths, wheres)
  return split_protocols.Part(image_paths, {"class_id": np.asarray(class_ids, np.int64),
                                      "super_class_id": np.asarray(super_ids, np.int64)})


def read(name: str, root: str) -> dict[str, split_protocols.Part]:
  """The parts ``'train'`` and ``'test'`` of SOP (module docstring); ``name`` is ``'sop'``."""
  folder = files.dataset_folder(files.check_root(name, root), FOLDER, LISTS["train"])
  return {part: read_list(name, files.find(name, folder, (list_file,)), folder)
          for part, list_file in LISTS.items()}
