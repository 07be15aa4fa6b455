"""Similarities and label masks: the one convention of dml_jax is *higher = closer*.

Every miner and loss works on a similarity matrix ``S [B, B']``. Three kinds exist:

* ``'cosine'``: ``S_ij = <x_i, y_j> / (|x_i| |y_j|)``; on L2-normalised embeddings (what the
  embedding head returns) this is the dot product and ``d_ij^2 = 2 - 2 S_ij``.
* ``'dot'``: ``S_ij = <x_i, y_j>``, no normalisation.
* ``'neg_sq_euclidean'``: ``S_ij = -|x_i - y_j|^2``, for unnormalised embeddings (e.g. the 2-D
  embedding of the digits even/odd experiment); ``d_ij^2 = -S_ij``. Computed as
  ``2 <x_i, y_j> - |x_i|^2 - |y_j|^2``, whose float32 rounding grows with ``|x|^2``: for
  embeddings far from the origin compared with their distances (a norm of 200 against
  distances near 1 loses most digits), subtract their mean first (the retrieval evaluation's
  search does so itself, ``evaluation.knn``).

Precision. Every similarity is computed in float32 at full precision on every platform: the
operands are cast to float32 (also when the model runs in bfloat16) and the matrix product
carries ``jax.lax.Precision.HIGHEST`` (:func:`inner_products`). On NVIDIA GPUs since Ampere,
XLA's default for a float32 product is TF32 (a 10-bit mantissa, errors near ``1e-3`` in a
cosine, ``2e-2`` after a temperature of 0.05); on TPUs it is bfloat16 passes. Mining
decisions, loss values, cross-batch memory and the retrieval ranking of the evaluation all
read these similarities, so they equal the CPU's up to float32 rounding. The backbone is not
affected: its convolutions and dense layers keep the platform's fast default.

An objective of your own gets the same precision as long as it computes its similarities
with :func:`pairwise_similarity` (or :func:`inner_products`); a product written as
``x @ y.T`` gets the platform's default (wrap it in ``jax.default_matmul_precision('highest')``
or pass ``precision=jax.lax.Precision.HIGHEST``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

KINDS = ("cosine", "dot", "neg_sq_euclidean")
PRECISION = jax.lax.Precision.HIGHEST   # of every product of embeddings (module docstring)


def l2_normalize(x: jax.Array, *, axis: int = -1, eps: float = 1e-12) -> jax.Array:
  """Scales ``x`` to unit L2 norm along ``axis``: ``x / max(|x|, eps)``.

  Args:
    x: float array, e.g. ``[B, D]``.
    axis: the axis to normalise.
    eps: lower bound of the norm, so that a zero vector stays zero (finite gradient).
      A vector whose squared norm overflows float32 is rescaled first and still comes out
      of unit norm.

  Returns:
    Array of the shape and dtype of ``x``.
  """
  xf = x.astype(jnp.float32)
  sq = jnp.sum(jnp.square(xf), axis=axis, keepdims=True)
  # |x|^2 overflows float32 from |x| ~ 1.8e19 on; such vectors are first divided by their
  # largest |x_k| (the others are divided by 1, so their result is unchanged).
  big = jnp.isinf(sq)
  scale = jnp.where(big, jnp.max(jnp.abs(xf), axis=axis, keepdims=True), 1.0)
  xs = x / scale
  sq = jnp.where(big, jnp.sum(jnp.square(xs), axis=axis, keepdims=True), sq)
  inv = jax.lax.rsqrt(jnp.maximum(sq, eps * eps))
  return (xs * inv).astype(x.dtype)


def inner_products(x: jax.Array, y: jax.Array) -> jax.Array:
  """``x y^T`` in float32 at full precision on every platform (no TF32 or bfloat16 passes).

  Args:
    x: float ``[B, D]``.
    y: float ``[B', D]``.

  Returns:
    float32 ``[B, B']``, ``out[i, j] = <x_i, y_j>``; its gradients are computed at the same
    precision.
  """
  return jax.lax.dot_general(x.astype(jnp.float32), y.astype(jnp.float32),
                             (((1,), (1,)), ((), ())), precision=PRECISION,
                             preferred_element_type=jnp.float32)


def check_kind(kind: str) -> str:
  """Returns ``kind`` or raises ``ValueError`` naming the allowed kinds."""
  if kind not in KINDS:
    raise ValueError(f"Unknown similarity kind {kind!r}; allowed: {', '.join(KINDS)}.")
  return kind


def pairwise_similarity(x: jax.Array, y: jax.Array | None = None, *,
                        kind: str = "cosine") -> jax.Array:
  """Similarity of every row of ``x`` with every row of ``y`` (higher = closer).

  Args:
    x: float ``[B, D]``.
    y: float ``[B', D]``; ``None`` means ``y = x``.
    kind: ``'cosine'``, ``'dot'`` or ``'neg_sq_euclidean'`` (see the module docstring).

  Returns:
    float32 ``[B, B']``. Computed in float32 at full precision whatever the input dtype and
    the platform (:func:`inner_products`; the module docstring says why).
  """
  check_kind(kind)
  if x.ndim != 2:
    raise ValueError(f"embeddings must have rank 2 [B, D], got shape {x.shape}.")
  x = x.astype(jnp.float32)
  y = x if y is None else y.astype(jnp.float32)
  if y.ndim != 2 or y.shape[1] != x.shape[1]:
    raise ValueError(f"gallery must have shape [B', {x.shape[1]}], got {y.shape}.")
  if kind == "cosine":
    xn = l2_normalize(x)
    yn = xn if y is x else l2_normalize(y)
    return inner_products(xn, yn)
  if kind == "dot":
    return inner_products(x, y)
  # -|x - y|^2 = 2 <x, y> - |x|^2 - |y|^2, clipped so that it never exceeds 0.
  x2 = jnp.sum(jnp.square(x), axis=1)
  y2 = x2 if y is x else jnp.sum(jnp.square(y), axis=1)
  return jnp.minimum(2.0 * inner_products(x, y) - x2[:, None] - y2[None, :], 0.0)


def squared_distance(s: jax.Array, *, kind: str = "cosine") -> jax.Array:
  """Squared Euclidean distance implied by a similarity of the given kind.

  ``'cosine'`` (unit vectors): ``d^2 = 2 - 2 S``; ``'neg_sq_euclidean'``: ``d^2 = -S``.
  ``'dot'`` does not determine a distance and raises ``ValueError``.

  Args:
    s: similarities, any shape.
    kind: the similarity kind ``s`` was computed with.

  Returns:
    Array of the shape of ``s``, clipped at 0 from below.
  """
  check_kind(kind)
  if kind == "cosine":
    return jnp.maximum(2.0 - 2.0 * s, 0.0)
  if kind == "neg_sq_euclidean":
    return jnp.maximum(-s, 0.0)
  raise ValueError("similarity kind 'dot' defines no distance; use 'cosine' or "
                   "'neg_sq_euclidean' with a distance-based loss.")


def label_masks(labels: jax.Array, other_labels: jax.Array | None = None,
                *, exclude_self: bool | None = None) -> tuple[jax.Array, jax.Array]:
  """Positive and negative pair masks from integer labels.

  Args:
    labels: int ``[B]`` (anchor labels).
    other_labels: int ``[B']``; ``None`` means the batch against itself.
    exclude_self: remove the diagonal from the positives. Defaults to ``True`` when
      ``other_labels`` is ``None`` (self pairs are never positives or negatives).

  Returns:
    ``(pos, neg)``: bool ``[B, B']``. ``pos[i, j]`` = same label (``i != j`` when self is
    excluded), ``neg[i, j]`` = different label.
  """
  if labels.ndim != 1:
    raise ValueError(f"labels must have rank 1 [B], got shape {labels.shape}.")
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
  if other_labels is not None and other_labels.ndim != 1:
    raise ValueError(f"reference labels must have rank 1 [B'], got shape {other_labels.shape}.")
  if other_labels is not None and not jnp.issubdtype(other_labels.dtype, jnp.integer):
    raise ValueError(f"reference labels must be integers, got dtype {other_labels.dtype}.")
  same_batch = other_labels is None
  other = labels if same_batch else other_labels
  if exclude_self is None:
    exclude_self = same_batch
  same = labels[:, None] == other[None, :]
  pos = same
  if exclude_self:
    pos = same & ~jnp.eye(labels.shape[0], other.shape[0], dtype=bool)
  return pos, ~same
