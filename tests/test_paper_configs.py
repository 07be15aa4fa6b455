"""Every paper config runs end to end with its ``smoke`` option on mock data: the real dataset
loader (TFDS under ``tfds.testing.mock_data``, In-Shop on generated files), the sampler, the
augmentation pipeline, two train steps, a checkpoint and an evaluation. A variant that differs
from an earlier variant of its file in the loss alone applies its objective to a batch of its
composition instead (its end-to-end run is ``long``)."""

import importlib
import json
import os

import jax
import numpy as np
import pytest

from dml_jax import data
from dml_jax import objectives
from dml_jax.run import training
from dml_jax import optimizers
from dml_jax.run import config as config_lib
from dml_jax.run import eval_checkpoints
from fake_datasets import fill_image_list_options, write_inshop_dataset
from test_configs import EXPERIMENTS, load
from tfds_mock import mock_tfds


def paper_config(spec, *extra):
  """``spec`` = 'name[:variant]' (see test_configs.load)."""
  return load(spec, *extra)


IMAGE_CONFIGS = [s for s in EXPERIMENTS
                 if paper_config(s, "smoke").data.name in data.IMAGE_DATASETS]


def test_every_paper_config_of_the_issue_exists():
  expected = {"cub_ephn_2nd", "cub_ephn", "cub_epshn", "cars_ephn_2nd", "sop_ephn_2nd",
              "inshop_ephn_2nd", "cars_eps_margin", "cub_eps_ms", "cub_eps_triplet",
              "omniglot_eps_triplet", "mnist_evenodd_eps", "cub_dro_topk", "cars_dro_kl",
              "inshop_dro_topk_pn", "label_noise:cub,triplet_random_semihard",
              "label_noise:cub,triplet_fixed_semihard", "label_noise:cub,margin"}
  assert expected <= set(IMAGE_CONFIGS)
  assert {f"label_noise:{d},margin" for d in ("sop", "flowers")} <= set(IMAGE_CONFIGS)


def test_paper_settings_reach_the_config():
  c = paper_config("cub_ephn_2nd")
  assert (c.data.name, c.model.name, c.model.embedding_dim) == ("cub", "resnet50", 512)
  assert (c.batch_size, c.data.group_size, c.num_epochs) == (128, 8, 40)
  assert (c.optimizer.name, c.optimizer.learning_rate) == ("sgd", 0.0025)
  assert tuple(c.optimizer.decay_epochs) == (20, 30)
  assert (c.loss.name, c.loss.positive, c.loss.negative) == ("nca_2nd", "easy", "hard")
  assert c.model.pretrained == "weights/resnet50.npz"
  assert paper_config("inshop_dro_topk_pn").eval.splits == ("query@gallery",)
  assert paper_config("omniglot_eps_triplet").data.image_size == 80


def test_training_a_paper_config_needs_the_converted_weights(tmp_path):
  c = paper_config("cub_ephn_2nd")
  c.model.pretrained = str(tmp_path / "missing.npz")
  with pytest.raises(FileNotFoundError, match="pretrained convert --arch resnet50"):
    config_lib.validate(c)


def test_num_epochs_and_decay_epochs_use_the_sampler_epoch():
  c = paper_config("cub_ephn_2nd")
  assert training.resolve_num_train_steps(c, steps_per_epoch=46) == 40 * 46
  _, schedule = optimizers.make_optimizer(c.optimizer, num_train_steps=40 * 46,
                                        steps_per_epoch=46)
  np.testing.assert_allclose([schedule(0), schedule(20 * 46 - 1), schedule(20 * 46),
                              schedule(30 * 46)], [0.0025, 0.0025, 0.00025, 0.000025],
                             rtol=1e-6)


def loss_only_variants(specs) -> dict[str, str]:
  """``{spec: earlier}``: each spec whose smoke config equals that of an earlier spec of the
  same config file except in ``loss`` (e.g. ``omniglot_dro:lifted`` and ``omniglot_dro:ms``)."""
  first, out = {}, {}
  for spec in specs:
    c = paper_config(spec, "smoke").to_dict()
    del c["loss"]
    key = (spec.partition(":")[0], json.dumps(c, sort_keys=True, default=str))
    if key in first:
      out[spec] = first[key]
    else:
      first[key] = spec
  return out


LOSS_ONLY = loss_only_variants(IMAGE_CONFIGS)


def smoke_param(spec):
  """The label-noise losses run by default on CUB; on SOP and Flowers (same code, other
  data) they are ``long``, as is every other loss-only variant (``LOSS_ONLY``: its objective
  is applied to a batch of its composition by default)."""
  long = ((spec.startswith("label_noise:") and not spec.startswith("label_noise:cub,"))
          or spec in LOSS_ONLY)
  return pytest.param(spec, marks=[pytest.mark.long] if long else [])


def test_loss_only_variants_are_the_rows_of_a_config_file():
  assert {"omniglot_dro:lifted", "omniglot_ephn:ephn", "label_noise:cub,margin",
          "label_noise:sop,margin"} <= set(LOSS_ONLY)
  assert LOSS_ONLY["omniglot_dro:lifted"] == "omniglot_dro:ms"
  # the first row of each file, and a row that changes more than the loss, run end to end
  assert not {"omniglot_dro:ms", "label_noise:cub,triplet_random_semihard", "label_noise:sop,"
              "triplet_random_semihard", "omniglot_ephn:proxy_nca"} & set(LOSS_ONLY)


