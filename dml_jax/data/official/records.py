"""Random-access image records of the official files: members of a zip file read in place,
and small grey images decoded once and kept in memory.

Both are picklable (grain worker processes get a copy without the open zip or the cache) and
safe to read from the decoding threads of ``LazyImages`` and the training pipeline.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence

import numpy as np

from dml_jax.data import augment


class ZipMembers(Sequence):
  """``records[i]`` = the bytes of member ``names[i]`` of the zip file ``path``.

  The zip is opened on first access in each process; threads share the handle (``zipfile``
  serialises reads of one archive with its own lock).
  """

  def __init__(self, path: str, names: Sequence[str]):
    self.path, self.names = path, tuple(names)
    self._zip = None

  def __getstate__(self):
    return {"path": self.path, "names": self.names}

  def __setstate__(self, state):
    self.__init__(state["path"], state["names"])

  def __len__(self) -> int:
    return len(self.names)

  def __getitem__(self, i) -> bytes:
    if self._zip is None:
      self._zip = zipfile.ZipFile(self.path)
    return self._zip.read(self.names[int(i)])

  def where(self, i) -> str:
    """``'path:member'`` of record ``i``, for messages."""
    return f"{self.path}:{self.names[int(i)]}"


class DecodedGrey(Sequence):
  """``records[i]`` decoded once to a grey uint8 ``[H, W]`` image and kept in memory.

  For small images read many times (Omniglot: an epoch decodes each PNG again): the cache
  holds black-and-white images (every pixel 0 or 255, as Omniglot's 1-bit PNGs) packed to
  one bit a pixel (1.4 kB for 105 x 105), others as uint8. The returned image equals
  ``augment.decode(records[i], channels=1)[..., 0]``.

  Args:
    records: encoded records (bytes or file paths); ``records.where(i)`` (if present) names a
      record in error messages.
  """

  def __init__(self, records: Sequence):
    self.records = records
    self._cache = {}

  def __getstate__(self):
    return {"records": self.records}

  def __setstate__(self, state):
    self.__init__(state["records"])

  def __len__(self) -> int:
    return len(self.records)

  def __getitem__(self, i) -> np.ndarray:
    i = int(i)
    hit = self._cache.get(i)
    if hit is None:
      hit = self._cache[i] = _pack(self._decode(i))
    return _unpack(hit)

  def _decode(self, i: int) -> np.ndarray:
    try:
      return np.asarray(augment.load_image(self.records[i], channels=1))
    except ValueError as e:
      where = self.records.where(i) if hasattr(self.records, "where") else f"record {i}"
      raise ValueError(f"{where}: {e}") from e


def _pack(image: np.ndarray) -> tuple:
  """uint8 ``[H, W]`` -> ``('bits', shape, packed)`` if black and white, else
  ``('raw', shape, image)``."""
  if np.all((image == 0) | (image == 255)):
    return ("bits", image.shape, np.packbits(image.reshape(-1) > 127))
  image = np.array(image)
  image.setflags(write=False)
  return ("raw", image.shape, image)


def _unpack(entry: tuple) -> np.ndarray:
  kind, shape, data = entry
  if kind == "raw":
    return data
  bits = np.unpackbits(data, count=int(np.prod(shape)))
  return (bits * np.uint8(255)).reshape(shape)
