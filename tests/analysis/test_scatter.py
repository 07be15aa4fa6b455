"""Triplet scatter diagram: points equal a numpy loop oracle; the plot is written."""

import numpy as np
import pytest

from dml_jax.analysis import scatter
from dml_jax.evaluation import triplet_scatter


def oracle(x, labels, kind):
  n = len(x)
  s_ap, s_an, correct = [], [], []
  for a in range(n):
    def sim(i, j):
      if kind == "cosine":
        return np.dot(x[i], x[j]) / (np.linalg.norm(x[i]) * np.linalg.norm(x[j]))
      return -np.sum((x[i] - x[j]) ** 2)
    pos = [sim(a, p) for p in range(n) if p != a and labels[p] == labels[a]]
    neg = [sim(a, m) for m in range(n) if labels[m] != labels[a]]
    s_ap.append(max(pos) if pos else np.nan)
    s_an.append(max(neg) if neg else np.nan)
    others = [j for j in range(n) if j != a]
    nn = others[int(np.argmax([sim(a, j) for j in others]))]
    correct.append(labels[nn] == labels[a])
  return np.array(s_ap), np.array(s_an), np.array(correct)


@pytest.mark.parametrize("kind", ["cosine", "neg_sq_euclidean"])
def test_scatter_points_equal_numpy_loop(kind):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(13, 5)).astype(np.float32)
  labels = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 4])  # class 4: no positive
  got = scatter.scatter_points(x, labels, similarity=kind, block_size=4)
  want = oracle(x, labels, kind)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[2], want[2])
  assert np.isnan(got[0][-1]) and not got[2][-1]
  assert 0 < got[2].sum() < len(x)


def test_points_far_from_the_origin_are_their_distances():
  # 256 from the origin in 16 dimensions, 2 <x, y> - |x|^2 - |y|^2 rounds in steps (~0.1)
  # larger than these distances: the points must be the embeddings' (float64 oracle)
  rng = np.random.default_rng(0)
  labels = np.arange(200) % 10
  x = rng.normal(size=(10, 16))[labels] * 0.3 + 0.1 * rng.normal(size=(200, 16))
  x = x.astype(np.float32) + 256
  s_ap, s_an, correct = scatter.scatter_points(x, labels, similarity="neg_sq_euclidean")
  x64 = x.astype(np.float64)
  d = ((x64[:, None] - x64[None]) ** 2).sum(-1)
  np.fill_diagonal(d, np.inf)
  same = labels[:, None] == labels[None, :]
  np.testing.assert_allclose(s_ap, -np.where(same, d, np.inf).min(1), atol=1e-4)
  np.testing.assert_allclose(s_an, -np.where(~same, d, np.inf).min(1), atol=1e-4)
  np.testing.assert_array_equal(correct, labels[d.argmin(1)] == labels)
  pos, neg = triplet_scatter.pair_similarities(x, labels, similarity="neg_sq_euclidean",
                                               max_points=200)
  i, j = np.triu_indices(200, k=1)
  np.testing.assert_allclose(pos, -d[i, j][same[i, j]], atol=1e-4)
  np.testing.assert_allclose(neg, -d[i, j][~same[i, j]], atol=1e-4)


def test_plot_scatter_writes_png(tmp_path):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(12, 3))
  labels = np.arange(12) % 3
  pts = scatter.scatter_points(x, labels)
  path = scatter.plot_scatter(*pts, path=str(tmp_path / "s.png"), title="t")
  assert (tmp_path / "s.png").stat().st_size > 1000 and path.endswith("s.png")
  with pytest.raises(ValueError, match="labels"):
    scatter.scatter_points(x, labels[:5])
