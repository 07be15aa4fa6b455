"""The sweep runner: grid parsing, overrides, resume (finished runs skipped), mean ± std."""

import json
import os
import socket

import numpy as np
import pytest

from dml_jax.run import experiments
from dml_jax.run import overrides
from dml_jax.run import workdir as workdir_lib
from dml_jax.evaluation import report
from dml_test_support import ROOT, small_config


def test_parse_grid_and_points():
  axes = experiments.parse_grid(["loss.positive=easy,random",
                                 "loss.positive_x+loss.negative=a+b,c+d; data.group_size=2,4"])
  assert axes[0] == (("loss.positive",), [("easy",), ("random",)])
  assert axes[1] == (("loss.positive_x", "loss.negative"), [("a", "b"), ("c", "d")])
  points = experiments.grid_points(axes)
  assert len(points) == 8
  assert points[0] == {"loss.positive": "easy", "loss.positive_x": "a", "loss.negative": "b",
                       "data.group_size": "2"}
  assert experiments.grid_points([]) == [{}]
  assert experiments.point_name({}) == "base"
  assert experiments.point_name({"a.b": "x/y"}) == "a.b=x_y"
  for bad, match in (("nokey", "no '='"), ("a=1,,2", "empty value"), ("a+b=1", "parts"),
                     ("a=1;a=2", "more than one")):
    with pytest.raises(ValueError, match=match):
      experiments.parse_grid([bad])


def test_a_grid_over_tuple_values_keeps_each_tuple_one_value():
  """Tuple-valued keys (``model.embedding_hidden``, a user objective's tuple hyper-parameter)
  are written as Python in the grid; their commas do not separate the axis's values."""
  axes = experiments.parse_grid(["model.embedding_hidden=(),(512,),(512, 128)",
                                 "loss.weights+loss.scale=(1.0,2.0)+3,[2, 1]+4"])
  assert axes[0] == (("model.embedding_hidden",), [("()",), ("(512,)",), ("(512, 128)",)])
  assert axes[1] == (("loss.weights", "loss.scale"), [("(1.0,2.0)", "3"), ("[2, 1]", "4")])
  config = overrides.apply(small_config(10), experiments.grid_points(axes[:1])[2],
                           from_strings=True)
  assert tuple(config.model.embedding_hidden) == (512, 128)
  names = {experiments.point_name(p) for p in experiments.grid_points(axes[:1])}
  assert len(names) == 3


def test_sweep_overrides_types_and_errors():
  c = small_config(10)
  got = overrides.apply(c, {"data.group_size": "4", "loss.margin": "0.5",
                                        "eval.plot": "true", "loss.positive": "random",
                                        "eval.ks": "(1, 2)"}, from_strings=True)
  assert got.data.group_size == 4 and isinstance(got.data.group_size, int)
  assert got.loss.margin == 0.5 and got.eval.plot is True and got.eval.ks == (1, 2)
  assert c.data.group_size == 16    # the input config is not modified
  with pytest.raises(ValueError, match="unknown config key loss.nope"):
    overrides.apply(c, {"loss.nope": "1"}, from_strings=True)
  with pytest.raises(ValueError, match="cannot convert"):
    overrides.apply(c, {"data.group_size": "four"}, from_strings=True)


def fake_train(values):
  """A train_fn writing config.json and the final eval JSON with recall@1 from
  ``values[(positive, seed)]``, as train.py does."""
  calls = []

  def train_fn(config, workdir):
    calls.append((config.loss.positive, config.seed))
    os.makedirs(workdir, exist_ok=True)
    workdir_lib.write_config(config, workdir)
    r1 = values[(config.loss.positive, config.seed)]
    report.write_results({"test": {"recall@1": r1, "nmi": 0.5}}, workdir=workdir,
                               step=config.num_train_steps)
    return {}

  return train_fn, calls


