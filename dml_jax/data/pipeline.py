"""The training input pipeline: sampler -> decode + augment -> batches (grain).

``train_batches`` turns the n-per-class sampler's index batches into augmented float
batches. It is a grain ``MapDataset`` over *examples* ``j = step * b + k`` (``b`` rows of the
batch that this process loads, ``k`` the row), mapped by a picklable function and batched
back to steps, so:

* example ``(step, row)`` is augmented with ``numpy.random.default_rng([seed, step, row])``
  (``row`` = the row in the *global* batch): batches do not depend on the number of threads,
  worker processes or hosts, and a resumed run (``start_step > 0``) gets exactly the batches
  of an uninterrupted one;
* on a multi-host run each process passes its ``rows`` (``parallel.process_slice``) and
  decodes only its share of every global batch;
* decoding runs in ``num_threads`` threads of this process (Pillow releases the GIL) or, with
  ``num_workers > 0``, in grain worker processes (``mp_prefetch``), each with its own threads;
* memory stays bounded: threads decode at most ``prefetch`` batches ahead of the consumer;
  each worker holds ``num_threads`` batches in decoding and ``prefetch`` finished ones.

In-memory datasets (numpy image arrays, e.g. the embedded digits) skip grain: rows are
gathered directly and ``augmentation`` must be ``'none'``.

``cached_batches`` is the same sampling and the same per-example generators over a
``cache.DecodedCache`` (images decoded once): it yields each batch's crop windows and
parameters (``crop_windows.DeviceInputs``) for ``device_augment.augment`` to finish on the
device; the crop boxes and flips are the ones ``train_batches`` draws.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from dml_jax.data import augment
from dml_jax.data import crop_windows
from dml_jax.data.images import LazyImages


def example_rng(seed: int, step: int, row: int) -> np.random.Generator:
  """The generator of the augmentation of global batch row ``row`` at ``step``."""
  return np.random.default_rng([int(seed), int(step), int(row)])


class _Example:
  """Picklable ``j -> {'step', 'image' [S, S, C], 'label'}`` for grain workers."""

  def __init__(self, images: LazyImages, labels: np.ndarray, sampler, *, rows: range,
               seed: int, augmentation: str, transform_kwargs: dict):
    self.images, self.labels, self.sampler = images, labels, sampler
    self.rows, self.seed = rows, seed
    self.augmentation, self.transform_kwargs = augmentation, transform_kwargs

  def __call__(self, j: int) -> dict:
    b = len(self.rows)
    step, k = divmod(int(j), b)
    row = self.rows[k]
    i = int(self.sampler.batch_indices(step)[row])
    image = self.images.options.train_transform(
        self.images.record(i), example_rng(self.seed, step, row),
        augmentation=self.augmentation, **self.transform_kwargs)
    return {"step": np.int64(step), "image": image, "label": np.int32(self.labels[i])}


def _rows(rows: slice, batch_size: int) -> range:
  rows = range(batch_size)[rows]
  if len(rows) == 0:
    raise ValueError(f"rows {rows} select no row of a batch of {batch_size}.")
  return rows


AUTO_WORKERS = -1       # data.num_workers: choose by the platform (see resolve_workers)
MAX_AUTO_WORKERS = 8


def resolve_workers(num_workers: int, num_threads: int, *, platform: str,
                    cpus: int) -> tuple[int, int]:
  """``(num_workers, num_threads)`` of the pipeline for ``data.num_workers`` (``-1``: auto).

  Auto on the CPU platform is 0 workers (the trainer's threads: the model's step needs the
  cores); on an accelerator ``min(8, cpus // 2)`` worker processes of
  ``min(num_threads, cpus // workers)`` threads each, because the per-example Python work holds
  the GIL: threads alone fed ResNet-50 at 224 px about 800 images/s on 16 cores, 8 workers x 2
  threads 3,000 (docs/training.md, the ``data.num_workers`` row). Any other value is returned
  as it is.

  Raises:
    ValueError: ``num_workers < -1`` or ``num_threads < 1``.
  """
  if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
    raise ValueError(f"data.num_threads={num_threads!r}; allowed: an integer >= 1 (decoding "
                     "threads per process).")
  if num_workers != AUTO_WORKERS:
    if num_workers < 0:
      raise ValueError(f"data.num_workers={num_workers}; allowed: -1 (auto), 0 (threads of "
                       "the trainer only) or a number of worker processes.")
    return num_workers, num_threads
  if platform == "cpu":
    return 0, num_threads
  workers = max(1, min(MAX_AUTO_WORKERS, cpus // 2))
  return workers, max(1, min(num_threads, cpus // workers))


def describe_workers(num_workers: int, num_threads: int) -> str:
  """Where decoding runs, for the start-up line of ``train.py``."""
  where = (f"{num_workers} worker process(es) x {num_threads} threads" if num_workers
           else f"{num_threads} threads of the trainer")
  return f"decoding in {where} (data.num_workers, data.num_threads)"


def train_batches(images, labels, sampler, *, seed: int, start_step: int, num_steps: int,
                  rows: slice = slice(None), augmentation: str = "none", flip: bool = True,
                  pad: int = 10, pad_fill: int = 0, num_threads: int = 8, num_workers: int = 0,
                  prefetch: int = 2) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
  """Yields ``(step, images [b, S, S, C] float32, labels [b] int32)`` for
  ``step = start_step .. num_steps - 1`` (0-based; the train loop's step ``s + 1`` uses the
  batch of ``s``).

  Args:
    images: ``LazyImages`` (decoded + augmented here) or an in-memory array ``[N, H, W, C]``.
    labels: int ``[N]`` training labels (after label noise).
    sampler: an object with ``batch_indices(step) -> int [B]`` and ``batch_size``
      (``samplers.NPerClassSampler``).
    seed: the augmentation seed.
    start_step, num_steps: the steps to produce.
    rows: the rows of each global batch this process loads (``b = len(rows)``).
    augmentation: ``augment.AUGMENTATIONS`` (``'none'`` for in-memory arrays).
    flip, pad, pad_fill: passed to ``augment.train_transform``.
    num_threads: decoding threads (per worker process when ``num_workers > 0``).
    num_workers: grain worker processes (0: threads of this process only).
    prefetch: batches prepared ahead.

  Raises:
    ValueError: an unknown augmentation, an augmentation on in-memory arrays, bad counts,
      ``images`` and ``labels`` of different lengths.
  """
  if augmentation not in augment.AUGMENTATIONS:
    raise ValueError(f"Unknown augmentation {augmentation!r}; valid: "
                     f"{', '.join(augment.AUGMENTATIONS)}.")
  if num_workers < 0 or num_threads < 1 or prefetch < 0:
    raise ValueError(f"num_workers must be >= 0, num_threads >= 1 and prefetch >= 0, got "
                     f"{num_workers}, {num_threads}, {prefetch}.")
  labels = np.asarray(labels)
  if len(images) != len(labels):
    raise ValueError(f"There are {len(images)} images but {len(labels)} labels; pass the "
                     "images and labels of one split.")
  row_range = _rows(rows, sampler.batch_size)
  if not isinstance(images, LazyImages):
    if augmentation != "none":
      raise ValueError(f"augmentation={augmentation!r} needs an image dataset (LazyImages); "
                       "in-memory arrays (the digits) only support augmentation='none'.")
    return _array_batches(images, labels, sampler, start_step, num_steps, rows)
  return _grain_batches(images, labels, sampler, row_range, seed=seed, start_step=start_step,
                        num_steps=num_steps, augmentation=augmentation,
                        transform_kwargs={"flip": flip, "pad": pad, "pad_fill": pad_fill},
                        num_threads=num_threads, num_workers=num_workers, prefetch=prefetch)


def _array_batches(images, labels, sampler, start_step, num_steps, rows):
  for step in range(start_step, num_steps):
    idx = sampler.batch_indices(step)[rows]
    yield step, images[idx], labels[idx]


def _grain_batches(images, labels, sampler, rows, *, seed, start_step, num_steps,
                   augmentation, transform_kwargs, num_threads, num_workers, prefetch):
  import grain  # pylint: disable=import-outside-toplevel
  b = len(rows)
  if num_steps <= start_step:
    return
  fn = _Example(images, labels, sampler, rows=rows, seed=seed, augmentation=augmentation,
                transform_kwargs=transform_kwargs)
  ds = grain.MapDataset.range(start_step * b, num_steps * b).map(fn)
  if num_workers == 0:
    # Threads decode examples; at most `prefetch` batches of examples are decoded ahead.
    ds = ds.to_iter_dataset(grain.ReadOptions(
        num_threads=num_threads, prefetch_buffer_size=max(1, prefetch) * b,
    )).batch(b)
  else:
    # A worker's slice of the dataset must hold whole steps, so the elements are batches:
    # each worker's threads decode `num_threads` batches at a time and keep `prefetch` ready.
    from absl import flags  # pylint: disable=import-outside-toplevel
    if not flags.FLAGS.is_parsed():  # grain reads its absl flags; outside absl.app (notebooks,
      flags.FLAGS.mark_as_parsed()   # tests) they would be unparsed
    ds = ds.batch(b).to_iter_dataset(grain.ReadOptions(
        num_threads=num_threads, prefetch_buffer_size=num_threads))
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers,
                                                     per_worker_buffer_size=max(1, prefetch)))
  for batch in ds:
    steps = batch["step"]
    if not np.all(steps == steps[0]):
      raise RuntimeError(f"A batch mixes steps {np.unique(steps)}; this is a bug.")
    images, labels = batch["image"], batch["label"]
    if num_workers > 0:
      # Worker batches live in grain's shared memory; copy them out so that memory is freed
      # (and unlinked) as soon as grain drops the batch, not at interpreter exit.
      images, labels = np.array(images), np.array(labels)
    yield int(steps[0]), images, labels


class _EvalBatch:
  """Picklable ``i -> {'index', 'images' [b, S, S, C], 'valid'}``: batch ``i`` of ``images``
  (``LazyImages``, decoded with the evaluation transform, or an array), the last one padded
  with copies of image 0."""

  def __init__(self, images, batch_size: int):
    self.images, self.batch_size = images, batch_size

  def __call__(self, i: int) -> dict:
    start = int(i) * self.batch_size
    chunk = self.images[start:start + self.batch_size]
    valid = len(chunk)
    if valid < self.batch_size:
      pad = np.repeat(self.images[0:1], self.batch_size - valid, axis=0)
      chunk = np.concatenate([chunk, pad], axis=0)
    return {"index": np.int64(i), "images": chunk, "valid": np.int64(valid)}


def eval_batches(images, *, batch_size: int, num_workers: int = 0, num_threads: int = 8,
                 prefetch: int = 2) -> Iterator[tuple[np.ndarray, int]]:
  """Yields ``(images [b, S, S, C] float32, valid)`` of ``images`` in order, in batches of a
  fixed shape ``b = min(batch_size, N)`` (the last padded with copies of image 0; ``valid``
  real rows), decoded with the evaluation transform.

  With ``num_workers > 0`` grain worker processes decode whole batches ahead (each with
  ``num_threads`` threads; at most ``prefetch`` finished batches per worker), so embedding runs
  at the rate the model allows where one process's decoding (the GIL) would bound it, as in
  training; with ``0`` this process decodes each batch (``LazyImages``' threads) while the
  device embeds the one before. In-memory arrays and ``DecodedImages`` (the evaluation cache,
  ``eval_cache``: slicing only normalises) are sliced in this process.
  """
  n = len(images)
  if n == 0:
    raise ValueError("Cannot embed an empty split.")
  if num_workers < 0 or num_threads < 1 or prefetch < 0:
    raise ValueError(f"num_workers must be >= 0, num_threads >= 1 and prefetch >= 0, got "
                     f"{num_workers}, {num_threads}, {prefetch}.")
  b = min(batch_size, n)
  num_batches = -(-n // b)
  batch = _EvalBatch(images, b)
  if num_workers == 0 or not isinstance(images, LazyImages):
    for i in range(num_batches):
      out = batch(i)
      yield out["images"], int(out["valid"])
    return
  import grain  # pylint: disable=import-outside-toplevel
  from absl import flags  # pylint: disable=import-outside-toplevel
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  ds = grain.MapDataset.range(num_batches).map(batch).to_iter_dataset(
      grain.ReadOptions(num_threads=1, prefetch_buffer_size=1))
  ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers,
                                                   per_worker_buffer_size=max(1, prefetch)))
  expected = 0
  for batch in ds:
    if int(batch["index"]) != expected:
      raise RuntimeError(f"Evaluation batch {int(batch['index'])} came in place of "
                         f"{expected}; this is a bug.")
    expected += 1
    yield np.array(batch["images"]), int(batch["valid"])   # out of grain's shared memory


class _CachedBatch:
  """``step -> {'step', 'windows', 'boxes', 'valid', 'flips', 'label'}`` of this process's
  rows (``crop_windows.host_inputs``), the crops drawn as ``train_batches`` draws them."""

  def __init__(self, cache, labels: np.ndarray, sampler, *, rows: range, seed: int,
               flip: bool, pad: int, pad_fill: int):
    self.cache, self.labels, self.sampler = cache, labels, sampler
    self.rows, self.seed, self.flip, self.pad, self.pad_fill = rows, seed, flip, pad, pad_fill

  def __call__(self, step: int) -> dict:
    spec, step = self.cache.spec, int(step)
    idx = self.sampler.batch_indices(step)[self.rows.start:self.rows.stop:self.rows.step]
    crops = []
    for row, i in zip(self.rows, idx):
      h, w = self.cache.source_hw[i]
      rng = None if spec.augmentation == "none" else example_rng(self.seed, step, row)
      crops.append(augment.sample_crop(spec.augmentation, rng, (int(w), int(h)),
                                       image_size=spec.image_size, flip=self.flip,
                                       pad=self.pad))
    inputs = crop_windows.host_inputs(
        self.cache.images, self.cache.source_hw, idx, crops, augmentation=spec.augmentation,
        image_size=spec.image_size, resize_size=spec.resize_size, channels=spec.channels,
        pad_fill=self.pad_fill)
    return {"step": np.int64(step), **inputs._asdict(), "label": self.labels[idx]}


def cached_batches(cache, labels, sampler, *, seed: int, start_step: int, num_steps: int,
                   rows: slice = slice(None), flip: bool = True, pad: int = 10,
                   pad_fill: int = 0, num_threads: int = 2, prefetch: int = 2
                   ) -> Iterator[tuple[int, crop_windows.DeviceInputs, np.ndarray]]:
  """Yields ``(step, DeviceInputs of b rows, labels [b] int32)`` for ``step = start_step ..
  num_steps - 1`` from a ``cache.DecodedCache`` (its ``spec`` names the augmentation).

  Row ``k`` of a step is the example ``train_batches`` would give it, with the crop box and
  flip drawn from the same ``example_rng(seed, step, row)``; ``device_augment.augment`` turns
  the inputs into the float batch. ``num_threads`` threads cut up to ``prefetch`` batches
  ahead (numpy copies: two threads keep up with a GPU).

  Raises:
    ValueError: rows that select nothing, bad counts, a cache of another length than
      ``labels``.
  """
  if num_threads < 1 or prefetch < 0:
    raise ValueError(f"num_threads must be >= 1 and prefetch >= 0, got {num_threads}, "
                     f"{prefetch}.")
  labels = np.asarray(labels).astype(np.int32)
  if len(cache) != len(labels):
    raise ValueError(f"The cache holds {len(cache)} images but there are {len(labels)} "
                     "labels; build it from the same split.")
  fn = _CachedBatch(cache, labels, sampler, rows=_rows(rows, sampler.batch_size), seed=seed,
                    flip=flip, pad=pad, pad_fill=pad_fill)
  return _cached_iter(fn, start_step=start_step, num_steps=num_steps, num_threads=num_threads,
                      prefetch=prefetch)


def _cached_iter(fn, *, start_step, num_steps, num_threads, prefetch):
  if num_steps <= start_step:
    return
  import grain  # pylint: disable=import-outside-toplevel
  ds = grain.MapDataset.range(start_step, num_steps).map(fn).to_iter_dataset(
      grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=max(1, prefetch)))
  for batch in ds:
    inputs = crop_windows.DeviceInputs(batch["windows"], batch["boxes"], batch["valid"],
                                         batch["flips"])
    yield int(batch["step"]), inputs, batch["label"]
