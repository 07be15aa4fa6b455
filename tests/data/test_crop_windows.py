"""Tests of data.crop_windows: the windows cut from cached images on the host."""

import math

import numpy as np
import pytest

from dml_jax.data import augment, crop_windows


@pytest.mark.parametrize("h, w", [(256, 341), (341, 256), (256, 768), (768, 256), (256, 256)])
def test_window_holds_everything_the_filter_reaches(h, w):
  # Any box RandomResizedCrop draws (in the source, here 2x the cached size) fits the window
  # with the filter's reach on both sides, so the window is never cut short.
  window = crop_windows.window_size("random_resized_crop", image_size=224, resize_size=256)
  out = np.zeros((window, window, 1), np.uint8)
  image = np.ones((h, w, 1), np.uint8)
  for seed in range(300):
    crop = augment.sample_crop("random_resized_crop", np.random.default_rng(seed),
                               (2 * w, 2 * h), image_size=224)
    out[:] = 0
    box, valid = crop_windows.cut_window(image, (2 * h, 2 * w), crop, out, resample=True,
                                           image_size=224)
    top, left, height, width = box
    for start, length, n, size, offset in ((top, height, valid[0], h, crop.top / 2 - top),
                                           (left, width, valid[1], w, crop.left / 2 - left)):
      reach = max(1.0, length / 224)
      assert n <= window
      assert offset == 0 or start - reach >= 0              # the near side is all there
      assert offset + n == size or start + length + reach <= n   # and the far side
    assert out[:valid[0], :valid[1]].all() and not out[valid[0]:].any()


@pytest.mark.parametrize("top, left", [(-3, -3), (3, 3), (0, 2), (-1, 3)])
def test_crop_windows_are_the_crop_with_zeros_outside(top, left):
  # pad_crop's boxes reach up to pad pixels outside the S x S source: zeros there.
  image = np.arange(1, 8 * 8 * 2 + 1, dtype=np.uint8).reshape(8, 8, 2)
  padded = np.pad(image, ((3, 3), (3, 3), (0, 0)))
  out = np.zeros((8, 8, 2), np.uint8)
  box, valid = crop_windows.cut_window(image, (8, 8), augment.Crop(left, top, 8, 8, False),
                                       out, resample=False, image_size=8)
  np.testing.assert_array_equal(out, padded[top + 3:top + 11, left + 3:left + 11])
  assert box == (0.0, 0.0, 8.0, 8.0) and valid == (8, 8)


def test_host_inputs_stack_rows_and_flips():
  images = [np.full((10, 12, 3), k, np.uint8) for k in range(3)]
  crops = [augment.Crop(1, 2, 8, 8, True), augment.Crop(0, 0, 8, 8, False)]
  inputs = crop_windows.host_inputs(images, np.array([[10, 12]] * 3), [2, 0], crops,
                                    augmentation="resize_crop", image_size=8, resize_size=10,
                                    channels=3)
  assert inputs.windows.shape == (2, 8, 8, 3) and inputs.windows.dtype == np.uint8
  assert (inputs.windows[0] == 2).all() and (inputs.windows[1] == 0).all()
  np.testing.assert_array_equal(inputs.flips, [True, False])
  assert crop_windows.window_size("random_resized_crop", image_size=224,
                                  resize_size=256) == 351
