"""Max- and average-pooling as elementwise maxima / sums of shifted slices (``conv.window_taps``),
beside flax's ``lax.reduce_window`` pooling; chosen by the same ``impl`` as the convolutions.

XLA:CPU runs ``reduce_window`` and max-pool's gradient (``select_and_scatter_add``) as slow
generic loops; the slice forms are elementwise fusions. With the taps ``T_t`` of the input
padded with ``-inf`` (max) or 0 (average):

  * ``max_pool``: ``y = max_t T_t``; the gradient goes, per window, to the **first** tap (in
    row-major window order) that equals the maximum, padding included, exactly as
    ``select_and_scatter_add`` with ``ge`` (what ``jax.grad`` of ``reduce_window`` max does):
    equal values, ties included.
  * ``avg_pool``: ``y = (sum_t T_t) / n`` with ``n`` the window size (``count_include_pad``)
    or the number of non-padding taps; equal to float32 rounding (another summation order).

``impl`` (the convolutions' option, ``conv.CONV_IMPLS``): ``'lax'`` is always
``reduce_window`` (``flax.nnx.max_pool`` / ``avg_pool``). Every other ``impl`` max-pools by
slices, on every platform. Average-pooling is by slices with ``'matmul'``, and with
``'auto'`` where lowered for the CPU; by ``reduce_window`` otherwise.

Max-pooling by slices on a GPU too: XLA:GPU lowers ``select_and_scatter_add`` to a
``reduce_window`` that writes four int32 index arrays of the output's size, and a scatter
into a zeroed, padded copy of the input. The slice form keeps one int8 array (the first
maximal tap), and its backward fuses into the consumer of ``dx``. In ResNet-50's bf16
training step (224 px, batch 256), compiled for an H200, the kernels read and write 3.9 GB
less per step: 96.3 GB instead of 100.1 (``benchmarks/speed/train_throughput.py
--gpu_target=h200``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from dml_jax.models import conv


def _taps(x, window, strides, padding, pad_value):
  return conv.window_taps(x, window, strides=strides, padding=padding, pad_value=pad_value)


def _max_and_first_argmax(taps: list[jax.Array]) -> tuple[jax.Array, jax.Array]:
  """``y = max_t T_t`` and the first ``t`` with ``T_t = y`` (``K`` where none is, e.g. NaN)."""
  y = functools.reduce(jnp.maximum, taps)
  first = jnp.full(y.shape, len(taps), jnp.int8 if len(taps) < 127 else jnp.int32)
  for t in reversed(range(len(taps))):
    first = jnp.where(taps[t] == y, jnp.asarray(t, first.dtype), first)
  return y, first


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def max_pool_slices(x: jax.Array, window: tuple[int, ...], strides: tuple[int, ...],
                    padding) -> jax.Array:
  """``y[b, o, c] = max_t T_t[b, o, c]`` over the ``-inf``-padded taps: ``[B, *S, C] ->
  [B, *S', C]``; gradient to the first maximal tap of each window (see the module docstring).

  ``padding``: ``'SAME'``, ``'VALID'`` or a tuple of ``(low, high)`` pairs (hashable).
  """
  return functools.reduce(jnp.maximum, _taps(x, window, strides, padding, -jnp.inf))


def _max_pool_fwd(x, window, strides, padding):
  y, first = _max_and_first_argmax(_taps(x, window, strides, padding, -jnp.inf))
  return y, (x, first)  # x only for its shape: the backward reads first and g


def _max_pool_bwd(window, strides, padding, residuals, g):
  """``dx = sum_t S_t^T [first = t] g`` with ``S_t^T`` the transpose of taking tap ``t``."""
  x, first = residuals
  zero = jnp.zeros((), g.dtype)
  cotangents = [jnp.where(first == t, g, zero) for t in range(int(np.prod(window)))]
  take_taps = jax.linear_transpose(lambda v: _taps(v, window, strides, padding, 0.0),
                                   jax.ShapeDtypeStruct(x.shape, x.dtype))
  return take_taps(cotangents)


max_pool_slices.defvjp(_max_pool_fwd, _max_pool_bwd)


def avg_pool_slices(x: jax.Array, window: Sequence[int], strides: Sequence[int], padding, *,
                    count_include_pad: bool = True) -> jax.Array:
  """``y = (sum_t T_t) / n`` over the zero-padded taps, ``[B, *S, C] -> [B, *S', C]``; ``n`` the
  window size, or (``count_include_pad=False``) the number of taps inside the input."""
  taps = _taps(x, window, strides, padding, 0.0)
  total = functools.reduce(jnp.add, taps)
  if count_include_pad:
    return total / np.prod(window)
  with jax.ensure_compile_time_eval():  # a constant [1, *S', 1]
    ones = jnp.ones((1, *x.shape[1:-1], 1), total.dtype)
    counts = functools.reduce(jnp.add, _taps(ones, window, strides, padding, 0.0))
  return total / counts


def _canonical(window, strides, padding):
  window = tuple(int(k) for k in window)
  strides = tuple(int(s) for s in (strides or (1,) * len(window)))
  if not isinstance(padding, str):
    padding = tuple((int(lo), int(hi)) for lo, hi in padding)
  return window, strides, padding


def max_pool(x: jax.Array, window: Sequence[int], strides: Sequence[int] | None = None,
             padding="VALID", *, impl: str = "auto") -> jax.Array:
  """Max-pooling ``[B, *S, C] -> [B, *S', C]`` (``-inf`` padding), as ``flax.nnx.max_pool``.

  ``impl``: one of ``conv.CONV_IMPLS`` (see the module docstring).
  """
  conv.conv_function(impl)  # validates impl
  window, strides, padding = _canonical(window, strides, padding)
  slices = functools.partial(max_pool_slices, window=window, strides=strides, padding=padding)
  reference = functools.partial(nnx.max_pool, window_shape=window, strides=strides,
                                padding=padding)
  return reference(x) if impl == "lax" else slices(x)


def avg_pool(x: jax.Array, window: Sequence[int], strides: Sequence[int] | None = None,
             padding="VALID", *, count_include_pad: bool = True,
             impl: str = "auto") -> jax.Array:
  """Average-pooling ``[B, *S, C] -> [B, *S', C]``, as ``flax.nnx.avg_pool``.

  ``impl``: one of ``conv.CONV_IMPLS`` (see the module docstring).
  """
  conv.conv_function(impl)
  window, strides, padding = _canonical(window, strides, padding)
  slices = functools.partial(avg_pool_slices, window=window, strides=strides, padding=padding,
                             count_include_pad=count_include_pad)
  reference = functools.partial(nnx.avg_pool, window_shape=window, strides=strides,
                                padding=padding, count_include_pad=count_include_pad)
  if impl in ("lax", "lax_aligned"):
    return reference(x)
  if impl == "matmul":
    return slices(x)
  return lax.platform_dependent(x, cpu=slices, default=reference)
