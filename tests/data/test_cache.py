"""Tests of data.cache: the decoded-image cache holds each image's crop source (against decoding
each record directly), in memory and memory-mapped, its reuse, estimate, progress lines and the
validation of ``data.cache`` / ``data.cache_max_gb``."""

import io
import os

import numpy as np
import pytest
from PIL import Image

from dml_jax.data import augment, cache
from dml_jax.data.images import ImageOptions, LazyImages

SIZES = [(37, 50), (50, 37), (30, 30), (64, 90), (22, 70)]   # (h, w): both orientations


def smooth(h, w, seed):
  rng = np.random.default_rng(seed)
  coarse = rng.integers(0, 256, (h // 6 + 2, w // 6 + 2, 3), dtype=np.uint8)
  return np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR))


def jpeg(array):
  buf = io.BytesIO()
  Image.fromarray(array).save(buf, "JPEG", quality=90)
  return buf.getvalue()


def records(kind="array"):
  arrays = [smooth(h, w, i) for i, (h, w) in enumerate(SIZES)]
  return arrays if kind == "array" else [jpeg(a) for a in arrays]


def lazy(recs, *, image_size=20, resize_size=24, name="toy:train"):
  return LazyImages(recs, ImageOptions(image_size=image_size, resize_size=resize_size),
                    name=name)


@pytest.mark.parametrize("kind", ["array", "jpeg"])
@pytest.mark.parametrize("augmentation", augment.AUGMENTATIONS)
def test_cache_holds_each_crop_source(augmentation, kind):
  recs = records(kind)
  spec = cache.CacheSpec(augmentation, 20, 24)
  c = cache.build(lazy(recs), spec, num_threads=2)
  assert len(c) == len(recs) and c.path == ""
  for i, record in enumerate(recs):
    source = augment.crop_source(record, augmentation=augmentation, image_size=20,
                                 resize_size=24)
    assert tuple(c.source_hw[i]) == (source.size[1], source.size[0])
    if augmentation == "random_resized_crop" and min(source.size) > 24:
      source = augment.resize_shorter(source, 24)   # the full image, kept at shorter side 24
    np.testing.assert_array_equal(c.images[i], np.asarray(source))
    assert c.images[i].dtype == np.uint8 and c.images[i].ndim == 3


def test_shorter_side_and_square_shapes():
  recs = records()
  shapes = {a: [im.shape for im in cache.build(lazy(recs), cache.CacheSpec(a, 20, 24)).images]
            for a in augment.AUGMENTATIONS}
  assert all(min(s[:2]) == 24 for s in shapes["resize_crop"])
  assert shapes["none"] == shapes["resize_crop"]
  assert all(s == (20, 20, 3) for s in shapes["pad_crop"])
  # random_resized_crop: shorter side 24, never upsampled (the 22 px image stays 22 x 70)
  assert [min(s[:2]) for s in shapes["random_resized_crop"]] == [24, 24, 24, 24, 22]


def test_grey_cache_has_one_channel():
  c = cache.build(lazy(records()), cache.CacheSpec("pad_crop", 20, 20, channels=1))
  assert all(im.shape == (20, 20, 1) for im in c.images)


def test_mmap_cache_equals_memory_and_is_reused(tmp_path):
  recs, spec = records("jpeg"), cache.CacheSpec("resize_crop", 20, 24)
  memory = cache.build(lazy(recs), spec)
  stem = str(tmp_path / "data_cache" / "toy")
  lines = []
  mapped = cache.build(lazy(recs), spec, path=stem, log=lines.append)
  assert mapped.path == stem and os.path.exists(stem + ".u8") and os.path.exists(stem + ".npz")
  assert os.path.getsize(stem + ".u8") == memory.nbytes == mapped.nbytes
  for a, b in zip(memory.images, mapped.images):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(memory.source_hw, mapped.source_hw)
  again = cache.build(lazy(recs), spec, path=stem, log=lines.append)
  assert lines and "mapped" in lines[-1]
  np.testing.assert_array_equal(again.images[3], memory.images[3])
  # Other records or another spec: a different fingerprint, so the files are rebuilt.
  other = cache.build(lazy(recs[::-1]), spec, path=stem)
  np.testing.assert_array_equal(other.images[0], memory.images[-1])
  assert cache.load(stem, key=cache.fingerprint(lazy(recs), spec), spec=spec) is None


def test_fingerprint_follows_records_indices_and_spec():
  recs, spec = records(), cache.CacheSpec("resize_crop", 20, 24)
  key = cache.fingerprint(lazy(recs), spec)
  assert key == cache.fingerprint(lazy(records()), spec)
  assert key != cache.fingerprint(lazy(recs).take([0, 1, 2]), spec)
  assert key != cache.fingerprint(lazy(recs), cache.CacheSpec("none", 20, 24))
  changed = list(recs)
  changed[0] = 255 - changed[0]
  assert key != cache.fingerprint(lazy(changed), spec)


def test_progress_lines_only_for_slow_builds():
  recs, spec = records(), cache.CacheSpec("resize_crop", 20, 24)
  lines = []
  cache.build(lazy(recs), spec, log=lines.append, log_every_s=0.0, chunk=2)
  assert len(lines) == 4   # after each of 3 chunks, then the summary
  assert "2/5 images" in lines[0] and "built in" in lines[-1]
  lines.clear()
  cache.build(lazy(recs), spec, log=lines.append, log_every_s=60.0)
  assert lines == []


