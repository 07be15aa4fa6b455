"""A rerun can never damage a workdir: refused configs leave it byte-identical; --overwrite;
checkpoints that do not fit the config; Ctrl-C saves; the resolved config on disk."""

import json
import os
import re

import pytest

from dml_jax.run import checkpointing
from dml_jax.run import signals
from dml_jax.run import training
from dml_jax.run import workdir as workdir_lib
from dml_jax.run import eval_checkpoints
from dml_test_support import ROOT
from dml_test_support import small_config
from dml_test_support import snapshot


@pytest.fixture
def copy(run20_copy):
  return run20_copy


@pytest.mark.parametrize("key,value,listed", [
    ("loss.positive", "random", "loss.positive 'easy' -> 'random'"),
    ("model.embedding_dim", 16, "model.embedding_dim 2 -> 16"),
])
def test_rerun_with_another_config_is_refused_and_changes_nothing(copy, key, value, listed):
  before = snapshot(copy)
  with pytest.raises(workdir_lib.WorkdirConflictError) as e:
    training.train_and_evaluate(small_config(20, **{key: value}), copy, show_progress=False)
  message = str(e.value)
  assert listed in message and "--overwrite" in message and "new --workdir" in message
  assert "\n" not in message
  assert snapshot(copy) == before
  # The untouched run still evaluates.
  step, _ = eval_checkpoints.evaluate_checkpoint(copy)
  assert step == 20


def test_checkpoint_of_another_shape_is_a_mismatch_not_damage(copy, caplog):
  os.remove(os.path.join(copy, workdir_lib.CONFIG_FILE))   # nothing to compare with first
  before = snapshot(copy)
  with caplog.at_level("WARNING"):
    with pytest.raises(checkpointing.CheckpointMismatchError,
                       match="the config differs from the checkpoint .*20: params/dense2/.* shape"):
      training.train_and_evaluate(small_config(20, **{"model.embedding_dim": 16}), copy,
                                  show_progress=False)
  assert not any("cannot be restored" in r.getMessage() for r in caplog.records)
  assert snapshot(copy) == before


def test_resumable_keys_may_change(copy):
  results = training.train_and_evaluate(
      small_config(30, log_every_steps=10, **{"eval.ks": (1, 5)}), copy, show_progress=False)
  assert set(results["test"]) >= {"recall@1", "recall@5"} and "recall@10" not in results["test"]
  config = workdir_lib.load_config(copy)
  assert config.num_train_steps == 30 and tuple(config.eval.ks) == (1, 5)
  assert os.path.exists(os.path.join(copy, "eval_step_30.json"))


def test_overwrite_starts_afresh(copy):
  for name in ("notes.txt", "my_plot_step_3.png", "scatter_test_step_20.png"):
    with open(os.path.join(copy, name), "w") as f:
      f.write("mine" if name.startswith(("notes", "my_")) else "ours")
  training.train_and_evaluate(small_config(10, **{"loss.positive": "random"}), copy,
                              show_progress=False, overwrite=True)
  manager = checkpointing.make_manager(copy, read_only=True)
  assert checkpointing.steps(manager) == [10]
  assert workdir_lib.load_config(copy).loss.positive == "random"
  assert not os.path.exists(os.path.join(copy, "eval_step_20.json"))
  assert max(r["step"] for r in workdir_lib.read_metrics(copy)) == 10
  assert os.path.exists(os.path.join(copy, "notes.txt"))   # not ours: kept
  assert os.path.exists(os.path.join(copy, "my_plot_step_3.png"))
  assert not os.path.exists(os.path.join(copy, "scatter_test_step_20.png"))


def test_stop_flag_saves_the_current_step(tmp_path):
  workdir = str(tmp_path)
  stop = signals.StopFlag()
  stop.set(2)   # as if SIGINT arrived during the first step
  with pytest.raises(training.TrainingInterrupted,
                     match="interrupted at step 1; rerun the same command to resume"):
    training.train_and_evaluate(small_config(20), workdir, show_progress=False, stop=stop)
  manager = checkpointing.make_manager(workdir, read_only=True)
  assert checkpointing.steps(manager) == [1]
  assert not os.path.exists(os.path.join(workdir, "eval_step_1.json"))


