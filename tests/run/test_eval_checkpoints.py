"""eval_checkpoints: the machine's input settings replace a workdir's recorded ones."""

import os
import shutil

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
