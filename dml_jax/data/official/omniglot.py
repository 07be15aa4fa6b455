"""Omniglot from its official zips (read in place) or their extracted folders.

Official layout (https://github.com/brendenlake/omniglot, ``python/``)::

    images_background.zip   images_background/<Alphabet>/characterNN/<charid>_<drawer>.png
    images_evaluation.zip   images_evaluation/<Alphabet>/characterNN/<charid>_<drawer>.png

30 + 20 alphabets, 964 + 659 characters, 20 drawings each, 105 x 105 1-bit PNG. ``charid``
(``0001``..``1623``) numbers the characters of both sets. ROOT holds the two zips or the two
extracted folders (a zip is used when both exist).

``read`` returns the parts ``'train'`` (background) and ``'test'`` (evaluation) with the
TFDS builder's features: ``'alphabet'`` = the rank of the alphabet's name among the 50 sorted
names of both sets, ``'label'`` = ``charid - 1`` (the character, 0..1622). Records are
``DecodedGrey`` images (uint8 ``[105, 105]``, decoded once and cached), rows sorted by path.
"""

from __future__ import annotations

import os
import re
import zipfile

import numpy as np

from dml_jax.data import split_protocols
from dml_jax.data.official import files
from dml_jax.data.official.records import DecodedGrey, ZipMembers

PARTS = {"train": "images_background", "test": "images_evaluation"}
_PATH = re.compile(r"(?:.*/)?(?P<alphabet>[^/]+)/character(?P<char>\d+)/"
                   r"(?P<id>\d+)_(?P<drawer>\d+)\.png")


def _is_drawing(path: str) -> bool:
  base = path.rsplit("/", 1)[-1]
  return (path.lower().endswith(".png") and not base.startswith(".")
          and not path.startswith("__MACOSX/"))


def list_set(root: str, folder: str) -> tuple[ZipMembers | list[str], list[str], str]:
  """The drawings of one set: ``(records, paths, location)`` where ``paths`` are relative
  ``/``-separated paths (sorted) and ``records`` the zip members or absolute file paths.

  Raises:
    DatasetNotPreparedError: neither ``folder.zip`` nor ``folder/`` is in ``root``.
    ValueError: an unreadable zip, or no PNG in it (naming the file).
  """
  zip_path, dir_path = os.path.join(root, folder + ".zip"), os.path.join(root, folder)
  if os.path.isfile(zip_path):
    try:
      with zipfile.ZipFile(zip_path) as z:
        names = sorted(n for n in z.namelist() if _is_drawing(n))
    except zipfile.BadZipFile as e:
      raise ValueError(f"{zip_path}: not a readable zip file ({e}); a truncated download?") \
          from e
    records, location = ZipMembers(zip_path, names), zip_path
  elif os.path.isdir(dir_path):
    names = sorted(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
                   for d, _, fs in os.walk(dir_path) for f in fs)
    names = [n for n in names if _is_drawing(n)]
    records, location = [os.path.join(root, n) for n in names], dir_path
  else:
    raise files.not_found("omniglot", f"{folder + '.zip'!r} or the folder {folder + '/'!r}",
                          root)
  if not names:
    raise ValueError(f"{location}: no PNG drawing in it; expected "
                     f"{folder}/<Alphabet>/characterNN/<charid>_<drawer>.png.")
  return records, names, location


def parse_paths(paths: list[str], location: str) -> list[tuple[str, int, int]]:
  """``(alphabet name, character number in the alphabet, charid)`` of each drawing path.

  Raises:
    ValueError: a path not of the form ``<Alphabet>/characterNN/<charid>_<drawer>.png``, or
      a charid of 0 (naming the location and the path).
  """
  out = []
  for path in paths:
    match = _PATH.fullmatch(path)
    if match is None:
      raise ValueError(f"{location}: {path!r} is not of the form "
                       "<Alphabet>/characterNN/<charid>_<drawer>.png.")
    charid = files.to_int(match["id"], f"{location}:{path}", "the character id", low=1)
    out.append((match["alphabet"], int(match["char"]), charid))
  return out


def _check_characters(parsed: dict[str, list[tuple[str, int, int]]],
                      paths: dict[str, list[str]], locations: dict[str, str]) -> None:
  """ValueError if one charid names two characters (alphabet, number) or vice versa."""
  seen = {}
  for part, entries in parsed.items():
    for (alphabet, char, charid), path in zip(entries, paths[part]):
      for key, value in (((alphabet, char), charid), (charid, (alphabet, char))):
        first = seen.setdefault(key, (value, f"{locations[part]}:{path}"))
        if first[0] != value:
          raise ValueError(f"{locations[part]}:{path}: the character id {charid} of "
                           f"{alphabet}/character{char:02d} disagrees with {first[1]}.")


def read(name: str, root: str) -> dict[str, split_protocols.Part]:
  """The parts ``'train'`` (background) and ``'test'`` (evaluation); see the module
  docstring. ``name`` is ``'omniglot'`` (for messages)."""
  del name
  root = files.check_root("omniglot", root)
  listed = {part: list_set(root, folder) for part, folder in PARTS.items()}
  paths = {part: names for part, (_, names, _) in listed.items()}
  locations = {part: location for part, (_, _, location) in listed.items()}
  parsed = {part: parse_paths(paths[part], locations[part]) for part in PARTS}
  _check_characters(parsed, paths, locations)
  alphabets = sorted({a for entries in parsed.values() for a, _, _ in entries})
  rank = {a: k for k, a in enumerate(alphabets)}
  parts = {}
  for part, (records, _, _) in listed.items():
    values = {"alphabet": np.asarray([rank[a] for a, _, _ in parsed[part]], np.int64),
              "label": np.asarray([c - 1 for _, _, c in parsed[part]], np.int64)}
    parts[part] = split_protocols.Part(DecodedGrey(records), values)
  return parts
