"""The reproductions on real data (README "Reproductions on real data"): the MNIST even/odd
and Omniglot CPU configs, their batch composition against the real class counts of every
paper config's dataset, and 2-step training runs on the real files of ../shared/data."""

import functools
import importlib
import json
import os

import numpy as np
import pytest

from dml_jax import data, objectives, training
from official_files import real_data
from test_configs import CONFIGS, SMOKE_ARG

OMNIGLOT_ROWS = ("triplet", "eps_triplet", "ms", "eps_ms", "margin", "eps_margin")

# Training classes of each dataset's protocol, as published (issue 18): the sampler of every
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


def test_the_two_mnist_configs_differ_only_in_the_positive():
  eps, base = config("mnist_evenodd_eps"), config("mnist_evenodd_triplet")
  assert eps.loss.positive == "easy" and base.loss.positive == "random"
  base.loss.positive = "easy"
  assert eps.to_dict() == base.to_dict()


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_batch_fits_the_real_class_count(name):
  """Issue 18: the full-scale batch composition against the dataset's published number of
  training classes (synthetic labels, 10 examples a class)."""
  c = config(name)
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


def run_two_steps(c, workdir):
  """Trains 2 steps on the real files (checkpoint, metrics), evaluation left out."""
  c.eval.splits = ()
  training.train_and_evaluate(c, workdir, show_progress=False)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    losses = [r["train/loss"] for r in map(json.loads, f) if "train/loss" in r]
  assert len(losses) == 2 and np.all(np.isfinite(losses))
  assert training.checkpoint_steps(workdir) == [2]


def omniglot_smoke(row):
  c = config("omniglot_cpu", f"{row},smoke")
  c.num_devices = 1
  c.data.options.root = real_data("omniglot", "images_background.zip", "images_evaluation.zip")
  return c


def test_omniglot_eps_triplet_trains_on_the_real_files(tmp_path):
  run_two_steps(omniglot_smoke("eps_triplet"), str(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("row", OMNIGLOT_ROWS)
def test_every_omniglot_row_trains_on_the_real_files_at_full_batch(row, tmp_path):
  c = omniglot_smoke(row)
  full = config("omniglot_cpu", row)
  c.batch_size, c.data.group_size = full.batch_size, full.data.group_size
  run_two_steps(c, str(tmp_path))


@pytest.mark.slow
def test_mnist_evenodd_trains_on_the_real_files(tmp_path):
  c = config("mnist_evenodd_triplet", "smoke")
  c.num_devices = 1
  c.data.options.root = real_data("mnist", "train-images-idx3-ubyte.gz",
                                  "t10k-labels-idx1-ubyte.gz")
  run_two_steps(c, str(tmp_path))
