"""The evaluation's input, from the config: the evaluated image splits decoded once
(``eval.cache``, ``data.eval_cache``) or at every evaluation.

* ``eval.cache='none'``: each evaluation decodes every image of its splits again
  (``LazyImages``, ``pipeline.eval_batches``).
* ``'memory'``: each evaluated split decoded once per process into its uint8 centre crops.
* ``'mmap'``: the same in ``<workdir>/data_cache/<split>-eval-<size>-<resize>-c<channels>.npy``,
  mapped by every later evaluation: a resumed run and ``eval.py`` on the workdir decode
  nothing.
* ``'auto'`` (default): ``'mmap'`` for a split whose pixels fit ``data.cache_max_gb``, when
  there is a workdir; else ``'none'``.

Either way the model's inputs are bitwise the same (``images.DecodedImages``), so are the
metrics. Only ``LazyImages`` splits are cached (the in-memory digits are arrays already), and
only those that the protocols embed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence

import jax
import ml_collections

from dml_jax.data import eval_cache
from dml_jax.data.images import LazyImages
from dml_jax.evaluation import protocols as protocols_lib
from dml_jax.run import workdir as workdir_lib


def split_mode(config: ml_collections.ConfigDict, images, *, workdir: str = "") -> str:
  """``'memory'``, ``'mmap'`` or ``'none'`` (decode at every evaluation) for the evaluated
  ``images`` under ``eval.cache`` (``'auto'``: ``'mmap'`` when there is a ``workdir`` and the
  uint8 pixels fit ``data.cache_max_gb``).

  Raises:
    ValueError: a bad ``eval.cache``, or ``'mmap'`` without a ``workdir``.
  """
  mode = config.eval.cache
  eval_cache.check_mode(mode)
  if mode == "mmap" and not workdir:
    raise ValueError("eval.cache='mmap' needs a workdir for its files; use 'memory'.")
  if mode == "none" or not isinstance(images, LazyImages):
    return "none"
  if mode == "auto":
    fits = eval_cache.nbytes(images) <= config.data.cache_max_gb * 1e9
    return "mmap" if workdir and fits else "none"
  return mode


def cache_path(workdir: str, images: LazyImages) -> str:
  """``<workdir>/data_cache/<split>-eval-<size>-<resize>-c<channels>[-p<process>]`` (the
  stem of ``<stem>.npy`` and ``<stem>.json``)."""
  name = re.sub(r"[^A-Za-z0-9_.-]+", "_", images.name)
  o = images.options
  stem = f"{name}-eval-{o.image_size}-{o.resize_size}-c{o.channels}"
  if jax.process_count() > 1:
    stem += f"-p{jax.process_index()}"
  return os.path.join(workdir_lib.data_cache_dir(workdir), stem)


def evaluated_splits(protocols: Sequence[str], splits: Mapping) -> list[str]:
  """The names of the splits that ``protocols`` embed (query splits and galleries), in order
  of first use."""
  names = []
  for protocol in protocols:
    split, _, gallery = protocols_lib.parse_protocol(protocol, splits)
    names += [s for s in (split, gallery) if s is not None and s not in names]
  return names


def cached_splits(config: ml_collections.ConfigDict, splits: Mapping, *,
                  protocols: Sequence[str] | None = None, workdir: str = "",
                  log: Callable[[str], None] | None = None) -> dict:
  """``splits`` with the images of every evaluated ``LazyImages`` split that ``eval.cache``
  caches replaced by its ``DecodedImages`` (built now, or mapped from ``workdir``).

  Args:
    config: the run's config (``eval.cache``, ``data.cache_max_gb``, ``data.num_threads``).
    splits: ``{name: Split}`` of the run.
    protocols: the evaluated protocols (default ``config.eval.splits``).
    workdir: the run directory (``'mmap'``, and ``'auto'``'s memory map); ``''``: none.
    log: receives progress lines of long builds and one line saying what was cached.

  Raises:
    ValueError: a bad ``eval.cache``, ``'mmap'`` without a workdir, a bad protocol.
  """
  out = dict(splits)
  done, folder = [], ""
  protocols = config.eval.splits if protocols is None else protocols
  for name in evaluated_splits(tuple(protocols), splits):
    images = splits[name].images
    mode = split_mode(config, images, workdir=workdir)
    if mode == "none":
      if isinstance(images, LazyImages) and config.eval.cache == "auto":
        why = (f"{eval_cache.nbytes(images) / 1e9:.2f} GB > data.cache_max_gb="
               f"{config.data.cache_max_gb}" if workdir else "no workdir")
        done.append(f"{name}: decoded at every evaluation ({why})")
      continue
    path = cache_path(workdir, images) if mode == "mmap" else ""
    start = time.perf_counter()
    view = eval_cache.load(path, images) if path else None
    how = "mapped (decoded earlier)"
    if view is None:
      view = eval_cache.build(images, path=path, num_threads=config.data.num_threads, log=log)
      how = f"decoded in {time.perf_counter() - start:.1f} s"
    out[name] = dataclasses.replace(splits[name], images=view)
    done.append(f"{name}: {len(view):,} images ({view.nbytes / 1e9:.2f} GB) {how}"
                f"{' in memory' if mode == 'memory' else ''}")
    folder = os.path.dirname(path) if path else folder
  if log and done:
    log(f"evaluation images (eval.cache={config.eval.cache}): " + "; ".join(done) +
        (f"; memory maps in {folder}" if folder else ""))
  return out


def evaluation_splits(config: ml_collections.ConfigDict, splits: Mapping, *, workdir: str,
                      log: Callable[[str], None] | None = None) -> Callable[[], dict]:
  """``get()``: the ``splits`` every evaluation of a training run embeds, with the evaluation
  cache (:func:`cached_splits`, ``eval.cache``) built at the first call and reused after."""
  built = {}

  def get() -> dict:
    if not built:
      built.update(cached_splits(config, splits, workdir=workdir, log=log))
    return built

  return get
