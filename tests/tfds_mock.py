"""Mocked TFDS image datasets for the tests (``mock_tfds``, ``mock_data``)."""

import contextlib

SOP_MOCK_CLASSES = 8


@contextlib.contextmanager
def mock_data(num_examples):
  """``tfds.testing.mock_data(num_examples=...)``, without the empty temporary directory that
  TFDS makes for each builder of a dataset not prepared (every mocked one) to read its info
  from TFDS's bucket, and never removes; the bucket is off here."""
  from unittest import mock  # pylint: disable=import-outside-toplevel
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  with tfds.testing.mock_data(num_examples=num_examples), mock.patch.object(
      tfds.core.DatasetInfo, "initialize_from_bucket", lambda info: None):
    yield


def mock_tfds(num_examples=96):
  """``tfds.testing.mock_data`` for our TFDS builders: TFDS's random examples, except for
  Stanford Online Products, whose random ``class_id`` over 22,634 classes would leave every
  mock class a singleton; there the examples get ``class_id = i % 8`` (same features)."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  class FewClasses:
    """The SOP mock source with few classes (a picklable random-access sequence)."""

    def __init__(self, split):
      self.offset = 0 if split == "train" else 1000

    def __len__(self):
      return num_examples

    def __getitem__(self, i):
      rng = np.random.default_rng(i + self.offset)
      return {"image": rng.integers(0, 256, (20 + i % 7, 24, 3), dtype=np.uint8),
              "class_id": np.int64(self.offset + i % SOP_MOCK_CLASSES),
              "super_class_id": np.int64(i % 3), "super_class_id/num": np.int64(3)}

  return _MockTfds(num_examples, FewClasses)


class _MockTfds:
  """Context manager: TFDS's mock for every builder, SOP's replaced (see ``mock_tfds``)."""

  def __init__(self, num_examples, sop_source):
    self.num_examples, self.sop_source = num_examples, sop_source

  def __enter__(self):
    import contextlib  # pylint: disable=import-outside-toplevel
    from unittest import mock  # pylint: disable=import-outside-toplevel
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
    self.stack = contextlib.ExitStack()
    self.stack.enter_context(mock_data(self.num_examples))
    real = tfds.data_source
    sop = self.sop_source

    def data_source(name, *args, **kwargs):
      if name == "stanford_online_products":
        return sop(kwargs.get("split"))
      return real(name, *args, **kwargs)

    self.stack.enter_context(mock.patch.object(tfds, "data_source", data_source))
    return self

  def __exit__(self, *exc):
    return self.stack.__exit__(*exc)
