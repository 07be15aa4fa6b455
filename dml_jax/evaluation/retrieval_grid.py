"""Retrieval grid: what a model retrieves, for a person to look at.

For ``n`` queries of a protocol, a row each: the query image, then its ``k`` most similar
gallery images (self excluded when the query split is its own gallery; ties by lower gallery
index, as ``knn.nearest_neighbors``), each framed green when it has the query's label and red
when not, with its similarity under it; the query's label is written under it by the name
the embedding plots use (the digit of the digits datasets, else the class).

Queries are drawn reproducibly: ``'random'`` takes ``n`` distinct queries with
``numpy.random.default_rng(seed)`` (shown in index order); ``'worst'`` takes the ``n`` with
the lowest average precision (MAP@R of the query alone, ``metrics.map_at_r``; queries without
another item of their class are never picked; ties by lower index).

Images are shown as the model's input undone: ``LazyImages`` (and the evaluation cache's
``DecodedImages``) de-normalised with their ``mean`` / ``std``, in-memory arrays in ``[0, 1]``
as they are (others min-max scaled per image); grey images are drawn grey.
"""

from __future__ import annotations

from typing import Mapping

import jax.numpy as jnp
import numpy as np

from dml_jax import similarity as sim
from dml_jax.data import images as images_lib
from dml_jax.evaluation import knn
from dml_jax.evaluation import metrics
from dml_jax.evaluation import protocols as protocols_lib
from dml_jax.evaluation import report

QUERY_MODES = ("random", "worst")


def average_precisions(query, labels, gallery=None, gallery_labels=None, *,
                       similarity: str = "cosine") -> np.ndarray:
  """Per-query MAP@R ``[Nq]`` (NaN for a query with no other item of its class).

  Args:
    query: float ``[Nq, D]``; labels: int ``[Nq]``.
    gallery, gallery_labels: float ``[Ng, D]`` and int ``[Ng]``; ``None``: the query set,
      self excluded.
  """
  labels = np.asarray(labels)
  exclude_self = gallery is None
  g_labels = labels if exclude_self else np.asarray(gallery_labels)
  num_relevant = metrics.positive_counts(labels, g_labels, exclude_self=exclude_self)
  max_r = max(int(num_relevant.max()), 1)
  _, relevant = knn.neighbor_relevance(query, labels, gallery, gallery_labels, k=max_r,
                                       num_columns=max_r, similarity=similarity)
  return metrics.map_at_r(relevant, num_relevant)


def choose_queries(num_queries: int, n: int, *, mode: str = "random", seed: int = 0,
                   average_precision: np.ndarray | None = None) -> np.ndarray:
  """Indices int ``[n]`` of the grid's queries among ``num_queries`` (module docstring).

  Raises:
    ValueError: ``n`` outside ``[1, num_queries]`` (or beyond the queries that have an AP
      with ``'worst'``), or an unknown ``mode``.
  """
  if mode not in QUERY_MODES:
    raise ValueError(f"Unknown retrieval grid query mode {mode!r}; use one of {QUERY_MODES}.")
  if not 1 <= n <= num_queries:
    raise ValueError(f"A retrieval grid of {n} queries needs 1 to {num_queries} (the size of "
                     "the query set).")
  if mode == "random":
    return np.sort(np.random.default_rng(seed).choice(num_queries, n, replace=False))
  ap = np.asarray(average_precision, np.float64)
  ranked = [int(i) for i in np.argsort(np.where(np.isnan(ap), np.inf, ap), kind="stable")
            if not np.isnan(ap[i])]
  if n > len(ranked):
    raise ValueError(f"A 'worst' retrieval grid of {n} queries: only {len(ranked)} queries have "
                     "another item of their class.")
  return np.asarray(ranked[:n])


def top_k(query, gallery=None, *, rows: np.ndarray, k: int,
          similarity: str = "cosine") -> tuple[np.ndarray, np.ndarray]:
  """The ``k`` nearest gallery items of the queries ``rows``.

  Args:
    query: float ``[Nq, D]``; gallery: float ``[Ng, D]`` or ``None`` (the query set, self
      excluded).
    rows: int ``[n]`` query indices.

  Returns:
    int ``[n, k]`` gallery indices and float32 ``[n, k]`` similarities, by decreasing
    similarity (ties: lower index); for ``'neg_sq_euclidean'`` computed, as the search does,
    on the embeddings moved by ``knn.euclidean_shift`` (the same distances, without the
    rounding of embeddings far from the origin).
  """
  query = np.asarray(query, np.float32)
  base = query if gallery is None else np.asarray(gallery, np.float32)
  available = len(base) - (gallery is None)
  if not 1 <= k <= available:
    raise ValueError(f"retrieval_grid_k={k} must be between 1 and {available} (gallery size).")
  base, query = knn.near_origin(similarity, base, query)   # the search's rounding
  s = np.array(sim.pairwise_similarity(jnp.asarray(query[rows]), jnp.asarray(base),
                                       kind=similarity), np.float32)
  if gallery is None:
    s[np.arange(len(rows)), rows] = -np.inf
  order = np.argsort(-s, axis=1, kind="stable")[:, :k]
  return order.astype(np.int32), np.take_along_axis(s, order, axis=1)


