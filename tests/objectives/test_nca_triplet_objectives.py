"""Objectives: make/apply API, and every selection mode against a numpy oracle over explicit
triplets (loss value, gradient w.r.t. the embeddings, and the aux diagnostics)."""

import dataclasses
import functools
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dml_test_support import objective_value_and_grad, random_batch
from dml_jax import losses
from dml_jax import mining
from dml_jax import objectives
from dml_jax.objectives import _common as objectives_common
from dml_jax import similarity as sim

# Two classes of 3, two of 2 and two singletons (anchors 10 and 11 have no positive).
LABELS = np.array([0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 5], np.int32)
B, D = len(LABELS), 4
RNG_KEY = jax.random.key(42)


def batch(seed=0, b=B, d=D, normalize=True):
  return random_batch(seed, b, d, normalize)


def compiled(name, **hparams):
  return objective_value_and_grad(name, 1, **hparams)


def run(name, e, labels, rng=RNG_KEY, **hparams):
  (loss, aux), grad = compiled(name, **hparams)({}, jnp.asarray(e), jnp.asarray(labels),
                                                rng=rng)
  return loss, aux, grad


# ----------------------------------------------------------------------------- numpy oracle


def np_similarity(e, kind):
  e = np.asarray(e, np.float64)
  if kind == "cosine":
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
  if kind == "neg_sq_euclidean":
    return -np.sum((e[:, None] - e[None]) ** 2, axis=-1)
  return e @ e.T


def np_sq_distance(s, kind):
  return np.maximum(2 - 2 * s, 0.0) if kind == "cosine" else -s


def np_triplet_distance(s, hp):
  """The distance the triplet hinge uses: d^2, or d for distance='euclidean'."""
  d2 = np_sq_distance(s, hp.get("similarity", "cosine"))
  return np.sqrt(np.maximum(d2, 1e-12)) if hp.get("distance") == "euclidean" else d2


def positives_of(labels, a):
  return [j for j in range(len(labels)) if j != a and labels[j] == labels[a]]


def negatives_of(labels, a):
  return [j for j in range(len(labels)) if labels[j] != labels[a]]


def candidates(score, d2, labels, a, p, negative, margin, dist=None):
  """Admissible negatives of term (a, p), by explicit loops (one for deterministic modes).

  ``dist``: unsquared distances, for ``'semihard_band'`` (Roth et al.'s miner)."""
  negs = negatives_of(labels, a)
  if negative == "hard":
    return [max(negs, key=lambda n: score[a, n])]
  if negative == "easy":
    return [min(negs, key=lambda n: score[a, n])]
  if negative == "semihard":
    below = [n for n in negs if score[a, n] <= score[a, p]]
    return [max(below, key=lambda n: score[a, n])] if below else []
  if negative == "semihard_random":   # positive triplet loss (label-noise paper eq. 28)
    return [n for n in negs if d2[a, p] - d2[a, n] + margin > 0]
  if negative == "semihard_band":     # d_ap < d_an < d_ap + margin, else any negative
    return [n for n in negs if dist[a, p] < dist[a, n] < dist[a, p] + margin] or negs
  return negs   # random, all


def oracle_terms(e, labels, name, hp, sel=None):
  """[(a, p, [negatives])] for the objective; ``sel`` (the library's draw) for random modes.

  Deterministic modes are selected here independently; for random modes the drawn positive /
  negative is checked to be admissible and then used.
  """
  kind = hp.get("similarity", "cosine")
  s = np_similarity(e, kind)
  d2 = np_triplet_distance(s, hp)
  dist = np.sqrt(np.maximum(np_sq_distance(s, kind), 1e-12))
  score = -d2 if name == "triplet" else s
  positive, negative = hp["positive"], hp["negative"]
  margin = hp.get("margin", 0.0)
  terms = []
  for a in range(len(labels)):
    ps = positives_of(labels, a)
    if hp.get("skip_duplicate_positives"):
      ps = [p for p in ps if s[a, p] <= 0.9999]
    if not ps or not negatives_of(labels, a):
      if sel is not None:
        assert not sel.valid[a].any()
      continue
    if positive == "easy":
      ps = [max(ps, key=lambda p: score[a, p])]
    elif positive == "hard":
      ps = [min(ps, key=lambda p: score[a, p])]
    elif positive == "random":
      (p,) = np.flatnonzero(sel.pairs[a])
      assert p in ps
      ps = [p]
    for p in ps:
      cand = candidates(score, d2, labels, a, p, negative, margin, dist)
      if sel is not None:
        assert bool(sel.valid[a, p]) == bool(cand), (a, p)
      if not cand:
        continue
      if negative in ("random", "semihard_random", "semihard_band"):
        n = int(sel.negative[a, p])
        assert n in cand, (a, p, n, cand)
        cand = [n]
      if hp.get("positive_similarity_only"):
        if s[a, p] <= 0:
          continue
        cand = [n for n in cand if s[a, n] > 0]
        if not cand:
          continue
      terms.append((a, p, cand))
  return terms


