"""Finding and parsing the official files: clear errors naming the file, the folder searched,
the line, and where the dataset comes from.

* A required file or image that is missing: ``DatasetNotPreparedError`` (a
  ``FileNotFoundError``) naming it, the folder searched, the dataset's homepage and how to get
  it (``prepare --download`` or the source's note).
* A file that does not parse: ``ValueError`` naming the file and the line (text files), the
  record (``.mat`` arrays) or the byte offset (binary files).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence

import numpy as np

from dml_jax.data.images import DatasetNotPreparedError, not_there
from dml_jax.data.official.sources import SOURCES


def how_to_get(name: str) -> str:
  """One sentence: where dataset ``name`` comes from and how to get its files."""
  source = SOURCES[name]
  text = f"{source.title} comes from {source.homepage}; ROOT must hold {source.layout}."
  if any(a.url for a in source.archives):
    text += f" `python -m dml_jax.data.prepare {name} --root=ROOT --download` fetches it."
  if source.note:
    text += f" {source.note}"
  return text


def not_found(name: str, what: str, folder: str) -> DatasetNotPreparedError:
  """The error for a required file ``what`` (a name or a list of names) missing in
  ``folder``."""
  return DatasetNotPreparedError(f"{SOURCES[name].title}: {what} not found in {folder!r}. "
                                 f"{how_to_get(name)}")


def check_root(name: str, root: str) -> str:
  """``root`` as an absolute path; ``DatasetNotPreparedError`` if it is not a folder."""
  path = os.path.abspath(os.path.expanduser(root))
  if not os.path.isdir(path):
    raise DatasetNotPreparedError(f"{SOURCES[name].title}: the root folder {path!r} "
                                  f"{not_there(path)}. {how_to_get(name)}")
  return path


def find(name: str, folder: str, candidates: Sequence[str]) -> str:
  """The first of ``candidates`` (paths relative to ``folder``) that exists.

  Raises:
    DatasetNotPreparedError: none exists (naming them and ``folder``).
  """
  for candidate in candidates:
    path = os.path.join(folder, candidate)
    if os.path.exists(path):
      return path
  shown = " or ".join(repr(c) for c in candidates)
  raise not_found(name, shown, folder)


def dataset_folder(root: str, folder: str, marker: str) -> str:
  """``root/folder`` if it holds ``marker``, else ``root`` (ROOT may be the extracted folder
  itself or its parent)."""
  inner = os.path.join(root, folder)
  return inner if os.path.exists(os.path.join(inner, marker)) else root


def rows(path: str, *, num_fields: int, header: Sequence[str] = ()
         ) -> Iterator[tuple[str, list[str]]]:
  """Yields ``(where, fields)`` of the non-empty lines of a whitespace-separated text file
  (``where`` = ``'path:line'``), each with exactly ``num_fields`` fields; a first line equal
  to ``header`` is skipped.

  Raises:
    ValueError: a line with another number of fields (file, line and the line's text).
  """
  with open(path, encoding="utf-8-sig") as f:
    for lineno, line in enumerate(f, start=1):
      fields = line.split()
      if not fields or (lineno == 1 and header and fields == list(header)):
        continue
      where = f"{path}:{lineno}"
      if len(fields) != num_fields:
        raise ValueError(f"{where}: expected {num_fields} whitespace-separated fields, got "
                         f"{len(fields)}: {line.strip()!r}.")
      yield where, fields


def to_int(text: str, where: str, what: str, *, low: int, high: int | None = None) -> int:
  """``int(text)`` in ``[low, high]``; ``ValueError`` naming ``where`` and ``what`` else."""
  if re.fullmatch(r"[+-]?\d+", text) is None:
    raise ValueError(f"{where}: {what} {text!r} is not an integer.")
  value = int(text)
  if value < low or (high is not None and value > high):
    allowed = f"{low}..{high}" if high is not None else f">= {low}"
    raise ValueError(f"{where}: {what} {value} is out of range (allowed: {allowed}).")
  return value


def check_ints(values, where: str, what: str, *, low: int, high: int) -> np.ndarray:
  """``values`` as int64 ``[N]``, each in ``[low, high]``; ``ValueError`` naming ``where``,
  the first bad record's index and value."""
  values = np.asarray(values).reshape(-1)
  if not np.issubdtype(values.dtype, np.integer) and not (
      np.issubdtype(values.dtype, np.floating) and np.all(values == np.round(values))):
    raise ValueError(f"{where}: {what} must be integers, got dtype {values.dtype}.")
  values = values.astype(np.int64)
  bad = np.flatnonzero((values < low) | (values > high))
  if bad.size:
    raise ValueError(f"{where}: {what} of record {bad[0]} is {values[bad[0]]}, out of range "
                     f"(allowed: {low}..{high}; {bad.size} such records).")
  return values


def check_images(name: str, paths: Sequence[str], wheres: Sequence[str]) -> None:
  """``DatasetNotPreparedError`` naming the first listed image that is missing, where it is
  listed, and how many are missing."""
  missing = [k for k, p in enumerate(paths) if not os.path.isfile(p)]
  if missing:
    k = missing[0]
    raise DatasetNotPreparedError(
        f"{SOURCES[name].title}: {len(missing)} of the {len(paths)} listed images are "
        f"missing; the first is {paths[k]!r} (listed at {wheres[k]}). {how_to_get(name)}")


def load_mat(path: str, keys: Sequence[str]) -> dict:
  """The variables ``keys`` of a MATLAB ``.mat`` file (``scipy.io.loadmat``).

  Raises:
    ValueError: the file is not a readable ``.mat`` file, or lacks one of ``keys`` (naming
      the file and the variables it has).
  """
  import scipy.io  # pylint: disable=import-outside-toplevel
  try:
    mat = scipy.io.loadmat(path)
  except Exception as e:  # scipy raises ValueError, TypeError, OSError... for damaged files
    raise ValueError(f"{path}: not a readable MATLAB .mat file ({type(e).__name__}: {e}).") \
        from e
  missing = [k for k in keys if k not in mat]
  if missing:
    present = sorted(k for k in mat if not k.startswith("__"))
    raise ValueError(f"{path}: has no variable {', '.join(missing)}; it has {present}.")
  return mat


def struct_field(records: np.ndarray, field: str, path: str) -> list:
  """The values of ``field`` of a MATLAB struct array (``loadmat``), one per record: scalars
  as Python numbers, strings as ``str``.

  Raises:
    ValueError: the array is not a struct array with ``field`` (naming the file).
  """
  records = np.asarray(records).reshape(-1)
  names = records.dtype.names or ()
  if field not in names:
    raise ValueError(f"{path}: the struct array has no field {field!r}; its fields: "
                     f"{list(names)}.")
  out = []
  for k, value in enumerate(records[field]):
    value = np.asarray(value).reshape(-1)
    if value.size != 1:
      raise ValueError(f"{path}: record {k} has {value.size} values in field {field!r}, "
                       "expected one.")
    item = value[0]
    out.append(str(item) if isinstance(item, str) else item.item())
  return out
