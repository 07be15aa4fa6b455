"""Stopping a run cleanly on SIGINT (Ctrl-C) and SIGTERM (sent by schedulers before preemption).

``train.py`` runs ``train_and_evaluate(..., stop=flag)`` inside :func:`stop_on_signals`; the
first signal only sets the flag, and the training loop saves a checkpoint of the step it is at
and stops. A second signal stops at once (``KeyboardInterrupt``), for a user who does not want
to wait for the save. On several processes, :func:`stop_check` makes them all stop after the
same step.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from absl import logging
import jax
import tqdm

from dml_jax import parallel

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopFlag:
  """Set once a stop was asked for; ``signum`` says by which signal (0 when set by hand)."""

  def __init__(self):
    self._event = threading.Event()
    self.signum = 0

  def set(self, signum: int = 0) -> None:
    self.signum = signum
    self._event.set()

  def is_set(self) -> bool:
    return self._event.is_set()


@contextlib.contextmanager
def stop_on_signals(signums=SIGNALS) -> Iterator[StopFlag]:
  """Within the block, ``signums`` set the yielded :class:`StopFlag` instead of killing the
  process; the previous handlers come back afterwards. Must run in the main thread."""
  flag = StopFlag()

  def handler(signum, frame):  # pylint: disable=unused-argument
    if flag.is_set():
      raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping without saving")
    with tqdm.tqdm.external_write_mode(file=sys.stderr):   # on a line of its own, not the bar's
      logging.warning("%s received: saving a checkpoint of the current step, then stopping "
                      "(send it again to stop at once).", signal.Signals(signum).name)
    flag.set(signum)

  previous = {s: signal.signal(s, handler) for s in signums}
  try:
    yield flag
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


def stop_check(stop: StopFlag | None, mesh: jax.sharding.Mesh, *,
               processes: int | None = None) -> Callable[[], int | None]:
  """``check() -> signum or None``, called once per train step by every process: the signal
  (``StopFlag.signum``) to stop after this step on, ``None`` to go on.

  One process: whether ``stop`` is set now. Several (``processes``, default
  ``jax.process_count()``): a signal reaches each process at its own moment (a Ctrl-C on one
  host, a scheduler's SIGTERM to each task), yet the checkpoint of the stop is written by all
  of them together, so they must stop after the same step: each step every process casts its
  flag into a vote over the devices (``parallel.process_max``), and ``check`` returns the
  result of the previous step's vote, the same on every process, one step late (read without
  waiting for the step just dispatched).
  """
  if stop is None:
    return lambda: None
  if (jax.process_count() if processes is None else processes) == 1:
    return lambda: stop.signum if stop.is_set() else None
  vote, pending = parallel.process_max(mesh), []

  def check() -> int | None:
    agreed = int(jax.device_get(pending.pop())) if pending else 0   # signum + 1, or 0
    pending.append(vote(stop.signum + 1 if stop.is_set() else 0))
    return agreed - 1 if agreed else None

  return check
