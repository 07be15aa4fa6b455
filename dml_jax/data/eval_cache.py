"""The evaluation cache: each evaluation image decoded once, kept as its uint8 centre crop.

Evaluating a ``LazyImages`` split decodes every image again (``augment.eval_transform``: load,
resize the shorter side to ``resize_size``, centre crop ``image_size``, normalise), at every
evaluation of a run and again in ``eval.py``; the decoder, not the model, then sets the pace.
``build`` decodes each image of a split once into a uint8 ``[N, S, S, C]`` array of the
centre-cropped pixels, the exact pixels ``eval_transform`` normalises, and returns a
``images.DecodedImages`` view whose slices are float32 batches bitwise equal to the
``LazyImages`` ones (the same ``augment.normalize_pixels``): the metrics do not change.

In memory, or memory-mapped: ``<path>.npy`` (the pixels) and ``<path>.json`` (the fingerprint
of the records and options, ``fingerprint``). A later ``build`` with the same fingerprint maps
the file instead of decoding (another process, e.g. ``eval.py`` after ``train.py``); another
fingerprint rebuilds it. Files are written under a temporary name of the build and renamed,
so two processes may build the same files at once (``eval.py`` while ``train.py`` evaluates).

Sizes at 224 px, 3 channels (N x 224 x 224 x 3 bytes, 1 GB = 10^9 bytes): CUB-200-2011 test
(5,924 images) 0.89 GB, Cars196 test (8,131) 1.22 GB, In-Shop query + gallery (14,218 +
12,612) 4.04 GB, Stanford Online Products test (60,502) 9.11 GB; Omniglot at 28 px grey
(13,180 + 19,280 images) 25 MB.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from collections.abc import Callable

import numpy as np

from dml_jax.data import augment
from dml_jax.data import cache as cache_lib
from dml_jax.data.images import DecodedImages, LazyImages

CACHE_MODES = cache_lib.CACHE_MODES   # 'auto', 'memory', 'mmap', 'none'
_FORMAT = 1   # bump when the stored pixels change


def check_mode(mode: str) -> None:
  """Raises ``ValueError`` (one line naming the value and what is allowed) for a bad
  ``eval.cache``."""
  if mode not in CACHE_MODES:
    raise ValueError(f"eval.cache={mode!r}; allowed: {', '.join(map(repr, CACHE_MODES))}.")


def nbytes(images) -> int:
  """Bytes of the cache of ``images`` (``[N, S, S, C]`` uint8): ``N * S * S * C``."""
  return int(np.prod(images.shape, dtype=np.int64))


def eval_pixels(record, options) -> np.ndarray:
  """One record -> uint8 ``[S, S, C]``: the centre crop ``eval_transform`` normalises
  (``augment.eval_crop``) for ``ImageOptions`` ``options``."""
  image = augment.eval_crop(record, image_size=options.image_size,
                            resize_size=options.resize_size, channels=options.channels)
  array = np.asarray(image)
  return array[..., None] if array.ndim == 2 else array


def fingerprint(images: LazyImages, *, sample: int = 16) -> str:
  """A hex digest of what the cache of ``images`` holds: the format, the crop options
  (``image_size``, ``resize_size``, ``channels``; not ``mean`` / ``std``, applied on access)
  and the records (``cache.records_fingerprint``)."""
  o = images.options
  return cache_lib.records_fingerprint(
      images, ["eval", _FORMAT, o.image_size, o.resize_size, o.channels], sample=sample)


def _check(images) -> None:
  if not isinstance(images, LazyImages):
    raise ValueError(f"The evaluation cache decodes LazyImages; got {type(images).__name__} "
                     "(in-memory arrays need no cache).")
  if len(images) == 0:
    raise ValueError(f"{images.name}: cannot cache an empty split.")


def load(path: str, images: LazyImages, *, key: str | None = None) -> DecodedImages | None:
  """The memory-mapped cache of ``images`` at ``path`` (``<path>.npy``, ``<path>.json``) if
  both exist, hold ``key`` (default ``fingerprint(images)``) and have ``images``' shape; else
  ``None``."""
  _check(images)
  key = fingerprint(images) if key is None else key
  try:
    with open(path + ".json") as f:
      meta = json.load(f)
    if meta.get("key") != key:
      return None
    pixels = np.load(path + ".npy", mmap_mode="r")
  except (OSError, ValueError):
    return None
  if pixels.dtype != np.uint8 or tuple(pixels.shape) != tuple(images.shape):
    return None
  return DecodedImages(pixels, images.options, name=images.name, path=path + ".npy",
                       num_threads=images.num_threads)


def build(images: LazyImages, *, path: str = "", num_threads: int = 8,
          log: Callable[[str], None] | None = None, log_every_s: float = 5.0,
          chunk: int = 256) -> DecodedImages:
  """Decodes every image of ``images`` once into a ``DecodedImages`` view.

  Args:
    images: an evaluation split's ``LazyImages``.
    path: ``''`` keeps the pixels in memory; otherwise the stem of the memory-mapped files
      (``<path>.npy``, ``<path>.json``; the folder is created). Files of the same
      fingerprint are mapped without decoding; others are rebuilt.
    num_threads: decoding threads (Pillow releases the GIL).
    log: receives a progress line at most every ``log_every_s`` seconds (``None``: silent;
      the caller says what was built, ``eval_input.cached_splits``).
    chunk: images decoded per round (bounds the memory of a ``path`` build).

  Raises:
    ValueError: ``images`` is not a ``LazyImages`` or is empty, or a record cannot be decoded.
  """
  _check(images)
  key = fingerprint(images)
  if path:
    mapped = load(path, images, key=key)
    if mapped is not None:
      return mapped
  n, t0 = len(images), time.perf_counter()
  last = t0
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:   # a stale key must never describe new pixels (another build may remove it first)
      os.remove(path + ".json")
    except FileNotFoundError:
      pass
    data = cache_lib.temp_name(path + ".npy")   # this build's own file (concurrent builds)
    pixels = np.lib.format.open_memmap(data, mode="w+", dtype=np.uint8, shape=images.shape)
  else:
    pixels = np.empty(images.shape, np.uint8)

  def decode(i):
    pixels[i] = eval_pixels(images.record(i), images.options)

  try:
    with concurrent.futures.ThreadPoolExecutor(max(1, num_threads)) as pool:
      for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        list(pool.map(decode, range(start, stop)))
        now = time.perf_counter()
        if log and now - last >= log_every_s:
          log(f"evaluation cache {images.name}: {stop:,}/{n:,} images, {now - t0:.0f} s")
          last = now
  except BaseException:
    if path:
      del pixels
      os.remove(data)
    raise
  if path:
    pixels.flush()
    del pixels
    view = DecodedImages(np.load(data, mmap_mode="r"), images.options, name=images.name,
                         path=path + ".npy", num_threads=images.num_threads)
    os.replace(data, path + ".npy")
    meta = cache_lib.temp_name(path + ".json")
    with open(meta, "w") as f:
      json.dump({"key": key, "name": images.name, "shape": list(images.shape)}, f)
    os.replace(meta, path + ".json")
  else:
    view = DecodedImages(pixels, images.options, name=images.name,
                         num_threads=images.num_threads)
  return view
