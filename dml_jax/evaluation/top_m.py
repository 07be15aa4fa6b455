"""The exact top-m search of ``knn.neighbor_relevance`` (``m`` small, about 16): tiled,
symmetric, one pass per tile, on several threads. Higher similarity = closer.

:func:`top_m_neighbors` computes the similarity matrix in tiles ``[row_tile, col_tile]``
(:func:`tile_sizes`) and merges each into every query's running best ``m``:

* When the query set is its own gallery, ``S`` is symmetric: only the tiles ``(i, j >= i)``
  are computed and ``S_ij`` updates the queries of block ``i`` while ``S_ij^T`` (never formed)
  updates those of block ``j``: half the matrix products.
* The merge (``selection='auto'``) is a C++ kernel called from the jitted tile
  (``dml_jax/kernels/top_m.cc``, ``top_m_kernel.merge_tile_kernel``): one pass over the tile that
  compares 8 similarities at a time with the rows' and the columns' running ``m``-th best and
  inserts the few that beat it. Where the kernel cannot be built (no C++ compiler) or with
  ``selection='xla'``, :func:`_merge_tile` does it with XLA: it reads only the ``m`` chunks of
  ``CHUNK`` gallery items with the highest maximum (no other item can be among the best
  ``m``), and only the best ``FEW_CHUNKS`` chunks when no query of the tile has more chunks
  above its running ``m``-th best.
* XLA:CPU runs a tile's selection on one thread, so tiles run on as many Python threads as
  CPUs, each started once its predecessors in gallery order are done (:func:`tile_waves`).

Ties. Every query merges its gallery blocks in increasing gallery order and both merges put
the earlier item first (``top_k``'s lower position; the kernel inserts an item only above
strictly lower values), so items of equal similarity are ranked by lower gallery index.
``-0.0`` is made ``+0.0`` and non-finite similarities are clipped to the finite float32 range
(:func:`sanitize`), so that masked items (self, padding; ``-inf``) are never returned.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from dml_jax import kernels
from dml_jax.evaluation import top_m_kernel
from dml_jax.similarity import pairwise_similarity

DEFAULT_MEMORY_BYTES = 1 << 28  # 256 MiB of temporaries per query block.
BYTES_PER_ENTRY = 16  # similarity + candidate value (float32) + candidate index (int32) + slack.
TILE = 2048  # Default side of the similarity tiles of top_m_neighbors.
CHUNK = 8  # Gallery items per chunk of the tile filter (see _merge_tile).
FEW_CHUNKS = 8  # Chunks read per query when no query of the tile has more entering ones.


def tile_sizes(num_query: int, num_gallery: int, *,
               memory_bytes: int = DEFAULT_MEMORY_BYTES, block_size: int | None = None,
               gallery_block_size: int | None = None) -> tuple[int, int]:
  """Tile ``[row_tile, col_tile]`` of the similarity matrix for :func:`top_m_neighbors`.

  Unless given, each side is ``min(TILE, N rounded up to CHUNK, sqrt(memory_bytes /
  BYTES_PER_ENTRY))`` rounded down to a multiple of ``CHUNK`` (at least ``CHUNK``), so that a
  query set searched against itself gets square tiles (the symmetric search).

  Returns:
    ``(row_tile, col_tile)``.
  """
  for name, value in (("num_query", num_query), ("num_gallery", num_gallery),
                      ("memory_bytes", memory_bytes)):
    check_positive_int(name, value)
  side = min(TILE, int(np.sqrt(max(1, memory_bytes // BYTES_PER_ENTRY))))
  side = max(CHUNK, side // CHUNK * CHUNK)

  def one(given, n):
    if given is not None:
      check_positive_int("block size", given)
      return given
    return min(side, -(-n // CHUNK) * CHUNK)

  return one(block_size, num_query), one(gallery_block_size, num_gallery)


def top_m_neighbors(query, gallery=None, *, m: int, kind: str = "dot", row_tile: int = TILE,
                    col_tile: int = TILE, chunk: int = CHUNK, selection: str = "auto",
                    show_progress: bool = False) -> np.ndarray:
  """Indices of the ``m`` most similar gallery items of every query (``m`` small), exact.

  ``idx[i] = argsort_j(-S_ij)[:m]`` with ``S = pairwise_similarity(query, gallery, kind)``,
  ties by lower gallery index, self excluded when ``gallery`` is ``None``. No normalisation
  is done here (pass normalised rows and ``'dot'`` for cosine).

  The similarity matrix is computed in tiles ``[row_tile, col_tile]``; each query keeps its
  best ``m`` so far, merged with each tile by :func:`_merge_tile`. When the gallery is the
  query set and the tiles are square, ``S`` is symmetric and only the tiles ``(i, j)`` with
  ``j >= i`` are computed: tile ``S_ij`` updates the queries of block ``i`` and its transpose
  those of block ``j`` (half the matrix products). Every query sees its gallery blocks in
  increasing order, so the running best always holds lower gallery indices than the tile
  (the tie order). Rows and columns are padded to whole tiles (masked with ``-inf``).

  Args:
    query: float32 ``[Nq, D]`` (numpy).
    gallery: float32 ``[Ng, D]``; ``None`` means ``query`` with self excluded.
    m: neighbours kept, ``1 <= m <= Ng`` (``Ng - 1`` when self is excluded).
    kind: a kind of :func:`dml_jax.similarity.pairwise_similarity`.
    row_tile, col_tile: the tile shape; the filter of :func:`_merge_tile` needs ``chunk``
      to divide ``col_tile`` (and ``row_tile`` when symmetric), else it is off (chunk 1).
    chunk: gallery items per chunk of the filter.
    selection: how a tile is merged: ``'kernel'``, the C++ merge of ``dml_jax/kernels/top_m.cc``
      (one pass over the tile, see :mod:`dml_jax.kernels`); ``'xla'``, the filtered
      ``lax.top_k`` of :func:`_merge_tile`; ``'rows'``, no tiles: ``lax.top_k`` over each
      query's whole row (:func:`_top_m_by_rows`); ``'auto'`` (default), whole rows from
      ``m >= ROWS_MIN_M`` on (selected by the C++ kernel where it is available), else the
      tiles with the kernel where it is available (a CPU with a C++ compiler), else XLA.
      The kernel and XLA give the same results; whole rows compute the
      products in another shape, which rounds differently in float32, so two items closer
      than that rounding (~1e-7) may come in the other order.
    show_progress: a progress bar over the query blocks.

  Returns:
    int32 ``[Nq, m]``, each row by decreasing similarity.
  """
  return _search(query, gallery, m=m, kind=kind, row_tile=row_tile, col_tile=col_tile,
                 chunk=chunk, selection=selection, show_progress=show_progress)[0]


def top_m_and_ranks(query, gallery=None, *, m: int, target_value, target_index, query_codes,
                    gallery_codes, kind: str = "dot", row_tile: int = TILE,
                    col_tile: int = TILE, chunk: int = CHUNK, selection: str = "auto",
                    show_progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """:func:`top_m_neighbors`, and in the same pass over the tiles the rank of a given item.

  Every query ``i`` names a gallery item ``t_i = target_index[i]`` of its own class (label
  code ``query_codes[i]``; gallery codes ``gallery_codes``) and its expected similarity
  ``v_i = target_value[i]``, meant to be the best item of the class (``knn`` finds them
  beforehand; ``t_i = -1``, ``v_i = +inf`` for a query with none). Each tile adds, for every
  query, the number of items ``j != t_i`` (self and padding excluded) with ``S_ij > v_i``,
  with ``S_ij = v_i``, and of its class with ``S_ij >= v_i``, and reads ``S_{i t_i}`` if it
  reaches ``v_i``. When
  that read equals ``v_i`` bit for bit, no other item equals ``v_i`` and no other item of the
  class reaches it, ``t_i`` is the query's best item of its class and exactly
  ``before_i = #{j : S_ij > v_i}`` items are ranked before it (the similarities of the tiles
  themselves, so the count agrees with the top-m lists); otherwise ``before_i = -1``
  (undecided: the caller ranks that query another way). The counts are a few comparisons per
  similarity, next to the ``D`` multiply-adds of computing it.

  Args:
    query, gallery, m, kind, row_tile, col_tile, chunk, selection, show_progress: as
      :func:`top_m_neighbors` (``selection='rows'`` is not supported here; ``'auto'`` takes
      the tiles whatever ``m``).
    target_value: float32 ``[Nq]``.
    target_index: int32 ``[Nq]``.
    query_codes: int32 ``[Nq]``, the queries' label codes.
    gallery_codes: int32 ``[Ng]``, the gallery's (the query codes when ``gallery`` is
      ``None``).

  Returns:
    ``(indices int32 [Nq, m], before int32 [Nq])``.
  """
  if selection == "rows":
    raise ValueError("top_m_and_ranks needs tiles; selection='rows' is not supported.")
  nq = np.asarray(query).shape[0]
  ranks = (np.asarray(target_value, np.float32).reshape(nq),
           np.asarray(target_index, np.int32).reshape(nq),
           np.asarray(query_codes, np.int32).reshape(nq),
           np.asarray(gallery_codes, np.int32).reshape(-1))
  return _search(query, gallery, m=m, kind=kind, row_tile=row_tile, col_tile=col_tile,
                 chunk=chunk, selection="xla" if selection == "xla" else "tiles",
                 show_progress=show_progress, ranks=ranks)


def _search(query, gallery, *, m: int, kind: str, row_tile: int, col_tile: int, chunk: int,
            selection: str, show_progress: bool, ranks=None):
  """The tiled search of :func:`top_m_neighbors` (``ranks=None``) and
  :func:`top_m_and_ranks` (``ranks = (value, index, query codes, gallery codes)``); returns
  ``(indices, before or None)``. ``selection='tiles'``: the kernel where available, else XLA,
  whatever ``m``."""
  exclude_self = gallery is None
  rows_kernel = selection == "auto"   # 'rows' itself names XLA's top_k
  if selection == "auto" and m >= ROWS_MIN_M:
    selection = "rows"
  if selection == "tiles":
    selection = "auto"
  targets = selection_targets(selection) if selection != "rows" else None
  q = np.asarray(query, np.float32)
  g = q if exclude_self else np.asarray(gallery, np.float32)
  num_query, num_gallery = q.shape[0], g.shape[0]
  check_positive_int("m", m)
  if m > num_gallery - int(exclude_self):
    raise ValueError(f"m={m} is larger than the {num_gallery - int(exclude_self)} gallery "
                     "items available.")
  if selection == "rows":
    return _top_m_by_rows(q, g, m=m, kind=kind, exclude_self=exclude_self,
                          show_progress=show_progress,
                          kernel=rows_kernel and selection_targets("auto") is not None), None
  symmetric = exclude_self and row_tile == col_tile
  if col_tile % chunk or (symmetric and row_tile % chunk):
    chunk = 1
  q_blocks = _device_blocks(q, row_tile)
  g_blocks = q_blocks if symmetric else _device_blocks(g, col_tile)
  init = (jnp.full((row_tile, m), -jnp.inf, jnp.float32), jnp.full((row_tile, m), -1, jnp.int32))
  best = [init] * len(q_blocks)
  n = np.int32(num_gallery)
  static = dict(m=m, chunk=chunk, kind=kind)
  padded = len(g_blocks) * col_tile > num_gallery
  if ranks is not None:
    value, index, q_codes, g_codes = ranks
    # Padded queries name no item (value +inf: nothing is counted); padded items match no code.
    params = [tuple(jnp.asarray(pad_values(x[start:start + row_tile], row_tile, fill))
                    for x, fill in ((value, np.inf), (index, -1), (q_codes, -1)))
              for start in range(0, num_query, row_tile)]
    codes = ([p[2] for p in params] if symmetric else
             [jnp.asarray(pad_values(g_codes[start:start + col_tile], col_tile, -2))
              for start in range(0, num_gallery, col_tile)])
    counted = [(jnp.zeros((row_tile, 3), jnp.int32),
                jnp.full((row_tile,), -jnp.inf, jnp.float32))] * len(q_blocks)

  def rank_args(i: int, j: int, both: bool):
    if ranks is None:
      return None
    out = {"a": (params[i], counted[i]), "codes_b": codes[j]}
    if both:
      out.update(b=(params[j], counted[j]), codes_a=codes[i])
    return out

  def keep(i: int, j: int, out, both: bool) -> None:
    if both:
      (best[i], best[j]), rank_out = out[:2], out[2]
    else:
      best[i], rank_out = out
    if ranks is not None:
      counted[i] = rank_out["a"]
      if both:
        counted[j] = rank_out["b"]

  def tile(i: int, j: int) -> None:
    row_start, col_start = np.int32(i * row_tile), np.int32(j * col_tile)
    both = symmetric and j > i
    r = rank_args(i, j, both)
    if targets is not None:
      starts = np.array([row_start, col_start, n], np.int32)
      if both:
        out = _tile_update_both_kernel(q_blocks[i], g_blocks[j], starts, best[i], best[j],
                                       r, kind=kind)
      else:
        out = _tile_update_kernel(q_blocks[i], g_blocks[j], starts, best[i], r, kind=kind,
                                  exclude_self=exclude_self)
    elif both:
      out = _tile_update_both(q_blocks[i], g_blocks[j], row_start, col_start, n, best[i],
                              best[j], r, mask_padding=padded and j == len(g_blocks) - 1,
                              **static)
    else:
      out = _tile_update(q_blocks[i], g_blocks[j], row_start, col_start, n, best[i], r,
                         exclude_self=exclude_self, **static)
    keep(i, j, jax.block_until_ready(out), both)

  waves = tile_waves(len(q_blocks), len(g_blocks), symmetric=symmetric)
  futures = {}

  def after(i: int, j: int) -> None:
    # A tile waits for its predecessors (tile_waves); they were submitted before it, and the
    # pool starts tasks in submission order, so they are done or running: no deadlock.
    for dep in ((i, j - 1), (i - 1, j)) if symmetric else ((i, j - 1),):
      if dep in futures:
        futures[dep].result()
    tile(i, j)

  with concurrent.futures.ThreadPoolExecutor(max_workers=num_threads()) as pool, tqdm.tqdm(
      total=sum(len(w) for w in waves), disable=not show_progress, desc="kNN", unit="tile",
      dynamic_ncols=True, mininterval=1.0) as bar:
    for wave in waves:
      for i, j in wave:
        futures[i, j] = pool.submit(after, i, j)
    for done in futures.values():
      done.result()
      bar.update(1)
  indices = np.concatenate([np.asarray(b[1]) for b in best])[:num_query]
  if ranks is None:
    return indices, None
  counts = np.concatenate([np.asarray(c[0]) for c in counted])[:num_query]
  read = np.concatenate([np.asarray(c[1]) for c in counted])[:num_query]
  decided = ((index >= 0) & (read == value) & (counts[:, 1] == 0) & (counts[:, 2] == 0))
  return indices, np.where(decided, counts[:, 0], -1).astype(np.int32)


def _rank_counts(s, q_index, g_index, num_items, params, g_codes, state, *,
                 exclude_self: bool):
  """The counts of :func:`top_m_and_ranks` for the queries of the rows of ``s [R, G]``
  (sanitised; row ``r`` is query ``q_index[r]``, column ``c`` gallery item ``g_index[c]``,
  code ``g_codes[c]``). ``params = (value [R], target [R], code [R])``; ``state = (counts
  int32 [R, 3] (above, equal, same class reaching the value), read float32 [R])``."""
  value, target, code = params
  counts, read = state
  valid = g_index[None, :] < num_items
  if exclude_self:
    valid = valid & (q_index[:, None] != g_index[None, :])
  is_target = g_index[None, :] == target[:, None]
  other = valid & ~is_target
  v = value[:, None]
  above = jnp.sum(other & (s > v), axis=1, dtype=jnp.int32)
  equal = jnp.sum(other & (s == v), axis=1, dtype=jnp.int32)
  same = jnp.sum(other & (s >= v) & (g_codes[None, :] == code[:, None]), axis=1,
                 dtype=jnp.int32)
  new_read = jnp.max(jnp.where(is_target & valid & (s >= v), s, -jnp.inf), axis=1)
  return counts + jnp.stack([above, equal, same], axis=1), jnp.maximum(read, new_read)


def _tile_ranks(s, a_index, b_index, num_items, ranks, *, exclude_self: bool):
  """The rank counts of one tile ``s [ra, rb]`` (sanitised) for its rows and, in the
  symmetric search, its columns (``ranks`` from ``_search``; ``None``: nothing)."""
  if ranks is None:
    return None
  out = {"a": _rank_counts(s, a_index, b_index, num_items, ranks["a"][0], ranks["codes_b"],
                           ranks["a"][1], exclude_self=exclude_self)}
  if "b" in ranks:
    out["b"] = _rank_counts(s.T, b_index, a_index, num_items, ranks["b"][0],
                            ranks["codes_a"], ranks["b"][1], exclude_self=False)
  return out


def pad_values(x: np.ndarray, size: int, value) -> np.ndarray:
  """``x [N]`` padded with ``value`` to ``[size]``."""
  return x if size == x.shape[0] else np.pad(x, (0, size - x.shape[0]), constant_values=value)


# From this m on, ``'auto'`` takes whole rows: ``lax.top_k`` over each query's row beats
# merging tiles into lists of m (benchmarks/speed/top_m_selection.py on 2 cores, 13,180 points:
# m = 659 rows 2.7 s against the C++ merge's 11.3 s, m = 256 1.4 against 2.4, m = 64 0.9 against
# 0.4).
ROWS_MIN_M = 256
ROWS_MEMORY_BYTES = DEFAULT_MEMORY_BYTES


def _top_m_by_rows(q: np.ndarray, g: np.ndarray, *, m: int, kind: str, exclude_self: bool,
                   show_progress: bool, kernel: bool = False) -> np.ndarray:
  """:func:`top_m_neighbors` by whole rows: query blocks against the whole gallery, each row's
  ``m`` best by ``lax.top_k`` (lower index first on ties), or with ``kernel`` by the C++
  selection (``top_m_kernel.select_rows_kernel``: the same order, in linear time per row);
  blocks on :func:`num_threads` threads; a block's ``[rows, Ng]`` similarities within
  ``ROWS_MEMORY_BYTES``."""
  rows = int(max(8, min(TILE, ROWS_MEMORY_BYTES // (4 * 4 * g.shape[0]))))
  q_blocks = _device_blocks(q, rows)
  gd = jnp.asarray(g)
  select = _rows_top_m_kernel if kernel else _rows_top_m

  def block(i: int) -> np.ndarray:
    return np.asarray(select(q_blocks[i], np.int32(i * rows), gd, m=m, kind=kind,
                             exclude_self=exclude_self))

  with concurrent.futures.ThreadPoolExecutor(max_workers=num_threads()) as pool:
    out = list(tqdm.tqdm(pool.map(block, range(len(q_blocks))), total=len(q_blocks),
                         disable=not show_progress, desc="kNN", unit="block",
                         dynamic_ncols=True, mininterval=1.0))
  return np.concatenate(out)[:q.shape[0]]


@functools.partial(jax.jit, static_argnames=("m", "kind", "exclude_self"))
def _rows_top_m(a, a_start, g, *, m: int, kind: str, exclude_self: bool) -> jax.Array:
  """int32 ``[ra, m]``: the ``m`` best gallery indices of rows ``a`` (indices ``a_start + r``)."""
  s = sanitize(pairwise_similarity(a, g, kind=kind))
  if exclude_self:
    a_index = a_start + jnp.arange(a.shape[0], dtype=jnp.int32)
    s = jnp.where(a_index[:, None] == jnp.arange(g.shape[0], dtype=jnp.int32)[None, :],
                  -jnp.inf, s)
  return jax.lax.top_k(s, m)[1].astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("m", "kind", "exclude_self"))
def _rows_top_m_kernel(a, a_start, g, *, m: int, kind: str, exclude_self: bool) -> jax.Array:
  """:func:`_rows_top_m` by the C++ selection."""
  starts = jnp.stack([a_start, jnp.int32(0), jnp.int32(g.shape[0])]).astype(jnp.int32)
  return top_m_kernel.select_rows_kernel(pairwise_similarity(a, g, kind=kind), starts, m=m,
                                         exclude_self=exclude_self)


SELECTIONS = ("auto", "kernel", "xla", "rows")


def selection_targets(selection: str) -> dict[str, str] | None:
  """The custom-call targets of the C++ tile merge for ``selection`` (see
  :func:`top_m_neighbors`), or ``None`` for the XLA merge."""
  if selection not in SELECTIONS:
    raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}.")
  try:
    return kernels.choose("top_m.cc", "xla" if selection == "rows" else selection)
  except RuntimeError as e:
    raise RuntimeError(f"selection='kernel': {e} Use selection='auto' or 'xla'.") from None


def tile_waves(num_row_blocks: int, num_col_blocks: int, *,
               symmetric: bool) -> list[list[tuple[int, int]]]:
  """The tiles ``(i, j)`` of :func:`top_m_neighbors` in waves of independent tiles, in the
  order they are started; a tile starts when its predecessors are done (the tiles of a wave
  can run at once).

  Every query block must merge its gallery blocks in increasing order (the tie rule), so
  tile ``(i, j)`` comes after ``(i, j - 1)``, and in the symmetric search (tiles ``j >= i``;
  ``(i, j)`` also updates block ``j`` with gallery block ``i``) after ``(i - 1, j)`` too. The
  anti-diagonals ``i + j = d`` satisfy both, and two tiles of one anti-diagonal never update
  the same block. Without symmetry the waves are the columns ``j``.
  """
  if symmetric:
    return [[(i, d - i) for i in range(0, d // 2 + 1) if d - i < num_col_blocks]
            for d in range(2 * num_col_blocks - 1)]
  return [[(i, j) for i in range(num_row_blocks)] for j in range(num_col_blocks)]


def num_threads() -> int:
  """Tiles run at once: the CPUs this process may use (XLA:CPU runs a tile's selection on one
  thread, so two tiles keep two cores busy), at least 1."""
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:   # not Linux
    return max(1, os.cpu_count() or 1)


def _device_blocks(x: np.ndarray, rows: int) -> list[jax.Array]:
  """``x [N, D]`` split into device arrays ``[rows, D]``, the last one zero-padded (no padded
  copy of the whole of ``x``)."""
  return [jnp.asarray(pad_rows(x[start:start + rows], rows))
          for start in range(0, x.shape[0], rows)]


def _tile_similarity(a, b, a_start, b_start, *, kind: str, exclude_self: bool):
  """``S [ra, rb]`` of rows ``a [ra, D]`` (indices ``a_start + r``) and ``b [rb, D]``, and the
  masks of padding / self: ``(s, a_index [ra], b_index [rb], self_pair [ra, rb] or None)``."""
  s = sanitize(pairwise_similarity(a, b, kind=kind))
  a_index = a_start + jnp.arange(a.shape[0], dtype=jnp.int32)
  b_index = b_start + jnp.arange(b.shape[0], dtype=jnp.int32)
  self_pair = (a_index[:, None] == b_index[None, :]) if exclude_self else None
  return s, a_index, b_index, self_pair


@functools.partial(jax.jit, static_argnames=("m", "chunk", "kind", "exclude_self"))
def _tile_update(a, b, a_start, b_start, num_items, best, ranks=None, *, m: int, chunk: int,
                 kind: str, exclude_self: bool):
  """The best ``(values [ra, m], indices [ra, m])`` of queries ``a [ra, D]`` merged with gallery
  block ``b [rb, D]`` (gallery indices ``b_start + c``; those ``>= num_items`` are padding),
  and the rank counts (:func:`_tile_ranks`)."""
  s, a_index, b_index, self_pair = _tile_similarity(a, b, a_start, b_start, kind=kind,
                                                    exclude_self=exclude_self)
  invalid = b_index[None, :] >= num_items
  if self_pair is not None:
    invalid = invalid | self_pair
  return (_merge_tile(*best, jnp.where(invalid, -jnp.inf, s), b_index, m=m, chunk=chunk),
          _tile_ranks(s, a_index, b_index, num_items, ranks, exclude_self=exclude_self))


@functools.partial(jax.jit, static_argnames=("m", "chunk", "kind", "mask_padding"))
def _tile_update_both(a, b, a_start, b_start, num_items, best_a, best_b, ranks=None, *, m: int,
                      chunk: int, kind: str, mask_padding: bool):
  """An off-diagonal tile of the symmetric search: ``S [ra, rb]`` of two different blocks of
  the query set updates the queries ``a`` (gallery ``b``) and ``S^T`` the queries ``b``
  (gallery ``a``). No pair is a self pair and ``a`` (an earlier block) is never padding;
  ``b``'s rows with index ``b_start + c >= num_items`` are, when ``mask_padding``.

  Returns:
    ``(best_a, best_b, rank counts)``, each best ``(values [r, m], indices [r, m])``.
  """
  # The barriers keep the product a plain matrix multiplication (not fused with the rest).
  s = jax.lax.optimization_barrier(pairwise_similarity(a, b, kind=kind))
  s = jax.lax.optimization_barrier(sanitize(s))
  a_index = a_start + jnp.arange(a.shape[0], dtype=jnp.int32)
  b_index = b_start + jnp.arange(b.shape[0], dtype=jnp.int32)
  s_a = jnp.where(b_index[None, :] >= num_items, -jnp.inf, s) if mask_padding else s
  return (_merge_tile(*best_a, s_a, b_index, m=m, chunk=chunk),
          _merge_tile(*best_b, s, a_index, m=m, chunk=chunk, transposed=True),
          _tile_ranks(s, a_index, b_index, num_items, ranks, exclude_self=False))


@functools.partial(jax.jit, static_argnames=("kind", "exclude_self"))
def _tile_update_kernel(a, b, starts, best, ranks=None, *, kind: str, exclude_self: bool):
  """:func:`_tile_update` with the C++ merge; ``starts`` is int32 ``[3]`` = (first query index,
  first gallery index, number of items)."""
  s = pairwise_similarity(a, b, kind=kind)
  return (top_m_kernel.merge_tile_kernel(s, starts, best, exclude_self=exclude_self)[0],
          top_m_kernel.count_tile_kernel(s, starts, ranks, exclude_self=exclude_self))


@functools.partial(jax.jit, static_argnames=("kind",))
def _tile_update_both_kernel(a, b, starts, best_a, best_b, ranks=None, *, kind: str):
  """:func:`_tile_update_both` with the C++ merge (rows into ``best_a``, columns into
  ``best_b``, in one pass over the tile)."""
  s = pairwise_similarity(a, b, kind=kind)
  return (*top_m_kernel.merge_tile_kernel(s, starts, best_a, best_b),
          top_m_kernel.count_tile_kernel(s, starts, ranks, exclude_self=False))


def _merge_tile(best_values, best_index, s, g_index, *, m: int, chunk: int,
                transposed: bool = False):
  """Top-m of ``concat(best, tile)`` by (similarity, lower gallery index), exactly.

  The tile is ``s [R, G]`` (query ``r``, gallery column ``c``), or ``s [G, R]`` read as its
  transpose when ``transposed`` (the symmetric search; the transpose is never formed).
  ``best_values, best_index [R, m]`` hold gallery indices below every ``g_index [G]`` (the
  increasing gallery indices of the tile). Filter: with ``G / chunk`` chunks of ``chunk``
  consecutive gallery items, only the ``m`` chunks of highest maximum (``lax.top_k``, ties by
  lower chunk) are read. Exact: an item in another chunk has ``m`` chunks ranked above its
  own, each holding an item ranked above it (a higher value, or an equal one at a lower
  index), so it is not among the best ``m``. The chunks are re-sorted by index, so that the
  candidates, like the tile, are in gallery-index order and ``top_k``'s lower-position tie
  rule is the lower-index rule.

  Returns:
    ``(values float32 [R, m], indices int32 [R, m])``.
  """
  width, rows = s.shape if transposed else s.shape[::-1]
  if m * chunk >= width:
    candidates = s.T if transposed else s
    cand_index = jnp.broadcast_to(g_index, candidates.shape)
    return _merge_candidates(best_values, best_index, candidates, cand_index, m=m)
  if transposed:
    chunk_max = s.reshape(width // chunk, chunk, rows).max(axis=1).T
  else:
    chunk_max = s.reshape(rows, width // chunk, chunk).max(axis=2)

  def merge_chunks(num_chunks: int):
    _, top_chunks = jax.lax.top_k(chunk_max, num_chunks)
    cols = (jnp.sort(top_chunks, axis=1)[:, :, None] * chunk
            + jnp.arange(chunk, dtype=top_chunks.dtype)).reshape(rows, num_chunks * chunk)
    if transposed:
      candidates = s[cols, jnp.arange(rows, dtype=cols.dtype)[:, None]]
    else:
      candidates = jnp.take_along_axis(s, cols, axis=1)
    return _merge_candidates(best_values, best_index, candidates, g_index[cols], m=m)

  # Only a chunk whose maximum beats the m-th best so far can hold a new neighbour (an equal
  # value in the tile has a higher gallery index and loses the tie). Once the running best is
  # good, few do: then the top FEW_CHUNKS chunks hold all of them (a cheaper selection).
  few = min(FEW_CHUNKS, m)
  if few == m:
    return merge_chunks(m)
  entering = jnp.max(jnp.sum(chunk_max > best_values[:, m - 1:], axis=1))
  return jax.lax.cond(entering <= few, lambda: merge_chunks(few), lambda: merge_chunks(m))


def _merge_candidates(best_values, best_index, candidates, cand_index, *, m: int):
  """Top-m of ``concat(best, candidates)`` (candidates after the best in gallery order)."""
  values, pos = jax.lax.top_k(jnp.concatenate([best_values, candidates], axis=1), m)
  index = jnp.take_along_axis(jnp.concatenate([best_index, cand_index], axis=1), pos, axis=1)
  return values, index


def sanitize(s: jax.Array) -> jax.Array:
  """Maps ``-0.0`` to ``+0.0`` and NaN / +-inf into the finite float32 range."""
  info = jnp.finfo(s.dtype)
  s = jnp.nan_to_num(s, nan=info.min, posinf=info.max, neginf=info.min)
  return jnp.where(s == 0.0, jnp.zeros_like(s), s)


def pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
  """``x [N, D]`` padded with zero rows to ``[rows, D]``."""
  return x if rows == x.shape[0] else np.pad(x, ((0, rows - x.shape[0]), (0, 0)))


def check_positive_int(name: str, value) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}.")
