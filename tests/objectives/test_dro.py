"""The DRO objectives (``dro_topk``, ``dro_topk_pn``, ``dro_kl``, ``dro_kl_grouped``;
dml_jax/objectives/_dro.py) against the numpy loop oracle over explicit pairs (loss, gradient
w.r.t. the embeddings, aux), their properties and error messages; then the DRO paper's
identities (§3.3 and supplement 6.1), to tight tolerance.

DRO-KL grouped per anchor (eq. 7) with the margin pair loss ``[m + y (lambda - S)]_+``, when
every pair loss is positive (the paper's "m sufficiently large"):

* ``gamma+ = gamma- = 1``, no pseudo pairs: its weights are eq. 19 and its gradient is the
  lifted-structure gradient (eqs. 5-6, 21-22), while the lifted-structure hinge is open;
* zero-loss pseudo pairs, ``gamma+ = 1/alpha``, ``gamma- = 1/beta``: its weights are eq. 25 with
  ``c+ = lambda + m``, ``c- = lambda - m`` and its gradient is the multi-similarity gradient
  (eq. 27) of the MS loss *without mining*, whose positive term uses ``lambda = c+`` and
  negative term ``lambda = c-``; with pseudo pairs at ``c+ = c- = lambda_MS`` it is the usual
  single-``lambda`` MS (``multi_similarity(positive='all', negative='all')``). With MS mining on,
  it holds only when DRO is restricted to the mined pairs.

Gradients are compared w.r.t. the similarity matrix (against closed forms too) and w.r.t. the
embeddings (through ``objectives.make``).
"""

import functools
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objective_support as support
from objective_support import B, D
from oracles import LABELS, fd_grad, negatives_of, np_similarity, plan, positives_of
from oracles import random_batch as batch
from dml_jax import losses
from dml_jax import mining
from dml_jax import objectives
from dml_jax import similarity as sim

NUM_PAIRS = B * (B - 1)
RNG_KEY = jax.random.key(7)
run = functools.partial(support.run, rng=RNG_KEY)


# ----------------------------------------------------------------------------- oracle tests


CASES = [
    ("dro_topk", dict(k=40)),
    ("dro_topk", dict(k=40, pair_loss="binomial")),
    ("dro_topk_pn", dict(k=12)),                                      # 2 (K/2) < 16 positives
    ("dro_topk_pn", dict(k=40, pair_loss="binomial")),              # 2 (K/2) > 16 positives
    ("dro_topk_pn", dict(k=40, balanced=True)),                     # and 16 negatives
    ("dro_topk_pn", dict(k=17, balanced=True)),     # exactly 16 positives: 18 negatives
    ("dro_kl", dict(mode="weight")),
    ("dro_kl", dict(mode="weight", pair_loss="binomial", gamma=0.5, remove_zero_loss=False)),
    ("dro_kl", dict(mode="sample", k=50)),
    ("dro_kl_grouped", {}),
    ("dro_kl_grouped", dict(pseudo_pairs=True, gamma_pos=0.1, gamma_neg=0.3)),
    ("dro_kl_grouped", dict(pseudo_pairs=True, c_pos=0.6, c_neg=0.1, pair_loss="binomial",
                            gamma_pos=0.5, gamma_neg=0.05, remove_zero_loss=False)),
]


@pytest.mark.parametrize("name,kw", CASES,
                         ids=[f"{n}-{'-'.join(map(str, kw.values())) or 'default'}"
                              for n, kw in CASES])
def test_objective_matches_oracle(name, kw):
  loss, entering, active = support.check_pair_objective(name, batch(0), LABELS, rng=RNG_KEY,
                                                        **kw)
  assert loss > 0
  assert 0 < len(active) <= len(entering)


