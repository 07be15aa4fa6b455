"""Distance-weighted sampling (dml_jax/mining/distance_weighted.py): the weights against the
analytic formula, sampling frequencies against them over many keys, the fallbacks of anchors
without weight, and its use through ``mining.select``."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oracles import LABELS, np_d2, np_dw_probs, np_similarity, positives_of
from oracles import random_batch as batch
from dml_jax import mining
from dml_jax import similarity as sim
from dml_jax.mining import _common as mining_common

B, D = len(LABELS), 4
RNG_KEY = jax.random.key(7)


def test_distance_weights_match_the_formula_and_mask_same_class_and_far_negatives():
  e = batch(0)
  s = sim.pairwise_similarity(jnp.asarray(e))
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  w = np.asarray(mining.distance_weights(-sim.squared_distance(s), neg, dim=D))
  want = np_dw_probs(e, LABELS)
  got = w / np.maximum(w.sum(axis=1, keepdims=True), 1e-30)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
  assert np.all(w[np.asarray(pos)] == 0) and np.all(np.diag(w) == 0)
  dist = np.sqrt(np_d2(e))
  far = (LABELS[:, None] != LABELS[None]) & (dist >= 1.4)
  assert far.any() and np.all(w[far] == 0)   # the batch has far negatives; they get 0
  assert np.allclose(w.max(axis=1)[w.max(axis=1) > 0], 1.0)   # max-subtracted per anchor


def test_distance_weights_without_cutoff_keep_far_negatives():
  """nonzero_loss_cutoff=2 (Roth et al.'s code): every negative keeps its weight q(d)^-1,
  also beyond d = 1.4 and at an antipodal point (d = 2, finite weight)."""
  e = batch(0)
  e[11] = -e[0]                                         # antipodal to anchor 0 (classes differ)
  s = sim.pairwise_similarity(jnp.asarray(e))
  _, neg = sim.label_masks(jnp.asarray(LABELS))
  score = -sim.squared_distance(s)
  w = np.asarray(mining.distance_weights(score, neg, dim=D, nonzero_loss_cutoff=2.0))
  assert np.all(np.isfinite(w)) and np.all((w > 0) == (LABELS[:, None] != LABELS[None]))
  rows = slice(1, B - 1)                # anchors 0 and 11 put all their weight on d = 2
  got = w[rows] / w[rows].sum(axis=1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):   # the oracle's rows 0, 11: inf / inf
    want = np_dw_probs(e, LABELS, nonzero_loss_cutoff=2.0)[rows]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
  assert w[0, 11] == w[11, 0] == 1.0
  cut = np.asarray(mining.distance_weights(score, neg, dim=D))
  assert (cut[np.asarray(neg)] == 0).any()              # the default cuts some of them off


def test_distance_weights_in_high_dimension_are_finite():
  e = batch(1, d=128)
  s = sim.pairwise_similarity(jnp.asarray(e))
  _, neg = sim.label_masks(jnp.asarray(LABELS))
  w = np.asarray(mining.distance_weights(-sim.squared_distance(s), neg, dim=128))
  assert np.all(np.isfinite(w)) and np.all((w >= 0) & (w <= 1))
  np.testing.assert_allclose(w / np.maximum(w.sum(1, keepdims=True), 1e-30),
                             np_dw_probs(e, LABELS), rtol=1e-3, atol=1e-6)


FREQ_LABELS = np.repeat(np.arange(3), 4).astype(np.int32)   # 3 positives per anchor
FREQ_KEYS = 2000


@functools.cache
def _dw_draws(seed, fallback="negatives"):
  e = jnp.asarray(batch(seed, b=len(FREQ_LABELS)))
  score = -sim.squared_distance(sim.pairwise_similarity(e))
  pos, neg = sim.label_masks(jnp.asarray(FREQ_LABELS))
  draw = lambda k: mining.distance_weighted_negatives(score, neg, pos, dim=D, fallback=fallback,
                                                      key=k)
  keys = jax.random.split(jax.random.key(seed), FREQ_KEYS)
  return jax.device_get(jax.jit(jax.vmap(draw))(keys))


def test_distance_weighted_sampling_frequencies_match_the_analytic_weights():
  seed = 3
  idx, valid = _dw_draws(seed)
  e = batch(seed, b=len(FREQ_LABELS))
  probs = np_dw_probs(e, FREQ_LABELS)
  assert probs.max() > 2 * probs[probs > 0].min()   # non-uniform weights: the test can fail
  assert (probs == 0)[FREQ_LABELS[:, None] != FREQ_LABELS[None]].any()
  b = len(FREQ_LABELS)
  for a in range(b):
    assert np.all(valid[:, a][:, positives_of(FREQ_LABELS, a)])
    draws = idx[:, a][valid[:, a]]                       # one per (key, positive)
    n = draws.size
    assert n == FREQ_KEYS * 3
    freq = np.bincount(draws, minlength=b) / n
    # Never a zero-weight item; elsewhere within 5 binomial standard deviations (+1e-3).
    assert np.all(freq[probs[a] == 0] == 0), a
    tol = 5 * np.sqrt(probs[a] * (1 - probs[a]) / n) + 1e-3
    assert np.all(np.abs(freq - probs[a]) <= tol), (a, freq, probs[a])


def fallback_batch():
  """Class 0 (items 0, 1) lies at d >= 1.4 from every negative; classes 1, 2 are close."""
  x = np.zeros((6, D), np.float32)
  x[0] = [1, 0, 0, 0]
  x[1] = [1, 0, 0, 0.1]
  x[2] = [0, 1, 0, 0]
  x[3] = [0, 1, 0, 0.1]
  x[4] = [0, 1, 1, 0]
  x[5] = [0, 1, 1, 0.1]
  return x / np.linalg.norm(x, axis=1, keepdims=True), np.array([0, 0, 1, 1, 2, 2], np.int32)


@pytest.mark.parametrize("fallback", mining.DW_FALLBACKS)
def test_distance_weighted_fallback_when_an_anchor_has_no_weight(fallback):
  x, labels = fallback_batch()
  assert np.all(np_dw_probs(x, labels)[:2] == 0) and np.all(np_dw_probs(x, labels)[2:].sum(1) > 0)
  score = -sim.squared_distance(sim.pairwise_similarity(jnp.asarray(x)))
  pos, neg = sim.label_masks(jnp.asarray(labels))
  draw = jax.jit(jax.vmap(lambda k: mining.distance_weighted_negatives(
      score, neg, pos, dim=D, fallback=fallback, key=k)))
  idx, valid = jax.device_get(draw(jax.random.split(jax.random.key(0), 200)))
  idx0 = idx[:, 0, 1]                                   # term (anchor 0, positive 1)
  if fallback == "drop":
    assert not valid[:, :2].any()
  elif fallback == "negatives":
    assert valid[:, 0, 1].all() and set(idx0) == {2, 3, 4, 5}
  else:  # released code: uniform over the whole batch, self and positive included
    assert valid[:, 0, 1].all() and set(idx0) == set(range(6))
  probs = np_dw_probs(x, labels)
  for a in (2, 3):                                      # anchors with weights are unaffected
    assert valid[:, a].any(axis=1).all()
    assert np.all(probs[a][idx[:, a][valid[:, a]]] > 0)


def test_select_plugs_in_distance_weighted_with_easy_positives():
  e = batch(4)
  score = -sim.squared_distance(sim.pairwise_similarity(jnp.asarray(e)))
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  kw = dict(positive="easy", negative="distance_weighted", key=RNG_KEY, dim=D)
  sel = jax.device_get(mining.select(score, pos, neg, **kw))
  again = jax.device_get(mining.select(score, pos, neg, **kw))
  chex.assert_trees_all_equal(sel, again)               # a key gives one selection
  s, probs = np_similarity(e), np_dw_probs(e, LABELS)
  for a in range(B):
    ps = positives_of(LABELS, a)
    if not ps:
      assert not sel.valid[a].any()
      continue
    (p,) = np.flatnonzero(sel.pairs[a])
    assert p == max(ps, key=lambda j: s[a, j]) and sel.valid[a, p]
    assert probs[a, sel.negative[a, p]] > 0 or probs[a].sum() == 0
  with pytest.raises(ValueError, match="embedding dimension dim"):
    mining.select(score, pos, neg, positive="easy", negative="distance_weighted", key=RNG_KEY)


def test_distance_weights_need_the_embedding_dimension():
  with pytest.raises(ValueError, match="embedding dimension dim"):
    mining.distance_weights(jnp.zeros((2, 2)), jnp.ones((2, 2), bool), dim=0)


def test_inverse_cdf_draws_never_land_on_a_zero_weight_entry():
  """The draws of distance-weighted sampling and DRO-KL sampling search a cumulative row. XLA's
  cumsum (a windowed reduction) does not add in sequence, so by rounding a prefix
  can step up at a zero weight and down elsewhere; a zero-weight entry (self, a positive, a
  cut-off negative) must still never be drawn. Over 2^21 draws from rows of 4096 half-zero
  weights the unguarded search drew about 2 per million."""
  rng = np.random.default_rng(0)
  w = (rng.random((256, 4096)) * (rng.random((256, 4096)) < 0.5)).astype(np.float32)
  # w is an argument, not a constant of the program: XLA would constant-fold the cumsum.
  draw = jax.jit(lambda k, w: mining_common.inverse_cdf_rows(k, w, 4096))
  for seed in (0, 1):
    idx = np.asarray(draw(jax.random.key(seed), jnp.asarray(w)))
    assert np.all(np.take_along_axis(w, idx, axis=1) > 0), seed
