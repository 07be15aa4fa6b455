"""Tests of dml_jax.run.train_input: which input feeds the training loop (``data.cache``), the
mmap cache in the workdir, and the sharded feed of the cached path on the test session's 8
fake CPU devices against the streaming path."""

import os
import shutil

import numpy as np
import pytest

from configs import default
from dml_jax import data, parallel
from dml_jax.run import config as config_lib
from dml_jax.run import eval_checkpoints, train_input, training, workdir as workdir_lib
from fake_datasets import write_inshop_dataset


@pytest.fixture(scope="module")
def inshop_root(tmp_path_factory):
  return write_inshop_dataset(str(tmp_path_factory.mktemp("inshop")), items=6, per_item=4)


@pytest.fixture(scope="module")
def inshop_train(inshop_root):
  return data.load("inshop", root=inshop_root, image_size=12, resize_size=14)["train"]


def image_config(**data_keys):
  c = default.get_config()
  c.data.name, c.data.image_size, c.data.resize_size = "inshop", 12, 14
  c.data.augmentation, c.data.num_threads, c.batch_size, c.data.group_size = (
      "random_resized_crop", 2, 8, 4)
  for key, value in data_keys.items():
    c.data[key] = value
  return c


def test_cache_mode_follows_the_config_budget_and_run_length(inshop_train):
  images = inshop_train.images   # 24 images of 14 x 17 x 3 (714 bytes) when cached
  mode = lambda examples=None, **kw: train_input.cache_mode(image_config(**kw).data, images,
                                                            examples=examples)[0]
  assert mode(cache="auto") == "memory"
  assert mode(cache="auto", cache_max_gb=1e-6) == "none"      # 17 kB > 1 kB
  assert mode(cache="auto", examples=16) == "none"            # fewer examples than images
  assert mode(cache="auto", examples=24) == "memory"
  assert mode(cache="memory", examples=8, cache_max_gb=0) == "memory"
  assert mode(cache="mmap") == "mmap" and mode(cache="none") == "none"
  digits = np.zeros((24, 8, 8, 1), np.float32)                 # in-memory arrays: own path
  assert train_input.cache_mode(image_config(cache="memory").data, digits)[0] == "none"


def test_mmap_cache_lives_in_the_workdir_and_auto_says_why(inshop_train, tmp_path):
  lines = []
  c = train_input.input_cache(image_config(cache="mmap"), inshop_train.images,
                              workdir=str(tmp_path), log=lines.append)
  folder = workdir_lib.data_cache_dir(str(tmp_path))
  assert c.path.startswith(folder) and sorted(os.listdir(folder)) == [
      "inshop_train-random_resized_crop-12-14-c3.npz",
      "inshop_train-random_resized_crop-12-14-c3.u8"]
  with pytest.raises(ValueError, match="data.cache='mmap' needs a workdir"):
    train_input.input_cache(image_config(cache="mmap"), inshop_train.images)
  assert train_input.input_cache(image_config(cache="auto"), inshop_train.images,
                                 examples=8, log=lines.append) is None
  assert "8 examples, fewer than the 24 images: streaming" in lines[-1]
  assert train_input.input_cache(image_config(cache="auto"), inshop_train.images,
                                 log=lines.append) is not None
  assert "GB, budget data.cache_max_gb=8.0: cached in memory" in lines[-1]


@pytest.mark.parametrize("augmentation", ["resize_crop", "random_resized_crop"])
def test_cached_feed_on_eight_devices_matches_the_streaming_batches(inshop_train,
                                                                    augmentation):
  c = image_config(cache="memory", augmentation=augmentation)
  mesh = parallel.make_mesh(0)
  sampler = data.NPerClassSampler(inshop_train.labels, batch_size=8, group_size=4, seed=0)
  cache = train_input.input_cache(c, inshop_train.images)
  streamed = train_input.train_batches(c, inshop_train, sampler, start_step=1, num_steps=3)
  fed = train_input.train_batches(c, inshop_train, sampler, start_step=1, num_steps=3,
                                  cache=cache)
  host_feed, cached_feed = train_input.make_feed(c, mesh), train_input.make_feed(c, mesh, cache)
  for (s1, x1, y1), (s2, x2, y2) in zip(streamed, fed, strict=True):
    a, ya = host_feed(x1, y1)
    b, yb = cached_feed(x2, y2)
    assert s1 == s2 and b.shape == (8, 12, 12, 3) and len(b.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(yb), np.asarray(ya))
    diff = np.abs(np.asarray(b) - np.asarray(a)) * 255 * 0.225   # in uint8 levels
    if augmentation == "resize_crop":
      assert diff.max() < 1e-3                 # the same pixels
    else:   # 20 x 16 JPEGs cached at 14 x 17: a double resize of noise images, loosely close
      assert diff.mean() < 40 and np.corrcoef(np.asarray(a).ravel(),
                                              np.asarray(b).ravel())[0, 1] > 0.6


