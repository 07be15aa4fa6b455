"""Metric writers: TensorBoard event files read back at the right steps (a run and a resume),
purge on resume, a failing backend warns once, W&B missing / offline, bad backends."""

import importlib.util
import os
import sys
import types
import warnings

import jax
import ml_collections
import numpy as np
import pytest

from dml_jax.evaluation import compute
from dml_jax.run import config as config_lib
from dml_jax.run import signals
from dml_jax.run import training
from dml_jax.run import workdir as workdir_lib
from dml_jax.run import writers
from dml_test_support import small_config


def train_events(workdir):
  return writers.read_events(os.path.join(workdir, writers.TENSORBOARD_DIR, "train"))


def test_run_scalars_read_back_at_the_steps_of_metrics_jsonl(run20):
  workdir, results = run20
  events = train_events(workdir)
  rows = workdir_lib.read_metrics(workdir)
  expected = {}
  for row in rows:
    for key, value in row.items():
      if key not in writers.ROW_STEPS:
        expected.setdefault(key, []).append((row["step"], value))
  assert set(events["scalars"]) == set(expected)
  for key, points in expected.items():
    got = events["scalars"][key]
    assert [s for s, _ in got] == [s for s, _ in points], key
    np.testing.assert_allclose([v for _, v in got], [v for _, v in points], rtol=1e-6)
  assert [s for s, _ in events["scalars"]["train/loss"]] == [5, 10, 15, 20]
  assert events["scalars"]["eval/test/recall@1"] == [
      (20, pytest.approx(results["test"]["recall@1"]))]
  hist = events["histograms"]
  assert [s for s, _ in hist["train/similarity_positive"]] == [5, 10, 15, 20]
  assert [s for s, _ in hist["eval/train:digit/similarity_negative"]] == [20]
  assert all(count > 0 for _, count in hist["train/similarity_negative"])


def write_steps(logdir, steps, value, start_step=0):
  backend = writers.TensorBoardBackend(logdir, start_step=start_step)
  for s in steps:
    backend.scalars(s, {"loss": value + s})
  backend.histograms(steps[-1], {"h": np.arange(5.0)})
  backend.close()


def test_resume_purges_the_steps_after_the_checkpoint(tmp_path):
  logdir = str(tmp_path / "tb")
  write_steps(logdir, [1, 2, 3, 4, 5], 0.0)          # killed after step 5, checkpoint at 3
  write_steps(logdir, [4, 5, 6], 100.0, start_step=3)
  events = writers.read_events(logdir)
  assert events["scalars"]["loss"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 104.0), (5, 105.0),
                                       (6, 106.0)]
  assert [s for s, _ in events["histograms"]["h"]] == [6]
  assert len(os.listdir(logdir)) == 2


def test_two_writers_of_one_second_keep_both_files(tmp_path):
  """Two writers of one process within one second (e.g. two evaluations from a notebook):
  the second does not overwrite the first's file."""
  logdir = str(tmp_path / "tb")
  write_steps(logdir, [1, 2], 0.0)
  write_steps(logdir, [1, 2], 0.0)
  assert len(os.listdir(logdir)) == 2
  assert writers.read_events(logdir)["scalars"]["loss"] == [(1, 1.0), (2, 2.0)]


def test_a_run_folder_named_with_brackets_reads_back(tmp_path):
  logdir = str(tmp_path / "lr[0.1]" / "tb")
  write_steps(logdir, [1, 2], 0.0)
  assert writers.read_events(logdir)["scalars"]["loss"] == [(1, 1.0), (2, 2.0)]


def test_tensorboard_itself_reads_the_resumed_run(tmp_path):
  """The purge is TensorBoard's own rule (when the tensorboard package is installed)."""
  if importlib.util.find_spec("tensorboard") is None:
    pytest.skip("tensorboard is not installed (not a dependency)")
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=all
  logdir = str(tmp_path / "tb")
  write_steps(logdir, [1, 2, 3, 4, 5], 0.0)
  write_steps(logdir, [4, 5, 6], 100.0, start_step=3)
  acc = event_accumulator.EventAccumulator(logdir)
  acc.Reload()
  assert [(e.step, e.value) for e in acc.Scalars("loss")] == [
      (1, 1.0), (2, 2.0), (3, 3.0), (4, 104.0), (5, 105.0), (6, 106.0)]


