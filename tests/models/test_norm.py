"""Tests of ``models.norm.batch_norm``: nnx.BatchNorm's values and statistics, and a VJP equal to
autodiff of the same formula (the output, the ReLU mask and the statistics' cotangents)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dml_jax.models import norm

EPS = 1e-5


def _plain(x, scale, bias, relu):
  """The formula, differentiated by JAX (nnx.BatchNorm's fast variance)."""
  axes = tuple(range(x.ndim - 1))
  mean = jnp.mean(x, axes)
  var = jnp.maximum(0.0, jnp.mean(jnp.square(x), axes) - jnp.square(mean))
  y = (x - mean) * (jax.lax.rsqrt(var + EPS) * scale) + bias
  return (jnp.maximum(y, 0.0) if relu else y), mean, var


def _inputs(shape, seed=0):
  rng = np.random.default_rng(seed)
  c = shape[-1]
  x = rng.normal(0.3, 2.0, shape).astype(np.float32)
  return (jnp.asarray(x), jnp.asarray(rng.uniform(0.5, 1.5, c).astype(np.float32)),
          jnp.asarray(rng.normal(0.0, 0.5, c).astype(np.float32)))


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape", [(4, 5, 6, 8), (7, 3)])
def test_batch_norm_values_and_vjp_equal_autodiff(shape, relu):
  x, scale, bias = _inputs(shape, seed=len(shape))
  rng = np.random.default_rng(1)
  cts = (jnp.asarray(rng.normal(size=shape).astype(np.float32)),
         jnp.asarray(rng.normal(size=shape[-1:]).astype(np.float32)),
         jnp.asarray(rng.normal(size=shape[-1:]).astype(np.float32)))
  fused = jax.jit(lambda *a: jax.vjp(lambda *b: norm.batch_norm(*b, EPS, relu), *a))
  want, want_vjp = jax.vjp(lambda *b: _plain(*b, relu), x, scale, bias)
  got, got_vjp = fused(x, scale, bias)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
  if relu:
    assert 0.2 < float(jnp.mean(got[0] > 0)) < 0.8   # the mask matters
  for ct in (cts, (cts[0], jnp.zeros_like(cts[1]), jnp.zeros_like(cts[2]))):
    for g, w in zip(got_vjp(ct), want_vjp(ct)):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-4,
                                 atol=2e-5 * float(jnp.max(jnp.abs(w))))


def test_batch_norm_matches_nnx_batch_norm():
  x, scale, bias = _inputs((6, 4, 4, 16), seed=3)
  bn = nnx.BatchNorm(16, use_running_average=False, rngs=nnx.Rngs(0))
  bn.scale[...], bn.bias[...] = scale, bias
  y, mean, var = norm.batch_norm(x, scale, bias, bn.epsilon, False)
  np.testing.assert_allclose(np.asarray(y), np.asarray(bn(x)), rtol=1e-6, atol=1e-6)
  m = bn.momentum   # nnx's running averages after one call from (0, 1)
  np.testing.assert_allclose(np.asarray(bn.mean[...]), (1 - m) * np.asarray(mean), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(bn.var[...]), m + (1 - m) * np.asarray(var), rtol=1e-6)
