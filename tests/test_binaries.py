"""The train.py / eval.py binaries as a user runs them: flags, errors, SIGKILL + resume."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dml_jax import training
from dml_test_support import ROOT
from dml_test_support import small_config

pytestmark = pytest.mark.slow

CONFIG = "configs/digits_evenodd_eps.py:smoke"
# Overrides shared by the kill test and its in-process reference run.
KILL_OVERRIDES = {"num_train_steps": 300, "checkpoint_every_steps": 100,
                  "log_every_steps": 50, "batch_size": 32, "data.group_size": 16}


def run(args, **kw):
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, **kw)


def flags(overrides):
  return [f"--config.{k}={v}" for k, v in overrides.items()]


def test_unknown_config_key_is_a_clear_error(tmp_path):
  out = run(["train.py", f"--config={CONFIG}", f"--workdir={tmp_path}",
             "--config.loss.temprature=0.05"])
  assert out.returncode != 0
  assert "temprature" in out.stderr


def test_wrong_config_type_is_a_clear_error(tmp_path):
  out = run(["train.py", f"--config={CONFIG}", f"--workdir={tmp_path}",
             "--config.num_train_steps=many"])
  assert out.returncode != 0
  assert "num_train_steps" in out.stderr


def test_unknown_loss_name_is_a_clear_error(tmp_path):
  out = run(["train.py", f"--config={CONFIG}", f"--workdir={tmp_path}",
             "--config.loss.name=tripplet"])
  assert out.returncode != 0
  assert "tripplet" in out.stderr and "triplet" in out.stderr


def test_unprepared_dataset_and_missing_weights_are_one_line_errors(tmp_path):
  """No traceback: the message names the command that prepares the data / the weights."""
  out = run(["train.py", "--config=configs/cub_ephn_2nd.py", f"--workdir={tmp_path / 'w'}",
             "--config.model.pretrained=", f"--config.data.options.data_dir={tmp_path}"])
  assert out.returncode == 1
  assert "tfds build caltech_birds2011 --file_format=array_record" in out.stderr
  assert "Traceback" not in out.stderr, out.stderr[-2000:]
  out = run(["train.py", "--config=configs/cub_ephn_2nd.py", f"--workdir={tmp_path / 'w'}"])
  assert out.returncode == 1
  assert "pretrained convert --arch resnet50" in out.stderr and "Traceback" not in out.stderr


def test_eval_without_checkpoint_exits_nonzero(tmp_path):
  out = run(["eval.py", f"--workdir={tmp_path}"])
  assert out.returncode != 0
  assert "not a dml_jax workdir" in out.stderr


def test_sigkill_then_resume_reproduces_uninterrupted_run(tmp_path):
  workdir = str(tmp_path / "killed")
  args = ["train.py", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress",
          *flags(KILL_OVERRIDES)]
  proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  first = os.path.join(workdir, "checkpoints", "100")
  deadline = time.time() + 240
  while not os.path.isdir(first) and time.time() < deadline and proc.poll() is None:
    time.sleep(0.05)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert os.path.isdir(first), "the run never wrote its first checkpoint"
  assert not os.path.exists(os.path.join(workdir, "eval_step_300.json")), "killed too late"

  resumed = run(args)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  with open(os.path.join(workdir, "eval_step_300.json")) as f:
    killed_results = json.load(f)["results"]

  ref = training.train_and_evaluate(
      small_config(**KILL_OVERRIDES), str(tmp_path / "reference"), show_progress=False)
  for protocol in ref:
    assert killed_results[protocol] == pytest.approx(ref[protocol], abs=1e-6)

  ev = run(["eval.py", f"--workdir={workdir}"])
  assert ev.returncode == 0, ev.stderr[-3000:]
  assert "recall@1" in ev.stdout and "Step 300" in ev.stdout
