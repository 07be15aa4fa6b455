"""End-to-end training on the embedded digits: steps, checkpoints, resume, NaN guard, eval."""

import json
import os

import jax
import numpy as np
import pytest

from dml_jax.run import checkpointing
from dml_jax import data as data_lib
from dml_jax import optimizers
from dml_jax.run import restore
from dml_jax.run import config as config_lib
from dml_jax.run import training
from dml_jax.run import workdir as workdir_lib
from dml_jax.run import writers
from dml_jax.data import noise as noise_lib
from dml_jax.run import eval_checkpoints
from dml_test_support import leaves_equal, restore_state, small_config


def read_rows(workdir):
  with open(os.path.join(workdir, workdir_lib.METRICS_FILE)) as f:
    return [json.loads(line) for line in f if line.strip()]


def test_run_writes_everything(run20):
  workdir, results = run20
  assert sorted(checkpointing.steps(checkpointing.make_manager(workdir, read_only=True))) == [10, 20]
  rows = read_rows(workdir)
  assert [r["step"] for r in rows if "train/loss" in r] == [5, 10, 15, 20]
  assert [r["first_step"] for r in rows if "train/loss" in r] == [1, 6, 11, 16]
  assert all(np.isfinite(r["train/loss"]) and r["examples_per_sec"] > 0
             for r in rows if "train/loss" in r)
  with open(os.path.join(workdir, "eval_step_20.json")) as f:
    saved = json.load(f)
  assert saved["step"] == 20
  assert saved["results"] == results
  for protocol in ("test", "train:digit"):
    for key in ("recall@1", "recall@5", "recall@10", "map@r", "r_precision", "nmi"):
      assert 0.0 <= results[protocol][key] <= 1.0
  config = workdir_lib.load_config(workdir)
  assert config.loss.positive == "easy" and config.num_train_steps == 20


def test_loss_goes_down_and_max_checkpoints_to_keep_0_keeps_all(tmp_path):
  workdir = str(tmp_path)
  training.train_and_evaluate(
      small_config(60, log_every_steps=20, checkpoint_every_steps=10, max_checkpoints_to_keep=0),
      workdir, show_progress=False)
  losses = [r["train/loss"] for r in read_rows(workdir) if "train/loss" in r]
  assert len(losses) == 3
  assert losses[-1] < losses[0]
  manager = checkpointing.make_manager(workdir, read_only=True)
  assert sorted(checkpointing.steps(manager)) == [10, 20, 30, 40, 50, 60]


def test_resume_continues_and_matches_uninterrupted(run20, tmp_path):
  workdir = str(tmp_path)
  training.train_and_evaluate(small_config(10), workdir, show_progress=False)
  assert restore_state(workdir)[0] == 10
  results = training.train_and_evaluate(small_config(20), workdir, show_progress=False)
  step, state, _ = restore_state(workdir)
  assert step == 20 and int(state["step"]) == 20
  _, ref_state, _ = restore_state(run20[0])
  assert leaves_equal(state, ref_state, atol=1e-6)
  for p in run20[1]:
    assert results[p] == pytest.approx(run20[1][p], abs=1e-6)
  # metrics.jsonl and TensorBoard have each log step exactly once.
  steps = [r["step"] for r in read_rows(workdir) if "train/loss" in r]
  assert steps == [5, 10, 15, 20]
  events = writers.read_events(os.path.join(workdir, writers.TENSORBOARD_DIR, "train"))
  assert [s for s, _ in events["scalars"]["train/loss"]] == [5, 10, 15, 20]
  assert [s for s, _ in events["scalars"]["eval/test/recall@1"]] == [10, 20]


def test_eval_checkpoint_equals_train_results(run20):
  workdir, results = run20
  step, again = eval_checkpoints.evaluate_checkpoint(workdir)
  assert step == 20
  assert again.keys() == results.keys()
  for p in results:
    assert again[p] == pytest.approx(results[p], abs=1e-6)


def test_damaged_latest_checkpoint_falls_back(run20, tmp_path, caplog):
  import shutil
  workdir = str(tmp_path / "copy")
  shutil.copytree(run20[0], workdir)
  latest = os.path.join(checkpointing.checkpoint_dir(workdir), "20", "state")
  for root, _, files in os.walk(latest):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  with caplog.at_level("WARNING"):
    step, _, _ = restore_state(workdir)
  assert step == 10
  assert any("20" in r.getMessage() and "cannot be restored" in r.getMessage()
             for r in caplog.records)


