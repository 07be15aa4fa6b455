"""The train.py / eval.py binaries as a user runs them: flags, errors, SIGKILL + resume."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dml_jax.run import cli
from dml_jax.run import training
from dml_jax.run import workdir as workdir_lib
from dml_jax.run import writers
from dml_test_support import ROOT
from dml_test_support import small_config, write_user_module

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


def last_line(out):
  """The single line a user error prints (no traceback before it)."""
  assert out.returncode == 1, (out.returncode, out.stderr[-3000:])
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  return out.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("args,line", [
    (["--config.loss.margn=0.1"],
     "train.py: unknown config key loss.margn (did you mean loss.margin?)"),
    (["--config.data.group_sise=4"],
     "train.py: unknown config key data.group_sise (did you mean data.group_size?)"),
    (["--config.num_train_steps=many"], "train.py: flag --config.num_train_steps=many"),
    (["--config.data.group_size=256", "--config.batch_size=128"],
     "train.py: data.group_size=256 must be between 2 and batch_size=128"),
    (["--config.num_epochs=2", "--config.num_train_steps=30"],
     "train.py: num_train_steps=30 has no effect: this config trains num_epochs=2 epochs"),
])
def test_mistakes_are_one_line(tmp_path, args, line):
  out = run(["train.py", f"--config={CONFIG}", f"--workdir={tmp_path / 'w'}", *args])
  assert last_line(out).startswith(line)
  assert not os.path.exists(tmp_path / "w" / "checkpoints")


def test_distributed_without_a_cluster_names_the_flags_that_give_one(tmp_path):
  env = {k: v for k, v in os.environ.items()   # no cluster JAX would detect (SLURM, MPI)
         if not k.startswith(("SLURM_", "OMPI_", "PMI_", "MV2_"))}
  out = run(["train.py", f"--config={CONFIG}", f"--workdir={tmp_path / 'w'}", "--distributed"],
            env=env)
  line = last_line(out)
  assert line.startswith("train.py: --distributed: ") and line.endswith(
      "give --coordinator_address=HOST:PORT (process 0's), --num_processes and --process_id.")
  assert not os.path.exists(tmp_path / "w" / "checkpoints")


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb installed")
def test_wandb_asked_for_but_missing_is_one_line(tmp_path):
  out = run(["train.py", f"--config={CONFIG}", f"--workdir={tmp_path / 'w'}",
             "--config.log.wandb=True"])
  assert last_line(out) == ("train.py: config.log.wandb=True but the package 'wandb' is not "
                            "installed: pip install wandb (or set --config.log.wandb=False).")
  assert not os.path.exists(tmp_path / "w")


def test_missing_config_file_is_one_line(tmp_path):
  out = run(["train.py", "--config=configs/nope.py", f"--workdir={tmp_path}",
             "--config.loss.margin=0.1"])
  assert last_line(out) == "train.py: config file configs/nope.py does not exist"
  assert out.stderr.count("\n") == 1, out.stderr     # before any device or log line


def test_rerun_with_another_config_is_one_line_and_writes_nothing(tmp_path):
  workdir = tmp_path / "w"
  workdir_lib.write_config(small_config(20), str(workdir))
  before = (workdir / "config.json").read_bytes()
  out = run(["train.py", f"--config={CONFIG}", f"--workdir={workdir}",
             "--config.loss.positive=random"])
  line = last_line(out)
  assert "was trained with a different config" in line and "loss.positive 'easy' -> 'random'" in line
  assert sorted(os.listdir(workdir)) == ["config.json"]
  assert (workdir / "config.json").read_bytes() == before


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


@pytest.mark.long
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

  ref = training.train_and_evaluate(   # on one device, as train.py runs here
      small_config(num_devices=1, **KILL_OVERRIDES), str(tmp_path / "reference"),
      show_progress=False)
  for protocol in ref:
    assert killed_results[protocol] == pytest.approx(ref[protocol], abs=1e-6)
  # TensorBoard shows each step once, with the values of the uninterrupted run.
  killed_tb, ref_tb = (writers.read_events(os.path.join(w, "tensorboard", "train"))["scalars"]
                       for w in (workdir, str(tmp_path / "reference")))
  for tag in ("train/loss", "eval/test/recall@1"):
    assert [s for s, _ in killed_tb[tag]] == [s for s, _ in ref_tb[tag]]
    np.testing.assert_allclose([v for _, v in killed_tb[tag]], [v for _, v in ref_tb[tag]],
                               atol=1e-5)

  ev = run(["eval.py", f"--workdir={workdir}"])
  assert ev.returncode == 0, ev.stderr[-3000:]
  assert "recall@1" in ev.stdout and "Step 300" in ev.stdout


def test_sigint_saves_the_current_step_and_a_rerun_resumes(tmp_path):
  workdir = str(tmp_path / "interrupted")
  args = ["train.py", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress",
          *flags(KILL_OVERRIDES)]
  proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  metrics = os.path.join(workdir, workdir_lib.METRICS_FILE)
  deadline = time.time() + 240
  while (not (os.path.exists(metrics) and os.path.getsize(metrics)) and time.time() < deadline
         and proc.poll() is None):
    time.sleep(0.05)
  proc.send_signal(signal.SIGINT)
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
  # the compilation cache (the tests' shared one, from the environment) is named once
  cache = os.path.abspath(os.environ[cli.CACHE_ENV])
  assert stdout.count(cli.describe_cache(cache)) == 1
  assert "Traceback" not in stderr
  line = stderr.strip().splitlines()[-1]
  match = re.fullmatch(r"train.py: interrupted at step (\d+); rerun the same command to resume",
                       line)
  assert match, line
  step = int(match.group(1))
  assert 50 <= step < 300
  assert os.path.isdir(os.path.join(workdir, "checkpoints", str(step)))

  resumed = run(args)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resumed from checkpoint step {step}" in resumed.stderr
  assert os.path.exists(os.path.join(workdir, "eval_step_300.json"))
  # Each training row says which steps it averages; the first after the resume starts at the
  # checkpoint, so the steps between the last row before it and the checkpoint are in none.
  spans = {r["step"]: r["first_step"] for r in workdir_lib.read_metrics(workdir)
           if "train/loss" in r}
  assert sorted(spans) == list(range(50, 301, 50))
  after = min(s for s in spans if s > step)
  assert spans[after] == step + 1
  assert all(first == last - 49 for last, first in spans.items() if last != after)


@pytest.mark.long
def test_user_objective_module_is_found_by_eval(tmp_path):
  module = write_user_module(str(tmp_path))
  workdir = str(tmp_path / "own")
  # digits_objective.py:NAME names the user's objective: --module is imported before the
  # config file is read
  out = run(["train.py", "--config=configs/digits_objective.py:scaled_triplet,smoke",
             f"--workdir={workdir}", "--noprogress", f"--module={module}",
             "--config.loss.scale=3", "--config.num_train_steps=2"])
  assert out.returncode == 0, out.stderr[-3000:]
  assert workdir_lib.load_config(workdir).user_modules == [module]
  ev = run(["eval.py", f"--workdir={workdir}", "--noprogress"])   # no --module needed
  assert ev.returncode == 0, ev.stderr[-3000:]
  assert "Step 2" in ev.stdout and "recall@1" in ev.stdout
