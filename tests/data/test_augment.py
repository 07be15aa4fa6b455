"""Tests of data.augment: decoding, the training augmentations and the evaluation transform.

Most checks invert the normalisation (``mean=(0,), std=(1,)`` gives ``x / 255``) and compare
uint8 pixels exactly against a hand-computed crop of an image whose values encode position
(a gradient, or noise whose three channels make every pixel unique).
"""

import io
import math

import numpy as np
import pytest
from PIL import Image

from dml_jax.data import augment

RAW = dict(mean=(0.0,), std=(1.0,))   # output = pixel / 255: invertible to uint8 exactly


def natural(h, w, *, seed=0, grey=False):
  """A "natural-ish" uint8 image [h, w, 3] (or [h, w]): a smooth random field plus noise."""
  rng = np.random.default_rng(seed)
  base = rng.uniform(0, 255, (max(2, h // 40), max(2, w // 40), 3)).astype(np.uint8)
  img = np.asarray(Image.fromarray(base).resize((w, h), Image.BICUBIC), np.float32)
  img = np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
  return img[..., 0] if grey else img


def noise(h, w, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def encode(array, fmt, **kwargs):
  buf = io.BytesIO()
  Image.fromarray(array).save(buf, fmt, **kwargs)
  return buf.getvalue()


def to_uint8(x):
  """Inverts the RAW normalisation: float32 x / 255 -> the uint8 pixels (exact)."""
  out = np.rint(np.asarray(x, np.float64) * 255)
  assert np.all((out >= 0) & (out <= 255))
  return out.astype(np.uint8)


def train(record, seed=0, **kwargs):
  kwargs = {"image_size": 24, "resize_size": 28, **kwargs}
  return augment.train_transform(record, np.random.default_rng(seed), **kwargs)


def find_window(big, small):
  """All ``(top, left)`` with ``big[top:top+s, left:left+s] == small`` (``small`` square)."""
  s = small.shape[0]
  tops, lefts = np.nonzero(np.all(big[:big.shape[0] - s + 1, :big.shape[1] - s + 1]
                                  == small[0, 0], axis=-1))
  return [(int(t), int(l)) for t, l in zip(tops, lefts)
          if np.array_equal(big[t:t + s, l:l + s], small)]


# ------------------------------------------------------------------------------------------
# Shapes, dtype, normalisation, determinism.


@pytest.mark.parametrize("augmentation", augment.AUGMENTATIONS)
@pytest.mark.parametrize("channels", [1, 3])
def test_shape_dtype_and_exact_normalisation_of_a_constant_image(augmentation, channels):
  value = 173
  mean, std = (0.485, 0.456, 0.406)[:channels], (0.229, 0.224, 0.225)[:channels]
  image = np.full((30, 47, 3), value, np.uint8)
  x = train(image, augmentation=augmentation, channels=channels, mean=mean, std=std, pad=0)
  assert x.shape == (24, 24, channels) and x.dtype == np.float32
  expected = (value / 255 - np.asarray(mean)) / np.asarray(std)
  np.testing.assert_allclose(x, np.broadcast_to(expected, x.shape), rtol=0, atol=1e-6)


def test_default_normalisation_is_imagenet():
  x = augment.eval_transform(np.full((8, 8, 3), 255, np.uint8), image_size=8, resize_size=8)
  expected = (1 - np.array(augment.IMAGENET_MEAN)) / np.array(augment.IMAGENET_STD)
  np.testing.assert_allclose(x[3, 3], expected, rtol=1e-6)


@pytest.mark.parametrize("augmentation", ["resize_crop", "random_resized_crop", "pad_crop"])
def test_same_seed_same_output_different_seeds_different_crops(augmentation):
  image = noise(37, 50)
  a = train(image, seed=3, augmentation=augmentation, flip=False)
  np.testing.assert_array_equal(a, train(image, seed=3, augmentation=augmentation, flip=False))
  outputs = {train(image, seed=s, augmentation=augmentation, flip=False).tobytes()
             for s in range(12)}
  assert len(outputs) >= 6


def test_none_is_eval_and_ignores_rng_and_flip():
  image = noise(37, 50)
  expected = augment.eval_transform(image, image_size=24, resize_size=28)
  for seed in range(5):
    np.testing.assert_array_equal(train(image, seed=seed, augmentation="none", flip=True),
                                  expected)


# ------------------------------------------------------------------------------------------
# Record kinds.


@pytest.mark.parametrize("augmentation", augment.AUGMENTATIONS)
def test_array_png_path_and_jpeg_records_agree(augmentation, tmp_path):
  image = natural(45, 61)
  png = encode(image, "PNG")
  jpeg = encode(image, "JPEG", quality=95)
  (tmp_path / "x.png").write_bytes(png)
  (tmp_path / "x.jpg").write_bytes(jpeg)
  ref = train(image, seed=1, augmentation=augmentation)
  for record in (png, bytearray(png), memoryview(png), str(tmp_path / "x.png"),
                 tmp_path / "x.png"):
    np.testing.assert_array_equal(train(record, seed=1, augmentation=augmentation), ref)
  # JPEG is lossy: the same crop, pixels within a few grey levels on average (measured ~1.6
  # levels at quality 95 for this noisy image; a different crop would differ by ~10).
  from_bytes = train(jpeg, seed=1, augmentation=augmentation, **RAW)
  np.testing.assert_array_equal(from_bytes, train(str(tmp_path / "x.jpg"), seed=1,
                                                  augmentation=augmentation, **RAW))
  assert np.abs(from_bytes - train(image, seed=1, augmentation=augmentation, **RAW)).mean() \
      < 3 / 255
  assert np.abs(from_bytes - train(image, seed=2, augmentation=augmentation, **RAW)).mean() \
      > 5 / 255 or augmentation == "none"


@pytest.mark.parametrize("channels", [1, 3])
def test_grey_records_hw_and_hw1_agree(channels):
  grey = natural(33, 40, grey=True)
  ref = train(grey, seed=2, augmentation="resize_crop", channels=channels, **RAW)
  np.testing.assert_array_equal(train(grey[..., None], seed=2, augmentation="resize_crop",
                                      channels=channels, **RAW), ref)
  np.testing.assert_array_equal(train(encode(grey, "PNG"), seed=2, augmentation="resize_crop",
                                      channels=channels, **RAW), ref)
  if channels == 3:   # grey -> RGB replicates the channel
    np.testing.assert_array_equal(ref[..., 0], ref[..., 1])
    np.testing.assert_array_equal(ref[..., 0], ref[..., 2])


def test_rgb_to_grey_uses_the_luma_formula():
  image = natural(24, 24)
  x = to_uint8(augment.eval_transform(image, image_size=24, resize_size=24, channels=1, **RAW))
  assert x.shape == (24, 24, 1)
  r, g, b = (image[..., k].astype(np.float64) for k in range(3))
  luma = (299 * r + 587 * g + 114 * b) / 1000   # ITU-R 601-2, Pillow's convert('L')
  assert np.abs(x[..., 0] - luma).max() <= 1.0
  assert augment.decode(image, channels=1).shape == (24, 24, 1)
  assert augment.decode(image[..., 0], channels=3).shape == (24, 24, 3)


def test_decode_keeps_pixels_and_accepts_non_contiguous_arrays():
  image = noise(20, 30)
  for view in (image, image[:, ::-1], image.transpose(1, 0, 2), image[::2, 1::3]):
    np.testing.assert_array_equal(augment.decode(view), view)
  np.testing.assert_array_equal(augment.decode(encode(image, "PNG")), image)
  rgba = np.concatenate([image, np.full((20, 30, 1), 255, np.uint8)], axis=-1)
  np.testing.assert_array_equal(augment.decode(rgba), image)


# ------------------------------------------------------------------------------------------
# Geometry of the transforms.


@pytest.mark.parametrize("h, w", [(256, 341), (341, 256)])
def test_eval_centre_crop_without_resize_is_exact_indexing(h, w):
  image = noise(h, w)
  x = to_uint8(augment.eval_transform(image, image_size=224, resize_size=256, **RAW))
  top, left = (h - 224) // 2, (w - 224) // 2   # 16, 58 (or swapped)
  np.testing.assert_array_equal(x, image[top:top + 224, left:left + 224])


@pytest.mark.parametrize("h, w", [(600, 800), (800, 600)])
def test_eval_transform_is_shorter_side_resize_then_centre_crop(h, w):
  # R = linear in x, G = linear in y: a bilinear (antialiased) resize keeps a linear ramp
  # linear away from the borders, so every output pixel's value gives its source position.
  yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
  image = np.stack([xx * 255 / (w - 1), yy * 255 / (h - 1), np.full_like(xx, 77)], -1)
  image = np.rint(image).astype(np.uint8)
  x = augment.eval_transform(image, image_size=224, resize_size=256, **RAW) * 255
  # Hand computation: shorter side 600 -> 256, longer 800 -> round(800 * 256 / 600) = 341,
  # centre crop offset (341 - 224) // 2 = 58 along the long side, 16 along the short side.
  rw, rh = (341, 256) if w > h else (256, 341)
  left, top = (rw - 224) // 2, (rh - 224) // 2
  j = np.arange(224)
  src_x = (left + j + 0.5) * w / rw - 0.5   # pixel-centre mapping of the resize
  src_y = (top + j + 0.5) * h / rh - 0.5
  np.testing.assert_allclose(x[0, :, 0], src_x * 255 / (w - 1), atol=1.0)
  np.testing.assert_allclose(x[:, 0, 1], src_y * 255 / (h - 1), atol=1.0)
  np.testing.assert_allclose(x[..., 2], 77, atol=1e-4)
  # The same as the library's own two steps.
  resized = augment.resize_shorter(Image.fromarray(image), 256)
  assert resized.size == (rw, rh)
  np.testing.assert_array_equal(to_uint8(x / 255),
                                np.asarray(augment.center_crop(resized, 224)))


def test_resize_crop_is_a_window_of_the_resized_image_spread_over_it():
  h, w, s, r = 60, 80, 40, 45
  image = noise(h, w)
  rw = round(w * r / h)   # 60 -> 45, 80 -> 60
  resized = np.asarray(Image.fromarray(image).resize((rw, r), Image.BILINEAR))
  offsets = []
  for seed in range(60):
    x = to_uint8(augment.train_transform(image, np.random.default_rng(seed),
                                         augmentation="resize_crop", image_size=s,
                                         resize_size=r, flip=False, **RAW))
    found = find_window(resized, x)
    assert len(found) == 1, (seed, found)   # noise pixels are unique: one exact window
    offsets.append(found[0])
  tops, lefts = np.array(offsets).T
  assert tops.min() >= 0 and tops.max() <= r - s and lefts.max() <= rw - s
  # Uniform placement: both ends of the range are reached.
  assert lefts.min() <= 2 and lefts.max() >= rw - s - 2
  assert len(set(tops)) >= 4


def test_random_resized_crop_full_box_is_a_plain_resize():
  image = noise(30, 40)
  x = to_uint8(train(image, augmentation="random_resized_crop", scale=(1, 1),
                     ratio=(4 / 3, 4 / 3), flip=False, **RAW))
  expected = np.asarray(Image.fromarray(image).resize((24, 24), Image.BILINEAR))
  np.testing.assert_array_equal(x, expected)


def _box_within_rules(box, width, height, scale, ratio):
  left, top, w, h = box
  assert 0 <= left and 0 <= top and 0 < w and 0 < h
  assert left + w <= width and top + h <= height
  # w = round(sqrt(area * aspect)), h = round(sqrt(area / aspect)): allow the rounding.
  area = width * height
  assert (w - 0.5) * (h - 0.5) <= scale[1] * area * (1 + 1e-9)
  assert (w + 0.5) * (h + 0.5) >= scale[0] * area * (1 - 1e-9)
  assert (w - 0.5) / (h + 0.5) <= ratio[1] * (1 + 1e-9)
  assert (w + 0.5) / (h - 0.5) >= ratio[0] * (1 - 1e-9)


@pytest.mark.parametrize("width, height", [(500, 375), (375, 500), (224, 224)])
def test_random_resized_crop_box_follows_torchvision_rules(width, height):
  scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
  boxes = [augment.random_resized_crop_box(width, height, np.random.default_rng(seed),
                                           scale=scale, ratio=ratio) for seed in range(1500)]
  for box in boxes:
    _box_within_rules(box, width, height, scale, ratio)
  left, top, w, h = np.array(boxes, np.float64).T
  fraction, log_aspect = w * h / (width * height), np.log(w / h)
  # The draws cover the ranges (area U(scale), aspect log-uniform in ratio) ...
  assert fraction.min() < 0.1 and fraction.max() > 0.9
  assert log_aspect.min() < math.log(0.8) and log_aspect.max() > math.log(1.25)
  assert abs(np.median(log_aspect)) < 0.05
  # ... and the box is placed uniformly (it touches every side sometimes).
  assert np.any(left == 0) and np.any(top == 0)
  assert np.any(left + w == width) and np.any(top + h == height)


def test_random_resized_crop_box_narrow_ranges():
  for seed in range(50):
    box = augment.random_resized_crop_box(400, 300, np.random.default_rng(seed),
                                          scale=(0.25, 0.25), ratio=(1, 1))
    _box_within_rules(box, 400, 300, (0.25, 0.25), (1, 1))
    assert box[2:] in ((173, 173), (174, 174))   # sqrt(0.25 * 120000) = 173.2


@pytest.mark.parametrize("width, height, expected", [
    (600, 200, ((600 - 267) // 2, 0, 267, 200)),   # too wide: h = H, w = round(H * 4 / 3)
    (200, 600, (0, (600 - 267) // 2, 200, 267)),   # too tall: w = W, h = round(W / (3 / 4))
    (400, 350, (0, 0, 400, 350)),                  # aspect allowed: the whole image
])
def test_random_resized_crop_box_fallback_when_no_draw_fits(width, height, expected):
  # scale > 1 never fits, so after 10 draws torchvision takes the largest centred box of
  # allowed aspect.
  for seed in range(5):
    box = augment.random_resized_crop_box(width, height, np.random.default_rng(seed),
                                          scale=(2, 3))
    assert box == expected


def test_pad_crop_shifts_by_at_most_pad_and_pads_with_zeros():
  s, pad = 24, 4
  image = noise(s, s)
  image[image == 0] = 1   # no zero pixel in the content: zeros can only be padding
  padded = np.zeros((s + 2 * pad, s + 2 * pad, 3), np.uint8)
  padded[pad:pad + s, pad:pad + s] = image
  shifts, with_zeros = set(), 0
  for seed in range(150):
    x = to_uint8(train(image, seed=seed, augmentation="pad_crop", image_size=s, resize_size=s,
                       pad=pad, flip=False, **RAW))
    found = find_window(padded, x)
    assert len(found) == 1, seed
    top, left = found[0]
    shifts.add((top - pad, left - pad))
    with_zeros += bool(np.any(np.all(x == 0, axis=-1)))
  assert all(abs(dy) <= pad and abs(dx) <= pad for dy, dx in shifts)
  assert {dy for dy, _ in shifts} == set(range(-pad, pad + 1))
  assert with_zeros >= 100   # only shift (0, 0) has no border: 1/81 of the crops


def test_pad_crop_resizes_and_centre_crops_first():
  image = noise(40, 64)
  x = to_uint8(train(image, seed=0, augmentation="pad_crop", image_size=24, resize_size=24,
                     pad=0, flip=False, **RAW))
  expected = augment.center_crop(augment.resize_shorter(Image.fromarray(image), 24), 24)
  np.testing.assert_array_equal(x, np.asarray(expected))


@pytest.mark.parametrize("grey", [False, True])
def test_pad_crop_shifts_the_evaluation_image_in_a_pad_fill_border(grey):
  # The crop source is the evaluation image (resize_size, then the centre image_size), so
  # training and evaluation see one scale; the border is pad_fill (white drawings: 255).
  s, pad, fill = 20, 3, 255
  image = natural(40, 52, grey=grey)
  image = np.minimum(image, 254).astype(np.uint8)   # content never equals the fill
  channels = 1 if grey else 3
  evaluated = np.asarray(augment.eval_crop(image, image_size=s, resize_size=26,
                                           channels=channels)).reshape(s, s, channels)
  padded = np.full((s + 2 * pad, s + 2 * pad, channels), fill, np.uint8)
  padded[pad:pad + s, pad:pad + s] = evaluated
  bordered = 0
  for seed in range(40):
    x = to_uint8(train(image, seed=seed, augmentation="pad_crop", image_size=s, resize_size=26,
                       pad=pad, pad_fill=fill, flip=False, channels=channels, **RAW))
    assert len(find_window(padded, x.reshape(s, s, channels))) == 1, seed
    bordered += bool(np.any(np.all(x == fill, axis=-1)))
  assert bordered >= 30


def test_flip_half_the_time_and_never_when_off():
  image = noise(24, 24)   # resize_crop of a 24 x 24 image to 24: the crop is the image
  flips = 0
  for seed in range(400):
    x = to_uint8(train(image, seed=seed, augmentation="resize_crop", image_size=24,
                       resize_size=24, **RAW))
    if np.array_equal(x, image[:, ::-1]):
      flips += 1
    else:
      np.testing.assert_array_equal(x, image)
    x = to_uint8(train(image, seed=seed, augmentation="resize_crop", image_size=24,
                       resize_size=24, flip=False, **RAW))
    np.testing.assert_array_equal(x, image)
  assert 150 <= flips <= 250   # Binomial(400, 1/2): mean 200, sd 10


# ------------------------------------------------------------------------------------------
# JPEG draft decoding.


@pytest.mark.parametrize("channels", [3, 1])
def test_jpeg_draft_decoding_is_close_to_full_decoding(channels):
  image = natural(800, 1000)
  jpeg = encode(image, "JPEG", quality=90)
  # Draft: the shorter side 800 is >= 2 * 256, so Pillow decodes at scale 1/2.
  assert augment.load_image(jpeg, channels=channels, min_shorter_side=256).size == (500, 400)
  assert augment.load_image(jpeg, channels=channels).size == (1000, 800)
  assert augment.load_image(jpeg, channels=channels, min_shorter_side=500).size == (1000, 800)
  full = augment.decode(jpeg, channels=channels)   # full-size decode, no draft
  kwargs = dict(image_size=224, resize_size=256, channels=channels, **RAW)
  drafted = augment.eval_transform(jpeg, **kwargs) * 255
  reference = augment.eval_transform(full, **kwargs) * 255
  diff = np.abs(drafted - reference)
  # Stated tolerance: mean |diff| below 1.5 grey levels and max below 12 (measured: mean
  # ~0.45 / 0.37 levels, max 3 / 2 for RGB / grey).
  assert diff.mean() < 1.5 and diff.max() < 12


# ------------------------------------------------------------------------------------------
# Errors.


@pytest.mark.parametrize("kwargs, match", [
    (dict(augmentation="mixup"), "Unknown augmentation 'mixup'.*resize_crop"),
    (dict(augmentation="resize_crop", resize_size=20), r"resize_size \(20\).*image_size \(24\)"),
    (dict(augmentation="none", resize_size=20), r"resize_size \(20\)"),
    (dict(augmentation="resize_crop", channels=2), "channels must be 1 or 3, got 2"),
    (dict(augmentation="resize_crop", channels=4), "channels must be 1 or 3, got 4"),
    (dict(augmentation="resize_crop", image_size=0, resize_size=4), "image_size must be an int >= 1"),
    (dict(augmentation="resize_crop", std=(0.2, 0.0, 0.2)), "std must be positive"),
    (dict(augmentation="resize_crop", mean=(0.1, 0.2)), "mean must have 1 or channels=3"),
    (dict(augmentation="resize_crop", channels=1), "mean must have 1 or channels=1"),
    (dict(augmentation="pad_crop", pad=-1), "pad must be an int >= 0, got -1"),
    (dict(augmentation="pad_crop", pad_fill=256), r"pad_fill must be an int in \[0, 255\].*256"),
    (dict(augmentation="pad_crop", pad_fill=0.5), "pad_fill must be an int"),
])
def test_train_transform_option_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    train(noise(30, 30), **kwargs)


def test_eval_transform_option_errors():
  image = noise(30, 30)
  with pytest.raises(ValueError, match=r"resize_size \(16\) must be >= image_size \(24\)"):
    augment.eval_transform(image, image_size=24, resize_size=16)
  with pytest.raises(ValueError, match="channels must be 1 or 3"):
    augment.eval_transform(image, image_size=24, resize_size=24, channels=0)


def test_record_errors(tmp_path):
  jpeg = encode(natural(64, 64), "JPEG")
  with pytest.raises(ValueError, match=r"Cannot decode the image \(11 encoded bytes\)"):
    augment.decode(b"not a image")
  with pytest.raises(ValueError, match="(?i)Cannot decode the image.*truncated"):
    augment.decode(jpeg[:len(jpeg) // 2])
  with pytest.raises(ValueError, match="Cannot decode the image"):
    augment.eval_transform(b"\xff\xd8\xff" + b"\x00" * 50, image_size=8, resize_size=8)
  missing = tmp_path / "no_such_dir" / "bird_0001.jpg"
  with pytest.raises(ValueError, match=f"Cannot decode the image '{missing}'"):
    augment.decode(str(missing))
  with pytest.raises(ValueError, match="bird_0001.jpg"):
    train(missing, augmentation="resize_crop")
  bad = tmp_path / "bad.png"
  bad.write_bytes(b"\x89PNG garbage")
  with pytest.raises(ValueError, match="bad.png"):
    augment.decode(bad)
  with pytest.raises(ValueError, match="uint8, got float32"):
    augment.decode(np.zeros((4, 4, 3), np.float32))
  with pytest.raises(ValueError, match=r"got shape \(4, 4, 5\)"):
    augment.decode(np.zeros((4, 4, 5), np.uint8))
  with pytest.raises(ValueError, match=r"got shape \(4,\)"):
    augment.decode(np.zeros((4,), np.uint8))
  with pytest.raises(ValueError, match="encoded bytes or a file path, got int"):
    augment.decode(7)


def test_resize_and_centre_crop_round_as_torchvision():
  """torchvision: long side int(size * long / short) (truncated); crop offset round(d / 2)."""
  image = Image.new("RGB", (10, 7))
  assert augment.resize_shorter(image, 4).size == (5, 4)        # 5.71 -> 5 (not 6)
  assert augment.resize_shorter(Image.new("RGB", (7, 10)), 4).size == (4, 5)
  ramp = Image.fromarray(np.tile(np.arange(7, dtype=np.uint8) * 30, (4, 1)))
  cropped = np.asarray(augment.center_crop(ramp, 4))
  assert cropped[0, 0] == 2 * 30                                # offset round(1.5) = 2


@pytest.mark.parametrize("bad,match", [
    (dict(resize_size=28 * 8 / 7), r"resize_size must be an int >= 1, got 32.0"),
    (dict(image_size=28.0), r"image_size must be an int >= 1, got 28.0"),
    (dict(image_size=True), r"image_size must be an int >= 1, got True"),
    (dict(channels="1"), r"channels must be 1 or 3, got '1'")])
def test_sizes_that_are_not_ints_are_refused_when_the_options_are_made(bad, match):
  """``resize_size=image_size * 8 / 7`` is a float: refused at once, not as a TypeError on
  the first decoded image."""
  options = dict(image_size=28, resize_size=32, channels=3, mean=augment.IMAGENET_MEAN,
                 std=augment.IMAGENET_STD)
  with pytest.raises(ValueError, match=match):
    augment.check_options(**{**options, **bad})
