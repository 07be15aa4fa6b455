"""The best gallery item of every query's class, from the same-class pairs alone.

``knn.neighbor_relevance`` ranks a query whose class is not among its first neighbours by
counting, in its tile pass, the items above the best item of its class
(``top_m.top_m_and_ranks``); :func:`best_relevant` finds that item and its similarity
beforehand, computing only pairs of one class, packed into small products. Higher similarity =
closer.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from dml_jax.evaluation.top_m import BYTES_PER_ENTRY
from dml_jax.evaluation.top_m import DEFAULT_MEMORY_BYTES
from dml_jax.evaluation.top_m import sanitize
from dml_jax.similarity import pairwise_similarity

CLASS_WIDTH = 64  # Gallery items per product of best_relevant (see class_width).
MAX_CLASS_WORK = 0.125  # best_relevant's products, at most this fraction of Nq x Ng ...
MIN_CLASS_WORK = 1 << 20  # ... or this many similarities (a negligible amount).


def class_width(col_tile: int) -> int:
  """The gallery items per product of :func:`best_relevant` for tiles ``col_tile`` wide.

  The ranks of the tile pass are exact only where ``S_ij*`` of a tile equals the value found
  here bit for bit. XLA:CPU computes an entry of a float32 product the same way in products
  whose gallery side is a multiple of 64 items (and, more generally, of equal width), so the
  products here are 64 wide when the tiles are a multiple of 64, else as wide as the tiles.
  Where another platform rounds differently, the pass leaves those queries undecided and they
  are ranked from whole rows, as without this step: exact either way.
  """
  return CLASS_WIDTH if col_tile % CLASS_WIDTH == 0 else col_tile


def best_relevant(query, query_codes, gallery, gallery_codes, *, kind: str, width: int,
                  memory_bytes: int = DEFAULT_MEMORY_BYTES
                  ) -> tuple[np.ndarray, np.ndarray] | None:
  """The best gallery item of every query's class: ``(value float32 [Nq], index int32 [Nq])``.

  ``index[i] = argmax_{j : code_j = code_i, j != i} S_ij`` (the lowest such ``j`` on ties) and
  ``value[i] = S_{i, index[i]}`` (sanitised as the tiles are); ``(+inf, -1)`` for a query with
  no item of its class. Only same-class pairs are computed: the queries and gallery items of
  each class are packed into products ``[width, D] x [width, D]`` (a class larger than
  ``width`` spans several), batched within ``memory_bytes``. Returns ``None`` when those
  products would exceed ``MAX_CLASS_WORK`` of the full ``Nq x Ng`` matrix and
  ``MIN_CLASS_WORK`` similarities (a few large classes: their queries nearly all find a
  relevant item among their first neighbours anyway).

  Args:
    query: float32 ``[Nq, D]`` (normalised for cosine; ``kind`` is then ``'dot'``).
    query_codes: int32 ``[Nq]`` label codes.
    gallery: float32 ``[Ng, D]``, or ``None``: the query set, self excluded.
    gallery_codes: int32 ``[Ng]`` (the query codes when ``gallery`` is ``None``).
    kind: the similarity kind of the tiles.
    width: gallery items (and queries) per product.
    memory_bytes: budget for one batch of products.
  """
  exclude_self = gallery is None
  g = query if exclude_self else gallery
  nq, ng = query.shape[0], g.shape[0]
  q_order = np.argsort(query_codes, kind="stable")
  g_order = np.argsort(gallery_codes, kind="stable")
  q_bounds = np.searchsorted(query_codes[q_order], np.arange(int(max(
      query_codes.max(initial=0), gallery_codes.max(initial=0))) + 2))
  g_bounds = np.searchsorted(gallery_codes[g_order], np.arange(q_bounds.shape[0]))
  # Units: (query rows, gallery columns) of one class, each at most `width` long.
  units = []
  for c in range(q_bounds.shape[0] - 1):
    qs, gs = q_order[q_bounds[c]:q_bounds[c + 1]], g_order[g_bounds[c]:g_bounds[c + 1]]
    if qs.size == 0 or gs.size == 0:
      continue
    for r0 in range(0, qs.size, width):
      for c0 in range(0, gs.size, width):
        units.append((qs[r0:r0 + width], gs[c0:c0 + width]))
  value = np.full(nq, np.inf, np.float32)
  index = np.full(nq, -1, np.int32)
  if not units:
    return value, index
  # Pack units into products of `width` rows and `width` columns (first fit in class order).
  products, rows, cols = [], [], []
  used_r = used_c = 0
  for qs, gs in units:
    if used_r + qs.size > width or used_c + gs.size > width:
      products.append((np.concatenate(rows), np.concatenate(cols)))
      rows, cols, used_r, used_c = [], [], 0, 0
    rows.append(qs)
    cols.append(gs)
    used_r += qs.size
    used_c += gs.size
  products.append((np.concatenate(rows), np.concatenate(cols)))
  work = len(products) * width * width
  if work > max(MAX_CLASS_WORK * nq * ng, MIN_CLASS_WORK):
    return None
  row_index = np.full((len(products), width), -1, np.int64)
  col_index = np.full((len(products), width), -1, np.int64)
  for t, (r, c) in enumerate(products):
    row_index[t, :r.size], col_index[t, :c.size] = r, c
  per_batch = max(1, memory_bytes // (BYTES_PER_ENTRY * width * (width + query.shape[1])))
  best_value = np.empty((len(products), width), np.float32)
  best_index = np.empty((len(products), width), np.int32)
  for start in range(0, len(products), per_batch):
    r, c = row_index[start:start + per_batch], col_index[start:start + per_batch]
    size = r.shape[0]
    if size < per_batch and len(products) > per_batch:   # one compiled shape
      r = np.pad(r, ((0, per_batch - size), (0, 0)), constant_values=-1)
      c = np.pad(c, ((0, per_batch - size), (0, 0)), constant_values=-1)
    r_codes = np.where(r >= 0, query_codes[np.maximum(r, 0)], -1).astype(np.int32)
    c_codes = np.where(c >= 0, gallery_codes[np.maximum(c, 0)], -2).astype(np.int32)
    v, j = _class_products(query[np.maximum(r, 0)], g[np.maximum(c, 0)], r.astype(np.int32),
                           c.astype(np.int32), r_codes, c_codes, kind=kind,
                           exclude_self=exclude_self)
    best_value[start:start + size], best_index[start:start + size] = (np.asarray(v)[:size],
                                                                      np.asarray(j)[:size])
  valid = row_index >= 0
  value[row_index[valid]] = best_value[valid]
  index[row_index[valid]] = best_index[valid]
  # A query whose class spans several column products: the best over them (lowest index on
  # ties). Rows of one class chunk repeat only then.
  flat_rows, flat_value, flat_index = row_index[valid], best_value[valid], best_index[valid]
  if np.unique(flat_rows).size < flat_rows.size:
    order = np.lexsort((flat_index, -flat_value.astype(np.float64), flat_rows))
    keep = np.ones(order.size, bool)
    keep[1:] = flat_rows[order][1:] != flat_rows[order][:-1]
    value[flat_rows[order][keep]] = flat_value[order][keep]
    index[flat_rows[order][keep]] = flat_index[order][keep]
  value[index < 0] = np.inf
  return value, index


@functools.partial(jax.jit, static_argnames=("kind", "exclude_self"))
def _class_products(q, g, q_index, g_index, q_codes, g_codes, *, kind: str,
                    exclude_self: bool):
  """Per product ``t``: the best same-code column of each row, ``(value [T, W], index
  [T, W])`` (index ``-1``, value ``-inf`` where none); ``q [T, W, D]``, ``g [T, W, D]``, and
  their indices (``-1`` padding) and codes."""
  s = sanitize(jax.vmap(functools.partial(pairwise_similarity, kind=kind))(q, g))
  ok = (q_codes[:, :, None] == g_codes[:, None, :]) & (g_index[:, None, :] >= 0)
  if exclude_self:
    ok = ok & (q_index[:, :, None] != g_index[:, None, :])
  s = jnp.where(ok, s, -jnp.inf)
  best = jnp.max(s, axis=2, keepdims=True)
  # lowest gallery index among the columns reaching the best (columns of a class are in
  # increasing index, but the packing puts classes side by side: take the index minimum)
  big = jnp.iinfo(jnp.int32).max
  at_best = ok & (s == best)
  index = jnp.min(jnp.where(at_best, g_index[:, None, :], big), axis=2)
  return best[..., 0], jnp.where(at_best.any(axis=2), index, -1)
