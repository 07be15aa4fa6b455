"""Reference sets (``objectives.References``, dml_jax/objectives/_common.py): every pair- and
triplet-based objective given the batch itself as references (self pairs masked) returns
exactly its batch loss and gradient; the others refuse one; bad reference shapes are clear
errors. Which objectives take references is their registered support
(``objectives.support(name).references``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from objective_support import D, NUM_CLASSES
from oracles import LABELS
from oracles import random_batch as batch
from dml_jax import objectives

WITH_REFERENCES = [n for n in objectives.names() if objectives.support(n).references]
NO_REFERENCES = [n for n in objectives.names() if not objectives.support(n).references]


@pytest.mark.parametrize("name", WITH_REFERENCES)
def test_batch_as_references_equals_the_batch_loss(name):
  obj = objectives.make(name)
  params = obj.init(jax.random.key(0), num_classes=NUM_CLASSES, dim=D)
  key = jax.random.key(3)

  def both(e, labels):
    plain = obj.apply(params, e, labels, rng=key)[0]
    refs = objectives.References(e, labels, ~jnp.eye(len(LABELS), dtype=bool))
    return plain, obj.apply(params, e, labels, rng=key, references=refs)[0]

  def values_and_grads(e, labels):   # labels traced: no eager label-range check
    grad = lambda i: jax.grad(lambda x: both(x, labels)[i])(e)
    return both(e, labels), (grad(0), grad(1))

  (l1, l2), (g1, g2) = jax.jit(values_and_grads)(jnp.asarray(batch(11, d=D)), jnp.asarray(LABELS))
  np.testing.assert_allclose(float(l2), float(l1), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(np.asarray(g2), np.asarray(g1), rtol=1e-5, atol=1e-7)


def test_bad_references_are_clear_errors():
  obj = objectives.make("contrastive")
  e, y = jnp.asarray(batch(0, d=D)), jnp.asarray(LABELS)
  with pytest.raises(ValueError, match=r"references must be \(embeddings \[N, 4\]"):
    obj.apply({}, e, y, references=objectives.References(e[:, :2], y, jnp.ones((12, 12), bool)))
  with pytest.raises(ValueError, match="mask boolean"):
    obj.apply({}, e, y, references=objectives.References(e, y, jnp.ones((12, 12))))


@pytest.mark.parametrize("name", NO_REFERENCES)
def test_an_objective_without_reference_support_refuses_them(name):
  obj = objectives.make(name)
  params = obj.init(jax.random.key(0), num_classes=NUM_CLASSES, dim=D)
  e, y = jnp.asarray(batch(0, d=D)), jnp.asarray(LABELS)
  refs = objectives.References(e, y, ~jnp.eye(len(LABELS), dtype=bool))
  with pytest.raises(ValueError, match="takes no reference set.*memory.size=0"):
    obj.apply(params, e, y, rng=jax.random.key(0), references=refs)
