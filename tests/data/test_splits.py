"""data.splits.relabel: training by another label set of a split."""

import numpy as np
import pytest

from dml_jax.data import splits as splits_lib


def _split():
  images = np.arange(6 * 2 * 2, dtype=np.float32).reshape(6, 2, 2, 1)
  return splits_lib.Split(images=images, labels=np.array([0, 0, 0, 1, 1, 1]),
                          label_sets={"letter": np.array([7, 3, 7, 12, 30, 12]),
                                      "class": np.array([4, 4, 4, 9, 9, 9])},
                          name="toy:train")


def test_relabel_ranks_the_label_set_and_keeps_the_rest():
  split = _split()
  out = splits_lib.relabel(split, "letter")
  np.testing.assert_array_equal(out.labels, [1, 0, 1, 2, 3, 2])
  assert out.labels.dtype == np.int32 and out.num_classes == 4
  assert out.images is split.images and out.name == "toy:train"
  assert set(out.label_sets) == {"letter", "class"}
  np.testing.assert_array_equal(out.label_sets["letter"], split.label_sets["letter"])
  np.testing.assert_array_equal(split.labels, [0, 0, 0, 1, 1, 1])   # the input is unchanged


def test_relabel_by_nothing_is_the_split_itself():
  split = _split()
  assert splits_lib.relabel(split, "") is split


def test_relabel_names_the_label_sets_a_split_has():
  with pytest.raises(ValueError, match=r"^config.data.train_label_set='digit' is not a label "
                     r"set of 'toy:train'; it has: class, letter.$"):
    splits_lib.relabel(_split(), "digit", key="config.data.train_label_set")
  with pytest.raises(ValueError, match=r"^label_set must be a label set's name \(a string\), "
                     r"got 3.$"):
    splits_lib.relabel(_split(), 3)