@pytest.mark.parametrize("spec", sorted(LOSS_ONLY))
def test_loss_only_variant_objective_on_a_batch_of_its_composition(spec):
  """The variant's objective (every hyper-parameter of its config) and gradient on a batch of
  its smoke config's size, classes x group size and embedding dimension."""
  c = paper_config(spec, "smoke")
  obj = objectives.make(**c.loss.to_dict())
  classes = c.batch_size // c.data.group_size
  labels = np.repeat(np.arange(classes), c.data.group_size)
  emb = np.random.default_rng(0).normal(size=(c.batch_size, c.model.embedding_dim))
  emb = (emb / np.linalg.norm(emb, axis=1, keepdims=True)).astype(np.float32)
  key = jax.random.key(0)
  params = obj.init(key, num_classes=classes, dim=c.model.embedding_dim)
  (loss, _), grad = jax.jit(jax.value_and_grad(
      lambda e: obj.apply(params, e, labels, rng=key), has_aux=True))(emb)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(grad)), spec
  assert float(loss) > 0 and np.abs(grad).max() > 0, spec


@pytest.mark.slow
@pytest.mark.parametrize("name", [smoke_param(s) for s in IMAGE_CONFIGS])
def test_smoke_run_on_mock_data(name, tmp_path):
  c = paper_config(name, "smoke")
  c.num_devices = 1
  if c.data.name == "inshop":
    c.data.options.root = write_inshop_dataset(str(tmp_path / "inshop"), items=8, per_item=4)
  elif name == "digits_image_folder":
    c.data.options.root = str(tmp_path / "digits_png")
    data.digits.write_digit_images(c.data.options.root, size=32)
  elif c.data.name in ("image_list", "image_folder", "hotels"):
    fill_image_list_options(c, str(tmp_path / "images"))
  run_smoke(c, str(tmp_path / "run"))


def run_smoke(c, workdir):
  """Trains 2 steps + evaluates; checks the logs, the checkpoint and the results file."""
  with mock_tfds(num_examples=96):
    results = training.train_and_evaluate(c, workdir, show_progress=False)
  assert len(results) == len(c.eval.splits)
  for metrics in results.values():
    assert 0.0 <= metrics["recall@1"] <= 1.0
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  losses = [r["train/loss"] for r in rows if "train/loss" in r]
  assert len(losses) == 2 and np.all(np.isfinite(losses))
  assert eval_checkpoints.checkpoint_steps(workdir) == [2]
  assert os.path.exists(os.path.join(workdir, "eval_step_2.json"))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["image_folder", "hotels"])
def test_own_images_formats_smoke(fmt, tmp_path):
  c = paper_config("image_list", f"{fmt},smoke")
  c.num_devices = 1
  fill_image_list_options(c, str(tmp_path / "images"))
  run_smoke(c, str(tmp_path / "run"))


def test_own_images_need_a_path():
  c = paper_config("image_list", "smoke")
  with pytest.raises(ValueError, match="needs path: set --config.data.options.path"):
    training.build(c)


@pytest.mark.long
def test_cub_ephn_2nd_recipe_with_converted_resnet50_weights(tmp_path):
  """End to end: torchvision state dict -> convert -> weights/resnet50.npz -> the CUB
  config trains with them (here: a synthetic state dict, mock CUB, 32 px, 2 steps)."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from dml_jax.models import pretrained  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  state_dict = {}
  for key, shape in pretrained.torch_key_table("resnet50").items():
    if key.endswith("running_var"):
      state_dict[key] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    elif key.endswith("num_batches_tracked"):
      state_dict[key] = np.zeros(shape, np.int64)
    else:
      state_dict[key] = (0.05 * rng.standard_normal(shape)).astype(np.float32)
  path = str(tmp_path / "resnet50.npz")
  pretrained.save_weights(pretrained.convert_state_dict(state_dict, "resnet50"), path,
                          arch="resnet50")

  c = paper_config("cub_ephn_2nd", "smoke")
  c.num_devices = 1
  c.model.name, c.model.pretrained = "resnet50", path   # undo the smoke's small CNN
  c.model.embedding_dim = 32
  with mock_tfds(num_examples=96):
    setup = training.build(c)
  flat = {"/".join(map(str, k)): v
          for k, v in nnx.to_flat_state(setup.init_state["params"])}
  np.testing.assert_array_equal(np.asarray(flat["backbone/conv1/kernel"][...]),
                                state_dict["conv1.weight"].transpose(2, 3, 1, 0))
  run_smoke(c, str(tmp_path / "run"))


def parse_config_flags(path, *overrides):
  """``train.py``'s ``--config`` flag (a locked config file) parsed from a command line."""
  from absl import flags as absl_flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  argv = ["train.py", f"--config={path}", *overrides]
  flag_values = absl_flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "config", flag_values=flag_values,
                                  lock_config=True, sys_argv=argv)
  flag_values(argv)
  return flag_values.config


OFFICIAL_FILE_CONFIGS = [
    n for n in EXPERIMENTS
    if paper_config(n).data.name in importlib.import_module("configs.recipes").OFFICIAL_FILES]


def test_every_benchmark_config_has_the_official_files_root():
  assert {"mnist_evenodd_eps", "omniglot_eps_triplet", "cub_eps_triplet",
          "cars_eps_margin", "sop_ephn_2nd",
          "label_noise:flowers,margin"} <= set(OFFICIAL_FILE_CONFIGS)
  for name in OFFICIAL_FILE_CONFIGS:
    assert paper_config(name).data.options.root == "", name


@pytest.mark.parametrize("name", OFFICIAL_FILE_CONFIGS)
def test_root_is_settable_from_the_command_line(name):
  from dml_test_support import ROOT  # pylint: disable=import-outside-toplevel
  file, _, variant = name.partition(":")
  path = os.path.join(ROOT, "configs", f"{file}.py") + (f":{variant}" if variant else "")
  c = parse_config_flags(path, "--config.data.options.root=/data/official")
  assert c.data.options.root == "/data/official"
