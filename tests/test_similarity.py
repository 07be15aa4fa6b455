"""Similarities (dml_jax/similarity.py) at the edges of float32: normalisation of embeddings
whose squared norm overflows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dml_jax import similarity as sim


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cosine_of_embeddings_with_huge_norms(dtype):
  """|x|^2 overflows float32 from |x| ~ 1.8e19 on; the cosine must not collapse to 0."""
  x = np.array([[1e20, 0.0, 0.0], [2e20, 2e19, 0.0], [3e25, -4e25, 0.0], [1.0, 1.0, 0.0]])
  xd = jnp.asarray(x, dtype)
  exact = np.asarray(xd, np.float64)
  exact = exact / np.linalg.norm(exact, axis=1, keepdims=True)
  unit = np.asarray(sim.l2_normalize(xd), np.float64)
  np.testing.assert_allclose(unit, exact, atol=1e-2 if dtype == jnp.bfloat16 else 1e-6)
  s = np.asarray(sim.pairwise_similarity(xd, kind="cosine"))
  np.testing.assert_allclose(s, exact @ exact.T, atol=1e-5)
  grad = jax.grad(lambda x: jnp.sum(sim.pairwise_similarity(x, kind="cosine")[0]))(
      jnp.asarray(x, jnp.float32))
  assert np.all(np.isfinite(np.asarray(grad)))
