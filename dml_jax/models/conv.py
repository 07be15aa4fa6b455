"""Convolutions for the backbones: XLA's ``lax.conv_general_dilated`` or an exact im2col
formulation (shifted slices of the padded input, concatenated, times one matmul) that
XLA:CPU runs several times faster, forward and backward.

Why: XLA:CPU's convolution, and above all its gradient (a convolution again), is slow; a
matmul is not. With ``K = kh kw`` kernel taps, the patches of the padded input ``x_p``
(``[B, H_p, W_p, C]``) are

  ``P[b, i, j, (t, c)] = x_p[b, s i + d u_t, s j + d v_t, c]``     ``[B, H', W', K C]``

(``(u_t, v_t)`` the t-th tap, ``s`` the stride, ``d`` the kernel dilation), and the output is
one matmul ``y = P W`` with the kernel ``W [kh, kw, C, O]`` read as ``[K C, O]``. Its
gradient is again a matmul plus shifted slices (``dW = P^T dy``; ``dx`` adds the ``K`` shifted
slices of ``dy W^T``), all of which XLA:CPU runs at matmul speed. The sums are the same as the
convolution's, in another order: equal to float32 rounding.

``impl`` (the models' ``conv_impl``):
  * ``'auto'`` (default): the matmul form where the computation is lowered for the CPU, XLA's
    convolution elsewhere (cuDNN on GPU, the TPU compiler), chosen per lowering platform by
    ``lax.platform_dependent`` (not by the default backend of the process).
  * ``'lax'``: always ``lax.conv_general_dilated``.
  * ``'matmul'``: always the matmul form.

Every function here has ``lax.conv_general_dilated``'s signature, so it is passed to
``nnx.Conv(conv_general_dilated=...)``: parameter names, shapes and initialisation are
nnx.Conv's, whatever the implementation.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

CONV_IMPLS = ("auto", "lax", "matmul")


def _pads(padding, in_spatial: Sequence[int], window: Sequence[int],
          strides: Sequence[int]) -> list[tuple[int, int]]:
  """Explicit ``(low, high)`` pads per spatial axis from ``'SAME'`` / ``'VALID'`` / pairs."""
  if isinstance(padding, str):
    return [tuple(p) for p in lax.padtype_to_pads(in_spatial, window, strides, padding)]
  pads = [tuple(int(v) for v in p) for p in padding]
  if len(pads) != len(in_spatial) or any(len(p) != 2 for p in pads):
    raise ValueError(f"padding={padding!r} must be 'SAME', 'VALID' or one (low, high) pair "
                     f"per spatial axis ({len(in_spatial)}).")
  return pads


def window_taps(x: jax.Array, window: Sequence[int], *, strides: Sequence[int], padding,
                lhs_dilation: Sequence[int] | None = None,
                rhs_dilation: Sequence[int] | None = None, pad_value=0.0) -> list[jax.Array]:
  """The ``K = prod(window)`` shifted, strided slices of the padded input, ``[B, *S', C]`` each.

  ``T_t[b, o, c] = x_p[b, s o + d u_t, c]`` where ``x_p`` is ``x [B, *S, C]`` dilated by
  ``lhs_dilation`` (zeros between pixels) and padded with ``pad_value``, ``u_t`` the t-th
  window offset in row-major order, ``s`` the strides and ``d`` the window (kernel)
  dilation; ``S' = floor((S_p - d (k - 1) - 1) / s) + 1`` as for ``lax.conv``.
  """
  nd = len(window)
  lhs_dilation = tuple(lhs_dilation or (1,) * nd)
  rhs_dilation = tuple(rhs_dilation or (1,) * nd)
  strides = tuple(strides)
  dilated_in = [(n - 1) * d + 1 if n else 0 for n, d in zip(x.shape[1:-1], lhs_dilation)]
  dilated_window = [(k - 1) * d + 1 for k, d in zip(window, rhs_dilation)]
  pads = _pads(padding, dilated_in, dilated_window, strides)
  config = [(0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in zip(pads, lhs_dilation)]
  config.append((0, 0, 0))
  if any(c != (0, 0, 0) for c in config):
    x = lax.pad(x, jnp.asarray(pad_value, x.dtype), config)
  out = [(n - k) // s + 1 for n, k, s in zip(x.shape[1:-1], dilated_window, strides)]
  if min(out) < 1:
    raise ValueError(f"window {tuple(window)} (dilated {tuple(dilated_window)}) is larger "
                     f"than the padded input {tuple(x.shape[1:-1])}.")
  taps = []
  for tap in itertools.product(*(range(k) for k in window)):
    start = [u * d for u, d in zip(tap, rhs_dilation)]
    limit = [a + (o - 1) * s + 1 for a, o, s in zip(start, out, strides)]
    if not any(start) and tuple(limit) == x.shape[1:-1] and set(strides) <= {1}:
      taps.append(x)  # the whole input (a 1x1 window, stride 1, no padding)
      continue
    taps.append(lax.slice(x, (0, *start, 0), (x.shape[0], *limit, x.shape[-1]),
                          (1, *strides, 1)))
  return taps


def patches(x: jax.Array, window: Sequence[int], *, strides: Sequence[int], padding,
            lhs_dilation: Sequence[int] | None = None,
            rhs_dilation: Sequence[int] | None = None) -> jax.Array:
  """im2col by shifted slices: ``[B, *S, C] -> [B, *S', K C]`` (channels-last, taps major).

  ``P[b, o, (t, c)] = T_t[b, o, c]`` for the taps ``T_t`` of ``window_taps`` (zero padding).
  For a 1x1 window with stride 1 and no padding this is ``x`` itself.
  """
  taps = window_taps(x, window, strides=strides, padding=padding, lhs_dilation=lhs_dilation,
                     rhs_dilation=rhs_dilation)
  return taps[0] if len(taps) == 1 else jnp.concatenate(taps, axis=-1)


def _to_channels_last(dimension_numbers, lhs_shape, rhs_shape):
  """Permutations to ``[B, *S, C]`` / ``[*k, I, O]`` / from ``[B, *S, O]`` (None: identity)."""
  dn = lax.conv_dimension_numbers(lhs_shape, rhs_shape, dimension_numbers)
  lhs_perm = (dn.lhs_spec[0], *dn.lhs_spec[2:], dn.lhs_spec[1])
  rhs_perm = (*dn.rhs_spec[2:], dn.rhs_spec[1], dn.rhs_spec[0])
  out_nhwc = (dn.out_spec[0], *dn.out_spec[2:], dn.out_spec[1])
  out_perm = tuple(out_nhwc.index(i) for i in range(len(out_nhwc)))
  identity = tuple(range(len(lhs_shape)))
  return tuple(None if p == identity else p for p in (lhs_perm, rhs_perm, out_perm))


def conv_matmul(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding,
                lhs_dilation: Sequence[int] | None = None,
                rhs_dilation: Sequence[int] | None = None, dimension_numbers=None,
                feature_group_count: int = 1, batch_group_count: int = 1, precision=None,
                preferred_element_type=None, out_sharding=None) -> jax.Array:
  """``lax.conv_general_dilated`` as im2col (``patches``) times one matmul; same arguments,
  same result up to float32 rounding.

  With ``G = feature_group_count`` groups the input channels ``C = G C_g`` and outputs
  ``O = G O_g`` split into groups and ``y_g = P_g W_g`` per group (one batched matmul;
  depthwise is ``C_g = 1``). ``batch_group_count > 1`` (which only XLA's own gradient
  rules use) is refused.

  Args and result as ``lax.conv_general_dilated`` (any ``dimension_numbers``; ``nnx.Conv``
  passes NHWC / HWIO).
  """
  if batch_group_count != 1:
    raise ValueError(f"batch_group_count={batch_group_count}: the matmul convolution only "
                     "supports 1; use impl='lax'.")
  lhs_perm, rhs_perm, out_perm = _to_channels_last(dimension_numbers, lhs.shape, rhs.shape)
  x = lhs if lhs_perm is None else jnp.transpose(lhs, lhs_perm)
  w = rhs if rhs_perm is None else jnp.transpose(rhs, rhs_perm)
  window, (c_g, o) = w.shape[:-2], w.shape[-2:]
  g = feature_group_count
  if x.shape[-1] != g * c_g or o % g:
    raise ValueError(f"input channels {x.shape[-1]} must be feature_group_count ({g}) x the "
                     f"kernel's input channels ({c_g}), and outputs {o} divisible by {g}.")
  p = patches(x, window, strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
              rhs_dilation=rhs_dilation)
  out_shape = p.shape[:-1]
  k = len(p.shape) - 1  # contract the last axis of p
  dot = functools.partial(lax.dot_general, precision=precision,
                          preferred_element_type=preferred_element_type,
                          out_sharding=out_sharding)
  if g == 1:
    y = dot(p, w.reshape(-1, o), (((k,), (0,)), ((), ())))
  else:
    taps = p.shape[-1] // x.shape[-1]
    pg = p.reshape(-1, taps, g, c_g)  # [M, K, G, C_g]
    wg = w.reshape(taps, c_g, g, o // g)  # [K, C_g, G, O_g]
    y = dot(pg, wg, (((1, 3), (0, 1)), ((2,), (2,))))  # [G, M, O_g]
    y = jnp.transpose(y, (1, 0, 2)).reshape(*out_shape, o)
  return y if out_perm is None else jnp.transpose(y, out_perm)


def conv_auto(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding,
              lhs_dilation: Sequence[int] | None = None,
              rhs_dilation: Sequence[int] | None = None, dimension_numbers=None,
              feature_group_count: int = 1, batch_group_count: int = 1, precision=None,
              preferred_element_type=None, out_sharding=None) -> jax.Array:
  """``conv_matmul`` when lowered for the CPU, ``lax.conv_general_dilated`` for any other
  platform (resolved at lowering; the compiled program holds only one of them)."""
  kwargs = dict(window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
                rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
                feature_group_count=feature_group_count, batch_group_count=batch_group_count,
                precision=precision, preferred_element_type=preferred_element_type,
                out_sharding=out_sharding)
  return lax.platform_dependent(
      lhs, rhs, cpu=functools.partial(conv_matmul, **kwargs),
      default=functools.partial(lax.conv_general_dilated, **kwargs))


CONV_FUNCTIONS: dict[str, Callable[..., jax.Array]] = {
    "auto": conv_auto,
    "lax": lax.conv_general_dilated,
    "matmul": conv_matmul,
}


def conv_function(impl: str) -> Callable[..., jax.Array]:
  """The convolution for ``impl`` (one of ``CONV_IMPLS``), with ``lax.conv_general_dilated``'s
  signature (for ``nnx.Conv(conv_general_dilated=...)``)."""
  if impl not in CONV_FUNCTIONS:
    raise ValueError(f"conv_impl={impl!r}; allowed: {', '.join(CONV_IMPLS)}.")
  return CONV_FUNCTIONS[impl]
