"""Exact blocked kNN: hand-made answers, a numpy oracle, tie order, no retrace, block sizes."""

import jax.numpy as jnp
import numpy as np
import pytest

from dml_jax.evaluation import knn
from oracles import ranked_gallery


def oracle(query, gallery, k, kind):
  """Brute force in float64: every pair, sorted by (-similarity, gallery index)."""
  ranked = ranked_gallery(query, gallery, kind)
  return (np.array([[j for _, j in row[:k]] for row in ranked]),
          np.array([[s for s, _ in row[:k]] for row in ranked]))


def test_points_on_a_line_by_hand():
  # Points 0, 1, 3, 6 on a line; similarity -d^2. Neighbours worked out by hand; for the
  # point 3 the points 0 and 6 are both at d^2 = 9 and the lower index (0) comes first.
  x = np.array([[0.0], [1.0], [3.0], [6.0]])
  idx, sims = knn.nearest_neighbors(x, k=2, similarity="neg_sq_euclidean")
  np.testing.assert_array_equal(idx, [[1, 2], [0, 2], [1, 0], [2, 1]])
  np.testing.assert_array_equal(sims, [[-1, -9], [-1, -4], [-4, -9], [-9, -25]])
  assert idx.dtype == np.int32 and sims.dtype == np.float32


