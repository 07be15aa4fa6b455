"""Private helpers of the miners: input checks, PRNG-key checks, row-wise ``searchsorted`` and
uniform / inverse-CDF draws."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def check_inputs(s: jax.Array, mask: jax.Array, what: str) -> jax.Array:
  """``s`` as float32 under stop-gradient; ``ValueError`` unless ``s`` is ``[B, N]`` and
  ``mask`` bool of its shape."""
  if s.ndim != 2:
    raise ValueError(f"scores must have rank 2 [B, N], got shape {s.shape}.")
  if mask.shape != s.shape or mask.dtype != jnp.bool_:
    raise ValueError(f"{what} must be bool with the shape of the scores {s.shape}, "
                     f"got {mask.dtype} {mask.shape}.")
  return jax.lax.stop_gradient(s.astype(jnp.float32))


def need_key(key, mode: str):
  """``key``, or ``ValueError`` saying ``mode`` draws random numbers."""
  if key is None:
    raise ValueError(f"mode {mode!r} draws random numbers; pass a PRNG key (key=...).")
  return key


def search_rows(sorted_rows: jax.Array, values: jax.Array, *, side: str) -> jax.Array:
  """Row-wise ``searchsorted``: ``[B, N]`` sorted rows, ``[B, P]`` values -> int32 ``[B, P]``."""
  fn = lambda row, v: jnp.searchsorted(row, v, side=side)
  return jax.vmap(fn)(sorted_rows, values).astype(jnp.int32)


def uniform_in_range(key: jax.Array, lo: jax.Array, count: jax.Array) -> jax.Array:
  """A uniform integer in ``[lo, lo + count)`` per entry (``lo`` where ``count == 0``)."""
  u = jax.random.uniform(key, lo.shape, jnp.float32)
  offset = jnp.minimum(jnp.floor(u * count).astype(jnp.int32), jnp.maximum(count - 1, 0))
  return lo + offset


def inverse_cdf_rows(key: jax.Array, weights: jax.Array, num_draws: int) -> jax.Array:
  """Per row of ``weights [B, N]`` (>= 0), ``num_draws`` independent draws ``j ~ w_j / sum w``.

  Inverse CDF: ``c = cumsum(w)``, ``u ~ U[0, 1)``, ``j = min{j : c_j > u c_N}`` via a row-wise
  ``searchsorted`` (``O(B N log N)`` time, ``O(B N)`` memory). A zero-weight entry is never
  drawn (clamped to the row's last positive entry against rounding). Rows that are all zero
  give an arbitrary index. Returns int32 ``[B, num_draws]``.
  """
  b, n = weights.shape
  cdf = jnp.cumsum(weights, axis=1)
  u = jax.random.uniform(key, (b, num_draws), jnp.float32)
  idx = search_rows(cdf, u * cdf[:, -1:], side="right")
  last = (n - 1 - jnp.argmax(weights[:, ::-1] > 0, axis=1)).astype(jnp.int32)
  return jnp.minimum(idx, last[:, None])