def oracle_term_losses(e, terms, name, hp):
  """Per-term losses of explicit triplets, float64."""
  kind = hp.get("similarity", "cosine")
  s = np_similarity(e, kind)
  out = []
  for a, p, negs in terms:
    if name in ("nca", "nca_2nd"):
      t = hp["temperature"]
      if name == "nca":
        lp, ln = s[a, p], [s[a, n] for n in negs]
      else:
        lp, ln = s[a, p] - s[a, p] ** 2 / 2, [s[a, n] ** 2 / 2 for n in negs]
      logits = np.array([lp] + ln) / t
      m = logits.max()
      out.append(-logits[0] + m + np.log(np.exp(logits - m).sum()))
    else:
      d2 = np_triplet_distance(s, hp)
      h = [max(d2[a, p] - d2[a, n] + hp["margin"], 0.0) for n in negs]
      out.append(sum(h) if hp["negative_reduction"] == "sum" else sum(h) / len(h))
  return np.array(out)


def oracle_loss(e, terms, name, hp):
  vals = oracle_term_losses(e, terms, name, hp)
  return float(vals.mean()) if len(vals) else 0.0


def oracle_grad(e, terms, name, hp, eps=1e-6):
  e = np.asarray(e, np.float64)
  g = np.zeros_like(e)
  for i in np.ndindex(e.shape):
    d = np.zeros_like(e)
    d[i] = eps
    g[i] = (oracle_loss(e + d, terms, name, hp) - oracle_loss(e - d, terms, name, hp)) / (2 * eps)
  return g


def oracle_aux(e, labels, terms, name, hp):
  s = np_similarity(e, hp.get("similarity", "cosine"))
  vals = oracle_term_losses(e, terms, name, hp)
  active = vals > 0 if name == "triplet" else 1 - np.exp(-vals) > 1e-3
  n = max(len(terms), 1)
  return {
      "valid_fraction": len({a for a, _, _ in terms}) / len(labels),
      "active_fraction": active.sum() / n,
      "mean_s_ap": sum(s[a, p] for a, p, _ in terms) / n,
      "mean_s_an": sum(np.mean([s[a, k] for k in negs]) for a, _, negs in terms) / n,
  }


def library_selection(e, labels, name, hp, rng):
  """The selection ``apply`` draws with ``rng`` (same scores, same key)."""
  s = sim.pairwise_similarity(jnp.asarray(e), kind=hp["similarity"])
  score = s
  if name == "triplet":
    d2 = sim.squared_distance(s, kind=hp["similarity"])
    plain = hp.get("distance") == "euclidean" or hp["negative"] == "semihard_band"
    score = -(jnp.sqrt(jnp.maximum(d2, 1e-12)) if plain else d2)
  pos, neg = sim.label_masks(jnp.asarray(labels))
  return jax.device_get(mining.select(score, pos, neg, positive=hp["positive"],
                                      negative=hp["negative"], margin=hp.get("margin", 0.0),
                                      key=rng))


