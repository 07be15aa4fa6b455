"""Computing an evaluation: embed each split once with a model, then score every protocol
(``protocols``) with the retrieval, clustering and spectral metrics (``metrics``).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, Mapping, Sequence

from absl import logging
import jax
import ml_collections
import numpy as np
import tqdm

from dml_jax.data import pipeline
from dml_jax.evaluation import knn
from dml_jax.evaluation import metrics
from dml_jax.evaluation import protocols as protocols_lib
from dml_jax.evaluation import report
from dml_jax.evaluation import retrieval_grid
from dml_jax.evaluation import triplet_scatter


def embed(embed_fn: Callable, images: np.ndarray, *, batch_size: int,
          show_progress: bool = False, desc: str = "embed", num_workers: int = 0,
          num_threads: int = 8) -> np.ndarray:
  """Embeds ``images [N, H, W, C]`` in batches of a fixed shape (one compilation).

  The last batch is padded with copies of the first image and the padding is dropped.
  ``embed_fn`` should be jitted; batches are dispatched asynchronously and fetched one batch
  behind. Decoding: ``pipeline.eval_batches`` (``num_workers`` grain processes of
  ``num_threads`` threads, or this process).

  Returns:
    float32 ``[N, D]``.
  """
  b = min(batch_size, len(images))
  out = []
  batches = pipeline.eval_batches(images, batch_size=b, num_workers=num_workers,
                                  num_threads=num_threads)
  for chunk, valid in tqdm.tqdm(batches, total=-(-len(images) // max(b, 1)),
                                disable=not show_progress,
                                desc=desc, unit="batch", dynamic_ncols=True, mininterval=0.5):
    out.append((embed_fn(chunk), valid))
  return np.concatenate([np.asarray(e, dtype=np.float32)[:valid] for e, valid in out], axis=0)


@contextlib.contextmanager
def _phase(what: str, show_progress: bool):
  """Without progress bars, one log line as an evaluation phase starts and one with its time
  as it ends (with bars, the bars show it)."""
  if show_progress:
    yield
    return
  logging.info("evaluation: %s ...", what)
  start = time.perf_counter()
  yield
  logging.info("evaluation: %s: %.1f s", what, time.perf_counter() - start)


def _feasible_overcluster(overcluster: float | None, labels: np.ndarray,
                          protocol: str = "") -> float | None:
  """``overcluster`` if ``round(overcluster * classes)`` clusters fit the ``[N]`` labels'
  points, else ``None`` (no NMI+ for that protocol; logged)."""
  if overcluster is None:
    return None
  clusters = round(overcluster * np.unique(labels).shape[0])
  if clusters > labels.shape[0]:
    logging.info("evaluation: %s: no NMI+: %d clusters (eval.overcluster=%s x %d classes) "
                 "exceed its %d items.", protocol, clusters, overcluster,
                 np.unique(labels).shape[0], labels.shape[0])
    return None
  return overcluster


def evaluate_splits(embed_fn: Callable, splits: Mapping, *, protocols: tuple[str, ...],
                    ks: tuple[int, ...], similarity: str = "cosine", batch_size: int = 512,
                    overcluster: float | None = None, seed: int = 0,
                    plot_dir: str | None = None, step: int = 0,
                    metrics_groups: Sequence[str] = protocols_lib.DEFAULT_METRICS,
                    rho_skip: int = 0,
                    kmeans_n_init: int = metrics.KMEANS_N_INIT, kmeans: str = "jax",
                    dataset: str | None = None, num_workers: int = 0, num_threads: int = 8,
                    show_progress: bool = False,
                    embedding_cache: dict | None = None) -> dict[str, dict[str, float]]:
  """Retrieval, clustering and spectral metrics for each protocol.

  Each split is embedded once (batched, with ``embed_fn``) and checked for NaN / inf rows.

  Args:
    embed_fn: ``images [b, H, W, C] -> embeddings [b, D]``.
    splits: ``{name: Split}`` as returned by ``dml_jax.data.load``.
    protocols: e.g. ``('test', 'train:digit', 'query@gallery')`` (module docstring).
    ks: Recall@K values; ``()`` means ``DEFAULT_KS[dataset]``.
    similarity: kNN similarity kind (``dml_jax.similarity``).
    batch_size: embedding batch size.
    overcluster: adds NMI+ with ``overcluster * classes`` clusters to every protocol where
      that is at most the number of query points (EPS Table 3: 30x on Omniglot's 20
      languages; its 659 letters have too few drawings, so those rows report NMI only).
    seed: KMeans seed.
    plot_dir: if given, writes ``embedding_<split>_step_<step>.png`` of every embedded split.
    step: the checkpoint step (names the plot).
    metrics_groups: any of ``METRIC_GROUPS``; default ``('retrieval', 'clustering')``
      (``'mrr'`` adds the mean reciprocal rank, ``'ami'`` and ``'f1'`` scores of the NMI
      clustering, and of the NMI+ one as ``'ami+'`` / ``'f1+'``).
    rho_skip: largest singular values left out of ``rho`` (``metrics.spectral_decay``).
    kmeans_n_init: k-means restarts of NMI / NMI+ (default 10).
    kmeans: the k-means of NMI / NMI+, ``'jax'`` (default) or ``'sklearn'``
      (``metrics.clustering_metrics``).
    num_workers, num_threads: decoding of the embedded images (:func:`embed`).
    dataset: the dataset name for ``ks=()``; ``None`` takes it from the split names
      (``'<dataset>:<split>'``).
    show_progress: progress bars for the embedding and the neighbour search.
    embedding_cache: a dict that receives ``{split: embeddings [N, D]}`` of every embedded
      split (splits already in it are not embedded again).

  Returns:
    ``{protocol: {'recall@K': ..., 'map@r': ..., 'r_precision': ..., 'nmi': ..., 'rho': ...}}``
    (the metrics of the groups asked for).

  Raises:
    ValueError: naming the protocol, for a bad protocol, NaN / inf embeddings (the rows are
      named), a K larger than the gallery, and the other errors of the metric functions.
  """
  groups = protocols_lib.check_metrics(metrics_groups)
  parsed = [(p, protocols_lib.parse_protocol(p, splits)) for p in protocols]
  retrieval = any(group in groups for group in protocols_lib.RETRIEVAL_GROUPS)
  scores = [{"clustering": "nmi"}.get(group, group) for group in protocols_lib.CLUSTERING_GROUPS
            if group in groups]   # the scores of the k-means partition
  if "retrieval" not in groups:
    ks = (1,)   # the mean reciprocal rank alone: the search needs no cut-off
  elif not ks:
    ks = protocols_lib.default_ks(dataset or _dataset_name(splits))
  cache: dict[str, np.ndarray] = {} if embedding_cache is None else embedding_cache

  def embedding(name: str) -> np.ndarray:
    if name not in cache:
      with _phase(f"embedding split {name!r} ({len(splits[name].labels):,} images)",
                  show_progress):
        emb = embed(embed_fn, splits[name].images, batch_size=batch_size,
                    show_progress=show_progress, desc=f"embed {name}",
                    num_workers=num_workers, num_threads=num_threads)
      cache[name] = knn.as_embeddings(f"The embeddings of split {name!r}", emb)
    return cache[name]

  results = {}
  seedings: dict[str, dict] = {}   # k-means++ seedings shared by the clusterings of a split
  for protocol, (split, label_set, gallery) in parsed:
    query = embedding(split)
    labels = protocols_lib.protocol_labels(splits[split], label_set)
    row = {}
    try:
      if retrieval:
        gallery_emb = None if gallery is None else embedding(gallery)
        gallery_labels = (None if gallery is None
                          else protocols_lib.protocol_labels(splits[gallery], label_set))
        with _phase(f"{protocol}: neighbours and retrieval metrics", show_progress):
          found = metrics.retrieval_metrics(
              query, labels, gallery_emb, gallery_labels, ks=tuple(ks), similarity=similarity,
              reciprocal_rank="mrr" in groups, show_progress=show_progress)
        row.update(found if "retrieval" in groups else {"mrr": found["mrr"]})
      geometry = _normalized(query) if similarity == "cosine" else query
      if scores:
        with _phase(f"{protocol}: k-means and {', '.join(s.upper() for s in scores)}",
                    show_progress):
          row.update(metrics.clustering_metrics(
              geometry, labels, seed=seed, n_init=kmeans_n_init, kmeans=kmeans,
              overcluster=(_feasible_overcluster(overcluster, labels, protocol)
                           if "clustering" in groups else None),
              seedings=seedings.setdefault(split, {}), scores=scores,
              show_progress=show_progress))
      if "spectral_decay" in groups:
        row["rho"] = metrics.spectral_decay(geometry, skip_largest=rho_skip)
    except ValueError as e:
      raise ValueError(f"Evaluation protocol {protocol!r}: {e}") from None
    results[protocol] = {k: float(v) for k, v in row.items()}
  if plot_dir is not None:
    for split, emb in cache.items():
      sp = splits[split]
      label_set = "digit" if "digit" in sp.label_sets else None
      colours = sp.label_sets[label_set] if label_set else sp.labels
      path = os.path.join(plot_dir, f"embedding_{split}_step_{step}.png")
      report.plot_embedding(emb, colours, path=path,
                     title=f"{split} embedding, step {step}, coloured by {label_set or 'label'}")
  return results


def _normalized(x: np.ndarray) -> np.ndarray:
  """Rows of ``x [N, D]`` scaled to unit L2 norm (zero rows stay zero)."""
  norm = np.linalg.norm(x, axis=1, keepdims=True)
  return x / np.maximum(norm, 1e-12)


def _dataset_name(splits: Mapping) -> str:
  """The dataset of ``Split.name = '<dataset>:<split>'`` shared by all splits."""
  names = {str(getattr(s, "name", "")).partition(":")[0] for s in splits.values()}
  if len(names) != 1:
    raise ValueError(f"eval.ks is empty and the splits do not name one dataset ({sorted(names)}"
                     "); set eval.ks.")
  return names.pop()


def grid_options(config) -> dict | None:
  """The retrieval grid ``config.eval`` asks for at every evaluation (``None``: off), as
  keyword arguments of ``retrieval_grid.write_grid``."""
  n = int(config.eval.get("retrieval_grid", 0))
  if not n:
    return None
  return {"num_queries": n, "k": int(config.eval.get("retrieval_grid_k", 8)),
          "mode": config.eval.get("retrieval_grid_queries", "random"), "seed": int(config.seed)}


def grid_path(workdir: str, protocol: str, step: int, mode: str = "random") -> str:
  """``<workdir>/retrieval_grid_<protocol>[_worst]_step_<N>.png`` (``:`` and ``@`` as ``_``)."""
  name = protocol.replace(":", "_").replace("@", "_at_")
  return os.path.join(workdir, f"retrieval_grid_{name}{'_worst' if mode == 'worst' else ''}"
                               f"_step_{step}.png")


def evaluate_with_config(config: ml_collections.ConfigDict, splits: Mapping, state: dict,
                         embed_fn: Callable, *, workdir: str,
                         step: int, plot: bool, show_progress: bool = False,
                         protocols: tuple[str, ...] | None = None, writer=None,
                         grid: dict | None = None,
                         embedding_cache: dict | None = None,
                         results_tag: str = "", settings: Mapping | None = None) -> dict:
  """Runs the config's evaluation (``config.eval``: protocols, ks, metrics, similarity, ...)
  of ``splits`` (``{name: Split}``) with the model ``embed_fn(state, images [B, H, W, C]) ->
  [B, D]`` and writes ``eval_step_N.json`` (process 0; ``eval_step_N.<results_tag>.json``
  with the ``settings`` it stands for, for an evaluation under settings other than the
  run's). ``eval.ks = ()`` means the dataset's ``DEFAULT_KS``.

  Also, on process 0: the retrieval grid of the first protocol (``grid``, default
  :func:`grid_options` of the config; :func:`grid_path`), and, when ``writer``
  (``writers.MetricWriter``) has a backend open, the similarity histograms of positive and
  negative pairs of every protocol's query split (``eval/<protocol>/similarity_positive`` /
  ``_negative``, at most 1,000 points each) and the PNGs written (embedding, grid). The caller
  writes the metrics themselves (``writer.write_row``).
  """
  options = protocols_lib.eval_options(config)
  if protocols is not None:
    options["protocols"] = tuple(protocols)
  main = jax.process_index() == 0
  cache = {} if embedding_cache is None else embedding_cache
  results = evaluate_splits(
      lambda images: embed_fn(state, images), splits, **options,
      plot_dir=workdir if plot and main else None, step=step,
      show_progress=show_progress, embedding_cache=cache)
  if not main:
    return results
  report.write_results(results, workdir=workdir, step=step, tag=results_tag, settings=settings)
  grid = grid_options(config) if grid is None else grid
  images = {}
  if grid:
    protocol = options["protocols"][0]
    path = grid_path(workdir, protocol, step, grid.get("mode", "random"))
    retrieval_grid.write_grid(cache, splits, protocol=protocol, path=path,
                              similarity=options["similarity"],
                              title=f"{protocol}, step {step}: {grid.get('mode', 'random')} "
                                    f"queries, top {grid.get('k', 8)} by "
                                    f"{options['similarity']}", **grid)
    images[f"retrieval_grid/{protocol}"] = path
  if writer is not None and writer.active:
    if plot:
      images.update({f"embedding/{split}": os.path.join(workdir,
                                                        f"embedding_{split}_step_{step}.png")
                     for split in cache})
    histograms = {}
    for protocol in options["protocols"]:
      split, label_set, _ = protocols_lib.parse_protocol(protocol, splits)
      pos, neg = triplet_scatter.pair_similarities(
          cache[split], protocols_lib.protocol_labels(splits[split], label_set),
          similarity=options["similarity"], seed=options["seed"])
      histograms[f"eval/{protocol}/similarity_positive"] = pos
      histograms[f"eval/{protocol}/similarity_negative"] = neg
    writer.histograms(step, histograms)
    writer.images(step, images)
  return results
