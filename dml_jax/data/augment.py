"""Image decoding and augmentation on the host (numpy + Pillow), one example at a time.

Every function takes one *record* and returns one float32 image ``[S, S, C]`` normalised
with ``(x / 255 - mean) / std``. A record is what a dataset stores per example:

* a uint8 array ``[H, W, C]`` or ``[H, W]`` (a TFDS ``data_source`` decodes images),
* encoded bytes (JPEG / PNG / ...),
* a file path (``str`` or ``os.PathLike``; image-list datasets).

Training augmentations (``AUGMENTATIONS``), all followed by an optional horizontal flip:

* ``'resize_crop'`` (EPHN / 2nd-order papers): resize the shorter side to ``resize_size``
  (256), random crop ``image_size`` (224).
* ``'random_resized_crop'`` (MS / DRO / Roth et al.): torchvision's RandomResizedCrop --
  a crop of area fraction ``U(scale)`` and log-uniform aspect ratio in ``ratio`` (10 tries,
  then the largest centred crop of allowed aspect), resized to ``image_size`` squared.
* ``'pad_crop'`` (small images, e.g. Omniglot / MNIST): the evaluation image (shorter side
  resized to ``resize_size``, centre crop ``image_size``), padded by ``pad`` pixels of the value
  ``pad_fill`` on each side (0, black, for MNIST; 255, white, for Omniglot's drawings), random
  crop ``image_size``: a random shift of the evaluation image by up to ``pad`` pixels.
* ``'none'``: the evaluation transform.

Evaluation (``eval_transform``): resize the shorter side to ``resize_size`` and centre crop
``image_size`` (with ``resize_size == image_size`` this is a shorter-side resize and a
centre crop of the longer side).

Randomness comes only from the ``numpy.random.Generator`` passed in; the pipeline derives it
from ``(seed, step, row)``, so an augmented batch is reproducible and independent of the
number of workers. ``sample_crop`` makes every draw (the crop box in the pixels of
``crop_source``, then the flip); the cached path (``cache``, ``device_augment``) calls it with
the same generator, so both paths cut the same boxes. Resizing is bilinear with antialiasing (Pillow), like torchvision on PIL
images. JPEG bytes are decoded with Pillow's ``draft`` mode at the smallest DCT scale that
still leaves the shorter side at least as large as the resize target, which is where most of
the decode time goes.
"""

from __future__ import annotations

import io
import math
import os
from typing import NamedTuple

import numpy as np
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUGMENTATIONS = ("resize_crop", "random_resized_crop", "pad_crop", "none")
_MODES = {1: "L", 3: "RGB"}


def check_options(*, augmentation: str = "none", image_size: int, resize_size: int,
                  channels: int, mean, std, pad: int = 0, pad_fill: int = 0) -> None:
  """Validates the transform options; raises ``ValueError`` naming the bad value."""
  if not isinstance(pad, (int, np.integer)) or isinstance(pad, bool) or pad < 0:
    raise ValueError(f"pad must be an int >= 0, got {pad!r}.")
  if (not isinstance(pad_fill, (int, np.integer)) or isinstance(pad_fill, bool)
      or not 0 <= pad_fill <= 255):
    raise ValueError(f"pad_fill must be an int in [0, 255] (the padding's pixel value), got "
                     f"{pad_fill!r}.")
  if augmentation not in AUGMENTATIONS:
    raise ValueError(f"Unknown augmentation {augmentation!r}; valid: {', '.join(AUGMENTATIONS)}.")
  for what, size in (("image_size", image_size), ("resize_size", resize_size)):
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
      raise ValueError(f"{what} must be an int >= 1, got {size!r}.")
  if resize_size < image_size:
    raise ValueError(f"resize_size ({resize_size}) must be >= image_size ({image_size}): the "
                     "crop is taken from the resized image.")
  if channels not in _MODES:
    raise ValueError(f"channels must be 1 or 3, got {channels!r}.")
  for what, values in (("mean", mean), ("std", std)):
    if len(values) not in (1, channels):
      raise ValueError(f"{what} must have 1 or channels={channels} values, got {tuple(values)}.")
  if min(std) <= 0:
    raise ValueError(f"std must be positive, got {tuple(std)}.")


