"""Metric writers: one small interface from the training loop and eval.py to every place a run
is watched.

``metrics.jsonl`` stays the source of truth (``workdir.append_metrics``); the backends of
:data:`BACKENDS` receive the same scalars plus histograms and images:

* ``'tensorboard'``: event files under ``<workdir>/tensorboard/<run>/``, written with
  ``tensorboardX``'s protocol buffers and record writer (no TensorFlow), synchronously, so a
  failure surfaces where it happens;
* ``'wandb'``: Weights & Biases (optional; ``pip install wandb``), the resolved config
  attached, the run id kept in ``<workdir>/wandb_run_id.txt`` so a resumed run continues it.

A :class:`MetricWriter` holds the backends of ``config.log``. Only process 0 writes. A
backend that raises (disk full, W&B offline) is warned about once and switched off; training
goes on and ``metrics.jsonl`` is still written.

Resume: a writer opened at ``start_step`` begins a new event file whose first record is a
``SessionLog.START`` at ``start_step + 1``. TensorBoard then drops every event of the earlier
files at a step ``> start_step`` (what tensorboardX's ``purge_step`` does), exactly the rows
``workdir.truncate_metrics`` drops from ``metrics.jsonl``: a step written before a kill and
written again after the resume appears once. :func:`read_events` reads a run back with the
same rule.
"""

from __future__ import annotations

import glob
import importlib.util
import io
import os
import struct
import time
import warnings
from typing import Any, Callable, Mapping

import ml_collections
import numpy as np

from dml_jax.run import workdir as workdir_lib

TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_run_id.txt"
HISTOGRAM_BINS = 64


class LoggingBackendError(ValueError):
  """An unknown backend, or one asked for whose package is missing (one line, with the fix)."""


# --------------------------------------------------------------------------- tensorboard


class TensorBoardBackend:
  """Writes one TensorBoard run directory (``logdir``) with tensorboardX, synchronously.

  Args:
    logdir: the run directory (created).
    start_step: the step training resumes from; events of earlier files after it are purged.
      ``None``: nothing is purged (eval.py, whose runs evaluate any checkpoints in any order).
  """

  def __init__(self, logdir: str, *, start_step: int | None = 0):
    from tensorboardX import event_file_writer  # pylint: disable=import-outside-toplevel
    from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
    self._event_pb2 = event_pb2
    os.makedirs(logdir, exist_ok=True)
    # The step, then the time in ns in the name order two files of one second the way they
    # were written (and keep two writers of one process and second from sharing a file).
    self._writer = event_file_writer.EventsWriter(
        os.path.join(logdir, "events"),
        f".{start_step or 0:010d}.{time.time_ns()}.{os.getpid()}")
    if start_step is not None:
      self._write(event_pb2.Event(step=start_step + 1, session_log=event_pb2.SessionLog(
          status=event_pb2.SessionLog.START)))

  def _write(self, event) -> None:
    event.wall_time = time.time()
    self._writer.write_event(event)

  def _summary(self, step: int, values: list) -> None:
    from tensorboardX.proto import summary_pb2  # pylint: disable=import-outside-toplevel
    self._write(self._event_pb2.Event(step=step, summary=summary_pb2.Summary(value=values)))

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    from tensorboardX.proto import summary_pb2  # pylint: disable=import-outside-toplevel
    self._summary(step, [summary_pb2.Summary.Value(tag=k, simple_value=float(v))
                         for k, v in values.items()])
    self._writer.flush()

  def histograms(self, step: int, values: Mapping[str, np.ndarray]) -> None:
    from tensorboardX.proto import summary_pb2  # pylint: disable=import-outside-toplevel
    self._summary(step, [summary_pb2.Summary.Value(tag=tag, histo=histogram_proto(v))
                         for tag, v in values.items() if np.size(v)])
    self._writer.flush()

  def images(self, step: int, pngs: Mapping[str, bytes]) -> None:
    from tensorboardX.proto import summary_pb2  # pylint: disable=import-outside-toplevel
    values = []
    for tag, png in pngs.items():
      width, height = png_size(png)
      values.append(summary_pb2.Summary.Value(tag=tag, image=summary_pb2.Summary.Image(
          height=height, width=width, colorspace=4, encoded_image_string=png)))
    self._summary(step, values)
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


