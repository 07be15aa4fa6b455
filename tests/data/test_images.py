"""Tests of data.images: ImageOptions, LazyImages (array-like, decoded on access) and their use
as the images of a Split / class_split."""

import dataclasses
import io
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from PIL import Image

from dml_jax import data
from dml_jax.data import augment, images

OPTIONS = images.ImageOptions(image_size=12, resize_size=14)


def _records(n=10, seed=0):
  """n uint8 records of varied (non-square) sizes, every third one PNG-encoded."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    h, w = int(rng.integers(14, 30)), int(rng.integers(14, 30))
    a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    if i % 3 == 2:
      buf = io.BytesIO()
      Image.fromarray(a).save(buf, "PNG")
      out.append(buf.getvalue())
    else:
      out.append(a)
  return out


class CountingRecords(Sequence):
  """A random-access record source that counts reads (thread-safe)."""

  def __init__(self, records):
    self.records, self.reads, self._lock = records, 0, threading.Lock()

  def __len__(self):
    return len(self.records)

  def __getitem__(self, i):
    with self._lock:
      self.reads += 1
    return self.records[int(i)]


def _expected(records, rows, options=OPTIONS):
  return np.stack([options.eval_transform(records[int(r)]) for r in rows])


# ------------------------------------------------------------------------------------------
# ImageOptions.


def test_image_options_take_one_number_for_mean_and_std_and_name_bad_values():
  """``data.load(name, channels=1, mean=0.1307, std=0.3081)``, as one writes it for MNIST."""
  o = images.ImageOptions(image_size=8, resize_size=8, channels=1, mean=0.1307, std=0.3081)
  assert o.mean == (0.1307,) and o.std == (0.3081,)
  for bad, match in ((dict(mean=None), "mean must be finite numbers"),
                     (dict(std="abc"), "std must be finite numbers"),
                     (dict(mean=[[0.5]]), "mean must be finite numbers"),
                     (dict(std=float("nan")), "std must be finite numbers")):
    with pytest.raises(ValueError, match=match):
      images.ImageOptions(image_size=8, resize_size=8, channels=1, **bad)


def test_image_options_defaults_and_transforms():
  o = images.ImageOptions()
  assert (o.image_size, o.resize_size, o.channels) == (224, 256, 3)
  assert o.mean == augment.IMAGENET_MEAN and o.std == augment.IMAGENET_STD
  o = images.ImageOptions(image_size=8, resize_size=10, channels=1, mean=[0.5], std=np.array([2]))
  assert o.mean == (0.5,) and o.std == (2.0,) and isinstance(o.std[0], float)
  with pytest.raises(dataclasses.FrozenInstanceError):
    o.image_size = 4
  record = _records(1)[0]
  np.testing.assert_array_equal(
      o.eval_transform(record),
      augment.eval_transform(record, image_size=8, resize_size=10, channels=1, mean=(0.5,),
                             std=(2.0,)))
  np.testing.assert_array_equal(
      o.train_transform(record, np.random.default_rng(4), augmentation="pad_crop", pad=2),
      augment.train_transform(record, np.random.default_rng(4), augmentation="pad_crop",
                              image_size=8, resize_size=10, channels=1, mean=(0.5,),
                              std=(2.0,), pad=2))


@pytest.mark.parametrize("kwargs, match", [
    (dict(image_size=0), "image_size must be an int >= 1"),
    (dict(image_size=224, resize_size=200), r"resize_size \(200\) must be >= image_size"),
    (dict(channels=2), "channels must be 1 or 3, got 2"),
    (dict(channels=1), "mean must have 1 or channels=1"),
    (dict(mean=(0.1, 0.2)), "mean must have 1 or channels=3"),
    (dict(std=(1.0, -1.0, 1.0)), "std must be positive"),
])
def test_image_options_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    images.ImageOptions(**kwargs)


# ------------------------------------------------------------------------------------------
# LazyImages.


def test_lazy_images_is_array_like():
  records = _records(10)
  lazy = images.LazyImages(records, OPTIONS, name="toy")
  assert lazy.shape == (10, 12, 12, 3) and len(lazy) == 10
  assert lazy.ndim == 4 and lazy.dtype == np.float32
  assert "toy" in repr(lazy) and "(10, 12, 12, 3)" in repr(lazy)
  grey = images.LazyImages(records, images.ImageOptions(image_size=12, resize_size=14,
                                                        channels=1, mean=(0.5,), std=(0.5,)))
  assert grey.shape == (10, 12, 12, 1) and grey[3].shape == (12, 12, 1)


def test_lazy_indexing_equals_eval_transform_per_record():
  records = _records(10)
  lazy = images.LazyImages(records, OPTIONS)
  everything = _expected(records, range(10))
  for i in (0, 4, 9, np.int64(7), np.array(5), -1, -10):
    x = lazy[i]
    assert x.shape == (12, 12, 3) and x.dtype == np.float32
    np.testing.assert_array_equal(x, everything[int(i)])
  for key in (slice(None), slice(2, 7), slice(None, None, 3), slice(8, 2, -2), slice(5, 5)):
    np.testing.assert_array_equal(lazy[key], everything[key])
  for key in ([3, 3, 0], np.array([9, 1, 4]), np.array([], np.int64), np.arange(10) % 2 == 0,
              np.array([-1, 2])):
    x = lazy[key]
    assert x.dtype == np.float32 and x.shape[1:] == (12, 12, 3)
    np.testing.assert_array_equal(x, everything[key])


def test_lazy_with_indices_and_take_compose():
  records = _records(10)
  lazy = images.LazyImages(records, OPTIONS, indices=[8, 1, 5, 5, 0])
  assert lazy.shape == (5, 12, 12, 3)
  np.testing.assert_array_equal(lazy[:], _expected(records, [8, 1, 5, 5, 0]))
  sub = lazy.take([4, 0, 2])            # -> records 0, 8, 5
  assert isinstance(sub, images.LazyImages) and sub.options is lazy.options
  np.testing.assert_array_equal(sub.indices, [0, 8, 5])
  subsub = sub.take(np.array([2, 2, 1]))  # -> records 5, 5, 8
  np.testing.assert_array_equal(subsub.indices, [5, 5, 8])
  np.testing.assert_array_equal(subsub[:], _expected(records, [5, 5, 8]))
  np.testing.assert_array_equal(subsub[1], OPTIONS.eval_transform(records[5]))
  assert subsub.record(2) is records[8]
  np.testing.assert_array_equal(lazy.take(slice(1, 3)).indices, [1, 5])
  np.testing.assert_array_equal(lazy.take(np.array([True, False, False, True, True])).indices,
                                [8, 5, 0])
  with pytest.raises(ValueError, match="read-only"):
    lazy.indices[0] = 3
  # The module-level take: lazy sub-view for LazyImages, plain indexing for arrays.
  assert isinstance(images.take(lazy, [0, 1]), images.LazyImages)
  array = np.arange(24, dtype=np.float32).reshape(6, 2, 2, 1)
  np.testing.assert_array_equal(images.take(array, [5, 0]), array[[5, 0]])


def test_np_asarray_decodes_everything():
  records = _records(6)
  lazy = images.LazyImages(records, OPTIONS, indices=[5, 0, 3])
  x = np.asarray(lazy)
  assert x.shape == (3, 12, 12, 3) and x.dtype == np.float32
  np.testing.assert_array_equal(x, _expected(records, [5, 0, 3]))
  x64 = np.asarray(lazy, dtype=np.float64)
  assert x64.dtype == np.float64
  np.testing.assert_array_equal(x64, x.astype(np.float64))
  np.testing.assert_array_equal(np.array(lazy), x)


def test_threads_and_one_thread_give_identical_batches():
  records = CountingRecords(_records(24, seed=1))
  threaded = images.LazyImages(records, OPTIONS, num_threads=4)
  single = images.LazyImages(records, OPTIONS, num_threads=1)
  assert threaded.num_threads == 4 and single.num_threads == 1
  assert images.LazyImages(records, OPTIONS).num_threads >= 1
  rows = np.random.default_rng(0).permutation(24)
  np.testing.assert_array_equal(threaded[rows], single[rows])
  np.testing.assert_array_equal(threaded[:], single[:])
  assert records.reads == 4 * 24   # every row read exactly once per call


def test_decoding_errors_propagate_from_threads():
  records = _records(5) + [b"corrupt"]
  lazy = images.LazyImages(records, OPTIONS, num_threads=3)
  with pytest.raises(ValueError, match="Cannot decode the image"):
    lazy[:]
  np.testing.assert_array_equal(lazy[:5], _expected(records, range(5)))


def test_lazy_index_errors():
  records = _records(4)
  with pytest.raises(ValueError, match=r"toy: indices must be in \[0, 4\), got 0..4"):
    images.LazyImages(records, OPTIONS, indices=[0, 4], name="toy")
  with pytest.raises(ValueError, match=r"indices must be in \[0, 4\), got -1..2"):
    images.LazyImages(records, OPTIONS, indices=[-1, 2])
  with pytest.raises(ValueError, match="1-D integer array"):
    images.LazyImages(records, OPTIONS, indices=[0.0, 1.0])
  with pytest.raises(ValueError, match="1-D integer array"):
    images.LazyImages(records, OPTIONS, indices=[[0, 1]])
  # Indexing the view follows numpy: IndexError (so the legacy iteration protocol stops).
  lazy = images.LazyImages(records, OPTIONS, indices=[3, 1])
  with pytest.raises(IndexError):
    lazy[2]
  with pytest.raises(IndexError):
    lazy[np.array([0, 5])]
  with pytest.raises(IndexError):
    lazy.take([2])
  assert len(list(lazy)) == 2


def test_field_view_reads_one_feature_of_dict_records():
  records = _records(4)
  source = [{"image": r, "label": i} for i, r in enumerate(records)]
  view = images.FieldView(source, "image")
  assert len(view) == 4 and view[np.int64(2)] is records[2]
  lazy = images.LazyImages(view, OPTIONS)
  np.testing.assert_array_equal(lazy[[3, 0]], _expected(records, [3, 0]))


# ------------------------------------------------------------------------------------------
# Splits over LazyImages.


def test_split_keeps_lazy_images_lazy():
  records = CountingRecords(_records(6))
  lazy = images.LazyImages(records, OPTIONS, name="toy")
  split = data.Split(images=lazy, labels=np.array([0, 1, 1, 0, 2, 2]), name="toy")
  assert split.images is lazy and len(split) == 6
  assert "(6, 12, 12, 3)" in repr(split)
  assert records.reads == 0   # no decoding at construction
  np.testing.assert_array_equal(split.images[[4]], _expected(records.records, [4]))
  assert records.reads == 1


def test_class_split_of_lazy_images_returns_lazy_splits_with_the_right_rows():
  records = CountingRecords(_records(9))
  labels = np.array([5, 2, 9, 2, 5, 9, 7, 7, 1])
  lazy = images.LazyImages(records, OPTIONS)
  splits = data.class_split(lazy, labels, train_classes=(9, 2), test_classes=(5, 7))
  assert records.reads == 0
  train, test = splits["train"], splits["test"]
  assert isinstance(train.images, images.LazyImages)
  assert isinstance(test.images, images.LazyImages)
  np.testing.assert_array_equal(train.images.indices, [1, 2, 3, 5])
  np.testing.assert_array_equal(test.images.indices, [0, 4, 6, 7])
  np.testing.assert_array_equal(train.labels, [0, 1, 0, 1])
  np.testing.assert_array_equal(train.label_sets["class"], [2, 9, 2, 9])
  assert train.images.shape == (4, 12, 12, 3) and records.reads == 0
  np.testing.assert_array_equal(test.images[:], _expected(records.records, [0, 4, 6, 7]))
  assert records.reads == 4
  # The same rows as class_split of the decoded array.
  eager = data.class_split(np.asarray(lazy), labels, train_classes=(9, 2), test_classes=(5, 7))
  np.testing.assert_array_equal(np.asarray(train.images), eager["train"].images)