def load_image(record, *, channels: int, min_shorter_side: int = 0) -> Image.Image:
  """Opens one record as a Pillow image of mode ``'RGB'`` (channels 3) or ``'L'`` (1).

  For JPEG bytes or files, ``min_shorter_side > 0`` lets Pillow decode at a reduced DCT scale
  whose shorter side is still at least ``min_shorter_side``.

  Raises:
    ValueError: the record cannot be decoded (message names the file for paths).
  """
  if channels not in _MODES:
    raise ValueError(f"channels must be 1 or 3, got {channels}.")
  mode = _MODES[channels]
  if isinstance(record, np.ndarray):
    array = record
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[-1] in (1, 2, 3, 4))):
      raise ValueError(f"Image arrays must be [H, W] or [H, W, C] with C in 1..4, got shape "
                       f"{array.shape}.")
    if array.ndim == 3 and array.shape[-1] == 1:
      array = array[..., 0]
    if array.dtype != np.uint8:
      raise ValueError(f"Image arrays must be uint8, got {array.dtype}.")
    image = Image.fromarray(array)
  else:
    source = record
    if isinstance(record, (bytes, bytearray, memoryview)):
      source = io.BytesIO(bytes(record))
    elif not isinstance(record, (str, os.PathLike)):
      raise ValueError(f"An image record must be a uint8 array, encoded bytes or a file path, "
                       f"got {type(record).__name__}.")
    image = None
    try:
      image = Image.open(source)
      if min_shorter_side > 0 and image.format == "JPEG":
        w, h = image.size
        scale = min(w, h) / min_shorter_side
        if scale >= 2:  # draft keeps both sides >= the requested size
          image.draft(mode, (math.ceil(w / scale), math.ceil(h / scale)))
      image.load()
    except (OSError, SyntaxError) as e:
      if image is not None:
        image.close()  # a file Pillow opened stays open when load() fails
      if isinstance(record, (str, os.PathLike)):
        where = f" {os.fspath(record)!r}"
      else:
        where = f" ({len(bytes(record))} encoded bytes)"
      raise ValueError(f"Cannot decode the image{where}: {e}") from e
  if image.mode != mode:
    image = image.convert(mode)
  return image


def decode(record, *, channels: int = 3) -> np.ndarray:
  """One record -> uint8 ``[H, W, channels]`` (no resizing)."""
  array = np.asarray(load_image(record, channels=channels))
  return array[..., None] if array.ndim == 2 else array


def resize_shorter(image: Image.Image, size: int) -> Image.Image:
  """Resizes so the shorter side is ``size`` (aspect ratio kept, bilinear, antialiased).

  The longer side is ``int(long * size / short)`` (truncated), as torchvision's ``Resize``.
  """
  w, h = image.size
  if min(w, h) == size:
    return image
  if w <= h:
    new = (size, max(1, int(size * h / w)))
  else:
    new = (max(1, int(size * w / h)), size)
  return image.resize(new, Image.BILINEAR)


def center_crop(image: Image.Image, size: int) -> Image.Image:
  """Centre crop ``size x size`` (the image's shorter side must be >= ``size``); offsets
  ``round((side - size) / 2)`` as torchvision's ``CenterCrop``."""
  w, h = image.size
  left, top = int(round((w - size) / 2.0)), int(round((h - size) / 2.0))
  return image.crop((left, top, left + size, top + size))


def random_crop(image: Image.Image, size: int, rng: np.random.Generator) -> Image.Image:
  """Uniformly placed ``size x size`` crop (the image's shorter side must be >= ``size``)."""
  w, h = image.size
  left = int(rng.integers(0, w - size + 1))
  top = int(rng.integers(0, h - size + 1))
  return image.crop((left, top, left + size, top + size))


