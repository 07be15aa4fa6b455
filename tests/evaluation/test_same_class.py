"""The best item of each query's class (evaluation/same_class.py) against a loop oracle."""

import numpy as np
import pytest

from dml_jax.evaluation import same_class
from oracles import best_relevant_oracle


@pytest.mark.parametrize("gallery", [False, True])
@pytest.mark.parametrize("width", [4, 64])   # classes spanning several products / one each
def test_best_relevant_matches_oracle(gallery, width):
  rng = np.random.default_rng(width + gallery)
  q = rng.integers(-2, 3, size=(40, 3)).astype(np.float32)   # ties everywhere
  g = rng.integers(-2, 3, size=(33, 3)).astype(np.float32) if gallery else None
  qc = rng.integers(0, 6, size=40).astype(np.int32)
  qc[0] = 9   # a class with no other item: (+inf, -1)
  gc = rng.integers(0, 6, size=33).astype(np.int32) if gallery else qc
  for kind in ("dot", "neg_sq_euclidean"):
    value, index = same_class.best_relevant(q, qc, g, gc, kind=kind, width=width)
    gg = q if g is None else g
    s = (q @ gg.T if kind == "dot" else
         -((q[:, None, :] - gg[None, :, :]) ** 2).sum(-1)).astype(np.float64)
    want_value, want_index = best_relevant_oracle(s, qc, gc, exclude_self=not gallery)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_array_equal(value, want_value)
    assert index[0] == -1 and value[0] == np.inf


def test_best_relevant_declines_large_classes():
  # Two classes: their products would be half of the whole matrix, above MAX_CLASS_WORK
  # (and above MIN_CLASS_WORK).
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2048, 8)).astype(np.float32)
  codes = (np.arange(2048) % 2).astype(np.int32)
  assert same_class.best_relevant(x, codes, None, codes, kind="dot", width=64) is None