def histogram_proto(values, bins: int = HISTOGRAM_BINS):
  """TensorBoard's ``HistogramProto`` of float ``values [n]`` (``bins`` equal bins over
  their range; ``bucket_limit`` holds each bin's right edge)."""
  from tensorboardX.proto import summary_pb2  # pylint: disable=import-outside-toplevel
  v = np.asarray(values, np.float64).reshape(-1)
  counts, edges = np.histogram(v, bins=bins)
  return summary_pb2.HistogramProto(
      min=float(v.min()), max=float(v.max()), num=float(v.size), sum=float(v.sum()),
      sum_squares=float(np.dot(v, v)), bucket_limit=edges[1:].tolist(),
      bucket=counts.astype(np.float64).tolist())


def png_size(png: bytes) -> tuple[int, int]:
  """``(width, height)`` from a PNG's IHDR chunk."""
  if png[:8] != b"\x89PNG\r\n\x1a\n":
    raise ValueError("not a PNG image")
  return struct.unpack(">II", png[16:24])


# -------------------------------------------------------------------------------- wandb


class WandbBackend:
  """Logs to Weights & Biases; resumes the run whose id is in ``<workdir>/wandb_run_id.txt``.

  W&B refuses steps lower than the last it received, so after a resume the steps between the
  checkpoint and the kill keep their first values there (TensorBoard and metrics.jsonl show
  the rewritten ones).
  """

  def __init__(self, workdir: str, *, config: ml_collections.ConfigDict | None,
               project: str, run: str = "train"):
    import wandb  # pylint: disable=import-outside-toplevel
    self._wandb = wandb
    id_path = os.path.join(workdir, WANDB_ID_FILE)
    if os.path.exists(id_path):
      with open(id_path) as f:
        run_id = f.read().strip()
    else:
      run_id = wandb.util.generate_id()
      with open(id_path, "w") as f:
        f.write(run_id)
    self._run = wandb.init(project=project, id=run_id, resume="allow", dir=workdir,
                           name=os.path.basename(os.path.abspath(workdir)), job_type=run,
                           config=None if config is None else config.to_dict())

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    self._run.log({k: float(v) for k, v in values.items()}, step=step)

  def histograms(self, step: int, values: Mapping[str, np.ndarray]) -> None:
    self._run.log({k: self._wandb.Histogram(np.asarray(v)) for k, v in values.items()
                   if np.size(v)}, step=step)

  def images(self, step: int, pngs: Mapping[str, bytes]) -> None:
    from PIL import Image  # pylint: disable=import-outside-toplevel
    self._run.log({k: self._wandb.Image(Image.open(io.BytesIO(v))) for k, v in pngs.items()},
                  step=step)

  def close(self) -> None:
    self._run.finish()


def _make_tensorboard(workdir: str, *, run: str, start_step: int | None,
                      **_) -> TensorBoardBackend:
  return TensorBoardBackend(os.path.join(workdir, TENSORBOARD_DIR, run), start_step=start_step)


def _make_wandb(workdir: str, *, run: str, config, project: str, **_) -> WandbBackend:
  return WandbBackend(workdir, config=config, project=project, run=run)


# name -> (constructor, the package it needs)
BACKENDS: dict[str, tuple[Callable[..., Any], str]] = {
    "tensorboard": (_make_tensorboard, "tensorboardX"),
    "wandb": (_make_wandb, "wandb"),
}


