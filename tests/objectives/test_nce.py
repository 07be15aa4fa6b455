"""NT-Xent and SupCon (dml_jax/objectives/_nce.py) against numpy loops over explicit pairs:
values and gradients, anchors without positives, a batch without negatives."""

import functools

import numpy as np
import pytest

import objective_support as support
from oracles import LABELS, fd_grad, np_similarity
from oracles import random_batch as batch

run = functools.partial(support.run, rng=None)


def oracle_ntxent(e, labels, t):
  s = np_similarity(e)
  terms = []
  for a in range(len(labels)):
    negs = [n for n in range(len(labels)) if labels[n] != labels[a]]
    for p in range(len(labels)):
      if p != a and labels[p] == labels[a]:
        num = np.exp(s[a, p] / t)
        terms.append(-np.log(num / (num + sum(np.exp(s[a, n] / t) for n in negs))))
  return float(np.mean(terms)) if terms else 0.0


def oracle_supcon(e, labels, t):
  s = np_similarity(e)
  if not any(labels[i] != labels[j] for i in range(len(labels)) for j in range(len(labels))):
    return 0.0
  out = []
  for a in range(len(labels)):
    others = [j for j in range(len(labels)) if j != a]
    pos = [p for p in others if labels[p] == labels[a]]
    if not pos:
      continue
    denom = sum(np.exp(s[a, j] / t) for j in others)
    value = -np.mean([np.log(np.exp(s[a, p] / t) / denom) for p in pos])
    if value > 0:   # PML's AvgNonZeroReducer: anchors whose term is non-zero
      out.append(value)
  return float(np.mean(out)) if out else 0.0


ORACLES = {"ntxent": oracle_ntxent, "supcon": oracle_supcon}


@pytest.mark.parametrize("name,t", [("ntxent", 0.07), ("ntxent", 0.5), ("supcon", 0.1),
                                    ("supcon", 0.5)])
@pytest.mark.parametrize("labels", [LABELS, np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2])],
                         ids=["singletons", "two_big_classes"])
def test_matches_oracle_values_and_gradients(name, t, labels):
  e = batch(3, d=4, normalize=False)
  loss, aux, grad = run(name, e, labels.astype(np.int32), temperature=t)
  oracle = lambda x: ORACLES[name](x, labels, t)
  np.testing.assert_allclose(float(loss), oracle(e), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(grad), fd_grad(oracle, e), rtol=1e-4, atol=1e-5)
  assert 0.0 < float(aux["valid_fraction"]) <= 1.0


@pytest.mark.parametrize("name", ["ntxent", "supcon"])
def test_one_class_batch_gives_zero_loss_and_finite_gradient(name):
  e = batch(4, d=4)
  loss, aux, grad = run(name, e, np.zeros(12, np.int32))
  assert float(loss) == 0.0 and np.all(np.isfinite(np.asarray(grad)))
  assert float(aux["mean_s_an"]) == 0.0


def test_supcon_gradient_pulls_positives_together():
  """A step against the gradient raises the anchors' mean positive similarity."""
  e = batch(5, d=4)
  _, aux, grad = run("supcon", e, LABELS)
  _, aux2, _ = run("supcon", e - 0.05 * np.asarray(grad), LABELS)
  assert float(aux2["mean_s_ap"]) > float(aux["mean_s_ap"])


@pytest.mark.parametrize("name", ["ntxent", "supcon"])
def test_bf16_traces_once_and_permutation_invariant(name):
  rng = None
  support.check_pair_bf16(name, rng=rng)
  support.check_apply_traces_once_per_shape(name)
  support.check_invariant_to_batch_permutation(name, rng=rng)
