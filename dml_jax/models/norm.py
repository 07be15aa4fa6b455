"""Training-mode BatchNorm (optionally followed by ReLU) as one function with its own VJP.

``batch_norm(x, scale, bias, epsilon, relu) -> (y, mean, var)`` computes what
``nnx.BatchNorm`` computes from the batch statistics (``var = E[x^2] - E[x]^2`` clipped at 0,
flax's fast variance; ``y = (x - mean) rsqrt(var + eps) scale + bias``), then ``relu`` if asked.
Its VJP is the closed form

  ``g' = g [y > 0]`` (with ``relu``),  ``dbias = sum g'``,  ``dscale = sum g' xhat``,
  ``dx = scale rsqrt(var + eps) (g' - dbias / n - xhat dscale / n)``

(sums over the ``n`` positions of a channel, ``xhat = (x - mean) rsqrt(var + eps)``) plus the
statistics' own cotangents, which recompute ``xhat`` from ``x`` instead of letting XLA keep and
differentiate each intermediate of the chain: on this CPU the forward + backward of a
BatchNorm + ReLU at ``[8, 56, 56, 256]`` took 28.9 ms instead of nnx's 41.5, with 25 MB of
temporaries instead of 49 (``benchmarks/speed/conv_parts.py --batch_norm --batch=8 --size=224``).
The mask of ``relu`` comes from the output, which the next layer keeps anyway.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax


def check_batch_statistics(x: jax.Array, axis_name=None, axis_index_groups=None) -> None:
  """``ValueError`` when BatchNorm's batch statistics of ``x [..., C]`` would be over one
  value per channel (every axis but the last, times the devices of ``axis_name``): the mean is
  then that value, the variance 0 and the output the bias, the same for any input (torch
  raises "Expected more than 1 value per channel when training"). Shapes are static, so this
  is decided at trace time; under ``jax.jit`` with a sharded batch ``x`` is the global batch.
  """
  n = math.prod(x.shape[:-1])
  if n == 1 and axis_name is not None:
    if axis_index_groups is not None:
      return
    n *= jax.lax.axis_size(axis_name)
  if n != 1:
    return
  where = f"batch {x.shape[0]}" + (
      f", feature map {' x '.join(map(str, x.shape[1:-1]))}" if x.ndim > 2 else "")
  raise ValueError(
      f"BatchNorm with batch statistics (train mode) got one value per channel: input shape "
      f"{tuple(x.shape)} ({where}); its output would be its bias whatever the image. Use "
      "batches of 2 or more images (or images large enough for a feature map larger than "
      "1 x 1), or the running averages (model.eval() or bn_mode='frozen').")


def _stats(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean and (biased, fast) variance over every axis but the last: ``[..., C]`` -> 2 x ``[C]``."""
  axes = tuple(range(x.ndim - 1))
  mean = jnp.mean(x, axes)
  return mean, jnp.maximum(0.0, jnp.mean(jnp.square(x), axes) - jnp.square(mean))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def batch_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, epsilon: float,
               relu: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
  """BatchNorm of ``x [..., C]`` with the batch statistics, then ReLU if ``relu``.

  Args:
    x: float32 ``[..., C]``; the statistics are over every axis but the last.
    scale: float32 ``[C]``.
    bias: float32 ``[C]``.
    epsilon: added to the variance.
    relu: apply ``max(y, 0)`` to the result.

  Returns:
    ``(y [..., C], mean [C], var [C])``: the statistics for the running averages.
  """
  return _forward(x, scale, bias, epsilon, relu)[0]


def _forward(x, scale, bias, epsilon, relu):
  mean, var = _stats(x)
  y = (x - mean) * (lax.rsqrt(var + epsilon) * scale) + bias
  if relu:
    y = jnp.maximum(y, 0.0)
  return (y, mean, var), (x, y if relu else None, mean, var, scale)


def _backward(epsilon, relu, residuals, cotangents):
  x, y, mean, var, scale = residuals
  g, g_mean, g_var = cotangents
  if relu:
    g = jnp.where(y > 0.0, g, 0.0)
  axes = tuple(range(x.ndim - 1))
  n = x.size // x.shape[-1]
  inv = lax.rsqrt(var + epsilon)
  xhat = (x - mean) * inv
  dbias = jnp.sum(g, axes)
  dscale = jnp.sum(g * xhat, axes)
  dx = (scale * inv) * (g - dbias / n - xhat * (dscale / n))
  # the statistics as outputs (d mean / dx = 1 / n, d var / dx = 2 (x - mean) / n)
  dx = dx + (g_mean + 2.0 * g_var * (x - mean)) / n
  return dx, dscale, dbias


batch_norm.defvjp(_forward, _backward)
