"""Pair-based objectives (contrastive, binomial, multi-similarity, lifted structure, DRO top-K /
top-K-PN / KL / KL grouped): every objective against a numpy loop oracle over explicit pairs
(loss, gradient w.r.t. the embeddings, aux), the selections and pair-loss forms against loops,
and the properties (no valid anchor, bf16, traces, vmap, permutation, bad input)."""

import functools
import json
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dml_test_support import objective_value_and_grad, random_batch
from dml_jax import losses
from dml_jax import mining
from dml_jax import objectives
from dml_jax import similarity as sim

# Two classes of 3, two of 2 and two singletons (anchors 10 and 11 have no positive).
LABELS = np.array([0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 5], np.int32)
B, D = len(LABELS), 4
NUM_PAIRS = B * (B - 1)
RNG_KEY = jax.random.key(7)


def batch(seed=0, b=B, d=D):
  return random_batch(seed, b, d)


def compiled(name, **hparams):
  return objective_value_and_grad(name, 1, **hparams)


def run(name, e, labels, rng=RNG_KEY, **hparams):
  (loss, aux), grad = compiled(name, **hparams)({}, jnp.asarray(e), jnp.asarray(labels),
                                                rng=rng)
  return loss, aux, grad


# ----------------------------------------------------------------------------- numpy oracle


def np_cosine(e):
  e = np.asarray(e, np.float64)
  e = e / np.linalg.norm(e, axis=1, keepdims=True)
  return e @ e.T


def pairs_of(labels):
  """[(i, j, is_positive)] over the ordered pairs i != j, by explicit loops."""
  return [(i, j, labels[i] == labels[j]) for i in range(len(labels))
          for j in range(len(labels)) if i != j]


def softplus(x):
  return np.logaddexp(0.0, x)


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def pair_loss_and_weight(hp, kind, s, is_pos):
  """One pair's loss and |dl/dS| (closed form), float64."""
  if kind in ("contrastive", "margin"):
    if kind == "contrastive":
      pm, nm = hp["pos_margin"], hp["neg_margin"]
    else:
      pm, nm = hp["base"] + hp["margin"], hp["base"] - hp["margin"]
    v = max(pm - s, 0.0) if is_pos else max(s - nm, 0.0)
    return v, float(v > 0)
  a, b, lam = hp["alpha"], hp["beta"], hp["base"]
  if is_pos:
    return 2 / b * softplus(-b * (s - lam)), 2 * sigmoid(-b * (s - lam))
  return 2 / a * softplus(a * (s - lam)), 2 * sigmoid(a * (s - lam))


def pair_kind(name, hp):
  if name == "contrastive":
    return "contrastive"
  if name == "binomial":
    return "binomial"
  return hp["pair_loss"]


def ms_sets(s, labels, i, hp):
  """Multi-similarity mining of anchor i, by explicit loops (released-code rules)."""
  ps = [j for j in range(len(labels)) if j != i and labels[j] == labels[i]]
  if hp["skip_duplicate_positives"]:
    ps = [j for j in ps if s[i, j] < 1 - 1e-5]
  ns = [j for j in range(len(labels)) if labels[j] != labels[i]]
  eps = hp["epsilon"]
  cand = [max(ps, key=lambda j: s[i, j])] if hp["positive"] == "easy" and ps else ps
  if hp["positive"] == "ms":
    pk = [j for j in ps if ns and s[i, j] - eps < max(s[i, n] for n in ns)]
  else:
    pk = cand
  ref = cand if hp.get("negative_reference", "hardest") == "selected" else ps
  if hp["negative"] == "ms":
    nk = [j for j in ns if ref and s[i, j] + eps > min(s[i, p] for p in ref)]
  else:
    nk = ns
  return pk, nk


def ms_term(s, i, pk, nk, hp):
  a, b, lam = hp["alpha"], hp["beta"], hp["base"]
  pos = np.log1p(sum(np.exp(-a * (s[i, p] - lam)) for p in pk)) / a
  neg = np.log1p(sum(np.exp(b * (s[i, n] - lam)) for n in nk)) / b
  return pos + neg


