"""Greedy k-means++ in rounds (``evaluation.kmeans_seeding``) and seedings shared by clusterings
of the same points."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dml_jax.evaluation import kmeans
from dml_jax.evaluation import kmeans_seeding


def unit_gaussian(seed, n, d):
  x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("block", [64, 500])   # row blocks; one block (distances kept)
def test_seeding_draws_distinct_data_points_in_rounds(block):
  x = unit_gaussian(2, 500, 4)
  for per_round, trials in ((1, 1), (1, 5), (7, 1), (7, 5)):
    c = np.asarray(kmeans_seeding.seed_centres(jnp.asarray(x), jax.random.key(0), k=50,
                                               per_round=per_round, trials=trials, rows=block))
    rows = [np.flatnonzero((x == ci).all(1)) for ci in c]
    assert all(len(r) == 1 for r in rows)          # every centre is a data point
    assert len({int(r[0]) for r in rows}) == 50    # never the same one twice


def test_the_schedule():
  assert kmeans_seeding.seeding_schedule(20) == (19, 1, 4)
  assert kmeans_seeding.seeding_schedule(659) == (220, 3, 8)
  assert kmeans_seeding.seeding_schedule(600) == (200, 3, 8)
  assert kmeans_seeding.seeding_schedule(600, greedy=False) == (200, 3, 1)
  assert kmeans_seeding.seeding_schedule(11316) == (252, 45, 11)


@pytest.mark.parametrize("block", [128, 1200])
@pytest.mark.parametrize("order", [(280, 300), (300, 280)])
def test_a_shared_seeding_is_the_seeding_drawn_alone(order, block):
  x = jnp.asarray(unit_gaussian(7, 1200, 12))
  key = jax.random.key(4)
  assert kmeans_seeding.seeding_schedule(280)[1:] == kmeans_seeding.seeding_schedule(300)[1:]
  alone = {k: np.asarray(kmeans_seeding.seed_centres(x, key, k=k, per_round=2, trials=7,
                                                     rows=block)) for k in order}
  shared = {}
  for k in order:
    got = kmeans_seeding.seed_centres(x, key, k=k, per_round=2, trials=7, rows=block,
                                      seedings=shared)
    np.testing.assert_array_equal(np.asarray(got), alone[k])
  assert len(shared) == 1   # one seeding kept, the longer one
  np.testing.assert_array_equal(alone[280], alone[300][:280])


def test_kmeans_with_shared_seedings_gives_the_clusterings_of_kmeans_alone():
  x = unit_gaussian(8, 1500, 16)
  alone = {k: kmeans.kmeans(x, n_clusters=k, seed=2, n_init=2) for k in (20, 280, 300)}
  seedings = {}
  for k in (300, 20, 280):
    got = kmeans.kmeans(x, n_clusters=k, seed=2, n_init=2, seedings=seedings)
    np.testing.assert_array_equal(got.assignment, alone[k].assignment)
    assert got.inertias == alone[k].inertias
  # other points empty the dict first
  y = unit_gaussian(9, 1500, 16)
  got = kmeans.kmeans(y, n_clusters=280, seed=2, n_init=2, seedings=seedings)
  np.testing.assert_array_equal(
      got.assignment, kmeans.kmeans(y, n_clusters=280, seed=2, n_init=2).assignment)
  assert np.array_equal(seedings["x"], y)


def test_seedings_must_be_a_dict():
  with pytest.raises(ValueError, match="seedings must be a dict"):
    kmeans.kmeans(unit_gaussian(0, 50, 4), n_clusters=3, seedings=[])
