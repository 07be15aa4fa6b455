"""Oxford 102 Flowers from its three official files.

Files used (ROOT)::

    jpg/image_00001.jpg ...   the 8,189 images (102flowers.tgz extracted)
    imagelabels.mat           labels [1, 8189]: the class 1..102 of image k at position k-1
    setid.mat                 trnid, valid, tstid: 1-based image numbers of each split

``read`` returns the parts ``'train'``, ``'validation'``, ``'test'`` (``setid.mat``'s order
within each) with ``'label'`` = class - 1 (TFDS's label); the protocol merges them and splits
classes 0-50 / 51-101. Records are the absolute image paths.
"""

from __future__ import annotations

import os

import numpy as np

from dml_jax.data import split_protocols
from dml_jax.data.official import files

NUM_CLASSES = 102
SETS = {"train": "trnid", "validation": "valid", "test": "tstid"}


def read(name: str, root: str) -> dict[str, split_protocols.Part]:
  """The parts of Oxford 102 Flowers (module docstring); ``name`` is ``'flowers102'``.

  Raises:
    DatasetNotPreparedError: a file, ``jpg/`` or a listed image is missing.
    ValueError: a damaged ``.mat`` file, a missing variable, a label outside 1..102, or an
      image number outside the labels (file and position).
  """
  root = files.check_root(name, root)
  labels_path = files.find(name, root, ("imagelabels.mat",))
  setid_path = files.find(name, root, ("setid.mat",))
  files.find(name, root, ("jpg",))
  labels = files.check_ints(files.load_mat(labels_path, ("labels",))["labels"], labels_path,
                            "the label", low=1, high=NUM_CLASSES) - 1
  sets = files.load_mat(setid_path, tuple(SETS.values()))
  parts = {}
  for part, key in SETS.items():
    ids = files.check_ints(sets[key], f"{setid_path} ({key})", "the image number", low=1,
                           high=len(labels))
    paths = [os.path.join(root, "jpg", f"image_{i:05d}.jpg") for i in ids]
    files.check_images(name, paths, [f"{setid_path} ({key}), position {k}"
                                     for k in range(len(ids))])
    parts[part] = split_protocols.Part(paths, {"label": labels[ids - 1]})
  return parts
