"""Proxy-NCA (dml_jax/objectives/_proxy.py): values, gradients w.r.t. the embeddings and the
proxies against a numpy loop oracle, init, singleton classes, labels out of range and the error
messages."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objective_support as support
from objective_support import B, D, NUM_CLASSES
from oracles import LABELS, fd_grad
from oracles import random_batch as batch
from dml_jax import objectives

run = functools.partial(support.run_with_params, rng=None)


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
  loss, aux, gp, ge = run("proxy_nca", params, e, LABELS, **kw)
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


PROXY_OBJECTIVES = [("proxy_nca", 1), ("proxy_anchor", 1), ("normalized_softmax", 1),
                    ("cosface", 1), ("arcface", 1), ("subcenter_arcface", 3), ("softtriple", 10)]


@pytest.mark.parametrize("name,per_class", PROXY_OBJECTIVES)
def test_proxy_norm_sets_the_initial_length_and_not_the_loss(name, per_class):
  key = jax.random.key(3)
  unit = objectives.make(name).init(key, num_classes=5, dim=D)["proxies"]
  long = objectives.make(name, proxy_norm=4.0).init(key, num_classes=5, dim=D)["proxies"]
  assert unit.shape == long.shape == (5 * per_class, D)
  np.testing.assert_allclose(np.linalg.norm(long, axis=1), 4.0, rtol=1e-5)
  np.testing.assert_allclose(long, 4.0 * unit, rtol=1e-6)   # the same directions
  labels = np.asarray(LABELS, np.int32) % 5
  loss_unit = run(name, {"proxies": unit}, batch(0), labels)[0]
  loss_long = run(name, {"proxies": long}, batch(0), labels)[0]
  np.testing.assert_allclose(loss_long, loss_unit, rtol=1e-5)   # the losses see cosines
  with pytest.raises(ValueError, match="proxy_norm must be a number > 0, got 0"):
    objectives.make(name, proxy_norm=0)


def test_proxy_nca_with_singleton_classes_is_finite():
  obj = objectives.make("proxy_nca")
  params = obj.init(jax.random.key(0), num_classes=NUM_CLASSES, dim=D)
  loss, aux, gp, ge = run("proxy_nca", params, batch(12), np.arange(B, dtype=np.int32))
  chex.assert_tree_all_finite((loss, aux, gp, ge))
  assert aux["valid_fraction"] == 1.0


def test_apply_traces_once_per_shape():
  support.check_apply_traces_once_per_shape("proxy_nca")


@pytest.mark.parametrize("call,match", [
    (lambda: objectives.make("proxy_nca", denominator="none"), "negatives, all"),
    (lambda: objectives.make("proxy_nca", temperature=0), "temperature must be a number > 0"),
    (lambda: objectives.make("proxy_nca").init(jax.random.key(0), num_classes=1, dim=D),
     "num_classes must be an int >= 2"),
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


def oracle_proxy_anchor(e, proxies, labels, margin, alpha):
  """Kim et al. eq. 4 as loops over proxies and embeddings."""
  x = np.asarray(e, np.float64)
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  pr = np.asarray(proxies, np.float64)
  pr = pr / np.linalg.norm(pr, axis=1, keepdims=True)
  pos_terms, neg_total = [], 0.0
  for c in range(len(pr)):
    members = [i for i, y in enumerate(labels) if y == c]
    others = [i for i, y in enumerate(labels) if y != c]
    if members:
      pos_terms.append(np.log1p(sum(np.exp(-alpha * (x[i] @ pr[c] - margin)) for i in members)))
    if others:
      neg_total += np.log1p(sum(np.exp(alpha * (x[i] @ pr[c] + margin)) for i in others))
  return float(np.mean(pos_terms) + neg_total / len(pr))


@pytest.mark.parametrize("margin,alpha", [(0.1, 32.0), (0.3, 4.0)])
def test_proxy_anchor_matches_oracle_values_and_gradients(margin, alpha):
  e = batch(6, d=D, normalize=False)
  proxies = np.random.default_rng(7).normal(size=(NUM_CLASSES, D)).astype(np.float32)
  loss, aux, gp, ge = run("proxy_anchor", {"proxies": jnp.asarray(proxies)}, e, LABELS,
                          margin=margin, alpha=alpha)
  f = lambda x: oracle_proxy_anchor(x, proxies, LABELS, margin, alpha)
  np.testing.assert_allclose(float(loss), f(e), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(ge), fd_grad(f, e), rtol=1e-3, atol=1e-4)
  gw = fd_grad(lambda w: oracle_proxy_anchor(e, w, LABELS, margin, alpha), proxies)
  np.testing.assert_allclose(np.asarray(gp["proxies"]), gw, rtol=1e-3, atol=1e-4)
  assert float(aux["valid_fraction"]) == 1.0 and 0.0 < float(aux["active_fraction"]) <= 1.0


def test_proxy_anchor_bf16_one_trace_and_label_range():
  support.check_apply_traces_once_per_shape("proxy_anchor")
  obj = objectives.make("proxy_anchor")
  params = obj.init(jax.random.key(0), num_classes=NUM_CLASSES, dim=D)
  loss, _ = obj.apply(params, jnp.asarray(batch(1), jnp.bfloat16), jnp.asarray(LABELS))
  assert loss.dtype == jnp.float32 and np.isfinite(float(loss))
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
    obj.apply(obj.init(jax.random.key(0), num_classes=3, dim=D), jnp.asarray(batch(1)),
              jnp.asarray(LABELS))
