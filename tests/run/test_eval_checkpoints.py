"""eval_checkpoints: the machine's input settings replace a workdir's recorded ones."""

import json
import os
import shutil

import pytest

from dml_jax.run import eval_checkpoints
from dml_jax.run import writers
from dml_jax.run import workdir as workdir_lib
from dml_test_support import small_config


def test_machine_settings_replace_the_recorded_ones(tmp_path):
  config = small_config(2, **{"data.num_threads": 8, "data.num_workers": -1})
  workdir_lib.write_config(config, str(tmp_path))
  loaded = eval_checkpoints.load_config(str(tmp_path), {"data.num_threads": 1})
  assert (loaded.data.num_threads, loaded.data.num_workers) == (1, -1)
  assert eval_checkpoints.load_config(str(tmp_path)).data.num_threads == 8
  assert workdir_lib.load_config(str(tmp_path)).data.num_threads == 8   # the file is unchanged



def test_output_replaces_only_an_earlier_result_of_its_mode(tmp_path):
  run = tmp_path / "run"
  workdir_lib.write_config(small_config(2), str(run))
  config = (run / "config.json").read_text()
  for mode in ("all_steps", "workdirs"):   # the run's own config.json is not a result
    with pytest.raises(ValueError, match=rf"^--output={run}/config.json: {run}/config.json "
                       r"exists and is not an earlier eval.py result; it is left as it is"):
      eval_checkpoints.check_output(str(run / "config.json"), mode)
  assert (run / "config.json").read_text() == config
  (tmp_path / "curves.png").write_bytes(b"a figure of mine")   # beside an absent JSON
  with pytest.raises(ValueError, match=rf"{tmp_path}/curves.png exists and is not an earlier"):
    eval_checkpoints.check_output(str(tmp_path / "curves.json"), "all_steps")
  eval_checkpoints.check_output(str(tmp_path / "curves.json"), "workdirs")   # writes .md
  assert not (tmp_path / "curves.json").exists()   # the check leaves nothing behind
  earlier = tmp_path / "seeds.json"
  earlier.write_text(json.dumps({"workdirs": [], "steps": [], "runs": [], "summary": {}}))
  (tmp_path / "seeds.md").write_text("mean ± std")
  eval_checkpoints.check_output(str(earlier), "workdirs")   # replaced, with its .md
  with pytest.raises(ValueError, match="seeds.json exists and is not an earlier"):
    eval_checkpoints.check_output(str(earlier), "all_steps")
  eval_checkpoints.check_output(str(tmp_path / "new" / "x.json"), "all_steps")
  assert (tmp_path / "new").is_dir()


def test_runs_of_other_lengths_or_evaluations_are_named_as_differences(tmp_path):
  """eval.py --workdirs warns when its mean ± std mixes runs that differ in more than the seed:
  also in their length and their evaluation (keys a rerun may change, but which change the
  numbers), as the HTML summary groups them."""
  workdirs = []
  for i, (steps, overrides) in enumerate(((20, {}), (20, {"seed": 1}),
                                          (20, {"eval.similarity": "cosine"}), (40, {}))):
    workdirs.append(str(tmp_path / f"run{i}"))
    workdir_lib.write_config(small_config(steps, **overrides), workdirs[-1])
  assert eval_checkpoints.config_differences(workdirs[:2]) == []
  assert [d.split(":")[0] for d in eval_checkpoints.config_differences(workdirs)] == [
      "eval.similarity", "num_train_steps"]


def test_eval_py_keeps_the_earlier_evaluations_in_tensorboard(run20, tmp_path):
  """eval.py of step 10, then of step 20: TensorBoard shows both (the second run's events do
  not purge the first's)."""
  workdir = str(tmp_path / "run")
  shutil.copytree(run20[0], workdir)
  for step in (10, 20, 10):
    eval_checkpoints.evaluate_checkpoint(workdir, step=step)
  events = writers.read_events(os.path.join(workdir, writers.TENSORBOARD_DIR, "eval"))
  assert [s for s, _ in events["scalars"]["eval/test/recall@1"]] == [10, 20, 10]
  assert [s for s, _ in events["histograms"]["eval/test/similarity_positive"]] == [10, 20, 10]


def test_all_steps_skips_a_checkpoint_deleted_since_it_was_listed(run20_copy, monkeypatch,
                                                                  capsys):
  """eval.py --all_steps beside a run training with max_checkpoints_to_keep: a checkpoint
  that run deletes before its turn is skipped with a line, the others are evaluated (it
  stopped the whole evaluation with 'No checkpoint for step ...')."""
  workdir, listed = run20_copy, eval_checkpoints.checkpoint_steps

  def listed_then_deleted(wd):
    steps = listed(wd)
    if os.path.isdir(os.path.join(wd, "checkpoints", "10")):   # the first listing
      shutil.rmtree(os.path.join(wd, "checkpoints", "10"))
    return steps

  monkeypatch.setattr(eval_checkpoints, "checkpoint_steps", listed_then_deleted)
  out = eval_checkpoints.evaluate_all_steps(workdir)
  assert list(out["steps"]) == [20]
  assert ("dml_jax: step 10: deleted since it was listed (max_checkpoints_to_keep of the run "
          "training there); skipped\n") in capsys.readouterr().out
  with open(out["json"]) as f:
    assert list(json.load(f)["steps"]) == ["20"]


def test_all_steps_still_fails_on_a_listed_checkpoint_that_cannot_be_read(run20_copy):
  for root, _, files in os.walk(os.path.join(run20_copy, "checkpoints", "10")):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  with pytest.raises(ValueError, match="10"):
    eval_checkpoints.evaluate_all_steps(run20_copy)
