"""The CPU formulations of convolution and pooling (``conv``, ``pooling``) against XLA's own
ops, values and gradients, and every model with each ``conv_impl``."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from dml_jax import kernels
from dml_jax import models
from dml_jax.models import conv, pooling

from dml_test_support import require_kernel

NHWC = ("NHWC", "HWIO", "NHWC")

# name -> (input [B, H, W, C], kernel [kh, kw, C / groups, O], conv_general_dilated kwargs)
CONV_CASES = {
    "1x1": ((2, 6, 5, 4), (1, 1, 4, 6), dict(window_strides=(1, 1), padding="VALID")),
    "1x1_stride2": ((2, 7, 6, 4), (1, 1, 4, 6), dict(window_strides=(2, 2), padding="VALID")),
    "3x3_same": ((2, 6, 5, 4), (3, 3, 4, 6), dict(window_strides=(1, 1), padding="SAME")),
    "3x3_stride2_pad1": ((2, 7, 6, 4), (3, 3, 4, 6),
                         dict(window_strides=(2, 2), padding=((1, 1), (1, 1)))),
    "7x7_stride2_pad3": ((2, 11, 10, 3), (7, 7, 3, 5),
                         dict(window_strides=(2, 2), padding=((3, 3), (3, 3)))),
    "3x3_same_stride2": ((2, 7, 6, 4), (3, 3, 4, 6), dict(window_strides=(2, 2), padding="SAME")),
    "uneven": ((2, 7, 6, 4), (3, 2, 4, 6),
               dict(window_strides=(2, 1), padding=((0, 2), (1, -1)))),
    "grouped": ((2, 6, 5, 4), (3, 3, 2, 6),
                dict(window_strides=(1, 1), padding="SAME", feature_group_count=2)),
    "depthwise": ((2, 6, 5, 4), (3, 3, 1, 8),
                  dict(window_strides=(2, 2), padding="SAME", feature_group_count=4)),
    "kernel_dilation": ((2, 8, 7, 4), (3, 3, 4, 6),
                        dict(window_strides=(1, 1), padding="SAME", rhs_dilation=(2, 2))),
    "input_dilation": ((2, 4, 3, 4), (3, 3, 4, 6),
                       dict(window_strides=(1, 1), padding=((2, 2), (1, 1)),
                            lhs_dilation=(2, 2))),
    # the C++ direct convolution's cases ('auto' on the CPU): stride 1, O % 8 == 0; rows of
    # 13 and 7 pixels (tiles of 6 / 12 and their tails), O = 24 (a 16-wide and an 8-wide
    # block), C = 3 (its input gradient by the matmul form), C = 16 and 8 (by the kernel)
    "direct_3x3_same": ((3, 5, 13, 16), (3, 3, 16, 24),
                        dict(window_strides=(1, 1), padding="SAME")),
    "direct_5x3_uneven": ((2, 9, 7, 8), (5, 3, 8, 16),
                          dict(window_strides=(1, 1), padding=((0, 3), (2, -1)))),
    "direct_valid_rgb": ((2, 8, 9, 3), (3, 3, 3, 8),
                         dict(window_strides=(1, 1), padding="VALID")),
    # strided: the kernels' forward and kernel gradient, the matmul form's input gradient
    "direct_7x7_stride2_pad3": ((2, 11, 10, 3), (7, 7, 3, 8),
                                dict(window_strides=(2, 2), padding=((3, 3), (3, 3)))),
    "direct_3x3_stride21_same": ((2, 9, 8, 16), (3, 3, 16, 16),
                                 dict(window_strides=(2, 1), padding="SAME")),
    # 1 x 1 with O % 8 == 0: pointwise_conv (a matmul; the kernel gradient by the C++
    # kernel), unstrided and strided over odd sides (the input gradient scattered back)
    "direct_1x1": ((2, 6, 5, 12), (1, 1, 12, 24), dict(window_strides=(1, 1), padding="VALID")),
    "direct_1x1_stride2": ((2, 7, 9, 8), (1, 1, 8, 16),
                           dict(window_strides=(2, 2), padding="SAME")),
}


IMPLS = {
    "reference": lax.conv_general_dilated,
    "lax": conv.conv_function("lax"),
    "matmul": conv.conv_function("matmul"),
    "auto": conv.conv_function("auto"),
    "direct": conv.conv_direct,
    # one example per batch chunk (lax.map + jax.checkpoint), as large inputs get
    "matmul_chunked": functools.partial(conv.conv_matmul, max_patch_bytes=1),
}


def _conv_and_vjp(impl, kwargs):
  """``(x, w, ct) -> (y, dx, dw)`` of ``IMPLS[impl]``."""
  fn = IMPLS[impl]

  def run(x, w, ct):
    y, vjp = jax.vjp(lambda x, w: fn(x, w, dimension_numbers=NHWC, **kwargs), x, w)
    return (y, *vjp(ct))
  return run


@pytest.mark.parametrize("name", sorted(CONV_CASES))
def test_conv_matches_lax_values_and_gradients(name):
  x_shape, w_shape, kwargs = CONV_CASES[name]
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
  w = jnp.asarray(rng.standard_normal(w_shape), jnp.float32)
  y_shape = jax.eval_shape(
      lambda: lax.conv_general_dilated(x, w, dimension_numbers=NHWC, **kwargs)).shape
  ct = jnp.asarray(rng.standard_normal(y_shape), jnp.float32)

  # the direct kernel's cases against 'auto' (which runs it) and 'direct'; the others against
  # every formulation but 'direct' (which would be the matmul form again there)
  impls = (("auto", "direct") if name.startswith("direct")
           else ("lax", "matmul", "auto", "matmul_chunked"))

  @jax.jit
  def all_impls(x, w, ct):
    return {impl: _conv_and_vjp(impl, kwargs)(x, w, ct) for impl in ("reference", *impls)}

  got = all_impls(x, w, ct)
  for impl in impls:
    for a, b, what in zip(got[impl], got["reference"], ("y", "dx", "dw")):
      chex.assert_equal_shape([a, b])
      scale = float(jnp.max(jnp.abs(b)))
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{impl} {what}")


@pytest.mark.parametrize("name", ["3x3_same", "3x3_stride2_pad1"])
def test_bf16_gradients_match_float32_math(name):
  """bf16 operands (a bf16 model on the CPU): the matmul form's values and gradients equal
  the float32 convolution of the same bf16 numbers to bf16 precision (its weight gradient
  once asked XLA:CPU for a bf16 x bf16 -> f32 dot, which it cannot run)."""
  x_shape, w_shape, kwargs = CONV_CASES[name]
  rng = np.random.default_rng(2)
  x, w = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in (x_shape, w_shape))
  y_shape = jax.eval_shape(
      lambda: lax.conv_general_dilated(x, w, dimension_numbers=NHWC, **kwargs)).shape
  ct = jnp.asarray(rng.standard_normal(y_shape), jnp.bfloat16)
  for impl in ("matmul", "matmul_chunked"):
    got = jax.jit(_conv_and_vjp(impl, kwargs))(x, w, ct)
    want = _conv_and_vjp("reference", kwargs)(*(a.astype(jnp.float32) for a in (x, w, ct)))
    for a, b, what in zip(got, want, ("y", "dx", "dw")):
      assert a.dtype == jnp.bfloat16, (impl, what)
      scale = float(jnp.max(jnp.abs(b)))
      np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=2e-2 * scale,
                                 err_msg=f"{impl} {what}")


@pytest.mark.parametrize("form", ["packed", "unpacked", "scalar"])
@pytest.mark.parametrize("x_shape,w_shape,strides", [((2, 7, 15, 16), (3, 3, 16, 32), (1, 1)),
                                                     ((1, 6, 5, 5), (2, 4, 5, 8), (1, 1)),
                                                     ((3, 4, 26, 8), (1, 3, 8, 24), (1, 1)),
                                                     ((2, 9, 12, 8), (3, 3, 8, 16), (2, 3)),
                                                     # C, O >= 256, where the network's
                                                     # kernel gradient packs (1 x 1 over 3,072
                                                     # pixels; 3 x 3 strided, a last channel
                                                     # tile of 1, the last output block 8 wide)
                                                     ((3, 32, 32, 256), (1, 1, 256, 264), (1, 1)),
                                                     ((2, 9, 10, 259), (3, 3, 259, 264), (2, 1))])
def test_direct_kernels_match_lax(x_shape, w_shape, strides, form):
  # The two C++ kernels on their own, AVX2 (the kernel gradient packed and not) and scalar
  # forms: the VALID convolution and its kernel gradient against XLA's.
  require_kernel("conv.cc")
  vectorized = form != "scalar"
  pack = form == "packed"
  rng = np.random.default_rng(sum(x_shape))
  x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
  w = jnp.asarray(rng.standard_normal(w_shape), jnp.float32)
  ref = lambda w: lax.conv_general_dilated(x, w, strides, "VALID", dimension_numbers=NHWC)
  y_ref, vjp = jax.vjp(ref, w)
  g = jnp.asarray(rng.standard_normal(y_ref.shape), jnp.float32)
  (dw_ref,) = vjp(g)
  y = jax.jit(functools.partial(conv.direct_valid, strides=strides, vectorized=vectorized))(x, w)
  dw = jax.jit(functools.partial(conv.direct_kernel_grad, window=w_shape[:2], strides=strides,
                                 vectorized=vectorized, pack=pack))(x, g)
  for a, b in ((y, y_ref), (dw, dw_ref)):
    chex.assert_equal_shape([a, b])
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_direct_applies_only_where_the_kernel_computes_it():
  # where the kernel is not available (another backend or CPU, switched off, no compiler)
  # nothing applies
  built = kernels.load("conv.cc") is not None
  f32 = (jnp.float32, jnp.float32)
  base = dict(window_strides=(1, 1), lhs_dilation=None, rhs_dilation=None,
              feature_group_count=1, batch_group_count=1, preferred_element_type=None,
              out_sharding=None)
  applies = functools.partial(conv.direct_applies, (2, 8, 8, 4))
  assert applies((3, 3, 4, 16), f32, **base) == built
  assert not applies((3, 3, 4, 12), f32, **base)           # O % 8
  assert not applies((1, 1, 4, 16), f32, **base)           # a plain matmul already
  assert not applies((3, 3, 4, 16), (jnp.bfloat16,) * 2, **base)
  assert applies((3, 3, 4, 16), f32, **{**base, "window_strides": (2, 2)}) == built
  assert not applies((3, 3, 4, 16), f32, **{**base, "rhs_dilation": (2, 2)})
  assert not applies((3, 3, 2, 16), f32, **{**base, "feature_group_count": 2})


def test_pointwise_applies_to_unpadded_1x1_only():
  built = kernels.load("conv.cc") is not None
  f32 = (jnp.float32, jnp.float32)
  base = dict(window_strides=(1, 1), padding="VALID", lhs_dilation=None, rhs_dilation=None,
              feature_group_count=1, batch_group_count=1, preferred_element_type=None,
              out_sharding=None)
  applies = functools.partial(conv.pointwise_applies, (2, 7, 7, 4))
  assert applies((1, 1, 4, 16), f32, **base) == built
  assert applies((1, 1, 4, 16), f32, **{**base, "window_strides": (2, 2),
                                         "padding": "SAME"}) == built
  assert not applies((3, 3, 4, 16), f32, **base)           # a window: direct_conv
  assert not applies((1, 1, 4, 12), f32, **base)           # O % 8
  assert not applies((1, 1, 4, 16), f32, **{**base, "padding": ((1, 0), (0, 0))})
  assert not applies((1, 1, 4, 16), (jnp.bfloat16,) * 2, **base)
  assert not applies((1, 1, 2, 16), f32, **{**base, "feature_group_count": 2})


def test_pointwise_kernel_gradient_is_the_kernel():
  require_kernel("conv.cc")
  fn = conv.conv_function("auto")
  loss = lambda x, w: jnp.sum(fn(x, w, (2, 2), "VALID", dimension_numbers=NHWC) ** 2)
  text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(
      jnp.ones((2, 6, 6, 8)), jnp.ones((1, 1, 8, 16))).compile().as_text()
  assert "dml_jax_conv_kernel_grad" in text and " convolution(" not in text


def test_conv_matmul_other_dimension_numbers():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((2, 4, 7, 6)), jnp.float32)  # NCHW
  w = jnp.asarray(rng.standard_normal((5, 4, 3, 3)), jnp.float32)  # OIHW
  kwargs = dict(window_strides=(2, 1), padding="SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
  np.testing.assert_allclose(conv.conv_matmul(x, w, **kwargs),
                             lax.conv_general_dilated(x, w, **kwargs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch,per_example,max_bytes,chunks", [
    (128, 100, None, 1), (128, 100, 12800, 1), (128, 100, 1000, 16), (128, 100, 1, 128),
    (6, 100, 450, 2), (7, 100, 300, 7)])
def test_batch_chunks(batch, per_example, max_bytes, chunks):
  assert conv.batch_chunks(batch, per_example, max_bytes) == chunks


@pytest.mark.parametrize("batch,per_example,max_bytes,max_chunks,chunks", [
    (128, 100, 1, 32, 32),      # one example per chunk would be 128 chunks
    (128, 100, 1000, 32, 16),   # the byte bound already gives few chunks
    (128, 100, 1000, 8, 8),
    (7, 100, 300, 3, 1),        # no divisor of 7 between 3 and 3: the next one up
    (128, 100, 12800, 4, 1)])
def test_batch_chunks_at_most_max_chunks(batch, per_example, max_bytes, max_chunks, chunks):
  assert conv.batch_chunks(batch, per_example, max_bytes, max_chunks) == chunks


def test_patches_layout_and_identity():
  x = jnp.arange(2 * 3 * 4 * 2, dtype=jnp.float32).reshape(2, 3, 4, 2)
  p = conv.patches(x, (3, 3), strides=(1, 1), padding="SAME")
  chex.assert_shape(p, (2, 3, 4, 18))
  # tap (1, 1) (the centre, t = 4) is the input; tap (0, 0) is shifted down-right.
  np.testing.assert_array_equal(p[..., 8:10], x)
  np.testing.assert_array_equal(p[:, 1:, 1:, 0:2], x[:, :-1, :-1])
  assert conv.patches(x, (1, 1), strides=(1, 1), padding="VALID") is x


def test_auto_on_cpu_compiles_no_convolution():
  if jax.default_backend() != "cpu":
    pytest.skip("'auto' is the CPU's formulation; elsewhere it is XLA's convolution")
  x = jnp.ones((2, 6, 6, 3))
  w = jnp.ones((3, 3, 3, 4))

  def hlo(impl):
    fn = conv.conv_function(impl)
    grad = jax.grad(lambda x, w: jnp.sum(fn(x, w, (1, 1), "SAME", dimension_numbers=NHWC)),
                    argnums=(0, 1))
    return jax.jit(grad).lower(x, w).compile().as_text()

  assert " convolution(" in hlo("lax")
  assert " convolution(" not in hlo("auto")
  require_kernel("conv.cc")
  # with 8 outputs the C++ direct convolution runs: its two kernels (the forward one for the
  # value; the input gradient of 3 channels by the matmul form), no patches
  fn = conv.conv_function("auto")
  loss = lambda x, w: jnp.sum(fn(x, w, (1, 1), "SAME", dimension_numbers=NHWC) ** 2)
  text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(
      x, jnp.ones((3, 3, 3, 8))).compile().as_text()
  assert "dml_jax_conv_forward" in text and "dml_jax_conv_kernel_grad" in text


@pytest.mark.parametrize("features,layout", [(3, "NHWC"), (1, "NHWC"), (3, "NCHW"),
                                             (8, "NHWC"), (10, "NHWC")])
def test_lax_aligned_pads_the_input_features_and_equals_lax(features, layout):
  # a stem (7x7, stride 2, pad 3) on 3 colour channels, grey images, channels first, an
  # aligned input (nothing to pad) and 10 features (padded to 16): values and both gradients
  dn = (layout, "HWIO" if layout == "NHWC" else "OIHW", layout)
  x = jax.random.normal(jax.random.key(0), (2, 20, 20, features))
  w = jax.random.normal(jax.random.key(1), (7, 7, features, 16))
  if layout == "NCHW":
    x, w = x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)

  def run(fn):
    f = lambda x, w: fn(x, w, (2, 2), ((3, 3), (3, 3)), dimension_numbers=dn,  # noqa: E731
                        precision=lax.Precision.HIGHEST)
    return f(x, w), jax.grad(lambda x, w: jnp.sum(jnp.sin(f(x, w))), argnums=(0, 1))(x, w)

  got, want = run(conv.conv_lax_aligned), run(lax.conv_general_dilated)
  chex.assert_trees_all_equal_shapes_and_dtypes(got, want)
  for g, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    # the same sums in another order: float32 rounding of sums of 49 C terms, on their scale
    assert np.abs(np.asarray(g) - np.asarray(v)).max() <= 2e-5 * np.abs(np.asarray(v)).max()
  # the convolution XLA is given has the padded features
  jaxpr = jax.make_jaxpr(lambda x, w: conv.conv_lax_aligned(x, w, (2, 2), "SAME",
                                                            dimension_numbers=dn))(x, w)
  (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "conv_general_dilated"]
  feature_axis = layout.index("C")
  assert eqn.invars[0].aval.shape[feature_axis] == -(-features // 8) * 8


def test_lax_aligned_leaves_grouped_convolutions_alone():
  x = jax.random.normal(jax.random.key(0), (2, 9, 9, 6))
  w = jax.random.normal(jax.random.key(1), (3, 3, 3, 6))
  args = ((1, 1), "SAME")
  kwargs = dict(dimension_numbers=NHWC, feature_group_count=2)
  chex.assert_trees_all_equal(conv.conv_lax_aligned(x, w, *args, **kwargs),
                              lax.conv_general_dilated(x, w, *args, **kwargs))


def test_bad_options_raise():
  with pytest.raises(ValueError, match="allowed: auto, lax, matmul"):
    conv.conv_function("cudnn")
  with pytest.raises(ValueError, match="batch_group_count"):
    conv.conv_matmul(jnp.ones((2, 4, 4, 2)), jnp.ones((1, 1, 2, 2)), (1, 1), "VALID",
                     dimension_numbers=NHWC, batch_group_count=2)
  with pytest.raises(ValueError, match="allowed: auto, lax, matmul"):
    pooling.max_pool(jnp.ones((1, 4, 4, 1)), (2, 2), impl="fast")
  for arch in ("small_cnn", "resnet18", "bn_inception"):
    with pytest.raises(ValueError, match="allowed: auto, lax, matmul"):
      models.make(arch, embedding_dim=4, rngs=nnx.Rngs(0), conv_impl="fast")


POOL_CASES = {
    "2x2_stride2": ((2, 2), (2, 2), "VALID"),
    "3x3_stride2_pad1": ((3, 3), (2, 2), ((1, 1), (1, 1))),
    "3x3_stride1_pad1": ((3, 3), (1, 1), ((1, 1), (1, 1))),
    "3x3_stride2_ceil": ((3, 3), (2, 2), ((0, 1), (0, 1))),
    "3x3_same": ((3, 3), (2, 2), "SAME"),
}


@pytest.mark.parametrize("name", sorted(POOL_CASES))
def test_max_pool_equals_reduce_window_values_and_gradients_with_ties(name):
  window, strides, padding = POOL_CASES[name]
  rng = np.random.default_rng(0)
  base = rng.standard_normal((2, 7, 9, 3)).astype(np.float32)
  inputs = {"normal": base, "ties": np.round(base),  # many equal values per window
            "neg_inf": np.where(base > 0.5, base, -np.inf).astype(np.float32)}
  y_shape = nnx.max_pool(jnp.asarray(base), window, strides, padding).shape
  ct = jnp.asarray(rng.standard_normal(y_shape), jnp.float32)

  @jax.jit
  def all_impls(x, ct):
    out = {}
    for impl in ("lax", "matmul", "auto"):
      y, vjp = jax.vjp(lambda x: pooling.max_pool(x, window, strides, padding, impl=impl), x)
      out[impl] = (y, *vjp(ct))
    return out

  for kind, x in inputs.items():
    got = all_impls(jnp.asarray(x), ct)
    for impl in ("matmul", "auto"):  # exactly: the same selection, ties included
      np.testing.assert_array_equal(got[impl][0], got["lax"][0], err_msg=f"{kind} {impl} y")
      np.testing.assert_array_equal(got[impl][1], got["lax"][1], err_msg=f"{kind} {impl} dx")


def test_max_pool_is_by_slices_on_every_platform_but_with_lax():
  # XLA:GPU's select_and_scatter writes int32 indices and a padded gradient (pooling's
  # docstring): every impl but 'lax' max-pools by slices, whatever the lowering platform.
  x = jnp.ones((2, 8, 8, 3), jnp.bfloat16)
  for impl in conv.CONV_IMPLS:
    pool = lambda x, impl=impl: pooling.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)), impl=impl)
    text = str(jax.make_jaxpr(jax.grad(lambda x: jnp.sum(pool(x).astype(jnp.float32))))(x))
    assert ("reduce_window_max" in text) == (impl == "lax"), impl
    assert ("platform_index" in text) is False, impl


@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool_matches_reduce_window(count_include_pad):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 7, 9, 3)), jnp.float32)
  ct = jnp.asarray(rng.standard_normal((2, 7, 9, 3)), jnp.float32)
  pool = functools.partial(pooling.avg_pool, window=(3, 3), strides=(1, 1),
                           padding=((1, 1), (1, 1)), count_include_pad=count_include_pad)

  @jax.jit
  def all_impls(x, ct):
    return {impl: (lambda y, vjp: (y, *vjp(ct)))(*jax.vjp(lambda v: pool(v, impl=impl), x))
            for impl in ("lax", "matmul")}

  got = all_impls(x, ct)
  for a, b in zip(got["matmul"], got["lax"]):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


# ---- the models: same parameters, same outputs with every conv_impl ----

# arch -> (constructor kwargs, input shape, BatchNorm mode). Eval mode (running averages) for
# BN-Inception: with batch statistics over a handful of values per channel (a 1x1 feature
# map), BatchNorm amplifies float32 rounding differences; ResNet-18 checks train mode at a
# size where the last feature map is 2x2. ResNet-50 (same layers as ResNet-18 plus 1x1
# convolutions) is only checked for its parameters (compiling it costs half a minute).
MODEL_CASES = {
    "small_cnn": (dict(image_size=12, in_channels=1), (4, 12, 12, 1), "train"),
    "resnet18": ({}, (2, 64, 64, 3), "train"),
    "resnet50": ({}, None, None),
    "bn_inception": ({}, (2, 32, 32, 3), "eval"),
}


def _random_state(model, seed=0):
  """Random values for an abstract model's variables (BN scales and variances in [0.5, 1.5],
  the rest normal with variance 1 / fan-in)."""
  rng = np.random.default_rng(seed)

  def fill(path, v):
    name = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)][-1]
    if name in ("var", "scale"):
      return jnp.asarray(rng.uniform(0.5, 1.5, v.shape), v.dtype)
    fan_in = int(np.prod(v.shape[:-1])) if len(v.shape) > 1 else 10
    return jnp.asarray(rng.standard_normal(v.shape) / np.sqrt(fan_in), v.dtype)
  return jax.tree_util.tree_map_with_path(fill, nnx.state(model))


@nnx.jit
def _forward(model, x):
  return model(x)


@pytest.mark.parametrize("arch", sorted(MODEL_CASES))
def test_models_same_parameters_and_outputs_with_each_impl(arch):
  kwargs, shape, mode = MODEL_CASES[arch]
  built = {impl: nnx.eval_shape(lambda impl=impl: models.make(
      arch, embedding_dim=8, rngs=nnx.Rngs(0), conv_impl=impl, **kwargs))
           for impl in ("lax", "auto", "lax_aligned")}
  # identical parameter names, shapes and dtypes (checkpoints and pretrained weights load)
  for impl in ("auto", "lax_aligned"):
    chex.assert_trees_all_equal_shapes_and_dtypes(nnx.state(built["lax"]),
                                                  nnx.state(built[impl]))
  if shape is None:
    return
  values = _random_state(built["lax"])
  x = jax.random.normal(jax.random.key(1), shape)
  out = {}
  for impl, model in built.items():
    nnx.update(model, values)
    getattr(model, mode)()
    out[impl] = (_forward(model, x), nnx.state(model, nnx.BatchStat))
  chex.assert_tree_all_finite(out["lax"])
  chex.assert_trees_all_close(out["auto"], out["lax"], rtol=1e-4, atol=1e-4)
  chex.assert_trees_all_close(out["lax_aligned"], out["lax"], rtol=1e-4, atol=1e-4)


def test_small_cnn_gradients_equal_with_each_impl_and_one_trace():
  x = jax.random.normal(jax.random.key(0), (8, 12, 12, 1))
  grads, traces = {}, []
  for impl in ("lax", "matmul"):
    model = models.make("small_cnn", embedding_dim=4, image_size=12, rngs=nnx.Rngs(0),
                        conv_impl=impl)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, rest, x, graphdef=graphdef, impl=impl):
      traces.append(impl)
      return jnp.sum(nnx.merge(graphdef, params, rest, copy=True)(x)[:, 0])

    grad = jax.jit(jax.grad(loss))
    grads[impl] = grad(params, rest, x)
    grad(params, rest, x + 1.0)  # same shapes: no second trace
  assert traces == ["lax", "matmul"]
  chex.assert_trees_all_close(grads["matmul"], grads["lax"], rtol=1e-4, atol=1e-5)


def test_vmap_over_a_model_with_the_cpu_kernels_equals_the_batch():
  """``jax.vmap`` of a model over single examples (e.g. per-example gradients) runs with the
  C++ kernels and gives the batched values and gradients."""
  require_kernel("conv.cc")
  model = models.make("small_cnn", embedding_dim=4, image_size=6, rngs=nnx.Rngs(0))
  model.eval()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  x = jax.random.normal(jax.random.key(0), (3, 6, 6, 1))

  def loss(p, xi):   # xi [6, 6, 1]
    return jnp.sum(nnx.merge(graphdef, p, rest, copy=True)(xi[None]) ** 3)

  per_example = jax.jit(jax.vmap(jax.value_and_grad(loss), in_axes=(None, 0)))(params, x)
  one_example = jax.jit(jax.value_and_grad(loss))
  for i in range(3):
    value, grad = one_example(params, x[i])
    np.testing.assert_allclose(per_example[0][i], value, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(per_example[1]), jax.tree.leaves(grad)):
      np.testing.assert_allclose(a[i], b, rtol=1e-4, atol=1e-5)
