"""MNIST from its four IDX files (``.gz`` or not), held in memory as uint8.

IDX format (LeCun et al.): a 4-byte magic number ``0x00 0x00 <type> <rank>``, then ``rank``
big-endian int32 dimensions, then the values, row-major. MNIST's images are type ``0x08``
(unsigned byte) rank 3 ``[N, 28, 28]``, its labels type ``0x08`` rank 1 ``[N]``.
Compression is detected from the content (gzip magic ``1f 8b``), not the name.

``read`` returns the parts ``'train'`` and ``'test'``: records ``uint8 [N, 28, 28]`` (one
image per row; ``augment`` treats a 2-D uint8 array as a grey image) and ``'label'`` = the
digit. The MNIST protocols (``split_protocols.digit_splits``) make the DML splits of ``mnist`` and
``mnist_evenodd``.
"""

from __future__ import annotations

import gzip
import zlib

import numpy as np

from dml_jax.data import split_protocols
from dml_jax.data.official import files

# IDX type byte -> big-endian numpy dtype
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
# part -> (images file, labels file), without '.gz'
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_bytes(path: str) -> bytes:
  """The content of ``path``, decompressed if it is gzip.

  Raises:
    ValueError: a truncated or damaged gzip stream (naming the file).
  """
  with open(path, "rb") as f:
    data = f.read()
  if data[:2] != b"\x1f\x8b":
    return data
  try:
    return gzip.decompress(data)
  except (EOFError, OSError, zlib.error) as e:
    raise ValueError(f"{path}: damaged or truncated gzip file ({e}).") from e


def parse_idx(data: bytes, *, path: str = "IDX data") -> np.ndarray:
  """An IDX array from its bytes.

  Returns:
    The array of the header's shape, in native byte order (uint8 for type 0x08), read-only.

  Raises:
    ValueError: a bad magic number, an unknown type, or a size that differs from the
      header's (truncated or trailing bytes), naming ``path`` and the byte offset.
  """
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in IDX_TYPES:
    raise ValueError(f"{path}: byte 0: bad IDX magic number {data[:4].hex() or '(empty)'}; "
                     f"expected 0000 <type> <rank> with type in "
                     f"{', '.join(f'{t:02x}' for t in IDX_TYPES)} (MNIST: 00000803 images, "
                     "00000801 labels). Is this an IDX file?")
  dtype, rank = np.dtype(IDX_TYPES[data[2]]), data[3]
  header = 4 + 4 * rank
  if len(data) < header:
    raise ValueError(f"{path}: truncated at byte {len(data)}: the header of a rank-{rank} IDX "
                     f"file has {header} bytes.")
  shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=rank, offset=4))
  size = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(data) != size:
    what = "truncated" if len(data) < size else "has trailing bytes"
    raise ValueError(f"{path}: {what}: the header announces shape {shape} ({size} bytes "
                     f"with the header), the file has {len(data)} bytes.")
  array = np.frombuffer(data, dtype, offset=header).reshape(shape)
  return array.astype(dtype.newbyteorder("="), copy=False)


def read_idx(path: str) -> np.ndarray:
  """The IDX array in ``path`` (gzip or not); see ``parse_idx``."""
  return parse_idx(read_bytes(path), path=path)


def find_file(name: str, root: str, stem: str) -> str:
  """``root/stem`` or ``root/stem.gz`` (also the ``train-images.idx3-ubyte`` spelling of
  some extractors); ``DatasetNotPreparedError`` naming the file and ``root`` otherwise."""
  dotted = stem.replace("-idx", ".idx")
  return files.find(name, root, (stem + ".gz", stem, dotted, dotted + ".gz"))


def read_part(name: str, root: str, images_stem: str, labels_stem: str
              ) -> split_protocols.Part:
  """One part: images uint8 ``[N, 28, 28]`` and ``{'label': int64 [N]}``.

  Raises:
    DatasetNotPreparedError: a file is missing.
    ValueError: a damaged file, images that are not ``[N, H, W]`` uint8, labels that are not
      ``[N]`` digits 0..9, or different counts (naming the files).
  """
  images_path = find_file(name, root, images_stem)
  labels_path = find_file(name, root, labels_stem)
  images, labels = read_idx(images_path), read_idx(labels_path)
  if images.ndim != 3 or images.dtype != np.uint8:
    raise ValueError(f"{images_path}: expected uint8 images [N, H, W], got {images.dtype} "
                     f"{images.shape}.")
  if labels.ndim != 1:
    raise ValueError(f"{labels_path}: expected labels [N], got shape {labels.shape}.")
  if len(labels) != len(images):
    raise ValueError(f"{labels_path} has {len(labels)} labels but {images_path} has "
                     f"{len(images)} images.")
  digits = files.check_ints(labels, labels_path, "the label", low=0, high=9)
  return split_protocols.Part(images, {"label": digits})


def read(name: str, root: str) -> dict[str, split_protocols.Part]:
  """The parts ``'train'`` and ``'test'`` of MNIST from the IDX files in ``root`` (``name``:
  ``'mnist'`` or ``'mnist_evenodd'``, for messages)."""
  root = files.check_root(name, root)
  return {part: read_part(name, root, *stems) for part, stems in FILES.items()}