def test_sweep_aggregates_and_resumes(tmp_path):
  values = {("easy", 0): 0.6, ("easy", 1): 0.7, ("easy", 2): 0.8,
            ("random", 0): 0.5, ("random", 1): 0.5, ("random", 2): 0.2}
  train_fn, calls = fake_train(values)
  wd = str(tmp_path / "sweep")
  # A finished run already on disk (seed 1 of 'easy') must be skipped.
  done = os.path.join(wd, "loss.positive=easy", "seed_1")
  os.makedirs(done)
  workdir_lib.write_config(overrides.apply(small_config(10), {"loss.positive": "easy",
                                                             "seed": 1}), done)
  report.write_results({"test": {"recall@1": 0.7, "nmi": 0.5}}, workdir=done, step=10)
  out = experiments.sweep(small_config(10), grid=["loss.positive=easy,random"], seeds=3,
                          workdir=wd, train_fn=train_fn, log=lambda s: None)
  assert calls == [("easy", 0), ("easy", 2), ("random", 0), ("random", 1), ("random", 2)]
  easy = out["summary"]["loss.positive=easy"]["test"]["recall@1"]
  assert easy["mean"] == pytest.approx(0.7) and easy["std"] == pytest.approx(0.1)
  rnd = out["summary"]["loss.positive=random"]["test"]["recall@1"]
  assert rnd["mean"] == pytest.approx(0.4)
  assert rnd["std"] == pytest.approx(np.std([0.5, 0.5, 0.2], ddof=1))
  assert "| loss.positive=easy | test | 70.0 ± 10.0 | 50.0 ± 0.0 |" in out["table"]
  with open(os.path.join(wd, "sweep.json")) as f:
    saved = json.load(f)
  assert saved["summary"] == json.loads(json.dumps(out["summary"]))
  assert [r["seed"] for r in saved["runs"]] == [0, 1, 2, 0, 1, 2]
  assert os.path.getsize(os.path.join(wd, "sweep.png")) > 1000
  assert os.path.exists(os.path.join(wd, "sweep.md"))
  # Second call: everything finished, nothing retrained, same summary.
  calls.clear()
  again = experiments.sweep(small_config(10), grid=["loss.positive=easy,random"], seeds=3,
                            workdir=wd, train_fn=train_fn, log=lambda s: None)
  assert calls == [] and again["summary"] == out["summary"]


def test_sweep_line_plot_and_bad_x(tmp_path):
  values = {(p, s): 0.1 * s + (0.3 if p == "easy" else 0.1) for p in ("easy", "random")
            for s in range(2)}
  train_fn, _ = fake_train(values)
  out = experiments.sweep(small_config(10), grid=["loss.positive=easy,random",
                                                  "data.group_size=4,8"], seeds=2,
                          workdir=str(tmp_path), train_fn=train_fn, x="data.group_size",
                          log=lambda s: None)
  assert len(out["summary"]) == 4 and os.path.getsize(out["png"]) > 1000
  with pytest.raises(ValueError, match="not a grid key"):
    experiments.sweep(small_config(10), grid=["loss.positive=easy"], seeds=2,
                      workdir=str(tmp_path / "b"), train_fn=train_fn, x="data.group_size",
                      log=lambda s: None)


def test_cli(tmp_path, monkeypatch):
  """The command line: the config file (+ ':arg'), --set, --grid, default train function."""
  from dml_jax.run import training
  train_fn, calls = fake_train({("easy", 3): 0.9, ("easy", 4): 0.7})
  monkeypatch.setattr(training, "train_and_evaluate",
                      lambda config, workdir, show_progress, stop: train_fn(config, workdir))
  wd = str(tmp_path / "cli")
  rc = experiments.main(["sweep", f"--config={ROOT}/configs/digits_ephn_groupsize.py:smoke",
                         "--grid=loss.positive=easy", "--seeds=2", "--seed_offset=3",
                         f"--workdir={wd}", "--set=num_train_steps=4"])
  assert rc == 0 and calls == [("easy", 3), ("easy", 4)]
  with open(os.path.join(wd, "loss.positive=easy", "seed_3", "eval_step_4.json")) as f:
    assert json.load(f)["step"] == 4
  with open(os.path.join(wd, "sweep.json")) as f:
    saved = json.load(f)
  r1 = saved["summary"]["loss.positive=easy"]["test"]["recall@1"]
  assert r1["mean"] == pytest.approx(0.8) and r1["values"] == [0.9, 0.7]
  with pytest.raises(ValueError, match="does not exist"):
    overrides.load_config_file("configs/nope.py")



