"""NCA objectives (``nca``, ``nca_2nd``; dml_jax/objectives/_nca.py): every selection mode against
a numpy oracle over explicit triplets (loss value, gradient w.r.t. the embeddings, and the aux
diagnostics), the EPHN paper's properties and the error messages."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objective_support as support
from objective_support import B
from oracles import LABELS, np_similarity, oracle_terms
from oracles import random_batch as batch
from dml_jax import objectives

RNG_KEY = jax.random.key(42)
run = functools.partial(support.run, rng=RNG_KEY)
check_against_oracle = functools.partial(support.check_nca_triplet, rng=RNG_KEY)


# ----------------------------------------------------------------------------- oracle tests


NCA_CASES = [
    dict(positive="easy", negative="hard"),        # EPHN (default)
    dict(positive="easy", negative="semihard"),    # EPSHN
    dict(positive="easy", negative="all"),         # EP
    dict(positive="hard", negative="all"),         # HP
    dict(positive="hard", negative="hard"),        # HPHN
    dict(positive="all", negative="all"),          # batch-all
    dict(positive="random", negative="hard"),
    dict(positive="all", negative="semihard"),     # semi-hard per pair
    dict(positive="easy", negative="easy"),
    dict(positive="easy", negative="random"),
]


@pytest.mark.parametrize("kw", NCA_CASES, ids=lambda kw: f"{kw['positive']}-{kw['negative']}")
def test_nca_matches_oracle(kw):
  check_against_oracle("nca", batch(0), LABELS, **kw)


@pytest.mark.parametrize("kw", [
    dict(positive="easy", negative="hard", temperature=1.0),   # eq. 16 exactly
    dict(positive="easy", negative="semihard"),
    dict(positive="all", negative="all"),
], ids=["EPHN-T1", "EPSHN", "batch-all"])
def test_nca_2nd_matches_oracle(kw):
  check_against_oracle("nca_2nd", batch(1), LABELS, **kw)


@pytest.mark.parametrize("name,kw", [("nca", dict(negative="semihard")),
                                     ("nca_2nd", dict(negative="all"))])
def test_sum_reduction_is_the_sum_of_the_terms(name, kw):
  """``reduction='sum'`` (the EPHN paper's released code): the sum over the valid terms, the
  mean times their number, gradient included."""
  terms = check_against_oracle(name, batch(2), LABELS, reduction="sum", **kw)
  total, _, g_sum = run(name, batch(2), LABELS, reduction="sum", **kw)
  mean, _, g_mean = run(name, batch(2), LABELS, **kw)
  np.testing.assert_allclose(total, len(terms) * mean, rtol=1e-5)
  np.testing.assert_allclose(g_sum, len(terms) * g_mean, rtol=1e-4, atol=1e-7)


def test_ephn_released_code_options():
  e = batch(4)
  e[1] = e[0]                                           # a duplicate pair (S = 1)
  kw = dict(skip_duplicate_positives=True, positive_similarity_only=True)
  terms = check_against_oracle("nca", e, LABELS, **kw)
  assert all(p != 1 for a, p, _ in terms if a == 0)
  plain = oracle_terms(e, LABELS, "nca", objectives.make("nca").hparams)
  assert (0, 1) in [(a, p) for a, p, _ in plain] and len(terms) < len(plain)
  check_against_oracle("nca", e, LABELS, negative="all", positive_similarity_only=True)
  # Hard positives with S_ap <= 0 and random negatives with S_an <= 0 are both dropped.
  kw = dict(positive="hard", negative="random")
  hp = objectives.make("nca", **kw).hparams
  dropped = oracle_terms(e, LABELS, "nca", hp,
                         support.library_selection(e, LABELS, "nca", hp, RNG_KEY))
  kept = check_against_oracle("nca", e, LABELS, positive_similarity_only=True, **kw)
  s = np_similarity(e, "cosine")
  assert any(s[a, p] <= 0 for a, p, _ in dropped)
  assert any(s[a, p] > 0 and s[a, n] <= 0 for a, p, (n,) in dropped)
  assert 0 < len(kept) < len(dropped)


def test_positive_similarity_only_drops_exactly_orthogonal_pairs():
  """``S_ap > 0`` and ``S_an > 0`` are strict: pairs of orthogonal embeddings (``S = 0``
  exactly) leave the loss, whether positive, single negative or one of all negatives."""
  e = np.array([[1, 0, 0], [0.6, 0.8, 0], [0, 0, 1], [0.8, 0, 0.6]], np.float32)
  s = np_similarity(e, "cosine")
  assert s[0, 2] == 0 and s[1, 2] == 0
  nca = lambda sp, sn: np.log1p(np.sum(np.exp((np.asarray(sn) - sp) / 0.1)))
  loss = lambda labels, negative: jax.jit(objectives.make(
      "nca", negative=negative, positive_similarity_only=True).apply)(
          {}, jnp.asarray(e), jnp.asarray(labels, jnp.int32))[0]
  # All negatives, labels 0 0 1 1: 2 leaves the sums of 0 and 1; anchor 2 keeps none.
  want = [nca(s[0, 1], [s[0, 3]]), nca(s[1, 0], [s[1, 3]]), nca(s[3, 2], s[3, :2])]
  np.testing.assert_allclose(loss([0, 0, 1, 1], "all"), np.mean(want), rtol=1e-5)
  # Easy negatives, labels 0 1 0 1: anchors 0 and 2 have S_ap = 0, anchor 1 has S_an = 0.
  np.testing.assert_allclose(loss([0, 1, 0, 1], "easy"), nca(s[3, 1], [s[3, 2]]), rtol=1e-5)


# ----------------------------------------------------------------------------- properties


def test_group_size_two_ep_hp_and_batch_all_coincide():
  """EPHN paper §6.1: with two examples per class EP = HP = batch-all, and EPHN = HPHN."""
  labels = np.repeat(np.arange(B // 2), 2).astype(np.int32)
  e = batch(5)
  for name in ("nca", "nca_2nd"):
    ep = run(name, e, labels, positive="easy", negative="all")
    for other in (run(name, e, labels, positive="hard", negative="all"),
                  run(name, e, labels, positive="all", negative="all")):
      np.testing.assert_allclose(other[0], ep[0], rtol=1e-6)
      np.testing.assert_allclose(other[2], ep[2], rtol=1e-5, atol=1e-7)
  ephn = run("nca", e, labels, positive="easy", negative="hard")
  hphn = run("nca", e, labels, positive="hard", negative="hard")
  np.testing.assert_allclose(hphn[0], ephn[0], rtol=1e-6)
  np.testing.assert_allclose(hphn[2], ephn[2], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["nca", "nca_2nd"])
def test_batch_without_valid_anchor_gives_zero_loss_and_finite_gradient(name):
  support.check_zero_loss_without_valid_anchor(name, rng=RNG_KEY)


@pytest.mark.parametrize("kw", [{}, dict(positive="all", negative="all")],
                         ids=["kw0", "kw1"])
def test_anchors_without_positive_never_give_nan(kw):
  support.check_anchors_without_positive_never_give_nan("nca", rng=RNG_KEY, **kw)


def test_semihard_without_candidate_drops_the_anchor():
  # Anchor 0: positive 1 is farther than every negative -> dropped; anchor 1 keeps its term.
  x = np.array([[1.0, 0.0], [-0.6, 0.8], [0.9, 0.1], [0.8, -0.3]], np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  labels = np.array([0, 0, 1, 2], np.int32)
  loss, aux, _ = run("nca", x, labels, negative="semihard")
  np.testing.assert_allclose(aux["valid_fraction"], 0.25, rtol=1e-6)   # only anchor 1
  hp = objectives.make("nca").hparams
  s = np_similarity(x, "cosine")
  negs = [n for n in (2, 3) if s[1, n] <= s[1, 0]]
  n = max(negs, key=lambda k: s[1, k])
  want = np.log1p(np.exp((s[1, n] - s[1, 0]) / hp["temperature"]))
  np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_loss_is_invariant_to_batch_permutation():
  e = batch(8)
  perm = np.random.default_rng(0).permutation(B)
  for kw in (dict(), dict(positive="all", negative="semihard")):
    a = run("nca", e, LABELS, **kw)[0]
    b = run("nca", e[perm], LABELS[perm], **kw)[0]
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_bf16_embeddings_give_finite_float32_loss():
  e = jnp.asarray(batch(9), jnp.bfloat16)
  for name in ("nca", "nca_2nd"):
    loss, aux, grad = run(name, e, LABELS, temperature=0.01)
    assert loss.dtype == jnp.float32 and grad.dtype == jnp.bfloat16
    chex.assert_tree_all_finite((loss, aux, grad.astype(jnp.float32)))
    assert loss > 0


def test_apply_traces_once_per_shape():
  support.check_apply_traces_once_per_shape("nca", positive="all", negative="semihard")


@pytest.mark.parametrize("positive,negative", [("easy", "hard"), ("hard", "semihard"),
                                               ("random", "easy")])
def test_single_positive_fast_path_equals_general_path(positive, negative):
  support.check_fast_path_equals_general_path("nca", positive, negative)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("call,match", [
    (lambda: objectives.make("nca", margin=0.2), "margin.*valid: positive, negative, temperature"),
    (lambda: objectives.make("nca", positive="semihard"), "easy, hard, random, all"),
    (lambda: objectives.make("nca", temperature=0.0), "temperature must be a number > 0"),
    (lambda: objectives.make("nca_2nd", temperature=-1), "temperature must be a number > 0"),
    (lambda: objectives.make("nca", negative="semihard_random"), "needs a triplet margin"),
    (lambda: objectives.make("nca_2nd", negative="semihard_band"), "needs a triplet margin"),
    (lambda: objectives.make("nca", similarity="l1"), "cosine, dot, neg_sq_euclidean"),
    (lambda: objectives.make("nca", skip_duplicate_positives=1), "True or False"),
    (lambda: objectives.make("nca_2nd", reduction="batch"), "reduction.*mean, sum"),
    (lambda: objectives.make("nca", similarity="dot", positive_similarity_only=True),
     "similarity='cosine'"),
])
def test_make_rejects_bad_arguments(call, match):
  with pytest.raises(ValueError, match=match):
    call()
