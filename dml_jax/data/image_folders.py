"""Datasets given as class folders (``root/<class>/<image>`` or ``root/<split>/<class>/<image>``;
format in ``image_lists``), and the embedded digits written as such folders (``digits_png``)."""

from __future__ import annotations

import os

from absl import logging
import numpy as np

from dml_jax.data import augment
from dml_jax.data import image_files
from dml_jax.data import splits as splits_lib
from dml_jax.data.images import DatasetNotPreparedError, not_there
from dml_jax.data.splits import Split


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
  extension (``image_files.IMAGE_EXTENSIONS``, any case).

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
    FileNotFoundError: ``root`` does not exist or is not a folder.
    ValueError: an unknown layout, no class folder, a class folder without images (named),
      a split folder holding image files directly, or a bad ``train_classes``.
  """
  options = image_files.image_options(image_size, resize_size, channels, mean, std)
  root = os.path.abspath(os.path.expanduser(root))
  if not os.path.isdir(root):
    raise DatasetNotPreparedError(f"Image folder {root!r} {not_there(root)}; expected "
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
    return image_files.class_disjoint(paths, labels, train_classes, options, num_threads, name,
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
    stray = [f for f in os.listdir(folder) if image_files.is_image(os.path.join(folder, f))]
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
  primary, unshared = splits_lib.label_spaces({s: labels for s, (_, labels) in data.items()})
  for a, b in unshared:
    logging.warning("%s: split folders %r and %r share classes but neither holds all classes "
                    "of the other, so their primary labels are numbered separately; compare "
                    "them with the 'class' label set (e.g. '%s:class@%s').", root, a, b, a, b)
  return {s: image_files.lazy_split(paths, primary[s], {"class": labels}, options, num_threads, f"{name}:{s}")
          for s, (paths, labels) in data.items()}


def _subfolders(folder: str) -> list[str]:
  return sorted(e for e in os.listdir(folder)
                if not e.startswith(".") and os.path.isdir(os.path.join(folder, e)))


def _only_folders(folder: str) -> bool:
  """``folder`` exists, has a sub-folder, and holds no image file directly."""
  if not os.path.isdir(folder) or not _subfolders(folder):
    return False
  return not any(image_files.is_image(os.path.join(folder, e)) for e in os.listdir(folder))


def _class_folders(folder: str) -> dict[str, list[str]]:
  """``class name -> sorted absolute image paths`` of ``folder/<class>/<image>``."""
  classes = _subfolders(folder)
  if not classes:
    raise ValueError(f"Image folder {folder!r} has no class folder ({folder}/<class>/<image>).")
  out = {}
  for c in classes:
    d = os.path.join(folder, c)
    files = sorted(os.path.join(d, e) for e in os.listdir(d) if image_files.is_image(os.path.join(d, e)))
    if not files:
      raise ValueError(f"Class folder {d!r} has no image (extensions: "
                       f"{' '.join(image_files.IMAGE_EXTENSIONS)}, any case).")
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
        f"{root} {not_there(os.path.expanduser(root))}; write the digits as PNG files first: python -c \"from "
        f"dml_jax.data import digits; digits.write_digit_images('{root}')\"")
  return load_image_folder(root=root, layout="splits", **image_options)
