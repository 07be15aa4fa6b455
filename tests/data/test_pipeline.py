"""The training input pipeline: batch composition, determinism, resumption, per-process rows,
threads and worker processes, on image files and on mocked TFDS data."""

import threading
import time

import numpy as np
import pytest

from dml_jax import data
from dml_jax.data import augment, pipeline
from dml_jax.data.images import ImageOptions, LazyImages
from fake_datasets import write_inshop_dataset
from tfds_mock import mock_data

OPTIONS = ImageOptions(image_size=12, resize_size=14)


@pytest.fixture(scope="module")
def inshop_train(tmp_path_factory):
  root = write_inshop_dataset(str(tmp_path_factory.mktemp("inshop")), items=6, per_item=4)
  return data.load("inshop", root=root, image_size=12, resize_size=14)["train"]


def batches(split, sampler, *, start=0, steps=3, **kwargs):
  kwargs.setdefault("augmentation", "resize_crop")
  return list(pipeline.train_batches(split.images, split.labels, sampler, seed=3,
                                     start_step=start, num_steps=steps, **kwargs))


def make_sampler(split, batch_size=8, group_size=4):
  return data.NPerClassSampler(split.labels, batch_size=batch_size, group_size=group_size,
                               seed=0)


def test_batches_follow_the_sampler_and_the_augmentation(inshop_train):
  sampler = make_sampler(inshop_train)
  out = batches(inshop_train, sampler, steps=2)
  assert [s for s, _, _ in out] == [0, 1]
  for step, images, labels in out:
    idx = sampler.batch_indices(step)
    np.testing.assert_array_equal(labels, inshop_train.labels[idx])
    assert images.shape == (8, 12, 12, 3) and images.dtype == np.float32
    # Row k is the augmentation of record idx[k] with the generator of (seed, step, k).
    for k in (0, 5):
      expected = OPTIONS.train_transform(inshop_train.images.record(idx[k]),
                                         pipeline.example_rng(3, step, k),
                                         augmentation="resize_crop")
      np.testing.assert_array_equal(images[k], expected)
    # Group composition: 2 classes x 4 consecutive rows each.
    assert len(np.unique(labels)) == 2
    assert all(len(set(labels[g * 4:(g + 1) * 4])) == 1 for g in range(2))


def test_same_batches_for_any_thread_count_and_after_resuming(inshop_train):
  sampler = make_sampler(inshop_train)
  full = batches(inshop_train, sampler, steps=4, num_threads=4)
  single = batches(inshop_train, sampler, steps=4, num_threads=1)
  resumed = batches(inshop_train, sampler, start=2, steps=4, num_threads=2)
  for (s1, x1, y1), (s2, x2, y2) in zip(full, single):
    assert s1 == s2
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
  for (s1, x1, _), (s2, x2, _) in zip(full[2:], resumed):
    assert s1 == s2
    np.testing.assert_array_equal(x1, x2)


def test_process_rows_partition_the_global_batch(inshop_train):
  """Multi-host: each process decodes its rows; together they are the global batch."""
  sampler = make_sampler(inshop_train)
  full = batches(inshop_train, sampler, steps=2)
  halves = [batches(inshop_train, sampler, steps=2, rows=slice(0, 4)),
            batches(inshop_train, sampler, steps=2, rows=slice(4, 8))]
  for step in range(2):
    np.testing.assert_array_equal(
        np.concatenate([halves[0][step][1], halves[1][step][1]]), full[step][1])
    np.testing.assert_array_equal(
        np.concatenate([halves[0][step][2], halves[1][step][2]]), full[step][2])


def test_different_seeds_and_steps_augment_differently(inshop_train):
  sampler = make_sampler(inshop_train)
  a = pipeline.train_batches(inshop_train.images, inshop_train.labels, sampler, seed=1,
                             start_step=0, num_steps=1, augmentation="random_resized_crop")
  b = pipeline.train_batches(inshop_train.images, inshop_train.labels, sampler, seed=2,
                             start_step=0, num_steps=1, augmentation="random_resized_crop")
  assert not np.array_equal(next(iter(a))[1], next(iter(b))[1])