@pytest.mark.parametrize("args,message", [
    (["--grid=loss.margin=0.1,-1"], "loss.margin must be a number >= 0, got -1.0."),
    (["--grid=loss.margn=0.1"], "unknown config key loss.margn (did you mean loss.margin?)"),
    (["--seeds=0"], "seeds must be a positive integer, got 0."),
    (["--seed_offset=-3"], "seed_offset must be an integer >= 0 (the first seed), got -3."),
    (["--config=configs/nope.py"], "config file configs/nope.py does not exist"),
])
def test_cli_errors_are_one_line_before_any_run(tmp_path, capsys, args, message):
  base = {"config": f"{ROOT}/configs/digits_evenodd_eps.py:smoke", "workdir": str(tmp_path)}
  base.update(a[2:].split("=", 1) for a in args)
  with pytest.raises(SystemExit) as exit_:
    experiments.main(["sweep", *(f"--{k}={v}" for k, v in base.items())])
  assert exit_.value.code == 1
  err = capsys.readouterr().err
  assert err.startswith(f"python -m dml_jax.run.experiments: {message}") and err.count("\n") == 1
  assert not os.listdir(tmp_path)   # no run started


def test_summary_table_leaves_a_metric_empty_where_a_protocol_lacks_it():
  """NMI+ is reported only for some protocols (Omniglot's languages, not its letters)."""
  cell = lambda m, s: {"mean": m, "std": s, "values": [m - s, m + s]}
  summary = {"data.group_size=8": {
      "test": {"recall@1": cell(0.35, 0.01), "nmi": cell(0.62, 0.0)},
      "test:alphabet": {"recall@1": cell(0.6, 0.02), "nmi": cell(0.3, 0.0),
                        "nmi+": cell(0.31, 0.01)}}}
  table = experiments.format_summary_table(summary, metrics=["recall@1", "nmi", "nmi+"])
  rows = table.splitlines()
  assert rows[-2] == "| data.group_size=8 | test | 35.0 ± 1.0 | 62.0 ± 0.0 |  |"
  assert rows[-1] == "| data.group_size=8 | test:alphabet | 60.0 ± 2.0 | 30.0 ± 0.0 | 31.0 ± 1.0 |"


def test_cli_stops_on_a_signal_like_train_py(tmp_path, monkeypatch, capsys):
  """The running point gets the stop flag of SIGINT / SIGTERM; its interruption ends the sweep
  with train.py's line and exit code."""
  from dml_jax.run import signals, training
  seen = []

  def interrupted(config, workdir, show_progress, stop):
    seen.append(isinstance(stop, signals.StopFlag) and not show_progress)
    raise training.TrainingInterrupted(7, 15)

  monkeypatch.setattr(training, "train_and_evaluate", interrupted)
  with pytest.raises(SystemExit) as exit_:
    experiments.main(["sweep", f"--config={ROOT}/configs/digits_evenodd_eps.py:smoke",
                      f"--workdir={tmp_path}", "--grid=loss.positive=easy,random"])
  assert exit_.value.code == 128 + 15 and seen == [True]
  assert capsys.readouterr().err == ("python -m dml_jax.run.experiments: interrupted at step 7; "
                                     "rerun the same command to resume\n")


def test_cli_shows_each_runs_log_lines(tmp_path, monkeypatch, caplog):
  """A point's per-log-step lines (absl INFO, off by default outside app.run) reach the user."""
  from absl import logging as absl_logging
  from dml_jax.run import training
  train_fn, _ = fake_train({("easy", 0): 0.9})

  def logging_train(config, workdir, show_progress, stop):
    absl_logging.info("step 2/4: loss 0.5")
    return train_fn(config, workdir)

  monkeypatch.setattr(training, "train_and_evaluate", logging_train)
  before = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.WARNING)
  try:
    assert experiments.main(["sweep", f"--config={ROOT}/configs/digits_ephn_groupsize.py:smoke",
                             "--grid=loss.positive=easy", f"--workdir={tmp_path}"]) == 0
  finally:
    absl_logging.set_verbosity(before)
  assert "step 2/4: loss 0.5" in caplog.text


