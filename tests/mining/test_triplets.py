"""Label masks and every triplet mining mode (dml_jax/mining/triplets.py) against plain numpy
loops over explicit pairs, and the per-anchor fast path against the general sorted path."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oracles import LABELS, negative_candidates, negatives_of, np_similarity, oracle_positives
from oracles import positives_of
from oracles import random_batch as batch
from dml_jax import mining
from dml_jax import similarity as sim
from dml_jax.mining import _common as mining_common
from dml_jax.mining import triplets as mining_triplets

B = len(LABELS)
np_scores = functools.partial(np_similarity, kind="dot")


@functools.partial(jax.jit, static_argnames=("positive", "negative"))
def jit_select(s, labels, key, *, positive, negative, margin=0.0):
  pos, neg = sim.label_masks(labels)
  return mining.select(s, pos, neg, positive=positive, negative=negative, margin=margin,
                       key=key)


KEY = jax.random.key(0)


# ----------------------------------------------------------------------------- label masks


def test_label_masks_exclude_self_and_partition_pairs():
  labels = jnp.asarray(LABELS)
  pos, neg = sim.label_masks(labels)
  chex.assert_shape([pos, neg], (B, B))
  for i in range(B):
    for j in range(B):
      assert bool(pos[i, j]) == (i != j and LABELS[i] == LABELS[j])
      assert bool(neg[i, j]) == (LABELS[i] != LABELS[j])
  np.testing.assert_array_equal(pos, pos.T)
  # Every pair is exactly one of: self, positive, negative.
  np.testing.assert_array_equal(pos.astype(int) + neg.astype(int) + np.eye(B, dtype=int), 1)
  # Singletons have no positive.
  assert not pos[10].any() and not pos[11].any()


def test_label_masks_reject_float_labels():
  with pytest.raises(ValueError, match="integers"):
    sim.label_masks(jnp.zeros((4,), jnp.float32))


def test_label_masks_check_the_reference_labels_too():
  labels = jnp.arange(4)
  with pytest.raises(ValueError, match=r"reference labels must have rank 1 \[B'\], got shape \(3, 1\)"):
    sim.label_masks(labels, jnp.arange(3).reshape(3, 1))
  with pytest.raises(ValueError, match="reference labels must be integers, got dtype float32"):
    sim.label_masks(labels, jnp.arange(3, dtype=jnp.float32))


# ----------------------------------------------------------------------------- positives


@pytest.mark.parametrize("mode", ["easy", "hard", "all"])
def test_positives_match_oracle(mode):
  x = batch(1)
  s = np_scores(x)
  pos, _ = sim.label_masks(jnp.asarray(LABELS))
  out = mining.positives(jnp.asarray(s, jnp.float32), pos, mode=mode)
  want = oracle_positives(s, LABELS, mode)
  if mode == "all":
    got = {a: list(np.flatnonzero(out[a])) for a in range(B) if out[a].any()}
    assert got == want
    return
  idx, valid = out
  chex.assert_shape([idx, valid], (B,))
  assert idx.dtype == jnp.int32
  assert [a for a in range(B) if valid[a]] == sorted(want)
  for a, (p,) in want.items():
    assert int(idx[a]) == p


def test_random_positive_is_uniform_and_deterministic():
  s = jnp.asarray(np_scores(batch(2)), jnp.float32)
  sel = draws(s, jnp.asarray(LABELS), 2000, positive="random", negative="hard", seed=7)
  assert sel.pairs.sum(axis=2).max() == 1
  idx = sel.pairs.argmax(axis=2)                       # [draws, B]
  assert (sel.pairs.any(axis=2) == (np.arange(B) < 10)).all()
  for a in range(10):
    cand = positives_of(LABELS, a)
    assert set(np.unique(idx[:, a]).tolist()) == set(cand)
    freq = np.array([np.mean(idx[:, a] == p) for p in cand])
    np.testing.assert_allclose(freq, 1 / len(cand), atol=0.05)
  again = draws(s, jnp.asarray(LABELS), 50, positive="random", negative="hard", seed=7)
  np.testing.assert_array_equal(again.pairs, sel.pairs[:50])
  assert (idx[0] != idx[1]).any()


def test_random_positive_needs_a_key():
  s = jnp.zeros((B, B))
  pos, _ = sim.label_masks(jnp.asarray(LABELS))
  with pytest.raises(ValueError, match="PRNG key"):
    mining.positives(s, pos, mode="random")


def test_unknown_modes_are_rejected_with_the_allowed_list():
  s = jnp.zeros((B, B))
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  with pytest.raises(ValueError, match="easy, hard, random, all"):
    mining.positives(s, pos, mode="semihard")
  with pytest.raises(ValueError, match="semihard_random"):
    mining.negatives(s, neg, pos, mode="hardest")


# ----------------------------------------------------------------------------- negatives


DETERMINISTIC = [(p, n) for p in ("easy", "hard", "all")
                 for n in ("hard", "semihard", "easy", "all")]


@pytest.mark.parametrize("positive,negative", DETERMINISTIC)
def test_deterministic_selection_matches_oracle(positive, negative):
  x = batch(3)
  s = np_scores(x)
  sel = jit_select(jnp.asarray(s, jnp.float32), jnp.asarray(LABELS), None, positive=positive,
                   negative=negative)
  chex.assert_shape([sel.pairs, sel.valid, sel.negative, sel.negatives], (B, B))
  want_pairs = oracle_positives(s, LABELS, positive)
  got_pairs = {a: list(np.flatnonzero(sel.pairs[a])) for a in range(B) if sel.pairs[a].any()}
  assert got_pairs == want_pairs
  want_valid = np.zeros((B, B), bool)
  for a, ps in want_pairs.items():
    for p in ps:
      cand = negative_candidates(s, LABELS, a, p, negative)
      want_valid[a, p] = bool(cand)
      if cand and negative != "all":
        assert int(sel.negative[a, p]) == cand[0], (a, p)
  np.testing.assert_array_equal(sel.valid, want_valid)
  _, neg = sim.label_masks(jnp.asarray(LABELS))
  np.testing.assert_array_equal(sel.negatives, neg)


def test_semihard_without_candidate_drops_the_anchor_without_fallback():
  # Anchor 0's only positive (1) is farther than both negatives: no S_an <= S_ap exists.
  x = np.array([[1.0, 0.0], [-1.0, 0.05], [0.9, 0.1], [0.8, -0.3]], np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  labels = jnp.array([0, 0, 1, 2], jnp.int32)
  s = jnp.asarray(x @ x.T)
  sel = jit_select(s, labels, None, positive="easy", negative="semihard")
  assert bool(sel.pairs[0, 1]) and not sel.valid[0].any()
  # Anchor 2 (a singleton) has no positive at all; anchor 3 likewise.
  assert not sel.valid[2].any() and not sel.valid[3].any()
  # The hard negative of the same anchor exists, so the drop is specific to semi-hard.
  hard = jit_select(s, labels, None, positive="easy", negative="hard")
  assert bool(hard.valid[0, 1]) and int(hard.negative[0, 1]) == 2


def test_semihard_is_per_pair_with_all_positives():
  # Anchor 0 has positives at S = 0.9 and 0.2; negatives at 0.5 and 0.1 (1-D angles on a circle).
  ang = np.arccos([1.0, 0.9, 0.2, 0.5, 0.1])
  x = np.stack([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
  labels = jnp.array([0, 0, 0, 1, 2], jnp.int32)
  sel = jit_select(jnp.asarray(x @ x.T), labels, None, positive="all", negative="semihard")
  assert int(sel.negative[0, 1]) == 3   # S_ap = 0.9 -> hardest negative below: 0.5
  assert int(sel.negative[0, 2]) == 4   # S_ap = 0.2 -> 0.1
  assert sel.valid[0, 1] and sel.valid[0, 2]


def draws(s, labels, n, *, positive, negative, margin=0.0, seed=11):
  """``n`` selections of one batch with keys ``split(key(seed), n)``, as numpy arrays."""
  out = [jit_select(s, labels, k, positive=positive, negative=negative, margin=margin)
         for k in jax.random.split(jax.random.key(seed), n)]
  return jax.tree.map(lambda *xs: np.stack(xs), *jax.device_get(out))


@pytest.mark.parametrize("positive", ["easy", "all"])
@pytest.mark.parametrize("negative,margin", [("semihard_random", 0.3), ("semihard_band", 0.3),
                                             ("random", 0.0)])
def test_random_negatives_are_admissible_uniform_and_deterministic(positive, negative, margin):
  s = np_scores(batch(4))
  args = (jnp.asarray(s, jnp.float32), jnp.asarray(LABELS), 2000)
  sel = draws(*args, positive=positive, negative=negative, margin=margin)
  pairs = sel.pairs[0]
  checked = 0
  for a, p in zip(*np.nonzero(pairs)):
    cand = negative_candidates(s, LABELS, a, p, negative, margin)
    np.testing.assert_array_equal(sel.valid[:, a, p], bool(cand))
    if not cand:
      continue
    chosen = sel.negative[:, a, p]
    assert set(np.unique(chosen).tolist()) <= set(cand)
    if len(cand) >= 2:
      freq = np.array([np.mean(chosen == n) for n in cand])
      np.testing.assert_allclose(freq, 1 / len(cand), atol=0.05)
      checked += 1
  assert checked > 0
  again = draws(*args[:2], 50, positive=positive, negative=negative, margin=margin)
  np.testing.assert_array_equal(again.negative, sel.negative[:50])
  # Different keys give different draws somewhere.
  assert (sel.negative[0] != sel.negative[1])[pairs].any()


def test_semihard_random_candidates_follow_the_positive_loss_condition():
  # Anchor 0, positive at S=0.6, negatives at 0.9, 0.55, 0.45, 0.2 (the rest of the batch
  # are far singletons); margin 0.1 admits s_an > 0.5: {0.9, 0.55} (0.9 is closer than the
  # positive but still has a positive loss).
  ang = np.arccos(np.r_[1.0, 0.6, 0.9, 0.55, 0.45, 0.2, np.full(B - 6, -0.5)])
  x = np.stack([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
  labels = jnp.arange(B, dtype=jnp.int32).at[1].set(0)
  sel = draws(jnp.asarray(x @ x.T), labels, 200, positive="easy", negative="semihard_random",
              margin=0.1, seed=3)
  assert set(sel.negative[:, 0, 1].tolist()) == {2, 3}


def test_semihard_band_is_roths_band_on_distances_with_a_random_fallback():
  # Scores s = -d (unsquared distances, what the objectives pass). Anchor 0: positive 1 at
  # d = 0.5; negatives at d = 0.3 (closer than the positive), 0.6 and 0.65 (in the band
  # (0.5, 0.7) of margin 0.2), 0.7 (on the open edge) and 0.9. Anchor 6: positive 7 at
  # d = 0.2, negatives only at d >= 0.8: empty band -> uniform over all its negatives.
  # Anchor 8 has no positive: no term, no NaN.
  d = np.full((9, 9), 1.5)
  np.fill_diagonal(d, 0.0)
  d[0, 1:6] = [0.5, 0.3, 0.6, 0.65, 0.7]
  d[0, 8] = 0.9
  d[6, 7], d[6, 8] = 0.2, 0.8
  d = np.minimum(d, d.T)
  labels = jnp.asarray([0, 0, 1, 2, 3, 4, 5, 5, 6], jnp.int32)
  s = jnp.asarray(-d, jnp.float32)
  for positive in ("easy", "all"):
    sel = draws(s, labels, 120, positive=positive, negative="semihard_band", margin=0.2, seed=5)
    assert set(sel.negative[:, 0, 1].tolist()) == {3, 4}
    assert sel.valid[:, 0, 1].all()
    fallback = sel.negative[:, 6, 7]
    assert sel.valid[:, 6, 7].all() and set(fallback.tolist()) == {0, 1, 2, 3, 4, 5, 8}
    assert not sel.valid[:, 8].any()
  # Label-noise random semi-hard (d_an < d_ap + 0.2) admits nothing for anchor 6: dropped.
  rnd = draws(s, labels, 20, positive="easy", negative="semihard_random", margin=0.2)
  assert not rnd.valid[:, 6, 7].any()


def test_random_negative_needs_a_key():
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  with pytest.raises(ValueError, match="PRNG key"):
    mining.select(jnp.zeros((B, B)), pos, neg, positive="easy", negative="random")


@pytest.mark.parametrize("positive", ["easy", "all"])
@pytest.mark.parametrize("negative", ["semihard_random", "semihard_band"])
@pytest.mark.parametrize("margin", [float("nan"), -0.5, "0.2"])
def test_margin_modes_reject_a_margin_that_is_not_a_number_at_least_0(positive, negative, margin):
  """A NaN margin dropped every term (or fell back to uniform) without a word."""
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  with pytest.raises(ValueError, match="margin must be a number >= 0"):
    mining.select(jnp.zeros((B, B)), pos, neg, positive=positive, negative=negative,
                  margin=margin, key=jax.random.key(0))


def test_no_negatives_and_no_positives_give_no_valid_term():
  s = jnp.asarray(np_scores(batch(5, b=4)), jnp.float32)
  same = jnp.zeros((4,), jnp.int32)        # one class: no negatives
  for negative in ("hard", "semihard", "all"):
    sel = jit_select(s, same, None, positive="easy", negative=negative)
    assert not sel.valid.any()
  distinct = jnp.arange(4, dtype=jnp.int32)  # all singletons: no positives
  sel = jit_select(s, distinct, None, positive="all", negative="all")
  assert not sel.pairs.any() and not sel.valid.any()


def test_selection_traces_once_per_shape():
  count = []

  @jax.jit
  def fn(s, labels):
    count.append(1)
    pos, neg = sim.label_masks(labels)
    return mining.select(s, pos, neg, positive="all", negative="semihard")

  for seed in range(3):
    fn(jnp.asarray(np_scores(batch(seed)), jnp.float32), jnp.asarray(np.roll(LABELS, seed)))
  assert len(count) == 1
  fn(jnp.asarray(np_scores(batch(0, b=6)), jnp.float32), jnp.arange(6, dtype=jnp.int32) % 3)
  assert len(count) == 2


# --------------------------------------------- per-anchor fast path == general sorted path


def tie_scores(seed, b=B):
  """Scores rounded to 1 decimal: many exact ties between negatives and with ``s_ap``."""
  return jnp.asarray(np.round(np_scores(batch(seed, b=b)), 1), jnp.float32)


@functools.partial(jax.jit, static_argnames=("negative",))
def jit_general(s, labels, pairs, key, *, negative, margin=0.0):
  """The general sorted path (:func:`mining.negatives`) for a given pair selection."""
  _, neg = sim.label_masks(labels)
  return mining.negatives(s, neg, pairs, mode=negative, margin=margin, key=key)


@pytest.mark.parametrize("positive", ["easy", "hard", "random"])
@pytest.mark.parametrize("negative", ["hard", "semihard", "easy"])
def test_per_anchor_negatives_equal_the_sorted_path(positive, negative):
  for seed in range(4):
    s = tie_scores(seed)
    labels = jnp.asarray(np.roll(LABELS, seed))
    key = jax.random.key(seed)
    sel = jit_select(s, labels, key, positive=positive, negative=negative)
    idx, valid = jit_general(s, labels, sel.pairs, None, negative=negative)
    np.testing.assert_array_equal(sel.valid, valid)
    np.testing.assert_array_equal(np.where(valid, sel.negative, -1), np.where(valid, idx, -1))
    assert sel.pairs.sum(axis=1).max() <= 1 and sel.valid.any()


@pytest.mark.parametrize("negative,margin", [("semihard_random", 0.15), ("semihard_band", 0.15),
                                             ("random", 0.0)])
def test_per_anchor_random_negatives_draw_from_the_sorted_paths_set(negative, margin):
  # Same validity and, per term, the same admissible set as the sorted path (uniformity over
  # that set: test_random_negatives_are_admissible_uniform_and_deterministic).
  s = tie_scores(6)
  labels = jnp.asarray(LABELS)
  sel = draws(s, labels, 300, positive="easy", negative=negative, margin=margin)
  seen = {}
  for t in range(300):
    pairs = jnp.asarray(sel.pairs[t])
    idx, valid = jit_general(s, labels, pairs, jax.random.key(t), negative=negative,
                             margin=margin)
    np.testing.assert_array_equal(sel.valid[t], valid)
    for a, p in zip(*np.nonzero(np.asarray(valid))):
      seen.setdefault((a, p), [set(), set()])
      seen[a, p][0].add(int(sel.negative[t, a, p]))
      seen[a, p][1].add(int(idx[a, p]))
  assert seen and all(fast == general for fast, general in seen.values())


# -------------------------------------------- compacted semi-hard negatives == sorted path


def test_compact_rows_lists_each_rows_true_entries_in_index_order():
  mask = np.random.default_rng(0).random((7, 11)) < 0.4
  mask[0] = False                                   # an empty row
  mask[1] = True                                    # a full row, cut to the size
  idx, ok = jax.jit(mining_common.compact_rows, static_argnums=1)(jnp.asarray(mask), 5)
  chex.assert_shape([idx, ok], (7, 5))
  for a in range(7):
    want = np.flatnonzero(mask[a])[:5]
    np.testing.assert_array_equal(ok[a], np.arange(5) < len(want))
    np.testing.assert_array_equal(np.asarray(idx[a])[:len(want)], want)
  out = mining_common.scatter_rows(jnp.where(ok, idx + 1, 0), idx, ok, num=11)
  np.testing.assert_array_equal(out, np.where(mask & (np.cumsum(mask, 1) <= 5),
                                              np.arange(1, 12), 0))


@functools.partial(jax.jit, static_argnames=("sizes",))
def jit_semihard(s, labels, *, sizes):
  pos, neg = sim.label_masks(labels)
  return mining_triplets.semihard_negatives(s, neg, pos, sizes=sizes)


# (2, 4): P_max > 4 for most label sets, the sorted fallback; (4, 16) and (8,): compacted.
@pytest.mark.parametrize("sizes", [(2, 4), (4, 16), (8,), (2, 4, 8, 64)], ids=str)
def test_compacted_semihard_equals_the_sorted_path_with_ties(sizes):
  for seed in range(4):
    s = tie_scores(seed, b=20)
    labels = np.random.default_rng(seed).permutation(
        np.repeat(np.arange(7), [7, 5, 3, 2, 1, 1, 1])).astype(np.int32)   # singletons too
    labels = jnp.asarray(labels)
    idx, valid = jit_semihard(s, labels, sizes=sizes)
    pos, _ = sim.label_masks(labels)
    want_idx, want_valid = jit_general(s, labels, pos, None, negative="semihard")
    np.testing.assert_array_equal(valid, want_valid)
    np.testing.assert_array_equal(np.where(valid, idx, -1), np.where(want_valid, want_idx, -1))
    assert valid.any() and not valid.all()
    # The numpy oracle (hardest s_an <= s_ap; ties: the last index).
    s_np, lab = np.asarray(s), np.asarray(labels)
    for a, p in zip(*np.nonzero(np.asarray(pos))):
      cand = [n for n in negatives_of(lab, a) if s_np[a, n] <= s_np[a, p]]
      assert bool(valid[a, p]) == bool(cand)
      if cand:
        best = max(s_np[a, n] for n in cand)
        assert int(idx[a, p]) == max(n for n in cand if s_np[a, n] == best)


def test_compacted_semihard_without_negatives_or_positives():
  s = tie_scores(1, b=6)
  for labels in (jnp.zeros((6,), jnp.int32), jnp.arange(6, dtype=jnp.int32)):
    _, valid = jit_semihard(s, labels, sizes=(2, 4))
    assert not valid.any()