def test_config_changes_and_resumable_keys():
  old = {"a": 1, "eval": {"ks": [1, 2]}, "loss": {"name": "nca", "temperature": 0.1}}
  new = {"a": 1, "eval": {"ks": [1]}, "loss": {"name": "nca", "margin": 0.2}}
  assert workdir_lib.config_changes(old, new) == [
      ("eval.ks", (1, 2), (1,)), ("loss.margin", None, 0.2), ("loss.temperature", 0.1, None)]
  assert workdir_lib.is_resumable("eval.ks") and workdir_lib.is_resumable("num_train_steps")
  assert not workdir_lib.is_resumable("evaluation") and not workdir_lib.is_resumable("seed")


def test_an_older_config_json_is_not_a_conflict(tmp_path):
  """Keys added to the schema since a workdir was written take their old-behaviour value."""
  config = small_config()
  tree = json.loads(workdir_lib.config_json(config))
  del tree["data"]["noise_seed"], tree["user_modules"]
  os.makedirs(tmp_path, exist_ok=True)
  with open(tmp_path / workdir_lib.CONFIG_FILE, "w") as f:
    json.dump(tree, f)
  assert workdir_lib.check_rerun(config, str(tmp_path)) == []


@pytest.mark.parametrize("text,why", [
    ("{}", "it lacks 'seed', 'num_train_steps', 'batch_size', 'data.name', 'model.name', "
           "'loss.name', 'optimizer.name', 'eval.splits' (train.py writes"),
    ('{"data": {"name": "digits_evenodd"}, "seed": 0}', "it lacks 'num_train_steps', "),
    ("[1, 2]", "it holds a JSON list, not an object"),
    ("{nope", "not JSON (Expecting property name"),
])
def test_a_config_json_that_is_not_a_dml_jax_config_is_one_line(tmp_path, text, why):
  (tmp_path / workdir_lib.CONFIG_FILE).write_text(text)
  path = os.path.join(str(tmp_path), workdir_lib.CONFIG_FILE)
  for read in (workdir_lib.load_config, eval_checkpoints.evaluate_checkpoint):
    with pytest.raises(ValueError) as error:
      read(str(tmp_path))
    assert str(error.value).startswith(f"{path} is not a dml_jax config: {why}")
    assert "\n" not in str(error.value)


def test_the_training_page_lists_the_keys_a_rerun_may_change():
  """docs/training.md "A rerun never damages a workdir" names exactly workdir.RESUMABLE_KEYS."""
  with open(os.path.join(ROOT, "docs", "training.md")) as f:
    text = " ".join(f.read().split())
  start = text.index("The keys a rerun **may** change")
  paragraph = text[start:text.index("`config.json` is written only", start)]
  keys = {k.replace(".*", ".") for k in re.findall(r"`([a-z_.]+(?:\.\*)?)`", paragraph)}
  keys.discard("workdir.RESUMABLE_KEYS")
  assert keys == set(workdir_lib.RESUMABLE_KEYS)


def test_a_file_as_workdir_is_refused_before_any_work(tmp_path):
  path = tmp_path / "notes.txt"
  path.write_text("mine")
  with pytest.raises(ValueError, match=r"^the workdir '.*notes.txt' is a file, not a directory"):
    training.train_and_evaluate(small_config(2), str(path), show_progress=False)
  assert path.read_text() == "mine"


def test_a_workdir_under_a_file_is_refused_before_any_work(tmp_path):
  path = tmp_path / "notes.txt"
  path.write_text("mine")
  with pytest.raises(ValueError, match=r"^the workdir '.*notes.txt/run' is inside .*notes.txt"
                                       r"', a file"):
    training.train_and_evaluate(small_config(2), str(path / "run"), show_progress=False)
  assert path.read_text() == "mine"


