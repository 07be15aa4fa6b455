"""Stanford Cars (Cars196) from either official release.

* All-in-one: ``cars_annos.mat`` (struct array ``annotations`` with fields
  ``relative_im_path`` e.g. ``'car_ims/000001.jpg'``, ``class`` 1..196 and ``test`` 0/1) and
  ``car_ims/``.
* Devkit: ``cars_train/`` + ``devkit/cars_train_annos.mat`` and ``cars_test/`` +
  ``cars_test_annos_withlabels.mat`` (in ROOT or ``devkit/``); the struct arrays
  ``annotations`` have the fields ``fname`` and ``class``.

``read`` returns the parts ``'train'`` and ``'test'`` (the official halves; the all-in-one
file's ``test`` flag) in annotation order with ``'label'`` = class - 1 (TFDS's label); the
protocol merges them and splits classes 0-97 / 98-195. Records are the absolute image paths.
"""

from __future__ import annotations

import os

import numpy as np

from dml_jax.data import split_protocols
from dml_jax.data.official import files

NUM_CLASSES = 196
ALL_IN_ONE = "cars_annos.mat"
DEVKIT = {"train": ("cars_train", ("devkit/cars_train_annos.mat",)),
          "test": ("cars_test", ("cars_test_annos_withlabels.mat",
                                 "devkit/cars_test_annos_withlabels.mat"))}


def _annotations(path: str, fields: tuple[str, ...]) -> dict[str, list]:
  """``field -> values`` of the ``annotations`` struct array of a ``.mat`` file."""
  records = files.load_mat(path, ("annotations",))["annotations"]
  return {f: files.struct_field(records, f, path) for f in fields}


def _part(name: str, path: str, image_paths: list[str], classes: list) -> split_protocols.Part:
  label = files.check_ints(classes, path, "the class", low=1, high=NUM_CLASSES) - 1
  files.check_images(name, image_paths, [f"{path}, annotation {k}"
                                         for k in range(len(image_paths))])
  return split_protocols.Part(image_paths, {"label": label})


def read_all_in_one(name: str, root: str) -> dict[str, split_protocols.Part]:
  """The parts from ``cars_annos.mat`` + ``car_ims/``."""
  path = os.path.join(root, ALL_IN_ONE)
  ann = _annotations(path, ("relative_im_path", "class", "test"))
  is_test = files.check_ints(ann["test"], path, "the test flag", low=0, high=1)
  parts = {}
  for part, flag in (("train", 0), ("test", 1)):
    rows = np.flatnonzero(is_test == flag)
    parts[part] = _part(name, path, [os.path.join(root, ann["relative_im_path"][k])
                                     for k in rows], [ann["class"][k] for k in rows])
  return parts


def read_devkit(name: str, root: str) -> dict[str, split_protocols.Part]:
  """The parts from the devkit layout."""
  parts = {}
  for part, (folder, candidates) in DEVKIT.items():
    path = files.find(name, root, candidates)
    if not os.path.isdir(os.path.join(root, folder)):
      raise files.not_found(name, f"the image folder {folder + '/'!r}", root)
    ann = _annotations(path, ("fname", "class"))
    parts[part] = _part(name, path, [os.path.join(root, folder, f) for f in ann["fname"]],
                        ann["class"])
  return parts


def read(name: str, root: str) -> dict[str, split_protocols.Part]:
  """The parts ``'train'`` and ``'test'`` of Cars196 (module docstring); ``name`` is
  ``'cars196'``.

  Raises:
    DatasetNotPreparedError: neither release's files are in ROOT, or listed images are
      missing.
    ValueError: a damaged ``.mat`` file, a missing field, or a class outside 1..196 (file
      and annotation).
  """
  root = files.check_root(name, root)
  if os.path.isfile(os.path.join(root, ALL_IN_ONE)):
    return read_all_in_one(name, root)
  if not any(os.path.isfile(os.path.join(root, c)) for _, cs in DEVKIT.values() for c in cs):
    raise files.not_found(name, f"{ALL_IN_ONE!r} (all-in-one) or "
                          "'devkit/cars_train_annos.mat' (devkit)", root)
  return read_devkit(name, root)
