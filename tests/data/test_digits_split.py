"""The all-digit class-disjoint loader ('digits') added for the sweeps."""

import numpy as np
import pytest

from dml_jax import data as data_lib


def test_load_digits_split():
  splits = data_lib.load("digits", train_digits=(3, 1, 2), test_digits=(9, 7))
  train, test = splits["train"], splits["test"]
  assert sorted(np.unique(train.label_sets["digit"]).tolist()) == [1, 2, 3]
  np.testing.assert_array_equal(train.labels, np.searchsorted([1, 2, 3],
                                                              train.label_sets["digit"]))
  np.testing.assert_array_equal(test.labels, (test.label_sets["digit"] == 9).astype(int))
  np.testing.assert_array_equal(test.label_sets["parity"], test.label_sets["digit"] % 2)
  default = data_lib.load("digits")
  assert default["train"].num_classes == 8 and default["test"].num_classes == 2
  assert len(default["train"]) + len(default["test"]) == 1797
  with pytest.raises(ValueError, match="0..9"):
    data_lib.load("digits", train_digits=(0, 10), test_digits=(1,))
  with pytest.raises(ValueError, match="overlap"):
    data_lib.load("digits", train_digits=(0, 1), test_digits=(1, 2))
