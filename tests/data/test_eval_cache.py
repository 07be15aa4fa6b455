"""Tests of data.eval_cache and images.DecodedImages: the evaluation cache gives bitwise the
float32 inputs of ``LazyImages`` (batches, sub-views, the padded evaluation batches), in memory
and memory-mapped, its reuse and rebuild by fingerprint, and its errors."""

import os

import numpy as np
import pytest

from dml_jax.data import eval_cache, pipeline, splits as splits_lib
from dml_jax.data.images import DecodedImages, ImageOptions, LazyImages, take
from dml_jax.evaluation import retrieval_grid

from data.test_cache import records, smooth


def lazy(recs, *, image_size=20, resize_size=24, channels=3, name="toy:test"):
  grey = {"mean": (0.45,), "std": (0.27,)} if channels == 1 else {}   # RGB: ImageNet's
  return LazyImages(recs, ImageOptions(image_size=image_size, resize_size=resize_size,
                                       channels=channels, **grey), num_threads=2, name=name)


def bits(x):
  """float32 values as their bit patterns (equal arrays of these: bitwise equal)."""
  x = np.asarray(x)
  assert x.dtype == np.float32
  return x.view(np.uint32)


@pytest.mark.parametrize("kind, channels", [("array", 3), ("jpeg", 3), ("jpeg", 1)])
@pytest.mark.parametrize("mapped", [False, True])
def test_cached_view_is_bitwise_the_lazy_images(kind, channels, mapped, tmp_path):
  images = lazy(records(kind), channels=channels)
  view = eval_cache.build(images, path=str(tmp_path / "c") if mapped else "", num_threads=2)
  assert isinstance(view, DecodedImages) and view.pixels.dtype == np.uint8
  assert view.shape == images.shape == (5, 20, 20, channels) and len(view) == 5
  assert bool(view.path) == mapped and isinstance(view.pixels, np.memmap) == mapped
  np.testing.assert_array_equal(bits(view[:]), bits(images[:]))
  np.testing.assert_array_equal(bits(view[1:4]), bits(images[1:4]))
  np.testing.assert_array_equal(bits(view[3]), bits(images[3]))
  np.testing.assert_array_equal(bits(view[np.array([4, 0, 2])]), bits(images[np.array([4, 0, 2])]))
  np.testing.assert_array_equal(bits(np.asarray(view)), bits(np.asarray(images)))
  # sub-views (class splits, clean subsets) compose as LazyImages.take does
  for idx in (slice(1, 5), np.array([3, 1]), np.array([True, False, True, True, False])):
    sub = take(view, idx)
    assert isinstance(sub, DecodedImages)
    np.testing.assert_array_equal(bits(sub[:]), bits(take(images, idx)[:]))


def test_evaluation_batches_are_bitwise_equal_padding_included():
  images = lazy(records("jpeg"))
  view = eval_cache.build(images)
  got = list(pipeline.eval_batches(view, batch_size=2, num_workers=1))   # sliced here
  want = list(pipeline.eval_batches(images, batch_size=2))
  assert [v for _, v in got] == [v for _, v in want] == [2, 2, 1]
  for (a, _), (b, _) in zip(got, want):
    np.testing.assert_array_equal(bits(a), bits(b))


def test_threaded_normalisation_is_bitwise_the_single_call():
  rng = np.random.default_rng(0)
  pixels = rng.integers(0, 256, (40, 96, 96, 3), dtype=np.uint8)   # 27,648 values a row
  options = ImageOptions(image_size=96, resize_size=96)
  view = DecodedImages(pixels, options, num_threads=4)
  view._ELEMENTS_PER_THREAD = 100_000   # 4 rows a block: 10 blocks over 4 threads
  one = DecodedImages(pixels, options, num_threads=1)
  np.testing.assert_array_equal(bits(view[:]), bits(one[:]))
  x = pixels.astype(np.float32)   # augment.normalize's order: * (1/255), - mean, / std
  x *= 1.0 / 255.0
  x -= np.asarray(options.mean, np.float32)
  x /= np.asarray(options.std, np.float32)
  np.testing.assert_array_equal(bits(view[:]), bits(x))


def test_split_and_retrieval_grid_take_the_view_as_it_is():
  images = lazy(records())
  view = eval_cache.build(images)
  split = splits_lib.Split(images=view, labels=np.array([0, 0, 1, 1, 0]), name="toy:test")
  assert split.images is view and len(split) == 5
  rows = np.array([0, 3])
  np.testing.assert_array_equal(retrieval_grid.display_images(view, rows),
                                retrieval_grid.display_images(images, rows))


