"""The tiled top-m search (evaluation/top_m.py) and the retrieval fast path of knn: exact against
the brute-force oracle."""

import numpy as np
import pytest

from dml_jax.evaluation import knn
from dml_jax.evaluation import top_m
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


@pytest.mark.parametrize("kind", ["dot", "neg_sq_euclidean"])
@pytest.mark.parametrize("row_tile,col_tile,chunk", [
    (32, 32, 8),   # symmetric (S_ij and S_ij^T), chunk filter on (3 * 8 < 32), padded.
    (16, 16, 8),   # symmetric, more blocks; filter off for m * chunk >= 16.
    (16, 24, 8),   # rectangular tiles: the plain (non-symmetric) sweep with the filter.
    (7, 5, 8),     # chunk does not divide the tile: no filter.
])
def test_top_m_self_matches_oracle_with_ties(kind, row_tile, col_tile, chunk):
  x = integer_points(np.random.default_rng(0), 70)
  for m in (1, 3, 9):
    idx = top_m.top_m_neighbors(x, m=m, kind=kind, row_tile=row_tile, col_tile=col_tile,
                              chunk=chunk)
    np.testing.assert_array_equal(idx, oracle_indices(x, None, m, kind))
    assert not np.any(idx == np.arange(70)[:, None]), "self must be excluded"


def test_top_m_all_equal_points_rank_by_index():
  # Every similarity ties: the neighbours are the other indices in increasing order, across
  # both the S_ij and the S_ij^T updates.
  x = np.ones((40, 3), np.float32)
  idx = top_m.top_m_neighbors(x, m=4, row_tile=16, col_tile=16, chunk=2)
  want = np.array([[j for j in range(40) if j != i][:4] for i in range(40)])
  np.testing.assert_array_equal(idx, want)


@pytest.mark.parametrize("row_tile,col_tile", [(16, 16), (8, 24)])
def test_top_m_separate_gallery_matches_oracle(row_tile, col_tile):
  rng = np.random.default_rng(1)
  q, g = rng.normal(size=(30, 5)).astype(np.float32), rng.normal(size=(53, 5)).astype(np.float32)
  idx = top_m.top_m_neighbors(q, g, m=4, kind="dot", row_tile=row_tile, col_tile=col_tile,
                            chunk=4)
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
  idx = top_m.top_m_neighbors(x, m=12, kind="dot", row_tile=128, col_tile=128, chunk=4)
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
