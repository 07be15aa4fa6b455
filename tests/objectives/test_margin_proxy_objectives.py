"""Distance-weighted sampling, trimming, and the margin / proxy_nca / trimmed_triplet objectives
against numpy loop oracles over explicit pairs and triplets (values, gradients incl. d beta and
d proxies), sampling frequencies against the analytic weights, and the error messages."""

import functools
import math

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
NUM_CLASSES = 12   # one shape of beta / proxies for every test (shared compilations)
B, D = len(LABELS), 4
RNG_KEY = jax.random.key(7)
EPS_D = 1e-8   # released margin code: d = sqrt(d^2 + 1e-8)


def batch(seed=0, b=B, d=D):
  return random_batch(seed, b, d)


def compiled(name, **hparams):
  return objective_value_and_grad(name, (0, 1), **hparams)


def run(name, params, e, labels, rng=RNG_KEY, **hparams):
  (loss, aux), (gp, ge) = compiled(name, **hparams)(params, jnp.asarray(e), jnp.asarray(labels),
                                                    rng=rng)
  return loss, aux, gp, ge


# ----------------------------------------------------------------------------- numpy oracles


def np_cos(e):
  e = np.asarray(e, np.float64)
  e = e / np.linalg.norm(e, axis=1, keepdims=True)
  return e @ e.T


def np_d2(e):
  return np.maximum(2 - 2 * np_cos(e), 0.0)


def np_dw_probs(e, labels, *, cutoff=0.5, nonzero_loss_cutoff=1.4):
  """Pr(n | a) of distance-weighted sampling, by explicit loops (rows without weight: 0)."""
  dim = np.asarray(e).shape[1]
  dist = np.sqrt(np_d2(e))
  p = np.zeros((len(labels), len(labels)))
  for a in range(len(labels)):
    for n in range(len(labels)):
      if labels[n] != labels[a] and (dist[a, n] < nonzero_loss_cutoff
                                     or nonzero_loss_cutoff == 2.0):   # 2: no cut-off
        d = max(dist[a, n], cutoff)
        p[a, n] = d ** (2 - dim) * (1 - d * d / 4) ** (-(dim - 3) / 2)
    if p[a].sum() > 0:
      p[a] /= p[a].sum()
  return p


def fd_grad(f, x, eps=1e-6):
  x = np.asarray(x, np.float64)
  g = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    dx = np.zeros_like(x)
    dx[i] = eps
    g[i] = (f(x + dx) - f(x - dx)) / (2 * eps)
  return g


def positives_of(labels, a):
  return [j for j in range(len(labels)) if j != a and labels[j] == labels[a]]


def negatives_of(labels, a):
  return [j for j in range(len(labels)) if labels[j] != labels[a]]


# ----------------------------------------------------------------------------- distance weights


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
  s, probs = np_cos(e), np_dw_probs(e, LABELS)
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


# ----------------------------------------------------------------------------- trimming


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


# ----------------------------------------------------------------------------- margin oracle


def margin_params(hp, seed=0):
  if hp["beta"] == "fixed":
    return {}
  size = NUM_CLASSES if hp["beta"] == "class" else 1
  return {"beta": jnp.asarray(hp["beta0"] + 0.15 * np.random.default_rng(seed).normal(size=size),
                              jnp.float32)}


def library_margin_selection(e, labels, hp, rng):
  d2 = sim.squared_distance(sim.pairwise_similarity(jnp.asarray(e)))
  score = -d2 if hp["negative"] == "distance_weighted" else -losses.euclidean_distance(d2)
  pos, neg = sim.label_masks(jnp.asarray(labels))
  return jax.device_get(mining.select(
      score, pos, neg, positive=hp["positive"], negative=hp["negative"], margin=hp["alpha"],
      key=rng, dim=np.asarray(e).shape[1], cutoff=hp["cutoff"],
      nonzero_loss_cutoff=hp["nonzero_loss_cutoff"], fallback=hp["fallback"]))