def recording_train(values):
  """``fake_train`` that also writes ``config.json`` and ``run.json`` as train.py does."""
  from dml_jax.run import workdir as workdir_lib
  train_fn, calls = fake_train(values)

  def train(config, workdir):
    out = train_fn(config, workdir)
    workdir_lib.write_config(config, workdir)
    workdir_lib.write_run_info(workdir, num_train_steps=config.num_train_steps,
                               steps_per_epoch=1)
    return out

  return train, calls


def test_a_rerun_with_another_config_is_refused_not_answered_from_the_old_runs(tmp_path):
  """The same sweep directory with a --set that changes the runs: the finished runs were
  trained with the other config, so their results must not be reported as the new ones."""
  train_fn, calls = recording_train({("easy", 0): 0.6, ("easy", 1): 0.8})
  wd = str(tmp_path)
  experiments.sweep(small_config(10), grid=["loss.positive=easy"], seeds=2, workdir=wd,
                    train_fn=train_fn, log=lambda s: None)
  calls.clear()
  with pytest.raises(ValueError, match=r"trained with a different config \(optimizer"):
    experiments.sweep(small_config(10), grid=["loss.positive=easy"], seeds=2, workdir=wd,
                      overrides={"optimizer.learning_rate": "0.5"}, train_fn=train_fn,
                      log=lambda s: None)
  assert calls == []


def test_a_rerun_with_more_steps_extends_the_finished_runs(tmp_path):
  """--set num_train_steps=20 on a sweep of 10 steps resumes each run to step 20 (as train.py
  does) instead of reporting the step-10 results as the 20-step sweep's."""
  train_fn, calls = recording_train({("easy", 0): 0.6, ("easy", 1): 0.8})
  wd = str(tmp_path)
  experiments.sweep(small_config(10), grid=["loss.positive=easy"], seeds=2, workdir=wd,
                    train_fn=train_fn, log=lambda s: None)
  calls.clear()
  experiments.sweep(small_config(10), grid=["loss.positive=easy"], seeds=2, workdir=wd,
                    overrides={"num_train_steps": "20"}, train_fn=train_fn, log=lambda s: None)
  assert calls == [("easy", 0), ("easy", 1)]
  with open(os.path.join(wd, "sweep.json")) as f:
    assert [r["workdir"] for r in json.load(f)["runs"]]
  assert os.path.exists(os.path.join(wd, "loss.positive=easy", "seed_0", "eval_step_20.json"))


def test_a_shortened_rerun_is_refused_before_any_run(tmp_path):
  """--set num_train_steps=5 on a sweep of 10 steps whose runs hold a step-10 checkpoint:
  refused before the first run, not in the middle of the sweep."""
  train_fn, calls = recording_train({("easy", 0): 0.6, ("easy", 1): 0.8})
  wd = str(tmp_path)
  experiments.sweep(small_config(10), grid=["loss.positive=easy"], seeds=2, workdir=wd,
                    train_fn=train_fn, log=lambda s: None)
  os.makedirs(os.path.join(wd, "loss.positive=easy", "seed_1", "checkpoints", "10"))
  calls.clear()
  with pytest.raises(ValueError, match=r"seed_1's newest checkpoint is step 10, past the final "
                                       r"step 5 of num_train_steps=5"):
    experiments.sweep(small_config(10), grid=["loss.positive=easy"], seeds=2, workdir=wd,
                      overrides={"num_train_steps": "5"}, train_fn=train_fn,
                      log=lambda s: None)
  assert calls == []