def distinct_pair_oracle(e, labels, *, k, split):
  """The paper's DRO-TopK (``split=False``) / TopK-PN (``split=True``) over the distinct pairs
  ``{i, j}``, ``i < j``, with the default margin pair loss; the selection frozen at ``e``."""
  loss = lambda s, i, j: max(0.0, 0.2 + (0.5 - s[i, j] if labels[i] == labels[j]
                                         else s[i, j] - 0.5))
  s0 = np_similarity(e)
  pairs = [(i, j) for i in range(len(labels)) for j in range(i + 1, len(labels))]
  top = lambda ps, n: sorted(ps, key=lambda ij: -loss(s0, *ij))[:n]
  if split:
    sel = (top([p for p in pairs if labels[p[0]] == labels[p[1]]], k // 2)
           + top([p for p in pairs if labels[p[0]] != labels[p[1]]], k - k // 2))
  else:
    sel = top(pairs, k)
  return lambda e1: np.mean([loss(np_similarity(e1), *ij) for ij in sel])


@pytest.mark.parametrize("name,k", [("dro_topk", 5), ("dro_topk", 30), ("dro_topk_pn", 6),
                                    ("dro_topk_pn", 12)])
def test_k_counts_distinct_pairs_as_the_paper(name, k):
  """``k`` is the paper's K: the mean over the top K distinct pairs (§4.2.3 counts pairs once;
  the released code takes 2K ordered pairs), value and gradient."""
  e = batch(3)
  f = distinct_pair_oracle(e, LABELS, k=k, split=name == "dro_topk_pn")
  loss, _, grad = run(name, e, LABELS, k=k)
  np.testing.assert_allclose(loss, f(e), rtol=1e-5)
  np.testing.assert_allclose(grad, fd_grad(f, e), rtol=2e-3, atol=2e-5)


def test_topk_pn_balanced_takes_as_many_negatives_as_positives_when_short():
  e = batch(3)
  for k, short in ((12, False), (40, True)):     # 8 distinct positive pairs in LABELS
    paper, released = (run("dro_topk_pn", e, LABELS, k=k, balanced=b)[0] for b in (False, True))
    assert (paper != released) == short, k


def test_kl_sample_draws_follow_the_key():
  e = batch(2)
  a = run("dro_kl", e, LABELS, rng=jax.random.key(1), k=50)[0]
  b = run("dro_kl", e, LABELS, rng=jax.random.key(1), k=50)[0]
  values = {float(run("dro_kl", e, LABELS, rng=jax.random.key(i), k=50)[0]) for i in range(5)}
  assert a == b and len(values) > 1


# ----------------------------------------------------------------------------- properties


def test_batch_without_valid_anchor_gives_zero_loss_and_finite_gradient():
  support.check_pair_zero_loss_without_valid_anchor("dro_kl_grouped", rng=RNG_KEY)


def test_dro_kl_without_nonzero_loss_pair_gives_zero():
  e = np.repeat(np.eye(3, D, dtype=np.float32), 4, axis=0)   # positives S = 1, negatives S = 0
  labels = np.repeat(np.arange(3, dtype=np.int32), 4)
  for kw in (dict(mode="weight"), dict(mode="sample", k=50), {}):
    name = "dro_kl_grouped" if not kw else "dro_kl"
    loss, aux, grad = run(name, e, labels, **kw)
    assert loss == 0.0 and aux["valid_fraction"] == 0.0
    chex.assert_tree_all_finite(grad)
    np.testing.assert_array_equal(grad, 0.0)


def test_singleton_classes_take_part_as_negatives():
  support.check_singleton_classes_take_part_as_negatives("dro_topk_pn", rng=RNG_KEY, k=40)


def test_bf16_embeddings_give_finite_float32_loss():
  support.check_pair_bf16("dro_kl_grouped", rng=RNG_KEY)


@pytest.mark.parametrize("name,kw", [("dro_topk", dict(k=30)), ("dro_kl", dict(k=30))])
def test_apply_traces_once_per_shape(name, kw):
  support.check_apply_traces_once_per_shape(name, **kw)


@pytest.mark.parametrize("name,kw", [("dro_topk_pn", dict(k=30)), ("dro_kl", dict(k=50))])
def test_vmap_over_a_leading_axis(name, kw):
  support.check_vmap_over_a_leading_axis(name, rng=RNG_KEY, **kw)


@pytest.mark.parametrize("name,kw", [
    ("dro_topk", dict(k=40)), ("dro_topk_pn", dict(k=30)), ("dro_kl", dict(mode="weight")),
    ("dro_kl_grouped", dict(pseudo_pairs=True))])
def test_loss_and_gradient_are_invariant_to_batch_permutation(name, kw):
  support.check_invariant_to_batch_permutation(name, rng=RNG_KEY, **kw)


def test_k_above_the_number_of_pairs_is_clamped_with_a_warning():
  e, labels = batch(22), LABELS
  with pytest.warns(UserWarning, match=rf"k=500 \(1000 ordered pairs\) exceeds the {NUM_PAIRS} "
                    "ordered pairs"):
    big = run("dro_topk", e, labels, k=500)[0]
  hp = objectives.make("dro_topk", k=NUM_PAIRS // 2).hparams
  f, entering, _ = plan("dro_topk", hp, e, labels)
  assert len(entering) == NUM_PAIRS
  np.testing.assert_allclose(big, f(e), rtol=1e-4)         # the mean over all 132 pairs
  # both halves are clamped
  with pytest.warns(UserWarning, match=r"k//2=400 \(800 ordered pairs\) exceeds"):
    run("dro_topk_pn", e, labels, k=800)
  with warnings.catch_warnings():
    warnings.simplefilter("error")          # sampling draws with replacement: no clamp
    obj = objectives.make("dro_kl", k=500)
    jax.jit(lambda x, y, key: obj.apply({}, x, y, rng=key))(jnp.asarray(e), jnp.asarray(labels),
                                                            RNG_KEY)


@pytest.mark.parametrize("call,match", [
    (lambda: objectives.make("dro_kl", gamma=0.0), "gamma must be a number > 0"),
    (lambda: objectives.make("dro_kl_grouped", gamma_neg=-1.0), "gamma_neg must be a number > 0"),
    (lambda: objectives.make("dro_topk", pair_loss="hinge"), "margin, binomial"),
    (lambda: objectives.make("dro_kl", mode="max"), "weight, sample"),
    (lambda: objectives.make("dro_topk", k=0), "k must be an int >= 1"),
    (lambda: objectives.make("dro_topk_pn", k=1), "k must be an int >= 2"),
    (lambda: objectives.make("dro_topk", k=2.5), "k must be an int"),
    (lambda: objectives.make("dro_kl_grouped", c_pos=0.5), "need pseudo_pairs=True"),
    (lambda: objectives.make("dro_kl_grouped", pseudo_pairs=True, c_neg="x"), "c_neg must be"),
    (lambda: objectives.make("dro_kl", remove_zero_loss=1), "True or False"),
])
def test_bad_arguments_are_rejected(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_sampling_without_rng_is_an_error():
  obj = objectives.make("dro_kl")
  with pytest.raises(ValueError, match="pass rng"):
    obj.apply({}, jnp.asarray(batch(0)), jnp.asarray(LABELS))
  loss, _ = objectives.make("dro_kl", mode="weight").apply({}, jnp.asarray(batch(0)),
                                                           jnp.asarray(LABELS))
  assert loss > 0


# ----------------------------------------------------------------------------- the identities


MARGIN, LAM = 1.5, 0.5      # S in (-1, 1) = (LAM - MARGIN, LAM + MARGIN): every pair loss > 0
TIGHT = dict(rtol=1e-5, atol=1e-7)
E = batch(0)
S = sim.pairwise_similarity(jnp.asarray(E))                   # float32 [B, B]
S64 = np.asarray(S, np.float64)
POS, NEG = sim.label_masks(jnp.asarray(LABELS))
VALID = (jnp.any(POS, axis=1) & jnp.any(NEG, axis=1))[:, None]
GP, GN = POS & VALID, NEG & VALID                              # anchors 10, 11 have no group
NONE = jnp.zeros((B, B), bool)


def grouped_loss(s, gp, gn, *, gamma_pos, gamma_neg, pseudo=None, margin=MARGIN, base=LAM):
  """eq. 20 / B with p* of eq. 7 (under stop-gradient); ``pseudo`` = (l0+, l0-) or None."""
  l = losses.dro_margin(s, POS, margin=margin, base=base)
  p0, n0 = pseudo if pseudo is not None else (None, None)
  w = (mining.kl_grouped_weights(l, gp, gamma=gamma_pos, pseudo_loss=p0)
       + mining.kl_grouped_weights(l, gn, gamma=gamma_neg, pseudo_loss=n0))
  return jnp.sum(w * l) / B


def grad_s(f):
  return np.asarray(jax.jit(jax.grad(f))(S))


@functools.cache
def grad_e(name, **hparams):
  obj = objectives.make(name, **hparams)
  fn = jax.jit(jax.grad(lambda e: obj.apply({}, e, jnp.asarray(LABELS))[0]))
  return np.asarray(fn(jnp.asarray(E)))


def sets(i):
  return positives_of(LABELS, i), negatives_of(LABELS, i)


def test_every_pair_loss_is_positive_in_these_tests():
  l = np.asarray(losses.dro_margin(S, POS, margin=MARGIN, base=LAM))
  assert (l[np.asarray(POS | NEG)] > 0).all()


# ----------------------------------------------------------------------------- lifted structure


def test_kl_grouped_weights_with_gamma_one_are_eq_19():
  l = losses.dro_margin(S, POS, margin=MARGIN, base=LAM)
  wp = np.asarray(mining.kl_grouped_weights(l, GP, gamma=1.0))
  wn = np.asarray(mining.kl_grouped_weights(l, GN, gamma=1.0))
  for i in range(10):
    ps, ns = sets(i)
    for j in ps:
      np.testing.assert_allclose(wp[i, j], 1 / sum(np.exp(S64[i, j] - S64[i, k]) for k in ps),
                                 **TIGHT)
    for j in ns:
      np.testing.assert_allclose(wn[i, j], 1 / sum(np.exp(S64[i, k] - S64[i, j]) for k in ns),
                                 **TIGHT)


def test_dro_grouped_gamma_one_gives_the_lifted_structure_gradient_wrt_s():
  ls = np.asarray(losses.lifted_structure(S, GP, GN))
  assert (ls[:10] > 0).all()                   # the hinge of eq. 3 is open for every anchor
  g_dro = grad_s(lambda s: grouped_loss(s, GP, GN, gamma_pos=1.0, gamma_neg=1.0))
  g_ls = grad_s(lambda s: jnp.sum(losses.lifted_structure(s, GP, GN)) / B)
  np.testing.assert_allclose(g_dro, g_ls, **TIGHT)
  # eq. 22 (eq. 6 weights), explicit loops.
  want = np.zeros((B, B))
  for i in range(10):
    ps, ns = sets(i)
    for j in ps:
      want[i, j] = -1 / sum(np.exp(S64[i, j] - S64[i, k]) for k in ps) / B
    for j in ns:
      want[i, j] = 1 / sum(np.exp(S64[i, k] - S64[i, j]) for k in ns) / B
  np.testing.assert_allclose(g_dro, want, **TIGHT)


def test_dro_grouped_gamma_one_gives_the_lifted_structure_gradient_wrt_embeddings():
  kw = dict(gamma_pos=1.0, gamma_neg=1.0, margin=MARGIN, base=LAM, remove_zero_loss=False)
  g_dro = grad_e("dro_kl_grouped", **kw)
  g_ls = grad_e("lifted_structure")
  assert np.abs(g_ls).max() > 1e-2
  np.testing.assert_allclose(g_dro, g_ls, rtol=1e-5, atol=1e-6)
  # The identity needs gamma = 1 and every pair loss > 0: other settings differ.
  assert np.abs(grad_e("dro_kl_grouped", **dict(kw, gamma_pos=0.5)) - g_ls).max() > 1e-3
  assert np.abs(grad_e("dro_kl_grouped", **dict(kw, margin=0.2)) - g_ls).max() > 1e-3


# ----------------------------------------------------------------------------- multi-similarity


def test_zero_loss_pseudo_pairs_give_eq_25_weights_and_the_ms_gradient():
  """The paper's construction: pseudo losses 0, so c+ = lambda + m, c- = lambda - m."""
  alpha, beta = 2.0, 2.0                        # small beta: the pseudo negative matters too
  c_pos, c_neg = LAM + MARGIN, LAM - MARGIN
  l = losses.dro_margin(S, POS, margin=MARGIN, base=LAM)
  wp = np.asarray(mining.kl_grouped_weights(l, GP, gamma=1 / alpha, pseudo_loss=0.0))
  wn = np.asarray(mining.kl_grouped_weights(l, GN, gamma=1 / beta, pseudo_loss=0.0))
  for i in range(10):                          # eq. 25
    ps, ns = sets(i)
    for j in ps:
      want = 1 / (np.exp(alpha * (S64[i, j] - c_pos))
                  + sum(np.exp(alpha * (S64[i, j] - S64[i, k])) for k in ps))
      np.testing.assert_allclose(wp[i, j], want, **TIGHT)
    for j in ns:
      want = 1 / (np.exp(beta * (c_neg - S64[i, j]))
                  + sum(np.exp(beta * (S64[i, k] - S64[i, j])) for k in ns))
      np.testing.assert_allclose(wn[i, j], want, **TIGHT)
  pseudo_p, pseudo_n = 1 - wp.sum(axis=1)[:10], 1 - wn.sum(axis=1)[:10]
  assert pseudo_p.max() > 1e-2 and pseudo_n.max() > 1e-2    # the pseudo pairs take weight
  g_dro = grad_s(lambda s: grouped_loss(s, GP, GN, gamma_pos=1 / alpha, gamma_neg=1 / beta,
                                        pseudo=(0.0, 0.0)))
  ms = lambda s: (losses.multi_similarity(s, GP, NONE, alpha=alpha, beta=beta, base=c_pos)
                  + losses.multi_similarity(s, NONE, GN, alpha=alpha, beta=beta, base=c_neg))
  g_ms = grad_s(lambda s: jnp.sum(ms(s)) / B)
  np.testing.assert_allclose(g_dro, g_ms, **TIGHT)
  # eq. 27 with the positive threshold c+ and the negative threshold c-.
  want = np.zeros((B, B))
  for i in range(10):
    ps, ns = sets(i)
    for j in ps:
      want[i, j] = -1 / (np.exp(alpha * (S64[i, j] - c_pos))
                         + sum(np.exp(alpha * (S64[i, j] - S64[i, k])) for k in ps)) / B
    for j in ns:
      want[i, j] = 1 / (np.exp(beta * (c_neg - S64[i, j]))
                        + sum(np.exp(beta * (S64[i, k] - S64[i, j])) for k in ns)) / B
  np.testing.assert_allclose(g_dro, want, **TIGHT)


def test_pseudo_pairs_at_lambda_give_the_single_lambda_ms_gradient_wrt_embeddings():
  """MS defaults (alpha 2, beta 50, lambda 0.5) without mining == DRO grouped with pseudo pairs
  at c+ = c- = 0.5 (pseudo losses m, not 0), gamma+ = 1/2, gamma- = 1/50."""
  g_dro = grad_e("dro_kl_grouped", gamma_pos=0.5, gamma_neg=0.02, pseudo_pairs=True, c_pos=0.5,
                 c_neg=0.5, margin=MARGIN, base=LAM, remove_zero_loss=False)
  g_ms = grad_e("multi_similarity", positive="all", negative="all")
  assert np.abs(g_ms).max() > 1e-2
  np.testing.assert_allclose(g_dro, g_ms, rtol=1e-5, atol=1e-6)
  # The released MS loss mines pairs: its gradient is a different one ...
  g_mined = grad_e("multi_similarity")
  assert np.abs(g_mined - g_ms).max() > 1e-3
  # ... and without the pseudo pairs DRO gives the lifted-structure-like weights instead.
  g_plain = grad_e("dro_kl_grouped", gamma_pos=0.5, gamma_neg=0.02, margin=MARGIN, base=LAM,
                   remove_zero_loss=False)
  assert np.abs(g_plain - g_ms).max() > 1e-3


def test_with_ms_mining_the_identity_holds_on_the_mined_pairs():
  pk, nk = mining.multi_similarity_pairs(S, POS, NEG, epsilon=0.1)
  valid = (jnp.any(pk, axis=1) & jnp.any(nk, axis=1))[:, None]
  pk, nk = pk & valid, nk & valid
  assert 0 < int(pk.sum()) < int(GP.sum()) or 0 < int(nk.sum()) < int(GN.sum())
  pseudo = tuple(float(losses.dro_margin(jnp.full((1, 1), 0.5), jnp.full((1, 1), p),
                                         margin=MARGIN, base=LAM)[0, 0]) for p in (True, False))
  g_dro = grad_s(lambda s: grouped_loss(s, pk, nk, gamma_pos=0.5, gamma_neg=0.02,
                                        pseudo=pseudo))
  g_ms = grad_s(lambda s: jnp.sum(losses.multi_similarity(s, pk, nk, alpha=2.0, beta=50.0,
                                                          base=0.5)) / B)
  np.testing.assert_allclose(g_dro, g_ms, **TIGHT)
  # The full MS objective (mining under stop-gradient) has exactly this gradient w.r.t. S.
  obj = objectives.make("multi_similarity")
  assert np.isclose(float(obj.apply({}, jnp.asarray(E), jnp.asarray(LABELS))[0]),
                    float(jnp.sum(losses.multi_similarity(S, pk, nk)) / B), rtol=1e-6)
