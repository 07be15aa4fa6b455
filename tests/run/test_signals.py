"""Stopping on SIGINT / SIGTERM (dml_jax/run/signals.py): the flag, and the message on a line of its
own while the training loop's progress bar is drawn."""

import io
import logging
import signal

import pytest
import tqdm

from dml_jax.run import signals


def test_the_first_signal_sets_the_flag_and_the_second_stops_at_once():
  with signals.stop_on_signals() as stop:
    handler = signal.getsignal(signal.SIGINT)
    assert not stop.is_set()
    handler(signal.SIGTERM, None)
    assert stop.is_set() and stop.signum == signal.SIGTERM
    with pytest.raises(KeyboardInterrupt, match="second SIGINT"):
      handler(signal.SIGINT, None)
  assert signal.getsignal(signal.SIGINT) is not handler


def test_the_message_starts_on_a_line_of_its_own_under_a_progress_bar(monkeypatch):
  terminal = io.StringIO()   # the bar and the log share stderr, as on a terminal
  monkeypatch.setattr("sys.stderr", terminal)
  log = logging.StreamHandler(terminal)
  logging.getLogger("absl").addHandler(log)
  try:
    bar = tqdm.tqdm(total=10, file=terminal, mininterval=0)
    bar.update(3)
    with signals.stop_on_signals():
      signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
    bar.close()
  finally:
    logging.getLogger("absl").removeHandler(log)
  text = terminal.getvalue()
  before = text[:text.index("SIGINT received")]
  assert "3/10" in before                        # the bar was drawn first
  assert before.split("\r")[-1].strip() == ""    # then cleared: the message starts the line
