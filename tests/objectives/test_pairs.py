"""Pair-based objectives (contrastive, binomial, multi-similarity, lifted structure, circle,
generalised lifted structure, intra-pair variance; dml_jax/objectives/_pairs.py): every
objective against a numpy loop oracle over explicit pairs (loss, gradient w.r.t. the
embeddings, aux), the pair-loss forms against loops, and the
properties (no valid anchor, no pair at all, bf16, vmap, permutation, bad input)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objective_support as support
from objective_support import B
from oracles import (LABELS, fd_grad, ls_bracket, ms_sets, ms_term, negatives_of, np_similarity,
                     pair_loss_and_weight, plan, positives_of)
from oracles import random_batch as batch
from dml_jax import losses
from dml_jax import objectives
from dml_jax import similarity as sim

NUM_PAIRS = B * (B - 1)
RNG_KEY = jax.random.key(7)
run = functools.partial(support.run, rng=RNG_KEY)
check_against_oracle = functools.partial(support.check_pair_objective, rng=RNG_KEY)

# The DRO objectives (test_dro.py) share the pair losses and these properties.
DRO = ["dro_topk", "dro_topk_pn", "dro_kl", "dro_kl_grouped"]
ALL = ["contrastive", "binomial", "multi_similarity", "lifted_structure"] + DRO


# ----------------------------------------------------------------------------- oracle tests


CASES = [
    ("contrastive", {}),
    ("contrastive", dict(pos_margin=0.6, neg_margin=0.2, reduction="balanced")),
    ("binomial", {}),
    ("binomial", dict(reduction="mean", alpha=10.0)),
    ("multi_similarity", {}),                                       # MS mining
    ("multi_similarity", dict(positive="easy")),                    # EPS + MS
    ("multi_similarity", dict(positive="easy", negative_reference="selected")),
    ("multi_similarity", dict(positive="all", negative="all")),     # no mining
    ("lifted_structure", {}),
    ("lifted_structure", dict(margin=-2.6, base=0.1)),              # some hinges closed
]


@pytest.mark.parametrize("name,kw", CASES,
                         ids=[f"{n}-{'-'.join(map(str, kw.values())) or 'default'}"
                              for n, kw in CASES])
def test_objective_matches_oracle(name, kw):
  loss, entering, active = check_against_oracle(name, batch(0), LABELS, **kw)
  assert loss > 0
  assert 0 < len(active) <= len(entering)


def test_oracle_cases_exercise_the_selections():
  """The oracle batch is not degenerate: each rule keeps some pairs and drops others."""
  e = batch(0)
  s = np_similarity(e)
  hp = objectives.make("multi_similarity").hparams
  kept = [ms_sets(s, LABELS, i, hp) for i in range(B)]
  n_pos = sum(len(pk) for pk, _ in kept)
  n_neg = sum(len(nk) for _, nk in kept)
  assert 0 < n_pos < 16 and 0 < n_neg < NUM_PAIRS - 16
  # Anchor 6 has a positive and negatives but keeps neither: it is dropped (contributes 0).
  assert kept[6] == ([], []) and LABELS[7] == LABELS[6]
  hp = objectives.make("lifted_structure", margin=-2.6).hparams
  brackets = [ls_bracket(s, i, positives_of(LABELS, i), negatives_of(LABELS, i), hp)
              for i in range(10)]
  assert min(brackets) < 0 < max(brackets)
  hp = objectives.make("dro_kl", mode="weight").hparams
  f, entering, _ = plan("dro_kl", hp, e, LABELS)
  assert 30 < len(entering) < NUM_PAIRS      # zero-loss pairs were removed


def test_ms_released_code_duplicate_rule():
  e = batch(1)
  e[1] = e[0]                                 # a duplicate of anchor 0 (S = 1)
  # EPS + MS: the easy positive of anchors 0 and 1 is the duplicate unless it is skipped.
  check_against_oracle("multi_similarity", e, LABELS, positive="easy",
                       skip_duplicate_positives=True)
  with_dup = run("multi_similarity", e, LABELS, positive="easy")[0]
  without = run("multi_similarity", e, LABELS, positive="easy", skip_duplicate_positives=True)[0]
  assert with_dup != without


# ----------------------------------------------------------------------------- loss forms


def test_pair_loss_forms_match_loops():
  s = np.random.default_rng(8).uniform(-1, 1, size=(5, 7))
  pos = np.random.default_rng(9).uniform(size=(5, 7)) < 0.4
  hp = dict(pos_margin=0.9, neg_margin=0.1, margin=0.2, base=0.5, alpha=40.0, beta=2.0)
  forms = {
      "contrastive": lambda x: losses.contrastive(x, pos, pos_margin=0.9, neg_margin=0.1),
      "margin": lambda x: losses.dro_margin(x, pos, margin=0.2, base=0.5),
      "binomial": lambda x: losses.binomial(x, pos, alpha=40.0, beta=2.0, base=0.5),
  }
  for kind, fn in forms.items():
    got = np.asarray(fn(jnp.asarray(s, jnp.float32)))
    g = np.asarray(jax.grad(lambda x: jnp.sum(fn(x)))(jnp.asarray(s, jnp.float32)))
    for ij in np.ndindex(s.shape):
      v, w = pair_loss_and_weight(hp, kind, s[ij], pos[ij])
      np.testing.assert_allclose(got[ij], v, rtol=1e-5, atol=1e-6, err_msg=kind)
      np.testing.assert_allclose(abs(g[ij]), w, rtol=1e-4, atol=1e-6, err_msg=kind)


def test_ms_and_lifted_forms_match_loops_with_empty_sets():
  s = np.random.default_rng(10).uniform(-1, 1, size=(4, 6))
  pm = np.random.default_rng(11).uniform(size=(4, 6)) < 0.4
  nm = ~pm & (np.random.default_rng(12).uniform(size=(4, 6)) < 0.7)
  pm[1], nm[2] = False, False
  hp = dict(alpha=2.0, beta=50.0, base=0.5, margin=0.3)
  ms = np.asarray(losses.multi_similarity(jnp.asarray(s, jnp.float32), pm, nm, alpha=2.0,
                                          beta=50.0, base=0.5))
  ls = np.asarray(losses.lifted_structure(jnp.asarray(s, jnp.float32), pm, nm, base=0.5,
                                          margin=0.3))
  for i in range(4):
    ps, ns = list(np.flatnonzero(pm[i])), list(np.flatnonzero(nm[i]))
    np.testing.assert_allclose(ms[i], ms_term(s, i, ps, ns, hp), rtol=1e-5, atol=1e-6)
    want = max(ls_bracket(s, i, ps, ns, hp), 0.0) if ps and ns else 0.0
    np.testing.assert_allclose(ls[i], want, rtol=1e-5, atol=1e-6)
  assert ls[1] == 0.0 and ls[2] == 0.0 and ms[1] > 0 and ms[2] > 0
  g = jax.grad(lambda x: jnp.sum(losses.lifted_structure(x, pm, nm)))(jnp.asarray(s))
  chex.assert_tree_all_finite(g)
  np.testing.assert_array_equal(g[1:3], 0.0)


def test_lifted_structure_does_not_depend_on_base():
  s = jnp.asarray(np_similarity(batch(13)), jnp.float32)
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  a = losses.lifted_structure(s, pos, neg, base=0.5)
  b = losses.lifted_structure(s, pos, neg, base=-0.3)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  c = losses.lifted_structure(s, pos, neg, base=0.5, margin=0.2)
  np.testing.assert_allclose(c[:10], a[:10] + 0.2, rtol=1e-5)


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize("name", ["multi_similarity", "lifted_structure"])
def test_batch_without_valid_anchor_gives_zero_loss_and_finite_gradient(name):
  support.check_pair_zero_loss_without_valid_anchor(name, rng=RNG_KEY)


def test_single_example_batch_has_no_pair():
  """Every pair objective, the DRO ones included."""
  objs = [objectives.make(name) for name in ALL]

  @jax.jit
  def all_objectives(e, labels):
    return [jax.value_and_grad(o.apply, argnums=1, has_aux=True)({}, e, labels, rng=RNG_KEY)
            for o in objs]

  with pytest.warns(UserWarning, match="exceeds the 0 ordered pairs"):   # k clamped to 0
    out = all_objectives(jnp.asarray(batch(15, b=1)), jnp.zeros(1, jnp.int32))
  for name, ((loss, aux), grad) in zip(ALL, out):
    assert loss == 0.0 and aux["valid_fraction"] == 0.0, name
    chex.assert_tree_all_finite(grad)


def test_singleton_classes_take_part_as_negatives():
  support.check_singleton_classes_take_part_as_negatives("contrastive", rng=RNG_KEY)


def test_bf16_embeddings_give_finite_float32_loss():
  support.check_pair_bf16("multi_similarity", rng=RNG_KEY)


def test_vmap_over_a_leading_axis():
  support.check_vmap_over_a_leading_axis("multi_similarity", rng=RNG_KEY, positive="easy")


@pytest.mark.parametrize("name", ["contrastive", "binomial", "multi_similarity",
                                  "lifted_structure"])
def test_loss_and_gradient_are_invariant_to_batch_permutation(name):
  support.check_invariant_to_batch_permutation(name, rng=RNG_KEY)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("call,match", [
    (lambda: objectives.make("multi_similarity", positive="hard"), "ms, all, easy"),
    (lambda: objectives.make("multi_similarity", negative="easy"), "ms, all"),
    (lambda: objectives.make("multi_similarity", negative_reference="easy"), "hardest, selected"),
    (lambda: objectives.make("multi_similarity", epsilon=-0.1), "epsilon must be a number >= 0"),
    (lambda: objectives.make("multi_similarity", beta=0), "beta must be a number > 0"),
    (lambda: objectives.make("multi_similarity", similarity="dot",
                             skip_duplicate_positives=True), "similarity='cosine'"),
    (lambda: objectives.make("contrastive", reduction="sum"), "mean, balanced"),
    (lambda: objectives.make("contrastive", pos_margin=float("nan")), "finite number"),
    (lambda: objectives.make("binomial", alpha=-2.0), "alpha must be a number > 0"),
    (lambda: objectives.make("lifted_structure", temperature=1.0), "valid: base, margin"),
])
def test_bad_arguments_are_rejected(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def oracle_circle(e, labels, m, gamma):
  """Sun et al. eq. 6 per anchor, loops over its positives and negatives (weights a_p, a_n at
  the current similarities); mean over anchors with both."""
  s = np_similarity(e)
  out = []
  for a in range(len(labels)):
    ps = [p for p in range(len(labels)) if p != a and labels[p] == labels[a]]
    ns = negatives_of(labels, a)
    if not ps or not ns:
      continue
    zp = [-gamma * max(1 + m - s[a, p], 0) * (s[a, p] - (1 - m)) for p in ps]
    zn = [gamma * max(s[a, n] + m, 0) * (s[a, n] - m) for n in ns]
    out.append(np.logaddexp(0.0, np.logaddexp.reduce(zp) + np.logaddexp.reduce(zn)))
  return float(np.mean(out))


@pytest.mark.parametrize("m,gamma", [(0.4, 80.0), (0.25, 16.0)])
def test_circle_matches_oracle_value_and_detached_weight_gradient(m, gamma):
  """The value equals eq. 6; the gradient is eq. 6's with a_p, a_n held fixed (the paper's
  detached weights), checked by finite differences of the oracle with frozen weights."""
  e = batch(8, d=4, normalize=False)
  loss, aux, grad = support.run("circle", e, LABELS, rng=None, m=m, gamma=gamma)
  np.testing.assert_allclose(float(loss), oracle_circle(e, LABELS, m, gamma), rtol=1e-5)
  s0 = np_similarity(e)
  a_p, a_n = np.maximum(1 + m - s0, 0), np.maximum(s0 + m, 0)

  def frozen(x):
    s = np_similarity(x)
    out = []
    for a in range(len(LABELS)):
      ps = [p for p in range(len(LABELS)) if p != a and LABELS[p] == LABELS[a]]
      ns = negatives_of(LABELS, a)
      if ps and ns:
        zp = [-gamma * a_p[a, p] * (s[a, p] - (1 - m)) for p in ps]
        zn = [gamma * a_n[a, n] * (s[a, n] - m) for n in ns]
        out.append(np.logaddexp(0.0, np.logaddexp.reduce(zp) + np.logaddexp.reduce(zn)))
    return float(np.mean(out))

  np.testing.assert_allclose(np.asarray(grad), fd_grad(frozen, e), rtol=1e-3, atol=1e-5)
  assert float(aux["valid_fraction"]) == pytest.approx(10 / 12)


def test_circle_bf16_one_trace_no_nan_without_pairs():
  support.check_pair_bf16("circle", rng=None)
  support.check_apply_traces_once_per_shape("circle")
  support.check_pair_zero_loss_without_valid_anchor("circle", rng=None)


def oracle_gls(e, labels, pos_margin, neg_margin):
  """Hermans et al. eq. 5 per anchor over explicit pairs; one-sided anchors keep their term."""
  d = np.sqrt(np.maximum(2 - 2 * np_similarity(e), 0))
  out = []
  for a in range(len(labels)):
    ps = [p for p in range(len(labels)) if p != a and labels[p] == labels[a]]
    ns = negatives_of(labels, a)
    total = (np.logaddexp.reduce([d[a, p] - pos_margin for p in ps]) if ps else 0.0) + \
        (np.logaddexp.reduce([neg_margin - d[a, n] for n in ns]) if ns else 0.0)
    out.append(max(total, 0.0) if ps or ns else 0.0)
  return float(np.mean(out))


@pytest.mark.parametrize("pos_margin,neg_margin", [(0.0, 1.0), (0.3, 0.6), (-200.0, 200.0)])
def test_generalized_lifted_structure_matches_oracle(pos_margin, neg_margin):
  e = batch(9, d=4, normalize=False)
  loss, _, grad = support.run("generalized_lifted_structure", e, LABELS, rng=None,
                              pos_margin=pos_margin, neg_margin=neg_margin)
  f = lambda x: oracle_gls(x, LABELS, pos_margin, neg_margin)
  np.testing.assert_allclose(float(loss), f(e), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), fd_grad(f, e), rtol=1e-3, atol=1e-5)
  support.check_pair_bf16("generalized_lifted_structure", rng=None)
  support.check_apply_traces_once_per_shape("generalized_lifted_structure")


def oracle_ipv(e, labels, pos_eps, neg_eps):
  """Yu & Tao eq. 9 over the explicit ordered pairs: the means over all positive / negative
  pairs, then the squared hinges around them."""
  s = np_similarity(e)
  b = len(labels)
  pos = [s[i, j] for i in range(b) for j in range(b) if i != j and labels[i] == labels[j]]
  neg = [s[i, j] for i in range(b) for j in range(b) if labels[i] != labels[j]]
  lp = np.mean([max((1 - pos_eps) * np.mean(pos) - v, 0) ** 2 for v in pos]) if pos else 0.0
  ln = np.mean([max(v - (1 + neg_eps) * np.mean(neg), 0) ** 2 for v in neg]) if neg else 0.0
  return float(lp + ln)


@pytest.mark.parametrize("pos_eps,neg_eps", [(0.01, 0.01), (0.2, 0.0)])
def test_intra_pair_variance_matches_oracle(pos_eps, neg_eps):
  """Loss and gradient, the gradient through the means included (not detached, as PML)."""
  e = batch(11, d=4, normalize=False)
  loss, aux, grad = support.run("intra_pair_variance", e, LABELS, rng=None, pos_eps=pos_eps,
                                neg_eps=neg_eps)
  f = lambda x: oracle_ipv(x, LABELS, pos_eps, neg_eps)
  np.testing.assert_allclose(float(loss), f(e), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), fd_grad(f, e), rtol=1e-3, atol=1e-6)
  assert 0.0 < float(aux["active_fraction"]) < 1.0


def test_intra_pair_variance_is_zero_on_equal_similarities_and_one_sided_without_pairs():
  # All positives at one similarity and all negatives at another: no spread, no loss.
  labels = np.repeat(np.arange(4), 3).astype(np.int32)
  e = np.eye(4, dtype=np.float32)[labels]
  assert float(support.run("intra_pair_variance", e, labels, rng=None)[0]) == 0.0
  support.check_pair_bf16("intra_pair_variance", rng=None)
  support.check_apply_traces_once_per_shape("intra_pair_variance")
  for labels in (np.arange(B, dtype=np.int32), np.zeros(B, np.int32)):   # no positive; no negative
    e = batch(14, d=4, normalize=False)
    loss, _, grad = support.run("intra_pair_variance", e, labels, rng=None)
    np.testing.assert_allclose(float(loss), oracle_ipv(e, labels, 0.01, 0.01), rtol=1e-5)
    chex.assert_tree_all_finite(grad)
