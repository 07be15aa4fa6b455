"""Tests of the small CNN, the embedding heads and the model registry."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dml_jax import models

B = 4
X = jax.random.uniform(jax.random.key(0), (B, 8, 8, 1))


def _model(dim=2, normalize=True, seed=0):
  return models.make("small_cnn", embedding_dim=dim, normalize=normalize, rngs=nnx.Rngs(seed))


@nnx.jit
def _embed(model, x):
  return model(x)


@nnx.jit
def _loss_and_grads(model, x):
  def loss_fn(m):
    e = m(x)
    return jnp.sum(jnp.square(e[0] - e[1])) - jnp.sum(jnp.square(e[0] - e[2]))
  return nnx.value_and_grad(loss_fn)(model)


@pytest.mark.parametrize("dim", [2, 64])
@pytest.mark.parametrize("normalize", [True, False])
def test_output_shape_dtype_and_norm(dim, normalize):
  model = _model(dim, normalize)
  e = _embed(model, X)
  chex.assert_shape(e, (B, dim))
  chex.assert_type(e, jnp.float32)
  chex.assert_tree_all_finite(e)
  norms = np.linalg.norm(np.asarray(e), axis=1)
  if normalize:
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
  else:
    assert np.all(np.abs(norms - 1.0) > 1e-3), norms


def test_normalize_only_rescales_the_raw_embedding():
  raw = _embed(_model(normalize=False), X)
  unit = _embed(_model(normalize=True), X)  # same seed -> same weights
  np.testing.assert_allclose(unit, raw / jnp.linalg.norm(raw, axis=1, keepdims=True),
                             rtol=1e-5, atol=1e-6)


def test_eval_mode_is_deterministic_and_per_example():
  model = _model(dim=8)
  _embed(model, X)  # one train step so the running statistics are not the initial ones
  model.eval()
  other = X.at[1:].set(jax.random.uniform(jax.random.key(1), (B - 1, 8, 8, 1)))
  a, b, c = _embed(model, X), _embed(model, X), _embed(model, other)
  np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(a[0], c[0], rtol=1e-5, atol=1e-6)  # independent of the others
  # In train mode the batch statistics couple the examples.
  model.train()
  assert not np.allclose(_embed(model, X)[0], _embed(model, other)[0], atol=1e-4)


def test_train_forward_updates_running_statistics_with_momentum():
  model = _model(dim=8)
  mean0, var0 = model.bn1.mean[...], model.bn1.var[...]
  np.testing.assert_array_equal(mean0, 0.0)
  h = nnx.relu(model.conv1(X))  # input of bn1
  _embed(model, X)
  np.testing.assert_allclose(model.bn1.mean[...], 0.9 * mean0 + 0.1 * h.mean((0, 1, 2)),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(model.bn1.var[...], 0.9 * var0 + 0.1 * h.var((0, 1, 2)),
                             rtol=1e-4, atol=1e-6)
  assert not np.allclose(model.bn2.mean[...], 0.0)
  # Eval mode leaves them alone.
  model.eval()
  frozen = model.bn2.mean[...]
  _embed(model, X)
  np.testing.assert_array_equal(model.bn2.mean[...], frozen)


def test_value_and_grad_under_jit_gives_finite_nonzero_gradients():
  model = _model(dim=2)
  loss, grads = _loss_and_grads(model, X)
  assert jnp.isfinite(loss)
  chex.assert_tree_all_finite(grads)
  for name in ("conv1", "conv2", "dense1", "dense2"):
    kernel = getattr(grads, name).kernel[...]
    assert jnp.any(kernel != 0), name
  # Gradients are taken w.r.t. parameters only: no BatchStat in the gradient state.
  assert not jax.tree.leaves(nnx.state(grads, nnx.BatchStat))


def test_heads():
  x = jnp.array([[3.0, 4.0], [0.0, 0.0]])
  np.testing.assert_allclose(models.finalize_embedding(x, normalize=True), [[0.6, 0.8], [0, 0]])
  np.testing.assert_array_equal(models.finalize_embedding(x, normalize=False), x)
  fmap = jnp.arange(2 * 2 * 3 * 5, dtype=jnp.float32).reshape(2, 2, 3, 5)
  np.testing.assert_allclose(models.global_average_pool(fmap), fmap.mean((1, 2)))
  head = models.LinearEmbedding(5, 3, rngs=nnx.Rngs(0))
  e = head(models.global_average_pool(fmap))
  chex.assert_shape(e, (2, 3))
  np.testing.assert_allclose(jnp.linalg.norm(e, axis=1), 1.0, rtol=1e-5)


def test_registry_and_errors():
  assert models.MODELS["small_cnn"] is models.SmallCNN and "small_cnn" in models.names()
  with pytest.raises(ValueError, match="'resnet9'.*small_cnn"):
    models.make("resnet9", embedding_dim=2, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"\['widht'\].*image_size"):
    models.make("small_cnn", embedding_dim=2, rngs=nnx.Rngs(0), widht=3)
  model = models.make("small_cnn", embedding_dim=3, image_size=(6, 10), in_channels=3,
                      rngs=nnx.Rngs(0))
  chex.assert_shape(model(jnp.zeros((2, 6, 10, 3))), (2, 3))
  with pytest.raises(ValueError, match=r"\[B, 6, 10, 3\], got shape \(2, 8, 8, 1\)"):
    model(jnp.zeros((2, 8, 8, 1)))