def test_mmap_is_reused_and_rebuilt_for_another_fingerprint(tmp_path, monkeypatch):
  calls = []
  decode = eval_cache.eval_pixels
  monkeypatch.setattr(eval_cache, "eval_pixels", lambda r, o: calls.append(1) or decode(r, o))
  recs, stem = records("jpeg"), str(tmp_path / "data_cache" / "toy")
  first = eval_cache.build(lazy(recs), path=stem)
  assert len(calls) == 5 and sorted(os.listdir(tmp_path / "data_cache")) == ["toy.json",
                                                                             "toy.npy"]
  assert first.path == stem + ".npy" and os.path.getsize(stem + ".npy") > 5 * 20 * 20 * 3
  mtime = os.stat(stem + ".npy").st_mtime_ns
  again = eval_cache.build(lazy(recs), path=stem)   # another process, the same records
  assert len(calls) == 5 and os.stat(stem + ".npy").st_mtime_ns == mtime
  np.testing.assert_array_equal(bits(again[:]), bits(first[:]))
  # other records, rows or crop options: another fingerprint, the files are rebuilt
  for other in (lazy(recs[::-1]), lazy(recs).take([0, 2]), lazy(recs, resize_size=22)):
    calls.clear()
    assert eval_cache.load(stem, other) is None
    rebuilt = eval_cache.build(other, path=stem)
    assert len(calls) == len(other)
    np.testing.assert_array_equal(bits(rebuilt[:]), bits(other[:]))
  assert eval_cache.load(stem, lazy(recs)) is None   # the last build replaced the first


def test_fingerprint_ignores_the_normalisation_only():
  recs = records()
  key = eval_cache.fingerprint(lazy(recs))
  moved = LazyImages(recs, ImageOptions(image_size=20, resize_size=24, mean=(0.5,), std=(0.5,)),
                     name="toy:test")
  assert eval_cache.fingerprint(moved) == key   # mean / std are applied on access
  assert eval_cache.fingerprint(lazy(recs, channels=1)) != key
  assert eval_cache.fingerprint(lazy(recs, name="toy:train")) != key
  changed = [smooth(37, 50, 99)] + list(recs[1:])
  assert eval_cache.fingerprint(lazy(changed)) != key


def test_progress_lines_only_for_slow_builds():
  lines = []
  eval_cache.build(lazy(records()), log=lines.append, log_every_s=0.0, chunk=2)
  assert lines[0].startswith("evaluation cache toy:test: 2/5 images, ")
  assert len(lines) == 3 and "5/5 images" in lines[-1]
  lines.clear()
  eval_cache.build(lazy(records()), log=lines.append, log_every_s=60.0)
  assert lines == []


def test_a_record_that_does_not_decode_leaves_no_file(tmp_path):
  recs = records("jpeg")
  recs[3] = b"not an image"
  with pytest.raises(ValueError, match="Cannot decode the image"):
    eval_cache.build(lazy(recs), path=str(tmp_path / "c"))
  assert os.listdir(tmp_path) == []


def test_errors_are_named():
  with pytest.raises(ValueError, match=r"^eval.cache='disk'; allowed: 'auto', 'memory', "
                                       r"'mmap', 'none'\.$"):
    eval_cache.check_mode("disk")
  with pytest.raises(ValueError, match="decodes LazyImages; got ndarray"):
    eval_cache.build(np.zeros((2, 4, 4, 3), np.float32))
  with pytest.raises(ValueError, match=r"decoded pixels must be uint8 \[N, S, S, C\]"):
    DecodedImages(np.zeros((2, 4, 4, 3), np.float32), ImageOptions(4, 4))


def test_two_builds_of_the_same_files_at_once_both_succeed(tmp_path):
  from data.test_cache import BuildsAgainOnce  # pylint: disable=import-outside-toplevel
  recs, stem = records("jpeg"), str(tmp_path / "toy")
  inner = BuildsAgainOnce(recs, 2, lambda: eval_cache.build(lazy(recs), path=stem))
  outer = eval_cache.build(lazy(inner), path=stem, num_threads=1)
  expected = bits(lazy(recs)[:])
  for view in (outer, inner.done, eval_cache.load(stem, lazy(recs))):
    np.testing.assert_array_equal(bits(view[:]), expected)
  assert sorted(os.listdir(tmp_path)) == ["toy.json", "toy.npy"]
