"""Triplet objectives (``triplet``, ``trimmed_triplet``; dml_jax/objectives/_triplet.py): every
selection mode (distance-weighted negatives included) against a numpy oracle over explicit
triplets (loss value, gradient w.r.t. the embeddings, and the aux diagnostics), trimming of the
hardest terms, the single-positive fast paths and the error messages."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objective_support as support
from objective_support import B, D
from oracles import (LABELS, fd_grad, negatives_of, np_d2, np_dw_probs, np_similarity,
                     np_sq_distance, positives_of)
from oracles import random_batch as batch
from dml_jax import mining
from dml_jax import objectives
from dml_jax.objectives import _common as objectives_common
from dml_jax import similarity as sim

RNG_KEY = jax.random.key(42)
DW_KEY = jax.random.key(7)   # the draw of the distance-weighted oracle test
run = functools.partial(support.run, rng=RNG_KEY)
check_against_oracle = functools.partial(support.check_nca_triplet, rng=RNG_KEY)


# ----------------------------------------------------------------------------- oracle tests


TRIPLET_CASES = [
    dict(positive="random", negative="semihard"),                 # default
    dict(positive="easy", negative="semihard"),                   # EPS
    dict(positive="easy", negative="hard"),
    dict(positive="hard", negative="easy", margin=1.5),
    dict(positive="hard", negative="random"),
    dict(positive="easy", negative="semihard_random"),
    dict(positive="all", negative="semihard_random", margin=0.5),
    dict(positive="all", negative="all", margin=0.5),             # batch-all, mean
    dict(positive="easy", negative="all", negative_reduction="sum"),
    # label-noise paper eq. 3: plain Euclidean distance, random / fixed semi-hard (eqs. 28-29)
    dict(positive="all", negative="semihard_random", margin=0.2, distance="euclidean"),
    dict(positive="all", negative="semihard", distance="euclidean"),
    dict(positive="easy", negative="all", distance="euclidean"),
    # Roth et al.'s semi-hard miner (EPS framework): band on plain d, hinge on d^2
    dict(positive="easy", negative="semihard_band"),
    dict(positive="all", negative="semihard_band", margin=0.3),
    dict(positive="all", negative="semihard_band", distance="euclidean"),
]


@pytest.mark.parametrize("kw", TRIPLET_CASES,
                         ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_triplet_matches_oracle(kw):
  check_against_oracle("triplet", batch(2), LABELS, **kw)


def test_euclidean_triplet_gradient_is_finite_for_identical_points():
  """d = sqrt(d^2) is clipped below, so a duplicated positive (d = 0) gives no NaN."""
  e = np.array(batch(2))
  e[1] = e[0]                                   # LABELS[0] == LABELS[1]: a duplicate positive
  assert LABELS[0] == LABELS[1]
  loss, _, grad = run("triplet", e, LABELS, positive="all", negative="all",
                      distance="euclidean")
  assert np.isfinite(loss) and np.all(np.isfinite(grad))


def test_triplet_on_unnormalised_2d_embeddings():
  e = 0.7 * batch(3, d=2, normalize=False)
  terms = check_against_oracle("triplet", e, LABELS, positive="easy", negative="semihard",
                               similarity="neg_sq_euclidean")
  assert len(terms) >= 3


def test_triplet_with_distance_weighted_negatives_matches_oracle():
  e = batch(8)
  kw = dict(positive="easy", negative="distance_weighted")
  loss, aux, ge = run("triplet", e, LABELS, rng=DW_KEY, **kw)
  score = -sim.squared_distance(sim.pairwise_similarity(jnp.asarray(e)))
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  sel = jax.device_get(mining.select(score, pos, neg, key=DW_KEY, dim=D, **kw))
  probs = np_dw_probs(e, LABELS)
  terms = []
  for a in range(B):
    ps = positives_of(LABELS, a)
    if not ps:
      continue
    p = max(ps, key=lambda j: np_similarity(e)[a, j])
    n = int(sel.negative[a, p])
    assert sel.valid[a, p] and (probs[a, n] > 0 or (probs[a].sum() == 0 and LABELS[n] != LABELS[a]))
    terms.append((a, p, n))

  def f(x):
    d2 = np_d2(x)
    return np.mean([max(d2[a, p] - d2[a, n] + 0.2, 0) for a, p, n in terms])

  np.testing.assert_allclose(loss, f(e), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(ge, fd_grad(f, e), rtol=2e-3, atol=2e-4)
  np.testing.assert_allclose(aux["valid_fraction"], 10 / 12, rtol=1e-6)


def test_semihard_band_oracle_batch_has_band_and_fallback_terms():
  """The oracle cases above exercise both branches of Roth et al.'s miner, and the band
  differs from what d^2 would give (it is on plain distances)."""
  s = np_similarity(batch(2), "cosine")
  d2 = np_sq_distance(s, "cosine")
  dist = np.sqrt(d2)
  band = fallback = squared_differs = 0
  for a in range(B):
    for p in positives_of(LABELS, a):
      negs = negatives_of(LABELS, a)
      in_band = [n for n in negs if dist[a, p] < dist[a, n] < dist[a, p] + 0.2]
      band += bool(in_band)
      fallback += not in_band
      squared_differs += in_band != [n for n in negs if d2[a, p] < d2[a, n] < d2[a, p] + 0.2]
  assert band and fallback and squared_differs


# ----------------------------------------------------------------------------- trimmed triplet


def test_trimmed_triplet_back_propagates_only_the_easiest_terms():
  e = batch(10)
  kw = dict(positive="all", negative="hard", margin=0.8, keep_fraction=0.6)
  loss, aux, ge = run("trimmed_triplet", e, LABELS, **kw)
  d2 = np_d2(e)
  terms = []
  for a in range(B):
    negs = negatives_of(LABELS, a)
    n = max(negs, key=lambda j: -d2[a, j])
    terms += [(a, p, n) for p in positives_of(LABELS, a)]
  vals = np.array([max(d2[a, p] - d2[a, n] + 0.8, 0) for a, p, n in terms])
  assert len(set(vals[vals > 0])) == (vals > 0).sum() > 10   # distinct: the kept set is unique
  k = math.ceil(0.6 * len(terms))
  kept = [terms[i] for i in np.argsort(vals, kind="stable")[:k]]

  def f(x):
    dd = np_d2(x)
    return np.mean([max(dd[a, p] - dd[a, n] + 0.8, 0) for a, p, n in kept])

  np.testing.assert_allclose(loss, f(e), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(ge, fd_grad(f, e), rtol=2e-3, atol=2e-4)
  np.testing.assert_allclose(aux["kept_fraction"], k / len(terms), rtol=1e-6)
  np.testing.assert_allclose(aux["valid_fraction"], 10 / 12, rtol=1e-6)
  full = run("triplet", e, LABELS, positive="all", negative="hard", margin=0.8)
  assert loss < full[0]                                 # the hardest terms are gone
  same = run("trimmed_triplet", e, LABELS, positive="all", negative="hard", margin=0.8,
             keep_fraction=1.0)
  np.testing.assert_allclose(same[0], full[0], rtol=1e-6)
  np.testing.assert_allclose(same[2], full[2], rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- properties


def test_batch_without_valid_anchor_gives_zero_loss_and_finite_gradient():
  support.check_zero_loss_without_valid_anchor("triplet", rng=RNG_KEY)


@pytest.mark.parametrize("name,kw", [("trimmed_triplet", {}),
                                     ("triplet", dict(negative="distance_weighted"))])
def test_trimmed_and_distance_weighted_without_valid_anchor_give_zero_loss(name, kw):
  support.check_zero_loss_without_valid_anchor_with_params(name, rng=DW_KEY, **kw)


@pytest.mark.parametrize("kw", [dict(positive="all", negative="all"),
                                dict(positive="easy", negative="semihard_band")],
                         ids=["all-all", "easy-semihard_band"])
def test_anchors_without_positive_never_give_nan(kw):
  support.check_anchors_without_positive_never_give_nan("triplet", rng=RNG_KEY, **kw)


def test_random_selection_is_deterministic_per_key():
  e = batch(10)
  a = run("triplet", e, LABELS, rng=jax.random.key(1))[0]
  b = run("triplet", e, LABELS, rng=jax.random.key(1))[0]
  losses = {float(run("triplet", e, LABELS, rng=jax.random.key(k))[0]) for k in range(6)}
  assert a == b and len(losses) > 1


@pytest.mark.parametrize("name,kw", [("triplet", dict(positive="easy", negative="semihard_band")),
                                     ("trimmed_triplet", dict(positive="all"))])
def test_apply_traces_once_per_shape(name, kw):
  support.check_apply_traces_once_per_shape(name, **kw)


@pytest.mark.parametrize("name,positive,negative", [
    ("triplet", "easy", "hard"), ("triplet", "random", "semihard"),
    ("triplet", "easy", "semihard"), ("triplet", "hard", "hard"),
    ("trimmed_triplet", "random", "semihard"), ("trimmed_triplet", "easy", "hard")])
def test_single_positive_fast_path_equals_general_path(name, positive, negative):
  support.check_fast_path_equals_general_path(name, positive, negative)


def test_negative_of_term_gathers_each_selected_term_with_its_gradient():
  # distance_weighted keeps a different negative in every column: the [B, 1] gather must
  # read the selected column's one.
  e = jnp.asarray(batch(7))
  s = sim.pairwise_similarity(e)
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  score = -sim.squared_distance(jax.lax.stop_gradient(s))
  sel = mining.select(score, pos, neg, positive="random", negative="distance_weighted",
                      key=jax.random.key(3), dim=D)
  assert sel.valid.any()

  def total(x, fast):
    if fast:
      x_an = objectives_common.negative_of_term(x, sel, positive="random")
    else:
      x_an = jnp.take_along_axis(x, sel.negative, axis=1)
    return jnp.sum(jnp.where(sel.valid, jnp.sin(3 * x_an) * x, 0.0))

  x = s * s
  np.testing.assert_allclose(total(x, True), total(x, False), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(total)(x, True), jax.grad(total)(x, False), rtol=1e-6)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("call,match", [
    (lambda: objectives.make("triplet", negative="hardest"), "semihard_random"),
    (lambda: objectives.make("triplet", similarity="dot"), "cosine, neg_sq_euclidean"),
    (lambda: objectives.make("triplet", margin=-0.1), "margin must be a number >= 0"),
    (lambda: objectives.make("triplet", negative_reduction="max"), "mean, sum"),
    (lambda: objectives.make("triplet", distance="l1"), "squared, euclidean"),
    (lambda: objectives.make("triplet", negative="distance_weighted",
                             similarity="neg_sq_euclidean"), "similarity='cosine'"),
    (lambda: objectives.make("trimmed_triplet", keep_fraction=0.0), r"keep_fraction.*\(0, 1\]"),
    (lambda: objectives.make("trimmed_triplet", keep_fraction=-0.5), r"keep_fraction.*\(0, 1\]"),
    (lambda: objectives.make("trimmed_triplet", keep_fraction=1.5), r"keep_fraction.*\(0, 1\]"),
])
def test_make_rejects_bad_arguments(call, match):
  with pytest.raises(ValueError, match=match):
    call()
