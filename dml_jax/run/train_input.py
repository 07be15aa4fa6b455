"""The training loop's input, from the config: the streaming host pipeline, or the
decoded-image cache with the augmentation on the device (``data.cache``).

* ``data.cache='none'``: ``pipeline.train_batches`` decodes and augments every example on the
  host (threads or grain worker processes, ``input_workers``); the loop gets float batches.
* ``'memory'`` / ``'mmap'``: ``data.cache.build`` decodes the training images once (in memory,
  or into ``<workdir>/data_cache/`` as a memory map, reused by a rerun);
  ``pipeline.cached_batches`` cuts each example's crop window on the host with the crop box
  and flip the streaming path draws, and ``make_feed``'s jitted
  ``device_augment.augment`` finishes the batch on the devices (sharded like the batch).
* ``'auto'`` (default): ``'memory'`` when the estimated cache fits ``data.cache_max_gb``,
  else ``'none'``.

In-memory datasets (the digits) always take their own path (rows gathered directly). Either
way a batch is a pure function of ``(seed, step)``, so resumption stays exact, and each process
loads only its rows of the global batch (``parallel.process_slice``).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from dml_jax import parallel
from dml_jax.run import workdir as workdir_lib
from dml_jax.data import cache as cache_lib
from dml_jax.data import crop_windows
from dml_jax.data import device_augment
from dml_jax.data import pipeline
from dml_jax.data.images import LazyImages

CACHE_THREADS = 2   # threads cutting cached windows (numpy copies; two keep up with a GPU)


def input_workers(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """``(num_workers, num_threads)``: ``data.num_workers`` resolved for the default backend and
  the CPUs this process may use (``pipeline.resolve_workers``)."""
  return pipeline.resolve_workers(config.data.num_workers, config.data.num_threads,
                                  platform=jax.default_backend(),
                                  cpus=len(os.sched_getaffinity(0)))


def cache_spec(data: ml_collections.ConfigDict) -> cache_lib.CacheSpec:
  """The ``CacheSpec`` of ``config.data`` (``resize_size`` 0: ``round(image_size * 8 / 7)``)."""
  return cache_lib.CacheSpec(augmentation=data.augmentation, image_size=data.image_size,
                             resize_size=data.resize_size or round(data.image_size * 8 / 7),
                             channels=data.channels)


def cache_mode(data: ml_collections.ConfigDict, images, *, examples: int | None = None
               ) -> tuple[str, int]:
  """``(mode, estimated bytes)``: how the training ``images`` are fed, ``'memory'``,
  ``'mmap'`` or ``'none'`` (stream), for ``data.cache`` / ``data.cache_max_gb`` and the
  ``examples`` of the whole run (``cache.choose``; not those left, so that a resumed run
  chooses as the uninterrupted one did); in-memory arrays are always ``'none'`` (they have
  their own path)."""
  cache_lib.check_mode(data.cache, data.cache_max_gb)
  if data.cache == "none" or not isinstance(images, LazyImages):
    return "none", 0
  if data.cache == "auto" and examples is not None and examples < len(images):
    return "none", 0   # fewer examples than images: streaming decodes less
  estimate = (cache_lib.estimate_nbytes(images, cache_spec(data)) if data.cache == "auto"
              else 0)
  return cache_lib.choose(data.cache, estimated_bytes=estimate, max_gb=data.cache_max_gb,
                          examples=examples, num_images=len(images)), estimate


def cache_path(workdir: str, images: LazyImages, spec: cache_lib.CacheSpec) -> str:
  """``<workdir>/data_cache/<dataset>-<augmentation>-<size>[-p<process>]`` (the stem)."""
  name = re.sub(r"[^A-Za-z0-9_.-]+", "_", images.name)
  stem = f"{name}-{spec.augmentation}-{spec.image_size}-{spec.resize_size}-c{spec.channels}"
  if jax.process_count() > 1:
    stem += f"-p{jax.process_index()}"
  return os.path.join(workdir_lib.data_cache_dir(workdir), stem)


def input_cache(config: ml_collections.ConfigDict, images, *, workdir: str = "",
                examples: int | None = None, log: Callable[[str], None] | None = None
                ) -> cache_lib.DecodedCache | None:
  """The decoded-image cache of the training ``images`` that ``data.cache`` asks for, built
  now (``None``: stream). ``examples``: how many the whole run uses (``cache_mode``);
  ``'mmap'`` needs ``workdir``; ``log`` gets progress lines and the choice of ``'auto'``."""
  mode, estimate = cache_mode(config.data, images, examples=examples)
  if config.data.cache == "auto" and log is not None and isinstance(images, LazyImages):
    why = (f"the decoded images take about {estimate / 1e9:.2f} GB, budget "
           f"data.cache_max_gb={config.data.cache_max_gb}" if estimate else
           f"the run has {examples:,} examples, fewer than the {len(images):,} images")
    log(f"data.cache=auto: {why}: " + ("cached in memory, augmented on the device"
                                      if mode == "memory" else
                                      "streaming (decoded on the host every epoch)"))
  if mode == "none":
    return None
  if mode == "mmap" and not workdir:
    raise ValueError("data.cache='mmap' needs a workdir for its files; use 'memory'.")
  spec = cache_spec(config.data)
  path = cache_path(workdir, images, spec) if mode == "mmap" else ""
  return cache_lib.build(images, spec, path=path, num_threads=config.data.num_threads,
                         log=log)


def train_batches(config: ml_collections.ConfigDict, train, sampler, *, start_step: int,
                  num_steps: int, cache: cache_lib.DecodedCache | None = None):
  """``(step, local inputs, local labels)`` from ``start_step`` on: float batches of
  ``pipeline.train_batches`` (``cache`` None) or ``DeviceInputs`` of
  ``pipeline.cached_batches``, this process's rows of every global batch."""
  d, rows = config.data, parallel.process_slice(config.batch_size)
  if cache is not None:
    return pipeline.cached_batches(cache, train.labels, sampler, seed=config.seed,
                                   start_step=start_step, num_steps=num_steps, rows=rows,
                                   flip=d.flip, pad=d.pad, pad_fill=d.pad_fill,
                                   num_threads=min(CACHE_THREADS, d.num_threads),
                                   prefetch=d.prefetch)
  num_workers, num_threads = input_workers(config)
  return pipeline.train_batches(
      train.images, train.labels, sampler, seed=config.seed, start_step=start_step,
      num_steps=num_steps, rows=rows, augmentation=d.augmentation, flip=d.flip, pad=d.pad,
      pad_fill=d.pad_fill, num_threads=num_threads, num_workers=num_workers, prefetch=d.prefetch)


def make_feed(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
              cache: cache_lib.DecodedCache | None = None) -> Callable:
  """``feed(local inputs, local labels) -> (images [B, S, S, C], labels [B])``: global arrays
  sharded over the mesh (``parallel.global_batch``); with a ``cache``, the ``DeviceInputs``
  are augmented on the devices by one jitted call, each device its own rows."""
  b = config.batch_size
  if cache is None:
    return lambda x, y: parallel.global_batch(mesh, x, y, batch_size=b)
  spec, sharded = cache.spec, parallel.batch_sharded(mesh)
  fn = functools.partial(device_augment.augment, augmentation=spec.augmentation,
                         image_size=spec.image_size, mean=tuple(config.data.mean),
                         std=tuple(config.data.std))
  augment = jax.jit(fn, in_shardings=(sharded,), out_shardings=sharded)

  def feed(inputs: crop_windows.DeviceInputs, labels: np.ndarray):
    *arrays, labels = parallel.global_batch(mesh, *inputs, labels, batch_size=b)
    return augment(crop_windows.DeviceInputs(*arrays)), labels

  return feed
