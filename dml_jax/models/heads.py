"""Embedding heads: what turns backbone features into the embeddings ``[B, D]`` that the
objectives see.

The library convention: embeddings are L2-normalised by the head, so cosine
similarity is a dot product and ``d^2 = 2 - 2 S``. ``normalize=False`` keeps raw embeddings
(e.g. the 2-D embedding of the digits even/odd experiment, used with the
``'neg_sq_euclidean'`` similarity).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dml_jax import similarity


def finalize_embedding(x: jax.Array, *, normalize: bool) -> jax.Array:
  """The last step of every head: float32 and optional L2 normalisation.

  ``e = x / |x|`` (row-wise) if ``normalize`` else ``e = x``.

  Args:
    x: float ``[B, D]``.
    normalize: whether to project the rows onto the unit sphere.

  Returns:
    float32 ``[B, D]``.
  """
  if x.ndim != 2:
    raise ValueError(f"embeddings must have rank 2 [B, D], got shape {x.shape}.")
  x = x.astype(jnp.float32)
  return similarity.l2_normalize(x) if normalize else x


def global_average_pool(x: jax.Array) -> jax.Array:
  """Mean over the spatial axes: ``[B, H, W, C] -> [B, C]``, ``p_bc = mean_hw x_bhwc``."""
  if x.ndim != 4:
    raise ValueError(f"feature maps must have rank 4 [B, H, W, C], got shape {x.shape}.")
  return jnp.mean(x, axis=(1, 2))


class LinearEmbedding(nnx.Module):
  """Linear projection to the embedding, then optional L2 normalisation.

  ``e = finalize_embedding(f W + b, normalize)``: features ``f [B, F]`` -> ``e [B, D]``.
  A bare linear head on pooled features; the ResNet and BN-Inception models use
  :class:`EmbeddingHead` (pooling, optional hidden layers, then this projection).

  Args:
    in_features: ``F``.
    embedding_dim: ``D``.
    normalize: L2-normalise the output.
    rngs: ``nnx.Rngs`` for the initialisation.
  """

  def __init__(self, in_features: int, embedding_dim: int, *, normalize: bool = True,
               rngs: nnx.Rngs):
    if embedding_dim < 1:
      raise ValueError(f"embedding_dim={embedding_dim} must be >= 1.")
    self.linear = nnx.Linear(in_features, embedding_dim, rngs=rngs)
    self.normalize = normalize

  def __call__(self, features: jax.Array) -> jax.Array:
    """``[B, F] -> [B, D]`` float32."""
    return finalize_embedding(self.linear(features), normalize=self.normalize)


# --- Backbone embedding heads (ResNet / BN-Inception) ---

POOLINGS = ("avg", "max", "avg+max")


def global_max_pool(x: jax.Array) -> jax.Array:
  """Max over the spatial axes: ``[B, H, W, C] -> [B, C]``, ``p_bc = max_hw x_bhwc``."""
  if x.ndim != 4:
    raise ValueError(f"feature maps must have rank 4 [B, H, W, C], got shape {x.shape}.")
  return jnp.max(x, axis=(1, 2))


def global_pool(x: jax.Array, *, pooling: str = "avg") -> jax.Array:
  """Global pooling of a feature map, in float32: ``[B, H, W, C] -> [B, C]``.

  ``'avg'``: ``mean_hw x``; ``'max'``: ``max_hw x``; ``'avg+max'``: ``mean_hw x + max_hw x``
  (the sum, as in Roth et al.'s DML benchmark code). Default ``'avg'``.
  """
  if pooling not in POOLINGS:
    raise ValueError(f"pooling={pooling!r}; allowed: {', '.join(POOLINGS)}.")
  x = x.astype(jnp.float32)
  if pooling == "avg":
    return global_average_pool(x)
  if pooling == "max":
    return global_max_pool(x)
  return global_average_pool(x) + global_max_pool(x)


class EmbeddingHead(nnx.Module):
  """Pool -> optional hidden layers -> linear -> optional L2 normalisation, all float32.

  ``f = global_pool(x, pooling)`` ``[B, F]``; ``h_k = relu(h_{k-1} W_k + b_k)`` for each width in
  ``hidden`` (none by default); ``e = finalize_embedding(h W + b, normalize)`` ``[B, D]``.
  The parameters live under ``hidden`` (an ``nnx.List``) and ``linear``.

  Args:
    in_features: ``F`` (channels of the feature map).
    embedding_dim: ``D``.
    pooling: ``'avg'`` (default), ``'max'`` or ``'avg+max'``.
    hidden: widths of the optional hidden layers; default ``()``.
    normalize: L2-normalise the output (default True).
    rngs: ``nnx.Rngs`` for the initialisation.
  """

  def __init__(self, in_features: int, embedding_dim: int, *, pooling: str = "avg",
               hidden: tuple[int, ...] = (), normalize: bool = True, rngs: nnx.Rngs):
    if embedding_dim < 1:
      raise ValueError(f"embedding_dim={embedding_dim} must be >= 1.")
    if pooling not in POOLINGS:
      raise ValueError(f"pooling={pooling!r}; allowed: {', '.join(POOLINGS)}.")
    if any(w < 1 for w in hidden):
      raise ValueError(f"embedding_hidden={tuple(hidden)}: every hidden width must be >= 1.")
    widths = (in_features, *hidden)
    self.pooling = pooling
    self.normalize = normalize
    self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths, widths[1:])])
    self.linear = nnx.Linear(widths[-1], embedding_dim, rngs=rngs)

  def pool(self, x: jax.Array) -> jax.Array:
    """``[B, H, W, F] -> [B, F]`` float32."""
    return global_pool(x, pooling=self.pooling)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Feature map ``[B, H, W, F]`` -> float32 embeddings ``[B, D]``."""
    h = self.pool(x)
    for layer in self.hidden:
      h = nnx.relu(layer(h))
    return finalize_embedding(self.linear(h), normalize=self.normalize)
