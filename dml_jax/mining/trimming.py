"""Trimming: keep the easiest terms of a batch (the trimmed loss of Shen & Sanghavi 2019, as
tested in the EPS paper), computed under stop-gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dml_jax import hparams

def keep_easiest(values: jax.Array, valid: jax.Array, *, keep_fraction: float) -> jax.Array:
  """Trimming: the ``k = ceil(keep_fraction * n_valid)`` valid terms of lowest value.

  The trimmed loss of Shen & Sanghavi (2019) as tested in the EPS paper (App. C, "Trimmed loss
  comparison"): back-propagate only the terms of the batch with the lowest current loss.
  Computed under stop-gradient: rank all valid terms by value (invalid ones last; ties by
  flat index, row-major, stable sort) and keep ranks ``< k``. ``O(T log T)`` for ``T`` terms,
  computed without the rank scatter: the ``k``-th smallest value ``v_k`` by a plain sort, then
  the terms ``< v_k`` and the first ``k - #{< v_k}`` valid terms equal to ``v_k`` (cumulative
  count in flat order): the same selection.
  ``k >= 1`` whenever a term is valid; ``keep_fraction = 1`` keeps every valid term.

  Args:
    values: float, any shape (e.g. per-term losses ``[B, N]``).
    valid: bool, the shape of ``values``.
    keep_fraction: in ``(0, 1]``.

  Returns:
    bool of the shape of ``values``: the kept terms (a subset of ``valid``).
  """
  hparams.fraction("keep_fraction", keep_fraction)
  if valid.shape != values.shape or valid.dtype != jnp.bool_:
    raise ValueError(f"valid must be bool with the shape of the values {values.shape}, "
                     f"got {valid.dtype} {valid.shape}.")
  ok = valid.ravel()
  v = jnp.where(ok, jax.lax.stop_gradient(values).astype(jnp.float32).ravel(), jnp.inf)
  n_valid = jnp.sum(valid, dtype=jnp.float32)
  # ceil(f n); the factor 1 - 1e-6 absorbs float32 rounding of f * n at exact integers.
  k = jnp.ceil(keep_fraction * n_valid * (1.0 - 1e-6)).astype(jnp.int32)
  # The k-th smallest valid value by a keys-only sort; keep everything below it and, of the
  # valid terms equal to it, the first ones in flat order: the ranks < k of a stable sort.
  thr = jnp.sort(v)[jnp.maximum(k - 1, 0)]
  below = ok & (v < thr)
  ties = ok & (v == thr)
  tie_rank = jnp.cumsum(ties, dtype=jnp.int32) - 1
  keep = below | (ties & (tie_rank < k - jnp.sum(below, dtype=jnp.int32)))
  return (keep & (k > 0)).reshape(values.shape)
