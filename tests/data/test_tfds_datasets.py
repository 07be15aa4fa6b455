"""TFDS datasets through the real loading path under ``tfds.testing.mock_data``: split
protocols, relabelling, label sets, lazy decoding, and the errors for bad input."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from dml_jax import data
from dml_jax.data import tfds_datasets
from tfds_mock import SOP_MOCK_CLASSES, mock_data, mock_tfds

N = 96
IMAGE = dict(image_size=12, resize_size=14)


def load(name, **kwargs):
  with mock_data(N):
    return data.load(name, **{**IMAGE, **kwargs})


def raw_labels(builder, split, key):
  with mock_data(N):
    source = tfds.data_source(builder, split=split, download=False)
    return np.array([int(source[i][key]) for i in range(len(source))])


def check_contiguous_relabelling(split, original):
  """``labels`` is the rank of the original label among the split's classes."""
  classes = np.unique(original)
  np.testing.assert_array_equal(split.labels, np.searchsorted(classes, original))


@pytest.mark.parametrize("name,builder,train_range,test_range", [
    ("cub", "caltech_birds2011", (0, 99), (100, 199)),
    ("cars196", "cars196", (0, 97), (98, 195)),
    ("flowers102", "oxford_flowers102", (0, 50), (51, 101)),
])
def test_class_disjoint_split_over_merged_tfds_splits(name, builder, train_range, test_range):
  splits = load(name)
  assert set(splits) == {"train", "test"}
  merged = np.concatenate([raw_labels(builder, s, "label")
                           for s in tfds_datasets.TFDS_DATASETS[name].splits])
  for split, (lo, hi) in (("train", train_range), ("test", test_range)):
    s = splits[split]
    original = s.label_sets["class"]
    assert original.min() >= lo and original.max() <= hi
    # Every example of the merged TFDS splits with a class in range is there, in order.
    np.testing.assert_array_equal(original, merged[(merged >= lo) & (merged <= hi)])
    check_contiguous_relabelling(s, original)
  assert len(splits["train"]) + len(splits["test"]) == len(merged)


def test_sop_keeps_the_official_splits_and_super_classes():
  splits = load("sop")
  for split in ("train", "test"):
    s = splits[split]
    np.testing.assert_array_equal(s.label_sets["class"],
                                  raw_labels("stanford_online_products", split, "class_id"))
    np.testing.assert_array_equal(
        s.label_sets["super_class"],
        raw_labels("stanford_online_products", split, "super_class_id"))
    check_contiguous_relabelling(s, s.label_sets["class"])


def test_sop_mock_with_few_classes_has_positives():
  with mock_tfds(num_examples=N):
    splits = data.load("sop", **IMAGE)
  assert splits["test"].num_classes == SOP_MOCK_CLASSES


def test_omniglot_trains_on_alphabets_and_evaluates_characters():
  splits = load("omniglot")
  train, test = splits["train"], splits["test"]
  np.testing.assert_array_equal(train.label_sets["alphabet"],
                                raw_labels("omniglot", "train", "alphabet"))
  np.testing.assert_array_equal(test.label_sets["character"],
                                raw_labels("omniglot", "test", "label"))
  check_contiguous_relabelling(train, train.label_sets["alphabet"])   # background: alphabets
  check_contiguous_relabelling(test, test.label_sets["character"])    # evaluation: characters
  assert {"alphabet", "character"} <= set(test.label_sets)


def test_mnist_evenodd_protocol():
  splits = load("mnist_evenodd")
  train_digits = raw_labels("mnist", "train", "label")
  test_digits = raw_labels("mnist", "test", "label")
  train, test, val = splits["train"], splits["test"], splits["val"]
  np.testing.assert_array_equal(train.label_sets["digit"], train_digits[train_digits <= 5])
  np.testing.assert_array_equal(train.labels, train.label_sets["digit"] % 2)   # even / odd
  np.testing.assert_array_equal(test.label_sets["digit"], test_digits[test_digits >= 6])
  check_contiguous_relabelling(test, test.label_sets["digit"])
  np.testing.assert_array_equal(val.label_sets["digit"], test_digits[test_digits <= 5])
  check_contiguous_relabelling(val, val.label_sets["digit"])


def test_images_are_decoded_lazily_to_the_eval_transform():
  splits = load("cub", channels=3)
  train = splits["train"]
  assert isinstance(train.images, data.LazyImages)
  batch = train.images[np.array([0, 3, 1])]
  assert batch.shape == (3, 12, 12, 3) and batch.dtype == np.float32
  # Row 3 of the batch is the eval transform of the record the split points at.
  np.testing.assert_array_equal(batch[1], train.images.options.eval_transform(
      train.images.record(3)))


def test_grey_mnist_as_one_channel():
  splits = load("mnist_evenodd", channels=1, mean=(0.0,), std=(1.0,))
  x = splits["train"].images[np.arange(4)]
  assert x.shape == (4, 12, 12, 1)
  assert 0.0 <= x.min() and x.max() <= 1.0


def test_unknown_dataset_and_options():
  with pytest.raises(ValueError, match="Unknown dataset 'cub2'.*cub"):
    data.load("cub2")
  with pytest.raises(ValueError, match="bad options.*image_sizes"):
    data.load("cub", image_sizes=3)


def test_split_names_are_validated_although_the_mock_accepts_any():
  with mock_data(4):
    with pytest.raises(ValueError, match="no split 'validation'.*train, test"):
      tfds_datasets.open_source("caltech_birds2011", "validation",
                                known_splits=("train", "test"))


def test_unprepared_dataset_names_the_prepare_command(tmp_path):
  with pytest.raises(data.DatasetNotPreparedError) as e:
    data.load("cub", data_dir=str(tmp_path), **IMAGE)
  message = str(e.value)
  assert "tfds build caltech_birds2011 --file_format=array_record" in message
  assert f"--data_dir={tmp_path}" in message
  assert not (tmp_path / "downloads").exists()  # nothing was downloaded
  # the other route: the official files, and how to get them
  assert ("Or read its official files instead, with the option root=ROOT (config key "
          "data.options.root): CUB-200-2011 comes from") in message
  assert "python -m dml_jax.data.prepare cub --root=ROOT --download" in message


def test_cars_error_mentions_the_manual_route(tmp_path):
  with pytest.raises(data.DatasetNotPreparedError, match="image-list loader"):
    data.load("cars196", data_dir=str(tmp_path), **IMAGE)


def test_bad_image_options():
  with pytest.raises(ValueError, match="resize_size"):
    load("cub", image_size=16, resize_size=8)
