"""Tests of dml_jax.run.eval_input: which evaluated splits ``eval.cache`` decodes once, where
their memory maps live, their reuse by a later process, and the errors of the key."""

import os

import numpy as np
import pytest

from configs import default
from dml_jax import data
from dml_jax.data import eval_cache
from dml_jax.data.images import DecodedImages, LazyImages
from dml_jax.run import config as config_lib
from dml_jax.run import eval_input, workdir as workdir_lib
from fake_datasets import write_inshop_dataset


@pytest.fixture(scope="module")
def inshop(tmp_path_factory):
  root = write_inshop_dataset(str(tmp_path_factory.mktemp("inshop")), items=6, per_item=4)
  return data.load("inshop", root=root, image_size=12, resize_size=14, num_threads=2)


def config(**eval_keys):
  c = default.get_config()
  c.data.name, c.data.image_size, c.data.resize_size, c.data.num_threads = "inshop", 12, 14, 2
  c.eval.splits = ("query@gallery",)
  for key, value in eval_keys.items():
    c.eval[key] = value
  return c


def test_mode_follows_the_key_the_budget_and_the_workdir(inshop):
  query = inshop["query"].images   # 12 images of 12 x 12 x 3: 5,184 bytes
  mode = lambda c, images=query, workdir="w": eval_input.split_mode(c, images, workdir=workdir)
  assert mode(config()) == "mmap"
  assert mode(config(), workdir="") == "none"
  small = config()
  small.data.cache_max_gb = 5e-6   # 5,000 bytes
  assert mode(small) == "none"
  assert mode(config(cache="memory"), workdir="") == "memory"
  assert mode(config(cache="mmap")) == "mmap" and mode(config(cache="none")) == "none"
  digits = np.zeros((12, 8, 8, 1), np.float32)   # in-memory arrays are left as they are
  assert mode(config(cache="memory"), images=digits) == "none"
  with pytest.raises(ValueError, match=r"^eval.cache='mmap' needs a workdir for its files; "
                                       r"use 'memory'\.$"):
    mode(config(cache="mmap"), workdir="")


def test_validate_names_a_bad_value():
  with pytest.raises(ValueError, match=r"^eval.cache='disk'; allowed: 'auto', 'memory', "
                                       r"'mmap', 'none'\.$"):
    config_lib.validate(config(cache="disk"))


def test_only_the_evaluated_splits_are_cached_and_a_later_process_maps_them(
    inshop, tmp_path, monkeypatch):
  calls = []
  decode = eval_cache.eval_pixels
  monkeypatch.setattr(eval_cache, "eval_pixels", lambda r, o: calls.append(1) or decode(r, o))
  lines = []
  cached = eval_input.cached_splits(config(), inshop, workdir=str(tmp_path), log=lines.append)
  assert isinstance(cached["query"].images, DecodedImages)
  assert isinstance(cached["gallery"].images, DecodedImages)
  assert cached["train"] is inshop["train"] and isinstance(inshop["query"].images, LazyImages)
  assert len(calls) == 24   # the 12 query and 12 gallery images, not the 24 train ones
  np.testing.assert_array_equal(cached["query"].labels, inshop["query"].labels)
  np.testing.assert_array_equal(cached["gallery"].images[:].view(np.uint32),
                                inshop["gallery"].images[:].view(np.uint32))
  assert sorted(os.listdir(workdir_lib.data_cache_dir(str(tmp_path)))) == [
      "inshop_gallery-eval-12-14-c3.json", "inshop_gallery-eval-12-14-c3.npy",
      "inshop_query-eval-12-14-c3.json", "inshop_query-eval-12-14-c3.npy"]
  assert len(lines) == 1 and lines[0].startswith(
      "evaluation images (eval.cache=auto): query: 12 images (0.00 GB) decoded in ")
  assert "; gallery: 12 images (0.00 GB) decoded in " in lines[0]
  assert lines[0].endswith(f"; memory maps in {workdir_lib.data_cache_dir(str(tmp_path))}")
  calls.clear()
  again = eval_input.cached_splits(config(), inshop, workdir=str(tmp_path), log=lines.append)
  assert calls == [] and "query: 12 images (0.00 GB) mapped (decoded earlier)" in lines[-1]
  assert again["gallery"].images.path == cached["gallery"].images.path
  # another protocol embeds the train split too; with eval.cache='none' nothing is cached
  both = eval_input.cached_splits(config(cache="memory"), inshop, protocols=("train",))
  assert isinstance(both["train"].images, DecodedImages) and both["query"] is inshop["query"]
  assert eval_input.cached_splits(config(cache="none"), inshop, workdir=str(tmp_path),
                                  log=lines.append) == inshop


def test_auto_without_room_says_why(inshop, tmp_path):
  c, lines = config(), []
  c.data.cache_max_gb = 1e-6
  out = eval_input.cached_splits(c, inshop, workdir=str(tmp_path), log=lines.append)
  assert out == inshop and lines == [
      "evaluation images (eval.cache=auto): query: decoded at every evaluation (0.00 GB > "
      "data.cache_max_gb=1e-06); gallery: decoded at every evaluation (0.00 GB > "
      "data.cache_max_gb=1e-06)"]