def test_training_resumed_before_a_damaged_checkpoint_sets_it_aside_and_goes_past_it(
    run20_copy, capsys):
  # the run fell back to step 10 and then stopped at 20: "Checkpoint for step 20 already
  # exists"; and Orbax's unfinished reads printed tracebacks
  workdir = run20_copy
  latest = os.path.join(checkpointing.checkpoint_dir(workdir), "20")
  for root, _, files in os.walk(os.path.join(latest, "state")):
    if "ocdbt.process" in root:   # the arrays' data files: the metadata still reads
      for name in files:
        os.remove(os.path.join(root, name))
  capsys.readouterr()
  training.train_and_evaluate(small_config(30), workdir, show_progress=False)
  aside = os.path.join(workdir, checkpointing.UNREADABLE_DIR, "20")
  assert os.path.isdir(os.path.join(aside, "state"))   # kept, out of the manager's way
  manager = checkpointing.make_manager(workdir, read_only=True)
  try:
    assert checkpointing.steps(manager) == [10, 20, 30]   # 20 saved anew
  finally:
    manager.close()
  assert restore_state(workdir, step=20)[0] == 20
  err = capsys.readouterr().err
  assert "Traceback" not in err and "never retrieved" not in err, err[-3000:]
  assert checkpointing.UNREADABLE_DIR in workdir_lib.OUTPUTS   # --overwrite removes it


def test_eval_without_checkpoint_is_a_clear_error(tmp_path):
  workdir_lib.write_config(small_config(), str(tmp_path))
  with pytest.raises(FileNotFoundError, match="No checkpoint"):
    eval_checkpoints.evaluate_checkpoint(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="not a dml_jax workdir"):
    eval_checkpoints.evaluate_checkpoint(str(tmp_path / "nowhere"))


def test_nan_stops_training_and_never_checkpoints_nan(tmp_path, monkeypatch):
  real_load = data_lib.load

  def poisoned_load(name, **kwargs):
    splits = dict(real_load(name, **kwargs))
    train = splits["train"]
    images = train.images.copy()
    images[:] = np.nan
    splits["train"] = type(train)(images=images, labels=train.labels,
                                  label_sets=train.label_sets, name=train.name)
    return splits

  monkeypatch.setattr(training.data_lib, "load", poisoned_load)
  with pytest.raises(training.NonFiniteLossError, match="at step 1 "):
    training.train_and_evaluate(small_config(), str(tmp_path), show_progress=False)
  manager = checkpointing.make_manager(str(tmp_path), read_only=True)
  assert checkpointing.steps(manager) == []


def test_train_step_keeps_state_on_nan():
  setup = training.build(small_config())
  step_fn = training.make_train_step(setup)
  train = setup.splits["train"]
  idx = setup.sampler.batch_indices(0)
  images = np.full_like(train.images[idx], np.nan)
  new_state, metrics = step_fn(setup.init_state, images, train.labels[idx],
                               training.step_key(0, 1))
  assert float(metrics["finite"]) == 0.0
  assert leaves_equal(new_state, setup.init_state)


@pytest.mark.parametrize("key,value,match", [
    ("num_train_steps", 0, "num_train_steps"),
    ("data.image_size", 32, "image_size"),
    ("model.pretrained", "w.msgpack", "pretrained"),
    ("data.num_workers", -2, r"num_workers=-2; allowed: -1 \(auto\)"),
    ("data.label_noise", 1.5, r"^config.data.label_noise must be in \[0, 1\], got 1.5.$"),
    ("data.clean_fraction", 0.0,
     r"^config.data.clean_fraction must be a number in \(0, 1\], got 0.0.$"),
    ("data.clean_fraction", -0.2, r"^config.data.clean_fraction must be a number in \(0, 1\]"),
    ("data.noise_seed", -1, r"^config.data.noise_seed must be an int >= 0, got -1.$"),
    ("data.group_size", 1, r"^data.group_size=1 must be between 2 and batch_size=32 \(examples "),
    ("data.group_size", 5, r"^batch_size=32 must be a multiple of data.group_size=5 .*e.g. 30.$"),
    ("data.num_threads", 0, r"^data.num_threads=0; allowed: an integer >= 1 \(decoding "),
    ("data.prefetch", -1, r"^config.data.prefetch must be an integer >= 0 \(batches decoded "),
    ("scatter_every_steps", -1, r"^config.scatter_every_steps must be an integer >= 0, got -1.$"),
    ("max_checkpoints_to_keep", -1, r"^config.max_checkpoints_to_keep must be an integer >= 0"),
    ("data.small_class", "pad", r"^Unknown data.small_class 'pad'; allowed: all, replace, skip.$"),
    ("data.epoch", "one", r"^Unknown data.epoch 'one'; allowed: every_example, one_group_"),
])
def test_bad_config_values(key, value, match):
  with pytest.raises((ValueError, NotImplementedError, FileNotFoundError), match=match):
    config_lib.validate(small_config(**{key: value}))