@pytest.mark.parametrize("options,message", [
    ({"x": "data.group_size"}, r"--x='data.group_size' is not a grid key; grid keys: "
                               r"\['loss.positive'\]"),
    ({"x": "loss.positive"}, r"--x='loss.positive' must be a numeric grid key"),
    ({"protocol": "val"}, r"--protocol='val' is not one of the runs' eval.splits"),
])
def test_plot_options_are_checked_before_any_run(tmp_path, options, message):
  train_fn, calls = fake_train({("easy", 0): 0.9, ("random", 0): 0.5})
  with pytest.raises(ValueError, match=message):
    experiments.sweep(small_config(10), grid=["loss.positive=easy,random"], workdir=str(tmp_path),
                      train_fn=train_fn, log=lambda s: None, **options)
  assert calls == []


def test_an_unknown_metric_to_plot_is_one_line_naming_the_metrics(tmp_path):
  train_fn, _ = fake_train({("easy", 0): 0.9})
  with pytest.raises(ValueError, match=r"--metric='recal@1' is not a metric of protocol 'test'; "
                                       r"its metrics: recall@1, nmi"):
    experiments.sweep(small_config(10), grid=["loss.positive=easy"], workdir=str(tmp_path),
                      train_fn=train_fn, log=lambda s: None, metric="recal@1")
  assert os.path.exists(os.path.join(tmp_path, "sweep.json"))   # the results are kept


def in_use(train_fn, busy, finish):
  """``train_fn`` refused as another process's (``WorkdirInUseError``) for the first
  ``busy[seed]`` calls of each seed in ``busy``; ``finish(config, workdir)`` is what that
  process does before the last refusal."""
  from dml_jax.run import workdir_lock  # pylint: disable=import-outside-toplevel
  refused = dict.fromkeys(busy, 0)

  def fn(config, workdir):
    if refused.get(config.seed, 0) < busy.get(config.seed, 0):
      refused[config.seed] += 1
      if refused[config.seed] == busy[config.seed]:
        finish(config, workdir)
      raise workdir_lock.WorkdirInUseError(f"{workdir} is in use", holder="train.py (pid 7)")
    return train_fn(config, workdir)

  return fn


def test_a_run_another_process_trains_is_left_to_it_and_read_back(tmp_path):
  """The same sweep started twice (e.g. once per GPU): each run is trained once, by the process
  that took it first; the other reads its results back when it has finished."""
  train_fn, calls = fake_train({("easy", 0): 0.6, ("easy", 1): 0.8, ("easy", 2): 0.7})
  other, lines = fake_train({("easy", 1): 0.8})[0], []
  wd = str(tmp_path / "sweep")
  out = experiments.sweep(small_config(10, **{"loss.positive": "easy"}), seeds=3, workdir=wd,
                          log=lines.append, poll_seconds=0.01,
                          train_fn=in_use(train_fn, busy={1: 2}, finish=other))
  assert calls == [("easy", 0), ("easy", 2)]   # seed 1 was the other process's
  assert [r["results"]["test"]["recall@1"] for r in out["runs"]] == [0.6, 0.8, 0.7]
  seed_1 = os.path.join(wd, "base", "seed_1")
  assert lines.count(
      f"{seed_1}: train.py (pid 7) is training it; the sweep takes the other runs first") == 1
  assert lines.index(f"{seed_1}: finished by the other process") > lines.index(
      "[3/3] training base seed 2 -> " + os.path.join(wd, "base", "seed_2"))


def test_a_run_the_other_process_left_unfinished_is_trained_here(tmp_path):
  train_fn, calls = fake_train({("easy", 0): 0.6, ("easy", 1): 0.8})
  wd = str(tmp_path / "sweep")
  out = experiments.sweep(small_config(10, **{"loss.positive": "easy"}), seeds=2, workdir=wd,
                          log=lambda s: None, poll_seconds=0.01,
                          train_fn=in_use(train_fn, busy={0: 1}, finish=lambda c, w: None))
  assert calls == [("easy", 1), ("easy", 0)]   # seed 0 taken over once its holder was gone
  assert [r["results"]["test"]["recall@1"] for r in out["runs"]] == [0.6, 0.8]


