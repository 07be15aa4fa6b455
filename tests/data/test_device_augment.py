"""Tests of data.device_augment against the host path (``augment.train_transform``): the same
crop boxes and flips from the same generators, the same pixels for the crop augmentations, and
pixels close to Pillow's for random_resized_crop (tolerances stated at each test)."""

import math

import jax
import numpy as np
import pytest
from PIL import Image

from dml_jax.data import augment, cache, crop_windows, device_augment, pipeline
from dml_jax.data.images import ImageOptions, LazyImages

LEVEL = 1 / 255 / min(augment.IMAGENET_STD)   # one uint8 level after the normalisation, at most


def smooth(h, w, seed):
  rng = np.random.default_rng(seed)
  coarse = rng.integers(0, 256, (h // 8 + 2, w // 8 + 2, 3), dtype=np.uint8)
  return np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC))


def jpeg(array):
  import io  # pylint: disable=import-outside-toplevel
  buf = io.BytesIO()
  Image.fromarray(array).save(buf, "JPEG", quality=90)
  return buf.getvalue()


def host_and_device(records, augmentation, *, image_size, resize_size, steps, pad=3,
                    pad_fill=0):
  """``(host [n, S, S, C], device [n, S, S, C])`` for example ``(step, row 0)`` of record
  ``step % len(records)``, both with ``example_rng(0, step, 0)``."""
  options = ImageOptions(image_size=image_size, resize_size=resize_size)
  c = cache.build(LazyImages(records, options), cache.CacheSpec(augmentation, image_size,
                                                                 resize_size))
  host, crops, idx = [], [], []
  for step in range(steps):
    i = step % len(records)
    host.append(options.train_transform(records[i], pipeline.example_rng(0, step, 0),
                                        augmentation=augmentation, pad=pad,
                                        pad_fill=pad_fill))
    h, w = c.source_hw[i]
    crops.append(augment.sample_crop(augmentation, pipeline.example_rng(0, step, 0),
                                     (int(w), int(h)), image_size=image_size, pad=pad))
    idx.append(i)
  inputs = crop_windows.host_inputs(c.images, c.source_hw, idx, crops,
                                      augmentation=augmentation, image_size=image_size,
                                      resize_size=resize_size, channels=3, pad_fill=pad_fill)
  fn = jax.jit(lambda x: device_augment.augment(
      x, augmentation=augmentation, image_size=image_size, mean=options.mean,
      std=options.std))
  return np.stack(host), np.asarray(fn(inputs))


@pytest.mark.parametrize("augmentation,pad_fill", [("resize_crop", 0), ("pad_crop", 0),
                                                   ("pad_crop", 255), ("none", 0)])
def test_crop_augmentations_equal_the_host_path(augmentation, pad_fill):
  # The cache holds the host's own crop source, so the window is the host's crop: equal up
  # to the float rounding of the normalisation (1e-5; one level is 0.017).
  records = [jpeg(smooth(h, w, i)) for i, (h, w) in enumerate([(30, 41), (44, 29), (26, 26)])]
  host, device = host_and_device(records, augmentation, image_size=20, resize_size=24,
                                 steps=24, pad_fill=pad_fill)
  assert device.shape == host.shape == (24, 20, 20, 3) and device.dtype == np.float32
  np.testing.assert_allclose(device, host, atol=1e-5, rtol=0)


def test_random_resized_crop_equals_pillow_from_an_unresized_cache():
  # Images no larger than resize_size are cached as they are, so the device resamples the very
  # pixels Pillow does, with Pillow's filter: the difference is Pillow's fixed-point weights
  # and its rounding to uint8 between the horizontal and vertical pass, at most 1 level.
  records = [smooth(h, w, i) for i, (h, w) in enumerate([(40, 56), (56, 40), (48, 48)])]
  host, device = host_and_device(records, "random_resized_crop", image_size=32,
                                 resize_size=64, steps=30)
  diff = np.abs(device - host)
  assert diff.max() <= 1.01 * LEVEL and diff.mean() <= 0.3 * LEVEL