def ms_weights(s, i, pk, nk, hp):
  """DRO paper eq. 27: |dL_i/dS_ij| of the MS loss."""
  a, b, lam = hp["alpha"], hp["beta"], hp["base"]
  w = {}
  for j in pk:
    w[j] = 1 / (np.exp(a * (s[i, j] - lam)) + sum(np.exp(a * (s[i, j] - s[i, k])) for k in pk))
  for j in nk:
    w[j] = 1 / (np.exp(b * (lam - s[i, j])) + sum(np.exp(b * (s[i, k] - s[i, j])) for k in nk))
  return w


def ls_bracket(s, i, ps, ns, hp):
  lam = hp["base"]
  return (np.log(sum(np.exp(lam - s[i, p]) for p in ps))
          + np.log(sum(np.exp(s[i, n] - lam) for n in ns)) + hp["margin"])


def plan(name, hp, e, labels, rng=RNG_KEY):
  """The oracle of objective ``name`` at ``e``: ``(f, entering, active)``.

  ``f(e')`` is the loss at ``e'`` with every selection and weight frozen at ``e`` (they are
  under stop-gradient in the library), ``entering`` the pairs that enter the loss and
  ``active`` those whose own gradient weight exceeds 1e-3.
  """
  s0 = np_cosine(e)
  n = len(labels)
  pairs = pairs_of(labels)
  kind = None if name in ("multi_similarity", "lifted_structure") else pair_kind(name, hp)
  pl = lambda s, i, j, p: pair_loss_and_weight(hp, kind, s[i, j], p)
  active_pair = lambda i, j, p: pl(s0, i, j, p)[1] > 1e-3

  if name in ("contrastive", "binomial"):
    def f(e1):
      s = np_cosine(e1)
      vals = [(pl(s, i, j, p)[0], p) for i, j, p in pairs]
      if hp["reduction"] == "mean":
        return np.mean([v for v, _ in vals]) if vals else 0.0
      pos = [v for v, p in vals if p]
      neg = [v for v, p in vals if not p]
      return (np.mean(pos) if pos else 0.0) + (np.mean(neg) if neg else 0.0)
    entering = [(i, j) for i, j, _ in pairs]
    active = {(i, j) for i, j, p in pairs if active_pair(i, j, p)}
    return f, entering, active

  if name == "multi_similarity":
    sets = {}
    for i in range(n):
      pk, nk = ms_sets(s0, labels, i, hp)
      if pk and nk:
        sets[i] = (pk, nk)
    f = lambda e1: sum(ms_term(np_cosine(e1), i, pk, nk, hp) for i, (pk, nk) in sets.items()) / n
    entering = [(i, j) for i, (pk, nk) in sets.items() for j in pk + nk]
    active = {(i, j) for i, (pk, nk) in sets.items()
              for j, w in ms_weights(s0, i, pk, nk, hp).items() if w > 1e-3}
    return f, entering, active

  if name == "lifted_structure":
    sets = {}
    for i in range(n):
      ps = [j for j in range(n) if j != i and labels[j] == labels[i]]
      ns = [j for j in range(n) if labels[j] != labels[i]]
      if ps and ns:
        sets[i] = (ps, ns)
    f = lambda e1: sum(max(ls_bracket(np_cosine(e1), i, ps, ns, hp), 0.0)
                       for i, (ps, ns) in sets.items()) / n
    entering = [(i, j) for i, (ps, ns) in sets.items() for j in ps + ns]
    active = set()
    for i, (ps, ns) in sets.items():
      if ls_bracket(s0, i, ps, ns, hp) > 0:      # eq. 6 weights while the hinge is open
        zp = sum(np.exp(-s0[i, k]) for k in ps)
        zn = sum(np.exp(s0[i, k]) for k in ns)
        active |= {(i, j) for j in ps if np.exp(-s0[i, j]) / zp > 1e-3}
        active |= {(i, j) for j in ns if np.exp(s0[i, j]) / zn > 1e-3}
    return f, entering, active

  loss0 = {(i, j): pl(s0, i, j, p)[0] for i, j, p in pairs}
  is_pos = {(i, j): p for i, j, p in pairs}

  def weighted(weights, norm):
    def f(e1):
      s = np_cosine(e1)
      return sum(w * pl(s, i, j, is_pos[i, j])[0] for (i, j), w in weights.items()) / norm
    entering = [ij for ij, w in weights.items() if w > 0]
    return f, entering, {ij for ij in entering if active_pair(*ij, is_pos[ij])}

  def top(cands, k):   # largest loss first, ties by the lower flat index (lax.top_k)
    return sorted(cands, key=lambda ij: (-loss0[ij], ij[0] * n + ij[1]))[:k]

  if name == "dro_topk":
    k = min(hp["k"], len(pairs))
    return weighted({ij: 1.0 for ij in top(list(loss0), k)}, k)
  if name == "dro_topk_pn":
    kp, kn = hp["k"] // 2, hp["k"] - hp["k"] // 2
    sel = (top([ij for ij in loss0 if is_pos[ij]], kp)
           + top([ij for ij in loss0 if not is_pos[ij]], kn))
    return weighted({ij: 1.0 for ij in sel}, max(len(sel), 1))
  if name == "dro_kl":
    cand = [ij for ij in loss0 if loss0[ij] > 0 or not hp["remove_zero_loss"]]
    if hp["mode"] == "weight":
      z = np.array([loss0[ij] / hp["gamma"] for ij in cand])
      p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
      return weighted(dict(zip(cand, p)), 1.0)
    counts = library_kl_counts(e, labels, hp, rng)
    assert counts.sum() == hp["k"]
    assert all(counts[ij] == 0 for ij in np.ndindex(counts.shape) if ij not in cand)
    return weighted({ij: float(counts[ij]) for ij in cand}, hp["k"])
  if name == "dro_kl_grouped":
    weights = {}
    for i in range(n):
      ps = [j for j in range(n) if j != i and labels[j] == labels[i]]
      ns = [j for j in range(n) if labels[j] != labels[i]]
      if not (ps and ns):
        continue
      for group, gamma, c, positive in ((ps, hp["gamma_pos"], hp["c_pos"], True),
                                        (ns, hp["gamma_neg"], hp["c_neg"], False)):
        group = [j for j in group if loss0[i, j] > 0 or not hp["remove_zero_loss"]]
        z = [loss0[i, j] / gamma for j in group]
        if hp["pseudo_pairs"]:
          z0 = 0.0 if c is None else pair_loss_and_weight(hp, kind, c, positive)[0] / gamma
          z.append(z0)
        if not group:
          continue
        z = np.array(z)
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        weights.update({(i, j): p[t] for t, j in enumerate(group)})
    return weighted(weights, n)
  raise AssertionError(name)