def test_threads_decode_at_most_prefetch_batches_ahead(inshop_train, monkeypatch):
  """A long run keeps a bounded number of decoded images in memory (``prefetch`` batches
  ahead of the consumer), not hundreds of batches (at 224 px, 150 MB each at b = 256)."""
  decoded, lock = [0], threading.Lock()
  record = LazyImages.record

  def counting_record(self, i):
    with lock:
      decoded[0] += 1
    return record(self, i)

  monkeypatch.setattr(LazyImages, "record", counting_record)
  sampler = make_sampler(inshop_train)
  it = pipeline.train_batches(inshop_train.images, inshop_train.labels, sampler, seed=3,
                              start_step=0, num_steps=10 ** 6, augmentation="resize_crop",
                              num_threads=2, prefetch=2)
  next(it)
  last, deadline = -1, time.monotonic() + 20
  while decoded[0] != last and time.monotonic() < deadline:  # until the threads idle
    last = decoded[0]
    time.sleep(0.5)
  assert 8 < decoded[0] <= (1 + 2) * 8 + 2, decoded[0]


@pytest.mark.slow
def test_worker_processes_give_the_same_batches(inshop_train):
  sampler = make_sampler(inshop_train)
  threads = batches(inshop_train, sampler, steps=3)
  workers = batches(inshop_train, sampler, steps=3, num_workers=2)
  assert [s for s, _, _ in workers] == [0, 1, 2]
  for (_, x1, y1), (_, x2, y2) in zip(threads, workers):
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)


def test_mocked_tfds_dataset_through_the_pipeline():
  with mock_data(64):
    train = data.load("cub", image_size=16, resize_size=18)["train"]
    sampler = data.NPerClassSampler(train.labels, batch_size=8, group_size=2, seed=0)
    (step, images, labels), = batches(train, sampler, steps=1)
  assert step == 0 and images.shape == (8, 16, 16, 3)
  np.testing.assert_array_equal(labels, train.labels[sampler.batch_indices(0)])


def test_in_memory_arrays_are_gathered_without_augmentation():
  train = data.load("digits_evenodd")["train"]
  sampler = data.NPerClassSampler(train.labels, batch_size=8, group_size=4, seed=0)
  (_, images, labels), = batches(train, sampler, steps=1, augmentation="none")
  np.testing.assert_array_equal(images, train.images[sampler.batch_indices(0)])
  with pytest.raises(ValueError, match="in-memory arrays.*'none'"):
    batches(train, sampler, steps=1, augmentation="resize_crop")


def test_bad_pipeline_arguments(inshop_train):
  sampler = make_sampler(inshop_train)
  with pytest.raises(ValueError, match="Unknown augmentation 'crop'"):
    batches(inshop_train, sampler, augmentation="crop")
  with pytest.raises(ValueError, match="num_workers"):
    batches(inshop_train, sampler, num_workers=-1)
  with pytest.raises(ValueError, match="select no row"):
    batches(inshop_train, sampler, rows=slice(8, 8))


def test_images_and_labels_of_different_splits_are_refused():
  """Another split's labels (or images) would pair images with the wrong labels, silently
  when the images outnumber the labels."""
  splits = data.load("digits_evenodd")
  train, test = splits["train"], splits["test"]
  sampler = data.NPerClassSampler(test.labels, batch_size=8, group_size=4, seed=0)
  with pytest.raises(ValueError, match=rf"{len(train)} images but {len(test)} labels"):
    list(pipeline.train_batches(train.images, test.labels, sampler, seed=0, start_step=0,
                                num_steps=1))


@pytest.mark.parametrize("workers,threads,platform,cpus,expected", [
    (-1, 8, "cpu", 16, (0, 8)),     # auto on the CPU: the trainer's threads
    (-1, 8, "gpu", 16, (8, 2)),     # auto on a GPU: the measured best of 16 cores
    (-1, 8, "gpu", 64, (8, 8)),
    (-1, 8, "tpu", 2, (1, 2)),
    (-1, 1, "gpu", 16, (8, 1)),
    (0, 8, "gpu", 16, (0, 8)),      # explicit values are kept
    (3, 2, "cpu", 16, (3, 2))])
def test_resolve_workers(workers, threads, platform, cpus, expected):
  assert pipeline.resolve_workers(workers, threads, platform=platform, cpus=cpus) == expected


def test_describe_workers_names_processes_or_threads():
  assert pipeline.describe_workers(8, 2).startswith("decoding in 8 worker process(es) x 2 ")
  assert pipeline.describe_workers(0, 8).startswith("decoding in 8 threads of the trainer")


def test_resolve_workers_rejects_other_negative_values():
  with pytest.raises(ValueError, match=r"num_workers=-3; allowed: -1 \(auto\)"):
    pipeline.resolve_workers(-3, 8, platform="cpu", cpus=2)


def test_lazy_images_view_is_used_by_augment(inshop_train):
  assert isinstance(inshop_train.images, LazyImages)
  assert augment.decode(inshop_train.images.record(0)).shape == (16, 20, 3)


