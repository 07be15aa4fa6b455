"""Tuplet margin, angular and N-pair losses (dml_jax/objectives/_tuples.py) against numpy loops
over explicit (anchor, positive, negative) tuples: values and gradients, anchors without a
positive or a negative, bf16, one trace per shape."""

import functools
import math

import numpy as np
import pytest

import objective_support as support
from oracles import LABELS, fd_grad, np_similarity
from oracles import random_batch as batch

run = functools.partial(support.run, rng=None)


def _pos_pairs(labels):
  return [(a, p) for a in range(len(labels)) for p in range(len(labels))
          if a != p and labels[a] == labels[p]]


def _negs(labels, a):
  return [n for n in range(len(labels)) if labels[n] != labels[a]]


def oracle_tuplet(e, labels, margin, scale):
  s = np_similarity(e)
  out = []
  for a, p in _pos_pairs(labels):
    cos_ap = math.cos(math.acos(min(1.0, s[a, p])) - margin)
    out.append(math.log1p(sum(math.exp(scale * (s[a, n] - cos_ap)) for n in _negs(labels, a))))
  return float(np.mean(out))


def oracle_angular(e, labels, alpha):
  x = np.asarray(e, np.float64)
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  t2 = math.tan(math.radians(alpha)) ** 2
  out = []
  for a, p in _pos_pairs(labels):
    f = [4 * t2 * (x[a] + x[p]) @ x[n] - 2 * (1 + t2) * x[a] @ x[p] for n in _negs(labels, a)]
    out.append(math.log1p(sum(math.exp(v) for v in f)))
  return float(np.mean(out))


def oracle_npairs(e, labels, kind):
  s = np_similarity(e, kind)
  pairs = []
  for c in sorted(set(labels.tolist())):
    members = [i for i, y in enumerate(labels) if y == c]
    if len(members) >= 2:
      pairs.append((members[0], members[1]))
  out = []
  for i, (a, p) in enumerate(pairs):
    logits = np.array([s[a, q] for _, q in pairs])
    out.append(np.logaddexp.reduce(logits) - logits[i])
  return float(np.mean(out))


CASES = [("tuplet_margin", {"margin": 0.1, "scale": 64.0}, oracle_tuplet),
         ("tuplet_margin", {"margin": 0.3, "scale": 8.0}, oracle_tuplet),
         ("angular", {"alpha": 40.0}, oracle_angular),
         ("angular", {"alpha": 50.0}, oracle_angular),
         ("npairs", {"similarity": "cosine"}, oracle_npairs),
         ("npairs", {"similarity": "dot"}, oracle_npairs)]


@pytest.mark.parametrize("name,hp,oracle", CASES,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(CASES)])
@pytest.mark.parametrize("labels", [LABELS, np.array([2, 0, 2, 2, 1, 0, 1, 2, 3, 0, 5, 4])],
                         ids=["grouped", "shuffled"])
def test_matches_oracle_values_and_gradients(name, hp, oracle, labels):
  labels = labels.astype(np.int32)
  e = batch(21, d=4, normalize=False)
  loss, aux, grad = run(name, e, labels, **hp)
  f = lambda x: oracle(x, labels, *hp.values())
  np.testing.assert_allclose(float(loss), f(e), rtol=1e-5, atol=1e-6)
  g = fd_grad(f, e)
  np.testing.assert_allclose(np.asarray(grad), g, rtol=1e-3,
                             atol=1e-5 * max(1.0, float(np.max(np.abs(g)))))
  assert 0.0 < float(aux["valid_fraction"]) <= 1.0


@pytest.mark.parametrize("name", ["tuplet_margin", "angular", "npairs"])
def test_bf16_one_trace_and_no_nan_without_pairs(name):
  support.check_pair_bf16(name, rng=None)
  support.check_apply_traces_once_per_shape(name)
  support.check_pair_zero_loss_without_valid_anchor(name, rng=None)


def test_angular_compacted_positives_equal_the_dense_form(monkeypatch):
  """The O(B P N) path on the positives compacted to [B, P] gives the dense [B, N] x [N, N]
  form's loss and gradient (the dense form forced by offering only P = 1), in bucket 8 and in
  bucket 32 with a singleton class (both batches of 40: one program per form)."""
  import jax  # pylint: disable=import-outside-toplevel
  from dml_jax import objectives  # pylint: disable=import-outside-toplevel
  from dml_jax.objectives import _tuples  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(3)
  all_labels = [rng.permutation(np.repeat(np.arange(len(sizes)), sizes)).astype(np.int32)
                for sizes in ([8, 8, 8, 8, 8], [21, 5, 1, 9, 4])]
  e = batch(5, b=40, d=6, normalize=False)

  def loss_and_grad():
    f = jax.jit(jax.value_and_grad(lambda x, y: objectives.make("angular", alpha=45.0).apply(
        {}, x, y)[0]))
    return [f(e, labels) for labels in all_labels]

  compacted = loss_and_grad()
  monkeypatch.setattr(_tuples, "COMPACT_SIZES", (1,))
  dense = loss_and_grad()
  for (loss, grad), (dense_loss, dense_grad) in zip(compacted, dense):
    np.testing.assert_allclose(float(loss), float(dense_loss), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(dense_grad), rtol=1e-4,
                               atol=1e-6 * float(np.max(np.abs(dense_grad))))


def test_angular_hessian_equals_the_dense_form(monkeypatch):
  """``jax.hessian`` (forward over reverse) differentiates the compacted path's custom VJP
  and gives the dense form's Hessian."""
  import jax  # pylint: disable=import-outside-toplevel
  from dml_jax import objectives  # pylint: disable=import-outside-toplevel
  from dml_jax.objectives import _tuples  # pylint: disable=import-outside-toplevel
  labels = np.arange(8, dtype=np.int32) % 2
  e = batch(4, b=8, d=4, normalize=False)
  hessian = lambda: np.asarray(jax.jit(jax.hessian(
      lambda x: objectives.make("angular").apply({}, x, labels)[0]))(e))
  compacted = hessian()
  monkeypatch.setattr(_tuples, "COMPACT_SIZES", (1,))
  dense = hessian()
  np.testing.assert_allclose(compacted, dense, rtol=1e-4, atol=1e-5 * np.max(np.abs(dense)))


@pytest.mark.parametrize("name", ["tuplet_margin", "angular", "npairs"])
def test_batch_of_one_gives_zero(name):
  """A batch of one example has no pair: loss 0 and a zero gradient (not a traceback)."""
  loss, _, grad = run(name, batch(2, b=1, d=4, normalize=False), np.zeros(1, np.int32))
  assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)
