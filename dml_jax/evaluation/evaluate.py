"""Evaluation protocols: embed dataset splits with a model, compute metrics, write results.

A *protocol* is a string ``'split'`` or ``'split:label_set'``: embed ``splits[split]`` and
score it with its primary labels or with ``split.label_sets[label_set]`` (e.g.
``'train:digit'`` scores the even/odd training digits by their digit). Each protocol is
query = gallery with self excluded.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Mapping

import numpy as np

from dml_jax.evaluation import metrics


def parse_protocol(protocol: str, splits: Mapping) -> tuple[str, str | None]:
  """``'train:digit'`` -> ``('train', 'digit')``; validates both names against ``splits``."""
  split, _, label_set = protocol.partition(":")
  if split not in splits:
    raise ValueError(f"Evaluation protocol {protocol!r}: unknown split {split!r}; "
                     f"available: {', '.join(sorted(splits))}.")
  if label_set and label_set not in splits[split].label_sets:
    raise ValueError(f"Evaluation protocol {protocol!r}: split {split!r} has no label set "
                     f"{label_set!r}; available: {', '.join(sorted(splits[split].label_sets))}.")
  return split, label_set or None


def embed(embed_fn: Callable, images: np.ndarray, *, batch_size: int) -> np.ndarray:
  """Embeds ``images [N, H, W, C]`` in batches of a fixed shape (one compilation).

  The last batch is padded with copies of the first image and the padding is dropped.

  Returns:
    float32 ``[N, D]``.
  """
  n = len(images)
  if n == 0:
    raise ValueError("Cannot embed an empty split.")
  batch_size = min(batch_size, n)
  out = []
  for start in range(0, n, batch_size):
    chunk = images[start:start + batch_size]
    valid = len(chunk)
    if valid < batch_size:
      pad = np.repeat(images[:1], batch_size - valid, axis=0)
      chunk = np.concatenate([chunk, pad], axis=0)
    out.append(np.asarray(embed_fn(chunk), dtype=np.float32)[:valid])
  return np.concatenate(out, axis=0)


def evaluate_splits(embed_fn: Callable, splits: Mapping, *, protocols: tuple[str, ...],
                    ks: tuple[int, ...], similarity: str = "cosine", batch_size: int = 512,
                    overcluster: int | None = None, seed: int = 0,
                    plot_dir: str | None = None, step: int = 0) -> dict[str, dict[str, float]]:
  """Retrieval and clustering metrics for each protocol.

  Args:
    embed_fn: ``images [b, H, W, C] -> embeddings [b, D]``.
    splits: ``{name: Split}`` as returned by ``dml_jax.data.load``.
    protocols: e.g. ``('test', 'train:digit')``.
    ks: Recall@K values.
    similarity: kNN similarity kind (``dml_jax.similarity``).
    batch_size: embedding batch size.
    overcluster: adds NMI+ with ``overcluster * classes`` clusters.
    seed: KMeans seed.
    plot_dir: if given, writes ``embedding_<split>_step_<step>.png`` of every embedded split.
    step: the checkpoint step (names the plot).

  Returns:
    ``{protocol: {'recall@K': ..., 'map@r': ..., 'r_precision': ..., 'nmi': ...}}``.
  """
  parsed = [(p, *parse_protocol(p, splits)) for p in protocols]
  cache: dict[str, np.ndarray] = {}
  results = {}
  for protocol, split, label_set in parsed:
    if split not in cache:
      cache[split] = embed(embed_fn, splits[split].images, batch_size=batch_size)
    emb = cache[split]
    labels = splits[split].labels if label_set is None else splits[split].label_sets[label_set]
    row = metrics.retrieval_metrics(emb, labels, ks=tuple(ks), similarity=similarity)
    row.update(metrics.clustering_metrics(emb, labels, overcluster=overcluster, seed=seed))
    results[protocol] = {k: float(v) for k, v in row.items()}
  if plot_dir is not None:
    for split, emb in cache.items():
      sp = splits[split]
      label_set = "digit" if "digit" in sp.label_sets else None
      colours = sp.label_sets[label_set] if label_set else sp.labels
      path = os.path.join(plot_dir, f"embedding_{split}_step_{step}.png")
      plot_embedding(emb, colours, path=path,
                     title=f"{split} embedding, step {step}, coloured by {label_set or 'label'}")
  return results


def flatten(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
  """``{'test': {'recall@1': x}}`` -> ``{'eval/test/recall@1': x}`` for metrics.jsonl."""
  return {f"eval/{p}/{k}": v for p, row in results.items() for k, v in row.items()}


def results_path(workdir: str, step: int) -> str:
  return os.path.join(workdir, f"eval_step_{step}.json")


def write_results(results: Mapping, *, workdir: str, step: int) -> str:
  """Writes ``{'step': N, 'results': {protocol: metrics}}`` to ``eval_step_N.json``."""
  path = results_path(workdir, step)
  with open(path, "w") as f:
    json.dump({"step": step, "results": results}, f, indent=2, sort_keys=True)
  return path


def format_table(results: Mapping[str, Mapping[str, float]]) -> str:
  """A markdown table: a row per protocol, a column per metric (in percent)."""
  keys = []
  for row in results.values():
    keys += [k for k in row if k not in keys]
  lines = ["| protocol | " + " | ".join(keys) + " |",
           "|---|" + "---|" * len(keys)]
  for protocol, row in results.items():
    cells = [f"{100 * row[k]:.2f}" if k in row else "" for k in keys]
    lines.append(f"| {protocol} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot_embedding(embeddings: np.ndarray, labels: np.ndarray, *, path: str,
                   title: str) -> str:
  """Scatter PNG of ``embeddings [N, D]`` coloured by ``labels [N]`` (PCA to 2-D if D > 2)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  x = np.asarray(embeddings, np.float64)
  if x.shape[1] > 2:
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    x = x @ vt[:2].T
    title += " (PCA)"
  elif x.shape[1] == 1:
    x = np.concatenate([x, np.zeros_like(x)], axis=1)
  fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
  for label in np.unique(labels):
    sel = labels == label
    ax.scatter(x[sel, 0], x[sel, 1], s=6, alpha=0.7, label=str(label))
  ax.legend(markerscale=3, fontsize=8, loc="best")
  ax.set_title(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path
