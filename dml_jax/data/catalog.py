"""The standard benchmarks, from their official files (``root``) or from TFDS (default).

``load_benchmark(name, root=DIR)`` reads the files as their authors distribute them
(``official``); without ``root`` it reads the TFDS ``data_source`` (``tfds_datasets``). Both
routes give their parts to ``split_protocols.make_splits``, so the splits, labels, label sets and
names are the same. Images are ``LazyImages`` (decoded and transformed on access with the
``ImageOptions``); MNIST's official route holds its uint8 arrays in memory, Omniglot's caches
its decoded drawings.
"""

from __future__ import annotations

from collections.abc import Sequence

from dml_jax.data import augment, official, split_protocols, tfds_datasets
from dml_jax.data.splits import Split
from dml_jax.data.images import DatasetNotPreparedError, ImageOptions, LazyImages
from dml_jax.data.official import files as official_files

NAMES = tuple(split_protocols.PROTOCOLS)


def load_benchmark(name: str, *, root: str = "", data_dir: str = "", image_size: int = 224,
                   resize_size: int = 256, channels: int = 3, mean=augment.IMAGENET_MEAN,
                   std=augment.IMAGENET_STD, num_threads: int | None = None,
                   train_digits: Sequence[int] | None = None,
                   test_digits: Sequence[int] | None = None) -> dict[str, Split]:
  """Loads benchmark ``name`` as lazily decoded splits (``split_protocols`` module docstring).

  Args:
    name: one of ``NAMES``.
    root: the folder of the official files ('' = read TFDS); ``official`` lists what it holds.
    data_dir: the TFDS data directory ('' = TFDS's default); only without ``root``.
    image_size, resize_size, channels, mean, std: the ``ImageOptions`` of the images.
    num_threads: decoding threads of ``LazyImages``.
    train_digits, test_digits: the digit lists of ``mnist`` / ``mnist_evenodd``.

  Returns:
    ``dict[str, Split]`` named ``'{name}:{split}'`` with ``LazyImages`` images.

  Raises:
    ValueError: an unknown name, both ``root`` and ``data_dir``, bad options, or an official
      file that does not parse.
    DatasetNotPreparedError: the files are missing (official route: which one, where, how to
      get it; TFDS: the command that prepares it).
  """
  split_protocols.check_digit_options(name, train_digits, test_digits)
  if root and data_dir:
    raise ValueError(f"{name}: root={root!r} (official files) and data_dir={data_dir!r} "
                     "(TFDS) are both set; set one of them.")
  options = ImageOptions(image_size=image_size, resize_size=resize_size, channels=channels,
                         mean=mean, std=std)
  if root:
    parts = official.read_parts(name, root)
  else:
    try:
      parts = tfds_datasets.read_parts(name, data_dir=data_dir)
    except DatasetNotPreparedError as e:
      if name not in official.READERS:
        raise
      raise DatasetNotPreparedError(
          f"{e}\nOr read its official files instead, with the option root=ROOT (config key "
          f"data.options.root): {official_files.how_to_get(name)}") from e
  return split_protocols.make_splits(name, parts,
                                     lazy_images(name, options, num_threads=num_threads),
                                     train_digits=train_digits, test_digits=test_digits)


def lazy_images(name: str, options: ImageOptions, *, num_threads: int | None = None
                ) -> split_protocols.MakeImages:
  """``(records, split) -> LazyImages`` named ``'{name}:{split}'`` (for ``make_splits``)."""

  def make(records, split):
    return LazyImages(records, options, num_threads=num_threads, name=f"{name}:{split}")

  return make
