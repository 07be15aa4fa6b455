"""k-means in JAX (``evaluation.kmeans``) against scikit-learn's KMeans and numpy loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn import cluster as sk_cluster
from sklearn import datasets as sk_datasets
from sklearn import metrics as sk_metrics

from dml_jax import evaluation
from dml_jax.evaluation import kmeans
from dml_test_support import require_kernel


def unit_gaussian(seed, n, d):
  x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 1])
def test_separable_data_gives_sklearns_partition(seed):
  x, y = sk_datasets.make_blobs(n_samples=600, centers=9, n_features=8, cluster_std=0.4,
                                random_state=seed)
  got = kmeans.kmeans(x, n_clusters=9, seed=seed, n_init=2)
  want = sk_cluster.KMeans(9, n_init=2, random_state=seed).fit(x)
  assert sk_metrics.adjusted_rand_score(want.labels_, got.assignment) == 1.0
  assert sk_metrics.adjusted_rand_score(y, got.assignment) == 1.0
  np.testing.assert_allclose(got.inertia, want.inertia_, rtol=1e-5)


@pytest.mark.parametrize("n,d,k,n_init", [
    (1200, 16, 40, 3),      # exact k-means++ (one centre a round)
    (2000, 32, 400, 2),     # two centres a round (k - 1 > 256 rounds), 5 points a cluster
])
def test_hard_data_inertia_within_one_percent_of_sklearn(n, d, k, n_init):
  x = unit_gaussian(n + k, n, d)   # no structure: the partition depends on the seeding
  got = kmeans.kmeans(x, n_clusters=k, seed=0, n_init=n_init)
  want = sk_cluster.KMeans(k, n_init=n_init, random_state=0).fit(x)
  assert got.inertia <= 1.01 * want.inertia_, (got.inertia, want.inertia_)
  assert len(got.inertias) == n_init and got.inertia == min(got.inertias)
  # the inertia is that of the returned assignment and centres
  np.testing.assert_allclose(
      got.inertia, np.sum((x - got.centres[got.assignment]) ** 2), rtol=1e-4)
  # and every point sits with its nearest centre (the final assignment step)
  d2 = ((x[:, None, :] - got.centres[None]) ** 2).sum(-1)
  np.testing.assert_array_equal(got.assignment, np.argmin(d2, axis=1))


@pytest.mark.parametrize("selection", ["xla", "kernel"])
def test_assign_is_the_nearest_centre_with_ties_to_the_lower_id(selection):
  if selection == "kernel":
    require_kernel("top_m.cc")
  rng = np.random.default_rng(3)
  x = rng.integers(-2, 3, size=(37, 3)).astype(np.float32)   # integer points: exact ties
  centres = np.array([[0, 0, 0], [1, 0, 0], [0, 0, 0], [-1, 1, 0]], np.float32)
  a, d2 = kmeans.assign(jnp.asarray(x), jnp.asarray(centres), rows=8, selection=selection)
  for i in range(len(x)):   # a loop oracle
    dist = [float(((x[i] - c) ** 2).sum()) for c in centres]
    assert int(a[i]) == dist.index(min(dist)) and float(d2[i]) == min(dist)


@pytest.mark.parametrize("selection", ["xla", "kernel"])
def test_assign_under_vmap_over_centres_equals_a_loop(selection):
  if selection == "kernel":
    require_kernel("top_m.cc")
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.standard_normal((37, 3)).astype(np.float32))
  centres = jnp.asarray(rng.standard_normal((3, 5, 3)).astype(np.float32))   # 3 restarts
  assign = lambda c: kmeans.assign(x, c, rows=8, selection=selection)
  got = jax.vmap(assign)(centres)
  for i in range(3):   # batched products may round differently: distances to float32
    a, d2 = assign(centres[i])
    np.testing.assert_array_equal(np.asarray(got[0])[i], np.asarray(a))
    np.testing.assert_allclose(np.asarray(got[1])[i], np.asarray(d2), rtol=1e-5, atol=1e-5)

def test_empty_clusters_take_the_farthest_points_in_order():
  x = jnp.asarray([[0.0], [1.0], [10.0], [20.0]])
  assignment = jnp.asarray([0, 0, 0, 0], jnp.int32)
  d2 = jnp.asarray([0.0, 1.0, 100.0, 400.0])
  centres = jnp.zeros((3, 1))
  new = kmeans.update_centres(x, assignment, d2, centres, k=3)
  np.testing.assert_allclose(np.asarray(new), [[31 / 4], [20.0], [10.0]])


def test_one_hot_sums_equal_the_scatter_add():
  rng = np.random.default_rng(6)
  x = jnp.asarray(rng.normal(size=(50, 3)), jnp.float32)
  a = jnp.asarray(rng.integers(0, 7, size=50), jnp.int32)
  d2 = jnp.asarray(rng.uniform(size=50), jnp.float32)
  want = kmeans.update_centres(x, a, d2, jnp.zeros((9, 3)), k=9)
  got = kmeans.update_centres(x, a, d2, jnp.zeros((9, 3)), k=9, rows=16, one_hot=True)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)   # clusters 7, 8 empty: moved


def test_fewer_distinct_points_than_clusters():
  x = np.repeat(np.eye(3, dtype=np.float32), 4, axis=0)
  got = kmeans.kmeans(x, n_clusters=5, seed=0)
  assert got.inertia == 0.0 and got.assignment.max() < 5
  assert len(np.unique(got.assignment)) == 3


def test_seeded_and_deterministic():
  x = unit_gaussian(5, 300, 6)
  a = kmeans.kmeans(x, n_clusters=12, seed=7, n_init=2)
  b = kmeans.kmeans(x, n_clusters=12, seed=7, n_init=2)
  np.testing.assert_array_equal(a.assignment, b.assignment)
  assert a.inertias == b.inertias
  assert kmeans.kmeans(x, n_clusters=12, seed=8, n_init=2).inertias != a.inertias


def test_greedy_seeding_beats_plain_kmeans_plus_plus_on_hard_data():
  # Greedy k-means++ is what brings the inertia to scikit-learn's (whose seeding it is).
  x = unit_gaussian(4, 1500, 24)
  greedy = kmeans.kmeans(x, n_clusters=300, seed=0, n_init=2)
  plain = kmeans.kmeans(x, n_clusters=300, seed=0, n_init=2, greedy=False)
  assert greedy.inertia < 0.99 * plain.inertia


def test_the_kernels_argmax_gives_xlas_clustering():
  require_kernel("top_m.cc")
  x = unit_gaussian(6, 900, 16)
  got = kmeans.kmeans(x, n_clusters=60, seed=1, n_init=2, selection="kernel")
  want = kmeans.kmeans(x, n_clusters=60, seed=1, n_init=2, selection="xla")
  np.testing.assert_array_equal(got.assignment, want.assignment)
  np.testing.assert_array_equal(got.centres, want.centres)
  assert got.inertias == want.inertias and got.iterations == want.iterations


def test_block_rows_bounds_the_tile():
  assert kmeans.block_rows(60502, 11316, 256 * 2 ** 20) == 256 * 2 ** 20 // (16 * 11316)
  assert kmeans.block_rows(100, 3, 2 ** 30) == 100
  assert kmeans.block_rows(10 ** 5, 3, 2 ** 30) == kmeans.MAX_BLOCK_ROWS
  assert kmeans.block_rows(10 ** 6, 10 ** 7, 1) == 8


def test_nmi_of_the_jax_kmeans_is_sklearns_nmi_of_its_assignment():
  x, _ = sk_datasets.make_blobs(n_samples=400, centers=6, n_features=5, cluster_std=2.5,
                                random_state=2)
  y = np.random.default_rng(0).integers(0, 6, size=400)
  got = evaluation.clustering_metrics(x, y, overcluster=2, seed=3, n_init=2)
  for key, k in (("nmi", 6), ("nmi+", 12)):
    a = kmeans.kmeans(x, n_clusters=k, seed=3, n_init=2).assignment
    np.testing.assert_allclose(got[key], sk_metrics.normalized_mutual_info_score(y, a),
                               rtol=1e-10)


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_clusters=11), "n_clusters=11 exceeds the 10 points"),
    (dict(n_clusters=0), "n_clusters must be an integer >= 1, got 0"),
    (dict(n_clusters=2, n_init=0), "n_init must be an integer >= 1"),
    (dict(n_clusters=2, max_iter=True), "max_iter must be an integer"),
    (dict(n_clusters=2, tol=-1.0), "tol must be a number >= 0"),
    (dict(n_clusters=2, selection="fast"), "kernel selection must be one of"),
])
def test_bad_arguments_raise_one_clear_error(kwargs, match):
  with pytest.raises(ValueError, match=match):
    kmeans.kmeans(np.zeros((10, 2)), **kwargs)


def test_bad_implementation_name():
  with pytest.raises(ValueError, match="kmeans must be one of jax, sklearn, got 'faiss'"):
    evaluation.clustering_metrics(np.zeros((4, 2)), np.arange(4), kmeans="faiss")


def bounded_cases():
  blobs, _ = sk_datasets.make_blobs(n_samples=3000, centers=60, n_features=16,
                                    cluster_std=1.5, random_state=0)
  grid = np.random.default_rng(5).integers(-2, 3, size=(1500, 4))   # exact ties, duplicates
  return {"blobs": (blobs, 80), "unit gaussian": (unit_gaussian(9, 2500, 24), 150),
          "integer grid (ties)": (grid, 70),
          "64 clusters, 8 movers": (unit_gaussian(3, 800, 8), 64)}


@pytest.mark.parametrize("case", sorted(bounded_cases()))
def test_the_bounds_keep_the_assignments_of_every_distance(case):
  x, k = bounded_cases()[case]
  assert kmeans.movers(k) > 0
  # Tiles of the bounded path's block shape ([ACTIVE_ROWS, k]) on both sides: a GPU's GEMM may
  # round a row differently in a tile of another shape, and a point within that rounding of
  # two centres could then go either way; the CPU gives the same rows in any tile.
  memory = kmeans.ACTIVE_ROWS * 16 * k
  assert kmeans.block_rows(len(x), k, memory) == kmeans.ACTIVE_ROWS
  for seed in (0, 1):
    got = kmeans.kmeans(x, n_clusters=k, seed=seed, n_init=2, memory_bytes=memory)
    want = kmeans.kmeans(x, n_clusters=k, seed=seed, n_init=2, pruning=False,
                         memory_bytes=memory)
    np.testing.assert_array_equal(got.assignment, want.assignment)
    np.testing.assert_array_equal(got.centres, want.centres)
    assert got.iterations == want.iterations
    np.testing.assert_allclose(got.inertias, want.inertias, rtol=1e-5)


def test_the_lower_bounds_hold_after_every_iteration():
  # lower[i] <= |x_i - c_j| for every centre j but x_i's own, iteration after iteration,
  # and every point sits with its nearest centre (float64 oracle)
  x = unit_gaussian(11, 2000, 16)
  k = 200
  xd = jnp.asarray(x)
  rows = kmeans.block_rows(len(x), k, kmeans.DEFAULT_MEMORY_BYTES)
  centres = kmeans.seed_centres(xd, jax.random.key(0), k=k, per_round=1, trials=6, rows=len(x))
  a, d2, lower = kmeans.assign_with_bounds(xd, centres, rows=rows)
  for _ in range(6):
    centres, a, d2, lower, done, _ = kmeans.lloyd(
        xd, centres, a, d2, lower, np.float32(0.0), np.int32(1), k=k, rows=rows,
        one_hot=False, steps=1)
    c = np.asarray(centres, np.float64)
    dist = np.sqrt(((x[:, None, :].astype(np.float64) - c[None]) ** 2).sum(-1))   # [N, k]
    a = np.asarray(a)
    np.testing.assert_array_equal(a, dist.argmin(1))
    others = dist.copy()
    others[np.arange(len(x)), a] = np.inf
    assert np.all(np.asarray(lower, np.float64) <= others.min(1) + 1e-6)
    np.testing.assert_allclose(np.asarray(d2), dist[np.arange(len(x)), a] ** 2, atol=1e-5)
    a = jnp.asarray(a)


def test_movers_start_at_64_clusters():
  assert [kmeans.movers(k) for k in (1, 63, 64, 200, 600, 11316)] == [0, 0, 8, 25, 64, 64]


@pytest.mark.parametrize("offset", [256.0, 4096.0])
def test_a_common_offset_changes_nothing(offset):
  # k-means is translation invariant; computed as |x|^2 - 2 <x, c> + |c|^2 its float32
  # distances would round with |x|^2 (an offset of 256 in 16 dimensions: |x|^2 ~ 1e6, steps
  # of ~0.1 against distances of ~0.1): every point moved by the same whole-number offset
  # (exactly representable here) must give the same clustering, centres moved by it
  rng = np.random.default_rng(3)
  centres = rng.normal(size=(30, 16)) * 0.3
  x = centres[np.arange(600) % 30] + 0.1 * rng.normal(size=(600, 16))
  x = (np.round(x * 64) / 64).astype(np.float32)   # multiples of 1/64: x + offset is exact
  x -= np.round(x.mean(axis=0))
  want = kmeans.kmeans(x, n_clusters=30, seed=0, n_init=2)
  got = kmeans.kmeans(x + np.float32(offset), n_clusters=30, seed=0, n_init=2)
  np.testing.assert_array_equal(got.assignment, want.assignment)
  np.testing.assert_allclose(got.inertias, want.inertias, rtol=1e-6)
  np.testing.assert_array_equal(got.centres, want.centres + np.float32(offset))
  assert got.iterations == want.iterations


def test_bfloat16_points_are_clustered_as_float32():
  # a model run in bfloat16: numpy's issubdtype does not count bfloat16 as a number, so the
  # points were refused as "not a numeric [N, D] array ... got shape (40, 3)"
  x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
  x16 = jnp.asarray(x, jnp.bfloat16)
  got = kmeans.kmeans(x16, n_clusters=3, seed=0)
  want = kmeans.kmeans(np.asarray(x16, np.float32), n_clusters=3, seed=0)
  np.testing.assert_array_equal(got.assignment, want.assignment)
  with pytest.raises(ValueError, match=r"numeric .* dtype <U1"):
    kmeans.kmeans(np.array([["a", "b"]]), n_clusters=1)
