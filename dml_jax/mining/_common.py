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


def _cdf_rows(weights: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per row of ``weights [B, N]`` (>= 0): its CDF, searched by the draws, and the index of its
  last positive entry (int32 ``[B]``, the clamp of a draw).

  XLA's ``cumsum`` (a windowed reduction) does not add in sequence, so by rounding ``c`` can
  step up at a zero weight or down elsewhere; the returned CDF is therefore the running
  maximum of ``c`` over the positive entries (exact), flat across zero weights, and a draw
  searched in it never lands on a zero weight once clamped to the row's last positive entry.
  """
  n = weights.shape[1]
  cdf = jax.lax.cummax(jnp.where(weights > 0, jnp.cumsum(weights, axis=1), 0.0), axis=1)
  last = (n - 1 - jnp.argmax(weights[:, ::-1] > 0, axis=1)).astype(jnp.int32)
  return cdf, last


def inverse_cdf_rows(key: jax.Array, weights: jax.Array, num_draws: int) -> jax.Array:
  """Per row of ``weights [B, N]`` (>= 0), ``num_draws`` independent draws ``j ~ w_j / sum w``.

  Inverse CDF: ``c = cumsum(w)``, ``u ~ U[0, 1)``, ``j = min{j : c_j > u c_N}`` via a row-wise
  ``searchsorted`` (``O(B N log N)`` time, ``O(B N)`` memory). A zero-weight entry is never
  drawn (:func:`_cdf_rows`). Rows that are all zero give an arbitrary index. A row resolves
  weights down to float32's rounding of its total (``~6e-8`` of it); for draws over a whole
  matrix use :func:`inverse_cdf_matrix`. Returns int32 ``[B, num_draws]``.
  """
  b, _ = weights.shape
  cdf, last = _cdf_rows(weights)
  u = jax.random.uniform(key, (b, num_draws), jnp.float32)
  idx = search_rows(cdf, u * cdf[:, -1:], side="right")
  return jnp.minimum(idx, last[:, None])


def search_gathered(sorted_rows: jax.Array, rows: jax.Array, values: jax.Array) -> jax.Array:
  """``searchsorted(sorted_rows[rows[k]], values[k], side='right')`` for every ``k``.

  A binary search that reads one entry of the selected row per step (``O(K log N)`` time,
  ``O(K)`` memory; no ``[K, N]`` gather). ``sorted_rows [B, N]`` non-decreasing rows, ``rows``
  int ``[K]``, ``values`` ``[K]`` -> int32 ``[K]`` in ``[0, N]``.
  """
  n = sorted_rows.shape[1]
  lo = jnp.zeros(rows.shape, jnp.int32)
  hi = jnp.full(rows.shape, n, jnp.int32)
  for _ in range(n.bit_length()):   # the interval [lo, hi) halves each step
    mid = (lo + hi) // 2
    right = sorted_rows[rows, jnp.minimum(mid, n - 1)] <= values
    open_ = lo < hi
    lo = jnp.where(open_ & right, mid + 1, lo)
    hi = jnp.where(open_ & ~right, mid, hi)
  return lo


def inverse_cdf_matrix(key: jax.Array, weights: jax.Array, num_draws: int) -> jax.Array:
  """``num_draws`` independent draws of an entry ``(r, j) ~ w_rj / sum w`` of ``weights [B, N]``.

  Two stages, each from its own uniform: a row ``r`` by inverse CDF over the row totals, then
  a column ``j`` by inverse CDF over row ``r`` (:func:`search_gathered`). One float32 CDF over
  all ``B N`` entries cannot do this: its total's rounding step (``~6e-8`` of it) is already a
  sizeable part of a typical entry at ``B N ~ 10^5`` and exceeds it beyond ``~10^7``, so entries
  lighter than their neighbours are drawn too rarely or never. In two stages a row total is
  resolved to ``~6e-8`` of the matrix total and an entry to ``~6e-8`` of its row's. A
  zero-weight entry (and a zero row) is never drawn; an all-zero matrix gives an arbitrary
  index. ``O(B N + num_draws (log B + log N))`` time, ``O(B N + num_draws)`` memory.

  Returns:
    int32 ``[num_draws]`` flat indices ``r N + j``.
  """
  n = weights.shape[1]
  key_row, key_col = jax.random.split(key)
  rows = inverse_cdf_rows(key_row, jnp.sum(weights, axis=1)[None, :], num_draws)[0]
  cdf, last = _cdf_rows(weights)
  u = jax.random.uniform(key_col, (num_draws,), jnp.float32)
  cols = jnp.minimum(search_gathered(cdf, rows, u * cdf[rows, -1]), last[rows])
  return rows * n + cols


# --- Compacted rows: few True entries per row as a fixed [B, P] index array ---------------
#
# In n-per-class batches every anchor has few positives (``n - 1``), so a per-(anchor,
# positive) computation over the anchor's row costs ``O(B P N)`` on the compacted positives
# instead of ``O(B N^2)`` on the full mask (or a row sort). ``P`` must be static: the callers
# pick the smallest of a few static sizes that holds the batch's largest row count at run time
# (``lax.switch``), falling back to their general path when no size does.

COMPACT_SIZES = (8, 16, 32, 64)   # static row sizes P tried before the general path


def compact_sizes(n: int, sizes: tuple[int, ...] = COMPACT_SIZES) -> tuple[int, ...]:
  """The sizes ``P`` to try for rows of length ``n``: ``sizes`` (ascending) clipped to ``n``,
  without repeats. When the last is ``n`` every row fits and no general path is needed."""
  return tuple(sorted({min(p, n) for p in sizes}))


def size_index(count_max: jax.Array, sizes: tuple[int, ...]) -> jax.Array:
  """int32 scalar: the index of the smallest ``P`` in ``sizes`` (ascending) with
  ``count_max <= P``, or ``len(sizes)`` when none is large enough (the general path)."""
  return jnp.sum(count_max > jnp.asarray(sizes, jnp.int32), dtype=jnp.int32)


def by_row_count(mask: jax.Array, compacted, general, *operands,
                 sizes: tuple[int, ...] = COMPACT_SIZES):
  """``compacted(P, *operands)`` for the smallest ``P`` of ``compact_sizes(N, sizes)`` that
  holds every row's True count of ``mask [B, N]``, else ``general(*operands)``: chosen at run
  time (``lax.switch``, one trace; every branch is compiled, one runs)."""
  sizes = compact_sizes(mask.shape[1], sizes)
  branches = [lambda *ops, p=p: compacted(p, *ops) for p in sizes]
  if sizes[-1] < mask.shape[1]:
    branches.append(general)
  if len(branches) == 1:
    return branches[0](*operands)
  count = jnp.max(jnp.sum(mask, axis=1, dtype=jnp.int32))
  return jax.lax.switch(size_index(count, sizes), branches, *operands)


def compact_rows(mask: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
  """The first ``size`` True entries of each row of ``mask``, in index order.

  ``idx[a, k]`` = the column of the ``(k+1)``-th True entry of row ``a`` and
  ``ok[a, k] = k < |mask_a|`` (``idx`` is arbitrary where not ``ok``). Computed as ``top_k`` of
  ``where(mask, N - n, 0)`` (distinct positive keys on the True entries, larger for smaller
  ``n``; exact for ``N < 2^24``), ``O(B N log P)``. Rows with more than ``size`` True entries
  are cut (callers only use ``size >= max_a |mask_a|``).

  Args:
    mask: bool ``[B, N]``.
    size: static ``1 <= P <= N``.

  Returns:
    ``(idx, ok)``: int32 ``[B, P]``, bool ``[B, P]``.
  """
  n = mask.shape[1]
  if n >= 2 ** 24:
    raise ValueError(f"compact_rows needs rows shorter than 2^24, got {n}.")
  keys = jnp.where(mask, (n - jnp.arange(n)).astype(jnp.float32), 0.0)
  vals, idx = jax.lax.top_k(keys, size)
  return idx.astype(jnp.int32), vals > 0


def scatter_rows(values: jax.Array, idx: jax.Array, ok: jax.Array, *, num: int) -> jax.Array:
  """Inverse of :func:`compact_rows`: ``out[a, idx[a, k]] = values[a, k]`` where ``ok``, 0
  elsewhere (a scatter-add of ``B P`` entries; the ``idx`` of a row are distinct where ``ok``,
  so differentiable in ``values`` as a gather).

  Args:
    values: numeric ``[B, P]``.
    idx: int32 ``[B, P]`` columns in ``[0, num)`` where ``ok``.
    ok: bool ``[B, P]``.
    num: ``N``.

  Returns:
    ``[B, N]`` of ``values``' dtype.
  """
  b = values.shape[0]
  rows = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], idx.shape)
  cols = jnp.where(ok, idx, num)                                  # out of range: dropped
  return jnp.zeros((b, num), values.dtype).at[rows, cols].add(values, mode="drop")