def eval_steps(workdir):
  """The steps of the evaluation rows of metrics.jsonl and of TensorBoard's recall@1."""
  rows = [r["step"] for r in workdir_lib.read_metrics(workdir) if "eval/test/recall@1" in r]
  return rows, [s for s, _ in train_events(workdir)["scalars"]["eval/test/recall@1"]]


class StopAtStep(signals.StopFlag):
  """Set from the training loop's ``step``-th look on (SIGINT arriving during that step)."""

  def __init__(self, step):
    super().__init__()
    self.step, self.looks, self.signum = step, 0, 2

  def is_set(self):
    self.looks += 1
    return self.looks >= self.step


def test_a_stop_at_an_evaluation_step_evaluates_it_on_resume(tmp_path):
  """Ctrl-C (or a kill after the checkpoint) at a step of eval_every_steps: the resumed run
  evaluates that step, as the uninterrupted run did, and logs it once."""
  workdir = str(tmp_path)
  config = small_config(20, eval_every_steps=10, scatter_every_steps=10)
  with pytest.raises(training.TrainingInterrupted, match="at step 10"):
    training.train_and_evaluate(config, workdir, show_progress=False, stop=StopAtStep(10))
  training.train_and_evaluate(config, workdir, show_progress=False)
  assert eval_steps(workdir) == ([10, 20], [10, 20])
  assert [r["step"] for r in workdir_lib.read_metrics(workdir)
          if "scatter/correct_fraction" in r] == [10, 20]
  training.train_and_evaluate(config, workdir, show_progress=False)   # finished: nothing new
  assert eval_steps(workdir) == ([10, 20], [10, 20])


def run_cut_off_in(module, name: str, config, workdir: str, monkeypatch) -> None:
  """Trains ``config`` in ``workdir`` with ``module.name`` stopping the run the way a second
  Ctrl-C does (no checkpoint of its own), then puts ``module.name`` back."""

  def second_ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt("second SIGINT: stopping without saving")

  with monkeypatch.context() as patch:
    patch.setattr(module, name, second_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
      training.train_and_evaluate(config, workdir, show_progress=False)


def test_a_final_evaluation_cut_off_is_logged_by_the_rerun(tmp_path, monkeypatch):
  workdir = str(tmp_path)
  config = small_config(10)
  run_cut_off_in(compute, "evaluate_with_config", config, workdir, monkeypatch)
  results = training.train_and_evaluate(config, workdir, show_progress=False)
  assert eval_steps(workdir) == ([10], [10])
  row, = [r for r in workdir_lib.read_metrics(workdir) if "eval/test/recall@1" in r]
  assert row["eval/test/recall@1"] == results["test"]["recall@1"]
  training.train_and_evaluate(config, workdir, show_progress=False)   # logged: not again
  assert eval_steps(workdir) == ([10], [10])


def test_a_kill_during_the_last_steps_scatter_diagram_draws_it_on_rerun(tmp_path, monkeypatch):
  """The scatter diagram of the last step, cut off (a kill, a second Ctrl-C) after its
  checkpoint, is drawn and logged by the rerun, once, before the final evaluation."""
  workdir = str(tmp_path)
  config = small_config(10, scatter_every_steps=10)
  run_cut_off_in(training, "log_scatter", config, workdir, monkeypatch)
  training.train_and_evaluate(config, workdir, show_progress=False)
  scatter_steps = lambda: [r["step"] for r in workdir_lib.read_metrics(workdir)
                           if "scatter/correct_fraction" in r]
  assert scatter_steps() == [10] and eval_steps(workdir) == ([10], [10])
  assert os.path.exists(os.path.join(workdir, "scatter_test_step_10.png"))
  training.train_and_evaluate(config, workdir, show_progress=False)   # logged: not again
  assert scatter_steps() == [10] and eval_steps(workdir) == ([10], [10])


class Failing:
  def __init__(self):
    self.calls = 0

  def scalars(self, step, values):
    self.calls += 1
    raise OSError(28, "No space left on device")

  def close(self):
    pass


def test_a_failing_backend_warns_once_and_jsonl_is_still_written(tmp_path):
  backend = Failing()
  writer = writers.MetricWriter({"tensorboard": backend}, workdir=str(tmp_path))
  with pytest.warns(RuntimeWarning, match="Logging to tensorboard failed.*No space left"):
    writer.write_row({"step": 1, "train/loss": 1.0})
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    writer.write_row({"step": 2, "train/loss": 0.5})
  assert backend.calls == 1 and not writer.active
  assert [r["step"] for r in workdir_lib.read_metrics(str(tmp_path))] == [1, 2]


def test_training_goes_on_when_tensorboard_fails(tmp_path, monkeypatch, capsys):
  def broken(self, step, values):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(writers.TensorBoardBackend, "scalars", broken)
  config = small_config(2, log_every_steps=1, checkpoint_every_steps=2)
  with pytest.warns(RuntimeWarning, match="Logging to tensorboard failed") as record:
    training.train_and_evaluate(config, str(tmp_path), show_progress=False)
  assert sum("Logging to tensorboard failed" in str(w.message) for w in record) == 1
  rows = workdir_lib.read_metrics(str(tmp_path))
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
  assert any("eval/test/recall@1" in r for r in rows)
  assert (f"dml_jax: 8 x cpu devices, 1 process, batch 32 (4 per device); outputs: {tmp_path} "
          f"(TensorBoard: {tmp_path}/tensorboard)") in capsys.readouterr().out


def test_wandb_missing_is_one_clear_error(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))
  config = small_config(2)
  config.log.wandb = True
  with pytest.raises(writers.LoggingBackendError, match=r"pip install wandb") as e:
    config_lib.validate(config)
  assert "\n" not in str(e.value)