@functools.partial(jax.jit, static_argnames=("hp",))
def _kl_counts(e, labels, rng, hp):
  hp = dict(hp)
  s = sim.pairwise_similarity(e)
  pos, neg = sim.label_masks(labels)
  if hp["pair_loss"] == "margin":
    values = losses.dro_margin(s, pos, margin=hp["margin"], base=hp["base"])
  else:
    values = losses.binomial(s, pos, alpha=hp["alpha"], beta=hp["beta"], base=hp["base"])
  cand = (pos | neg) & ((values > 0) if hp["remove_zero_loss"] else True)
  return mining.kl_sample_pairs(rng, values, cand, gamma=hp["gamma"], num=hp["k"])


def library_kl_counts(e, labels, hp, rng):
  """The draw counts ``apply`` makes with ``rng`` (same pair losses, same key)."""
  return np.asarray(_kl_counts(jnp.asarray(e), jnp.asarray(labels), rng,
                               tuple(sorted(hp.items()))))


def fd_grad(f, e, eps=1e-6):
  e = np.asarray(e, np.float64)
  g = np.zeros_like(e)
  for i in np.ndindex(e.shape):
    d = np.zeros_like(e)
    d[i] = eps
    g[i] = (f(e + d) - f(e - d)) / (2 * eps)
  return g


