"""The margin objective (dml_jax/objectives/_triplet.py, ``margin``): values, gradients w.r.t.
the embeddings and d beta against a numpy loop oracle over explicit triplets (distance-weighted
and the other samplers), beta's init and per-class gradient, and the error messages."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objective_support as support
from objective_support import B, D, NUM_CLASSES
from oracles import (LABELS, fd_grad, negative_candidates, negatives_of, np_d2, np_dw_probs,
                     np_similarity, positives_of, select_positives)
from oracles import random_batch as batch
from dml_jax import losses
from dml_jax import mining
from dml_jax import objectives
from dml_jax import similarity as sim

RNG_KEY = jax.random.key(7)
EPS_D = 1e-8   # released margin code: d = sqrt(d^2 + 1e-8)
run = functools.partial(support.run_with_params, rng=RNG_KEY)


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
    if hp["positive"] == "random":
      (p,) = np.flatnonzero(sel.pairs[a])
      assert p in ps
      ps = [p]
    else:
      ps = select_positives(-dist, labels, a, hp["positive"])
    for p in ps:
      if hp["negative"] == "distance_weighted":
        if probs[a].sum() > 0:
          cand = [n for n in negs if probs[a, n] > 0]
        else:
          cand = {"negatives": negs, "batch": list(range(len(labels))), "drop": []}[hp["fallback"]]
      else:   # in plain distances (scores -d)
        cand = negative_candidates(-dist, labels, a, p, hp["negative"], hp["alpha"])
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
  s = np_similarity(e)
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


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize("kw", [{}, dict(positive="all"),
                                dict(positive="all", negative="semihard_band", beta="global")],
                         ids=["kw0", "kw1", "kw2"])
def test_batch_without_valid_anchor_gives_zero_loss_and_finite_gradient(kw):
  support.check_zero_loss_without_valid_anchor_with_params("margin", rng=RNG_KEY, **kw)


def test_apply_traces_once_per_shape():
  support.check_apply_traces_once_per_shape("margin")


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("call,match", [
    (lambda: objectives.make("margin", beta="per_anchor"), "class, global, fixed"),
    (lambda: objectives.make("margin", negative="all"), "distance_weighted, semihard"),
    (lambda: objectives.make("margin", fallback="uniform"), "negatives, batch, drop"),
    (lambda: objectives.make("margin", cutoff=1.5), "0 < cutoff < nonzero_loss_cutoff <= 2"),
    (lambda: objectives.make("margin", nonzero_loss_cutoff=2.5),
     "0 < cutoff < nonzero_loss_cutoff <= 2"),
    (lambda: objectives.make("margin", beta="fixed", nu=0.1), "beta='fixed' use nu=0"),
    (lambda: objectives.make("margin", similarity="neg_sq_euclidean"), "similarity='cosine'"),
    (lambda: objectives.make("margin", reduction="sum"), "nonzero, mean"),
    (lambda: objectives.make("margin", beta0=0), "beta0 must be a number > 0"),
])
def test_bad_arguments_raise_clear_errors(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_out_of_range_labels_raise_eagerly_and_give_nan_under_jit():
  e, labels = jnp.asarray(batch(13)), jnp.asarray(LABELS)
  marg = objectives.make("margin", negative="hard")
  mparams = marg.init(jax.random.key(0), num_classes=4, dim=D)   # labels go up to 5
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