@pytest.mark.parametrize("key,value,allowed", [
    ("learning_rate", -1.0, "finite and >= 0"),
    ("learning_rate", float("inf"), "finite and >= 0"),
    ("learning_rate", float("nan"), "finite and >= 0"),
    ("objective_learning_rate", -0.1, "finite and >= 0"),
    ("backbone_learning_rate", -1e-3, "finite and >= 0"),
    ("head_learning_rate", float("inf"), "finite and >= 0"),
    ("momentum", 1.0, "in [0, 1)"),
    ("momentum", -0.5, "in [0, 1)"),
    ("weight_decay", -1e-4, "finite and >= 0"),
    ("weight_decay", float("inf"), "finite and >= 0"),
    ("decay_factor", 0.0, "in (0, 1]"),
    ("decay_factor", 10.0, "in (0, 1]"),
    ("warmup_steps", -5, ">= 0"),
])
def test_bad_optimizer_values_are_one_line_before_any_work(key, value, allowed):
  with pytest.raises(ValueError) as error:
    config_lib.validate(small_config(**{f"optimizer.{key}": value}))
  assert str(error.value) == f"optimizer.{key}={value!r} is not allowed: it must be {allowed}."


def test_unknown_optimizer_names_are_refused_before_any_work():
  with pytest.raises(ValueError, match="Unknown optimizer.schedule 'linear'; allowed: constant"):
    config_lib.validate(small_config(**{"optimizer.schedule": "linear"}))
  with pytest.raises(ValueError, match="Unknown optimizer.name 'lamb'; allowed: adam, sgd"):
    config_lib.validate(small_config(**{"optimizer.name": "lamb"}))
  with pytest.raises(ValueError, match=r"optimizer.decay_steps=\(100, -1\) is not allowed"):
    config_lib.validate(small_config(**{"optimizer.decay_steps": (100, -1)}))


