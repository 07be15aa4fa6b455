"""Exact, blocked k-nearest-neighbour search (higher similarity = closer).

``nearest_neighbors(query, gallery, k=k)`` returns, for every query row, the ``k`` gallery rows
of highest similarity ``S_ij`` (a kind of :func:`dml_jax.similarity.pairwise_similarity`),
sorted by decreasing similarity. ``neighbor_relevance(query, query_labels, gallery,
gallery_labels, k=k, num_columns=r)`` returns only what the retrieval metrics need (the rank
of the first neighbour of the query's class and the relevance of the first ``r`` neighbours),
so that nothing of size ``[Nq, k]`` is copied to the host.

``nearest_neighbors``: queries are processed in blocks of ``block_size`` rows; the gallery is
scanned in blocks of ``gallery_block_size`` rows with a running top-k merge:

  candidates = concat(best k so far, S[q_block, g_block]);  best = top_k(candidates, k)

so the largest temporary is ``[block_size, k + gallery_block_size]``, never ``[Nq, Ng]`` (the
whole gallery ``[Ng, D]`` is held on the device once). Without explicit sizes both are derived
from ``memory_bytes`` (see :func:`block_sizes`). The last query block is padded to the block
size and the gallery is padded to a whole number of blocks (padded rows are masked out), so the
block function compiles once per block shape, whatever the number of queries. For
``'cosine'`` the rows are L2-normalised once before the search and the blocks use the dot
product (the same numbers as normalising inside every block, without re-normalising the gallery
for every query block).

``neighbor_relevance`` never sorts ``k`` (about 1000) items per query; it needs only
``m = min(k, max(num_columns, MIN_SELECTED))`` neighbours and one rank:

1. ``top_m.top_m_neighbors``: the exact ``m`` best neighbours of every query, from tiles of
   ``S``; symmetric (half the matrix products) when the query set is its own gallery,
   filtered by chunk maxima, on several threads (see the ``top_m`` module).
2. A query with an item of its class among its ``m`` best has ``first`` and ``relevant`` from
   them (``num_columns <= m``). The others have ``relevant`` all False and ``first`` = the
   number of items ranked before the best item of their class. That item and its similarity
   are found first from the same-class pairs alone (``same_class.best_relevant``, a small fraction
   of the products when classes are small), and the tile pass of step 1 counts, per query, the
   items above it (``top_m.top_m_and_ranks``: a comparison per similarity, in the C++ kernel
   next to the merge), so embeddings whose queries rarely find their class nearby (an
   untrained model, a hard dataset) cost one symmetric pass, not a second full product. A
   query the pass cannot decide exactly (a tie at that similarity, or products that round
   differently from those) is counted on its whole similarity row
   (:func:`_first_relevant_rank`), as are all of them where the counts are not taken (a few
   large classes; XLA:CPU without the kernel, whose reductions cost more than the product).

Both give exactly the answer of the top-k search (the tests compare them with a brute-force
oracle, ties included). Memory: the embeddings once on the device, the ``[Nq, m]`` running
best and a few tiles.

Ties. Items of equal similarity are ranked by lower gallery index. ``jax.lax.top_k``
documents this ("if two elements are equal, the lower-index element appears first"); the merge
keeps it because the running best (earlier gallery blocks, lower indices) comes first in the
candidates. ``top_k`` orders ``-0.0`` below ``+0.0``, so zeros are made positive before the
search, and non-finite similarities (overflow) are clipped to the finite float32 range, so
that masked items (self, padding; ``-inf``) are never returned.

Precision. Every tile of ``S`` is a float32 product at full precision on every platform
(``similarity.inner_products``): on a GPU, where XLA's default float32 product is TF32, two
neighbours closer than TF32's resolution (about ``1e-3`` in a cosine) would otherwise swap, and
the ranking would differ from the CPU's. With it the search is exact at float32 precision
everywhere: the GPU's neighbours and metrics equal the CPU's on the same embeddings, up to ties
that float32 rounding itself decides. ``'neg_sq_euclidean'`` computes
``2 <x, y> - |x|^2 - |y|^2``, whose rounding grows with ``|x|^2``: the search first moves the
embeddings by the gallery's mean rounded to whole numbers (the distances do not change), so
the error scales with their spread, not with how far from the origin they lie.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from dml_jax import kernels
from dml_jax.evaluation import same_class
from dml_jax.evaluation.top_m import BYTES_PER_ENTRY
from dml_jax.evaluation.top_m import DEFAULT_MEMORY_BYTES
from dml_jax.evaluation.top_m import ROWS_MIN_M
from dml_jax.evaluation.top_m import check_positive_int as _check_positive_int
from dml_jax.evaluation.top_m import num_threads as _num_threads
from dml_jax.evaluation.top_m import pad_rows as _pad_rows
from dml_jax.evaluation.top_m import pad_values as _pad_values
from dml_jax.evaluation.top_m import sanitize as _sanitize
from dml_jax.evaluation.top_m import tile_sizes
from dml_jax.evaluation.top_m import top_m_and_ranks
from dml_jax.evaluation.top_m import top_m_neighbors
from dml_jax.similarity import check_kind
from dml_jax.similarity import l2_normalize
from dml_jax.similarity import pairwise_similarity

MIN_QUERY_BLOCK = 256  # The whole gallery is scanned at once if this many queries fit.
MAX_LISTED_ROWS = 10  # Rows named in the error for non-finite embeddings.
MIN_SELECTED = 16  # Neighbours kept per query by neighbor_relevance (at least num_columns).


def block_sizes(num_query: int, num_gallery: int, k: int, *,
                memory_bytes: int = DEFAULT_MEMORY_BYTES,
                block_size: int | None = None,
                gallery_block_size: int | None = None) -> tuple[int, int]:
  """Query and gallery block sizes whose temporaries fit in ``memory_bytes``.

  The temporaries of one block take about
  ``BYTES_PER_ENTRY * block_size * (gallery_block_size + k)`` bytes. Unless given:

  * ``gallery_block_size = Ng`` if ``min(MIN_QUERY_BLOCK, Nq)`` queries against the whole
    gallery fit, else the largest size for which they fit;
  * ``block_size = memory_bytes // (BYTES_PER_ENTRY * (gallery_block_size + k))``, clamped to
    ``[1, Nq]``.

  A given ``block_size`` is kept even when ``Nq`` is smaller (the block is padded), so that
  every number of queries reuses one compiled block; ``gallery_block_size`` is clamped to
  ``Ng``.

  Args:
    num_query: ``Nq``, the number of queries.
    num_gallery: ``Ng``, the number of gallery items.
    k: the number of neighbours kept per query.
    memory_bytes: budget for the temporaries of one query block.
    block_size: queries per block; ``None`` derives it from the budget.
    gallery_block_size: gallery items per scan step; ``None`` derives it from the budget.

  Returns:
    ``(block_size, gallery_block_size)``.
  """
  for name, value in (("num_query", num_query), ("num_gallery", num_gallery), ("k", k),
                      ("memory_bytes", memory_bytes)):
    _check_positive_int(name, value)
  if block_size is not None:
    _check_positive_int("block_size", block_size)
  if gallery_block_size is not None:
    _check_positive_int("gallery_block_size", gallery_block_size)
  entries = max(1, memory_bytes // BYTES_PER_ENTRY)
  if gallery_block_size is None:
    rows = block_size if block_size is not None else min(MIN_QUERY_BLOCK, num_query)
    gallery_block_size = max(1, entries // rows - k)
  gallery_block_size = min(gallery_block_size, num_gallery)
  if block_size is None:
    block_size = min(max(1, entries // (gallery_block_size + k)), num_query)
  return block_size, gallery_block_size


def nearest_neighbors(query, gallery=None, *, k: int, similarity: str = "cosine",
                      block_size: int | None = None,
                      gallery_block_size: int | None = None,
                      memory_bytes: int = DEFAULT_MEMORY_BYTES,
                      show_progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """The ``k`` most similar gallery items of every query, exact, in blocks.

  ``idx[i] = argsort_j(-S_ij)[:k]`` with ``S = pairwise_similarity(query, gallery)``, ties
  broken by lower gallery index ``j``; when ``gallery`` is ``None`` the query set is its own
  gallery and ``j = i`` is excluded.

  Args:
    query: float ``[Nq, D]`` (numpy or JAX array; copied to the host as float32).
    gallery: float ``[Ng, D]``; ``None`` means ``query`` with self excluded.
    k: neighbours per query, ``1 <= k <= Ng`` (``Ng - 1`` when self is excluded).
    similarity: ``'cosine'``, ``'dot'`` or ``'neg_sq_euclidean'``.
    block_size: queries per block (the last block is padded); ``None``: from the budget.
    gallery_block_size: gallery items per scan step; ``None``: from the budget.
    memory_bytes: budget for the temporaries of one block (see :func:`block_sizes`).
    show_progress: a progress bar over the query blocks.

  Returns:
    ``(indices, similarities)``: numpy int32 ``[Nq, k]`` gallery indices and float32
    ``[Nq, k]`` similarities, each row sorted by decreasing similarity.
  """
  plan = _plan(query, gallery, k=k, similarity=similarity, block_size=block_size,
               gallery_block_size=gallery_block_size, memory_bytes=memory_bytes)

  def block_fn(q, start):
    return _block_top_k(q, _self_index(start, q.shape[0], plan.exclude_self), plan.g_blocks,
                        plan.num_gallery, k=k, kind=plan.kind)

  indices, sims = _run_blocks(plan, block_fn, show_progress=show_progress)
  return indices, sims


def neighbor_relevance(query, query_labels, gallery=None, gallery_labels=None, *, k: int,
                       num_columns: int, similarity: str = "cosine",
                       block_size: int | None = None, gallery_block_size: int | None = None,
                       memory_bytes: int = DEFAULT_MEMORY_BYTES,
                       show_progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """Which of the ``k`` nearest gallery items of every query share its label.

  With ``n_1, ..., n_k`` the neighbours of :func:`nearest_neighbors` (same search, ties by
  lower gallery index, self excluded when ``gallery`` is ``None``) and
  ``rel(r) = [y^g_{n_r} = y^q_i]``:

  * ``first[i] = min{r - 1 : rel(r)}``, the 0-based rank of the first neighbour of the
    query's class, or ``k`` when none of the ``k`` neighbours is;
  * ``relevant[i, :] = rel(1..num_columns)``.

  Computed by the tiled top-m search and a rank count (see the module docstring), exactly as
  from the top-k neighbours; only ``[Nq, m]`` indices (``m`` small) come back to the host.
  ``block_size`` and ``gallery_block_size`` set the tile ``[block_size, gallery_block_size]``
  (:func:`tile_sizes`; the symmetric search needs a square tile).

  Args:
    query: float ``[Nq, D]``.
    query_labels: int ``[Nq]`` (any integers).
    gallery: float ``[Ng, D]``; ``None`` means ``query`` with self excluded.
    gallery_labels: int ``[Ng]``; ``None`` exactly when ``gallery`` is.
    k: neighbours searched per query (as :func:`nearest_neighbors`).
    num_columns: relevance columns returned, ``1 <= num_columns <= k``.
    similarity, block_size, gallery_block_size, memory_bytes, show_progress: as
      :func:`nearest_neighbors`.

  Returns:
    ``(first, relevant)``: numpy int32 ``[Nq]`` and bool ``[Nq, num_columns]``.
  """
  plan = _plan(query, gallery, k=k, similarity=similarity, block_size=block_size,
               gallery_block_size=gallery_block_size, memory_bytes=memory_bytes)
  _check_positive_int("num_columns", num_columns)
  if num_columns > k:
    raise ValueError(f"num_columns={num_columns} must be at most k={k}.")
  query_labels = np.asarray(query_labels)
  gallery_labels = query_labels if gallery is None else np.asarray(gallery_labels)
  if query_labels.shape != (plan.num_query,) or gallery_labels.shape != (plan.num_gallery,):
    raise ValueError(f"labels must have shapes [{plan.num_query}] and [{plan.num_gallery}] "
                     f"like the embeddings, got {query_labels.shape} and "
                     f"{gallery_labels.shape}.")
  # Contiguous int32 codes shared by both sides; padding gets codes that match nothing.
  _, codes = np.unique(np.concatenate([query_labels, gallery_labels]), return_inverse=True)
  codes = codes.astype(np.int32).reshape(-1)
  q_codes, g_codes = codes[:plan.num_query], codes[plan.num_query:]
  # 1. The m >= num_columns best neighbours of every query (tiled, filtered selection).
  m = min(k, max(num_columns, MIN_SELECTED))
  row_tile, col_tile = tile_sizes(plan.num_query, int(plan.num_gallery),
                                  memory_bytes=memory_bytes, block_size=block_size,
                                  gallery_block_size=gallery_block_size)
  gallery = None if plan.exclude_self else plan.g
  targets = None
  if m < k and m < ROWS_MIN_M and _counts_in_pass():
    targets = same_class.best_relevant(plan.q, q_codes, gallery, g_codes, kind=plan.kind,
                                       width=same_class.class_width(col_tile),
                                       memory_bytes=memory_bytes)
  if targets is None:
    index = top_m_neighbors(plan.q, gallery, m=m, kind=plan.kind, row_tile=row_tile,
                            col_tile=col_tile, show_progress=show_progress)
    before = np.full(plan.num_query, -1, np.int32)
  else:
    index, before = top_m_and_ranks(plan.q, gallery, m=m, target_value=targets[0],
                                    target_index=targets[1], query_codes=q_codes,
                                    gallery_codes=g_codes, kind=plan.kind, row_tile=row_tile,
                                    col_tile=col_tile, show_progress=show_progress)
  rel = g_codes[index] == q_codes[:, None]
  hit = rel.any(axis=1)
  first = np.where(hit, rel.argmax(axis=1), k).astype(np.int32)
  relevant = rel[:, :num_columns]
  # 2. Queries without a neighbour of their class among the m (so relevant[i] is all False,
  # as num_columns <= m): the rank of their first one, counted in the same pass when it was
  # decided there, else from whole similarity rows.
  counted = ~hit & (before >= 0)
  first[counted] = np.minimum(before[counted], k)
  if m < k and not (hit | counted).all():
    rows = np.flatnonzero(~(hit | counted))
    first[rows] = _first_relevant_rank(plan, rows, q_codes, g_codes, k=k,
                                       memory_bytes=memory_bytes, show_progress=show_progress)
  return first, relevant


def _counts_in_pass() -> bool:
  """Whether the tile pass counts the ranks (:func:`top_m.top_m_and_ranks`): with the C++
  kernel, or on an accelerator. XLA:CPU's own reductions of a tile cost more than its product,
  so without the kernel the CPU ranks the missing queries from whole rows instead."""
  return jax.default_backend() != "cpu" or kernels.load("top_m.cc") is not None


def _first_relevant_rank(plan, rows: np.ndarray, q_codes: np.ndarray, g_codes: np.ndarray, *,
                         k: int, memory_bytes: int, show_progress: bool) -> np.ndarray:
  """``first`` (int32 ``[n]``) of the queries ``rows [n]``, from whole similarity rows.

  With ``(s*, j*)`` the best item of the query's class (highest similarity, then lowest
  index), ``first = min(#{j : S_ij > s* or (S_ij = s* and j < j*)}, k)``: the items ranked
  before it; ``k`` when the class has no gallery item. Each block of queries gets its whole
  row ``S [rb, Ng]`` at once (``rb`` from ``memory_bytes``), so ``s*`` and the count come from
  the same numbers.
  """
  num_gallery = int(plan.num_gallery)
  rb = int(min(max(1, memory_bytes // (BYTES_PER_ENTRY * num_gallery)), MIN_QUERY_BLOCK))
  size = -(-rows.shape[0] // rb) * rb
  q = _pad_rows(plan.q[rows], size)
  q_index = _pad_values(rows.astype(np.int32) if plan.exclude_self
                        else np.full(rows.shape, -1, np.int32), size, -1)
  codes = _pad_values(q_codes[rows], size, -1)
  g, g_codes = jnp.asarray(plan.g), jnp.asarray(g_codes)

  def block(start: int) -> np.ndarray:
    stop = start + rb
    return np.asarray(_block_first_rank(q[start:stop], q_index[start:stop], codes[start:stop],
                                        g, g_codes, k=k, kind=plan.kind))

  # independent blocks, as many at once as CPUs (their reductions run on one thread each)
  with concurrent.futures.ThreadPoolExecutor(max_workers=_num_threads()) as pool:
    outputs = list(tqdm.tqdm(pool.map(block, range(0, size, rb)), total=size // rb,
                             disable=not show_progress, desc="kNN (rank)", unit="block",
                             dynamic_ncols=True, mininterval=1.0))
  return np.concatenate(outputs)[:rows.shape[0]]


@functools.partial(jax.jit, static_argnames=("k", "kind"))
def _block_first_rank(q, q_index, q_codes, g, g_codes, *, k: int, kind: str) -> jax.Array:
  """``first`` int32 ``[rb]`` of queries ``q [rb, D]`` (self index ``q_index [rb]`` or -1,
  label codes ``q_codes [rb]``) against the whole gallery ``g [Ng, D]`` (codes ``g_codes``);
  see :func:`_first_relevant_rank`."""
  g_index = jnp.arange(g.shape[0], dtype=jnp.int32)
  s = _sanitize(pairwise_similarity(q, g, kind=kind))
  s = jnp.where(q_index[:, None] == g_index[None, :], -jnp.inf, s)
  relevant = (g_codes[None, :] == q_codes[:, None]) & (q_index[:, None] != g_index[None, :])
  best = jnp.max(jnp.where(relevant, s, -jnp.inf), axis=1, keepdims=True)
  best_index = jnp.argmax(relevant & (s == best), axis=1)[:, None]
  before = (s > best) | ((s == best) & (g_index[None, :] < best_index))
  count = jnp.sum(before, axis=1, dtype=jnp.int32)
  return jnp.where(relevant.any(axis=1), jnp.minimum(count, k), k).astype(jnp.int32)


@dataclasses.dataclass
class _Plan:
  """A validated search: the queries, the gallery, sizes and the block similarity."""
  q: np.ndarray            # float32 [Nq, D] (normalised for cosine; g itself when exclude_self)
  g: np.ndarray            # float32 [Ng, D] (normalised for cosine)
  num_query: int
  num_gallery: np.int32
  qb: int
  gb: int
  kind: str
  exclude_self: bool

  @functools.cached_property
  def g_blocks(self) -> jax.Array:
    """The gallery padded to whole blocks on the device, float32 ``[nb, gb, D]``."""
    num_blocks = -(-self.g.shape[0] // self.gb)
    return jnp.asarray(_pad_rows(self.g, num_blocks * self.gb).reshape(num_blocks, self.gb, -1))


def _plan(query, gallery, *, k: int, similarity: str, block_size: int | None,
          gallery_block_size: int | None, memory_bytes: int) -> _Plan:
  """Validates the inputs and lays out the blocks of a search (see the module docstring)."""
  check_kind(similarity)
  exclude_self = gallery is None
  q = as_embeddings("query", query)
  g = q if exclude_self else as_embeddings("gallery", gallery)
  if g.shape[1] != q.shape[1]:
    raise ValueError(f"gallery must have shape [Ng, {q.shape[1]}] like the query, "
                     f"got {g.shape}.")
  num_query, num_gallery = q.shape[0], g.shape[0]
  available = num_gallery - int(exclude_self)
  _check_positive_int("k", k)
  if k > available:
    where = "other items of the query set" if exclude_self else "gallery items"
    raise ValueError(f"k={k} is larger than the {available} {where} available.")
  qb, gb = block_sizes(num_query, num_gallery, k, memory_bytes=memory_bytes,
                       block_size=block_size, gallery_block_size=gallery_block_size)
  kind = similarity
  if similarity == "cosine":
    q = np.asarray(_normalize(q))
    g = q if exclude_self else np.asarray(_normalize(g))
    kind = "dot"
  elif similarity == "neg_sq_euclidean":
    shift = euclidean_shift(g)
    q = q - shift
    g = q if exclude_self else g - shift
  return _Plan(q=q, g=g, num_query=num_query,
               num_gallery=np.int32(num_gallery), qb=qb, gb=gb, kind=kind,
               exclude_self=exclude_self)


def euclidean_shift(gallery) -> np.ndarray:
  """float32 ``[D]``: the mean of ``gallery [N, D]`` rounded to whole numbers, by which the
  ``'neg_sq_euclidean'`` search moves queries and gallery alike.

  ``-|x - y|^2 = 2 <x, y> - |x|^2 - |y|^2`` rounds with ``|x|^2``; less this shift the
  distances do not change and the rounding follows the embeddings' spread, not their offset
  from the origin (integer coordinates and their ties stay exact; unit embeddings are rarely
  moved). k-means, the retrieval grid, the triplet scatter, the evaluation's similarity
  histograms and the analysis tools' similarity matrices move their embeddings by it too;
  training (and what shows the training batches' similarities) does not
  (``similarity.pairwise_similarity``).
  """
  return np.round(np.asarray(gallery).mean(axis=0, dtype=np.float64)).astype(np.float32)


def near_origin(similarity: str, gallery, *arrays) -> tuple[np.ndarray, ...]:
  """``(gallery, *arrays)`` (numpy ``[., D]``) moved by :func:`euclidean_shift` of ``gallery``
  for ``'neg_sq_euclidean'``; as given for the other kinds."""
  if similarity != "neg_sq_euclidean":
    return (gallery, *arrays)
  shift = euclidean_shift(gallery)
  return tuple(a - shift for a in (gallery, *arrays))


def _run_blocks(plan: _Plan, block_fn, *, show_progress: bool):
  """``block_fn(q_block [qb, D], start)`` over the query blocks (the last one zero-padded);
  outputs concatenated along the first axis and cut to ``Nq`` rows (numpy)."""
  starts = range(0, plan.num_query, plan.qb)
  outputs = []
  for start in tqdm.tqdm(starts, disable=not show_progress, desc="kNN", unit="block",
                         dynamic_ncols=True, mininterval=1.0):
    out = block_fn(_pad_rows(plan.q[start:start + plan.qb], plan.qb), np.int32(start))
    if show_progress:
      jax.block_until_ready(out)
    outputs.append(out)
  return tuple(np.concatenate([np.asarray(o[i]) for o in outputs])[:plan.num_query]
               for i in range(len(outputs[0])))


_normalize = jax.jit(l2_normalize)


def _self_index(start, rows: int, exclude_self: bool) -> np.ndarray:
  """int32 ``[rows]``: the gallery index of each query of the block starting at ``start`` when
  the query set is the gallery, else ``-1`` (no gallery item is the query itself)."""
  if not exclude_self:
    return np.full(rows, -1, np.int32)
  return np.arange(start, start + rows, dtype=np.int32)


@functools.partial(jax.jit, static_argnames=("k", "kind"))
def _block_top_k(q: jax.Array, q_index: jax.Array, g_blocks: jax.Array,
                 num_gallery: jax.Array, *, k: int, kind: str) -> tuple[jax.Array, jax.Array]:
  """Top-k of one query block ``q [qb, D]`` over ``g_blocks [nb, gb, D]``.

  Gallery rows with index ``>= num_gallery`` (padding) and, for query ``i``, the gallery row
  ``q_index[i]`` (int32 ``[qb]``: the query itself, or ``-1`` for none) get similarity
  ``-inf``.

  Returns:
    ``(indices int32 [qb, k], similarities float32 [qb, k])``.
  """
  qb = q.shape[0]
  num_blocks, gb, _ = g_blocks.shape

  def block_similarity(g, g_start):
    g_index = g_start + jnp.arange(gb, dtype=jnp.int32)
    s = _sanitize(pairwise_similarity(q, g, kind=kind))
    invalid = (g_index[None, :] >= num_gallery) | (q_index[:, None] == g_index[None, :])
    return jnp.where(invalid, -jnp.inf, s), g_index

  if num_blocks == 1:
    s, g_index = block_similarity(g_blocks[0], jnp.int32(0))
    values, pos = jax.lax.top_k(s, k)
    return g_index[pos], values

  def step(best, inputs):
    best_values, best_index = best
    s, g_index = block_similarity(*inputs)
    values = jnp.concatenate([best_values, s], axis=1)
    index = jnp.concatenate([best_index, jnp.broadcast_to(g_index, s.shape)], axis=1)
    values, pos = jax.lax.top_k(values, k)
    return (values, jnp.take_along_axis(index, pos, axis=1)), None

  init = (jnp.full((qb, k), -jnp.inf, jnp.float32), jnp.full((qb, k), -1, jnp.int32))
  starts = jnp.arange(num_blocks, dtype=jnp.int32) * gb
  (values, index), _ = jax.lax.scan(step, init, (g_blocks, starts))
  return index, values


def as_embeddings(name: str, x) -> np.ndarray:
  """``x`` as a finite float32 numpy ``[N, D]`` array with ``N, D >= 1``.

  Raises ``ValueError`` naming ``name`` for another rank, an empty or non-numeric array, or
  NaN / inf entries (e.g. a diverged model; the message lists the first
  ``MAX_LISTED_ROWS`` rows that have one).
  """
  x = np.asarray(x)
  if x.ndim != 2:
    raise ValueError(f"{name} must have rank 2 [N, D], got shape {x.shape}.")
  if x.shape[0] == 0 or x.shape[1] == 0:
    raise ValueError(f"{name} must be non-empty, got shape {x.shape}.")
  # jnp's test: numpy's own does not count bfloat16 (a model run in bfloat16) as a float
  if not (jnp.issubdtype(x.dtype, jnp.floating) or np.issubdtype(x.dtype, np.integer)):
    raise ValueError(f"{name} must be a float array, got dtype {x.dtype}.")
  x = x.astype(np.float32, copy=False)
  finite = np.isfinite(x)
  if not finite.all():
    rows = np.flatnonzero(~finite.all(axis=1))
    listed = ", ".join(str(r) for r in rows[:MAX_LISTED_ROWS])
    more = f" and {len(rows) - MAX_LISTED_ROWS} more" if len(rows) > MAX_LISTED_ROWS else ""
    raise ValueError(f"{name} has {int(np.size(x) - np.count_nonzero(finite))} non-finite "
                     f"entries (NaN or inf) in {len(rows)} of {x.shape[0]} rows: "
                     f"rows [{listed}]{more}.")
  return x
