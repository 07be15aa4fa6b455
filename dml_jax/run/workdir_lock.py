"""One training run per workdir at a time.

Two ``train.py`` (or sweep) processes on one workdir would both write its checkpoints,
``metrics.jsonl`` and TensorBoard files, interleaving two copies of the run, and
``--overwrite`` would delete the checkpoints of a run still training there. While it trains,
:func:`hold` keeps an exclusive lock (``flock``) on ``<workdir>/.dml_jax.lock``, a small JSON
file naming its holder (program, pid, host, start time). A second run finds it locked and
stops with one line naming the holder, before it reads a checkpoint, writes or deletes
anything.

* The kernel releases the lock when its process ends, however it ends (a kill, a crash), so a
  file left behind by a killed run locks nothing; a run that ends otherwise removes it, and the
  workdir too when it created it and nothing else was written there (a refused first run).
* On several processes (multi-host), process 0 holds the lock for all of them and tells the
  others whether they may go on.
* ``eval.py`` and the analysis tools take no lock: they read a workdir beside the run
  training in it.
* A sweep started in several processes shares its runs through these locks
  (``experiments.sweep``); :func:`live_holder` tells who trains in a workdir without taking
  the lock (``python -m dml_jax.run.experiments status``).
* On a file system without locks (some FUSE mounts), or a system without ``fcntl``, a warning
  says so and the run goes on unguarded.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
import time
from collections.abc import Iterator

from absl import logging
import jax
import numpy as np

from dml_jax.run import workdir as workdir_lib

try:
  import fcntl
except ImportError:   # not a POSIX system: no locks, as on a file system without them
  fcntl = None

LOCK_FILE = ".dml_jax.lock"


class WorkdirInUseError(ValueError):
  """Another process trains in the workdir (holds its lock); ``holder`` names it."""

  def __init__(self, message: str, holder: str = "another process"):
    super().__init__(message)
    self.holder = holder


def lock_path(workdir: str) -> str:
  """``<workdir>/.dml_jax.lock``."""
  return os.path.join(workdir, LOCK_FILE)


def _named(info) -> str:
  return (f"{info['program']} (pid {int(info['pid'])} on host {info['host']}, started "
          f"{info['started']})")


def holder(path: str, tries: int = 10) -> str:
  """Who holds the lock file ``path``, as its holder wrote it (``'train.py (pid 12 on host
  h, started 2026-12-02 03:40:00 UTC)'``), or ``'another process'`` when the file cannot be
  read: not a dml_jax program's, or still empty after ``tries`` looks 50 ms apart (its holder
  writes it just after locking it)."""
  for attempt in range(tries):
    try:
      with open(path) as f:
        return _named(json.load(f))
    except (OSError, ValueError, KeyError, TypeError):
      if attempt + 1 < tries:
        time.sleep(0.05)
  return "another process"


def live_holder(workdir: str) -> str | None:
  """Who trains in ``workdir`` by its lock file, taking no lock (so never in a run's way):
  the holder it names while that process runs (its pid alive, when on this host; on another
  host, as written), ``None`` without a file or for one that a killed run left here."""
  try:
    with open(lock_path(workdir)) as f:
      info = json.load(f)
    pid = int(info["pid"])
    named = _named(info)
  except FileNotFoundError:
    return None
  except (OSError, ValueError, KeyError, TypeError):
    return "another process"   # its holder is writing it
  if info["host"] == socket.gethostname():
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return None
    except PermissionError:   # another user's process
      pass
  return named


def this_program(argv0: str | None = None) -> str:
  """How the running program is named in a lock file: ``'python -m dml_jax.run.experiments'``
  for a module of this package run with ``-m``, else the script's name (``'train.py'``)."""
  argv0 = (sys.argv[0] if sys.argv else "") if argv0 is None else argv0
  package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  path = os.path.abspath(argv0) if argv0 else ""
  if path.endswith(".py") and path.startswith(os.path.join(package, "dml_jax") + os.sep):
    return "python -m " + os.path.relpath(path, package)[:-3].replace(os.sep, ".")
  return os.path.basename(argv0) or "python"


def _describe(program: str) -> str:
  started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
  return json.dumps({"program": program, "pid": os.getpid(), "host": socket.gethostname(),
                     "started": started}) + "\n"


def acquire(workdir: str, program: str) -> tuple[int | None, str | None]:
  """Tries once to lock ``workdir`` (an existing folder) for ``program``.

  Returns:
    ``(fd, None)``: held, the file descriptor to :func:`release`; ``(None, holder)``: another
    process holds it (:func:`holder`); ``(None, None)``: no locks there (the file system, or
    the system, has none; a warning says why and that the run goes on unguarded).

  Raises:
    OSError: the lock file cannot be created (a read-only or foreign folder).
  """
  path = lock_path(workdir)
  why = "this system has no fcntl"
  while fcntl is not None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      return None, holder(path)
    except OSError as e:   # ENOLCK, ENOSYS, EOPNOTSUPP, ... of a file system without locks
      os.close(fd)
      why = f"flock: {e.strerror or e}"
      break
    # The holder removes the file as it releases it: a file opened just before that is no
    # longer the one at ``path`` (another run may lock a new one there), so open it again.
    try:
      here = os.stat(path)
    except FileNotFoundError:
      here = None
    mine = os.fstat(fd)
    if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
      os.ftruncate(fd, 0)
      os.write(fd, _describe(program).encode())
      return fd, None
    os.close(fd)
  logging.warning("%s cannot be locked (%s): %s cannot tell whether another run is writing "
                  "it.", workdir, why, program)
  return None, None


def release(workdir: str, fd: int) -> None:
  """Removes the lock file, then unlocks it (closes ``fd``)."""
  with contextlib.suppress(FileNotFoundError):
    os.remove(lock_path(workdir))
  os.close(fd)


def agree(flag: bool) -> bool:
  """Process 0's ``flag`` on every process (a collective when there are several)."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag)))


@contextlib.contextmanager
def hold(workdir: str, program: str | None = None) -> Iterator[None]:
  """Within the block, this process (process 0 of several) holds ``workdir``'s lock; the
  workdir is created when missing. ``program`` names it in the lock file (default
  :func:`this_program`).

  Raises:
    ValueError: ``workdir`` is not a usable path (``workdir.check_path``) or cannot be written.
    WorkdirInUseError: another process holds the lock; one line naming it, nothing written.
  """
  workdir_lib.check_path(workdir)
  program = this_program() if program is None else program
  fd, refusal, created = None, None, False
  if workdir_lib.is_main_process():
    created = not os.path.isdir(workdir)
    try:
      os.makedirs(workdir, exist_ok=True)
      fd, other = acquire(workdir, program)
    except OSError as e:
      other = None
      refusal = ValueError(f"the workdir {workdir!r} cannot be written ({e.strerror or e}); "
                           f"{program} keeps its checkpoints and results there. Give a "
                           "writable --workdir.")
    if other is not None:
      refusal = WorkdirInUseError(
          f"{workdir} is in use: {other} is training in it; nothing was written. Wait for it "
          "to finish, stop it (Ctrl-C saves a checkpoint, and the same command then resumes "
          "the run), or give another --workdir.", holder=other)
  if agree(refusal is not None):
    if created:
      with contextlib.suppress(OSError):
        os.rmdir(workdir)
    raise refusal or WorkdirInUseError(
        f"{workdir}: process 0 refused it (its output says why); nothing was written.")
  try:
    yield
  finally:
    if fd is not None:
      release(workdir, fd)
    if created:   # a first run refused before it wrote anything leaves no empty folder
      with contextlib.suppress(OSError):
        os.rmdir(workdir)
