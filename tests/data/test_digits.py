"""Tests of the Split container, class_split and the digits even/odd dataset."""

import dataclasses

import numpy as np
import pytest
from sklearn.datasets import load_digits as sk_load_digits

from dml_jax import data
from dml_jax.data import digits


@pytest.fixture(scope="module")
def sk():
  d = sk_load_digits()
  return d.images, d.target


@pytest.fixture(scope="module")
def evenodd():
  return data.load_digits_evenodd()


def test_evenodd_shapes_dtypes_and_range(evenodd):
  train, test = evenodd["train"], evenodd["test"]
  for s in (train, test):
    assert s.images.dtype == np.float32 and s.images.shape[1:] == (8, 8, 1)
    assert s.labels.dtype == np.int32 and s.labels.shape == (len(s),)
    assert s.images.min() == 0.0 and s.images.max() == 1.0
    assert set(s.label_sets) == {"digit", "parity"}
  # Every digit of the 1797 lands in exactly one split.
  assert len(train) + len(test) == 1797
  assert set(np.unique(train.label_sets["digit"])) == {0, 1, 2, 3, 4, 5}
  assert set(np.unique(test.label_sets["digit"])) == {6, 7, 8, 9}


def test_evenodd_labels(evenodd, sk):
  train, test = evenodd["train"], evenodd["test"]
  np.testing.assert_array_equal(train.labels, train.label_sets["digit"] % 2)
  np.testing.assert_array_equal(train.label_sets["parity"], train.labels)
  assert train.num_classes == 2
  # Documented test mapping 6, 7, 8, 9 -> 0, 1, 2, 3.
  np.testing.assert_array_equal(test.labels, test.label_sets["digit"] - 6)
  np.testing.assert_array_equal(test.label_sets["parity"], test.label_sets["digit"] % 2)
  assert test.num_classes == 4
  # Images and digits are scikit-learn's, in order, scaled by 1/16.
  sk_images, sk_target = sk
  keep = sk_target >= 6
  np.testing.assert_array_equal(test.label_sets["digit"], sk_target[keep])
  np.testing.assert_allclose(test.images[..., 0], sk_images[keep] / 16.0, rtol=1e-6)


def test_evenodd_custom_digits_mapping():
  s = data.load_digits_evenodd(train_digits=(3, 0), test_digits=(9, 7))
  np.testing.assert_array_equal(np.unique(s["train"].label_sets["digit"]), [0, 3])
  np.testing.assert_array_equal(s["train"].labels, s["train"].label_sets["digit"] % 2)
  # Test labels = rank in sorted(test_digits): 7 -> 0, 9 -> 1.
  np.testing.assert_array_equal(s["test"].labels, (s["test"].label_sets["digit"] == 9))


@pytest.mark.parametrize("kwargs, match", [
    (dict(train_digits=(0, 1, 2), test_digits=(2, 3)), r"overlap in \[2\]"),
    (dict(train_digits=(0, 1, 10)), r"\[10\].*0\.\.9"),
    (dict(test_digits=(-1, 7)), r"\[-1\].*0\.\.9"),
    (dict(test_digits=()), "test_digits is empty"),
    (dict(train_digits=()), "train_digits is empty"),
    (dict(train_digits=(0, 2, 4)), "one parity"),
    (dict(train_digits=(0, 1, 1)), r"\[1\] more than once"),
])
def test_evenodd_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    data.load_digits_evenodd(**kwargs)


def test_class_split_remaps_and_keeps_original_labels():
  labels = np.array([5, 2, 9, 2, 5, 9, 7, 7, 1])
  images = np.arange(len(labels), dtype=np.float32).reshape(-1, 1, 1, 1)
  s = data.class_split(images, labels, train_classes=(9, 2), test_classes=(5, 7))
  # Order kept, labels = rank in the sorted class list, original in label_sets['class'].
  np.testing.assert_array_equal(s["train"].images.ravel(), [1, 2, 3, 5])
  np.testing.assert_array_equal(s["train"].label_sets["class"], [2, 9, 2, 9])
  np.testing.assert_array_equal(s["train"].labels, [0, 1, 0, 1])
  np.testing.assert_array_equal(s["test"].labels, [0, 0, 1, 1])
  assert 1 not in s["train"].label_sets["class"] and 1 not in s["test"].label_sets["class"]


def test_class_split_rejects_small_or_missing_classes():
  labels = np.array([0, 0, 1, 1, 2])
  images = np.zeros((5, 2, 2, 1), np.float32)
  with pytest.raises(ValueError, match=r"\{2: 1\}"):
    data.class_split(images, labels, train_classes=(0, 1), test_classes=(2,))
  with pytest.raises(ValueError, match=r"\{3: 0\}"):
    data.class_split(images, labels, train_classes=(0,), test_classes=(1, 3))


def _split(**overrides):
  kwargs = dict(images=np.zeros((4, 2, 2, 1)), labels=np.array([0, 1, 1, 0]),
                label_sets={"x": np.array([7, 7, 8, 9])}, name="toy")
  kwargs.update(overrides)
  return data.Split(**kwargs)


def test_split_converts_dtypes_and_is_read_only():
  s = _split(images=np.zeros((4, 2, 2, 1), np.uint8), labels=np.array([0, 1, 1, 0], np.int64))
  assert s.images.dtype == np.float32 and s.labels.dtype == np.int32
  assert s.label_sets["x"].dtype == np.int32
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.labels = np.zeros(4, np.int32)
  with pytest.raises(TypeError):
    s.label_sets["y"] = s.labels


@pytest.mark.parametrize("overrides, match", [
    (dict(images=np.zeros((4, 2, 2))), "'toy'.*rank 4"),
    (dict(images=np.zeros((0, 2, 2, 1)), labels=np.zeros(0, int), label_sets={}), "'toy' is empty"),
    (dict(labels=np.array([0, 1, 1])), r"'toy'.*labels must have shape \[4\]"),
    (dict(labels=np.array([0.0, 1.0, 1.0, 0.0])), "'toy'.*integers"),
    (dict(labels=np.array([0, 2, 2, 0])), "'toy'.*contiguous"),
    (dict(label_sets={"x": np.array([1, 2])}), r"'toy'.*label_sets\['x'\]"),
])
def test_split_validation(overrides, match):
  with pytest.raises(ValueError, match=match):
    _split(**overrides)


def test_registry_load():
  assert data.DATASETS["digits_evenodd"] is digits.load_digits_evenodd
  s = data.load("digits_evenodd", test_digits=(8, 9))
  assert set(np.unique(s["test"].label_sets["digit"])) == {8, 9}
  with pytest.raises(ValueError, match="'mnist_digits'.*digits_evenodd"):
    data.load("mnist_digits")