def test_a_rerun_shorter_than_the_newest_checkpoint_is_refused_and_changes_nothing(copy):
  """num_train_steps=15 on a workdir whose newest checkpoint is step 20: training would not
  run, and the step-20 model would be evaluated and reported as the 15-step run's."""
  before = snapshot(copy)
  with pytest.raises(ValueError, match=r"newest checkpoint is step 20, past the final step 15 "
                                       r"of num_train_steps=15: .* Give num_train_steps >= 20"):
    training.train_and_evaluate(small_config(15), copy, show_progress=False)
  assert snapshot(copy) == before
  # the check a sweep makes before any run, from the folder names and run.json
  with pytest.raises(ValueError, match=r"step 20, past the final step 15"):
    workdir_lib.check_not_past_the_end(copy, small_config(15))
  workdir_lib.check_not_past_the_end(copy, small_config(20))



def test_a_shortened_epoch_run_is_named_in_epochs(tmp_path):
  os.makedirs(tmp_path / "checkpoints" / "20")
  (tmp_path / "run.json").write_text(json.dumps({"num_train_steps": 24, "steps_per_epoch": 8}))
  with pytest.raises(ValueError, match=r"step 20, past the final step 16 of num_epochs=2: .* "
                                       r"Give num_epochs >= 3,"):
    workdir_lib.check_not_past_the_end(str(tmp_path), small_config(**{"num_epochs": 2}))
  workdir_lib.check_not_past_the_end(str(tmp_path), small_config(**{"num_epochs": 3}))


def test_a_bad_value_on_a_rerun_is_named_as_a_bad_value_not_as_a_change(copy):
  """A misspelt objective mode on an existing workdir: the line says what is allowed (as on a
  new workdir), instead of calling it a config change that --overwrite would accept."""
  before = snapshot(copy)
  with pytest.raises(ValueError, match=r"positive=.esay. is not allowed; choose one of") as e:
    training.train_and_evaluate(small_config(20, **{"loss.positive": "esay"}), copy,
                                show_progress=False)
  assert not isinstance(e.value, workdir_lib.WorkdirConflictError)
  assert snapshot(copy) == before


