"""Image datasets that do not fit in memory: records decoded and transformed on access.

``LazyImages`` is a read-only, array-like view ``[N, S, S, C]`` float32 over a random-access
sequence of *records* (uint8 arrays from a TFDS ``data_source``, encoded bytes, or file
paths; see ``augment``). Indexing it (``images[i]``, ``images[a:b]``, ``images[index_array]``)
decodes the selected records in a thread pool and applies the evaluation transform (resize
+ centre crop + normalise), so evaluation and the embedding code treat it like a numpy
array. Training draws its augmented batches from the same records through
``pipeline.train_batches``, which reads ``records``, ``indices`` and ``options``.

``DecodedImages`` is the same view over uint8 pixels decoded once (the evaluation cache,
``eval_cache``): indexing it only normalises.

A ``Split`` (``splits.Split``) accepts either view as its ``images``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from dml_jax.data import augment


class DatasetNotPreparedError(FileNotFoundError):
  """A dataset's files are not where the loader looks; the message says how to get them."""


def not_there(path: str, kind: str = "folder") -> str:
  """Why ``path`` is not the ``kind`` (``'folder'`` or ``'file'``) a loader expects, for its
  error: ``'does not exist'``, or what it is instead (``'is a file, not a folder'``)."""
  if not os.path.exists(path):
    return "does not exist"
  found = "folder" if os.path.isdir(path) else "file"
  return f"is a {found}, not a {kind}" if found != kind else f"is not a readable {kind}"


@dataclasses.dataclass(frozen=True)
class ImageOptions:
  """How records become model inputs (the ``config.data`` keys of the same names).

  Attributes:
    image_size: output side ``S`` (224 for ImageNet backbones).
    resize_size: shorter side before the crop (256); evaluation centre-crops ``S`` from it.
    channels: 3 (RGB) or 1 (grey).
    mean, std: normalisation ``(x / 255 - mean) / std``; ImageNet statistics by default (one
      number, or one per channel).
  """

  image_size: int = 224
  resize_size: int = 256
  channels: int = 3
  mean: tuple[float, ...] = augment.IMAGENET_MEAN
  std: tuple[float, ...] = augment.IMAGENET_STD

  def __post_init__(self):
    for what in ("mean", "std"):
      object.__setattr__(self, what, _float_tuple(getattr(self, what), what))
    augment.check_options(image_size=self.image_size, resize_size=self.resize_size,
                          channels=self.channels, mean=self.mean, std=self.std)

  def eval_transform(self, record) -> np.ndarray:
    """One record -> float32 ``[S, S, C]`` (resize shorter side, centre crop, normalise)."""
    return augment.eval_transform(record, image_size=self.image_size,
                                  resize_size=self.resize_size, channels=self.channels,
                                  mean=self.mean, std=self.std)

  def train_transform(self, record, rng: np.random.Generator, *, augmentation: str,
                      **kwargs) -> np.ndarray:
    """One record -> float32 ``[S, S, C]`` augmented (``augment.train_transform``)."""
    return augment.train_transform(record, rng, augmentation=augmentation,
                                   image_size=self.image_size, resize_size=self.resize_size,
                                   channels=self.channels, mean=self.mean, std=self.std,
                                   **kwargs)


def _float_tuple(values, what: str) -> tuple[float, ...]:
  """``values`` (one number or a sequence of numbers) as a tuple of floats."""
  try:
    array = np.asarray(values, dtype=np.float64)
  except (TypeError, ValueError):
    array = None
  if array is None or array.ndim > 1 or not np.all(np.isfinite(array)):
    raise ValueError(f"{what} must be finite numbers (one, or one per channel), got "
                     f"{values!r}.")
  return tuple(float(v) for v in np.atleast_1d(array))


class FieldView(Sequence):
  """``view[i] = source[i][field]``: one feature of a dict-valued random-access source
  (e.g. the ``'image'`` of a TFDS ``data_source`` record). Picklable if the source is."""

  def __init__(self, source, field: str):
    self.source, self.field = source, field

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i):
    return self.source[int(i)][self.field]


class LazyImages:
  """Float32 ``[N, S, S, C]`` view of ``records[indices]``, decoded on access.

  Args:
    records: random-access sequence (``len`` and ``records[i]`` for an int ``i``).
    options: the ``ImageOptions`` of the evaluation transform (and of training).
    indices: int ``[N]`` positions in ``records`` (default: all of them, in order).
    num_threads: decoding threads used per indexing call (Pillow releases the GIL).
    name: used in error messages.
  """

  ndim = 4
  dtype = np.dtype(np.float32)

  def __init__(self, records, options: ImageOptions, *, indices=None,
               num_threads: int | None = None, name: str = "images"):
    self.records = records
    self.options = options
    n = len(records)
    if indices is None:
      indices = np.arange(n, dtype=np.int64)
    indices = np.asarray(indices)
    if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
      raise ValueError(f"{name}: indices must be a 1-D integer array, got {indices.shape} "
                       f"{indices.dtype}.")
    if indices.size and (indices.min() < 0 or indices.max() >= n):
      raise ValueError(f"{name}: indices must be in [0, {n}), got {indices.min()}.."
                       f"{indices.max()}.")
    self.indices = indices.astype(np.int64)
    self.indices.setflags(write=False)
    self.num_threads = num_threads or min(16, (os.cpu_count() or 1) + 2)
    self.name = name

  @property
  def shape(self) -> tuple[int, int, int, int]:
    s = self.options.image_size
    return (len(self.indices), s, s, self.options.channels)

  def __len__(self) -> int:
    return len(self.indices)

  def __repr__(self) -> str:
    return f"LazyImages({self.name!r}, shape={self.shape})"

  def take(self, idx) -> "LazyImages":
    """The lazy sub-view ``self[idx]`` (no decoding); ``idx``: a slice, or an int or bool
    index array."""
    idx = idx if isinstance(idx, slice) else np.asarray(idx)
    return LazyImages(self.records, self.options, indices=self.indices[idx],
                      num_threads=self.num_threads, name=self.name)

  def record(self, i: int):
    """The raw record of row ``i``."""
    return self.records[int(self.indices[i])]

  def __getitem__(self, key) -> np.ndarray:
    if isinstance(key, (int, np.integer)) or (isinstance(key, np.ndarray) and key.ndim == 0
                                               and np.issubdtype(key.dtype, np.integer)):
      return self.options.eval_transform(self.record(int(key)))
    rows = self.indices[key]
    out = np.empty((len(rows),) + self.shape[1:], np.float32)
    if len(rows) == 0:
      return out

    def fill(k):
      out[k] = self.options.eval_transform(self.records[int(rows[k])])

    if len(rows) == 1 or self.num_threads == 1:
      for k in range(len(rows)):
        fill(k)
    else:
      with concurrent.futures.ThreadPoolExecutor(min(self.num_threads, len(rows))) as pool:
        list(pool.map(fill, range(len(rows))))
    return out

  def __array__(self, dtype=None, copy=None):
    del copy
    out = self[:]
    return out if dtype is None else out.astype(dtype)