def random_resized_crop_box(width: int, height: int, rng: np.random.Generator, *,
                            scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
  """torchvision's RandomResizedCrop box ``(left, top, w, h)`` for a ``width x height`` image.

  Up to 10 draws of area ``width * height * U(scale)`` and aspect ``exp(U(log ratio))``;
  the first that fits is placed uniformly. Otherwise the largest centred box whose aspect
  is clipped to ``ratio``.
  """
  area = width * height
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target = area * rng.uniform(scale[0], scale[1])
    aspect = math.exp(rng.uniform(*log_ratio))
    w = int(round(math.sqrt(target * aspect)))
    h = int(round(math.sqrt(target / aspect)))
    if 0 < w <= width and 0 < h <= height:
      left = int(rng.integers(0, width - w + 1))
      top = int(rng.integers(0, height - h + 1))
      return left, top, w, h
  in_ratio = width / height
  if in_ratio < ratio[0]:
    w, h = width, int(round(width / ratio[0]))
  elif in_ratio > ratio[1]:
    w, h = int(round(height * ratio[1])), height
  else:
    w, h = width, height
  return (width - w) // 2, (height - h) // 2, w, h


def normalize(image: Image.Image, *, mean, std) -> np.ndarray:
  """Pillow image -> float32 ``[H, W, C]`` with ``(x / 255 - mean) / std``
  (``normalize_pixels``)."""
  x = np.asarray(image)
  return normalize_pixels(x[..., None] if x.ndim == 2 else x, mean=mean, std=std)


def normalize_pixels(pixels: np.ndarray, *, mean, std,
                     out: np.ndarray | None = None) -> np.ndarray:
  """uint8 ``[..., C]`` -> float32 ``[..., C]`` with ``(x / 255 - mean) / std``.

  The one order of float32 operations of every model input (elementwise: the same values
  for one image or a batch, the evaluation cache's pixels or a decoded record). ``out``: a
  float32 array of the same shape to write into (returned).
  """
  if out is None:
    x = np.array(pixels, dtype=np.float32)
  else:
    x = out
    x[...] = pixels
  x *= 1.0 / 255.0
  x -= np.asarray(mean, np.float32)
  x /= np.asarray(std, np.float32)
  return x


def eval_crop(record, *, image_size: int, resize_size: int, channels: int = 3) -> Image.Image:
  """The pixels of ``eval_transform`` before normalising: shorter side resized to
  ``resize_size``, centre crop ``image_size`` (``image_size`` squared, mode ``'RGB'`` or
  ``'L'``)."""
  image = load_image(record, channels=channels, min_shorter_side=resize_size)
  return center_crop(resize_shorter(image, resize_size), image_size)


def eval_transform(record, *, image_size: int, resize_size: int, channels: int = 3,
                   mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
  """Resize shorter side to ``resize_size``, centre crop ``image_size``, normalise
  (``eval_crop``, ``normalize``).

  Returns:
    float32 ``[image_size, image_size, channels]``.

  Raises:
    ValueError: bad options (``check_options``) or an undecodable record.
  """
  check_options(image_size=image_size, resize_size=resize_size, channels=channels, mean=mean,
                std=std)
  image = eval_crop(record, image_size=image_size, resize_size=resize_size, channels=channels)
  return normalize(image, mean=mean, std=std)


class Crop(NamedTuple):
  """One training example's random parameters: the box ``(left, top, width, height)`` in the
  pixels of its crop source (``crop_source``; ``'pad_crop'`` boxes may reach ``pad`` pixels
  outside it, into the padding) and whether the crop is flipped horizontally."""

  left: int
  top: int
  width: int
  height: int
  flip: bool


def crop_source(record, *, augmentation: str, image_size: int, resize_size: int,
                channels: int = 3) -> Image.Image:
  """The image a training crop is cut from (its size is what ``sample_crop`` draws for).

  * ``'resize_crop'``, ``'none'``: shorter side resized to ``resize_size`` (JPEG draft);
  * ``'pad_crop'``: the evaluation image (``eval_crop``: shorter side resized to
    ``resize_size``, centre crop ``image_size`` squared);
  * ``'random_resized_crop'``: the record at full resolution.
  """
  if augmentation in ("resize_crop", "none"):
    image = load_image(record, channels=channels, min_shorter_side=resize_size)
    return resize_shorter(image, resize_size)
  if augmentation == "pad_crop":
    return eval_crop(record, image_size=image_size, resize_size=resize_size, channels=channels)
  if augmentation == "random_resized_crop":
    return load_image(record, channels=channels)
  raise ValueError(f"Unknown augmentation {augmentation!r}; valid: {', '.join(AUGMENTATIONS)}.")


def sample_crop(augmentation: str, rng: np.random.Generator, size: tuple[int, int], *,
                image_size: int, flip: bool = True, pad: int = 10, scale=(0.08, 1.0),
                ratio=(3 / 4, 4 / 3)) -> Crop:
  """Draws an example's crop box and flip from ``rng``, for a crop source of ``size``
  ``(width, height)``: the only randomness of ``train_transform`` (and of the cached path,
  which calls it with the same generator, so both cut the same boxes).

  Draws, in order: ``'resize_crop'`` left then top of an ``image_size`` square (uniform);
  ``'pad_crop'`` the same on the source padded by ``pad`` (the box is returned in the
  unpadded source's pixels, ``-pad .. pad``); ``'random_resized_crop'``
  ``random_resized_crop_box``; ``'none'`` nothing (the centre crop, never flipped); then,
  with ``flip``, one ``rng.random() < 0.5``.
  """
  w, h = size
  s = image_size
  if augmentation == "none":
    return Crop(int(round((w - s) / 2.0)), int(round((h - s) / 2.0)), s, s, False)
  if augmentation == "resize_crop":
    left, top = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
    box = (left, top, s, s)
  elif augmentation == "pad_crop":
    left = int(rng.integers(0, w + 2 * pad - s + 1))
    top = int(rng.integers(0, h + 2 * pad - s + 1))
    box = (left - pad, top - pad, s, s)
  elif augmentation == "random_resized_crop":
    box = random_resized_crop_box(w, h, rng, scale=scale, ratio=ratio)
  else:
    raise ValueError(f"Unknown augmentation {augmentation!r}; valid: {', '.join(AUGMENTATIONS)}.")
  return Crop(*box, bool(flip and rng.random() < 0.5))


def train_transform(record, rng: np.random.Generator, *, augmentation: str, image_size: int,
                    resize_size: int, channels: int = 3, mean=IMAGENET_MEAN,
                    std=IMAGENET_STD, flip: bool = True, pad: int = 10, pad_fill: int = 0,
                    scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> np.ndarray:
  """One training augmentation (see the module docstring), then normalisation.

  Args:
    record: uint8 array, encoded bytes or a file path.
    rng: the example's generator (the only source of randomness).
    augmentation: one of ``AUGMENTATIONS``.
    image_size: output side ``S``.
    resize_size: shorter side before the crop (all but ``'random_resized_crop'``).
    channels: 3 (RGB) or 1 (grey).
    mean, std: per-channel normalisation (1 or ``channels`` values).
    flip: horizontal flip with probability 1/2 (off for characters / digits).
    pad: ``'pad_crop'``'s padding, pixels on each side.
    pad_fill: the padding's value in [0, 255], on every channel (the background: 0 black,
      255 white).
    scale, ratio: RandomResizedCrop's area fraction and aspect ranges.

  Returns:
    float32 ``[image_size, image_size, channels]``.

  Raises:
    ValueError: bad options (``check_options``) or an undecodable record.
  """
  check_options(augmentation=augmentation, image_size=image_size, resize_size=resize_size,
                channels=channels, mean=mean, std=std, pad=pad, pad_fill=pad_fill)
  if augmentation == "none":
    return eval_transform(record, image_size=image_size, resize_size=resize_size,
                          channels=channels, mean=mean, std=std)
  image = crop_source(record, augmentation=augmentation, image_size=image_size,
                      resize_size=resize_size, channels=channels)
  crop = sample_crop(augmentation, rng, image.size, image_size=image_size, flip=flip, pad=pad,
                     scale=scale, ratio=ratio)
  box = (crop.left, crop.top, crop.left + crop.width, crop.top + crop.height)
  if augmentation == "random_resized_crop":
    image = image.resize((image_size, image_size), Image.BILINEAR, box=box)
  elif augmentation == "pad_crop":
    fill = int(pad_fill) if image.mode == "L" else (int(pad_fill),) * 3
    padded = Image.new(image.mode, (image_size + 2 * pad, image_size + 2 * pad), fill)
    padded.paste(image, (pad, pad))
    image = padded.crop(tuple(b + pad for b in box))
  else:
    image = image.crop(box)
  if crop.flip:
    image = image.transpose(Image.FLIP_LEFT_RIGHT)
  return normalize(image, mean=mean, std=std)
