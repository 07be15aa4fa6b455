"""Trimming (dml_jax/mining/trimming.py): ``keep_easiest`` keeps exactly the lowest fraction of
the valid terms, equals the previous stable-rank selection with ties, and rejects a bad
``keep_fraction``."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from oracles import np_keep_easiest
from dml_jax import mining


@pytest.mark.parametrize("keep_fraction", [0.01, 0.25, 0.5, 0.7, 0.9, 1.0])
def test_keep_easiest_keeps_exactly_the_lowest_fraction(keep_fraction):
  rng = np.random.default_rng(0)
  values = rng.permutation(60).reshape(6, 10).astype(np.float32) / 7
  valid = rng.random((6, 10)) < 0.5
  n = int(valid.sum())
  kept = np.asarray(mining.keep_easiest(jnp.asarray(values), jnp.asarray(valid),
                                        keep_fraction=keep_fraction))
  k = max(1, math.ceil(round(keep_fraction * n, 9)))
  assert kept.sum() == k and np.all(valid[kept])
  order = np.sort(values[valid])
  np.testing.assert_array_equal(np.sort(values[kept]), order[:k])
  empty = mining.keep_easiest(jnp.asarray(values), jnp.zeros((6, 10), bool),
                              keep_fraction=keep_fraction)
  assert not np.asarray(empty).any()


@pytest.mark.parametrize("keep_fraction", [0.1, 0.5, 0.9, 1.0])
def test_keep_easiest_equals_the_stable_rank_selection_with_ties(keep_fraction):
  rng = np.random.default_rng(0)
  for shape in [(8, 8), (13,), (5, 7)]:
    values = np.maximum(np.round(rng.normal(size=shape), 1), 0).astype(np.float32)
    for valid in (rng.random(shape) < 0.6, np.ones(shape, bool), np.zeros(shape, bool)):
      got = mining.keep_easiest(jnp.asarray(values), jnp.asarray(valid),
                                keep_fraction=keep_fraction)
      np.testing.assert_array_equal(got, np_keep_easiest(values, valid, keep_fraction))


def test_keep_easiest_rejects_a_fraction_outside_zero_one():
  with pytest.raises(ValueError, match=r"keep_fraction.*\(0, 1\]"):
    mining.keep_easiest(jnp.ones(3), jnp.ones(3, bool), keep_fraction=0)


def test_keep_easiest_refuses_a_mask_that_is_not_bool():
  # an int mask of 0 / 2 counted each valid term twice (k doubled) and came back as int32
  with pytest.raises(ValueError, match=r"valid must be bool .* got int32"):
    mining.keep_easiest(jnp.arange(4.0), jnp.array([2, 2, 0, 2]), keep_fraction=0.5)