def oracle_margin_terms(e, labels, hp, sel):
  """[(a, p, n)] by explicit loops; the library's random draws are checked, then used."""
  dist = np.sqrt(np_d2(e) + EPS_D)
  probs = np_dw_probs(e, labels, cutoff=hp["cutoff"], nonzero_loss_cutoff=hp["nonzero_loss_cutoff"])
  terms = []
  for a in range(len(labels)):
    ps, negs = positives_of(labels, a), negatives_of(labels, a)
    if not ps:
      assert not sel.valid[a].any()
      continue
    if hp["positive"] == "easy":
      ps = [min(ps, key=lambda j: dist[a, j])]
    elif hp["positive"] == "hard":
      ps = [max(ps, key=lambda j: dist[a, j])]
    elif hp["positive"] == "random":
      (p,) = np.flatnonzero(sel.pairs[a])
      assert p in ps
      ps = [p]
    for p in ps:
      neg = hp["negative"]
      if neg == "distance_weighted":
        if probs[a].sum() > 0:
          cand = [n for n in negs if probs[a, n] > 0]
        else:
          cand = {"negatives": negs, "batch": list(range(len(labels))), "drop": []}[hp["fallback"]]
      elif neg == "semihard":
        farther = [n for n in negs if dist[a, n] >= dist[a, p]]
        cand = [min(farther, key=lambda n: dist[a, n])] if farther else []
      elif neg == "semihard_random":   # label-noise paper eq. 28 in plain distances
        cand = [n for n in negs if dist[a, p] - dist[a, n] + hp["alpha"] > 0]
      elif neg == "semihard_band":     # Roth et al.: d_ap < d_an < d_ap + alpha, else any
        cand = [n for n in negs if dist[a, p] < dist[a, n] < dist[a, p] + hp["alpha"]] or negs
      elif neg == "hard":
        cand = [min(negs, key=lambda n: dist[a, n])]
      elif neg == "easy":
        cand = [max(negs, key=lambda n: dist[a, n])]
      else:
        cand = negs
      assert bool(sel.valid[a, p]) == bool(cand), (a, p)
      if not cand:
        continue
      n = int(sel.negative[a, p])
      assert n in cand, (a, p, n, cand)
      terms.append((a, p, n))
  return terms


def oracle_beta(hp, beta_vec, label):
  if hp["beta"] == "fixed":
    return hp["beta0"]
  return beta_vec[label if hp["beta"] == "class" else 0]


def oracle_margin_loss(e, beta_vec, labels, terms, hp):
  dist = np.sqrt(np_d2(e) + EPS_D)
  total, count = 0.0, 0
  for a, p, n in terms:
    b = oracle_beta(hp, beta_vec, labels[a])
    pos = max(dist[a, p] - b + hp["alpha"], 0.0)
    neg = max(b - dist[a, n] + hp["alpha"], 0.0)
    total += pos + neg + hp["nu"] * b
    count += int(pos > 0) + int(neg > 0) if hp["reduction"] == "nonzero" else 2
  return total / max(count, 1)


MARGIN_CASES = [
    dict(),                                                        # random + distance-weighted
    dict(positive="easy"),                                         # EPS + distance-weighted
    dict(positive="all", fallback="batch", nu=0.1),                # released sampler
    dict(positive="easy", negative="semihard", beta="global", reduction="mean"),
    dict(positive="all", negative="semihard_random", beta="fixed", beta0=1.4),  # label-noise
    dict(positive="hard", negative="random", alpha=0.05, fallback="drop"),
    dict(positive="easy", nonzero_loss_cutoff=2.0),                # EPS in Roth's code
    dict(positive="all", negative="semihard_band", beta="global"),
]