def test_random_resized_crop_is_close_to_pillow_on_the_full_image():
  # CUB-like: 500 x 375 images, cache at shorter side 256, output 224. The host resamples the
  # box from the full image, the device from the cache (resized once, antialiased): a
  # double resize. Measured: mean |diff| 1.4 levels, max 14 (at sharp edges of these
  # smooth-noise images); bounds 2.5 and 24 levels.
  records = [smooth(375, 500, 0), smooth(500, 375, 1)]
  host, device = host_and_device(records, "random_resized_crop", image_size=224,
                                 resize_size=256, steps=6)
  diff = np.abs(device - host) / LEVEL
  assert diff.mean() <= 2.5 and diff.max() <= 24


def test_crop_parameters_are_the_host_paths(monkeypatch):
  """The streaming and the cached pipeline draw the same boxes and flips, row by row; their
  distribution is RandomResizedCrop's (area fraction U(0.08, 1), log-uniform aspect in
  [3/4, 4/3]) with flips at rate 1/2."""
  records = [smooth(h, w, i) for i, (h, w) in enumerate([(30, 40), (40, 30), (34, 34)])]
  labels = np.array([0, 1, 2])
  options = ImageOptions(image_size=16, resize_size=18)
  images = LazyImages(records, options)
  sampler = SimpleSampler(len(records), batch_size=8)
  drawn = []
  original = augment.sample_crop

  def spy(augmentation, rng, size, **kwargs):
    crop = original(augmentation, rng, size, **kwargs)
    drawn.append((size, crop))
    return crop

  monkeypatch.setattr(augment, "sample_crop", spy)
  kwargs = dict(seed=5, start_step=0, num_steps=60)
  list(pipeline.train_batches(images, labels, sampler, augmentation="random_resized_crop",
                              num_threads=1, **kwargs))
  host, drawn[:] = list(drawn), []
  c = cache.build(images, cache.CacheSpec("random_resized_crop", 16, 18))
  list(pipeline.cached_batches(c, labels, sampler, num_threads=1, **kwargs))
  assert len(host) == 480 and drawn == host   # the same source sizes, boxes and flips
  (w, h), crops = np.array([s for s, _ in host]).T, [cp for _, cp in host]
  area = np.array([cp.width * cp.height for cp in crops]) / (w * h)
  aspect = np.log([cp.width / cp.height for cp in crops])
  flips = np.mean([cp.flip for cp in crops])
  assert abs(flips - 0.5) < 4 * 0.5 / math.sqrt(480)
  assert 0.45 < area.mean() < 0.65 and area.min() < 0.15 and area.max() > 0.9
  assert abs(aspect.mean()) < 0.05 and aspect.std() > 0.1


class SimpleSampler:
  """Batch ``t`` = records ``(t * 8 + k) % n``: any fixed rule does for these tests."""

  def __init__(self, n, batch_size):
    self.n, self.batch_size = n, batch_size

  def batch_indices(self, step):
    return (step * self.batch_size + np.arange(self.batch_size)) % self.n


def test_resample_weights_of_an_integer_box_at_scale_one_copy_pixels():
  w = np.asarray(device_augment.resample_weights(3.0, 5.0, 10, out_size=5, in_size=12))
  np.testing.assert_array_equal(w, np.eye(12, dtype=np.float32)[3:8])
  # Down-scaling by 2: triangle of half-width 2 around centres 1, 3, 5, ...; masked at valid.
  w = np.asarray(device_augment.resample_weights(0.0, 8.0, 7, out_size=4, in_size=12))
  np.testing.assert_allclose(w.sum(1), 1, rtol=1e-6)
  np.testing.assert_allclose(w[0, :3], np.array([0.75, 0.75, 0.25]) / 1.75, rtol=1e-6)
  assert not w[:, 7:].any()


def test_flip_and_normalisation_without_resampling():
  windows = np.arange(2 * 4 * 4 * 1, dtype=np.uint8).reshape(2, 4, 4, 1)
  inputs = crop_windows.DeviceInputs(windows, np.zeros((2, 4), np.float32),
                                       np.full((2, 2), 4, np.int32), np.array([True, False]))
  x = np.asarray(device_augment.augment(inputs, augmentation="pad_crop", image_size=4,
                                        mean=(0.5,), std=(0.25,)))
  np.testing.assert_allclose(x[0], (windows[0, :, ::-1] / 255 - 0.5) / 0.25, rtol=1e-6)
  np.testing.assert_allclose(x[1], (windows[1] / 255 - 0.5) / 0.25, rtol=1e-6)
