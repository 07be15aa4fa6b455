"""Crop windows cut on the host from the decoded-image cache, for ``device_augment``.

Each example's crop box (``augment.sample_crop``, in its crop source's pixels) is scaled to the
cached image and cut into a fixed ``[W, W, C]`` uint8 window (``'pad_crop'``'s ``pad_fill``
outside the image, else zeros):

* ``'resize_crop'``, ``'pad_crop'``, ``'none'``: the box is an integer ``image_size`` square of
  the cached crop source, so the window *is* the crop (``W = image_size``): a copy of exactly
  the output's bytes, the cheapest form to transfer; the device only flips and normalises;
* ``'random_resized_crop'``: the box has any size and aspect, so the window is the box's
  neighbourhood (every pixel the resampling filter reaches), placed at the window's corner;
  ``W`` (``window_size``) bounds the largest box the aspect range allows at the cached size,
  whatever the image's own aspect (a padded ``[N, H, W, C]`` cache would not be bounded so).

numpy only (no JAX import), like the rest of the host pipeline.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from dml_jax.data import augment


class DeviceInputs(NamedTuple):
  """A batch's host part, ``b`` rows (numpy on the host, ``jax.Array`` on the device).

  Attributes:
    windows: uint8 ``[b, W, W, C]``, each example's crop (or its neighbourhood).
    boxes: float32 ``[b, 4]``, ``(top, left, height, width)`` of the box in window pixels.
    valid: int32 ``[b, 2]``, the rows / columns of the window that hold image pixels.
    flips: bool ``[b]``.
  """

  windows: np.ndarray
  boxes: np.ndarray
  valid: np.ndarray
  flips: np.ndarray


def resamples(augmentation: str) -> bool:
  """Whether ``augmentation``'s boxes are resampled on the device (else they are crops)."""
  return augmentation == "random_resized_crop"


def window_size(augmentation: str, *, image_size: int, resize_size: int,
                ratio=(3 / 4, 4 / 3)) -> int:
  """``W``: ``image_size`` for the crop augmentations; for ``'random_resized_crop'`` the
  largest box side at the cached size (``resize_size * max(ratio[1], 1 / ratio[0])`` plus
  rounding) and the filter's reach on both sides."""
  if not resamples(augmentation):
    return int(image_size)
  side = resize_size * max(ratio[1], 1 / ratio[0]) + 2
  support = max(1.0, side / image_size)
  return int(math.ceil(side + 2 * support)) + 4


def _span(start: float, length: float, support: float, size: int, window: int):
  """The pixels ``[lo, hi)`` of an axis of ``size`` that a resampled box reaches."""
  lo = max(0, math.floor(start - support) - 1)
  hi = min(size, math.ceil(start + length + support) + 1, lo + window)
  return lo, hi


def cut_window(image: np.ndarray, source_hw, crop: augment.Crop, out: np.ndarray, *,
               resample: bool, image_size: int) -> tuple[tuple[float, ...], tuple[int, int]]:
  """Copies ``crop``'s window of one cached image into ``out`` (``[W, W, C]``, prefilled).

  Args:
    image: uint8 ``[h, w, C]``, the cached image.
    source_hw: ``(height, width)`` of its crop source (the box's pixels).
    crop: from ``augment.sample_crop``.
    out: the zeroed window, written in place.
    resample: ``resamples(augmentation)``.
    image_size: ``S``.

  Returns:
    ``((top, left, height, width) in window pixels, (valid rows, valid columns))``.
  """
  h, w = image.shape[:2]
  if not resample:   # an integer S x S box of the crop source itself (maybe into the padding)
    top, left = crop.top, crop.left
    y0, y1 = max(0, top), min(h, top + image_size)
    x0, x1 = max(0, left), min(w, left + image_size)
    if y1 > y0 and x1 > x0:
      out[y0 - top:y1 - top, x0 - left:x1 - left] = image[y0:y1, x0:x1]
    return (0.0, 0.0, float(image_size), float(image_size)), (image_size, image_size)
  sy, sx = h / source_hw[0], w / source_hw[1]
  top, left = crop.top * sy, crop.left * sx
  height, width = crop.height * sy, crop.width * sx
  window = out.shape[0]
  y0, y1 = _span(top, height, max(1.0, height / image_size), h, window)
  x0, x1 = _span(left, width, max(1.0, width / image_size), w, window)
  out[:y1 - y0, :x1 - x0] = image[y0:y1, x0:x1]
  return (top - y0, left - x0, height, width), (y1 - y0, x1 - x0)


def host_inputs(images, source_hw: np.ndarray, indices, crops, *, augmentation: str,
                image_size: int, resize_size: int, channels: int,
                pad_fill: int = 0) -> DeviceInputs:
  """The ``DeviceInputs`` of ``b`` examples.

  Args:
    images: the cache's uint8 ``[h_i, w_i, C]`` arrays (``DecodedCache.images``).
    source_hw: int ``[N, 2]`` (``DecodedCache.source_hw``).
    indices: int ``[b]``, the examples' positions in ``images``.
    crops: ``b`` ``augment.Crop`` (drawn for ``source_hw[indices]``).
    augmentation, image_size, resize_size, channels: the cache's spec.
    pad_fill: the value of ``'pad_crop'``'s padding (the windows' pixels outside the image).
  """
  resample = resamples(augmentation)
  window = window_size(augmentation, image_size=image_size, resize_size=resize_size)
  b = len(indices)
  fill = pad_fill if augmentation == "pad_crop" else 0   # resampling reads valid pixels only
  windows = np.full((b, window, window, channels), fill, np.uint8)
  boxes = np.zeros((b, 4), np.float32)
  valid = np.zeros((b, 2), np.int32)
  for k, (i, crop) in enumerate(zip(indices, crops)):
    boxes[k], valid[k] = cut_window(images[int(i)], source_hw[int(i)], crop, windows[k],
                                    resample=resample, image_size=image_size)
  return DeviceInputs(windows, boxes, valid, np.array([c.flip for c in crops], bool))
