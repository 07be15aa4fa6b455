"""The reproductions on real data (docs/reproductions.md "Reproductions on real data"): the
MNIST even/odd and Omniglot CPU configs, the batch composition of every config against the
real class count of its dataset, and 2-step training runs on the real files in
``$DML_JAX_TEST_DATA`` (skipped without it; ``slow``: they compile a training step per
objective)."""

import functools
import importlib
import json
import os

import numpy as np
import pytest

from dml_jax import data, objectives
from dml_jax.run import training
from dml_jax.run import eval_checkpoints
from official_files import real_data
from test_configs import EXPERIMENTS, load

OMNIGLOT_ROWS = ("triplet", "eps_triplet", "ms", "eps_ms", "margin", "eps_margin")

# Training classes of each dataset's protocol, as published: the sampler of every
# paper config must fit them at its full batch composition.
TRAIN_CLASSES = {"cub": 100, "cars196": 98, "sop": 11_318, "inshop": 3_997, "omniglot": 30,
                 "flowers102": 51, "mnist_evenodd": 2, "mnist": 8, "digits_evenodd": 2}


def config(name, arg=""):
  return importlib.import_module(f"configs.{name}").get_config(arg)


@functools.lru_cache(maxsize=None)
def real_omniglot():
  return dict(data.load("omniglot", root=real_data("omniglot", "images_background.zip",
                                                   "images_evaluation.zip"),
                        image_size=28, resize_size=28, channels=1, mean=(0.0,), std=(1.0,)))


def test_omniglot_rows_differ_only_in_the_positive():
  for loss in ("triplet", "ms", "margin"):
    base, eps = config("omniglot_cpu", loss), config("omniglot_cpu", f"eps_{loss}")
    assert eps.loss.positive == "easy" and base.loss.positive != "easy"
    base.loss.positive = "easy"
    assert base.to_dict() == eps.to_dict()
    assert objectives.make(**eps.loss.to_dict()).name == eps.loss.name
  assert config("omniglot_cpu").loss.to_dict() == config("omniglot_cpu", "eps_triplet").loss.to_dict()
  with pytest.raises(ValueError, match="allowed: triplet, eps_triplet"):
    config("omniglot_cpu", "npair")


def test_omniglot_ephn_rows_differ_only_in_the_mining():
  """EPHN Fig. 4's strategies: the NCA loss at T 0.1 with each (positive, negative); EPHN is
  the 1st-order row of the 2nd-order paper's Fig. 4 config; Table 1's other rows change only
  the objective."""
  ephn = config("omniglot_ephn")
  assert ephn.to_dict() == config("omniglot_ephn", "ephn").to_dict()
  assert ephn.loss.to_dict() == config("omniglot_ephn_2nd", "ephn").loss.to_dict()
  pairs = set()
  for row in ("ep", "ephn", "epshn", "hp", "hphn", "ba"):
    c = config("omniglot_ephn", row)
    pairs.add((c.loss.positive, c.loss.negative))
    c.loss.positive, c.loss.negative = "easy", "hard"
    assert c.to_dict() == ephn.to_dict(), row
  assert len(pairs) == 6
  for row, name in (("triplet", "triplet"), ("proxy_nca", "proxy_nca")):   # Table 1's others
    c = config("omniglot_ephn", row)
    assert c.loss.name == name and c.data.to_dict() == ephn.data.to_dict()
    assert c.model.to_dict() == ephn.model.to_dict()
  assert config("omniglot_ephn", "proxy_nca").optimizer.objective_learning_rate > 0
  with pytest.raises(ValueError, match="allowed: ep, ephn"):
    config("omniglot_ephn", "npair")


def test_omniglot_label_noise_rows_are_the_papers_losses_on_the_letter_recipe():
  """The label-noise paper's three losses (as configs/label_noise.py) on the DRO tables'
  Omniglot letter recipe with the paper's batch of 12 classes x 5 and 128-D; the rows differ
  only in the loss."""
  base = config("omniglot_label_noise")
  assert base.to_dict() == config("omniglot_label_noise", "triplet_random_semihard").to_dict()
  assert (base.batch_size, base.data.group_size, base.model.embedding_dim) == (60, 5, 128)
  assert base.data.train_label_set == config("omniglot_dro").data.train_label_set == "character"
  for row in ("triplet_random_semihard", "triplet_fixed_semihard", "margin"):
    c = config("omniglot_label_noise", row)
    assert c.loss.to_dict() == config("label_noise", f"cub,{row}").loss.to_dict(), row
    c.loss = base.loss
    assert c.to_dict() == base.to_dict(), row
  assert config("omniglot_label_noise", "triplet_fixed_semihard").loss.negative == "semihard"
  with pytest.raises(ValueError, match="allowed: triplet_random_semihard"):
    config("omniglot_label_noise", "triplet")


def test_the_two_mnist_configs_differ_only_in_the_positive():
  eps, base = config("mnist_evenodd_eps"), config("mnist_evenodd_triplet")
  assert eps.loss.positive == "easy" and base.loss.positive == "random"
  base.loss.positive = "easy"
  assert eps.to_dict() == base.to_dict()


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_config_batch_fits_the_real_class_count(name):
  """The full-scale batch composition against the dataset's published number of
  training classes (synthetic labels, 10 examples a class)."""
  c = load(name)
  if c.data.name not in TRAIN_CLASSES:
    pytest.skip(f"{c.data.name}: no published class count (own data)")
  num_classes = TRAIN_CLASSES[c.data.name]
  labels = np.repeat(np.arange(num_classes), max(10, c.data.group_size))
  sampler = data.NPerClassSampler(labels, batch_size=c.batch_size,
                                  group_size=c.data.group_size, seed=0,
                                  small_class=c.data.small_class)
  if num_classes <= 1000:   # an SOP / In-Shop epoch table takes seconds to build
    batch = labels[sampler.batch_indices(0)]
    assert len(batch) == c.batch_size
    assert len(np.unique(batch)) >= c.batch_size // c.data.group_size


