"""The new-objective example of docs/extending.md ("A new objective"), run as written: it
registers, builds with ``objectives.make``, matches a numpy loop over the pairs in value and
gradient, takes references, and one gradient step lowers its loss."""

import os
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dml_test_support import ROOT
from oracles import LABELS, fd_grad
from oracles import random_batch as batch
from dml_jax import objectives
from dml_jax.objectives import _registry

NAME = "sigmoid_pair"


def example_code() -> str:
  """The first python block of the section "A new objective" of docs/extending.md."""
  with open(os.path.join(ROOT, "docs", "extending.md"), encoding="utf-8") as f:
    text = f.read()
  section = text.split("## A new objective", 1)[1].split("\n## ", 1)[0]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(name="registered")
def fixture_registered():
  """Runs the example as a user's module; leaves the registry as it was."""
  module = types.ModuleType("docs_extending_example")
  try:
    exec(compile(example_code(), "docs/extending.md", "exec"), module.__dict__)  # pylint: disable=exec-used
    yield module
  finally:
    _registry.REGISTRY.pop(NAME, None)
    _registry.SUPPORT.pop(NAME, None)


def oracle(e, labels, scale, bias):
  """Mean over the ordered pairs i != j of softplus(-z_ij scale (S_ij - bias)), float64."""
  e = np.asarray(e, np.float64)
  u = e / np.linalg.norm(e, axis=1, keepdims=True)
  terms = []
  for i in range(len(labels)):
    for j in range(len(labels)):
      if i != j:
        z = 1.0 if labels[i] == labels[j] else -1.0
        terms.append(np.logaddexp(0.0, -z * scale * (u[i] @ u[j] - bias)))
  return float(np.mean(terms))


def test_the_example_registers_and_matches_a_loop_oracle(registered):
  assert registered.sigmoid_pair is objectives.REGISTRY[NAME]
  assert NAME in objectives.names()
  assert objectives.support(NAME) == objectives.Support(references=True)
  obj = objectives.make(NAME, scale=5.0)
  assert obj.hparams == {"scale": 5.0, "bias": 0.5, "similarity": "cosine"}
  assert obj.init(jax.random.key(0), num_classes=6, dim=4) == {}
  with pytest.raises(ValueError, match="scale"):
    objectives.make(NAME, scale=0.0)
  with pytest.raises(ValueError, match="similarity"):
    objectives.make(NAME, similarity="cosines")
  with pytest.raises(ValueError, match="already registered"):
    objectives.register(NAME)(registered.sigmoid_pair)

  e, labels = batch(4, d=4, normalize=False), jnp.asarray(LABELS)
  value_and_grad = jax.jit(jax.value_and_grad(
      lambda x, refs=None: obj.apply({}, x, labels, references=refs), has_aux=True))
  (loss, aux), grad = value_and_grad(jnp.asarray(e))
  f = lambda x: oracle(x, LABELS, 5.0, 0.5)
  np.testing.assert_allclose(float(loss), f(e), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), fd_grad(f, e), rtol=1e-3, atol=1e-5)
  assert float(aux["valid_fraction"]) == 1.0 and 0 < float(aux["active_fraction"]) <= 1

  refs = objectives.References(jnp.asarray(e), labels, ~jnp.eye(len(LABELS), dtype=bool))
  np.testing.assert_allclose(float(value_and_grad(jnp.asarray(e), refs)[0][0]), float(loss),
                             rtol=1e-6)

  stepped = jnp.asarray(e) - 0.1 * grad     # one step of gradient descent on the embeddings
  assert float(value_and_grad(stepped)[0][0]) < float(loss)