def test_unknown_backend_and_log_key_are_one_line_errors():
  with pytest.raises(ValueError, match="Unknown logging backend 'tensorbord'; known: "
                     "tensorboard, wandb"):
    writers.check_backends(("tensorbord",))
  config = ml_collections.ConfigDict({"log": {"tensorboard": True, "mlflow": True}})
  with pytest.raises(ValueError, match="Unknown logging setting log.mlflow"):
    writers.config_backends(config)


class FakeRun:
  def __init__(self):
    self.logged, self.finished = [], False

  def log(self, values, step):
    self.logged.append((step, values))

  def finish(self):
    self.finished = True


def fake_wandb(monkeypatch, init):
  module = types.ModuleType("wandb")
  module.init = init
  module.util = types.SimpleNamespace(generate_id=lambda: "abc123")
  module.Histogram = lambda v: ("histogram", len(v))
  module.Image = lambda image: ("image", image.size)
  monkeypatch.setitem(sys.modules, "wandb", module)
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: object() if name == "wandb" else real(name, *a))


def test_wandb_gets_the_same_metrics_and_keeps_its_run_id(tmp_path, monkeypatch):
  run, inits = FakeRun(), []

  def init(**kwargs):
    inits.append(kwargs)
    return run

  fake_wandb(monkeypatch, init)
  config = small_config(2)
  config.log.wandb, config.log.tensorboard = True, False
  writer = writers.make_writer(config, str(tmp_path))
  writer.write_row({"step": 3, "train/loss": 0.25})
  writer.histograms(3, {"h": np.ones(4)})
  writer.close()
  assert run.logged[0] == (3, {"train/loss": 0.25})
  assert run.logged[1] == (3, {"h": ("histogram", 4)}) and run.finished
  assert inits[0]["id"] == "abc123" and inits[0]["config"]["loss"]["name"] == config.loss.name
  writers.make_writer(config, str(tmp_path)).close()
  assert inits[1]["id"] == "abc123" and inits[1]["resume"] == "allow"


def test_wandb_offline_warns_and_the_rest_goes_on(tmp_path, monkeypatch):
  def init(**_):
    raise ConnectionError("W&B is offline")

  fake_wandb(monkeypatch, init)
  config = small_config(2)
  config.log.wandb = True
  with pytest.warns(RuntimeWarning, match="Logging to wandb failed.*offline"):
    writer = writers.make_writer(config, str(tmp_path))
  writer.write_row({"step": 1, "train/loss": 1.0})
  writer.close()
  events = train_events(str(tmp_path))
  assert events["scalars"]["train/loss"] == [(1, 1.0)]


def test_only_process_zero_writes(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  writer = writers.make_writer(small_config(2), str(tmp_path))
  writer.write_row({"step": 1, "train/loss": 1.0})
  writer.close()
  assert not writer.active and os.listdir(tmp_path) == []
