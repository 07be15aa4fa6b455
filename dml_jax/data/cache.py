"""The decoded-image cache: each training image decoded once, kept as uint8 crop sources.

The host pipeline (``pipeline.train_batches``) decodes a JPEG / PNG for every example of every
epoch, and on a GPU that decoding, not the step, sets the pace. The datasets of deep metric
learning are small, so ``build`` decodes each training image *once* into the image that its
training crop is cut from (``augment.crop_source``), stored as uint8:

* ``'resize_crop'``, ``'none'``: shorter side resized to ``resize_size``, exactly the pixels
  the host path crops from (the same Pillow calls, JPEG draft mode included);
* ``'pad_crop'``: the ``image_size`` square (the evaluation image) the host path pads and
  crops (exact as well);
* ``'random_resized_crop'``: the host path cuts its box from the full-resolution image; the
  cache keeps it with the shorter side at ``resize_size`` (never upsampled) and the full
  size, so the same box is drawn and then scaled to the cached pixels (``device_augment``).

Layout: images are *ragged*, one uint8 ``[h_i, w_i, C]`` array each (a padded ``[N, H, W, C]``
array would pay for the most elongated image on every row; batches are cut from the images
on the host into fixed windows, ``crop_windows.host_inputs``). In memory they are a list of
arrays; ``'mmap'`` writes them back to back into one raw file ``<path>.u8`` with an index
``<path>.npz`` (offsets, shapes, crop-source sizes, the fingerprint of the records and
options), read as views of ``numpy.memmap``: a rerun with the same fingerprint maps the file
instead of decoding again.

Sizes at 256 px (shorter side 256, 3 channels, 1 GB = 10^9 bytes), *computed* as training
images x 256 x 256 * (typical aspect ratio) x 3 bytes, not measured on the datasets:

| dataset (train split) | images | typical size | aspect | GB |
|---|---|---|---|---|
| CUB-200-2011 (classes 0-99) | 5,864 | 500 x 375 | 4:3 | 1.54 |
| Cars196 (classes 0-97) | 8,054 | 600 x 400 | 3:2 | 2.38 |
| Stanford Online Products | 59,551 | 500 x 375 | 4:3 | 15.6 |
| In-Shop (train items) | 25,882 | 256 x 256 | 1:1 | 5.09 |
| Omniglot (background set) | 19,280 | 105 x 105 | 1:1 | 3.79 (1.26 grey) |

(``'pad_crop'`` stores ``image_size`` squares: Omniglot at 28 px grey is 15 MB.) The default
budget of ``'auto'`` (``DEFAULT_MAX_GB``, 8) caches all of them but SOP, which then streams
unless ``data.cache='memory'`` / ``'mmap'`` or a larger ``data.cache_max_gb``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence

import numpy as np

from dml_jax.data import augment

CACHE_MODES = ("auto", "memory", "mmap", "none")
DEFAULT_MAX_GB = 8.0
_FORMAT = 2   # bump when the stored pixels of a spec change (2: pad_crop at resize_size)


def check_mode(mode: str, max_gb: float) -> None:
  """Raises ``ValueError`` (one line naming the value and what is allowed) for a bad
  ``data.cache`` or ``data.cache_max_gb``."""
  if mode not in CACHE_MODES:
    raise ValueError(f"data.cache={mode!r}; allowed: {', '.join(map(repr, CACHE_MODES))}.")
  if isinstance(max_gb, bool) or not isinstance(max_gb, (int, float)) or not max_gb >= 0:
    raise ValueError(f"data.cache_max_gb={max_gb!r}; allowed: a number of GB >= 0 (the "
                     "budget of data.cache='auto').")


def choose(mode: str, *, estimated_bytes: int, max_gb: float, examples: int | None = None,
           num_images: int = 0) -> str:
  """``'memory'``, ``'mmap'`` or ``'none'`` (stream) for ``data.cache=mode``.

  ``'auto'`` is ``'memory'`` when the estimated cache fits ``max_gb`` (10^9 bytes) and the run
  will use at least as many ``examples`` as the cache decodes (``num_images``; a two-step run
  decodes less by streaming), else ``'none'``.
  """
  check_mode(mode, max_gb)
  if mode != "auto":
    return mode
  if examples is not None and examples < num_images:
    return "none"
  return "memory" if estimated_bytes <= max_gb * 1e9 else "none"


@dataclasses.dataclass(frozen=True)
class CacheSpec:
  """What the cache stores (the ``ImageOptions`` and augmentation it serves)."""

  augmentation: str
  image_size: int
  resize_size: int
  channels: int = 3

  def __post_init__(self):
    augment.check_options(augmentation=self.augmentation, image_size=self.image_size,
                          resize_size=self.resize_size, channels=self.channels, mean=(0,),
                          std=(1,))


def cached_image(record, spec: CacheSpec) -> tuple[np.ndarray, tuple[int, int]]:
  """One record -> (uint8 ``[h, w, C]`` as cached, ``(height, width)`` of its crop source).

  The crop source (``augment.crop_source``) itself, except for ``'random_resized_crop'``,
  whose full-resolution source is resized to shorter side ``resize_size`` when larger.
  """
  image = augment.crop_source(record, augmentation=spec.augmentation,
                              image_size=spec.image_size, resize_size=spec.resize_size,
                              channels=spec.channels)
  w, h = image.size
  if spec.augmentation == "random_resized_crop" and min(w, h) > spec.resize_size:
    image = augment.resize_shorter(image, spec.resize_size)
  array = np.asarray(image)
  return (array[..., None] if array.ndim == 2 else array), (h, w)


class DecodedCache:
  """The cached images of a training split.

  Attributes:
    images: ``N`` uint8 arrays ``[h_i, w_i, C]`` (in memory, or views of a memory map).
    source_hw: int32 ``[N, 2]``, the ``(height, width)`` each crop source had.
    spec: the ``CacheSpec``.
    path: the memory-mapped files' stem, or ``''`` in memory.
  """

  def __init__(self, images: Sequence[np.ndarray], source_hw, spec: CacheSpec, *,
               path: str = ""):
    self.images, self.spec, self.path = images, spec, path
    self.source_hw = np.asarray(source_hw, np.int32).reshape(len(images), 2)

  def __len__(self) -> int:
    return len(self.images)

  @property
  def nbytes(self) -> int:
    return int(sum(a.nbytes for a in self.images))

  def __repr__(self) -> str:
    where = f"mmap {self.path}.u8" if self.path else "memory"
    return f"DecodedCache({len(self)} images, {self.nbytes / 1e9:.2f} GB, {where})"


def estimate_nbytes(images, spec: CacheSpec, *, sample: int = 16) -> int:
  """The cache's size in bytes, from ``sample`` evenly spaced images of a ``LazyImages``
  (decoded; the mean size times the count)."""
  n = len(images)
  if n == 0:
    return 0
  picks = np.unique(np.linspace(0, n - 1, min(n, sample)).round().astype(np.int64))
  sizes = [cached_image(images.record(int(i)), spec)[0].nbytes for i in picks]
  return int(round(np.mean(sizes) * n))


def fingerprint(images, spec: CacheSpec, *, sample: int = 16) -> str:
  """A hex digest of what a cache of ``images`` (``LazyImages``) holds: the format, the spec,
  the dataset's name and size, every row's record position, and ``sample`` evenly spaced
  records (their bytes, or a file's path, size and mtime)."""
  return records_fingerprint(images, [_FORMAT, dataclasses.asdict(spec)], sample=sample)


def records_fingerprint(images, header: list, *, sample: int = 16) -> str:
  """A hex digest of ``header`` (JSON values: what a cache stores, in which format) and the
  records of ``images`` (``LazyImages``): the dataset's name and size, every row's record
  position, and ``sample`` evenly spaced records (their bytes, or a file's path, size and
  mtime). The key of ``fingerprint`` and of the evaluation cache (``eval_cache``)."""
  h = hashlib.sha256()
  h.update(json.dumps([*header, images.name, len(images.records)]).encode())
  h.update(np.ascontiguousarray(images.indices, np.int64).tobytes())
  n = len(images)
  for i in np.unique(np.linspace(0, n - 1, min(n, sample)).round().astype(np.int64)):
    h.update(_record_bytes(images.record(int(i))))
  return h.hexdigest()[:20]


def _record_bytes(record) -> bytes:
  if isinstance(record, np.ndarray):
    return record.tobytes()
  if isinstance(record, (bytes, bytearray, memoryview)):
    return bytes(record)
  if isinstance(record, (str, os.PathLike)):
    path = os.fspath(record)
    stat = os.stat(path)
    return f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()
  return repr(record).encode()


def build(images, spec: CacheSpec, *, path: str = "", num_threads: int = 8,
          log: Callable[[str], None] | None = None, log_every_s: float = 5.0,
          chunk: int = 256) -> DecodedCache:
  """Decodes every image of ``images`` (a ``LazyImages``) once into a ``DecodedCache``.

  Args:
    images: the training split's ``LazyImages``.
    spec: what to store.
    path: ``''`` keeps the cache in memory; otherwise the stem of the memory-mapped files
      (``<path>.u8``, ``<path>.npz``; the folder is created). Files of the same fingerprint
      are mapped without decoding; others are rebuilt, under temporary names of this build
      (``temp_name``) renamed when complete, so two processes may build the same files at
      once.
    num_threads: decoding threads (Pillow releases the GIL).
    log: receives a progress line at most every ``log_every_s`` seconds and a last line,
      when the build takes longer than ``log_every_s / 2`` seconds (``None``: silent).
    chunk: images decoded per round (bounds the memory of a ``path`` build).
  """
  key = fingerprint(images, spec)
  if path:
    cached = load(path, key=key, spec=spec)
    if cached is not None:
      if log:
        log(f"decoded-image cache: mapped {cached} (built earlier)")
      return cached
  n, t0 = len(images), time.perf_counter()
  last = t0
  arrays, source_hw, nbytes = [], np.zeros((n, 2), np.int32), 0
  out = None
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data, index = temp_name(path + ".u8"), temp_name(path + ".npz")
    out = open(data, "wb")  # pylint: disable=consider-using-with
  shapes = np.zeros((n, 3), np.int64)
  try:
    with concurrent.futures.ThreadPoolExecutor(max(1, num_threads)) as pool:
      for start in range(0, n, chunk):
        rows = range(start, min(n, start + chunk))
        done = pool.map(lambda i: cached_image(images.record(i), spec), rows)
        for i, (array, hw) in zip(rows, done):
          source_hw[i], shapes[i] = hw, array.shape
          nbytes += array.nbytes
          if out is None:
            arrays.append(array)
          else:
            out.write(np.ascontiguousarray(array).tobytes())
        now = time.perf_counter()
        if log and now - last >= log_every_s:
          log(f"decoded-image cache: {rows.stop:,}/{n:,} images, {nbytes / 1e9:.2f} GB, "
              f"{now - t0:.0f} s")
          last = now
  except BaseException:
    if out is not None:
      out.close()
      os.remove(data)
    raise
  if path:
    out.close()
    offsets = np.concatenate([[0], np.cumsum(np.prod(shapes, axis=1))])
    cache = _mapped(data, offsets, shapes, source_hw, spec, path=path)  # this build's pixels
    os.replace(data, path + ".u8")
    with open(index, "wb") as f:
      np.savez(f, offsets=offsets, shapes=shapes, source_hw=source_hw,
               key=np.array(key), spec=np.array(json.dumps(dataclasses.asdict(spec))))
    os.replace(index, path + ".npz")
  else:
    cache = DecodedCache(arrays, source_hw, spec)
  elapsed = time.perf_counter() - t0
  if log and elapsed >= log_every_s / 2:
    log(f"decoded-image cache: {cache} built in {elapsed:.1f} s")
  return cache


def load(path: str, *, key: str, spec: CacheSpec) -> DecodedCache | None:
  """The memory-mapped cache at ``path`` if its files exist and hold ``key``, else ``None``."""
  index, data = path + ".npz", path + ".u8"
  if not (os.path.exists(index) and os.path.exists(data)):
    return None
  with np.load(index) as z:
    if str(z["key"]) != key:
      return None
    offsets, shapes, source_hw = z["offsets"], z["shapes"], z["source_hw"]
  if os.path.getsize(data) != int(offsets[-1]):
    return None
  return _mapped(data, offsets, shapes, source_hw, spec, path=path)


def _mapped(data: str, offsets, shapes, source_hw, spec: CacheSpec, *, path: str
            ) -> DecodedCache:
  """The ``DecodedCache`` of the raw file ``data`` (``offsets`` ``[N + 1]``, ``shapes``
  ``[N, 3]``) as views of one ``numpy.memmap``."""
  flat = np.memmap(data, np.uint8, mode="r") if offsets[-1] else np.zeros(0, np.uint8)
  views = [flat[int(offsets[i]):int(offsets[i + 1])].reshape(tuple(shapes[i]))
           for i in range(len(shapes))]
  return DecodedCache(views, source_hw, spec, path=path)


def temp_name(path: str) -> str:
  """A name beside ``path`` for one build to write before renaming it to ``path``, of this
  process and call (concurrent builds of the same files do not write into each other's).
  Those that a killed process left are removed (``remove_stale_temps``)."""
  remove_stale_temps(path)
  return f"{path}.{_host()}-{os.getpid()}-{secrets.token_hex(4)}.tmp"


def _host() -> str:
  """This machine's name in ``temp_name`` (letters, digits and '_' only)."""
  return "".join(c if c.isalnum() else "_" for c in socket.gethostname()) or "host"


def remove_stale_temps(path: str) -> None:
  """Removes the ``temp_name`` files of ``path`` written on this host by a process that no
  longer runs (a build that was killed: they would stay, as large as the cache, at every
  kill), and ``<path>.tmp`` of earlier versions. Another host's files are left alone (a
  workdir shared by the hosts of a run)."""
  folder = os.path.dirname(os.path.abspath(path))
  prefix = f"{os.path.basename(path)}.{_host()}-"
  if not os.path.isdir(folder):
    return
  try:   # the one temporary name of earlier versions (``<path>.tmp``), left by a killed build
    os.remove(path + ".tmp")
  except FileNotFoundError:
    pass
  for name in os.listdir(folder):
    pid = name[len(prefix):].split("-", 1)[0]
    if not (name.startswith(prefix) and name.endswith(".tmp") and pid.isdigit()):
      continue
    try:
      os.kill(int(pid), 0)
    except ProcessLookupError:
      try:
        os.remove(os.path.join(folder, name))
      except FileNotFoundError:
        pass
    except PermissionError:   # alive, another user's
      pass