def test_sampler_epoch_reaches_the_sampler_and_the_epoch_length():
  every = training.build(small_config())
  one = training.build(small_config(**{"data.epoch": "one_group_per_class", "num_epochs": 3}))
  assert (every.sampler.epoch_mode, one.sampler.epoch_mode) == ("every_example",
                                                                 "one_group_per_class")
  num_classes = len(np.unique(one.splits["train"].labels))
  per_batch = one.config.batch_size // one.config.data.group_size
  assert one.sampler.steps_per_epoch == -(-num_classes // per_batch)
  assert one.num_train_steps == 3 * one.sampler.steps_per_epoch
  padded = training.build(small_config(**{"data.epoch": "pad_to_largest", "num_epochs": 2}))
  labels = padded.splits["train"].labels
  size = -(-np.bincount(labels).max() // padded.config.data.group_size) \
      * padded.config.data.group_size
  assert padded.sampler.epoch_mode == "pad_to_largest"
  assert padded.sampler.steps_per_epoch == -(-num_classes * size // padded.config.batch_size)
  assert padded.num_train_steps == 2 * padded.sampler.steps_per_epoch


def test_skip_with_pad_to_largest_is_refused_before_any_work():
  with pytest.raises(ValueError, match=r"^data.small_class='skip' drops the classes that "
                     r"data.epoch='pad_to_largest' pads; use 'all' or 'replace'.$"):
    config_lib.validate(small_config(**{"data.epoch": "pad_to_largest",
                                        "data.small_class": "skip"}))


@pytest.mark.parametrize("key,value", [("decay_epochs", ("abc",)), ("decay_steps", (10, None))])
def test_decay_points_that_are_not_numbers_are_one_line(key, value):
  """``--config.optimizer.decay_epochs=abc`` arrives as ``('abc',)``: a one-line ValueError,
  not a TypeError traceback from comparing a string with 0."""
  with pytest.raises(ValueError, match=rf"^optimizer.{key}=.* is not allowed: .*numbers >= 0"):
    config_lib.validate(small_config(**{f"optimizer.{key}": value}))


def test_label_noise_and_clean_topline_change_only_the_train_split():
  clean = training.build(small_config())
  noisy = training.build(small_config(**{"data.label_noise": 0.4, "data.noise_seed": 3}))
  tr_clean, tr_noisy = clean.splits["train"], noisy.splits["train"]
  np.testing.assert_array_equal(tr_noisy.label_sets["clean"], tr_clean.labels)
  flipped = np.mean(tr_noisy.labels != tr_clean.labels)
  assert 0.3 < flipped < 0.5          # p = 0.4 over K = 2 classes: every flip changes the label
  np.testing.assert_array_equal(noisy.splits["test"].labels, clean.splits["test"].labels)
  again = training.build(small_config(**{"data.label_noise": 0.4, "data.noise_seed": 3}))
  np.testing.assert_array_equal(again.splits["train"].labels, tr_noisy.labels)

  top = training.build(small_config(**{"data.clean_fraction": 0.6}))
  n = len(tr_clean.labels)
  assert len(top.splits["train"].labels) == round(0.6 * n)
  with pytest.raises(ValueError, match="clean topline is a separate run"):
    config_lib.validate(small_config(**{"data.label_noise": 0.2,
                                             "data.clean_fraction": 0.8}))


def test_noisy_labels_are_recorded_in_the_workdir(tmp_path):
  config = small_config(**{"data.label_noise": 0.4, "data.noise_seed": 3})
  train = training.build(config).splits["train"]
  summary = workdir_lib.write_train_labels(train, config.data, str(tmp_path))
  saved = np.load(tmp_path / workdir_lib.TRAIN_LABELS_FILE)
  np.testing.assert_array_equal(saved["labels"], train.labels)
  np.testing.assert_array_equal(saved["clean"], train.label_sets["clean"])
  with open(tmp_path / "train_labels.json") as f:
    assert json.load(f) == summary
  assert summary["flipped_fraction"] == pytest.approx(np.mean(saved["labels"] != saved["clean"]))
  assert (summary["label_noise"], summary["noise_seed"]) == (0.4, 3)
  assert workdir_lib.write_train_labels(train, small_config().data, str(tmp_path / "clean")) == {}


def _one_step_change(config):
  setup = training.build(config)
  step = training.make_train_step(setup)
  idx = setup.sampler.batch_indices(0)
  train = setup.splits["train"]
  new, _ = step(setup.init_state, train.images[idx], train.labels[idx], training.step_key(0, 1))
  return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(jax.tree.leaves(new["params"]),
                             jax.tree.leaves(setup.init_state["params"])))


def test_per_part_learning_rates_reach_the_model():
  # The small CNN is all 'backbone' (models.param_labels); Adam's first step is ~lr per weight.
  assert _one_step_change(small_config()) > 1e-4
  assert _one_step_change(small_config(**{"optimizer.backbone_learning_rate": 1e-9})) < 1e-8


def test_model_options_and_pretrained_errors():
  assert config_lib.model_options(small_config().model) == {}
  assert config_lib.model_options(small_config(**{"model.conv_impl": "lax_aligned"}).model) == {
      "conv_impl": "lax_aligned"}
  with pytest.raises(ValueError, match="dtype"):
    training.build(small_config(**{"model.dtype": "bfloat16"}))
  with pytest.raises(FileNotFoundError, match="pretrained convert"):
    config_lib.validate(small_config(**{"model.pretrained": "missing.npz"}))


@pytest.mark.parametrize("key,value,message", [
    ("eval.ks", (1, 0), r"^eval.ks=\(1, 0\) \(protocol 'test'\): ks must be positive integers, "
     r"got 0 in \(1, 0\).$"),
    ("eval.ks", (1, 100_000), r"^eval.ks=\(1, 100000\) \(protocol 'test'\): Recall@100000 asks "
     r"for more neighbours than the \d+ gallery items available \(self excluded\)"),
    ("eval.similarity", "cosine2", r"^eval.similarity: Unknown similarity kind 'cosine2'; "
     r"allowed: cosine, dot, neg_sq_euclidean.$"),
    ("eval.batch_size", 0, r"^eval.batch_size must be an int >= 1, got 0.$"),
    ("eval.kmeans_n_init", 0, r"^eval.kmeans_n_init must be an int >= 1, got 0.$"),
    ("eval.rho_skip", -1, r"^eval.rho_skip must be an int >= 0, got -1.$"),
    ("eval.retrieval_grid", -1, r"^eval.retrieval_grid must be an int >= 0, got -1.$"),
    ("eval.overcluster", -2, r"^eval.overcluster must be a number >= 0, got -2.$"),
])
def test_bad_eval_values_are_refused_with_the_data_before_any_step(key, value, message):
  # the data are loaded before the model is built: a K the gallery cannot give is found there,
  # not by the evaluation after training
  with pytest.raises(ValueError, match=message):
    restore.load_splits(small_config(**{key: value}))


def test_a_rho_skip_beyond_the_singular_values_is_refused_before_any_step():
  config = small_config(**{"eval.metrics": ("retrieval", "spectral_decay"), "eval.rho_skip": 0})
  dim = config.model.embedding_dim
  restore.load_splits(small_config(**{"eval.metrics": ("spectral_decay",),
                                      "eval.rho_skip": dim - 1}))
  with pytest.raises(ValueError, match=rf"^eval.rho_skip={dim}: protocol 'test' has "
                     rf"min\(N, D\) = {dim} singular values \(N = \d+ images, D = "
                     rf"model.embedding_dim = {dim}\); use 0 to {dim - 1}.$"):
    restore.load_splits(small_config(**{"eval.metrics": ("spectral_decay",),
                                        "eval.rho_skip": dim}))
  restore.load_splits(config)


def test_a_retrieval_grid_top_k_the_gallery_cannot_give_is_refused_before_any_step():
  for k in (0, 100_000):
    with pytest.raises(ValueError, match=rf"^eval.retrieval_grid_k={k}: the gallery of protocol "
                       r"'test' has \d+ images; ask for a top 1 to \d+.$"):
      restore.load_splits(small_config(**{"eval.retrieval_grid": 2,
                                          "eval.retrieval_grid_k": k}))


def test_the_train_split_can_be_trained_by_another_label_set():
  # the digits' train split is labelled by parity; 'digit' trains on the digits 0-5 themselves
  by_parity = restore.load_splits(small_config())["train"]
  by_digit = restore.load_splits(small_config(**{"data.train_label_set": "digit"}))["train"]
  assert by_parity.num_classes == 2 and by_digit.num_classes == 6
  np.testing.assert_array_equal(by_digit.labels, by_parity.label_sets["digit"])
  with pytest.raises(ValueError, match=r"^config.data.train_label_set='letter' is not a label "
                     r"set of 'digits_evenodd:train'; it has: digit, parity.$"):
    restore.load_splits(small_config(**{"data.train_label_set": "letter"}))


def test_older_workdir_config_gets_keys_added_since(tmp_path):
  config = small_config()
  del config.data["noise_seed"]
  del config.optimizer["head_learning_rate"]
  del config.model["conv_impl"]
  workdir_lib.write_config(config, str(tmp_path))
  loaded = workdir_lib.load_config(str(tmp_path))
  assert loaded.data.noise_seed == 0 and loaded.optimizer.head_learning_rate == 0.0
  assert loaded.model.conv_impl == "auto"
  config_lib.validate(loaded)
  # NMI of a run evaluated before the JAX k-means: scikit-learn's, as train.py printed it
  del config.eval["kmeans"]
  workdir_lib.write_config(config, str(tmp_path))
  assert workdir_lib.load_config(str(tmp_path)).eval.kmeans == "sklearn"


# The schema keys a workdir's config.json has always had; every key added since is in
# workdir.ADDED_CONFIG_KEYS with the value that reproduces the older runs.
ORIGINAL_KEYS = {
    "batch_size", "checkpoint_every_steps", "data.clean_fraction", "data.group_size",
    "data.image_size", "data.label_noise", "data.name", "data.small_class", "eval.batch_size",
    "eval.ks", "eval.overcluster", "eval.plot", "eval.similarity", "eval.splits",
    "eval_every_steps", "log_every_steps", "max_checkpoints_to_keep", "model.embedding_dim",
    "model.freeze_bn", "model.name", "model.normalize", "model.pretrained", "num_train_steps",
    "optimizer.decay_factor", "optimizer.decay_steps", "optimizer.learning_rate",
    "optimizer.momentum", "optimizer.name", "optimizer.objective_learning_rate",
    "optimizer.schedule", "optimizer.warmup_steps", "optimizer.weight_decay", "seed"}


def test_every_key_added_to_the_schema_has_its_older_value():
  from configs import default  # pylint: disable=import-outside-toplevel
  keys = {k for k in config_lib.flatten(default.get_config())
          if not k.startswith(("loss.", "data.options."))}
  missing = sorted(keys - ORIGINAL_KEYS - set(workdir_lib.ADDED_CONFIG_KEYS))
  assert not missing, (f"{missing}: add them to workdir.ADDED_CONFIG_KEYS with the value that "
                       "reproduces runs recorded before them")


@pytest.mark.parametrize("name,mode", [("adam", "decoupled"), ("sgd", "coupled"),
                                       ("rmsprop", "coupled")])
def test_workdir_before_weight_decay_mode_keeps_its_optimizers_decay(tmp_path, name, mode):
  # before the key, adam's weight decay was AdamW's and sgd / rmsprop's L2 in the gradient
  config = small_config(**{"optimizer.name": name, "optimizer.weight_decay": 1e-4})
  del config.optimizer["weight_decay_mode"]
  workdir_lib.write_config(config, str(tmp_path))
  loaded = workdir_lib.load_config(str(tmp_path))
  assert loaded.optimizer.weight_decay_mode == mode
  config_lib.validate(loaded)   # evaluates and resumes


def test_workdir_of_the_first_schema_resumes_with_todays_config(tmp_path):
  # the first config.json files lacked the backbone options and the metric choices
  config = small_config()
  for key in ("bn_mode", "dtype", "embedding_hidden", "pooling"):
    del config.model[key]
  for key in ("metrics", "rho_skip", "kmeans_n_init"):
    del config.eval[key]
  workdir_lib.write_config(config, str(tmp_path))
  assert workdir_lib.check_rerun(small_config(), str(tmp_path)) == []   # resumes unchanged


def test_workdir_before_the_sampler_epoch_and_rgb_input_keys_resumes_as_it_was(tmp_path):
  config = small_config()
  del config.data["epoch"]
  del config.model["rgb_input"]
  workdir_lib.write_config(config, str(tmp_path))
  loaded = workdir_lib.load_config(str(tmp_path))
  assert loaded.data.epoch == "every_example" and loaded.model.rgb_input is True
  assert workdir_lib.check_rerun(small_config(), str(tmp_path)) == []   # resumes unchanged
  # a BN-Inception run of then was fed RGB as it came: it keeps that, and a rerun with
  # today's default is named as a change, never silently fed reversed channels
  bn = small_config(**{"model.name": "bn_inception"})
  del bn.model["rgb_input"]
  workdir_lib.write_config(bn, str(tmp_path / "bn"))
  assert workdir_lib.load_config(str(tmp_path / "bn")).model.rgb_input is False
  with pytest.raises(workdir_lib.WorkdirConflictError, match=r"model.rgb_input False -> True\)"
                     r"\. Use a new --workdir, resume it as trained with "
                     r"--config.model.rgb_input=False, or add --overwrite"):
    workdir_lib.check_rerun(small_config(**{"model.name": "bn_inception"}), str(tmp_path / "bn"))
  with pytest.raises(workdir_lib.WorkdirConflictError,   # the sweep has no --overwrite
                     match=r"with --set=model.rgb_input=False, or delete this run folder"):
    workdir_lib.check_rerun(small_config(**{"model.name": "bn_inception"}), str(tmp_path / "bn"),
                            override_flag="--set=")   # the sweep's flag


def test_scatter_diagram_is_logged_during_training(tmp_path):
  workdir = str(tmp_path)
  training.train_and_evaluate(small_config(10, scatter_every_steps=5), workdir,
                              show_progress=False)
  for step in (5, 10):
    assert os.path.getsize(os.path.join(workdir, f"scatter_test_step_{step}.png")) > 0
  rows = [r for r in read_rows(workdir) if "scatter/correct_fraction" in r]
  assert [r["step"] for r in rows] == [5, 10]
  assert all(0.0 <= r["scatter/correct_fraction"] <= 1.0 for r in rows)


def _optimizer_step(**overrides):
  """One update of w = [1, -2] with gradient [0.5, 0.5] by ``make_optimizer``."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  opt = small_config(**{f"optimizer.{k}": v for k, v in overrides.items()}).optimizer
  tx, _ = optimizers.make_optimizer(opt, num_train_steps=10)
  params = {"model": {"w": jnp.array([1.0, -2.0])}, "objective": {}}
  grads = {"model": {"w": jnp.array([0.5, 0.5])}, "objective": {}}
  updates, _ = tx.update(grads, tx.init(params), params)
  return np.asarray(updates["model"]["w"])


def test_weight_decay_coupled_is_l2_in_the_gradient_and_decoupled_is_adamw():
  lr, wd = 1e-3, 0.1
  w, g = np.array([1.0, -2.0]), np.array([0.5, 0.5])

  def adam_first_step(grad):   # bias-corrected first Adam step: -lr * g / (|g| + eps)
    return -lr * grad / (np.abs(grad) + 1e-8)

  coupled = _optimizer_step(learning_rate=lr, weight_decay=wd, weight_decay_mode="coupled")
  np.testing.assert_allclose(coupled, adam_first_step(g + wd * w), rtol=1e-5)
  decoupled = _optimizer_step(learning_rate=lr, weight_decay=wd, weight_decay_mode="decoupled")
  np.testing.assert_allclose(decoupled, adam_first_step(g) - lr * wd * w, rtol=1e-5)
  sgd = _optimizer_step(name="sgd", momentum=0.0, learning_rate=lr, weight_decay=wd,
                        weight_decay_mode="coupled")
  np.testing.assert_allclose(sgd, -lr * (g + wd * w), rtol=1e-6)
  with pytest.raises(ValueError, match="'decoupled' is AdamW"):
    _optimizer_step(name="sgd", weight_decay=wd, weight_decay_mode="decoupled")
  with pytest.raises(ValueError, match="weight_decay_mode 'l2'; allowed: coupled, decoupled"):
    _optimizer_step(weight_decay_mode="l2")


def test_clean_topline_on_many_two_image_classes_drops_the_emptied_ones(caplog):
  """SOP-like: 300 classes of 2 images; a 0.4 subset empties many classes."""
  labels = np.repeat(np.arange(300), 2)
  train = data_lib.Split(images=np.zeros((600, 8, 8, 1), np.float32), labels=labels,
                         label_sets={}, name="sop-like")
  with caplog.at_level("WARNING"):
    top = noise_lib.prepare_train_split(train, label_noise=0.0, clean_fraction=0.4, seed=0)
  kept = np.unique(top.labels)
  assert len(top.labels) == 240 and 100 < len(kept) < 300
  assert any(f"{300 - len(kept)} of 300 training classes" in r.getMessage()
             for r in caplog.records)


def test_augmentation_on_the_in_memory_digits_is_refused_not_ignored():
  """The 8x8 digits are not read through the image pipeline, so data.augmentation would be
  ignored silently: a run the user believes augmented is not."""
  with pytest.raises(ValueError, match=r"^config.data.augmentation='pad_crop': the in-memory "
                                       r"dataset 'digits_evenodd' is not augmented"):
    training.build(small_config(**{"data.augmentation": "pad_crop"}))
  # a run recorded with it before the check still validates, so eval.py evaluates it
  config_lib.validate(small_config(**{"data.augmentation": "pad_crop"}))


def test_a_user_objective_without_a_scalar_loss_is_one_line_before_the_workdir(tmp_path):
  """An objective of the user's own whose ``apply`` forgot to reduce its per-anchor terms is
  refused when the run is built, naming it and the loss's shape, with nothing written."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from dml_jax import objectives  # pylint: disable=import-outside-toplevel
  from dml_jax.objectives import _registry  # pylint: disable=import-outside-toplevel

  def per_anchor(*, scale: float = 1.0):
    apply = lambda params, e, y, *, rng=None: (scale * jnp.sum(e * e, axis=1), {})
    return objectives.no_params, apply

  objectives.register("per_anchor_loss", per_anchor)
  try:
    config = small_config(num_train_steps=2)
    config.loss = {"name": "per_anchor_loss", "scale": 1.0}
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=r"objective 'per_anchor_loss' returns a loss of shape "
                       r"\(32,\); apply must return a scalar loss"):
      training.train_and_evaluate(config, str(workdir), show_progress=False)
    assert not workdir.exists()
  finally:
    _registry.REGISTRY.pop("per_anchor_loss", None)
    _registry.SUPPORT.pop("per_anchor_loss", None)


def test_a_relative_data_folder_is_recorded_absolute_and_evaluated_from_anywhere(
    tmp_path, monkeypatch):
  """``--config.data.options.root=imgs`` (a folder relative to where train.py runs): the
  workdir's config.json records it absolute, so eval.py run from another directory reads the
  same images; a workdir that recorded it relative resumes from that directory."""
  from configs import digits_image_folder  # pylint: disable=import-outside-toplevel
  from dml_jax.data import digits  # pylint: disable=import-outside-toplevel
  monkeypatch.chdir(tmp_path)
  digits.write_digit_images("imgs", size=32)
  config = digits_image_folder.get_config("smoke")
  config.data.options.root = "imgs"
  config.num_train_steps = 1
  results = training.train_and_evaluate(config, "run", show_progress=False)
  recorded = workdir_lib.read_config_json("run")
  assert recorded["data"]["options"]["root"] == str(tmp_path / "imgs")
  (tmp_path / "elsewhere").mkdir()
  monkeypatch.chdir(tmp_path / "elsewhere")
  _, again = eval_checkpoints.evaluate_checkpoint(str(tmp_path / "run"))
  assert again["test"]["recall@1"] == results["test"]["recall@1"]
  # an earlier version's config.json with the relative folder: the same rerun resumes
  monkeypatch.chdir(tmp_path)
  recorded["data"]["options"]["root"] = "imgs"
  with open(os.path.join("run", "config.json"), "w") as f:
    json.dump(recorded, f)
  assert workdir_lib.check_rerun(config, "run") == []
  # the images moved (a workdir copied to another machine): eval.py --data_root names them
  os.rename("imgs", "moved")
  with pytest.raises(FileNotFoundError, match="imgs"):
    eval_checkpoints.evaluate_checkpoint(str(tmp_path / "run"))
  _, moved = eval_checkpoints.evaluate_checkpoint(
      str(tmp_path / "run"), machine={"data.options.root": str(tmp_path / "moved")})
  assert moved["test"]["recall@1"] == results["test"]["recall@1"]
  from dml_jax.analysis import scatter  # pylint: disable=import-outside-toplevel
  assert scatter.main([f"--workdir={tmp_path / 'run'}", "--data_root=moved"]) == 0
  with pytest.raises(ValueError, match=r"reads no data.options.data_dir \(its options: .*root"):
    eval_checkpoints.load_config(str(tmp_path / "run"), {"data.options.data_dir": "/tfds"})


@pytest.mark.parametrize("returns, says", [
    (lambda loss: loss, r"returns an array of shape \(\); apply must return a pair \(loss, aux\)"),
    (lambda loss: (loss,), r"returns a tuple of 1; apply must return a pair"),
    (lambda loss: (loss, {}, {}), r"returns a tuple of 3; apply must return a pair"),
    (lambda loss: (loss, [loss]), r"returns a tuple of 2 whose aux is a list; apply must"),
])
def test_a_user_objective_that_returns_no_loss_aux_pair_is_one_line(returns, says):
  """An objective of the user's own whose ``apply`` returns the loss alone (or another
  structure than ``(loss, aux dict)``) is refused when the run is built, in one line, not by
  a ``TypeError`` from unpacking it."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from dml_jax import objectives  # pylint: disable=import-outside-toplevel
  from dml_jax.objectives import _registry  # pylint: disable=import-outside-toplevel

  def no_aux(*, scale: float = 1.0):
    apply = lambda params, e, y, *, rng=None: returns(scale * jnp.mean(e * e))
    return objectives.no_params, apply

  objectives.register("no_aux_loss", no_aux)
  try:
    config = small_config(num_train_steps=2)
    config.loss = {"name": "no_aux_loss", "scale": 1.0}
    with pytest.raises(ValueError, match=r"objective 'no_aux_loss' " + says):
      training.build(config)
  finally:
    _registry.REGISTRY.pop("no_aux_loss", None)
    _registry.SUPPORT.pop("no_aux_loss", None)