def test_a_signal_while_waiting_for_another_process_stops_the_sweep(tmp_path):
  from dml_jax.run import signals  # pylint: disable=import-outside-toplevel
  from dml_jax.run import workdir_lock  # pylint: disable=import-outside-toplevel
  stop = signals.StopFlag()

  def always_in_use(config, workdir):
    stop.set(15)   # a SIGTERM arrives while the other process trains
    raise workdir_lock.WorkdirInUseError("in use")

  with pytest.raises(experiments.SweepInterrupted, match="rerun the same command"):
    experiments.sweep(small_config(10), workdir=str(tmp_path), log=lambda s: None,
                      poll_seconds=60, stop=stop, train_fn=always_in_use)


def test_a_long_wait_says_where_the_other_process_is(tmp_path, monkeypatch):
  """Waiting for another process's run shows its progress (its metrics.jsonl) now and then."""
  train_fn, _ = fake_train({("easy", 0): 0.6})
  wd = str(tmp_path / "sweep")
  seed_0 = os.path.join(wd, "base", "seed_0")

  def logging_steps(config, workdir):   # the other process: 60 of 80 steps logged
    workdir_lib.write_config(config, workdir)
    for step in (20, 40, 60):
      workdir_lib.append_metrics(workdir, {"step": step, "train/loss": 1.0})

  monkeypatch.setattr(experiments, "WAIT_REPORT_SECONDS", 0.0)
  lines = []
  experiments.sweep(small_config(80, **{"loss.positive": "easy"}), workdir=wd,
                    log=lines.append, poll_seconds=0.01,
                    train_fn=in_use(train_fn, busy={0: 2}, finish=logging_steps))
  assert f"still waiting: {seed_0} at step 60 of 80" in lines
  assert experiments.run_progress(str(tmp_path / "none"), small_config(80)) == (
      f"{tmp_path / 'none'} at step 0 of 80")


def test_status_tells_finished_training_stopped_and_not_started_runs(tmp_path, run20,
                                                                   capsys):
  """``status`` reads a sweep folder without taking a lock: a run whose holder still runs is
  training (this process holds it here), one that a killed run's lock file names is not."""
  import shutil  # pylint: disable=import-outside-toplevel
  from dml_jax.run import workdir_lock  # pylint: disable=import-outside-toplevel
  wd = tmp_path / "sweep"
  for seed in range(4):
    shutil.copytree(run20[0], wd / "base" / f"seed_{seed}")
  os.remove(wd / "base" / "seed_1" / "eval_step_20.json")       # stopped after its checkpoint
  for seed in (2, 3):                                             # not started
    shutil.rmtree(wd / "base" / f"seed_{seed}" / "checkpoints")
    for name in ("eval_step_20.json", "metrics.jsonl"):
      os.remove(wd / "base" / f"seed_{seed}" / name)
  dead = subprocess_pid_that_ended()
  with open(wd / "base" / "seed_3" / workdir_lock.LOCK_FILE, "w") as f:   # left by a kill
    json.dump({"program": "train.py", "pid": dead, "host": socket.gethostname(),
               "started": "then"}, f)
  with workdir_lock.hold(str(wd / "base" / "seed_2"), program="train.py"):
    assert experiments.main(["status", f"--workdir={wd}"]) == 0
  out = capsys.readouterr().out
  assert "| base/seed_0 | finished | 20 / 20 |" in out
  assert "| base/seed_1 | stopped at checkpoint 20 | 20 / 20 |" in out
  assert f"| base/seed_2 | training: train.py (pid {os.getpid()} on host " in out
  assert "| base/seed_3 | not started | 0 / 20 |" in out
  assert "4 runs: 1 finished, 1 stopped, 1 training, 1 not started" in out
  with pytest.raises(SystemExit):
    experiments.main(["status", f"--workdir={tmp_path / 'none'}"])
  assert "holds no run folder" in capsys.readouterr().err


def subprocess_pid_that_ended() -> int:
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  return int(proc.stdout)