def test_validate_config_names_bad_cache_values():
  c = image_config(cache="gpu")
  with pytest.raises(ValueError, match=r"^data.cache='gpu'; allowed: 'auto', 'memory'"):
    config_lib.validate(c)
  c = image_config(cache_max_gb=-2)
  with pytest.raises(ValueError, match=r"^data.cache_max_gb=-2.0; allowed: a number of GB"):
    config_lib.validate(c)


def loop_config(root, steps):
  c = image_config(cache="memory")
  c.data.options = {"root": root}
  c.model.name, c.model.embedding_dim, c.num_train_steps = "small_cnn", 8, steps
  c.log_every_steps, c.checkpoint_every_steps, c.eval.plot = 2, 2, False
  c.eval.splits, c.eval.ks, c.eval.kmeans_n_init = ("query@gallery",), (1,), 1
  return c


@pytest.mark.slow
def test_training_loop_feeds_the_cached_batches(inshop_root, tmp_path, capsys):
  """train_and_evaluate builds the cache and feeds the device-augmented batches to the step;
  its evaluations (at step 1 and at the end) decode the evaluated splits once into the
  evaluation cache (eval.cache='auto'), which eval.py then maps, to the metrics of decoding
  every image (eval.cache='none')."""
  workdir, c = str(tmp_path), loop_config(inshop_root, 2)
  c.eval_every_steps = 1
  results = training.train_and_evaluate(c, workdir, show_progress=False)
  out = capsys.readouterr().out
  assert "dml_jax: training images: DecodedCache(24 images" in out
  assert "augmented on the device" in out and "decoding in" not in out
  assert out.count("dml_jax: evaluation images (eval.cache=auto): query: 12 images") == 1
  assert 0 < results["query@gallery"]["recall@1"] <= 1
  assert eval_checkpoints.evaluate_checkpoint(workdir) == (2, results)
  out = capsys.readouterr().out
  assert "query: 12 images (0.00 GB) mapped (decoded earlier); gallery: 12 images" in out
  streamed = workdir_lib.load_config(workdir)
  streamed.eval.cache = "none"
  workdir_lib.write_config(streamed, workdir)
  assert eval_checkpoints.evaluate_checkpoint(workdir) == (2, results)
  assert "evaluation images" not in capsys.readouterr().out


@pytest.mark.long
def test_resumed_cached_run_equals_the_uninterrupted_one(inshop_root, tmp_path):
  full = training.train_and_evaluate(loop_config(inshop_root, 4), str(tmp_path / "full"),
                                     show_progress=False)
  training.train_and_evaluate(loop_config(inshop_root, 2), str(tmp_path / "resumed"),
                              show_progress=False)
  resumed = training.train_and_evaluate(loop_config(inshop_root, 4), str(tmp_path / "resumed"),
                                        show_progress=False)
  assert resumed == full


@pytest.mark.long
def test_resumed_auto_run_feeds_as_the_uninterrupted_one(inshop_root, tmp_path, capsys):
  """data.cache='auto' decides by the run's examples, not those left: a run of 4 steps of 8
  (32 examples, 24 images) resumed from its step-2 checkpoint keeps the cache (16 left)."""
  c = loop_config(inshop_root, 4)
  c.data.cache = "auto"
  full = training.train_and_evaluate(c, str(tmp_path / "full"), show_progress=False)
  resumed = str(tmp_path / "resumed")
  training.train_and_evaluate(c, resumed, show_progress=False)
  shutil.rmtree(os.path.join(resumed, "checkpoints", "4"))   # as if killed after step 2
  capsys.readouterr()
  assert training.train_and_evaluate(c, resumed, show_progress=False) == full
  assert "augmented on the device" in capsys.readouterr().out
