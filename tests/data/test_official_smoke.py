"""One end-to-end run per reader of the official files: the dataset's paper config (smoke
variant) with ``data.options.root`` pointing at small generated files in the official layout
trains 2 steps, checkpoints and evaluates, with no TFDS involved."""

import json
import os

import numpy as np
import pytest

from dml_jax.run import training
from dml_jax.run import eval_checkpoints
from official_files import (write_cars, write_cub, write_flowers, write_mnist, write_omniglot,
                            write_sop)

# data.name -> (paper config, writer of the official layout)
READERS = {
    "omniglot": ("omniglot_eps_triplet", lambda root: write_omniglot(root, characters=2)),
    "mnist_evenodd": ("mnist_evenodd_eps", write_mnist),
    "cub": ("cub_ephn_2nd", write_cub),
    "cars196": ("cars_ephn_2nd", lambda root: write_cars(root, layout="devkit")),
    "sop": ("sop_ephn_2nd", write_sop),
    "flowers102": ("label_noise:flowers,margin", write_flowers),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(READERS))
def test_training_on_official_files(name, tmp_path):
  from test_configs import load  # pylint: disable=import-outside-toplevel
  config_name, write = READERS[name]
  c = load(config_name, "smoke")
  assert c.data.name == name
  root = str(tmp_path / "data")
  write(root)
  c.data.options.root = root
  c.data.options.data_dir = ""
  c.num_devices = 1
  c.batch_size, c.data.group_size = 8, 4    # the generated sets have 2-3 training classes
  c.eval.ks = (1, 2)
  workdir = str(tmp_path / "run")
  results = training.train_and_evaluate(c, workdir, show_progress=False)
  assert len(results) == len(c.eval.splits)
  for metrics in results.values():
    assert 0.0 <= metrics["recall@1"] <= 1.0
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    losses = [r["train/loss"] for r in map(json.loads, f) if "train/loss" in r]
  assert len(losses) == 2 and np.all(np.isfinite(losses))
  assert eval_checkpoints.checkpoint_steps(workdir) == [2]
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["data"]["options"]["root"] == root