def check_against_oracle(name, e, labels, **kw):
  hp = objectives.make(name, **kw).hparams
  loss, aux, grad = run(name, e, labels, **kw)
  sel = None
  if mining.is_stochastic(positive=hp["positive"], negative=hp["negative"]):
    sel = library_selection(e, labels, name, hp, RNG_KEY)
  terms = oracle_terms(e, labels, name, hp, sel)
  assert terms, "the test batch must give valid terms"
  assert loss.dtype == jnp.float32 and loss.shape == ()
  np.testing.assert_allclose(loss, oracle_loss(e, terms, name, hp), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(grad, oracle_grad(e, terms, name, hp), rtol=2e-3, atol=2e-4)
  want = oracle_aux(e, labels, terms, name, hp)
  assert set(aux) == set(want)
  for k, v in want.items():
    assert aux[k].dtype == jnp.float32 and aux[k].shape == ()
    np.testing.assert_allclose(aux[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
  return terms


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
  dropped = oracle_terms(e, LABELS, "nca", hp, library_selection(e, LABELS, "nca", hp, RNG_KEY))
  kept = check_against_oracle("nca", e, LABELS, positive_similarity_only=True, **kw)
  s = np_similarity(e, "cosine")
  assert any(s[a, p] <= 0 for a, p, _ in dropped)
  assert any(s[a, p] > 0 and s[a, n] <= 0 for a, p, (n,) in dropped)
  assert 0 < len(kept) < len(dropped)


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


@pytest.mark.parametrize("name", ["nca", "nca_2nd", "triplet"])
def test_batch_without_valid_anchor_gives_zero_loss_and_finite_gradient(name):
  singletons = np.arange(B, dtype=np.int32)
  loss, aux, grad = run(name, batch(6), singletons)
  assert loss == 0.0
  np.testing.assert_array_equal(grad, 0.0)
  for v in aux.values():
    assert v == 0.0
  one_class = np.zeros(B, np.int32)      # positives but no negative
  loss, aux, grad = run(name, batch(6), one_class)
  assert loss == 0.0 and aux["valid_fraction"] == 0.0
  chex.assert_tree_all_finite(grad)


@pytest.mark.parametrize("name,kw", [("nca", {}), ("nca", dict(positive="all", negative="all")),
                                     ("triplet", dict(positive="all", negative="all")),
                                     ("triplet", dict(positive="easy", negative="semihard_band"))])
def test_anchors_without_positive_never_give_nan(name, kw):
  loss, aux, grad = run(name, batch(7), LABELS, **kw)
  chex.assert_tree_all_finite((loss, aux, grad))
  np.testing.assert_allclose(aux["valid_fraction"], 10 / 12, rtol=1e-6)
  # Singleton anchors still receive gradient as other anchors' negatives.
  assert np.abs(grad[10]).sum() > 0


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


def test_random_selection_is_deterministic_per_key():
  e = batch(10)
  a = run("triplet", e, LABELS, rng=jax.random.key(1))[0]
  b = run("triplet", e, LABELS, rng=jax.random.key(1))[0]
  losses = {float(run("triplet", e, LABELS, rng=jax.random.key(k))[0]) for k in range(6)}
  assert a == b and len(losses) > 1


@pytest.mark.parametrize("name,kw", [("nca", dict(positive="all", negative="semihard")),
                                     ("triplet", dict(positive="easy", negative="semihard_band"))])
def test_apply_traces_once_per_shape(name, kw):
  obj = objectives.make(name, **kw)
  fn = jax.jit(chex.assert_max_traces(obj.apply, n=1))
  for seed in range(3):
    loss, _ = fn({}, jnp.asarray(batch(seed)), jnp.asarray(np.roll(LABELS, seed)),
                 rng=jax.random.key(seed))
    assert np.isfinite(loss)


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


# ----------------------------------------------------------------------------- the API


def test_names_hparams_and_init():
  assert {"nca", "nca_2nd", "triplet"} <= set(objectives.names())
  obj = objectives.make("nca", negative="semihard")
  assert obj.name == "nca"
  assert obj.hparams == dict(positive="easy", negative="semihard", temperature=0.1,
                             similarity="cosine", skip_duplicate_positives=False,
                             positive_similarity_only=False)
  json.dumps(obj.hparams)   # the trainer writes them to disk
  assert objectives.make("triplet").hparams == dict(
      positive="random", negative="semihard", margin=0.2, similarity="cosine",
      negative_reduction="mean", distance="squared")
  assert objectives.make("nca_2nd").hparams["temperature"] == 0.1
  assert obj.init(jax.random.key(0), num_classes=10, dim=D) == {}
  with pytest.raises(dataclasses.FrozenInstanceError):
    obj.name = "other"


@pytest.mark.parametrize("call,match", [
    (lambda: objectives.make("npair"), r"Unknown objective .npair.; available: .*nca, nca_2nd.*triplet"),
    (lambda: objectives.make("nca", margin=0.2), "margin.*valid: positive, negative, temperature"),
    (lambda: objectives.make("nca", positive="semihard"), "easy, hard, random, all"),
    (lambda: objectives.make("triplet", negative="hardest"), "semihard_random"),
    (lambda: objectives.make("nca", temperature=0.0), "temperature must be a number > 0"),
    (lambda: objectives.make("nca_2nd", temperature=-1), "temperature must be a number > 0"),
    (lambda: objectives.make("nca", negative="semihard_random"), "needs a triplet margin"),
    (lambda: objectives.make("nca_2nd", negative="semihard_band"), "needs a triplet margin"),
    (lambda: objectives.make("triplet", similarity="dot"), "cosine, neg_sq_euclidean"),
    (lambda: objectives.make("triplet", margin=-0.1), "margin must be a number >= 0"),
    (lambda: objectives.make("triplet", negative_reduction="max"), "mean, sum"),
    (lambda: objectives.make("triplet", distance="l1"), "squared, euclidean"),
    (lambda: objectives.make("nca", similarity="l1"), "cosine, dot, neg_sq_euclidean"),
    (lambda: objectives.make("nca", skip_duplicate_positives=1), "True or False"),
    (lambda: objectives.make("nca", similarity="dot", positive_similarity_only=True),
     "similarity='cosine'"),
])
def test_make_rejects_bad_arguments(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_apply_rejects_bad_inputs():
  e, labels = jnp.asarray(batch(0)), jnp.asarray(LABELS)
  rnd = objectives.make("triplet")
  with pytest.raises(ValueError, match="pass rng"):
    rnd.apply({}, e, labels)
  with pytest.raises(ValueError, match="pass rng"):
    jax.jit(rnd.apply)({}, e, labels)
  obj = objectives.make("nca")
  with pytest.raises(ValueError, match="rank 2"):
    obj.apply({}, e[None], labels)
  with pytest.raises(ValueError, match="integers"):
    obj.apply({}, e, labels.astype(jnp.float32))
  with pytest.raises(ValueError, match="shape"):
    obj.apply({}, e, labels[:5])


# ------------------------------ single-positive fast paths == general [B, N] path (issue 3)


@functools.partial(jax.jit, static_argnames=("name", "positive", "negative", "keep"))
def general_path_loss(e, labels, key, *, name, positive, negative, keep=None):
  """Loss of the ``[B, N]`` general path: sorted-row negatives (``mining.negatives``), a
  ``[B, N]`` gather and, for trimming, ``keep_easiest`` over all ``B^2`` entries."""
  s = sim.pairwise_similarity(e)
  pos, neg = sim.label_masks(labels)
  kp = jax.random.split(key)[0] if positive == "random" else None
  if name == "nca":
    score, x = jax.lax.stop_gradient(s), s
  else:
    x = sim.squared_distance(s)
    score = -jax.lax.stop_gradient(x)
  pairs = mining.positive_pairs(score, pos, mode=positive, key=kp)
  idx, valid = mining.negatives(score, neg, pairs, mode=negative)
  x_an = jnp.take_along_axis(x, idx, axis=1)
  if name == "nca":
    terms = losses.nca(s, x_an, temperature=0.1)
  else:
    terms = losses.triplet(x, x_an, margin=0.2)
  if keep is not None:
    valid = mining.keep_easiest(terms, valid, keep_fraction=keep)
  return losses.masked_mean(terms, valid)


@pytest.mark.parametrize("name,positive,negative", [
    ("nca", "easy", "hard"), ("nca", "hard", "semihard"), ("triplet", "easy", "hard"),
    ("triplet", "random", "semihard"), ("triplet", "easy", "semihard"),
    ("triplet", "hard", "hard"), ("nca", "random", "easy"),
    ("trimmed_triplet", "random", "semihard"), ("trimmed_triplet", "easy", "hard")])
def test_single_positive_fast_path_equals_general_path(name, positive, negative):
  hp = dict(positive=positive, negative=negative)
  keep = None
  if name == "trimmed_triplet":
    hp["keep_fraction"] = keep = 0.75
  general = jax.value_and_grad(functools.partial(
      general_path_loss, name="nca" if name == "nca" else "triplet", positive=positive,
      negative=negative, keep=keep))
  nonzero = 0
  for seed in range(3):
    e = batch(seed)
    e[4] = e[1]   # a duplicate: ties between negatives and with s_ap
    labels = np.roll(LABELS, seed)
    key = jax.random.key(seed)
    loss, _, grad = run(name, e, labels, rng=key, **hp)
    ref_loss, ref_grad = general(jnp.asarray(e), jnp.asarray(labels), key)
    nonzero += float(ref_loss) > 0
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
  assert nonzero > 0


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