@pytest.mark.parametrize("kw", MARGIN_CASES, ids=lambda kw: "-".join(map(str, kw.values())))
def test_margin_matches_oracle_values_and_gradients(kw):
  e = batch(5)
  hp = objectives.make("margin", **kw).hparams
  params = margin_params(hp)
  loss, aux, gp, ge = run("margin", params, e, LABELS, **kw)
  terms = oracle_margin_terms(e, LABELS, hp, library_margin_selection(e, LABELS, hp, RNG_KEY))
  assert terms, "the test batch must give valid terms"
  beta_vec = np.asarray(params.get("beta", [hp["beta0"]]), np.float64)
  want = oracle_margin_loss(e, beta_vec, LABELS, terms, hp)
  assert loss.dtype == jnp.float32 and loss.shape == () and want > 0
  np.testing.assert_allclose(loss, want, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(
      ge, fd_grad(lambda x: oracle_margin_loss(x, beta_vec, LABELS, terms, hp), e),
      rtol=2e-3, atol=2e-4)
  if hp["beta"] != "fixed":
    g_beta = fd_grad(lambda bv: oracle_margin_loss(e, bv, LABELS, terms, hp), beta_vec)
    np.testing.assert_allclose(gp["beta"], g_beta, rtol=1e-3, atol=1e-5)
    assert np.abs(gp["beta"]).sum() > 0
  else:
    assert gp == {}
  dist = np.sqrt(np_d2(e) + EPS_D)
  s = np_cos(e)
  beta_of = lambda a: oracle_beta(hp, beta_vec, LABELS[a])
  active = [dist[a, p] - beta_of(a) + hp["alpha"] > 0 or beta_of(a) - dist[a, n] + hp["alpha"] > 0
            for a, p, n in terms]
  assert set(aux) == {"valid_fraction", "active_fraction", "mean_s_ap", "mean_s_an",
                      "mean_beta"}
  np.testing.assert_allclose(aux["valid_fraction"], len({t[0] for t in terms}) / B, rtol=1e-6)
  np.testing.assert_allclose(aux["mean_s_ap"], np.mean([s[a, p] for a, p, _ in terms]),
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(aux["mean_s_an"], np.mean([s[a, n] for a, _, n in terms]),
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(aux["mean_beta"], beta_vec.mean(), rtol=1e-6)
  np.testing.assert_allclose(aux["active_fraction"], np.mean(active), rtol=1e-6)


def test_margin_beta_init_shapes_and_per_class_gradient():
  rng = jax.random.key(0)
  cls = objectives.make("margin")
  p = cls.init(rng, num_classes=NUM_CLASSES, dim=D)
  assert p["beta"].shape == (NUM_CLASSES,) and p["beta"].dtype == jnp.float32
  np.testing.assert_array_equal(p["beta"], np.float32(1.2))
  assert objectives.make("margin", beta="global").init(rng, num_classes=3, dim=D)["beta"].shape \
      == (1,)
  assert objectives.make("margin", beta="fixed").init(rng, num_classes=3, dim=D) == {}
  # Clustered classes: positives inside beta - alpha (closed hinge), negatives drawn inside
  # beta + alpha (open): dL/dbeta_c > 0 for classes 0-3; singleton classes 4, 5 have no term.
  rng_np = np.random.default_rng(6)
  x = rng_np.normal(size=(NUM_CLASSES, D))[LABELS] + 0.2 * rng_np.normal(size=(B, D))
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  _, aux, gp, _ = run("margin", p, x, LABELS)
  g = np.asarray(gp["beta"])
  assert np.all(g[4:] == 0) and np.all(g[:4] > 0), g
  np.testing.assert_allclose(aux["valid_fraction"], 10 / 12, rtol=1e-6)


def test_margin_with_default_hyperparameters_and_hparams():
  assert objectives.make("margin").hparams == dict(
      positive="random", negative="distance_weighted", alpha=0.2, beta="class", beta0=1.2,
      nu=0.0, similarity="cosine", cutoff=0.5, nonzero_loss_cutoff=1.4, fallback="negatives",
      reduction="nonzero")
  assert objectives.make("proxy_nca").hparams == dict(temperature=1.0, denominator="negatives")
  assert objectives.make("trimmed_triplet").hparams == dict(
      positive="random", negative="semihard", margin=0.2, similarity="cosine",
      negative_reduction="mean", keep_fraction=0.9, distance="squared")
  assert {"margin", "proxy_nca", "trimmed_triplet"} <= set(objectives.names())


# ----------------------------------------------------------------------------- triplet + DW


def test_triplet_with_distance_weighted_negatives_matches_oracle():
  e = batch(8)
  kw = dict(positive="easy", negative="distance_weighted")
  loss, aux, _, ge = run("triplet", {}, e, LABELS, **kw)
  score = -sim.squared_distance(sim.pairwise_similarity(jnp.asarray(e)))
  pos, neg = sim.label_masks(jnp.asarray(LABELS))
  sel = jax.device_get(mining.select(score, pos, neg, key=RNG_KEY, dim=D, **kw))
  probs = np_dw_probs(e, LABELS)
  terms = []
  for a in range(B):
    ps = positives_of(LABELS, a)
    if not ps:
      continue
    p = max(ps, key=lambda j: np_cos(e)[a, j])
    n = int(sel.negative[a, p])
    assert sel.valid[a, p] and (probs[a, n] > 0 or (probs[a].sum() == 0 and LABELS[n] != LABELS[a]))
    terms.append((a, p, n))

  def f(x):
    d2 = np_d2(x)
    return np.mean([max(d2[a, p] - d2[a, n] + 0.2, 0) for a, p, n in terms])

  np.testing.assert_allclose(loss, f(e), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(ge, fd_grad(f, e), rtol=2e-3, atol=2e-4)
  np.testing.assert_allclose(aux["valid_fraction"], 10 / 12, rtol=1e-6)


# ----------------------------------------------------------------------------- proxy-NCA oracle


def oracle_proxy_loss(e, proxies, labels, hp):
  x = np.asarray(e, np.float64)
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  pr = np.asarray(proxies, np.float64)
  pr = pr / np.linalg.norm(pr, axis=1, keepdims=True)
  t = hp["temperature"]
  out = []
  for a, y in enumerate(labels):
    d2 = [np.sum((x[a] - pr[z]) ** 2) for z in range(len(pr))]
    zs = [z for z in range(len(pr)) if z != y] if hp["denominator"] == "negatives" \
        else range(len(pr))
    out.append(d2[y] / t + np.log(sum(np.exp(-d2[z] / t) for z in zs)))
  return float(np.mean(out))


@pytest.mark.parametrize("kw", [dict(), dict(denominator="all", temperature=0.5)],
                         ids=["paper", "softmax-T0.5"])
def test_proxy_nca_matches_oracle_values_and_gradients(kw):
  obj = objectives.make("proxy_nca", **kw)
  params = obj.init(jax.random.key(1), num_classes=NUM_CLASSES, dim=D)
  params = {"proxies": params["proxies"] * 1.7}   # un-normalised proxies: apply normalises
  e = batch(9) * 2.0                              # and embeddings
  loss, aux, gp, ge = run("proxy_nca", params, e, LABELS, rng=None, **kw)
  prox = np.asarray(params["proxies"], np.float64)
  want = oracle_proxy_loss(e, prox, LABELS, obj.hparams)
  np.testing.assert_allclose(loss, want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(ge, fd_grad(lambda x: oracle_proxy_loss(x, prox, LABELS,
                                                                     obj.hparams), e),
                             rtol=2e-3, atol=2e-4)
  g_prox = fd_grad(lambda pr: oracle_proxy_loss(e, pr, LABELS, obj.hparams), prox)
  np.testing.assert_allclose(gp["proxies"], g_prox, rtol=2e-3, atol=2e-4)
  assert np.abs(gp["proxies"]).sum() > 0
  s = np.asarray(e, np.float64) / np.linalg.norm(e, axis=1, keepdims=True) @ (
      prox / np.linalg.norm(prox, axis=1, keepdims=True)).T
  np.testing.assert_allclose(aux["valid_fraction"], 1.0)
  np.testing.assert_allclose(aux["mean_s_ap"], np.mean(s[np.arange(B), LABELS]), rtol=1e-4,
                             atol=1e-6)
  other = [np.mean(np.delete(s[a], LABELS[a])) for a in range(B)]
  np.testing.assert_allclose(aux["mean_s_an"], np.mean(other), rtol=1e-4, atol=1e-6)


def test_proxy_nca_init_shapes():
  p = objectives.make("proxy_nca").init(jax.random.key(0), num_classes=5, dim=7)
  assert p["proxies"].shape == (5, 7) and p["proxies"].dtype == jnp.float32
  np.testing.assert_allclose(np.linalg.norm(p["proxies"], axis=1), 1.0, rtol=1e-5)


# ----------------------------------------------------------------------------- trimmed triplet


def test_trimmed_triplet_back_propagates_only_the_easiest_terms():
  e = batch(10)
  kw = dict(positive="all", negative="hard", margin=0.8, keep_fraction=0.6)
  loss, aux, _, ge = run("trimmed_triplet", {}, e, LABELS, **kw)
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
  full = run("triplet", {}, e, LABELS, positive="all", negative="hard", margin=0.8)
  assert loss < full[0]                                 # the hardest terms are gone
  same = run("trimmed_triplet", {}, e, LABELS, positive="all", negative="hard", margin=0.8,
             keep_fraction=1.0)
  np.testing.assert_allclose(same[0], full[0], rtol=1e-6)
  np.testing.assert_allclose(same[3], full[3], rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("name,kw", [("margin", {}), ("margin", dict(positive="all")),
                                     ("margin", dict(positive="all", negative="semihard_band",
                                                     beta="global")),
                                     ("trimmed_triplet", {}),
                                     ("triplet", dict(negative="distance_weighted"))])
def test_batch_without_valid_anchor_gives_zero_loss_and_finite_gradient(name, kw):
  params = objectives.make(name, **kw).init(jax.random.key(0), num_classes=NUM_CLASSES, dim=D)
  singletons = np.arange(B, dtype=np.int32)
  loss, aux, gp, ge = run(name, params, batch(11), singletons, **kw)
  assert loss == 0.0 and aux["valid_fraction"] == 0.0
  np.testing.assert_array_equal(ge, 0.0)
  chex.assert_tree_all_finite((gp, aux))
  one_class = np.zeros(B, np.int32)                     # positives but no negative
  loss, aux, gp, ge = run(name, params, batch(11), one_class, **kw)
  assert loss == 0.0 and aux["valid_fraction"] == 0.0
  chex.assert_tree_all_finite((ge, gp))


def test_proxy_nca_with_singleton_classes_is_finite():
  obj = objectives.make("proxy_nca")
  params = obj.init(jax.random.key(0), num_classes=NUM_CLASSES, dim=D)
  loss, aux, gp, ge = run("proxy_nca", params, batch(12), np.arange(B, dtype=np.int32), rng=None)
  chex.assert_tree_all_finite((loss, aux, gp, ge))
  assert aux["valid_fraction"] == 1.0


@pytest.mark.parametrize("name,kw", [("margin", {}), ("proxy_nca", {}),
                                     ("trimmed_triplet", dict(positive="all"))])
def test_apply_traces_once_per_shape(name, kw):
  obj = objectives.make(name, **kw)
  params = obj.init(jax.random.key(0), num_classes=NUM_CLASSES, dim=D)
  fn = jax.jit(chex.assert_max_traces(obj.apply, n=1))
  for seed in range(3):
    loss, _ = fn(params, jnp.asarray(batch(seed)), jnp.asarray(np.roll(LABELS, seed)),
                 rng=jax.random.key(seed))
    assert np.isfinite(loss)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("call,match", [
    (lambda: objectives.make("trimmed_triplet", keep_fraction=0.0), r"keep_fraction.*\(0, 1\]"),
    (lambda: objectives.make("trimmed_triplet", keep_fraction=-0.5), r"keep_fraction.*\(0, 1\]"),
    (lambda: objectives.make("trimmed_triplet", keep_fraction=1.5), r"keep_fraction.*\(0, 1\]"),
    (lambda: mining.keep_easiest(jnp.ones(3), jnp.ones(3, bool), keep_fraction=0),
     r"keep_fraction.*\(0, 1\]"),
    (lambda: objectives.make("margin", beta="per_anchor"), "class, global, fixed"),
    (lambda: objectives.make("margin", negative="all"), "distance_weighted, semihard"),
    (lambda: objectives.make("margin", fallback="uniform"), "negatives, batch, drop"),
    (lambda: objectives.make("margin", cutoff=1.5), "0 < cutoff < nonzero_loss_cutoff <= 2"),
    (lambda: objectives.make("margin", nonzero_loss_cutoff=2.5),
     "0 < cutoff < nonzero_loss_cutoff <= 2"),
    (lambda: objectives.make("margin", beta="fixed", nu=0.1), "beta='fixed' use nu=0"),
    (lambda: objectives.make("margin", similarity="neg_sq_euclidean"), "similarity='cosine'"),
    (lambda: objectives.make("triplet", negative="distance_weighted",
                             similarity="neg_sq_euclidean"), "similarity='cosine'"),
    (lambda: objectives.make("margin", reduction="sum"), "nonzero, mean"),
    (lambda: objectives.make("margin", beta0=0), "beta0 must be a number > 0"),
    (lambda: objectives.make("proxy_nca", denominator="none"), "negatives, all"),
    (lambda: objectives.make("proxy_nca", temperature=0), "temperature must be a number > 0"),
    (lambda: objectives.make("proxy_nca").init(jax.random.key(0), num_classes=1, dim=D),
     "num_classes must be an int >= 2"),
    (lambda: mining.distance_weights(jnp.zeros((2, 2)), jnp.ones((2, 2), bool), dim=0),
     "embedding dimension dim"),
])
def test_bad_arguments_raise_clear_errors(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_out_of_range_labels_raise_eagerly_and_give_nan_under_jit():
  e, labels = jnp.asarray(batch(13)), jnp.asarray(LABELS)
  proxy = objectives.make("proxy_nca")
  params = proxy.init(jax.random.key(0), num_classes=4, dim=D)   # labels go up to 5
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\).*\[0, 5\]"):
    proxy.apply(params, e, labels)
  with pytest.raises(ValueError, match="labels must lie in"):
    jax.grad(lambda p: proxy.apply(p, e, labels)[0])(params)
  assert np.isnan(jax.jit(proxy.apply)(params, e, labels)[0])
  assert np.isfinite(jax.jit(proxy.apply)(params, e, labels % 4)[0])
  marg = objectives.make("margin", negative="hard")
  mparams = marg.init(jax.random.key(0), num_classes=4, dim=D)
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
    marg.apply(mparams, e, labels, rng=RNG_KEY)
  bad = jnp.asarray(np.where(LABELS == 0, 9, LABELS % 4))     # class 0 (3 anchors) -> 9
  assert np.isnan(jax.jit(marg.apply)(mparams, e, bad, rng=RNG_KEY)[0])
  with pytest.raises(ValueError, match=r"needs params\['beta'\]"):
    marg.apply({}, e, labels % 4, rng=RNG_KEY)
  with pytest.raises(ValueError, match=r"shape \[1\] for beta='global'"):
    objectives.make("margin", beta="global").apply(mparams, e, labels % 4, rng=RNG_KEY)
  with pytest.raises(ValueError, match="pass rng"):
    objectives.make("margin").apply(mparams, e, labels % 4)
