"""The repository speaks of the project only: no tracked text file (outside ``.ci/`` and the
golden data of ``tests/golden/``) refers to how the code was built (numbered issues, goals or
sessions, a design file outside the repository, the machine or folders of the people who built
it). Data and paper locations are the user's choice (e.g. ``--config.data.options.root=
/data/omniglot``); tests that read real data take their folder from ``DML_JAX_TEST_DATA``.

This file holds the patterns and their examples, so it is the one file the scan leaves out.
"""

import os
import re
import subprocess

import pytest

from dml_test_support import ROOT

# Each pattern names a process reference; technical uses of the same words stay allowed
# (pytest's session-scoped fixtures, TensorBoard's SessionLog, "by design"). The word before
# each pattern is a lower-case substring of every match: a file without it skips that pattern.
# The words are spelt in pieces here (``_w``) so that this file does not show them itself.
def _w(*pieces: str) -> str:
  return "".join(pieces)


ISSUE, GOAL, SESSION = _w("iss", "ue"), _w("go", "al"), _w("sess", "ion")
PROCESS_WORDS = [
    (ISSUE, re.compile(_w(r"\b", ISSUE, r"s? ?#?\d+"), re.IGNORECASE)),
    (ISSUE, re.compile(_w(r"\b", ISSUE, r"'s\b|\b", ISSUE, " 'done when'"), re.IGNORECASE)),
    (GOAL, re.compile(_w(r"\b", GOAL, r"s? \d+"), re.IGNORECASE)),
    (SESSION, re.compile(_w(r"\b", SESSION, r"s? \d+"), re.IGNORECASE)),
    (SESSION, re.compile(_w(r"\b(this|that|last|previous|first|latest|earlier|next|one) ",
                            SESSION, r"\b"), re.IGNORECASE)),
    (SESSION, re.compile(_w(r"\bthe ", SESSION, r" (before|after|that)\b"), re.IGNORECASE)),
    ("design", re.compile(_w(r"\bDES", r"IGN\b"))),
    ("lent", re.compile(_w(r"\blent (GPU )?", "machine"), re.IGNORECASE)),
    ("task", re.compile(_w(r"\bthis ", r"task\b|\bthe ", r"task asks\b"), re.IGNORECASE)),
    (_w("..", "/shared"), re.compile(_w(r"\.\.", r"/shared\b"))),
    ("shared/", re.compile(_w(r"\bshared/", r"(data|papers)\b"))),
    ("/work/", re.compile(_w(r"/work/", r"(main|shared)\b"))),
    ("papers/", re.compile(_w(r"\bpapers/", r"[\w.-]+\.txt\b"))),
]

SKIPPED_PREFIXES = (".ci/", "tests/golden/")
THIS_FILE = "tests/test_wording.py"


def process_words(text: str) -> list[tuple[int, str]]:
  """``(line number, matched text)`` of every process word in ``text``, in line order."""
  lower, hits = text.lower(), []
  for word, pattern in PROCESS_WORDS:
    if word in lower:
      hits.extend((text.count("\n", 0, m.start()) + 1, m.group(0))
                  for m in pattern.finditer(text))
  return sorted(hits)


def tracked_text_files() -> list[str]:
  """The tracked files the scan reads (paths relative to the repository root)."""
  try:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode()
  except (OSError, subprocess.CalledProcessError) as e:
    pytest.skip(f"not a git checkout with git on PATH ({e}): nothing to scan")
  return [p for p in listed.split("\0")
          if p and p != THIS_FILE and not p.startswith(SKIPPED_PREFIXES)]


def test_tracked_files_speak_of_the_project_only():
  hits = []
  for path in tracked_text_files():
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):   # deleted in the working tree
      continue
    with open(full, "rb") as f:
      data = f.read()
    if b"\0" in data[:8192]:       # binary (figures, arrays)
      continue
    try:
      text = data.decode("utf-8")
    except UnicodeDecodeError:
      continue
    words = {}
    for number, word in process_words(text):
      words.setdefault(number, []).append(repr(word))
    hits.extend(f"{path}:{number}: {', '.join(w)}" for number, w in words.items())
  assert not hits, ("process words (state what is true of the code instead):\n"
                    + "\n".join(hits))


@pytest.mark.parametrize("text", [
    _w("the sampler rule (", ISSUE, " 18)"), _w("Iss", "ue 3: the fast paths"),
    _w(ISSUE, "s 17 / 18"), _w(GOAL, " 0 is met"), _w("in ", SESSION, " 4"),
    _w("the previous ", SESSION, "'s runs"), _w("this ", SESSION, "'s table"),
    _w("the config fields (DES", "IGN.md §3 schema)"), _w("DES", "IGN §4"),
    _w("on the lent ", "machine of this ", "task"), _w("a lent GPU ", "machine"),
    _w("--root=..", "/shared/data/mnist"), _w("/work", "/shared/data/mnist"),
    _w("``papers/", "dro-pairwise-metric-learning.txt``"), _w("the ", ISSUE, "'s EPHN pipeline"),
])
def test_process_words_are_found(text):
  assert process_words(text), text


@pytest.mark.parametrize("text", [
    '@pytest.fixture(scope="session")', "on the test session's 8 fake CPU devices",
    "event_pb2.SessionLog.START", "differ by design", "--workdir=/shared/W",
    "--config.data.options.root=/data/omniglot", "goal <= 1.5x", "one task per node",
])
def test_technical_uses_are_not_process_words(text):
  assert not process_words(text), text