def check_backends(names) -> tuple[str, ...]:
  """``names`` as a tuple, each a known backend whose package is importable.

  Raises:
    LoggingBackendError: one line naming the unknown backend (and the known ones) or the
      missing package with its ``pip install`` command.
  """
  names = tuple(names)
  for name in names:
    if name not in BACKENDS:
      raise LoggingBackendError(f"Unknown logging backend {name!r}; known: "
                                f"{', '.join(BACKENDS)}.")
    package = BACKENDS[name][1]
    if importlib.util.find_spec(package) is None:
      raise LoggingBackendError(
          f"config.log.{name}=True but the package {package!r} is not installed: "
          f"pip install {package} (or set --config.log.{name}=False).")
  return names


def config_backends(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The backends ``config.log`` turns on (``log.tensorboard``, ``log.wandb``), checked."""
  log = config.get("log", ml_collections.ConfigDict())
  unknown = [k for k in log if k not in LOG_KEYS]
  if unknown:
    raise LoggingBackendError(f"Unknown logging setting log.{unknown[0]}; known: "
                              f"{', '.join('log.' + k for k in LOG_KEYS)}.")
  return check_backends(n for n in BACKENDS if log.get(n, False))


# config.log keys besides the backends' on/off switches
LOG_KEYS = ("tensorboard", "wandb", "wandb_project")


# ------------------------------------------------------------------------------- writer


# The keys of a metrics.jsonl row that say which steps it holds, not a measurement: its step
# and, in a training row, the first of the steps whose mean it holds.
ROW_STEPS = ("step", "first_step")


class MetricWriter:
  """Sends scalars, histograms and images to the open backends; ``metrics.jsonl`` rows go
  through :meth:`write_row`. A backend that raises is warned about once and closed."""

  def __init__(self, backends: Mapping[str, Any], *, workdir: str | None = None):
    self.backends = dict(backends)
    self.workdir = workdir
    self.failed: dict[str, str] = {}

  def _each(self, method: str, *args) -> None:
    for name, backend in list(self.backends.items()):
      try:
        getattr(backend, method)(*args)
      except Exception as e:  # pylint: disable=broad-except
        self.disable(name, e)

  def disable(self, name: str, error: Exception) -> None:
    """Warns (once per backend) that ``name`` failed with ``error`` and closes it."""
    self.failed[name] = f"{type(error).__name__}: {error}"
    backend = self.backends.pop(name, None)
    warnings.warn(f"Logging to {name} failed ({self.failed[name]}); it is switched off for the "
                  "rest of the run, training goes on and metrics.jsonl is still written.",
                  RuntimeWarning, stacklevel=3)
    try:
      if backend is not None:
        backend.close()
    except Exception:  # pylint: disable=broad-except
      pass

  @property
  def active(self) -> bool:
    """Whether any backend is open (callers skip computing histograms / images otherwise)."""
    return bool(self.backends)

  def write_row(self, row: Mapping[str, Any]) -> None:
    """Appends ``row`` (with its ``'step'``) to ``metrics.jsonl`` (when the writer has a
    workdir) and sends its numbers as scalars, except the row's :data:`ROW_STEPS`."""
    if self.workdir is not None and workdir_lib.is_main_process():
      workdir_lib.append_metrics(self.workdir, dict(row))
    self.scalars(int(row["step"]), {k: v for k, v in row.items() if k not in ROW_STEPS})

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    values = {k: float(v) for k, v in values.items() if isinstance(v, (int, float, np.number))}
    if values:
      self._each("scalars", step, values)

  def histograms(self, step: int, values: Mapping[str, np.ndarray]) -> None:
    """``values``: tag -> float ``[n]`` samples."""
    if values:
      self._each("histograms", step, values)

  def images(self, step: int, pngs: Mapping[str, bytes | str]) -> None:
    """``pngs``: tag -> PNG bytes or the path of a PNG file."""
    if not self.backends:
      return
    encoded = {}
    for tag, png in pngs.items():
      if isinstance(png, str):
        with open(png, "rb") as f:
          png = f.read()
      encoded[tag] = png
    self._each("images", step, encoded)

  def close(self) -> None:
    self._each("close")
    self.backends = {}

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def make_writer(config: ml_collections.ConfigDict, workdir: str, *, run: str = "train",
                start_step: int | None = 0, jsonl: bool = True,
                backends=None) -> MetricWriter:
  """The writer of a run: the backends of ``config.log`` (or ``backends``) on process 0.

  Args:
    config: the resolved config (attached to the W&B run).
    workdir: the run directory.
    run: the TensorBoard run (``tensorboard/<run>/``) and W&B job type: ``'train'`` for the
      training loop, ``'eval'`` for eval.py.
    start_step: the step training resumes from (see the module docstring); ``None``: purge
      nothing written before.
    jsonl: whether :meth:`MetricWriter.write_row` appends to ``metrics.jsonl``.
    backends: backend names instead of ``config.log``'s.

  Raises:
    LoggingBackendError: an unknown backend or a missing package. A backend that fails to
      open (e.g. W&B offline) is only warned about.
  """
  names = check_backends(backends) if backends is not None else config_backends(config)
  writer = MetricWriter({}, workdir=workdir if jsonl else None)
  if not workdir_lib.is_main_process():
    return writer
  log = config.get("log", ml_collections.ConfigDict())
  for name in names:
    make = BACKENDS[name][0]
    try:
      writer.backends[name] = make(workdir, run=run, start_step=start_step, config=config,
                                   project=log.get("wandb_project", "dml_jax"))
    except Exception as e:  # pylint: disable=broad-except
      writer.disable(name, e)
  return writer


# ------------------------------------------------------------------------------ reading


def _records(path: str):
  """The payloads of a TFRecord file (length, crc, data, crc); a record cut short by a kill
  ends the file."""
  with open(path, "rb") as f:
    while True:
      header = f.read(12)
      if len(header) < 12:
        return
      (length,) = struct.unpack("<Q", header[:8])
      data = f.read(length)
      if len(data) < length or len(f.read(4)) < 4:
        return
      yield data


def read_events(logdir: str) -> dict[str, dict[str, list]]:
  """The events of one TensorBoard run directory as TensorBoard shows them.

  Files are read in name order; a ``SessionLog.START`` at step ``s`` drops what earlier
  records hold at steps ``>= s`` (TensorBoard's purge of orphaned data).

  Returns:
    ``{'scalars': {tag: [(step, value), ...]}, 'histograms': {tag: [(step, count), ...]},
    'images': {tag: [(step, png bytes), ...]}}``, each list in the order written.
  """
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  out = {"scalars": {}, "histograms": {}, "images": {}}
  for path in sorted(glob.glob(os.path.join(glob.escape(logdir), "events.out.tfevents.*"))):
    for data in _records(path):
      event = event_pb2.Event.FromString(data)
      if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
        for kind in out.values():
          for tag, points in kind.items():
            kind[tag] = [p for p in points if p[0] < event.step]
      for value in event.summary.value:
        if value.HasField("simple_value"):
          out["scalars"].setdefault(value.tag, []).append((event.step, value.simple_value))
        elif value.HasField("histo"):
          out["histograms"].setdefault(value.tag, []).append((event.step, value.histo.num))
        elif value.HasField("image"):
          out["images"].setdefault(value.tag, []).append(
              (event.step, value.image.encoded_image_string))
  return out


def describe(workdir: str, backends) -> str:
  """Where a run's outputs go, e.g. ``'runs/digits (TensorBoard: runs/digits/tensorboard)'``."""
  where = [workdir]
  if "tensorboard" in backends:
    where.append(f"TensorBoard: {os.path.join(workdir, TENSORBOARD_DIR)}")
  if "wandb" in backends:
    where.append("W&B")
  return where[0] + (f" ({', '.join(where[1:])})" if len(where) > 1 else "")