def test_a_url_workdir_is_refused_before_any_work(tmp_path, monkeypatch):
  """--workdir=gs://bucket/W: os.makedirs would make a local folder 'gs:' and Orbax fail on
  the first checkpoint with a traceback."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ValueError, match=r"^the workdir 'gs://bucket/W' is a URL; give a "
                                       r"directory of a mounted file system"):
    training.train_and_evaluate(small_config(2), "gs://bucket/W", show_progress=False)
  assert not os.listdir(tmp_path)


def test_an_empty_workdir_is_refused_before_any_work():
  """--workdir= (an empty value): one line saying so, not "No such file or directory: ''"."""
  with pytest.raises(ValueError, match=r"^the workdir is empty \(''\); give a directory"):
    training.train_and_evaluate(small_config(2), "", show_progress=False)


@pytest.mark.parametrize("config_json", ['{"lr": 0.1}', None])
def test_overwrite_refuses_a_folder_that_is_not_a_dml_jax_workdir(tmp_path, config_json):
  """--overwrite on a folder of another program (its own config.json, or checkpoints/ with
  files that are not Orbax step folders) deletes nothing of it."""
  folder = tmp_path / "project"
  (folder / "checkpoints").mkdir(parents=True)
  (folder / "checkpoints" / "model_best.pt").write_text("weights")
  if config_json is not None:
    (folder / "config.json").write_text(config_json)
  before = snapshot(str(folder))
  with pytest.raises(ValueError, match=r"--overwrite: .*project.* is not a dml_jax workdir"):
    training.train_and_evaluate(small_config(2), str(folder), show_progress=False,
                                overwrite=True)
  assert snapshot(str(folder)) == before


@pytest.mark.parametrize("overwrite", [False, True])
def test_files_of_another_program_without_config_json_are_kept(tmp_path, overwrite):
  """A folder with its own metrics.jsonl / run.json but no config.json (another program's):
  train.py neither truncates nor overwrites them (nor deletes them with --overwrite)."""
  folder = tmp_path / "project"
  folder.mkdir()
  (folder / "metrics.jsonl").write_text('{"step": 100, "loss": 0.5}\n')
  (folder / "run.json").write_text('{"epochs": 90}')
  (folder / "notes.txt").write_text("mine")
  before = snapshot(str(folder))
  with pytest.raises(ValueError, match=r"project.* is not a dml_jax workdir.*metrics\.jsonl, "
                                       r"run\.json but no config\.json.*Give a new --workdir"):
    training.train_and_evaluate(small_config(2), str(folder), show_progress=False,
                                overwrite=overwrite)
  assert snapshot(str(folder)) == before


def test_overwrite_of_a_folder_named_with_brackets_deletes_only_its_own_files(tmp_path):
  """``runs/exp[1]`` is a folder name, not a glob pattern matching ``runs/exp1``."""
  mine, other = tmp_path / "exp[1]", tmp_path / "exp1"
  for folder in (mine, other):
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("{}\n")
  assert workdir_lib.clear(str(mine)) == [str(mine / "metrics.jsonl")]
  assert os.listdir(mine) == [] and os.listdir(other) == ["metrics.jsonl"]


def test_a_stop_while_metrics_jsonl_is_rewritten_keeps_it_whole(tmp_path, monkeypatch):
  """A resume rewrites metrics.jsonl (dropping the rows after the checkpoint); a second Ctrl-C
  or a kill during that rewrite must not cut the run's history."""
  workdir = str(tmp_path)
  rows = [{"step": s, "train/loss": 1.0 / s} for s in range(1, 101)]
  for row in rows:
    workdir_lib.append_metrics(workdir, row)
  dumps, calls = json.dumps, []

  def interrupted(obj, *args, **kwargs):
    calls.append(obj)
    if len(calls) == 10:
      raise KeyboardInterrupt("second SIGINT")
    return dumps(obj, *args, **kwargs)

  monkeypatch.setattr(workdir_lib.json, "dumps", interrupted)
  with pytest.raises(KeyboardInterrupt):
    workdir_lib.truncate_metrics(workdir, 50)
  monkeypatch.setattr(workdir_lib.json, "dumps", dumps)
  assert workdir_lib.read_metrics(workdir) == rows
  assert os.listdir(workdir) == [workdir_lib.METRICS_FILE]
  workdir_lib.truncate_metrics(workdir, 50)
  assert workdir_lib.read_metrics(workdir) == rows[:50]


def test_only_relative_data_paths_are_made_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  config = small_config()
  config.data.options = {"root": "imgs", "path": "", "data_dir": "gs://bucket/tfds",
                         "train_digits": (0, 1)}
  got = workdir_lib.absolute_data_paths(config).data.options
  assert got.root == str(tmp_path / "imgs") and got.path == "" and got.data_dir.startswith("gs:")
  config.data.options = {"root": "~/data", "path": "/abs/list.csv"}
  assert workdir_lib.absolute_data_paths(config) is config


def test_an_overwrite_cut_off_while_deleting_can_be_rerun(tmp_path, monkeypatch):
  """A kill (or a second Ctrl-C) while ``--overwrite`` deletes the earlier outputs leaves a
  folder that train.py still takes as its own: the same command, with or without
  ``--overwrite``, is not refused as another program's folder."""
  workdir = str(tmp_path / "run")
  config = small_config(2)
  workdir_lib.write_config(config, workdir)
  for name in (workdir_lib.RUN_INFO_FILE, workdir_lib.METRICS_FILE, "eval_step_2.json"):
    (tmp_path / "run" / name).write_text("{}\n")
  remove, calls = os.remove, []

  def killed(path):
    calls.append(path)
    if len(calls) == 2:
      raise KeyboardInterrupt("second SIGINT")
    remove(path)

  monkeypatch.setattr(workdir_lib.os, "remove", killed)
  with pytest.raises(KeyboardInterrupt):
    workdir_lib.clear(workdir)
  monkeypatch.setattr(workdir_lib.os, "remove", remove)
  assert workdir_lib.foreign_outputs(workdir) == []
  workdir_lib.check_overwrite(workdir)
  assert workdir_lib.check_rerun(config, workdir) == []
