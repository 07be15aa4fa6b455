"""The JAX side of the objective tests, shared by the family files of tests/objectives/: the
compiled ``value_and_grad`` functions (built once per configuration for every test file:
compilation dominates test time here), the checks of NCA / triplet and pair objectives against
the numpy oracles of ``oracles.py``, and property checks that several families share."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from oracles import LABELS, fd_grad, oracle_aux, oracle_loss, oracle_terms, pair_aux, plan
from oracles import random_batch
from dml_jax import losses
from dml_jax import mining
from dml_jax import objectives
from dml_jax import similarity as sim

B, D = len(LABELS), 4
NUM_CLASSES = 12   # one shape of beta / proxies for every test (shared compilations)

_COMPILED = {}


def objective_value_and_grad(name, argnums=1, **hparams):
  """``jit(value_and_grad(make(name, **hparams).apply, argnums, has_aux=True))``, built once per
  configuration and shared by every test file (compilation dominates test time here)."""
  key = (name, argnums, tuple(sorted(hparams.items())))
  if key not in _COMPILED:
    obj = objectives.make(name, **hparams)
    _COMPILED[key] = jax.jit(jax.value_and_grad(obj.apply, argnums=argnums, has_aux=True))
  return _COMPILED[key]


def run(name, e, labels, *, rng, **hparams):
  """``(loss, aux, d loss / d e)`` of a parameter-free objective."""
  (loss, aux), grad = objective_value_and_grad(name, 1, **hparams)(
      {}, jnp.asarray(e), jnp.asarray(labels), rng=rng)
  return loss, aux, grad


def run_with_params(name, params, e, labels, *, rng, **hparams):
  """``(loss, aux, d loss / d params, d loss / d e)``."""
  (loss, aux), (gp, ge) = objective_value_and_grad(name, (0, 1), **hparams)(
      params, jnp.asarray(e), jnp.asarray(labels), rng=rng)
  return loss, aux, gp, ge


# ----------------------------------------------------------------------------- NCA / triplet


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


def check_nca_triplet(name, e, labels, *, rng, **kw):
  """Loss, gradient and aux of NCA / triplet objective ``name`` against the oracle over
  explicit triplets; returns the oracle's terms."""
  hp = objectives.make(name, **kw).hparams
  loss, aux, grad = run(name, e, labels, rng=rng, **kw)
  sel = None
  if mining.is_stochastic(positive=hp["positive"], negative=hp["negative"]):
    sel = library_selection(e, labels, name, hp, rng)
  terms = oracle_terms(e, labels, name, hp, sel)
  assert terms, "the test batch must give valid terms"
  assert loss.dtype == jnp.float32 and loss.shape == ()
  np.testing.assert_allclose(loss, oracle_loss(e, terms, name, hp), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(grad, fd_grad(lambda x: oracle_loss(x, terms, name, hp), e),
                             rtol=2e-3, atol=2e-4)
  want = oracle_aux(e, labels, terms, name, hp)
  assert set(aux) == set(want)
  for k, v in want.items():
    assert aux[k].dtype == jnp.float32 and aux[k].shape == ()
    np.testing.assert_allclose(aux[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
  return terms


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


def check_fast_path_equals_general_path(name, positive, negative):
  """The single-positive fast paths give the general ``[B, N]`` path's loss and
  gradient (ties included)."""
  hp = dict(positive=positive, negative=negative)
  keep = None
  if name == "trimmed_triplet":
    hp["keep_fraction"] = keep = 0.75
  general = jax.value_and_grad(functools.partial(
      general_path_loss, name="nca" if name == "nca" else "triplet", positive=positive,
      negative=negative, keep=keep))
  nonzero = 0
  for seed in range(3):
    e = random_batch(seed)
    e[4] = e[1]   # a duplicate: ties between negatives and with s_ap
    labels = np.roll(LABELS, seed)
    key = jax.random.key(seed)
    loss, _, grad = run(name, e, labels, rng=key, **hp)
    ref_loss, ref_grad = general(jnp.asarray(e), jnp.asarray(labels), key)
    nonzero += float(ref_loss) > 0
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
  assert nonzero > 0


def check_zero_loss_without_valid_anchor(name, *, rng, **kw):
  """Singletons only, then one class: loss 0, finite (for singletons zero) gradient, aux 0."""
  singletons = np.arange(B, dtype=np.int32)
  loss, aux, grad = run(name, random_batch(6), singletons, rng=rng, **kw)
  assert loss == 0.0
  np.testing.assert_array_equal(grad, 0.0)
  for v in aux.values():
    assert v == 0.0
  one_class = np.zeros(B, np.int32)      # positives but no negative
  loss, aux, grad = run(name, random_batch(6), one_class, rng=rng, **kw)
  assert loss == 0.0 and aux["valid_fraction"] == 0.0
  chex.assert_tree_all_finite(grad)


def check_anchors_without_positive_never_give_nan(name, *, rng, **kw):
  loss, aux, grad = run(name, random_batch(7), LABELS, rng=rng, **kw)
  chex.assert_tree_all_finite((loss, aux, grad))
  np.testing.assert_allclose(aux["valid_fraction"], 10 / 12, rtol=1e-6)
  # Singleton anchors still receive gradient as other anchors' negatives.
  assert np.abs(grad[10]).sum() > 0


def check_zero_loss_without_valid_anchor_with_params(name, *, rng, **kw):
  """As ``check_zero_loss_without_valid_anchor`` for objectives with parameters."""
  params = objectives.make(name, **kw).init(jax.random.key(0), num_classes=NUM_CLASSES, dim=D)
  singletons = np.arange(B, dtype=np.int32)
  loss, aux, gp, ge = run_with_params(name, params, random_batch(11), singletons, rng=rng, **kw)
  assert loss == 0.0 and aux["valid_fraction"] == 0.0
  np.testing.assert_array_equal(ge, 0.0)
  chex.assert_tree_all_finite((gp, aux))
  one_class = np.zeros(B, np.int32)                     # positives but no negative
  loss, aux, gp, ge = run_with_params(name, params, random_batch(11), one_class, rng=rng, **kw)
  assert loss == 0.0 and aux["valid_fraction"] == 0.0
  chex.assert_tree_all_finite((ge, gp))


def check_apply_traces_once_per_shape(name, **kw):
  chex.clear_trace_counter()   # objectives built by one factory share apply's code object
  obj = objectives.make(name, **kw)
  params = obj.init(jax.random.key(0), num_classes=NUM_CLASSES, dim=D)
  fn = jax.jit(chex.assert_max_traces(obj.apply, n=1))
  for seed in range(3):
    loss, _ = fn(params, jnp.asarray(random_batch(seed)), jnp.asarray(np.roll(LABELS, seed)),
                 rng=jax.random.key(seed))
    assert np.isfinite(loss)


# ----------------------------------------------------------------------------- pair objectives


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
  return mining.kl_sample_pairs(rng, values, cand, gamma=hp["gamma"], num=2 * hp["k"])


def library_kl_counts(e, labels, hp, rng):
  """The draw counts ``apply`` makes with ``rng`` (same pair losses, same key)."""
  return np.asarray(_kl_counts(jnp.asarray(e), jnp.asarray(labels), rng,
                               tuple(sorted(hp.items()))))


def check_pair_objective(name, e, labels, *, rng, **kw):
  """Loss, gradient and aux of pair objective ``name`` against ``oracles.plan``; returns
  ``(loss, entering, active)``."""
  hp = objectives.make(name, **kw).hparams
  loss, aux, grad = run(name, e, labels, rng=rng, **kw)
  counts = None
  if name == "dro_kl" and hp["mode"] == "sample":
    counts = library_kl_counts(e, labels, hp, rng)
  f, entering, active = plan(name, hp, e, labels, kl_counts=counts)
  assert entering, "the test batch must give pairs that enter the loss"
  assert loss.dtype == jnp.float32 and loss.shape == ()
  np.testing.assert_allclose(loss, f(e), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(grad, fd_grad(f, e), rtol=2e-3, atol=2e-5)
  want = pair_aux(e, labels, entering, active)
  assert set(aux) == set(want)
  for k, v in want.items():
    assert aux[k].dtype == jnp.float32 and aux[k].shape == ()
    np.testing.assert_allclose(aux[k], v, rtol=1e-4, atol=1e-6, err_msg=k)
  return loss, entering, active


def check_pair_zero_loss_without_valid_anchor(name, *, rng):
  for labels in (np.arange(B, dtype=np.int32), np.zeros(B, np.int32)):   # singletons; one class
    loss, aux, grad = run(name, random_batch(14), labels, rng=rng)
    assert loss == 0.0
    chex.assert_tree_all_finite(grad)
    np.testing.assert_array_equal(grad, 0.0)
    for v in aux.values():
      assert v == 0.0


def check_singleton_classes_take_part_as_negatives(name, *, rng, **kw):
  loss, aux, grad = run(name, random_batch(16), LABELS, rng=rng, **kw)
  chex.assert_tree_all_finite((loss, aux, grad))
  assert np.abs(grad[10]).sum() > 0 and np.abs(grad[11]).sum() > 0
  loss, aux, grad = run(name, random_batch(16), np.arange(B, dtype=np.int32), rng=rng, **kw)
  assert loss > 0 and aux["mean_s_ap"] == 0.0          # negatives only


def check_pair_bf16(name, *, rng):
  e = random_batch(17)
  e[3] = e[0] * 0.999 + 0.001                 # a negative almost identical to anchor 0
  e = jnp.asarray(e, jnp.bfloat16)
  loss, aux, grad = run(name, e, LABELS, rng=rng)   # MS with beta = 50: e^{50 (S - 0.5)} ~ e^25
  assert loss.dtype == jnp.float32 and grad.dtype == jnp.bfloat16
  chex.assert_tree_all_finite((loss, aux, grad.astype(jnp.float32)))
  assert loss > 0
  want = run(name, np.asarray(e.astype(jnp.float32)), LABELS, rng=rng)[0]
  np.testing.assert_allclose(loss, want, rtol=1e-5)


def check_vmap_over_a_leading_axis(name, *, rng, **kw):
  obj = objectives.make(name, **kw)
  e = jnp.stack([jnp.asarray(random_batch(20 + t)) for t in range(3)])
  labels = jnp.stack([jnp.asarray(np.roll(LABELS, t)) for t in range(3)])
  got, aux = jax.jit(jax.vmap(lambda x, y: obj.apply({}, x, y, rng=rng)))(e, labels)
  chex.assert_shape(got, (3,))
  for t in range(3):
    (want, want_aux), _ = objective_value_and_grad(name, 1, **kw)({}, e[t], labels[t], rng=rng)
    np.testing.assert_allclose(got[t], want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(aux["active_fraction"][t], want_aux["active_fraction"],
                               rtol=1e-5)


def check_invariant_to_batch_permutation(name, *, rng, **kw):
  e = random_batch(21)
  perm = np.random.default_rng(1).permutation(B)
  loss, _, grad = run(name, e, LABELS, rng=rng, **kw)
  loss_p, _, grad_p = run(name, e[perm], LABELS[perm], rng=rng, **kw)
  np.testing.assert_allclose(loss_p, loss, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(grad_p, grad[perm], rtol=1e-4, atol=1e-6)