def test_omniglot_batches_on_the_real_alphabets():
  """Every row's sampler on the 30 real background alphabets: 20 alphabets x 8 drawings."""
  train = real_omniglot()["train"]
  assert len(np.unique(train.labels)) == 30
  compositions = {(c.batch_size, c.data.group_size, c.data.small_class)
                  for c in [config("omniglot_cpu", row) for row in OMNIGLOT_ROWS]
                  + [config("omniglot_eps_triplet")]}
  assert len(compositions) == 1
  batch_size, group_size, small_class = compositions.pop()
  sampler = data.NPerClassSampler(train.labels, batch_size=batch_size, group_size=group_size,
                                  seed=0, small_class=small_class)
  for step in (0, sampler.steps_per_epoch - 1):
    _, counts = np.unique(train.labels[sampler.batch_indices(step)], return_counts=True)
    assert (len(counts), set(counts)) == (20, {8}), step


@pytest.mark.slow
def test_omniglot_cpu_config_trains_on_the_real_files(tmp_path):
  """train.py's path on the real zips: 2 steps, a checkpoint, finite losses."""
  c = config("omniglot_cpu", "smoke")
  c.num_devices = 1
  c.data.options.root = real_data("omniglot", "images_background.zip", "images_evaluation.zip")
  c.eval.splits = ()     # the 13,180 test drawings would dominate the test's time
  training.train_and_evaluate(c, str(tmp_path), show_progress=False)
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    losses = [r["train/loss"] for r in map(json.loads, f) if "train/loss" in r]
  assert len(losses) == 2 and np.all(np.isfinite(losses))
  assert eval_checkpoints.checkpoint_steps(str(tmp_path)) == [2]


@pytest.mark.long
def test_every_omniglot_row_trains_on_the_real_files_at_full_batch():
  """The six rows' objectives, each 2 steps at the full batch (20 alphabets x 8) of real
  drawings; one read of the files and one model initialisation shared by all rows."""
  splits = real_omniglot()
  for row in OMNIGLOT_ROWS:
    c = config("omniglot_cpu", row)
    c.num_devices = 1
    for labels, metrics in two_train_steps(c, splits):
      assert len(np.unique(labels)) == 20
      assert np.isfinite(float(metrics["loss"])) and float(metrics["finite"]) == 1.0, row


def two_train_steps(c, splits):
  """Builds ``c`` on ``splits`` (instead of its dataset) and runs two train steps on the
  sampler's batches; yields ``(batch labels [B], metrics)`` per step."""
  from unittest import mock  # pylint: disable=import-outside-toplevel
  with mock.patch.object(training.data_lib, "load", lambda name, **kwargs: dict(splits)):
    setup = training.build(c)
  train_step = training.make_train_step(setup)
  state, train = setup.init_state, setup.splits["train"]
  for step in range(2):
    idx = setup.sampler.batch_indices(step)
    state, metrics = train_step(state, train.images[idx], train.labels[idx],
                                training.step_key(c.seed, step))
    yield train.labels[idx], metrics


def class_structure_splits(name: str, num_classes: int, per_class: int, *, size: int,
                           channels: int, seed: int = 0) -> dict:
  """A train split with the class structure of a dataset's training set (its published number
  of classes, ``per_class`` random images each) at ``size`` px: what a paper config's sampler
  and objective see, without the images."""
  rng = np.random.default_rng(seed)
  labels = np.repeat(np.arange(num_classes), per_class)
  images = rng.normal(size=(len(labels), size, size, channels)).astype(np.float32)
  return {"train": data.Split(images=images, labels=labels, name=f"{name}:train")}


FULL_BATCH_EXPERIMENTS = [s for s in EXPERIMENTS if load(s).data.name in TRAIN_CLASSES
                          and load(s).data.name != "digits_evenodd"]


@pytest.mark.long
@pytest.mark.parametrize("spec", FULL_BATCH_EXPERIMENTS)
def test_every_experiment_trains_two_steps_at_its_full_batch_composition(spec):
  """Each paper experiment's own batch (size, classes x group size, small-class
  rule), sampler and objective (every hyper-parameter, K included) for two train steps on
  data of its dataset's class structure; only the backbone (the small CNN) and the image size
  (16 px) are shrunk."""
  c = load(spec)
  num_classes = TRAIN_CLASSES[c.data.name]
  per_class = max(c.data.group_size, 2)
  splits = class_structure_splits(c.data.name, num_classes, per_class, size=16,
                                  channels=c.data.channels)
  c.num_devices = 1
  c.model.name, c.model.pretrained, c.model.bn_mode = "small_cnn", "", "train"
  c.model.pooling, c.model.embedding_hidden, c.model.freeze_bn = "", (), False
  c.model.dtype = "float32"   # the small CNN computes in float32 only
  c.data.image_size = 16
  c.eval.splits = ("train",)
  for labels, metrics in two_train_steps(c, splits):
    _, counts = np.unique(labels, return_counts=True)
    assert len(labels) == c.batch_size
    assert len(counts) == c.batch_size // c.data.group_size and set(counts) == {c.data.group_size}
    assert np.isfinite(float(metrics["loss"])) and float(metrics["finite"]) == 1.0, spec