def test_estimate_is_the_sample_mean_times_the_count():
  recs = records()
  for augmentation in ("resize_crop", "random_resized_crop"):
    spec = cache.CacheSpec(augmentation, 20, 24)
    built = cache.build(lazy(recs), spec)
    assert cache.estimate_nbytes(lazy(recs), spec, sample=len(recs)) == built.nbytes
    first_last = (built.images[0].nbytes + built.images[-1].nbytes) / 2
    assert cache.estimate_nbytes(lazy(recs), spec, sample=2) == round(first_last * len(recs))
  assert cache.estimate_nbytes(lazy(recs), cache.CacheSpec("pad_crop", 20, 24)) == 20 * 20 * 3 * 5


def test_choose_auto_follows_the_budget():
  assert cache.choose("auto", estimated_bytes=10**9, max_gb=1.0) == "memory"
  assert cache.choose("auto", estimated_bytes=10**9 + 1, max_gb=1.0) == "none"
  assert cache.choose("mmap", estimated_bytes=10**12, max_gb=1.0) == "mmap"
  assert cache.choose("none", estimated_bytes=0, max_gb=1.0) == "none"


@pytest.mark.parametrize("mode, max_gb, match", [
    ("disk", 8.0, r"data.cache='disk'; allowed: 'auto', 'memory', 'mmap', 'none'\."),
    ("auto", -1.0, r"data.cache_max_gb=-1.0; allowed: a number of GB >= 0"),
    ("auto", "8", r"data.cache_max_gb='8'; allowed"),
    ("auto", float("nan"), r"data.cache_max_gb=nan; allowed"),
])
def test_bad_cache_options_are_named(mode, max_gb, match):
  with pytest.raises(ValueError, match=match):
    cache.check_mode(mode, max_gb)


def test_bad_spec_is_named():
  with pytest.raises(ValueError, match="Unknown augmentation 'cutout'"):
    cache.CacheSpec("cutout", 20, 24)
  with pytest.raises(ValueError, match=r"resize_size \(16\) must be >= image_size \(20\)"):
    cache.CacheSpec("resize_crop", 20, 16)


class BuildsAgainOnce(list):
  """Records whose second read of row ``at`` (the first is the fingerprint's) runs
  ``build()``: another build of the same files while this one is half-way, as a second
  process would."""

  def __init__(self, recs, at, build):
    super().__init__(recs)
    self.at, self.build, self.done, self.reads = at, build, None, 0

  def __getitem__(self, i):
    if i == self.at:
      self.reads += 1
      if self.reads == 2:
        self.done = self.build()
    return super().__getitem__(i)


def test_two_builds_of_the_same_files_at_once_both_succeed(tmp_path):
  recs, spec = records("jpeg"), cache.CacheSpec("resize_crop", 20, 24)
  stem = str(tmp_path / "toy")
  inner = BuildsAgainOnce(recs, 2, lambda: cache.build(lazy(recs), spec, path=stem))
  outer = cache.build(lazy(inner), spec, path=stem, num_threads=1)
  expected = cache.build(lazy(recs), spec)
  for c in (outer, inner.done, cache.load(stem, key=cache.fingerprint(lazy(recs), spec),
                                          spec=spec)):
    assert all(np.array_equal(a, b) for a, b in zip(c.images, expected.images))
  assert sorted(os.listdir(tmp_path)) == ["toy.npz", "toy.u8"]


def test_a_record_that_does_not_decode_leaves_no_file(tmp_path):
  recs = records("jpeg")
  recs[3] = b"not an image"
  with pytest.raises(ValueError, match="Cannot decode the image"):
    cache.build(lazy(recs), cache.CacheSpec("resize_crop", 20, 24), path=str(tmp_path / "c"))
  assert os.listdir(tmp_path) == []


def test_a_killed_builds_temporary_file_is_removed_by_the_next(tmp_path):
  recs, spec, stem = records("jpeg"), cache.CacheSpec("resize_crop", 20, 24), tmp_path / "toy"
  dead = 2 ** 22 + 12345   # above Linux's pid_max default: no such process
  host = cache._host()   # pylint: disable=protected-access
  for name in (f"toy.u8.{host}-{dead}-0a1b2c3d.tmp", f"toy.u8.{host}-{os.getpid()}-0a1b2c3d.tmp",
               "toy.u8.notes.tmp", f"other.u8.{host}-{dead}-0a1b2c3d.tmp",
               f"toy.u8.otherhost-{dead}-0a1b2c3d.tmp", "toy.u8.tmp", "toy.npz.tmp"):
    (tmp_path / name).write_bytes(b"partial")
  cache.build(lazy(recs), spec, path=str(stem))
  assert sorted(os.listdir(tmp_path)) == sorted([
      f"other.u8.{host}-{dead}-0a1b2c3d.tmp", "toy.npz", "toy.u8", "toy.u8.notes.tmp",
      f"toy.u8.{host}-{os.getpid()}-0a1b2c3d.tmp",   # this process's own is not stale
      f"toy.u8.otherhost-{dead}-0a1b2c3d.tmp"])      # nor another host's (a shared workdir)
