"""NormSoftmax, CosFace, ArcFace, SoftTriple, L-Softmax, SphereFace and P2SGrad
(dml_jax/objectives/_softmax.py) against numpy loops: values and gradients w.r.t. the embeddings
and the class weights, ArcFace's angle branch and the multiplicative margin's, the margin in
radians, labels out of range."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objective_support as support
from objective_support import D, NUM_CLASSES
from dml_test_support import require_kernel
from oracles import LABELS, fd_grad
from oracles import random_batch as batch
from dml_jax import kernels
from dml_jax import objectives

run = functools.partial(support.run_with_params, rng=None)


def _unit(x):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def oracle(name, hp, e, w, labels):
  """Mean over anchors of -log softmax(scale * logits)[y], logits from explicit angles; the
  centres of class c are rows c * K + k of w."""
  cos = _unit(e) @ _unit(w).T
  k = hp.get("sub_centers", hp.get("centers_per_class", 1))
  if name == "subcenter_arcface":
    cos = np.array([[max(row[c * k:(c + 1) * k]) for c in range(len(w) // k)] for row in cos])
  if name == "softtriple":
    soft = []
    for row in cos:
      classes = []
      for c in range(len(w) // k):
        s = row[c * k:(c + 1) * k]
        p = np.exp((s - s.max()) / hp["gamma"])
        classes.append(float(np.sum(p / p.sum() * s)))
      soft.append(classes)
    cos = np.array(soft)
  if name == "p2sgrad":
    return float(np.mean((np.clip(cos, -1, 1) - np.eye(len(w))[labels]) ** 2))
  out = []
  for a, y in enumerate(labels):
    logits = cos[a].copy()
    theta = math.acos(min(1.0, max(-1.0, cos[a, y])))
    if name == "normalized_softmax":
      scale = 1.0 / hp["temperature"]
    elif name == "cosface":
      scale, logits[y] = hp["scale"], cos[a, y] - hp["margin"]
    elif name == "softtriple":
      scale, logits[y] = hp["la"], cos[a, y] - hp["margin"]
    elif name in ("large_margin_softmax", "sphereface"):   # psi from the angle itself
      m = hp["margin"]
      k = math.floor(theta / (math.pi / m))
      logits[y] = (-1) ** k * math.cos(m * theta) - 2 * k
      lengths = np.linalg.norm(np.asarray(e[a], np.float64)) * hp["scale"]
      if name == "large_margin_softmax":
        lengths = lengths * np.linalg.norm(np.asarray(w, np.float64), axis=1)
      scale, logits = 1.0, logits * lengths
    else:
      m, scale = hp["margin"], hp["scale"]
      logits[y] = (math.cos(theta + m) if theta <= math.pi - m
                   else math.cos(theta) - m * math.sin(m))
    z = scale * logits
    out.append(-(z[y] - np.log(np.sum(np.exp(z - z.max()))) - z.max()))
  return float(np.mean(out))


CASES = [("normalized_softmax", {"temperature": 0.05}), ("normalized_softmax", {"temperature": 0.5}),
         ("cosface", {"margin": 0.35, "scale": 64.0}), ("cosface", {"margin": 0.1, "scale": 4.0}),
         ("arcface", {"margin": 0.5, "scale": 64.0}), ("arcface", {"margin": 0.3, "scale": 4.0}),
         ("subcenter_arcface", {"margin": 0.5, "scale": 64.0, "sub_centers": 3}),
         ("subcenter_arcface", {"margin": 0.2, "scale": 4.0, "sub_centers": 2}),
         ("softtriple", {"centers_per_class": 10, "la": 20.0, "gamma": 0.1, "margin": 0.01}),
         ("softtriple", {"centers_per_class": 3, "la": 4.0, "gamma": 0.5, "margin": 0.2}),
         # 2 / gamma = 100: the softmax over centres is shifted by its maximum, not by 1.
         ("softtriple", {"centers_per_class": 4, "la": 10.0, "gamma": 0.02, "margin": 0.05}),
         ("large_margin_softmax", {"margin": 4, "scale": 1.0}),
         ("large_margin_softmax", {"margin": 2, "scale": 3.0}),
         ("sphereface", {"margin": 4, "scale": 1.0}),
         ("sphereface", {"margin": 3, "scale": 8.0}),
         ("p2sgrad", {})]


@pytest.mark.parametrize("name,hp", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_matches_oracle_values_and_gradients(name, hp):
  e = batch(1, d=D, normalize=False)
  k = hp.get("sub_centers", hp.get("centers_per_class", 1))
  w = np.random.default_rng(2).normal(size=(NUM_CLASSES * k, D)).astype(np.float32)
  loss, aux, gp, ge = run(name, {"proxies": jnp.asarray(w)}, e, LABELS, **hp)
  f = lambda x: oracle(name, hp, x, w, LABELS)
  np.testing.assert_allclose(float(loss), f(e), rtol=1e-5, atol=1e-5)
  scale = max(1.0, float(np.max(np.abs(fd_grad(f, e)))))
  np.testing.assert_allclose(np.asarray(ge), fd_grad(f, e), rtol=1e-3, atol=1e-4 * scale)
  gw = fd_grad(lambda x: oracle(name, hp, e, x, LABELS), w)
  np.testing.assert_allclose(np.asarray(gp["proxies"]), gw, rtol=1e-3,
                             atol=1e-4 * max(1.0, float(np.max(np.abs(gw)))))
  assert float(aux["valid_fraction"]) == 1.0


@pytest.mark.parametrize("gamma", [0.1, 0.02])   # shift by the bound 1 / by the maximum
def test_softtriple_without_the_kernel_matches_oracle(monkeypatch, gamma):
  # The pure-XLA soft pool (no C++ compiler, or a GPU) gives the oracle's loss and gradients too.
  monkeypatch.setenv("DML_JAX_CPU_KERNELS", "0")
  hp = {"centers_per_class": 4, "la": 10.0, "gamma": gamma, "margin": 0.05}
  e = batch(1, d=D, normalize=False)
  w = np.random.default_rng(2).normal(size=(NUM_CLASSES * 4, D)).astype(np.float32)
  loss, _, _, ge = run("softtriple", {"proxies": jnp.asarray(w)}, e, LABELS, **hp)
  f = lambda x: oracle("softtriple", hp, x, w, LABELS)
  np.testing.assert_allclose(float(loss), f(e), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ge), fd_grad(f, e), rtol=1e-3, atol=1e-4)


def test_softtriple_is_the_same_with_the_kernels_switched_off(monkeypatch):
  # No objective depends on a kernel: the XLA soft pool gives softtriple's loss and gradients
  # (w.r.t. the embeddings and the centres) where the C++ one is used (same where it is not).
  hp = {"centers_per_class": 3, "la": 4.0, "gamma": 0.1, "margin": 0.2}
  e, labels = jnp.asarray(batch(4, d=D, normalize=False)), jnp.asarray(LABELS)
  w = jnp.asarray(np.random.default_rng(5).normal(size=(NUM_CLASSES * 3, D)), jnp.float32)

  def value_and_grads():   # a new objective and jit: traced under the current switch
    obj = objectives.make("softtriple", **hp)
    loss = lambda p, x: obj.apply(p, x, labels)[0]
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))({"proxies": w}, e)

  default = value_and_grads()
  monkeypatch.setenv("DML_JAX_CPU_KERNELS", "0")
  assert kernels.choose("soft_pool.cc") is None
  switched_off = value_and_grads()
  for got, want in zip(jax.tree.leaves(switched_off), jax.tree.leaves(default)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("gamma", [0.1, 0.02])   # shift by the bound 1 / by the maximum
@pytest.mark.parametrize("shape", [(6, 10, 13), (5, 3, 16), (2, 3, 4, 21)])   # [..., K, C]
def test_soft_pool_kernel_equals_xla(shape, gamma, vectorized):
  # The C++ soft pool (AVX2 and scalar forms; C not a multiple of 8; a leading batch axis)
  # against the XLA one: values and the VJP, cosines spanning [-1, 1].
  from dml_jax.objectives import _softmax  # pylint: disable=import-outside-toplevel
  require_kernel("soft_pool.cc")
  rng = np.random.default_rng(len(shape) * 10 + shape[-1])
  k = shape[-2]
  flat = shape[:-2] + (k * shape[-1],)
  cos_np = rng.uniform(-1.0, 1.0, size=flat).astype(np.float32)
  cos = jnp.asarray(cos_np)
  g = jnp.asarray(rng.normal(size=shape[:-2] + shape[-1:]).astype(np.float32))
  xla = lambda c: _softmax.soft_pool_xla(c, k, gamma)
  if len(shape) == 4:
    xla = jax.vmap(xla)
  want, want_vjp = jax.vjp(xla, cos)
  # jit, as in training: the backward pass then writes over the forward's cosines
  kernel = jax.jit(lambda c: jax.vjp(lambda c: _softmax.soft_pool_kernel(c, k, gamma,
                                                                          vectorized), c))
  got, got_vjp = kernel(cos)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=2e-7)
  dg_want, dg_got = np.asarray(want_vjp(g)[0]), np.asarray(got_vjp(g)[0])
  np.testing.assert_allclose(dg_got, dg_want, rtol=2e-5, atol=2e-6 * np.abs(dg_want).max())
  np.testing.assert_array_equal(np.asarray(cos), cos_np)   # the caller's cosines intact


def test_arcface_takes_the_linear_branch_beyond_pi_minus_m():
  """theta_y > pi - m: logit cos(theta) - m sin(m), which keeps decreasing in theta."""
  from dml_jax.objectives import _softmax  # pylint: disable=import-outside-toplevel
  m = 0.5
  cos = jnp.asarray([math.cos(math.pi - 0.2), math.cos(1.0), 1.0, -1.0], jnp.float32)
  got = np.asarray(_softmax.arcface_target(cos, m))
  np.testing.assert_allclose(got[:2], [math.cos(math.pi - 0.2) - m * math.sin(m),
                                       math.cos(1.0 + m)], rtol=1e-5)
  g = jax.grad(lambda c: jnp.sum(_softmax.arcface_target(c, m)))(cos)
  assert np.all(np.isfinite(np.asarray(g)))


def test_arcface_margin_in_degrees_is_rejected():
  with pytest.raises(ValueError, match="radians"):
    objectives.make("arcface", margin=28.6)


@pytest.mark.parametrize("name", ["normalized_softmax", "cosface", "arcface", "softtriple",
                                  "sphereface", "p2sgrad"])
def test_labels_out_of_range_and_references_are_clear_errors(name):
  obj = objectives.make(name)
  params = obj.init(jax.random.key(0), num_classes=3, dim=D)
  e = jnp.asarray(batch(0, d=D))
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):   # C, not C * K
    obj.apply(params, e, jnp.asarray(LABELS))
  # labels closed over by a jitted loss are concrete: checked the same, not a tracer error
  closed = jnp.asarray(LABELS)
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
    jax.jit(lambda e: obj.apply(params, e, closed)[0])(e)
  in_range = closed % 3
  assert np.isfinite(float(jax.jit(lambda e: obj.apply(params, e, in_range)[0])(e)))
  refs = objectives.References(e, jnp.asarray(LABELS), jnp.ones((12, 12), bool))
  with pytest.raises(ValueError, match="memory.size=0"):
    obj.apply(params, e, jnp.asarray(LABELS) % 3, references=refs)


@pytest.mark.parametrize("name", ["normalized_softmax", "cosface", "arcface",
                                  "subcenter_arcface", "softtriple", "large_margin_softmax",
                                  "sphereface", "p2sgrad"])
def test_bf16_and_one_trace_per_shape(name):
  support.check_apply_traces_once_per_shape(name)
  obj = objectives.make(name)
  w = obj.init(jax.random.key(3), num_classes=NUM_CLASSES, dim=D)["proxies"]
  e = batch(4, d=D)
  loss, aux, _, ge = run(name, {"proxies": w}, jnp.asarray(e, jnp.bfloat16), LABELS)
  assert loss.dtype == jnp.float32 and ge.dtype == jnp.bfloat16
  assert np.all(np.isfinite(np.asarray(ge, np.float32)))
  want = run(name, {"proxies": w}, np.asarray(jnp.asarray(e, jnp.bfloat16), np.float32), LABELS)[0]
  np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
def test_multiplicative_margin_is_continuous_decreasing_and_cos_m_theta_below_pi_over_m(m):
  """psi(theta) = (-1)^k cos(m theta) - 2k (L-Softmax eq. 6) from the Chebyshev polynomial:
  cos(m theta) on [0, pi/m], continuous at every k pi / m, decreasing over [0, pi], psi = cos
  for m = 1, and a finite gradient at cos = +-1."""
  from dml_jax.objectives import _softmax  # pylint: disable=import-outside-toplevel
  theta = np.linspace(0.0, math.pi, 2001)
  psi = np.asarray(_softmax.multiple_angle_target(jnp.asarray(np.cos(theta), jnp.float32), m),
                   np.float64)
  k = np.floor(theta / (math.pi / m))
  want = (-1.0) ** k * np.cos(m * theta) - 2 * k
  inner = np.abs(theta * m / math.pi - np.round(theta * m / math.pi)) > 1e-3   # away from k pi/m
  np.testing.assert_allclose(psi[inner], want[inner], atol=2e-4)
  assert np.all(np.diff(psi) <= 1e-4), "psi must decrease in theta"
  assert np.max(np.abs(np.diff(psi))) < 0.02 * m, "psi jumps at a k pi / m"
  if m == 1:
    np.testing.assert_allclose(psi, np.cos(theta), atol=1e-6)
  g = jax.grad(lambda c: jnp.sum(_softmax.multiple_angle_target(c, m)))(
      jnp.asarray([1.0, -1.0, 0.3], jnp.float32))
  assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.parametrize("name", ["large_margin_softmax", "sphereface", "p2sgrad"])
def test_an_embedding_on_its_class_weight_has_finite_gradients(name):
  # cos = 1 exactly (the arccos of k has an infinite derivative there; k is a constant)
  e = batch(3, d=D, normalize=False)
  w = np.random.default_rng(4).normal(size=(NUM_CLASSES, D)).astype(np.float32)
  e[0] = 2.0 * w[LABELS[0]]
  _, _, gp, ge = run(name, {"proxies": jnp.asarray(w)}, e, LABELS)
  assert np.all(np.isfinite(np.asarray(ge))) and np.all(np.isfinite(np.asarray(gp["proxies"])))


def test_sphereface_ignores_the_class_weights_lengths_and_l_softmax_does_not():
  e = batch(5, d=D, normalize=False)
  w = np.random.default_rng(6).normal(size=(NUM_CLASSES, D)).astype(np.float32)
  for name, same in (("sphereface", True), ("large_margin_softmax", False)):
    a = run(name, {"proxies": jnp.asarray(w)}, e, LABELS, margin=2)[0]
    b = run(name, {"proxies": jnp.asarray(3.0 * w)}, e, LABELS, margin=2)[0]
    assert np.isclose(float(a), float(b), rtol=1e-5) == same, name


def test_multiplicative_margin_must_be_an_integer():
  for name in ("large_margin_softmax", "sphereface"):
    with pytest.raises(ValueError, match=r"margin must be an int >= 1, got 0.35"):
      objectives.make(name, margin=0.35)
