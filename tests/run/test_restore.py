"""restore_model: a workdir's model and evaluation data, never a sampler, an objective or an
optimizer; the checkpoint's parameters and batch statistics only, equal to the full state's."""

import json
import os
import shutil

import numpy as np
import pytest

from dml_jax import data as data_lib
from dml_jax import objectives
from dml_jax import optimizers
from dml_jax.analysis import common
from dml_jax.run import checkpointing
from dml_jax.run import eval_checkpoints
from dml_jax.run import restore
from dml_jax.run import training
from dml_jax.run import workdir as workdir_lib
from dml_test_support import leaves_equal, restore_state


@pytest.fixture
def no_training_parts(monkeypatch):
  """Building a sampler, an objective or an optimizer fails the test."""
  def refuse(what):
    def fail(*args, **kwargs):
      raise AssertionError(f"restoring a model built {what}")
    return fail
  monkeypatch.setattr(data_lib, "NPerClassSampler", refuse("a sampler"))
  monkeypatch.setattr(objectives, "make", refuse("an objective"))
  monkeypatch.setattr(optimizers, "make_optimizer", refuse("an optimizer"))


@pytest.mark.slow
def test_restore_model_is_the_checkpoints_model(run20):
  workdir, _ = run20
  model = restore.restore_model(workdir)
  step, state, _ = restore_state(workdir)
  assert model.step == step == 20
  assert set(model.variables) == {"params", "batch_stats"}
  assert leaves_equal(model.variables, {"params": state["params"],
                                        "batch_stats": state["batch_stats"]})
  assert restore.restore_model(workdir, 10).step == 10
  images = model.splits["test"].images[:8]
  ours = restore.embed_split(model, images, batch_size=8)
  embed = training.make_embed_fn(training.build(model.config))
  np.testing.assert_allclose(ours, np.asarray(embed(state, images)), atol=1e-6)


@pytest.mark.slow
def test_restoring_builds_no_sampler_objective_or_optimizer(run20, tmp_path, no_training_parts):
  workdir, results = run20
  copy = str(tmp_path / "copy")
  shutil.copytree(workdir, copy)
  assert restore.restore_model(copy).step == 20
  step, again = eval_checkpoints.evaluate_checkpoint(copy)
  assert step == 20 and again.keys() == results.keys()
  for protocol in results:
    assert again[protocol] == pytest.approx(results[protocol], abs=1e-6)
  step, out, _ = common.load_embeddings(copy, splits=("test",))
  assert step == 20 and out["test"][0].shape[0] == len(out["test"][1].labels)


@pytest.mark.slow
def test_at_init_is_the_initial_state_of_training(run20):
  workdir, _ = run20
  model = restore.restore_model(workdir, at_init=True)
  init = training.build(workdir_lib.load_config(workdir)).init_state
  assert model.step == 0
  assert leaves_equal(model.variables, {"params": init["params"],
                                        "batch_stats": init["batch_stats"]})


@pytest.mark.slow
def test_restore_errors_are_named(run20, tmp_path):
  workdir, _ = run20
  with pytest.raises(ValueError, match="No checkpoint for step 15"):
    restore.restore_model(workdir, 15)
  with pytest.raises(FileNotFoundError, match="is not a dml_jax workdir"):
    restore.restore_model(str(tmp_path / "nowhere"))
  empty = tmp_path / "empty"
  empty.mkdir()
  shutil.copy(os.path.join(workdir, workdir_lib.CONFIG_FILE), empty)
  with pytest.raises(FileNotFoundError, match="No checkpoint in"):
    restore.restore_model(str(empty))
  other = tmp_path / "other"
  shutil.copytree(workdir, other)
  path = other / workdir_lib.CONFIG_FILE
  tree = json.loads(path.read_text())
  tree["model"]["embedding_dim"] = 7
  path.write_text(json.dumps(tree))
  with pytest.raises(checkpointing.CheckpointMismatchError, match="shape"):
    restore.restore_model(str(other))
