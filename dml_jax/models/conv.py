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
  * ``'lax_aligned'``: XLA's convolution with the input features zero-padded to a multiple of
    8 (:func:`conv_lax_aligned`; the same result to the order of the sums): the alignment
    cuDNN's tensor cores want for a stem's 3 colour channels, which XLA:GPU gives float16
    convolutions but not bfloat16 ones.

The models' pooling follows the same option (``pooling``): max-pooling by shifted slices
with every ``impl`` but ``'lax'``, which keeps XLA's ``reduce_window`` throughout.

Every function here has ``lax.conv_general_dilated``'s signature, so it is passed to
``nnx.Conv(conv_general_dilated=...)``: parameter names, shapes and initialisation are
nnx.Conv's, whatever the implementation.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dml_jax import kernels

CONV_IMPLS = ("auto", "lax", "matmul", "lax_aligned")
# Largest patch matrix made at once (bytes): larger ones are made batch chunk by batch chunk,
# in at most MAX_CHUNKS chunks (each chunk is a loop iteration of a dozen small ops, whose
# fixed cost outweighs the cache misses of larger chunks beyond that).
MAX_PATCH_BYTES = 1 << 20
MAX_CHUNKS = 32


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


def batch_chunks(batch: int, bytes_per_example: int, max_bytes: int | None,
                 max_chunks: int | None = None) -> int:
  """The number ``n`` of equal batch chunks (``n`` divides ``batch``) so that one chunk's
  patches take at most ``max_bytes`` (one example per chunk at the least), with at most
  ``max_chunks`` chunks (which wins over ``max_bytes``; None: no limit); 1 if they all fit or
  ``max_bytes`` is None."""
  if max_bytes is None or batch * bytes_per_example <= max_bytes:
    return 1
  size = max(1, min(batch, max_bytes // max(bytes_per_example, 1)))
  smallest = 1 if max_chunks is None else -(-batch // max(1, max_chunks))
  divisors = [d for d in range(1, batch + 1) if batch % d == 0]
  fitting = [d for d in divisors if smallest <= d <= size]
  size = fitting[-1] if fitting else min(d for d in divisors if d >= smallest)
  return batch // size


class _Spec(NamedTuple):
  """The static part of a chunked matmul convolution (hashable, for ``jax.custom_vjp``)."""
  window: tuple[int, ...]
  strides: tuple[int, ...]
  padding: str | tuple[tuple[int, int], ...]
  lhs_dilation: tuple[int, ...] | None
  rhs_dilation: tuple[int, ...] | None
  chunks: int
  precision: Any
  preferred_element_type: Any


def _spec_patches(spec: _Spec, x: jax.Array) -> jax.Array:
  return patches(x, spec.window, strides=spec.strides, padding=spec.padding,
                 lhs_dilation=spec.lhs_dilation, rhs_dilation=spec.rhs_dilation)


def _to_chunks(x: jax.Array, n: int) -> jax.Array:
  """``[B, ...] -> [n, B / n, ...]``, chunk ``j`` = examples ``j, j + n, ...``."""
  return jnp.moveaxis(x.reshape(x.shape[0] // n, n, *x.shape[1:]), 1, 0)


def _from_chunks(xs: jax.Array) -> jax.Array:
  """Inverse of ``_to_chunks``."""
  return jnp.moveaxis(xs, 0, 1).reshape(-1, *xs.shape[2:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv_chunked(x: jax.Array, w: jax.Array, spec: _Spec) -> jax.Array:
  """``y = P(x) W`` (``x [B, *S, C]``, ``W [K C, O]``) chunk by chunk: ``[B, *S', O]``.

  Backward, chunk by chunk too: ``dW^T += dy^T P`` (``[O, K C]``, so the large ``P`` is the
  matmul's right operand as stored) and ``dx = P^T(dy W^T)`` (``P^T`` the transpose of
  taking the patches: shifted slices added back).
  """
  dot = functools.partial(lax.dot_general, precision=spec.precision,
                          preferred_element_type=spec.preferred_element_type)

  def one(xc):
    p = _spec_patches(spec, xc)
    return dot(p, w, (((p.ndim - 1,), (0,)), ((), ())))

  if spec.chunks == 1:
    return one(x)
  return _from_chunks(lax.map(one, _to_chunks(x, spec.chunks)))


def _conv_chunked_fwd(x, w, spec):
  return _conv_chunked(x, w, spec), (x, w)


def _conv_chunked_bwd(spec, residuals, g):
  x, w = residuals
  example = jax.ShapeDtypeStruct((x.shape[0] // spec.chunks, *x.shape[1:]), x.dtype)
  patches_t = jax.linear_transpose(functools.partial(_spec_patches, spec), example)
  dot = functools.partial(lax.dot_general, precision=spec.precision)

  def one(dwt, xg):
    xc, gc = xg
    p = _spec_patches(spec, xc)
    batch_dims = tuple(range(gc.ndim - 1))
    # float32 operands: XLA:CPU has no bf16 x bf16 -> f32 dot, and the sum over the batch
    # should accumulate in float32 anyway
    dwt = dwt + dot(gc.astype(jnp.float32), p.astype(jnp.float32),
                    ((batch_dims, batch_dims), ((), ())),
                    preferred_element_type=jnp.float32)  # [O, K C]
    dp = dot(gc, w, (((gc.ndim - 1,), (1,)), ((), ())),
             preferred_element_type=spec.preferred_element_type)  # [c, *S', K C]
    return dwt, patches_t(dp.astype(p.dtype))[0]

  dwt0 = jnp.zeros((w.shape[1], w.shape[0]), jnp.float32)
  if spec.chunks == 1:
    dwt, dx = one(dwt0, (x, g))
  else:
    dwt, dxs = lax.scan(one, dwt0, (_to_chunks(x, spec.chunks), _to_chunks(g, spec.chunks)))
    dx = _from_chunks(dxs)
  return dx, dwt.T.astype(w.dtype)


_conv_chunked.defvjp(_conv_chunked_fwd, _conv_chunked_bwd)


def _conv_grouped(x: jax.Array, w: jax.Array, spec: _Spec, *, groups: int,
                  out_sharding=None) -> jax.Array:
  """``[B, *S, C]`` (*) ``[*k, C_g, O]`` -> ``[B, *S', O]`` with ``G`` groups:
  ``[M, K, G, C_g] x [K, C_g, G, O_g]``, one batched matmul (gradient by autodiff)."""
  c_g, o = w.shape[-2:]
  p = _spec_patches(spec, x)
  taps = p.shape[-1] // x.shape[-1]
  pg = p.reshape(-1, taps, groups, c_g)  # [M, K, G, C_g]
  wg = w.reshape(taps, c_g, groups, o // groups)  # [K, C_g, G, O_g]
  y = lax.dot_general(pg, wg, (((1, 3), (0, 1)), ((2,), (2,))), precision=spec.precision,
                      preferred_element_type=spec.preferred_element_type,
                      out_sharding=out_sharding)  # [G, M, O_g]
  return jnp.transpose(y, (1, 0, 2)).reshape(*p.shape[:-1], o)


def conv_matmul(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding,
                lhs_dilation: Sequence[int] | None = None,
                rhs_dilation: Sequence[int] | None = None, dimension_numbers=None,
                feature_group_count: int = 1, batch_group_count: int = 1, precision=None,
                preferred_element_type=None, out_sharding=None, *,
                max_patch_bytes: int | None = MAX_PATCH_BYTES,
                max_chunks: int | None = MAX_CHUNKS) -> jax.Array:
  """``lax.conv_general_dilated`` as im2col (``patches``) times one matmul; same arguments,
  same result up to float32 rounding.

  Without groups: ``y = P(x) W`` with ``W [K C, O]``, made ``batch_chunks`` examples at a
  time when the patches of the whole batch would exceed ``max_patch_bytes`` (None: never), so
  that each chunk's patches stay in the CPU's cache, forward and backward (``_conv_chunked``),
  in at most ``max_chunks`` chunks (None: no limit).
  With ``G = feature_group_count`` groups the input channels ``C = G C_g`` and outputs
  ``O = G O_g`` split into groups and ``y_g = P_g W_g`` per group (one batched matmul;
  depthwise is ``C_g = 1``), the whole batch at once, gradient by autodiff (as with an
  ``out_sharding``). ``batch_group_count > 1`` (which only XLA's own gradient rules use) is
  refused.

  Args and result as ``lax.conv_general_dilated`` (any ``dimension_numbers``; ``nnx.Conv``
  passes NHWC / HWIO).
  """
  if batch_group_count != 1:
    raise ValueError(f"batch_group_count={batch_group_count}: the matmul convolution only "
                     "supports 1; use impl='lax'.")
  lhs_perm, rhs_perm, out_perm = _to_channels_last(dimension_numbers, lhs.shape, rhs.shape)
  x = lhs if lhs_perm is None else jnp.transpose(lhs, lhs_perm)
  w = rhs if rhs_perm is None else jnp.transpose(rhs, rhs_perm)
  g = feature_group_count
  if x.shape[-1] != g * w.shape[-2] or w.shape[-1] % g:
    raise ValueError(f"input channels {x.shape[-1]} must be feature_group_count ({g}) x the "
                     f"kernel's input channels ({w.shape[-2]}), and outputs {w.shape[-1]} "
                     f"divisible by {g}.")
  spec = _Spec(
      window=tuple(w.shape[:-2]), strides=tuple(window_strides),
      padding=padding if isinstance(padding, str) else tuple(
          (int(lo), int(hi)) for lo, hi in padding),
      lhs_dilation=None if lhs_dilation is None else tuple(lhs_dilation),
      rhs_dilation=None if rhs_dilation is None else tuple(rhs_dilation), chunks=1,
      precision=precision, preferred_element_type=preferred_element_type)
  if g == 1 and out_sharding is None:
    example = jax.eval_shape(functools.partial(_spec_patches, spec),
                             jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype))
    taps = int(np.prod(spec.window))
    n = batch_chunks(x.shape[0], example.size * x.dtype.itemsize,
                     max_patch_bytes if taps > 1 else None, max_chunks)
    y = _conv_chunked(x, w.reshape(-1, w.shape[-1]), spec._replace(chunks=n))
  else:
    y = _conv_grouped(x, w, spec, groups=g, out_sharding=out_sharding)
  return y if out_perm is None else jnp.transpose(y, out_perm)


def _kernel_computes(x_shape, w_shape, dtypes, *, lhs_dilation, rhs_dilation,
                     feature_group_count: int, batch_group_count: int, preferred_element_type,
                     out_sharding) -> bool:
  """What both C++ paths need (channels-last shapes): 2-D, no dilation, no groups, float32,
  ``O % 8 == 0``, and the kernel built."""
  ones = lambda v: v is None or all(int(d) == 1 for d in v)
  return (len(x_shape) == 4 and ones(lhs_dilation)
          and ones(rhs_dilation) and feature_group_count == 1 and batch_group_count == 1
          and out_sharding is None and w_shape[-1] % 8 == 0
          and all(jnp.dtype(d) == jnp.float32 for d in dtypes)
          and preferred_element_type in (None, jnp.float32)
          and kernels.choose("conv.cc") is not None)


def direct_applies(x_shape, w_shape, dtypes, *, window_strides, **kwargs) -> bool:
  """Whether :func:`conv_direct` runs the C++ kernel for this convolution (channels-last
  shapes): a window larger than 1 x 1 (a 1 x 1 convolution is a plain matmul already, see
  :func:`pointwise_applies`), any strides, and :func:`_kernel_computes`' conditions
  (``kwargs``: its keyword arguments)."""
  del window_strides   # any
  return w_shape[0] * w_shape[1] > 1 and _kernel_computes(x_shape, w_shape, dtypes, **kwargs)


def conv_direct(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding,
                lhs_dilation: Sequence[int] | None = None,
                rhs_dilation: Sequence[int] | None = None, dimension_numbers=None,
                feature_group_count: int = 1, batch_group_count: int = 1, precision=None,
                preferred_element_type=None, out_sharding=None) -> jax.Array:
  """``lax.conv_general_dilated`` by the C++ direct convolution of ``dml_jax/kernels/conv.cc``
  where it applies (:func:`direct_applies`: float32 2-D convolutions with a window, every one
  of the small CNN's and a ResNet's but its 1 x 1 ones), unpadded float32 1 x 1 ones as
  :func:`pointwise_conv` (a matmul whose kernel gradient is the C++ kernel's), else
  :func:`conv_matmul`. Same arguments; equal to float32 rounding. See :func:`direct_conv`.
  """
  kwargs = dict(window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
                rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
                feature_group_count=feature_group_count, batch_group_count=batch_group_count,
                precision=precision, preferred_element_type=preferred_element_type,
                out_sharding=out_sharding)
  lhs_perm, rhs_perm, out_perm = _to_channels_last(dimension_numbers, lhs.shape, rhs.shape)
  x = lhs if lhs_perm is None else jnp.transpose(lhs, lhs_perm)
  w = rhs if rhs_perm is None else jnp.transpose(rhs, rhs_perm)
  strides = tuple(int(v) for v in window_strides)
  shapes = (x.shape, w.shape, (x.dtype, w.dtype))
  checks = dict(window_strides=window_strides, lhs_dilation=lhs_dilation,
                rhs_dilation=rhs_dilation, feature_group_count=feature_group_count,
                batch_group_count=batch_group_count,
                preferred_element_type=preferred_element_type, out_sharding=out_sharding)
  if pointwise_applies(*shapes, padding=padding, **checks):
    y = pointwise_conv(x, w, strides)
    return y if out_perm is None else jnp.transpose(y, out_perm)
  if not direct_applies(*shapes, **checks):
    return conv_matmul(lhs, rhs, **kwargs)
  pads = tuple(tuple(int(v) for v in p) for p in _pads(padding, x.shape[1:3], w.shape[:2],
                                                      strides))
  y = direct_conv(x, w, pads, strides)
  return y if out_perm is None else jnp.transpose(y, out_perm)


def pointwise_applies(x_shape, w_shape, dtypes, *, window_strides, padding, **kwargs) -> bool:
  """Whether :func:`conv_direct` runs a 1 x 1 convolution (channels-last shapes) as
  :func:`pointwise_conv`: unpadded, any strides, and :func:`_kernel_computes`' conditions
  (``kwargs``: its keyword arguments)."""
  if tuple(w_shape[:2]) != (1, 1) or len(x_shape) != 4:
    return False
  pads = _pads(padding, x_shape[1:3], w_shape[:2], tuple(int(v) for v in window_strides))
  return (all(int(lo) == 0 and int(hi) == 0 for lo, hi in pads)
          and _kernel_computes(x_shape, w_shape, dtypes, **kwargs))


# C and O from which the C++ kernel gradient packs its operands (direct_kernel_grad): below,
# the copies cost about as much as the sums they save (benchmarks/speed/conv_parts.py
# --weight_grads).
PACK_MIN_CHANNELS = 256


def _pointwise_input(x: jax.Array, strides) -> jax.Array:
  """The pixels a strided 1 x 1 convolution reads: ``x[:, ::s, ::s']``."""
  return x if strides == (1, 1) else x[:, ::strides[0], ::strides[1], :]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def pointwise_conv(x: jax.Array, w: jax.Array, strides) -> jax.Array:
  """A 1 x 1 convolution ``[N, H, W, C] (*) [1, 1, C, O]`` at ``strides``, unpadded: a matmul
  over the channels of the pixels it reads. VJP: the input gradient a matmul too (scattered
  back to the strided pixels), the kernel gradient the C++ kernel
  (:func:`direct_kernel_grad`), which sums over the pixels of ``x`` and ``dy`` as stored;
  XLA's matmul for it transposes one of them first (a strided pass as large as the layer)."""
  return lax.dot_general(_pointwise_input(x, strides), w[0, 0], (((3,), (0,)), ((), ())))


def _pointwise_conv_fwd(x, w, strides):
  return pointwise_conv(x, w, strides), (x, w)


def _pointwise_conv_bwd(strides, residuals, g):
  x, w = residuals
  dx = lax.dot_general(g, w[0, 0], (((3,), (1,)), ((), ())))   # [N, H', W', C]
  if strides != (1, 1):
    dx = lax.pad(dx, jnp.zeros((), dx.dtype), [
        (0, 0, 0), *((0, n - 1 - (m - 1) * s, s - 1)
                     for n, m, s in zip(x.shape[1:3], dx.shape[1:3], strides)), (0, 0, 0)])
  return dx, direct_kernel_grad(x, g, (1, 1), strides=strides)


pointwise_conv.defvjp(_pointwise_conv_fwd, _pointwise_conv_bwd)


def direct_valid(x: jax.Array, w: jax.Array, *, strides: tuple[int, int] = (1, 1),
                 vectorized: bool = True) -> jax.Array:
  """The C++ VALID convolution ``[N, H, W, C] (*) [KH, KW, C, O] -> [N, (H - KH) / s + 1,
  (W - KW) / s' + 1, O]`` with strides ``(s, s')`` (float32, ``O % 8 == 0``; no VJP of its
  own). ``vectorized=False`` runs the kernel's scalar form (what CPUs without AVX2 + FMA
  get)."""
  n, h, wd, _ = x.shape
  kh, kw, _, o = w.shape
  shape = (n, (h - kh) // strides[0] + 1, (wd - kw) // strides[1] + 1, o)
  return jax.ffi.ffi_call(kernels.require("conv.cc")["forward"],
                          jax.ShapeDtypeStruct(shape, jnp.float32),
                          vmap_method="sequential")(
      x, w, stride_h=np.int32(strides[0]), stride_w=np.int32(strides[1]),
      vectorized=np.int32(vectorized))


def direct_kernel_grad(x: jax.Array, g: jax.Array, window: tuple[int, int], *,
                       strides: tuple[int, int] = (1, 1), vectorized: bool = True,
                       pack: bool | None = None) -> jax.Array:
  """The kernel gradient of :func:`direct_valid` by the C++ kernel: ``dw[i, j, c, o] =
  sum_{n, h, w} x[n, s h + i, s' w + j, c] g[n, h, w, o]``, ``[KH, KW, C, O]``.

  ``pack``: whether the AVX2 form first copies ``g`` and blocks of ``x`` into contiguous
  panels (``None``: where ``C`` and ``O`` are both ``PACK_MIN_CHANNELS`` or more, whose rows
  otherwise fall into a few cache sets; ``True`` / ``False`` force it, for tests and
  benchmarks)."""
  shape = (*window, x.shape[-1], g.shape[-1])
  if pack is None:
    pack = min(shape[2:]) >= PACK_MIN_CHANNELS
  return jax.ffi.ffi_call(kernels.require("conv.cc")["kernel_grad"],
                          jax.ShapeDtypeStruct(shape, jnp.float32),
                          vmap_method="sequential")(
      x, g, stride_h=np.int32(strides[0]), stride_w=np.int32(strides[1]),
      vectorized=np.int32(vectorized), pack=np.int32(pack))


def _pad_spatial(x: jax.Array, pads) -> jax.Array:
  """``[N, H, W, C]`` padded (or cropped, for negative pads) by ``pads = ((lo, hi), (lo, hi))``."""
  return lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), *((lo, hi, 0) for lo, hi in pads),
                                             (0, 0, 0)])


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def direct_conv(x: jax.Array, w: jax.Array, pads, strides) -> jax.Array:
  """The convolution of ``x [N, H, W, C]`` padded by ``pads`` (``((lo, hi), (lo, hi))``) with
  ``w [KH, KW, C, O]`` at ``strides`` by the C++ kernel (float32, ``O % 8 == 0``): the input
  is padded here (``lax.pad``, whose gradient is a slice), then the kernel runs the VALID
  convolution without forming patches.

  VJP: the kernel gradient by the second kernel, from the padded input; with stride 1 the
  input gradient by the first kernel again, the VALID convolution of the output gradient
  padded by ``(K - 1 - lo, K - 1 - hi)`` with the flipped, transposed kernel (which is ``dx``
  itself, no padded ``dx`` to crop). With a stride, or when ``C`` is not a multiple of 8 (a
  network's first layer, whose input gradient is usually not needed and then not
  computed), the input gradient is :func:`conv_matmul`'s.
  """
  return direct_valid(_pad_spatial(x, pads), w, strides=strides)


def _direct_conv_fwd(x, w, pads, strides):
  xp = _pad_spatial(x, pads)
  return direct_valid(xp, w, strides=strides), (xp, w)


def _direct_conv_bwd(pads, strides, residuals, g):
  xp, w = residuals
  kh, kw = w.shape[:2]
  dw = direct_kernel_grad(xp, g, (kh, kw), strides=strides)
  (top, bottom), (left, right) = pads
  if strides == (1, 1) and w.shape[2] % 8 == 0:
    gp = _pad_spatial(g, ((kh - 1 - top, kh - 1 - bottom), (kw - 1 - left, kw - 1 - right)))
    dx = direct_valid(gp, jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2))   # [KH, KW, O, C]
  else:   # the transposed (input-dilated) convolution: the matmul form's input gradient
    x_shape = (xp.shape[0], xp.shape[1] - top - bottom, xp.shape[2] - left - right, xp.shape[3])
    conv_x = lambda x: conv_matmul(x, w, strides, pads, dimension_numbers=("NHWC", "HWIO",
                                                                            "NHWC"))
    dx = jax.vjp(conv_x, jnp.zeros(x_shape, g.dtype))[1](g)[0]   # linear in x
  return dx, dw


direct_conv.defvjp(_direct_conv_fwd, _direct_conv_bwd)


def conv_auto(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding,
              lhs_dilation: Sequence[int] | None = None,
              rhs_dilation: Sequence[int] | None = None, dimension_numbers=None,
              feature_group_count: int = 1, batch_group_count: int = 1, precision=None,
              preferred_element_type=None, out_sharding=None) -> jax.Array:
  """``conv_direct`` (the C++ kernel, else ``conv_matmul``) when lowered for the CPU,
  ``lax.conv_general_dilated`` for any other platform (resolved at lowering; the compiled
  program holds only one of them)."""
  kwargs = dict(window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
                rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
                feature_group_count=feature_group_count, batch_group_count=batch_group_count,
                precision=precision, preferred_element_type=preferred_element_type,
                out_sharding=out_sharding)
  return lax.platform_dependent(
      lhs, rhs, cpu=functools.partial(conv_direct, **kwargs),
      default=functools.partial(lax.conv_general_dilated, **kwargs))


FEATURE_ALIGNMENT = 8   # bf16 / f16 elements in 16 bytes: cuDNN tensor-core alignment


def _pad_axis(x: jax.Array, axis: int, extra: int) -> jax.Array:
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths)


def conv_lax_aligned(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding,
                     lhs_dilation: Sequence[int] | None = None,
                     rhs_dilation: Sequence[int] | None = None, dimension_numbers=None,
                     feature_group_count: int = 1, batch_group_count: int = 1,
                     precision=None, preferred_element_type=None,
                     out_sharding=None) -> jax.Array:
  """``lax.conv_general_dilated`` with the input features of ``lhs`` and of the kernel ``rhs``
  zero-padded to a multiple of ``FEATURE_ALIGNMENT`` (8) where they are not (a stem's 3
  colour channels: ``[B, H, W, 3]`` and ``[kh, kw, 3, O]`` become ``[.., 8]`` and
  ``[kh, kw, 8, O]``); ungrouped convolutions only, others as ``lax``.

  The added products are all zero, so the output is the convolution's up to the order of its
  sums, and the kernel's gradient is that of the unpadded kernel (the padding's slice is cut
  off). Why: cuDNN's tensor-core kernels want 16-byte aligned features, and XLA:GPU pads a
  convolution's features for them only in float16, not in bfloat16 or float32.
  """
  dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  extra = -lhs.shape[dn.lhs_spec[1]] % FEATURE_ALIGNMENT
  if extra and feature_group_count == 1 and batch_group_count == 1:
    lhs = _pad_axis(lhs, dn.lhs_spec[1], extra)
    rhs = _pad_axis(rhs, dn.rhs_spec[1], extra)
  return lax.conv_general_dilated(
      lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
      dimension_numbers=dn, feature_group_count=feature_group_count,
      batch_group_count=batch_group_count, precision=precision,
      preferred_element_type=preferred_element_type, out_sharding=out_sharding)


CONV_FUNCTIONS: dict[str, Callable[..., jax.Array]] = {
    "auto": conv_auto,
    "lax": lax.conv_general_dilated,
    "matmul": conv_matmul,
    "lax_aligned": conv_lax_aligned,
}


def conv_function(impl: str) -> Callable[..., jax.Array]:
  """The convolution for ``impl`` (one of ``CONV_IMPLS``), with ``lax.conv_general_dilated``'s
  signature (for ``nnx.Conv(conv_general_dilated=...)``)."""
  if impl not in CONV_FUNCTIONS:
    raise ValueError(f"conv_impl={impl!r}; allowed: {', '.join(CONV_IMPLS)}.")
  return CONV_FUNCTIONS[impl]
