"""Pair mining (dml_jax/mining/pairs.py): multi-similarity pairs, the top-K pairs, the KL-DRO
weights (global and per anchor with pseudo pairs) and KL sampling against loops, and the error
messages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oracles import LABELS, ms_sets, np_similarity
from oracles import random_batch as batch
from dml_jax import losses
from dml_jax import mining
from dml_jax import similarity as sim

B = len(LABELS)
RNG_KEY = jax.random.key(7)


S_RAND = np.random.default_rng(3).uniform(-1, 1, size=(6, 9)).astype(np.float32)
MASK_RAND = np.random.default_rng(4).uniform(size=(6, 9)) < 0.5
MASK_RAND[2] = False


def test_topk_pairs_is_the_global_top_k_of_the_masked_entries():
  for k in (0, 1, 5, 20, S_RAND.size):
    got = np.asarray(mining.topk_pairs(S_RAND, MASK_RAND, k=k))
    order = sorted(zip(*np.nonzero(MASK_RAND)), key=lambda ij: -S_RAND[ij])[:k]
    want = np.zeros_like(MASK_RAND)
    want[tuple(np.array(order).T)] = True if order else want
    np.testing.assert_array_equal(got, want, err_msg=f"k={k}")


def test_topk_pairs_with_a_traced_count_keeps_the_count_largest():
  f = jax.jit(lambda c: mining.topk_pairs(S_RAND, MASK_RAND, k=12, count=c))
  for count in (0, 3, 12):
    want = np.asarray(mining.topk_pairs(S_RAND, MASK_RAND, k=count))
    np.testing.assert_array_equal(np.asarray(f(count)), want, err_msg=f"count={count}")


def test_multi_similarity_pairs_match_loops():
  e = batch(5)
  s = np_similarity(e)
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  kept = {}
  for positive in mining.MS_POSITIVE_MODES:
    for negative in mining.MS_NEGATIVE_MODES:
      for ref in mining.MS_NEGATIVE_REFERENCES:
        hp = dict(epsilon=0.1, positive=positive, negative=negative, negative_reference=ref)
        pk, nk = map(np.asarray, mining.multi_similarity_pairs(jnp.asarray(s, jnp.float32),
                                                               pos, neg, **hp))
        for i in range(B):
          want_p, want_n = ms_sets(s, LABELS, i, dict(hp, skip_duplicate_positives=False))
          assert sorted(np.flatnonzero(pk[i])) == sorted(want_p), (positive, negative, ref, i)
          assert sorted(np.flatnonzero(nk[i])) == sorted(want_n), (positive, negative, ref, i)
        kept[positive, negative, ref] = nk
  # The reference matters only for EPS + MS, where the hardest positive keeps more negatives.
  hardest, selected = kept["easy", "ms", "hardest"], kept["easy", "ms", "selected"]
  assert np.all(selected <= hardest) and hardest.sum() > selected.sum()
  np.testing.assert_array_equal(kept["ms", "ms", "hardest"], kept["ms", "ms", "selected"])


def test_multi_similarity_pairs_drop_exact_ties():
  """Both MS rules are strict (released code): a negative with ``s_an + eps == min s_ap`` and a
  positive with ``s_ap - eps == max s_an`` are not kept (dyadic scores: the ties are exact)."""
  labels = jnp.asarray([0, 0, 0, 1, 1], jnp.int32)
  s = np.full((5, 5), -1.0, np.float32)
  s[0, 1:] = [0.5, 0.75, 0.25, 0.125]   # anchor 0: positives 0.5, 0.75; negatives 0.25, 0.125
  pos, neg = sim.label_masks(labels)
  pk, nk = map(np.asarray, mining.multi_similarity_pairs(jnp.asarray(s), pos, neg,
                                                         epsilon=0.25))
  assert not nk[0, 3] and not nk[0, 4]       # 0.25 + 0.25 == min s_ap 0.5: dropped
  assert not pk[0, 1] and not pk[0, 2]       # 0.5 - 0.25 == max s_an 0.25: dropped
  pk, nk = map(np.asarray, mining.multi_similarity_pairs(jnp.asarray(s), pos, neg,
                                                         epsilon=0.375))
  assert nk[0, 3] and not nk[0, 4]           # 0.625 > 0.5; 0.125 + 0.375 == 0.5: dropped
  assert pk[0, 1] and not pk[0, 2]           # 0.125 < 0.25; 0.375 > 0.25


def test_kl_weights_and_grouped_weights_match_loops():
  gamma = 0.3
  p = np.asarray(mining.kl_weights(S_RAND, MASK_RAND, gamma=gamma))
  z = np.where(MASK_RAND, np.exp(S_RAND.astype(np.float64) / gamma), 0.0)
  np.testing.assert_allclose(p, z / z.sum(), rtol=1e-5, atol=1e-8)
  for pseudo in (None, 0.0, 0.7):
    pg = np.asarray(mining.kl_grouped_weights(S_RAND, MASK_RAND, gamma=gamma,
                                              pseudo_loss=pseudo))
    for a in range(S_RAND.shape[0]):
      denom = z[a].sum() + (0.0 if pseudo is None else np.exp(pseudo / gamma))
      want = z[a] / denom if denom > 0 else z[a]
      np.testing.assert_allclose(pg[a], want, rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(pg[2], 0.0)
  empty = np.zeros_like(MASK_RAND)
  np.testing.assert_array_equal(mining.kl_weights(S_RAND, empty, gamma=gamma), 0.0)
  np.testing.assert_array_equal(
      mining.kl_sample_pairs(RNG_KEY, S_RAND, empty, gamma=gamma, num=7), 0)


def test_kl_sampling_frequencies_match_p_star_over_many_keys():
  labels = jnp.array([0, 0, 1, 1, 2], jnp.int32)
  s = sim.pairwise_similarity(jnp.asarray(batch(6, b=5)))
  pos, neg = sim.label_masks(labels)
  values = losses.binomial(s, pos)
  cand = pos | neg
  gamma, num, n_keys = 0.5, 200, 500
  p = np.asarray(mining.kl_weights(values, cand, gamma=gamma), np.float64)
  draw = jax.jit(jax.vmap(lambda k: mining.kl_sample_pairs(k, values, cand, gamma=gamma,
                                                            num=num)))
  counts = np.asarray(draw(jax.random.split(jax.random.key(0), n_keys)))
  assert (counts.sum(axis=(1, 2)) == num).all()
  assert (counts[:, ~np.asarray(cand)] == 0).all()
  total = num * n_keys
  freq = counts.sum(axis=0) / total
  sd = np.sqrt(p * (1 - p) / total)
  assert p[np.asarray(cand)].min() > 1e-3 and p.max() > 4 * p[np.asarray(cand)].min()
  np.testing.assert_array_less(np.abs(freq - p), 5 * sd + 1e-9)


def test_kl_sampling_keeps_the_share_of_light_pairs_in_a_large_batch():
  """B = 512: p* puts 1 % of its mass on the half of the pairs whose loss is lower by
  gamma ln 100. One float32 CDF over the 262,144 pairs drew them about half as often as p*
  says (0.79 % instead of 0.99 % at B = 256, none at B = 1024)."""
  b, gamma, num = 512, 0.1, 100_000
  light = np.arange(b) % 2 == 1
  values = np.where(light[None, :], 1.0 - gamma * np.log(100.0), 1.0).astype(np.float32) \
      * np.ones((b, b), np.float32)
  cand = np.ones((b, b), bool)
  counts = np.asarray(jax.jit(lambda k, v, c: mining.kl_sample_pairs(k, v, c, gamma=gamma,
                                                                     num=num))(RNG_KEY, values, cand))
  assert counts.sum() == num
  share = 0.01 / 1.01
  got = counts[:, light].sum() / num
  assert abs(got - share) < 5 * np.sqrt(share * (1 - share) / num), got


@pytest.mark.parametrize("call,match", [
    (lambda: mining.multi_similarity_pairs(S_RAND, MASK_RAND, ~MASK_RAND,
                                           negative_reference="x"), "hardest, selected"),
    (lambda: mining.topk_pairs(S_RAND, MASK_RAND, k=S_RAND.size + 1), "k must be an int in"),
    (lambda: mining.kl_weights(S_RAND, MASK_RAND, gamma=0.0), "gamma must be a number > 0"),
    (lambda: mining.kl_sample_pairs(RNG_KEY, S_RAND, MASK_RAND, gamma=1.0, num=0), "num must"),
    (lambda: mining.multi_similarity_pairs(S_RAND, MASK_RAND, ~MASK_RAND, positive="x"), "ms"),
])
def test_bad_arguments_are_rejected(call, match):
  with pytest.raises(ValueError, match=match):
    call()