class DecodedImages:
  """Float32 ``[N, S, S, C]`` view of decoded uint8 pixels, normalised on access.

  The evaluation cache (``eval_cache``) keeps each image of an evaluation split as the uint8
  centre crop that ``LazyImages`` normalises; indexing this view normalises the selected rows
  with ``augment.normalize_pixels``, so ``view[a:b]`` is bitwise ``lazy[a:b]``. Large
  selections are normalised by ``num_threads`` threads, a block of rows each (numpy releases
  the GIL).

  Args:
    pixels: uint8 ``[N, S, S, C]`` (in memory or a ``numpy.memmap``).
    options: the ``ImageOptions`` whose ``mean`` / ``std`` normalise it.
    name: the dataset split's name (as ``LazyImages.name``).
    path: the memory-mapped file, or ``''`` in memory.
    num_threads: normalising threads per indexing call.
  """

  ndim = 4
  dtype = np.dtype(np.float32)
  _ELEMENTS_PER_THREAD = 2 ** 20   # a thread normalises at least this many values

  def __init__(self, pixels: np.ndarray, options: ImageOptions, *, name: str = "images",
               path: str = "", num_threads: int | None = None):
    pixels = pixels if isinstance(pixels, np.ndarray) else np.asarray(pixels)   # a memmap stays
    if pixels.dtype != np.uint8 or pixels.ndim != 4:
      raise ValueError(f"{name}: decoded pixels must be uint8 [N, S, S, C], got "
                       f"{pixels.dtype} {pixels.shape}.")
    self.pixels, self.options, self.name, self.path = pixels, options, name, path
    self.num_threads = num_threads or min(16, (os.cpu_count() or 1) + 2)

  @property
  def shape(self) -> tuple[int, int, int, int]:
    return tuple(int(d) for d in self.pixels.shape)

  @property
  def nbytes(self) -> int:
    """Bytes of the uint8 pixels."""
    return int(self.pixels.nbytes)

  def __len__(self) -> int:
    return len(self.pixels)

  def __repr__(self) -> str:
    where = f"mmap {self.path}" if self.path else "memory"
    return (f"DecodedImages({self.name!r}, shape={self.shape}, {self.nbytes / 1e9:.2f} GB, "
            f"{where})")

  def take(self, idx) -> "DecodedImages":
    """The sub-view ``self[idx]`` (a slice keeps the memory map; an index array copies the
    selected uint8 rows); ``idx``: a slice, or an int or bool index array."""
    idx = idx if isinstance(idx, slice) else np.asarray(idx)
    return DecodedImages(self.pixels[idx], self.options, name=self.name, path=self.path,
                         num_threads=self.num_threads)

  def __getitem__(self, key) -> np.ndarray:
    mean, std = self.options.mean, self.options.std
    if isinstance(key, (int, np.integer)) or (isinstance(key, np.ndarray) and key.ndim == 0
                                               and np.issubdtype(key.dtype, np.integer)):
      return augment.normalize_pixels(self.pixels[int(key)], mean=mean, std=std)
    pixels = self.pixels[key]
    n = len(pixels)
    per_row = max(1, int(np.prod(pixels.shape[1:])))
    rows = max(1, -(-self._ELEMENTS_PER_THREAD // per_row))
    blocks = [slice(i, i + rows) for i in range(0, n, rows)]
    if len(blocks) <= 1 or self.num_threads == 1:
      return augment.normalize_pixels(pixels, mean=mean, std=std)
    out = np.empty(pixels.shape, np.float32)

    def fill(block):
      augment.normalize_pixels(pixels[block], mean=mean, std=std, out=out[block])

    with concurrent.futures.ThreadPoolExecutor(min(self.num_threads, len(blocks))) as pool:
      list(pool.map(fill, blocks))
    return out

  def __array__(self, dtype=None, copy=None):
    del copy
    out = self[:]
    return out if dtype is None else out.astype(dtype)


def is_image_view(images) -> bool:
  """Whether ``images`` is a ``LazyImages`` or ``DecodedImages`` view (kept as it is by
  ``Split`` and ``take``), not an array."""
  return isinstance(images, (LazyImages, DecodedImages))


def take(images, idx):
  """``images[idx]`` for a numpy array, the sub-view for ``LazyImages`` / ``DecodedImages``."""
  if is_image_view(images):
    return images.take(idx)
  return images[np.asarray(idx)]

