"""Downloading the official archives: resumable, verified, extracted.

``fetch`` writes ``DEST.part`` and renames it to ``DEST`` only once the download is complete
and its checksum verified, so an interrupted download never leaves a file that looks
complete. An interrupted download is resumed (HTTP ``Range``) within the call (``attempts``)
and by a later call from the kept ``.part``; a server that ignores ``Range`` makes it start
again. A wrong checksum deletes the ``.part`` and raises ``ChecksumError``.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable

import tqdm

from dml_jax.data.official.sources import Archive

_RETRY_HTTP = (408, 429, 500, 502, 503, 504)


class ChecksumError(ValueError):
  """A downloaded file's checksum differs from the published one."""


class DownloadError(OSError):
  """A download failed (network error, HTTP error, or fewer bytes than announced)."""


def file_hash(path: str, algorithm: str, *, decompress: bool = False) -> str:
  """Hex digest of the file (of its gzip-decompressed content with ``decompress`` and a gzip
  file).

  Raises:
    ChecksumError: ``decompress`` and a damaged or truncated gzip stream.
  """
  digest = hashlib.new(algorithm)
  with open(path, "rb") as raw:
    is_gzip = raw.read(2) == b"\x1f\x8b"
  opener = gzip.open if decompress and is_gzip else open
  try:
    with opener(path, "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
  except (EOFError, OSError, zlib.error) as e:
    raise ChecksumError(f"{path}: damaged or truncated gzip file ({e}).") from e
  return digest.hexdigest()


def verify(path: str, archive: Archive) -> str:
  """Checks ``path`` against ``archive``'s published SHA-256 or the MD5 of its decompressed
  content (either accepts it). Returns what matched.

  Raises:
    ChecksumError: neither matches (naming the file and both digests).
  """
  if not archive.sha256 and not archive.content_md5:
    return "no published checksum"
  got = []
  if archive.sha256:
    sha = file_hash(path, "sha256")
    if sha == archive.sha256:
      return "SHA-256"
    got.append(f"SHA-256 {sha} (published {archive.sha256})")
  if archive.content_md5:
    md5 = file_hash(path, "md5", decompress=True)
    if md5 == archive.content_md5:
      return "MD5 of the decompressed content"
    got.append(f"MD5 of the decompressed content {md5} (published {archive.content_md5})")
  raise ChecksumError(f"{path}: wrong checksum: {'; '.join(got)}. The download is damaged or "
                      "is not the official file.")


def _download_once(url: str, part: str, *, timeout: float, progress: bool,
                   chunk_size: int) -> None:
  """Appends the rest of ``url`` to ``part`` (resuming from its size when the server honours
  ``Range``, else from scratch).

  Raises:
    DownloadError: the transfer ended before the announced size.
    OSError, http.client.HTTPException: network errors (``urllib``).
  """
  offset = os.path.getsize(part) if os.path.exists(part) else 0
  headers = {"Range": f"bytes={offset}-"} if offset else {}
  try:
    response = urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                      timeout=timeout)
  except urllib.error.HTTPError as e:
    if e.code == 416 and offset:  # nothing left to send: the part is complete (verified next)
      return
    raise
  with response:
    status = getattr(response, "status", None)
    if offset and status != 206:
      offset = 0  # the server ignores Range: start again
    elif offset and not (response.headers.get("Content-Range") or "").startswith(
        f"bytes {offset}-"):
      os.remove(part)
      raise DownloadError(f"{url}: the server resumed at another offset than {offset} "
                          f"({response.headers.get('Content-Range')!r}); starting again.")
    length = response.headers.get("Content-Length")
    total = offset + int(length) if length else None
    with open(part, "ab" if offset else "wb") as f, tqdm.tqdm(
        total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
        desc=os.path.basename(part)[:-len(".part")], disable=not progress,
        file=sys.stderr) as bar:
      for chunk in iter(lambda: response.read(chunk_size), b""):
        f.write(chunk)
        bar.update(len(chunk))
  size = os.path.getsize(part)
  if total is not None and size < total:
    raise DownloadError(f"{url}: the transfer stopped after {size} of {total} bytes.")


def fetch(url: str, dest: str, *, check: Callable[[str], object] | None = None,
          attempts: int = 3, timeout: float = 60.0, progress: bool = True,
          chunk_size: int = 1 << 20) -> str:
  """Downloads ``url`` to ``dest`` through ``dest + '.part'`` (module docstring).

  Args:
    url: http(s) or ftp address.
    dest: the final file.
    check: called with the complete ``.part`` (e.g. ``verify``); raising ``ChecksumError``
      deletes it.
    attempts: transfers tried (each resuming the last) before giving up.
    timeout: seconds without data before a transfer counts as interrupted.
    progress: show a tqdm progress bar on stderr.
    chunk_size: bytes read at a time.

  Returns:
    ``dest``.

  Raises:
    DownloadError: every attempt failed, or an HTTP error that a retry cannot fix (e.g.
      404); a partial ``.part`` is kept for the next call to resume.
    ChecksumError: the complete download has the wrong checksum (``.part`` deleted).
  """
  if attempts < 1:
    raise ValueError(f"attempts must be >= 1, got {attempts}.")
  part = dest + ".part"
  error = None
  for _ in range(attempts):
    try:
      _download_once(url, part, timeout=timeout, progress=progress, chunk_size=chunk_size)
      break
    except urllib.error.HTTPError as e:
      if e.code not in _RETRY_HTTP:
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}.") from e
      error = e
    except (OSError, http.client.HTTPException) as e:
      error = e
  else:
    kept = os.path.getsize(part) if os.path.exists(part) else 0
    raise DownloadError(f"{url}: download failed {attempts} times (last: "
                        f"{type(error).__name__}: {error}); {kept} bytes are kept in {part!r} "
                        "and the next run resumes from there.") from error
  if check is not None:
    try:
      check(part)
    except ChecksumError as e:
      os.remove(part)
      raise ChecksumError(f"{url}: {e} It was deleted.") from e
  os.replace(part, dest)
  return dest


def extract(path: str, root: str) -> list[str]:
  """Unpacks the tar (any compression) or zip file ``path`` into ``root``.

  Members are unpacked into a temporary folder in ``root`` first and then moved into place
  entry by entry, so an interrupted extraction leaves no partly written top-level entry.
  Unsafe member paths (absolute, ``..``, links out of the folder) are refused.

  Returns:
    The top-level entries created in ``root``.

  Raises:
    ValueError: ``path`` is neither a tar nor a zip file, or has an unsafe member.
  """
  staging = os.path.join(root, f".extracting-{os.path.basename(path)}")
  shutil.rmtree(staging, ignore_errors=True)
  os.makedirs(staging)
  try:
    if tarfile.is_tarfile(path):
      with tarfile.open(path) as tar:
        try:
          tar.extractall(staging, filter="data")
        except tarfile.FilterError as e:
          raise ValueError(f"{path}: unsafe member ({e}).") from e
    elif zipfile.is_zipfile(path):
      with zipfile.ZipFile(path) as z:
        z.extractall(staging)  # zipfile drops absolute and '..' components
    else:
      raise ValueError(f"{path}: neither a tar nor a zip file.")
    created = []
    for entry in sorted(os.listdir(staging)):
      target = os.path.join(root, entry)
      if os.path.isdir(target) and os.path.isdir(os.path.join(staging, entry)):
        shutil.rmtree(target)  # a folder from an earlier, interrupted run
      os.replace(os.path.join(staging, entry), target)
      created.append(entry)
    return created
  finally:
    shutil.rmtree(staging, ignore_errors=True)
