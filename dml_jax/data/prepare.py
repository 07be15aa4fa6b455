r"""Checks (and with ``--download`` fetches) a benchmark's official files.

  python -m dml_jax.data.prepare NAME --root=DIR [--download] [--mirror=URL] [--keep_archives]

NAME is one of ``omniglot``, ``mnist`` (or ``mnist_evenodd``), ``cub``, ``cars196``, ``sop``,
``flowers102``. Without ``--download`` it reads the files in DIR with the readers that
training uses (``official``) and prints, for every published split, the images and classes
found next to the published counts, and the DML splits that training will see. The exit
status is 0 when every count equals the published one, 1 otherwise (or when files are
missing or damaged).

``--download`` first fetches the official archives that are not in DIR yet (the table in
``official.sources``), with a progress bar, verifies their checksums (SHA-256 of the file or,
for MNIST's gzip files, MD5 of the decompressed content), extracts those that need it and
deletes them (``--keep_archives`` keeps them). Interrupted downloads resume from
``FILE.part``; nothing that looks complete is written before the checksum is verified.
``--mirror=URL`` takes every file from ``URL/<file name>`` instead of the official address
(Cars196 has no live official address: a mirror is the only way to download it).

Then train with ``--config.data.options.root=DIR``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence

import numpy as np

from dml_jax.data import catalog, official, split_protocols
from dml_jax.data.images import DatasetNotPreparedError, ImageOptions
from dml_jax.data.official import download as download_lib
from dml_jax.data.official.sources import SOURCES, Expected, Source


@dataclasses.dataclass(frozen=True)
class PartCount:
  """What one published split holds, next to the published counts."""

  part: str
  images: int
  classes: int
  per_class: tuple[int, int]      # (min, max) images per class
  expected: Expected | None

  @property
  def problems(self) -> list[str]:
    """Differences from the published counts (empty: all equal)."""
    e = self.expected
    if e is None:
      return ["not a published split"]
    out = []
    if self.images != e.images:
      out.append(f"{self.images:,} images, published {e.images:,}")
    if self.classes != e.classes:
      out.append(f"{self.classes:,} classes, published {e.classes:,}")
    return out


def count_part(part_name: str, part: split_protocols.Part, expected: Expected | None) -> PartCount:
  """The counts of one part, per class of ``expected.feature`` (``'label'`` by default)."""
  feature = expected.feature if expected is not None else "label"
  values = np.asarray(part.values.get(feature, np.zeros(len(part), np.int64)))
  _, per_class = np.unique(values, return_counts=True)
  return PartCount(part_name, len(part), len(per_class),
                   (int(per_class.min()), int(per_class.max())), expected)


def per_class_problems(part: split_protocols.Part, expected: Expected) -> list[str]:
  """Classes whose image count differs from ``expected.per_class`` (first few named)."""
  if expected.per_class is None:
    return []
  values = np.asarray(part.values[expected.feature])
  classes, counts = np.unique(values, return_counts=True)
  if isinstance(expected.per_class, int):
    want = np.full(len(classes), expected.per_class)
  else:
    table = np.asarray(expected.per_class)
    want = np.where(classes < len(table), table[np.minimum(classes, len(table) - 1)], -1)
  bad = np.flatnonzero(counts != want)
  return [f"class {classes[k]}: {counts[k]} images, published {want[k]}" for k in bad[:3]] + (
      [f"... {len(bad) - 3} more classes differ"] if len(bad) > 3 else [])


def check(name: str, root: str, *, out=sys.stdout) -> bool:
  """Reads benchmark ``name`` from ``root``, prints its counts against the published ones
  and its DML splits; returns whether everything matches.

  Raises:
    DatasetNotPreparedError, ValueError: as the readers (``official``).
  """
  source = SOURCES[name]
  parts = official.read_parts(name, root)
  print(f"{source.title} in {os.path.abspath(root)} (from {source.homepage})", file=out)
  print(f"{'split':<12}{'images':>10}{'published':>11}{'classes':>9}{'published':>11}"
        f"{'per class':>12}  check", file=out)
  ok = True
  for part_name, part in parts.items():
    expected = source.expected.get(part_name)
    counts = count_part(part_name, part, expected)
    problems = counts.problems + (per_class_problems(part, expected) if expected else [])
    ok &= not problems
    lo, hi = counts.per_class
    print(f"{part_name:<12}{counts.images:>10,}{_published(expected, 'images'):>11}"
          f"{counts.classes:>9,}{_published(expected, 'classes'):>11}"
          f"{f'{lo}-{hi}' if lo != hi else str(lo):>12}  "
          f"{'OK' if not problems else '; '.join(problems)}", file=out)
  splits = split_protocols.make_splits(name, parts, catalog.lazy_images(name, ImageOptions()))
  print(f"DML splits (data.name={name!r}, --config.data.options.root={root}):", file=out)
  for split in splits.values():
    print(f"  {split.name:<22}{len(split):>9,} images {split.num_classes:>7,} classes  "
          f"label sets: {', '.join(sorted(split.label_sets))}", file=out)
  print("All counts equal the published ones." if ok else
        "Some counts differ from the published ones (see above).", file=out)
  return ok


def _published(expected: Expected | None, field: str) -> str:
  return f"{getattr(expected, field):,}" if expected is not None else "-"


def download(name: str, root: str, *, mirror: str = "", keep_archives: bool = False,
             progress: bool = True, sources: dict[str, Source] | None = None,
             out=sys.stdout) -> bool:
  """Fetches, verifies and extracts the archives of ``name`` that ``root`` lacks.

  Args:
    name: a key of ``sources``.
    root: the dataset folder (created if needed).
    mirror: base URL replacing the official address (``mirror/<file name>``).
    keep_archives: keep extracted archives.
    progress: tqdm progress bars.
    sources: the source table (default ``official.sources.SOURCES``; tests pass their own).

  Returns:
    False when an archive has no address (no live official one and no ``mirror``); the
    message says what to do.

  Raises:
    download.DownloadError, download.ChecksumError: a failed or damaged download.
  """
  source = (sources or SOURCES)[name]
  os.makedirs(root, exist_ok=True)
  unavailable = []
  for archive in source.archives:
    present = [p for p in archive.provides if os.path.exists(os.path.join(root, p))]
    if present:
      print(f"{archive.filename}: {present[0]} is already in {root}.", file=out)
      continue
    path = os.path.join(root, archive.filename)
    checked = []
    if os.path.isfile(path):  # downloaded earlier, not extracted yet
      checked.append(download_lib.verify(path, archive))
    else:
      url = f"{mirror.rstrip('/')}/{archive.filename}" if mirror else archive.url
      if not url:
        unavailable.append(archive.filename)
        continue
      print(f"{archive.filename}: downloading {url}", file=out)
      download_lib.fetch(url, path, progress=progress,
                         check=lambda p, a=archive: checked.append(download_lib.verify(p, a)))
    print(f"{archive.filename}: checksum OK ({checked[0]}).", file=out)
    if archive.extract:
      created = download_lib.extract(path, root)
      print(f"{archive.filename}: extracted {', '.join(created)}.", file=out)
      if not keep_archives:
        os.remove(path)
  if unavailable:
    print(f"{', '.join(unavailable)}: no live official address. {source.note}", file=out)
  return not unavailable


def main(argv: Sequence[str] | None = None, *, out=sys.stdout) -> int:
  """The command line (module docstring); returns the exit status."""
  parser = argparse.ArgumentParser(prog="python -m dml_jax.data.prepare",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("name", choices=sorted(SOURCES), help="the benchmark (data.name)")
  parser.add_argument("--root", required=True, help="the folder of its official files")
  parser.add_argument("--download", action="store_true",
                      help="fetch, verify and extract the missing official archives first")
  parser.add_argument("--mirror", default="",
                      help="base URL to download from instead of the official address")
  parser.add_argument("--keep_archives", action="store_true",
                      help="keep the downloaded archives after extracting them")
  parser.add_argument("--no_progress", action="store_true", help="no progress bars")
  args = parser.parse_args(argv)
  try:
    if args.download and not download(args.name, args.root, mirror=args.mirror,
                                      keep_archives=args.keep_archives,
                                      progress=not args.no_progress, out=out):
      return 1
    return 0 if check(args.name, args.root, out=out) else 1
  except (DatasetNotPreparedError, ValueError, download_lib.DownloadError) as e:
    print(f"error: {e}", file=out)
    return 1


if __name__ == "__main__":
  sys.exit(main())
