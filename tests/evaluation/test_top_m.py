"""The tiled top-m search (evaluation/top_m.py) and the retrieval fast path of knn: exact against
the brute-force oracle."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dml_jax.evaluation import knn
from dml_jax.evaluation import same_class
from dml_jax.evaluation import top_m
from dml_jax.evaluation import top_m_kernel
from dml_test_support import require_kernel
from oracles import best_relevant_oracle
from oracles import ranked_gallery


def oracle_indices(query, gallery, k, kind):
  """Brute force in float64: every pair, sorted by (-similarity, gallery index)."""
  return np.array([[j for _, j in row[:k]] for row in ranked_gallery(query, gallery, kind)])


def integer_points(rng, n, dim=2):
  # Small integer coordinates: exact float32 similarities, full of ties; no zero row (its
  # cosine is undefined).
  x = rng.integers(-2, 3, size=(n, dim)).astype(np.float32)
  x[~x.any(axis=1), 0] = 1.0
  return x


SELECTIONS = ["kernel", "xla", "rows"]  # the C++ merge, XLA's filtered top_k, whole rows


# the XLA merge does not depend on the similarity: 'dot' covers it
@pytest.mark.parametrize("kind,selection", [("dot", "kernel"), ("neg_sq_euclidean", "kernel"),
                                            ("dot", "xla"), ("dot", "rows")])
@pytest.mark.parametrize("row_tile,col_tile,chunk", [
    (32, 32, 8),   # symmetric (S_ij and S_ij^T), chunk filter on (3 * 8 < 32), padded.
    (16, 16, 8),   # symmetric, more blocks; filter off for m * chunk >= 16.
    (16, 24, 8),   # rectangular tiles: the plain (non-symmetric) sweep with the filter.
    (7, 5, 8),     # chunk does not divide the tile: no filter.
])
def test_top_m_self_matches_oracle_with_ties(kind, row_tile, col_tile, chunk, selection):
  if selection == "kernel":
    require_kernel("top_m.cc")
  x = integer_points(np.random.default_rng(0), 70)
  for m in (1, 3, 9):
    idx = top_m.top_m_neighbors(x, m=m, kind=kind, row_tile=row_tile, col_tile=col_tile,
                                chunk=chunk, selection=selection)
    np.testing.assert_array_equal(idx, oracle_indices(x, None, m, kind))
    assert not np.any(idx == np.arange(70)[:, None]), "self must be excluded"


@pytest.mark.parametrize("selection", SELECTIONS)
def test_top_m_all_equal_points_rank_by_index(selection):
  if selection == "kernel":
    require_kernel("top_m.cc")
  # Every similarity ties: the neighbours are the other indices in increasing order, across
  # both the S_ij and the S_ij^T updates.
  x = np.ones((40, 3), np.float32)
  idx = top_m.top_m_neighbors(x, m=4, row_tile=16, col_tile=16, chunk=2, selection=selection)
  want = np.array([[j for j in range(40) if j != i][:4] for i in range(40)])
  np.testing.assert_array_equal(idx, want)


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("row_tile,col_tile", [(16, 16), (8, 24)])
@pytest.mark.parametrize("num_query,num_gallery", [(30, 53), (53, 30)])
def test_top_m_separate_gallery_matches_oracle(row_tile, col_tile, num_query, num_gallery,
                                               selection):
  if selection == "kernel":
    require_kernel("top_m.cc")
  rng = np.random.default_rng(1)
  q = rng.normal(size=(num_query, 5)).astype(np.float32)
  g = rng.normal(size=(num_gallery, 5)).astype(np.float32)
  idx = top_m.top_m_neighbors(q, g, m=4, kind="dot", row_tile=row_tile, col_tile=col_tile,
                              chunk=4, selection=selection)
  np.testing.assert_array_equal(idx, oracle_indices(q, g, 4, "dot"))


def test_top_m_rejects_too_many_neighbours():
  with pytest.raises(ValueError, match="m=5 is larger than the 4"):
    top_m.top_m_neighbors(np.zeros((5, 2), np.float32), m=5)


@pytest.mark.parametrize("min_selected", [1, 3, 100])
@pytest.mark.parametrize("gallery", [False, True])
@pytest.mark.parametrize("block_size,gallery_block_size", [(16, 16), (8, 24), (None, None)])
def test_neighbor_relevance_fast_path_and_rank_fallback(monkeypatch, min_selected, gallery,
                                                        block_size, gallery_block_size):
  # With few neighbours kept (min_selected 1 or 3) many queries have none of their class
  # among them and take the whole-row rank; labels include classes of one item (R = 0).
  monkeypatch.setattr(knn, "MIN_SELECTED", min_selected)
  rng = np.random.default_rng(2)
  q, qy = integer_points(rng, 60, 3), rng.integers(0, 25, size=60)
  g, gy = ((integer_points(rng, 45, 3), rng.integers(0, 25, size=45)) if gallery
           else (None, None))
  k = 40
  for kind in ("dot", "neg_sq_euclidean"):  # exact in float32 (cosine is not: rounded ties)
    first, relevant = knn.neighbor_relevance(q, qy, g, gy, k=k, num_columns=2,
                                             similarity=kind, block_size=block_size,
                                             gallery_block_size=gallery_block_size)
    idx = oracle_indices(q, g, k, kind)
    want = (qy if g is None else gy)[idx] == qy[:, None]
    np.testing.assert_array_equal(relevant, want[:, :2])
    np.testing.assert_array_equal(first, np.where(want.any(1), want.argmax(1), k))
    assert first.dtype == np.int32 and relevant.dtype == bool


def test_tile_sizes():
  assert top_m.tile_sizes(100_000, 100_000) == (top_m.TILE, top_m.TILE)
  assert top_m.tile_sizes(13, 100) == (16, 104)  # rounded up to whole chunks of 8
  assert top_m.tile_sizes(10, 20, block_size=4, gallery_block_size=7) == (4, 7)
  small = top_m.tile_sizes(10_000, 10_000, memory_bytes=16 * 100 * 100)
  assert small == (96, 96)
  with pytest.raises(ValueError, match="block size"):
    top_m.tile_sizes(10, 10, block_size=0)


@pytest.mark.parametrize("dim", [2, 6])
def test_top_m_few_entering_chunks_branch_matches_oracle(dim):
  # m = 12 > FEW_CHUNKS with the chunk filter on (12 * 4 < 128): later tiles take the cheap
  # branch (few chunks beat the running 12th best), ties included (integer points, dim 2).
  x = integer_points(np.random.default_rng(dim), 700, dim=dim)
  assert top_m.FEW_CHUNKS < 12
  idx = top_m.top_m_neighbors(x, m=12, kind="dot", row_tile=128, col_tile=128, chunk=4,
                              selection="xla")
  np.testing.assert_array_equal(idx, oracle_indices(x, None, 12, "dot"))


@pytest.mark.parametrize("rows,cols,symmetric", [(5, 5, True), (1, 1, True), (3, 4, False)])
def test_tile_waves_cover_every_tile_once_after_its_predecessors(rows, cols, symmetric):
  waves = top_m.tile_waves(rows, cols, symmetric=symmetric)
  order = [t for w in waves for t in w]
  want = {(i, j) for i in range(rows) for j in range(cols) if not symmetric or j >= i}
  assert sorted(order) == sorted(want) and len(order) == len(want)
  position = {t: k for k, t in enumerate(order)}
  for w in waves:   # no two tiles of a wave update the same query block
    touched = [b for i, j in w for b in ({i, j} if symmetric else {i})]
    assert len(touched) == len(set(touched))
  for (i, j), k in position.items():
    for dep in ((i, j - 1), (i - 1, j)) if symmetric else ((i, j - 1),):
      if dep in position:
        assert position[dep] < k


def merge_oracle(values, indices, candidates, m):
  """One running best list merged with ``candidates [(value, index), ...]`` by
  (-value, index), as explicit Python tuples; unfilled places are (-inf, -1)."""
  items = [(v, i) for v, i in zip(values, indices) if i != -1] + candidates
  items = sorted(items, key=lambda t: (-t[0], t[1]))[:m]
  items += [(-np.inf, -1)] * (m - len(items))
  return [v for v, _ in items], [i for _, i in items]


def sanitize_oracle(x):
  big = float(np.finfo(np.float32).max)
  return -big if np.isnan(x) or x == -np.inf else (big if x == np.inf else float(x))


def awkward_tile(rng, rows, cols):
  """Small integers (ties everywhere), -0.0, NaN and +-inf."""
  s = rng.integers(-2, 3, size=(rows, cols)).astype(np.float32)
  s[s == 0] = np.where(rng.random(np.sum(s == 0)) < 0.5, 0.0, -0.0)
  special = rng.random((rows, cols))
  s[special < 0.05] = np.nan
  s[(special >= 0.05) & (special < 0.08)] = np.inf
  s[(special >= 0.08) & (special < 0.11)] = -np.inf
  return s


@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("both", [False, True])
@pytest.mark.parametrize("rows,cols,m", [(11, 13, 1), (16, 24, 4), (9, 40, 6)])
def test_merge_kernel_matches_loop_oracle(rows, cols, m, both, vectorized):
  require_kernel("top_m.cc")
  # Two tiles in gallery order into the same lists (the second merges into what the first
  # left), padding cut by num_items, self pairs excluded in the rows-only form; both the AVX2
  # and the scalar forms of the kernel.
  rng = np.random.default_rng(rows * cols + m)
  if both:   # blocks a (rows) and b (columns) of the symmetric search, a before b
    a_starts, b_starts = [0, rows], [2 * rows, 2 * rows + cols]
  else:      # one query block against two gallery blocks, overlapping it (self pairs)
    a_starts, b_starts = [3, 3], [0, cols]
  num_items = max(b_starts) + cols - 3   # the last columns are padding
  if not both:
    num_items = min(num_items, a_starts[0] + rows - 2)  # fewer items than queries: the
    # query rows at or above num_items are still merged (a separate gallery)
  exclude_self = not both
  best_a = [[[-np.inf] * m, [-1] * m] for _ in range(rows)]
  best_b = [[[-np.inf] * m, [-1] * m] for _ in range(cols)]
  got_a = (np.full((rows, m), -np.inf, np.float32), np.full((rows, m), -1, np.int32))
  got_b = (np.full((cols, m), -np.inf, np.float32), np.full((cols, m), -1, np.int32))
  for a_start, b_start in zip(a_starts, b_starts):
    s = awkward_tile(rng, rows, cols)
    starts = np.array([a_start, b_start, num_items], np.int32)
    got_a, new_b = top_m_kernel.merge_tile_kernel(s, starts, got_a, got_b if both else None,
                                           exclude_self=exclude_self, vectorized=vectorized)
    if both:
      got_b = new_b
    for r in range(rows):
      if both and a_start + r >= num_items:
        continue   # a padded item of the query set
      cands = [(sanitize_oracle(s[r, c]), b_start + c) for c in range(cols)
               if b_start + c < num_items and not (exclude_self and a_start + r == b_start + c)]
      best_a[r] = merge_oracle(*best_a[r], cands, m)
    for c in range(cols) if both else ():
      cands = [(sanitize_oracle(s[r, c]), a_start + r) for r in range(rows)
               if a_start + r < num_items]
      if b_start + c < num_items:
        best_b[c] = merge_oracle(*best_b[c], cands, m)
  np.testing.assert_array_equal(np.asarray(got_a[1]), [b[1] for b in best_a])
  np.testing.assert_array_equal(np.asarray(got_a[0]), [b[0] for b in best_a])
  if both:
    np.testing.assert_array_equal(np.asarray(got_b[1]), [b[1] for b in best_b])
    np.testing.assert_array_equal(np.asarray(got_b[0]), [b[0] for b in best_b])


@pytest.mark.parametrize("selection", SELECTIONS)
def test_top_m_overflowing_similarities_match_oracle(selection):
  if selection == "kernel":
    require_kernel("top_m.cc")
  # Each point is +-2^64 or +-2^60 on one axis, so a dot product has one non-zero term (the
  # same in any summation order, FMA included): +-2^128 overflows to +-inf, +-2^124 and
  # +-2^120 are finite. Sanitised, the infinities are the highest / lowest finite float32
  # (ties by index among them), never dropped.
  rng = np.random.default_rng(5)
  axis, sign = rng.integers(0, 3, size=40), rng.choice([-1.0, 1.0], size=40)
  scale = np.where(rng.random(40) < 0.6, 2.0**64, 2.0**60)
  x = np.zeros((40, 3))
  x[np.arange(40), axis] = sign * scale
  exact = x @ x.T   # float64: exact
  big = float(np.finfo(np.float32).max)
  s = np.clip(exact, -big, big)
  want = [[j for _, j in sorted((-s[i, j], j) for j in range(40) if j != i)[:5]]
          for i in range(40)]
  idx = top_m.top_m_neighbors(x.astype(np.float32), m=5, kind="dot", row_tile=16,
                              col_tile=16, selection=selection)
  np.testing.assert_array_equal(idx, want)


def test_auto_takes_whole_rows_from_rows_min_m(monkeypatch):
  calls = []
  real = top_m._top_m_by_rows
  monkeypatch.setattr(top_m, "_top_m_by_rows", lambda *a, **k: calls.append(k["m"]) or real(*a, **k))
  monkeypatch.setattr(top_m, "ROWS_MIN_M", 5)
  x = integer_points(np.random.default_rng(4), 40)
  want = top_m.top_m_neighbors(x, m=6, selection="xla")
  np.testing.assert_array_equal(top_m.top_m_neighbors(x, m=6), want)   # auto: rows
  top_m.top_m_neighbors(x, m=4)                                         # auto: tiles
  assert calls == [6]


def rank_oracle(s, value, index, q_codes, g_codes, exclude_self):
  """``before`` as top_m_and_ranks defines it, from the whole matrix: the items above the
  target, where no other item equals its value and no other item of the class reaches it;
  else -1."""
  before = np.full(s.shape[0], -1, np.int32)
  for i in range(s.shape[0]):
    if index[i] < 0:
      continue
    others = [j for j in range(s.shape[1]) if j != index[i] and not (exclude_self and j == i)]
    row = s[i, others]
    same = g_codes[others] == q_codes[i]
    if not (row == value[i]).any() and not (same & (row >= value[i])).any():
      before[i] = int((row > value[i]).sum())
  return before


@pytest.mark.parametrize("selection", ["kernel", "xla"])
@pytest.mark.parametrize("gallery", [False, True])
@pytest.mark.parametrize("row_tile,col_tile", [(16, 16), (16, 24), (7, 5)])
@pytest.mark.parametrize("spread", [50, 2])   # few ties / ties everywhere
def test_top_m_and_ranks_match_oracle(selection, gallery, row_tile, col_tile, spread):
  # Integer points: float32 products are exact, so every tile shape gives the oracle's
  # similarities. The decided queries are exactly those without a tie at the target's value,
  # and each gets the oracle's count; the top-m lists equal top_m_neighbors'.
  if selection == "kernel":
    require_kernel("top_m.cc")
  rng = np.random.default_rng(spread + row_tile)
  q = rng.integers(-spread, spread + 1, size=(50, 3)).astype(np.float32)
  g = rng.integers(-spread, spread + 1, size=(37, 3)).astype(np.float32) if gallery else None
  qc = rng.integers(0, 9, size=50).astype(np.int32)
  gc = rng.integers(0, 9, size=37).astype(np.int32) if gallery else qc
  s = (q @ (q if g is None else g).T).astype(np.float64)
  value, index = best_relevant_oracle(s, qc, gc, exclude_self=not gallery)
  idx, before = top_m.top_m_and_ranks(q, g, m=3, target_value=value, target_index=index,
                                      query_codes=qc, gallery_codes=gc, kind="dot",
                                      row_tile=row_tile, col_tile=col_tile, chunk=8,
                                      selection=selection)
  np.testing.assert_array_equal(before, rank_oracle(s, value, index, qc, gc, not gallery))
  np.testing.assert_array_equal(idx, top_m.top_m_neighbors(
      q, g, m=3, kind="dot", row_tile=row_tile, col_tile=col_tile, chunk=8,
      selection=selection))
  if spread == 50:
    assert (before >= 0).mean() > 0.8   # the counts decide nearly every query
  # A target value that the tiles do not reproduce leaves the query undecided.
  shifted = top_m.top_m_and_ranks(q, g, m=3, target_value=np.nextafter(value, np.inf),
                                  target_index=index, query_codes=qc, gallery_codes=gc,
                                  kind="dot", row_tile=row_tile, col_tile=col_tile,
                                  selection=selection)[1]
  assert (shifted[index >= 0] == -1).all()


@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("both", [False, True])
def test_count_kernel_matches_xla_counts(both, vectorized):
  # Awkward tiles (ties, -0.0, NaN, +-inf), padding, self pairs in the rows-only form, and
  # targets inside and outside the tile: the C++ counts equal the XLA ones.
  require_kernel("top_m.cc")
  rng = np.random.default_rng(7 + both)
  rows, cols = 13, 21
  s = awkward_tile(rng, rows, cols)
  a_start, b_start = (0, 16) if both else (5, 0)
  num_items = b_start + cols - 3
  starts = np.array([a_start, b_start, num_items], np.int32)

  def side(n, first, targets_from):
    value = rng.integers(-2, 3, size=n).astype(np.float32)
    value[rng.random(n) < 0.2] = np.inf
    target = rng.choice(targets_from, size=n).astype(np.int32)
    code = rng.integers(0, 3, size=n).astype(np.int32)
    counts = rng.integers(0, 5, size=(n, 3)).astype(np.int32)   # carried from earlier tiles
    read = np.where(rng.random(n) < 0.5, -np.inf, -1.0).astype(np.float32)
    return (value, target, code), (counts, read)

  ranks = {"a": side(rows, a_start, np.arange(b_start - 2, b_start + cols + 2)),
           "codes_b": rng.integers(0, 3, size=cols).astype(np.int32)}
  if both:
    ranks["b"] = side(cols, b_start, np.arange(a_start - 2, a_start + rows + 2))
    ranks["codes_b"] = ranks["b"][0][2]
    ranks["codes_a"] = ranks["a"][0][2]
  got = top_m_kernel.count_tile_kernel(s, starts, ranks, exclude_self=not both,
                                 vectorized=vectorized)
  a_index = a_start + np.arange(rows, dtype=np.int32)
  b_index = b_start + np.arange(cols, dtype=np.int32)
  want = top_m._tile_ranks(top_m.sanitize(s), a_index, b_index, np.int32(num_items), ranks,
                           exclude_self=not both)
  for key, real in (("a", rows), ("b", num_items - b_start)):   # padded queries: discarded
    if key in want:
      np.testing.assert_array_equal(np.asarray(got[key][0])[:real],
                                    np.asarray(want[key][0])[:real])
      np.testing.assert_array_equal(np.asarray(got[key][1])[:real],
                                    np.asarray(want[key][1])[:real])


@pytest.mark.parametrize("gallery", [False, True])
def test_neighbor_relevance_counts_ranks_in_the_pass(monkeypatch, gallery):
  # Few neighbours kept (MIN_SELECTED 1), so most queries miss their class among them; their
  # first relevant rank is counted in the tile pass (classes spread over products of 4) and
  # equals the oracle's.
  if knn._counts_in_pass() is False:
    pytest.skip("the tile pass counts ranks only with the C++ kernel on the CPU")
  monkeypatch.setattr(knn, "MIN_SELECTED", 1)
  monkeypatch.setattr(same_class, "CLASS_WIDTH", 4)
  calls = []
  original = top_m.top_m_and_ranks

  def spy(*args, **kwargs):
    out = original(*args, **kwargs)
    calls.append(out[1])
    return out

  monkeypatch.setattr(knn, "top_m_and_ranks", spy)
  rng = np.random.default_rng(3)
  q, qy = rng.integers(-50, 51, size=(70, 3)).astype(np.float32), rng.integers(0, 12, 70)
  g, gy = ((rng.integers(-50, 51, size=(45, 3)).astype(np.float32), rng.integers(0, 12, 45))
           if gallery else (None, None))
  k = 30
  first, relevant = knn.neighbor_relevance(q, qy, g, gy, k=k, num_columns=1, similarity="dot",
                                           block_size=16, gallery_block_size=16)
  idx = oracle_indices(q, g, k, "dot")
  want = (qy if g is None else gy)[idx] == qy[:, None]
  np.testing.assert_array_equal(relevant, want[:, :1])
  np.testing.assert_array_equal(first, np.where(want.any(1), want.argmax(1), k))
  assert len(calls) == 1 and (calls[0] >= 0).mean() > 0.8


@pytest.mark.parametrize("exclude_self", [False, True])
def test_select_rows_kernel_matches_top_k(exclude_self):
  # Awkward rows (ties, -0.0, NaN, +-inf) with padding: the C++ selection returns exactly
  # lax.top_k's order of the sanitised rows, masked items never.
  require_kernel("top_m.cc")
  rng = np.random.default_rng(11)
  s = awkward_tile(rng, 9, 40)
  starts = np.array([3, 0, 35], np.int32)   # rows are items 3..11; columns from 35 padding
  m = 20
  got = np.asarray(top_m_kernel.select_rows_kernel(s, starts, m=m, exclude_self=exclude_self))
  masked = np.asarray(top_m.sanitize(s)).copy()
  masked[:, 35:] = -np.inf
  if exclude_self:
    masked[np.arange(9), np.arange(9) + 3] = -np.inf
  order = np.lexsort((np.broadcast_to(np.arange(40), masked.shape), -masked.astype(np.float64)),
                     axis=1)   # value descending, lower index first
  # masked items have -inf, below the lowest finite value the sanitised items can have
  np.testing.assert_array_equal(got, order[:, :m])


def test_auto_rows_with_the_kernel_match_the_oracle(monkeypatch):
  require_kernel("top_m.cc")
  monkeypatch.setattr(top_m, "ROWS_MIN_M", 5)
  rng = np.random.default_rng(6)
  x, g = integer_points(rng, 50, 3), integer_points(rng, 31, 3)   # ties everywhere
  for gallery in (None, g):
    got = top_m.top_m_neighbors(x, gallery, m=12, kind="dot")   # auto: rows, kernel
    np.testing.assert_array_equal(got, oracle_indices(x, gallery, 12, "dot"))
    np.testing.assert_array_equal(got, top_m.top_m_neighbors(x, gallery, m=12, kind="dot",
                                                             selection="rows"))


@pytest.mark.parametrize("pattern", ["random", "sample_misleads"])
def test_select_rows_kernel_long_rows(pattern):
  # Rows long enough for the sampled threshold: random values with ties, and rows whose
  # sampled columns hold the only high values (the guess keeps fewer than m items and the
  # kernel falls back to the whole row).
  require_kernel("top_m.cc")
  rng = np.random.default_rng(5)
  rows, cols = 4, 5000
  if pattern == "random":
    s, m = rng.integers(-50, 50, size=(rows, cols)).astype(np.float32), 300
  else:
    s = np.zeros((rows, cols), np.float32)
    s[:, ::cols // 1024] = 1.0
    s += rng.integers(0, 3, size=(rows, cols)).astype(np.float32) * 1e-3
    m = 1200
  starts = np.array([0, 0, cols], np.int32)
  got = np.asarray(top_m_kernel.select_rows_kernel(s, starts, m=m, exclude_self=True))
  masked = s.astype(np.float64)
  masked[np.arange(rows), np.arange(rows)] = -np.inf
  order = np.lexsort((np.broadcast_to(np.arange(cols), s.shape), -masked), axis=1)
  np.testing.assert_array_equal(got, order[:, :m])


@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("width", [1, 7, 8, 9, 16, 23, 659])
def test_argmax_rows_kernel_is_jnp_argmax(vectorized, width):
  # Ties, -0.0 beside +0.0, +-inf and NaN in the vectorised part and in the tail: the first
  # index of the maximum (the first NaN of a row that has one), and that value, bit for bit.
  require_kernel("top_m.cc")
  rng = np.random.default_rng(width)
  s = rng.integers(-3, 4, size=(12, width)).astype(np.float32)   # ties everywhere
  s[0] = 0.0
  s[0, width // 2] = -0.0
  s[1] = -np.inf
  s[2, -1] = np.inf
  s[3, width // 3] = np.nan
  s[4, -1] = np.nan
  s[5, 0] = np.nan
  s[6] = rng.normal(size=width)
  index, value = jax.jit(functools.partial(top_m_kernel.argmax_rows_kernel,
                                           vectorized=vectorized))(s)
  want = np.asarray(jnp.argmax(s, axis=1))
  np.testing.assert_array_equal(np.asarray(index), want)
  want_value = s[np.arange(12), want]
  np.testing.assert_array_equal(np.asarray(value), want_value)
  np.testing.assert_array_equal(np.signbit(np.asarray(value)), np.signbit(want_value))


@pytest.mark.parametrize("both", [False, True])
def test_kernels_under_vmap_equal_a_loop_over_the_batch(both):
  # jax.vmap over the C++ kernels (e.g. over k-means restarts or several tiles) runs them once
  # per batch element; the batched inputs include the aliased running best / counts.
  require_kernel("top_m.cc")
  rng = np.random.default_rng(5)
  n, rows, cols, m = 3, 9, 20, 4
  s = np.stack([awkward_tile(rng, rows, cols) for _ in range(n)])
  starts = np.array([0, 16, 34] if both else [2, 0, 18], np.int32)
  side = lambda k: ((rng.integers(-2, 3, (n, k)).astype(np.float32),
                     rng.integers(0, 20, (n, k)).astype(np.int32),
                     rng.integers(0, 3, (n, k)).astype(np.int32)),
                    (rng.integers(0, 5, (n, k, 3)).astype(np.int32),
                     np.full((n, k), -1.0, np.float32)))
  best = lambda k: (np.full((n, k, m), -np.inf, np.float32), np.full((n, k, m), -1, np.int32))
  ranks = {"a": side(rows), "codes_b": rng.integers(0, 3, (n, cols)).astype(np.int32)}
  if both:
    ranks["b"] = side(cols)
    ranks["codes_a"] = ranks["a"][0][2]
  calls = {
      "merge": lambda s, ba, bb: top_m_kernel.merge_tile_kernel(
          s, starts, ba, bb if both else None, exclude_self=not both),
      "count": lambda s, r: top_m_kernel.count_tile_kernel(s, starts, r, exclude_self=not both),
      "select": lambda s: top_m_kernel.select_rows_kernel(s, starts, m=m, exclude_self=not both),
      "argmax": top_m_kernel.argmax_rows_kernel,
  }
  args = {"merge": (s, best(rows), best(cols)), "count": (s, ranks), "select": (s,),
          "argmax": (s,)}
  for name, fn in calls.items():
    got = jax.vmap(fn)(*args[name])
    for i in range(n):
      want = fn(*jax.tree.map(lambda x, i=i: x[i], args[name]))
      jax.tree.map(lambda g, w, i=i: np.testing.assert_array_equal(np.asarray(g)[i], w),
                   got, want)