@pytest.mark.parametrize("block_size,gallery_block_size", [
    (4, None),   # 4 does not divide 11: the last query block is padded.
    (11, 5),     # 5 does not divide 13: gallery scanned in 3 blocks with a running top-k.
    (3, 4),      # both blocked.
    (None, None),  # sizes from the memory budget (one block here).
])
def test_separate_gallery_matches_oracle(block_size, gallery_block_size):
  rng = np.random.default_rng(0)
  q, g = rng.normal(size=(11, 3)), rng.normal(size=(13, 3))
  for kind in ("cosine", "neg_sq_euclidean"):
    idx, sims = knn.nearest_neighbors(q, g, k=6, similarity=kind, block_size=block_size,
                                      gallery_block_size=gallery_block_size)
    want_idx, want_sims = oracle(q, g, 6, kind)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_allclose(sims, want_sims, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_size,gallery_block_size", [(4, None), (5, 4), (13, 13)])
def test_self_gallery_with_many_ties_matches_oracle(block_size, gallery_block_size):
  # Small integer coordinates: float32 similarities are exact and full of ties, so this also
  # checks the tie order (lower gallery index first) across query and gallery blocks.
  x = np.random.default_rng(1).integers(-2, 3, size=(13, 2)).astype(np.float32)
  for kind in ("dot", "neg_sq_euclidean"):
    idx, sims = knn.nearest_neighbors(x, k=12, similarity=kind, block_size=block_size,
                                      gallery_block_size=gallery_block_size)
    want_idx, want_sims = oracle(x, None, 12, kind)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_array_equal(sims, want_sims)
    assert not np.any(idx == np.arange(13)[:, None]), "self must be excluded"


@pytest.mark.parametrize("gallery_block_size", [None, 2])
def test_ties_broken_by_lower_index(gallery_block_size):
  # All points equal: every ranking is a tie, so the neighbours are the other indices in
  # increasing order.
  x = np.ones((5, 2))
  idx, _ = knn.nearest_neighbors(x, k=4, block_size=2, gallery_block_size=gallery_block_size)
  np.testing.assert_array_equal(
      idx, [[1, 2, 3, 4], [0, 2, 3, 4], [0, 1, 3, 4], [0, 1, 2, 4], [0, 1, 2, 3]])


def test_signed_zero_similarities_are_ties():
  # lax.top_k orders -0.0 below +0.0; the search treats them as equal (lower index first).
  q = np.array([[1.0]])
  g = np.array([[-0.0], [0.0], [-0.0], [0.0]])
  idx, sims = knn.nearest_neighbors(q, g, k=4, similarity="dot")
  np.testing.assert_array_equal(idx, [[0, 1, 2, 3]])
  np.testing.assert_array_equal(sims, [[0, 0, 0, 0]])


def test_one_trace_per_block_shape(monkeypatch):
  # The block function is traced once for a block shape; other numbers of queries (the last
  # block padded, or one padded block for fewer queries than block_size) reuse it. D = 7 is
  # used by no other test, so the jit cache starts cold.
  traces = []
  real = knn.pairwise_similarity

  def counting(*args, **kwargs):
    traces.append(1)
    return real(*args, **kwargs)

  monkeypatch.setattr(knn, "pairwise_similarity", counting)
  rng = np.random.default_rng(2)
  g = rng.normal(size=(9, 7))
  first = None
  for num_query in (9, 6, 10, 1):
    q = rng.normal(size=(num_query, 7))
    idx, _ = knn.nearest_neighbors(q, g, k=3, block_size=4)
    np.testing.assert_array_equal(idx, oracle(q, g, 3, "cosine")[0])
    first = len(traces) if first is None else first
  assert first >= 1
  assert len(traces) == first, f"retraced: {len(traces)} traces, {first} after the first call"


def test_block_sizes_respect_the_memory_budget():
  # Whole gallery when a full query block fits; the budget bounds block * (gallery + k).
  assert knn.block_sizes(100, 50, 5, memory_bytes=1 << 20) == (100, 50)
  budget = 16 * 1000
  qb, gb = knn.block_sizes(60_000, 60_000, 10, memory_bytes=budget)
  assert gb < 60_000 and qb < 60_000
  assert knn.BYTES_PER_ENTRY * qb * (gb + 10) <= budget
  assert knn.block_sizes(10, 50, 5, memory_bytes=1 << 20) == (10, 50)
  # Given sizes win; the gallery block is clamped to the gallery, the query block is kept
  # (padded) so that any number of queries reuses the compiled block.
  assert knn.block_sizes(10, 20, 3, block_size=64, gallery_block_size=7) == (64, 7)
  assert knn.block_sizes(10, 20, 3, block_size=4, gallery_block_size=70) == (4, 20)


def test_memory_budget_blocks_and_stays_exact():
  # A budget so small that both queries and gallery are blocked still gives the exact answer.
  rng = np.random.default_rng(3)
  q, g = rng.normal(size=(11, 3)), rng.normal(size=(13, 3))
  qb, gb = knn.block_sizes(11, 13, 6, memory_bytes=16 * 30)
  assert qb < 11 and gb < 13
  idx, _ = knn.nearest_neighbors(q, g, k=6, memory_bytes=16 * 30)
  np.testing.assert_array_equal(idx, oracle(q, g, 6, "cosine")[0])


@pytest.mark.parametrize("call,match", [
    (lambda: knn.nearest_neighbors(np.zeros(4), k=1), "rank 2"),
    (lambda: knn.nearest_neighbors(np.zeros((4, 2, 1)), k=1), "rank 2"),
    (lambda: knn.nearest_neighbors(np.zeros((4, 2)), np.zeros((5, 3)), k=1), r"\[Ng, 2\]"),
    (lambda: knn.nearest_neighbors(np.zeros((4, 2)), k=4), "k=4 is larger than the 3"),
    (lambda: knn.nearest_neighbors(np.zeros((4, 2)), np.zeros((5, 2)), k=6),
     "k=6 is larger than the 5"),
    (lambda: knn.nearest_neighbors(np.zeros((4, 2)), k=0), "k must be a positive"),
    (lambda: knn.nearest_neighbors(np.zeros((4, 2)), k=1, block_size=0), "block_size"),
    (lambda: knn.nearest_neighbors(np.zeros((4, 2)), k=1, similarity="l1"), "allowed"),
    (lambda: knn.nearest_neighbors(np.array([[0.0, np.nan], [1, 1]]), k=1), "non-finite"),
])
def test_bad_input_raises_clear_value_error(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_non_finite_rows_are_named():
  x = np.ones((30, 2))
  x[[3, 17], 1] = np.nan
  x[25, 0] = np.inf
  with pytest.raises(ValueError, match=r"3 non-finite entries .* in 3 of 30 rows: "
                                       r"rows \[3, 17, 25\]"):
    knn.nearest_neighbors(x, k=1)
  x[:12, 0] = np.nan
  with pytest.raises(ValueError, match=r"rows \[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\] and 4 more"):
    knn.as_embeddings("gallery", x)


def test_bfloat16_and_float16_embeddings_are_searched_as_float32():
  # A model run in bfloat16 returns bfloat16 embeddings (a float numpy has no bfloat16 kind).
  x = np.random.default_rng(0).normal(size=(9, 3)).astype(np.float32)
  for dtype in (jnp.bfloat16, jnp.float16):
    low = jnp.asarray(x, dtype)
    want = knn.nearest_neighbors(np.asarray(low.astype(jnp.float32)), k=2)
    got = knn.nearest_neighbors(low, k=2)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
  with pytest.raises(ValueError, match="must be a float array, got dtype bool"):
    knn.as_embeddings("query", np.ones((2, 2), bool))


@pytest.mark.parametrize("gallery", [False, True])
@pytest.mark.parametrize("block_size,gallery_block_size", [(4, 5), (None, None)])
def test_neighbor_relevance_matches_the_neighbour_labels(gallery, block_size,
                                                         gallery_block_size):
  # Integer points: duplicates and exact ties; the first relevant rank and the relevance
  # columns are those of the oracle's neighbour list (ties by lower index).
  rng = np.random.default_rng(4)
  q, qy = rng.integers(-2, 3, size=(13, 2)).astype(np.float32), rng.integers(0, 4, size=13)
  g, gy = ((rng.integers(-2, 3, size=(11, 2)).astype(np.float32), rng.integers(0, 4, size=11))
           if gallery else (None, None))
  first, relevant = knn.neighbor_relevance(q, qy * 1000, g, None if g is None else gy * 1000,
                                           k=8, num_columns=3, similarity="neg_sq_euclidean",
                                           block_size=block_size,
                                           gallery_block_size=gallery_block_size)
  idx, _ = oracle(q, g, 8, "neg_sq_euclidean")
  want = (qy if g is None else gy)[idx] == qy[:, None]
  np.testing.assert_array_equal(relevant, want[:, :3])
  np.testing.assert_array_equal(first, np.where(want.any(1), want.argmax(1), 8))
  assert first.dtype == np.int32 and relevant.dtype == bool