def check_against_oracle(name, e, labels, **kw):
  hp = objectives.make(name, **kw).hparams
  loss, aux, grad = run(name, e, labels, **kw)
  f, entering, active = plan(name, hp, e, labels)
  assert entering, "the test batch must give pairs that enter the loss"
  assert loss.dtype == jnp.float32 and loss.shape == ()
  np.testing.assert_allclose(loss, f(e), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(grad, fd_grad(f, e), rtol=2e-3, atol=2e-5)
  s = np_cosine(e)
  want = {
      "valid_fraction": len({i for i, _ in entering}) / len(labels),
      "active_fraction": len(active) / len(entering),
      "mean_s_ap": np.mean([s[ij] for ij in entering if labels[ij[0]] == labels[ij[1]]] or [0]),
      "mean_s_an": np.mean([s[ij] for ij in entering if labels[ij[0]] != labels[ij[1]]] or [0]),
  }
  assert set(aux) == set(want)
  for k, v in want.items():
    assert aux[k].dtype == jnp.float32 and aux[k].shape == ()
    np.testing.assert_allclose(aux[k], v, rtol=1e-4, atol=1e-6, err_msg=k)
  return loss, entering, active


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
    ("dro_topk", dict(k=40)),
    ("dro_topk", dict(k=40, pair_loss="binomial")),
    ("dro_topk_pn", dict(k=30)),
    ("dro_topk_pn", dict(k=40, pair_loss="binomial")),              # K/2 > 16 positive pairs
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
  loss, entering, active = check_against_oracle(name, batch(0), LABELS, **kw)
  assert loss > 0
  assert 0 < len(active) <= len(entering)


def test_oracle_cases_exercise_the_selections():
  """The oracle batch is not degenerate: each rule keeps some pairs and drops others."""
  e = batch(0)
  s = np_cosine(e)
  hp = objectives.make("multi_similarity").hparams
  kept = [ms_sets(s, LABELS, i, hp) for i in range(B)]
  n_pos = sum(len(pk) for pk, _ in kept)
  n_neg = sum(len(nk) for _, nk in kept)
  assert 0 < n_pos < 16 and 0 < n_neg < NUM_PAIRS - 16
  # Anchor 6 has a positive and negatives but keeps neither: it is dropped (contributes 0).
  assert kept[6] == ([], []) and LABELS[7] == LABELS[6]
  hp = objectives.make("lifted_structure", margin=-2.6).hparams
  brackets = [ls_bracket(s, i, [j for j in range(B) if j != i and LABELS[j] == LABELS[i]],
                         [j for j in range(B) if LABELS[j] != LABELS[i]], hp) for i in range(10)]
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


def test_kl_sample_draws_follow_the_key():
  e = batch(2)
  a = run("dro_kl", e, LABELS, rng=jax.random.key(1), k=50)[0]
  b = run("dro_kl", e, LABELS, rng=jax.random.key(1), k=50)[0]
  values = {float(run("dro_kl", e, LABELS, rng=jax.random.key(i), k=50)[0]) for i in range(5)}
  assert a == b and len(values) > 1


# ----------------------------------------------------------------------------- selections


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


def test_multi_similarity_pairs_match_loops():
  e = batch(5)
  s = np_cosine(e)
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
  s = jnp.asarray(np_cosine(batch(13)), jnp.float32)
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  a = losses.lifted_structure(s, pos, neg, base=0.5)
  b = losses.lifted_structure(s, pos, neg, base=-0.3)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  c = losses.lifted_structure(s, pos, neg, base=0.5, margin=0.2)
  np.testing.assert_allclose(c[:10], a[:10] + 0.2, rtol=1e-5)


# ----------------------------------------------------------------------------- properties


ALL = ["contrastive", "binomial", "multi_similarity", "lifted_structure", "dro_topk",
       "dro_topk_pn", "dro_kl", "dro_kl_grouped"]
ANCHOR_BASED = ["multi_similarity", "lifted_structure", "dro_kl_grouped"]


@pytest.mark.parametrize("name", ANCHOR_BASED)
def test_batch_without_valid_anchor_gives_zero_loss_and_finite_gradient(name):
  for labels in (np.arange(B, dtype=np.int32), np.zeros(B, np.int32)):   # singletons; one class
    loss, aux, grad = run(name, batch(14), labels)
    assert loss == 0.0
    chex.assert_tree_all_finite(grad)
    np.testing.assert_array_equal(grad, 0.0)
    for v in aux.values():
      assert v == 0.0


def test_single_example_batch_has_no_pair():
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


def test_dro_kl_without_nonzero_loss_pair_gives_zero():
  e = np.repeat(np.eye(3, D, dtype=np.float32), 4, axis=0)   # positives S = 1, negatives S = 0
  labels = np.repeat(np.arange(3, dtype=np.int32), 4)
  for kw in (dict(mode="weight"), dict(mode="sample", k=50), {}):
    name = "dro_kl_grouped" if not kw else "dro_kl"
    loss, aux, grad = run(name, e, labels, **kw)
    assert loss == 0.0 and aux["valid_fraction"] == 0.0
    chex.assert_tree_all_finite(grad)
    np.testing.assert_array_equal(grad, 0.0)


@pytest.mark.parametrize("name,kw", [("contrastive", {}), ("dro_topk_pn", dict(k=40))])
def test_singleton_classes_take_part_as_negatives(name, kw):
  loss, aux, grad = run(name, batch(16), LABELS, **kw)
  chex.assert_tree_all_finite((loss, aux, grad))
  assert np.abs(grad[10]).sum() > 0 and np.abs(grad[11]).sum() > 0
  loss, aux, grad = run(name, batch(16), np.arange(B, dtype=np.int32), **kw)
  assert loss > 0 and aux["mean_s_ap"] == 0.0          # negatives only


@pytest.mark.parametrize("name", ["multi_similarity", "dro_kl_grouped"])
def test_bf16_embeddings_give_finite_float32_loss(name):
  e = batch(17)
  e[3] = e[0] * 0.999 + 0.001                 # a negative almost identical to anchor 0
  e = jnp.asarray(e, jnp.bfloat16)
  loss, aux, grad = run(name, e, LABELS)      # MS with beta = 50: e^{50 (S - 0.5)} ~ e^25
  assert loss.dtype == jnp.float32 and grad.dtype == jnp.bfloat16
  chex.assert_tree_all_finite((loss, aux, grad.astype(jnp.float32)))
  assert loss > 0
  want = run(name, np.asarray(e.astype(jnp.float32)), LABELS)[0]
  np.testing.assert_allclose(loss, want, rtol=1e-5)


@pytest.mark.parametrize("name,kw", [("dro_topk", dict(k=30)), ("dro_kl", dict(k=30))])
def test_apply_traces_once_per_shape(name, kw):
  obj = objectives.make(name, **kw)
  fn = jax.jit(chex.assert_max_traces(obj.apply, n=1))
  for seed in range(3):
    loss, _ = fn({}, jnp.asarray(batch(seed)), jnp.asarray(np.roll(LABELS, seed)),
                 rng=jax.random.key(seed))
    assert np.isfinite(loss)


@pytest.mark.parametrize("name,kw", [("multi_similarity", dict(positive="easy")),
                                     ("dro_topk_pn", dict(k=30)), ("dro_kl", dict(k=50))])
def test_vmap_over_a_leading_axis(name, kw):
  obj = objectives.make(name, **kw)
  e = jnp.stack([jnp.asarray(batch(20 + t)) for t in range(3)])
  labels = jnp.stack([jnp.asarray(np.roll(LABELS, t)) for t in range(3)])
  got, aux = jax.jit(jax.vmap(lambda x, y: obj.apply({}, x, y, rng=RNG_KEY)))(e, labels)
  chex.assert_shape(got, (3,))
  for t in range(3):
    (want, want_aux), _ = compiled(name, **kw)({}, e[t], labels[t], rng=RNG_KEY)
    np.testing.assert_allclose(got[t], want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(aux["active_fraction"][t], want_aux["active_fraction"],
                               rtol=1e-5)


@pytest.mark.parametrize("name,kw", [
    ("contrastive", {}), ("binomial", {}), ("multi_similarity", {}), ("lifted_structure", {}),
    ("dro_topk", dict(k=40)), ("dro_topk_pn", dict(k=30)), ("dro_kl", dict(mode="weight")),
    ("dro_kl_grouped", dict(pseudo_pairs=True))])
def test_loss_and_gradient_are_invariant_to_batch_permutation(name, kw):
  e = batch(21)
  perm = np.random.default_rng(1).permutation(B)
  loss, _, grad = run(name, e, LABELS, **kw)
  loss_p, _, grad_p = run(name, e[perm], LABELS[perm], **kw)
  np.testing.assert_allclose(loss_p, loss, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(grad_p, grad[perm], rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- the API


def test_hparams_defaults_and_init():
  assert set(ALL) <= set(objectives.names())
  assert objectives.make("multi_similarity").hparams == dict(
      alpha=2.0, beta=50.0, base=0.5, epsilon=0.1, positive="ms", negative="ms",
      negative_reference="hardest", skip_duplicate_positives=False, similarity="cosine")
  assert objectives.make("dro_kl").hparams == dict(
      gamma=0.1, mode="sample", k=160, remove_zero_loss=True, pair_loss="margin", margin=0.2,
      base=0.5, alpha=40.0, beta=2.0, similarity="cosine")
  grouped = objectives.make("dro_kl_grouped").hparams
  assert grouped["gamma_pos"] == grouped["gamma_neg"] == 0.01 and grouped["c_pos"] is None
  assert objectives.make("binomial").hparams["alpha"] == 40.0
  assert objectives.make("contrastive").hparams["reduction"] == "mean"
  for name in ALL:
    obj = objectives.make(name)
    json.dumps(obj.hparams)
    assert obj.init(jax.random.key(0), num_classes=5, dim=D) == {}


def test_k_above_the_number_of_pairs_is_clamped_with_a_warning():
  e, labels = batch(22), LABELS
  with pytest.warns(UserWarning, match=f"k=500 exceeds the {NUM_PAIRS} ordered pairs"):
    big = run("dro_topk", e, labels, k=500)[0]
  hp = objectives.make("dro_topk", k=NUM_PAIRS).hparams
  f, entering, _ = plan("dro_topk", hp, e, labels)
  assert len(entering) == NUM_PAIRS
  np.testing.assert_allclose(big, f(e), rtol=1e-4)         # the mean over all 132 pairs
  with pytest.warns(UserWarning, match="k//2=400 exceeds"):   # both halves are clamped
    run("dro_topk_pn", e, labels, k=800)
  with warnings.catch_warnings():
    warnings.simplefilter("error")          # sampling draws with replacement: no clamp
    objectives.make("dro_kl", k=500).apply({}, jnp.asarray(e), jnp.asarray(labels),
                                           rng=RNG_KEY)


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
    (lambda: objectives.make("multi_similarity", positive="hard"), "ms, all, easy"),
    (lambda: objectives.make("multi_similarity", negative="easy"), "ms, all"),
    (lambda: objectives.make("multi_similarity", negative_reference="easy"), "hardest, selected"),
    (lambda: mining.multi_similarity_pairs(S_RAND, MASK_RAND, ~MASK_RAND,
                                           negative_reference="x"), "hardest, selected"),
    (lambda: objectives.make("multi_similarity", epsilon=-0.1), "epsilon must be a number >= 0"),
    (lambda: objectives.make("multi_similarity", beta=0), "beta must be a number > 0"),
    (lambda: objectives.make("multi_similarity", similarity="dot",
                             skip_duplicate_positives=True), "similarity='cosine'"),
    (lambda: objectives.make("contrastive", reduction="sum"), "mean, balanced"),
    (lambda: objectives.make("contrastive", pos_margin=float("nan")), "finite number"),
    (lambda: objectives.make("binomial", alpha=-2.0), "alpha must be a number > 0"),
    (lambda: objectives.make("lifted_structure", temperature=1.0), "valid: base, margin"),
    (lambda: objectives.make("dro_kl", remove_zero_loss=1), "True or False"),
    (lambda: mining.topk_pairs(S_RAND, MASK_RAND, k=S_RAND.size + 1), "k must be an int in"),
    (lambda: mining.kl_weights(S_RAND, MASK_RAND, gamma=0.0), "gamma must be a number > 0"),
    (lambda: mining.kl_sample_pairs(RNG_KEY, S_RAND, MASK_RAND, gamma=1.0, num=0), "num must"),
    (lambda: mining.multi_similarity_pairs(S_RAND, MASK_RAND, ~MASK_RAND, positive="x"), "ms"),
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
