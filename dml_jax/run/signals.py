"""Stopping a run cleanly on SIGINT (Ctrl-C) and SIGTERM (sent by schedulers before preemption).

``train.py`` runs ``train_and_evaluate(..., stop=flag)`` inside :func:`stop_on_signals`; the
first signal only sets the flag, and the training loop saves a checkpoint of the step it is at
and stops. A second signal stops at once (``KeyboardInterrupt``), for a user who does not want
to wait for the save.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

from absl import logging
import tqdm

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