# ------------------------------------------------------------------------------------------
# The cached path: pipeline.cached_batches + device_augment.augment.


def cached(split, sampler, augmentation="resize_crop", *, start=0, steps=3, **kwargs):
  """``[(step, float images, labels)]`` of the cached path, augmented by the device step."""
  from dml_jax.data import cache, device_augment  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  c = cache.build(split.images, cache.CacheSpec(augmentation, 12, 14))
  fn = jax.jit(lambda x: device_augment.augment(x, augmentation=augmentation, image_size=12,
                                                mean=OPTIONS.mean, std=OPTIONS.std))
  out = []
  for step, inputs, labels in pipeline.cached_batches(c, split.labels, sampler, seed=3,
                                                      start_step=start, num_steps=steps,
                                                      **kwargs):
    out.append((step, np.asarray(fn(inputs)), labels))
  return out


@pytest.mark.parametrize("augmentation", ["resize_crop", "pad_crop"])
def test_cached_batches_equal_the_streaming_batches(inshop_train, augmentation):
  # Same sampler rows, same generators, same crop sources: the same batches (1e-5: float
  # rounding of the normalisation; one uint8 level is 0.017).
  sampler = make_sampler(inshop_train)
  host = batches(inshop_train, sampler, steps=3, augmentation=augmentation)
  device = cached(inshop_train, sampler, augmentation, steps=3)
  for (s1, x1, y1), (s2, x2, y2) in zip(host, device, strict=True):
    assert s1 == s2 and x2.dtype == np.float32 and y2.dtype == np.int32
    np.testing.assert_allclose(x2, x1, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(y2, y1)


def test_cached_batches_resume_exactly_and_split_rows(inshop_train):
  sampler = make_sampler(inshop_train)
  full = cached(inshop_train, sampler, "random_resized_crop", steps=4, num_threads=2)
  resumed = cached(inshop_train, sampler, "random_resized_crop", start=2, steps=4)
  assert [s for s, _, _ in resumed] == [2, 3]
  for (s1, x1, y1), (s2, x2, y2) in zip(full[2:], resumed, strict=True):
    assert s1 == s2
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
  halves = [cached(inshop_train, sampler, "random_resized_crop", steps=2, rows=rows)
            for rows in (slice(0, 4), slice(4, 8))]
  for step in range(2):
    for part in (1, 2):
      np.testing.assert_array_equal(
          np.concatenate([halves[0][step][part], halves[1][step][part]]), full[step][part])


def test_bad_cached_batches_arguments(inshop_train):
  from dml_jax.data import cache  # pylint: disable=import-outside-toplevel
  sampler = make_sampler(inshop_train)
  c = cache.build(inshop_train.images, cache.CacheSpec("resize_crop", 12, 14))
  run = lambda **kw: pipeline.cached_batches(c, kw.pop("labels", inshop_train.labels), sampler,
                                             seed=0, start_step=0, num_steps=1, **kw)
  with pytest.raises(ValueError, match="select no row"):
    run(rows=slice(8, 8))
  with pytest.raises(ValueError, match="num_threads must be >= 1"):
    run(num_threads=0)
  with pytest.raises(ValueError, match="holds 24 images but there are 3 labels"):
    run(labels=np.arange(3))


def test_eval_batches_in_order_fixed_shape_last_padded(inshop_train):
  images = inshop_train.images
  n = len(images)
  got = list(pipeline.eval_batches(images, batch_size=7, num_threads=2))
  assert [v for _, v in got] == [7] * (n // 7) + ([n % 7] if n % 7 else [])
  assert all(x.shape == (7,) + images.shape[1:] for x, _ in got)
  np.testing.assert_array_equal(np.concatenate([x[:v] for x, v in got]), images[0:n])
  if n % 7:
    np.testing.assert_array_equal(got[-1][0][n % 7:], np.repeat(images[0:1], 7 - n % 7, 0))
  with pytest.raises(ValueError, match="num_workers must be >= 0"):
    next(pipeline.eval_batches(images, batch_size=4, num_workers=-2))


@pytest.mark.slow
def test_eval_batches_from_worker_processes_equal_this_process(inshop_train):
  images = inshop_train.images
  here = list(pipeline.eval_batches(images, batch_size=5, num_threads=2))
  there = list(pipeline.eval_batches(images, batch_size=5, num_workers=2, num_threads=1))
  assert [v for _, v in there] == [v for _, v in here]
  for (a, _), (b, _) in zip(here, there):
    np.testing.assert_array_equal(a, b)
