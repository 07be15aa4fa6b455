"""Embedding heads: what turns backbone features into the embeddings ``[B, D]`` that the
objectives see.

The library convention (DESIGN.md): embeddings are L2-normalised by the head, so cosine
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
  The head of the ResNet backbones (after ``global_average_pool``).

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
