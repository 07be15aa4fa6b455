"""The objectives API (dml_jax/objectives/__init__.py): names, make, the hyper-parameter
defaults every family reports, init, and the input checks of ``apply``."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from objective_support import D
from oracles import LABELS
from oracles import random_batch as batch
from dml_jax import objectives
from dml_jax.objectives import _registry

PAIRS = ["contrastive", "binomial", "multi_similarity", "lifted_structure", "dro_topk",
         "dro_topk_pn", "dro_kl", "dro_kl_grouped"]


def test_names_hparams_and_init():
  assert {"nca", "nca_2nd", "triplet"} <= set(objectives.names())
  obj = objectives.make("nca", negative="semihard")
  assert obj.name == "nca"
  assert obj.hparams == dict(positive="easy", negative="semihard", temperature=0.1,
                             similarity="cosine", skip_duplicate_positives=False,
                             positive_similarity_only=False, reduction="mean")
  json.dumps(obj.hparams)   # the trainer writes them to disk
  assert objectives.make("triplet").hparams == dict(
      positive="random", negative="semihard", margin=0.2, similarity="cosine",
      negative_reduction="mean", distance="squared")
  assert objectives.make("nca_2nd").hparams["temperature"] == 0.1
  assert obj.init(jax.random.key(0), num_classes=10, dim=D) == {}
  with pytest.raises(dataclasses.FrozenInstanceError):
    obj.name = "other"


def test_numpy_scalar_hyperparameters_are_recorded_as_python_numbers():
  # a sweep over np.arange / an array's entries recorded np.int64 / np.float32 in hparams,
  # which json.dumps refuses
  obj = objectives.make("dro_topk", k=np.int64(5), margin=np.float32(0.25), base=np.float64(0.5))
  assert [type(obj.hparams[k]) for k in ("k", "margin", "base")] == [int, float, float]
  json.dumps(obj.hparams)


def test_margin_with_default_hyperparameters_and_hparams():
  assert objectives.make("margin").hparams == dict(
      positive="random", negative="distance_weighted", alpha=0.2, beta="class", beta0=1.2,
      nu=0.0, similarity="cosine", cutoff=0.5, nonzero_loss_cutoff=1.4, fallback="negatives",
      reduction="nonzero")
  assert objectives.make("proxy_nca").hparams == dict(temperature=1.0, denominator="negatives",
                                                      proxy_norm=1.0)
  assert objectives.make("trimmed_triplet").hparams == dict(
      positive="random", negative="semihard", margin=0.2, similarity="cosine",
      negative_reduction="mean", keep_fraction=0.9, distance="squared")
  assert {"margin", "proxy_nca", "trimmed_triplet"} <= set(objectives.names())


def test_hparams_defaults_and_init():
  assert set(PAIRS) <= set(objectives.names())
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
  for name in PAIRS:
    obj = objectives.make(name)
    json.dumps(obj.hparams)
    assert obj.init(jax.random.key(0), num_classes=5, dim=D) == {}


def test_make_rejects_an_unknown_objective():
  with pytest.raises(ValueError,
                     match=r"Unknown objective .npair.; available: .*nca, nca_2nd.*triplet"):
    objectives.make("npair")


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



@pytest.mark.parametrize("rng", [0, np.uint32(3), jnp.zeros(3, jnp.uint32),
                                 jax.random.split(jax.random.key(0), 2)])
def test_apply_names_an_rng_that_is_not_one_key(rng):
  e, labels = jnp.asarray(batch(0)), jnp.asarray(LABELS)
  rnd = objectives.make("dro_kl", mode="sample")
  with pytest.raises(ValueError, match=r"'dro_kl' with mode='sample'.*rng must be one PRNG key"):
    rnd.apply({}, e, labels, rng=rng)
  with pytest.raises(ValueError, match="rng must be one PRNG key"):
    jax.jit(rnd.apply)({}, e, labels, rng=rng)


def test_apply_takes_a_typed_or_raw_key_eagerly_jitted_and_vmapped():
  e, labels = jnp.asarray(batch(0)), jnp.asarray(LABELS)
  rnd = objectives.make("triplet")
  loss = lambda k: rnd.apply({}, e, labels, rng=k)[0]
  typed = jax.random.split(jax.random.key(1), 3)
  raw = jax.random.key_data(typed)
  want = np.array([loss(k) for k in typed])
  np.testing.assert_allclose(np.array([loss(k) for k in raw]), want, rtol=1e-5)
  np.testing.assert_allclose(jax.vmap(loss)(typed), want, rtol=1e-5)
  np.testing.assert_allclose(jax.vmap(jax.jit(loss))(raw), want, rtol=1e-5)

@pytest.mark.parametrize("name", objectives.names())
def test_an_empty_batch_is_refused_in_one_line(name):
  # B = 0 or D = 0 failed deep inside (an argmax of an empty sequence, a modulo by zero) or
  # returned a loss, depending on the objective
  obj = objectives.make(name)
  params = obj.init(jax.random.key(0), num_classes=6, dim=D)
  for shape in ((0, D), (len(LABELS), 0)):
    labels = jnp.asarray(LABELS)[:shape[0]]
    with pytest.raises(ValueError, match=r"embeddings must be non-empty .* got shape \("):
      jax.eval_shape(lambda p, e, y: obj.apply(p, e, y, rng=jax.random.key(0)), params,
                     jnp.zeros(shape), labels)


@pytest.mark.parametrize("name", objectives.names())
def test_loss_and_aux_stay_float32_with_x64_enabled(name):
  # histogram's loss and npairs' valid_fraction came out float64 under jax_enable_x64
  obj = objectives.make(name)
  params = obj.init(jax.random.key(0), num_classes=6, dim=D)
  with jax.enable_x64(True):
    loss, aux = jax.eval_shape(lambda p, e, y: obj.apply(p, e, y, rng=jax.random.key(0)),
                               params, jnp.asarray(batch(0, d=D), jnp.float64),
                               jnp.asarray(LABELS))
  assert loss.dtype == jnp.float32 and loss.shape == ()
  assert {k: v.dtype for k, v in aux.items()} == {k: jnp.float32 for k in aux}


@pytest.mark.parametrize("name", objectives.names())
def test_non_finite_embeddings_are_named_or_give_a_nan_loss(name):
  # Mining left a NaN row out (comparisons with NaN are False), so triplet, trimmed_triplet,
  # multi_similarity, angular, fastap and dro_kl_grouped returned a finite loss.
  obj = objectives.make(name)
  params = obj.init(jax.random.key(0), num_classes=6, dim=D)
  e, y = jnp.asarray(batch(0, d=D)), jnp.asarray(LABELS)
  e = e.at[2, 1].set(jnp.nan).at[5, 0].set(jnp.inf)
  with pytest.raises(ValueError, match=r"non-finite .* in 2 of \d+ rows: rows \[2, 5\]"):
    obj.apply(params, e, y, rng=jax.random.key(0))
  loss, _ = jax.jit(lambda p, e: obj.apply(p, e, y, rng=jax.random.key(0)))(params, e)
  assert jnp.isnan(loss)


@pytest.mark.parametrize("name", objectives.names())
def test_every_numeric_hyperparameter_refuses_infinities_and_nan(name):
  # an infinite margin or scale passed the ">= 0" / "> 0" checks and made the loss NaN or inf
  numeric = {k: v for k, v in objectives.hparam_defaults(name).items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)}
  for key, value in ((k, v) for k in numeric for v in (float("inf"), -float("inf"), float("nan"))):
    with pytest.raises(ValueError) as error:   # one line naming the key and the value
      objectives.make(name, **{key: value})
    message = str(error.value)
    assert "\n" not in message and key in message and repr(value) in message, message


@pytest.mark.filterwarnings("ignore:objective 'dro_topk.*exceeds")   # k at its default 160
@pytest.mark.parametrize("name", objectives.names())
def test_the_registered_support_is_what_the_objective_does(name):
  """``objectives.support(name)`` (what the tests and the trainer parametrize over) agrees with
  the builder: parameters from ``init``, references and ``rng`` accepted by ``apply`` (traced
  only: ``jax.eval_shape``)."""
  obj = objectives.make(name)
  assert obj.support is objectives.support(name)
  assert getattr(objectives, name) is objectives.REGISTRY[name]
  params = obj.init(jax.random.key(0), num_classes=6, dim=D)
  assert bool(params) == obj.support.parameters    # at the defaults
  e, y = jnp.asarray(batch(0, d=D)), jnp.asarray(LABELS)
  if obj.support.randomness:
    key = jax.random.key(0)
  else:   # no hyper-parameter draws random numbers: rng may be left out
    key = None
  refs = objectives.References(e, y, ~jnp.eye(len(LABELS), dtype=bool))
  if obj.support.references:
    jax.eval_shape(lambda p, e, y: obj.apply(p, e, y, rng=key, references=refs), params, e, y)
  else:
    jax.eval_shape(lambda p, e, y: obj.apply(p, e, y, rng=key), params, e, y)


def test_register_refuses_a_taken_name_and_a_bad_builder():
  builder = lambda *, scale=1.0: (None, None)
  with pytest.raises(ValueError, match="'nca' is already registered.*_nca.nca"):
    objectives.register("nca")(builder)
  with pytest.raises(ValueError, match="keyword-only with a default"):
    objectives.register("no_default", lambda *, scale: (None, None))
  assert "no_default" not in objectives.names()
  objectives.register("registry_test_objective", builder, parameters=True)
  try:
    assert objectives.support("registry_test_objective") == objectives.Support(parameters=True)
    with pytest.raises(ValueError, match="already registered"):
      objectives.register("registry_test_objective", builder)   # twice: an error too
  finally:
    del _registry.REGISTRY["registry_test_objective"], _registry.SUPPORT["registry_test_objective"]
  with pytest.raises(ValueError, match="Unknown objective 'registry_test_objective'"):
    objectives.support("registry_test_objective")


def test_a_partial_builder_is_refused_in_one_line_not_replaced():
  """A ``functools.partial`` builder: a second one of its name, a built-in's name taken by a
  partial of the built-in's builder, or a bad parameter, is one ``ValueError`` naming the
  function it wraps (no ``AttributeError`` from the partial's missing ``__qualname__``)."""
  import functools  # pylint: disable=import-outside-toplevel

  def scaled(*, scale=1.0, shift=0.0):
    return objectives.no_params, None

  objectives.register("registry_test_partial", functools.partial(scaled, shift=1.0))
  try:
    with pytest.raises(ValueError, match=r"'registry_test_partial' is already registered \(by "
                       r"\S*test_registry\..*scaled in .*test_registry\.py\)"):
      objectives.register("registry_test_partial", functools.partial(scaled, shift=2.0))
    assert _registry.REGISTRY["registry_test_partial"].keywords == {"shift": 1.0}
  finally:
    del _registry.REGISTRY["registry_test_partial"], _registry.SUPPORT["registry_test_partial"]
  nca = _registry.REGISTRY["nca"]
  with pytest.raises(ValueError, match="'nca' is already registered.*_nca.nca"):
    objectives.register("nca", functools.partial(nca, margin=0.5))
  assert _registry.REGISTRY["nca"] is nca

  def positional(x, *, scale=1.0):
    return scaled(scale=scale + x)

  with pytest.raises(ValueError, match="builder positional for 'registry_test_bad': parameter "
                                       "'x' must be keyword-only"):
    objectives.register("registry_test_bad", functools.partial(positional, scale=2.0))