def display_images(images, idx: np.ndarray) -> np.ndarray:
  """float ``[n, H, W, 3]`` in ``[0, 1]`` of ``images[idx]`` (module docstring)."""
  idx = np.asarray(idx)
  x = np.asarray(images[idx], np.float32)
  if images_lib.is_image_view(images):
    x = x * np.asarray(images.options.std, np.float32) + np.asarray(images.options.mean,
                                                                     np.float32)
  elif x.size and (x.min() < 0 or x.max() > 1):
    lo = x.min(axis=(1, 2, 3), keepdims=True)
    hi = x.max(axis=(1, 2, 3), keepdims=True)
    x = (x - lo) / np.maximum(hi - lo, 1e-12)
  x = np.clip(x, 0.0, 1.0)
  return np.repeat(x, 3, axis=-1) if x.shape[-1] == 1 else x[..., :3]


def display_labels(split) -> tuple[str, np.ndarray]:
  """The labels a person reads for ``split``'s images, those its embedding plot is coloured
  by: ``('digit', the digits)`` when it has that label set, else ``('class', its labels)``."""
  if "digit" in split.label_sets:
    return "digit", np.asarray(split.label_sets["digit"])
  return "class", np.asarray(split.labels)


def plot_grid(query_images: np.ndarray, query_labels: np.ndarray, result_images: np.ndarray,
              result_labels: np.ndarray, similarities: np.ndarray, *, path: str,
              title: str = "", query_captions=None) -> str:
  """Draws the grid PNG.

  Args:
    query_images: float ``[n, H, W, 3]`` in ``[0, 1]``; query_labels: ``[n]``.
    result_images: float ``[n, k, H, W, 3]``; result_labels: ``[n, k]``;
      similarities: ``[n, k]``.
    query_captions: ``n`` texts under the queries (``None``: ``'class <label>'``).
  """
  plt = report.pyplot()
  n, k = result_labels.shape
  width, height = 1.05 * (k + 1), 1.3 * n + 0.4
  fig, axes = plt.subplots(n, k + 1, figsize=(width, height), dpi=90, squeeze=False)
  fig.subplots_adjust(left=0.01, right=0.99, top=1 - 0.35 / height, bottom=0.25 / height,
                      wspace=0.08, hspace=0.3)
  if query_captions is None:
    query_captions = [f"class {label}" for label in query_labels]
  for i in range(n):
    cells = [(query_images[i], "black", f"query, {query_captions[i]}")]
    for j in range(k):
      same = result_labels[i, j] == query_labels[i]
      cells.append((result_images[i, j], "tab:green" if same else "tab:red",
                    f"{similarities[i, j]:.3f}"))
    for ax, (image, colour, text) in zip(axes[i], cells):
      ax.imshow(image, interpolation="nearest")
      ax.set_xticks([])
      ax.set_yticks([])
      for spine in ax.spines.values():
        spine.set_edgecolor(colour)
        spine.set_linewidth(3 if colour != "black" else 1)
      ax.set_xlabel(text, fontsize=7, labelpad=1,
                    color="black" if colour == "black" else colour)
  if title:
    fig.suptitle(title, fontsize=9, y=1 - 0.08 / height, va="top")
  fig.savefig(path)
  plt.close(fig)
  return path


def write_grid(embeddings: Mapping[str, np.ndarray], splits: Mapping, *, protocol: str,
               path: str, num_queries: int, k: int = 8, mode: str = "random", seed: int = 0,
               similarity: str = "cosine", title: str = "") -> dict:
  """The retrieval grid of ``protocol`` from already computed embeddings, as a PNG at ``path``.

  Args:
    embeddings: split name -> float ``[N, D]`` (the protocol's query and gallery splits).
    splits: split name -> ``Split``.
    protocol: ``'split[:label_set][@gallery]'`` (``protocols``).
    num_queries, k, mode, seed: the grid (module docstring).

  Returns:
    ``{'path', 'queries' [n], 'neighbours' [n, k], 'similarities' [n, k], 'correct' [n, k],
    'captions' [n]}``; a query's caption names its label as the embedding plots do
    (:func:`display_labels`).

  Raises:
    ValueError: ``num_queries`` larger than the query set, a bad ``k`` or mode.
  """
  split, label_set, gallery = protocols_lib.parse_protocol(protocol, splits)
  query_labels = protocols_lib.protocol_labels(splits[split], label_set)
  gallery_split = split if gallery is None else gallery
  gallery_labels = protocols_lib.protocol_labels(splits[gallery_split], label_set)
  query = embeddings[split]
  gallery_emb = None if gallery is None else embeddings[gallery]
  try:
    ap = None
    if mode == "worst":
      ap = average_precisions(query, query_labels, gallery_emb,
                              None if gallery is None else gallery_labels, similarity=similarity)
    rows = choose_queries(len(query), num_queries, mode=mode, seed=seed, average_precision=ap)
    neighbours, sims = top_k(query, gallery_emb, rows=rows, k=k, similarity=similarity)
  except ValueError as e:
    raise ValueError(f"Retrieval grid of protocol {protocol!r}: {e}") from None
  q_images = display_images(splits[split].images, rows)
  r_images = display_images(splits[gallery_split].images, neighbours.reshape(-1))
  r_images = r_images.reshape(neighbours.shape + r_images.shape[1:])
  result_labels = gallery_labels[neighbours]
  name, shown = display_labels(splits[split])
  captions = [f"{name} {shown[r]}" for r in rows]
  plot_grid(q_images, query_labels[rows], r_images, result_labels, sims, path=path,
            title=title or f"{protocol}: {mode} queries, top {k}", query_captions=captions)
  return {"path": path, "queries": rows, "neighbours": neighbours, "similarities": sims,
          "correct": result_labels == query_labels[rows][:, None], "captions": captions}
