"""Training augmentation on the device, from the decoded-image cache (``cache``).

The randomness stays on the host and is the host path's own: example ``(step, row)`` draws its
crop box and flip with ``augment.sample_crop`` from ``pipeline.example_rng(seed, step, row)``,
for the size of its crop source, exactly as ``augment.train_transform`` does. So the cached
path cuts the *same* boxes and flips as the streaming path, and a resumed run gets the batches
of an uninterrupted one.

Host (``crop_windows.host_inputs``, numpy): each example's box, scaled to the cached pixels,
is cut from its cached image into a fixed ``[W, W, C]`` uint8 window: the crop itself for
``'resize_crop'``, ``'pad_crop'`` and ``'none'``, the box's neighbourhood for
``'random_resized_crop'``.

Device (``augment``, jit-able, batch-parallel): for ``'random_resized_crop'`` the box is
resampled to ``image_size`` squared with Pillow's ``BILINEAR`` resize semantics (a triangle
filter widened by the down-scaling factor, i.e. antialiased; pixel centres at ``+0.5``;
weights over the image's pixels only, normalised) as two dense weight matrices per example,
``out = Wy @ window @ Wx^T``, rounded to uint8 levels as Pillow's output is; then the flip and
``(x / 255 - mean) / std``. The output is float32 ``[B, S, S, C]``, laid out and normalised as
the streaming path's.

Agreement with the streaming path: for the crop augmentations the pixels are the host's own
(the same Pillow calls built the cache), so the batches are equal to float rounding. For
``'random_resized_crop'`` they differ by the cache's resize (the box is resampled from the
image at shorter side ``resize_size`` instead of full resolution, so the small boxes of a larger
image are softer) and Pillow's fixed-point arithmetic: about 1 uint8 level from an image no
larger than ``resize_size``, a mean of a few levels and tens at edges from a larger one
(``tests/data/test_device_augment.py`` states the bounds, docs/datasets.md a measurement).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dml_jax.data import crop_windows
from dml_jax.data.crop_windows import DeviceInputs


def resample_weights(start, length, valid, *, out_size: int, in_size: int) -> jax.Array:
  """Pillow's bilinear resampling of one axis as a matrix: float32 ``[out_size, in_size]``.

  Output pixel ``i`` samples ``c_i = start + (i + 0.5) * length / out_size`` with the triangle
  filter of half-width ``s = max(1, length / out_size)``: weight ``max(0, 1 - |x + 0.5 - c_i|
  / s)`` for input pixels ``x < valid``, normalised to sum 1.
  """
  scale = length / out_size
  support = jnp.maximum(scale, 1.0)
  centres = start + (jnp.arange(out_size, dtype=jnp.float32) + 0.5) * scale
  x = jnp.arange(in_size, dtype=jnp.float32) + 0.5
  w = jnp.maximum(0.0, 1.0 - jnp.abs(x[None, :] - centres[:, None]) / support)
  w = jnp.where(jnp.arange(in_size)[None, :] < valid, w, 0.0)
  return w / jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1e-12)


def _resample_one(window, box, valid, *, out_size: int) -> jax.Array:
  """``[W, W, C]`` uint8 -> float32 ``[S, S, C]``: the box resized to ``S`` squared."""
  size = window.shape[0]
  wy = resample_weights(box[0], box[2], valid[0], out_size=out_size, in_size=size)
  wx = resample_weights(box[1], box[3], valid[1], out_size=out_size, in_size=size)
  out = jnp.einsum("sh,hwc,tw->stc", wy, window.astype(jnp.float32), wx,
                   precision=jax.lax.Precision.HIGHEST)
  return jnp.clip(jnp.round(out), 0.0, 255.0)


def augment(inputs: DeviceInputs, *, augmentation: str, image_size: int, mean, std
            ) -> jax.Array:
  """The batch of ``inputs`` as model input: float32 ``[B, S, S, C]``, normalised
  ``(x / 255 - mean) / std`` (jit-able; ``augmentation``, ``image_size``, ``mean``, ``std``
  static)."""
  windows, boxes, valid, flips = inputs
  if crop_windows.resamples(augmentation):
    x = jax.vmap(lambda w, b, v: _resample_one(w, b, v, out_size=image_size))(
        windows, boxes, valid)
  else:
    x = windows.astype(jnp.float32)
  x = jnp.where(flips[:, None, None, None], x[:, :, ::-1], x)
  x = x * np.float32(1.0 / 255.0)
  return (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)
