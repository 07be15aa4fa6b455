"""Retrieval (Recall@K, MAP@R, R-precision) and clustering (NMI, NMI+) metrics.

Retrieval follows Musgrave et al., "A Metric Learning Reality Check" (2020). For a query ``q``
with label ``y_q`` let ``n_1, n_2, ...`` be its gallery neighbours by decreasing similarity
(ties: lower gallery index first; self excluded when the query set is its own gallery),
``rel(i) = [y_{n_i} = y_q]`` and ``R`` the number of gallery items with label ``y_q`` (self
excluded). Then

  Recall@K    = [sum_{i <= K} rel(i) > 0]
  R-precision = (1/R) sum_{i <= R} rel(i)
  MAP@R       = (1/R) sum_{i <= R} P(i) rel(i),   P(i) = (1/i) sum_{j <= i} rel(j)

each averaged over the queries. Queries with ``R = 0`` (no other item of their class in the
gallery) have no defined MAP@R / R-precision and can never score Recall@K; they are excluded
from *all* averages (as in Musgrave et al.'s code) and their number is logged as a warning.

The neighbour search is the exact blocked search of :mod:`dml_jax.evaluation.knn` with
``k = max(max(ks), max R)``, so MAP@R and R-precision are exact. The per-query functions below
are plain numpy on a relevance matrix ``relevant [Nq, k]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import logging
import numpy as np
from sklearn import cluster
from sklearn import metrics as sk_metrics

from dml_jax.evaluation import knn

KMEANS_N_INIT = 10  # KMeans restarts (best inertia kept) for NMI / NMI+.


def positive_counts(query_labels, gallery_labels, *, exclude_self: bool) -> np.ndarray:
  """``R``: the number of gallery items sharing each query's label.

  ``R_i = #{j : y^g_j = y^q_i} - [exclude_self]``.

  Args:
    query_labels: int ``[Nq]``.
    gallery_labels: int ``[Ng]``.
    exclude_self: the query set is the gallery (``Nq = Ng``); do not count the query itself.

  Returns:
    int64 ``[Nq]``.
  """
  query_labels = np.asarray(query_labels)
  gallery_labels = np.asarray(gallery_labels)
  _, codes = np.unique(np.concatenate([query_labels, gallery_labels]), return_inverse=True)
  counts = np.bincount(codes[query_labels.shape[0]:], minlength=int(codes.max()) + 1)
  return counts[codes[:query_labels.shape[0]]] - int(exclude_self)


def recall_at_k(relevant, *, ks: Sequence[int]) -> np.ndarray:
  """Per-query hits: ``hit[i, m] = any(relevant[i, :ks[m]])``.

  Args:
    relevant: bool ``[Nq, k]``, ``relevant[i, r]`` = the ``(r+1)``-th neighbour of query
      ``i`` has its label; ``k >= max(ks)``.
    ks: the cut-offs ``K``.

  Returns:
    float64 ``[Nq, len(ks)]`` of zeros and ones.
  """
  relevant = np.asarray(relevant, dtype=bool)
  first_hit = np.cumsum(relevant, axis=1) > 0
  return first_hit[:, np.asarray(ks) - 1].astype(np.float64)


def r_precision(relevant, num_relevant) -> np.ndarray:
  """Per-query R-precision: ``(1/R) sum_{i <= R} rel(i)``.

  Args:
    relevant: bool ``[Nq, k]`` with ``k >= max(R)``.
    num_relevant: int ``[Nq]``, ``R``; queries with ``R = 0`` get NaN.

  Returns:
    float64 ``[Nq]``.
  """
  hits, num_relevant = _hits_within_r(relevant, num_relevant)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(num_relevant > 0, hits.sum(axis=1) / num_relevant, np.nan)


def map_at_r(relevant, num_relevant) -> np.ndarray:
  """Per-query MAP@R: ``(1/R) sum_{i <= R} P(i) rel(i)``, ``P(i) = (1/i) sum_{j <= i} rel(j)``.

  Args:
    relevant: bool ``[Nq, k]`` with ``k >= max(R)``.
    num_relevant: int ``[Nq]``, ``R``; queries with ``R = 0`` get NaN.

  Returns:
    float64 ``[Nq]``.
  """
  hits, num_relevant = _hits_within_r(relevant, num_relevant)
  precision = np.cumsum(hits, axis=1) / np.arange(1, hits.shape[1] + 1)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(num_relevant > 0, (precision * hits).sum(axis=1) / num_relevant, np.nan)


def retrieval_metrics(query, query_labels, gallery=None, gallery_labels=None, *,
                      ks: Sequence[int] = (1, 2, 4, 8), similarity: str = "cosine",
                      block_size: int | None = None) -> dict[str, float]:
  """Recall@K, MAP@R and R-precision of a query set against a gallery.

  See the module docstring for the formulas; each metric is the mean over the queries with
  ``R > 0`` (queries without another item of their class in the gallery are excluded and
  counted in a logged warning).

  Args:
    query: float ``[Nq, D]`` embeddings.
    query_labels: int ``[Nq]``.
    gallery: float ``[Ng, D]``; ``None`` means the query set is its own gallery, self excluded.
    gallery_labels: int ``[Ng]``; given exactly when ``gallery`` is.
    ks: the cut-offs of Recall@K, each in ``[1, Ng]`` (``Ng - 1`` when self is excluded).
    similarity: ``'cosine'``, ``'dot'`` or ``'neg_sq_euclidean'`` (a kind of
      :func:`dml_jax.similarity.pairwise_similarity`; higher = closer).
    block_size: queries per block of the neighbour search; ``None`` derives it from a
      memory budget (:func:`dml_jax.evaluation.knn.block_sizes`).

  Returns:
    ``{'recall@K': ... for K in ks, 'map@r': ..., 'r_precision': ...}``, Python floats in
    ``[0, 1]``.
  """
  exclude_self = gallery is None
  if (gallery is None) != (gallery_labels is None):
    raise ValueError("gallery and gallery_labels must be given together (or both None); got "
                     f"gallery={'None' if gallery is None else 'array'}, gallery_labels="
                     f"{'None' if gallery_labels is None else 'array'}.")
  query_labels = _as_labels("query_labels", query_labels, _num_rows("query", query))
  if exclude_self:
    gallery_labels = query_labels
  else:
    gallery_labels = _as_labels("gallery_labels", gallery_labels,
                                _num_rows("gallery", gallery))
  available = gallery_labels.shape[0] - int(exclude_self)
  ks = _as_ks(ks, available)
  num_relevant = positive_counts(query_labels, gallery_labels, exclude_self=exclude_self)
  valid = num_relevant > 0
  if not valid.any():
    raise ValueError("no query has an item of its class in the gallery (R = 0 for all "
                     f"{valid.shape[0]} queries); retrieval metrics are undefined.")
  if not valid.all():
    logging.warning("retrieval_metrics: %d of %d queries have no item of their class in the "
                    "gallery (R = 0) and are excluded.", int((~valid).sum()), valid.shape[0])
  k = max(max(ks), int(num_relevant.max()))
  indices, _ = knn.nearest_neighbors(query, gallery, k=k, similarity=similarity,
                                     block_size=block_size)
  relevant = (gallery_labels[indices] == query_labels[:, None])[valid]
  num_relevant = num_relevant[valid]
  recalls = recall_at_k(relevant, ks=ks).mean(axis=0)
  result = {f"recall@{kk}": float(r) for kk, r in zip(ks, recalls)}
  result["map@r"] = float(map_at_r(relevant, num_relevant).mean())
  result["r_precision"] = float(r_precision(relevant, num_relevant).mean())
  return result


def clustering_metrics(embeddings, labels, *, n_clusters: int | None = None,
                       overcluster: float | None = None, seed: int = 0) -> dict[str, float]:
  """NMI of a KMeans clustering of the embeddings with the labels, and the over-clustered NMI+.

  ``NMI(Y, C) = I(Y; C) / ((H(Y) + H(C)) / 2)`` (sklearn's
  ``normalized_mutual_info_score``, arithmetic mean), where ``C`` is the assignment of
  ``sklearn.cluster.KMeans(n_clusters=k, n_init=KMEANS_N_INIT (10), random_state=seed)`` on
  the raw embeddings (Euclidean; pass L2-normalised embeddings for the cosine geometry).

  * ``'nmi'``: ``k = n_clusters``, or the number of distinct labels ``C``;
  * ``'nmi+'`` (only when ``overcluster`` is given): ``k = round(overcluster * C)``, the
    over-clustered NMI of the EPS paper (Levi et al., which uses factors 10 and 30).

  Args:
    embeddings: float ``[N, D]``.
    labels: int ``[N]``.
    n_clusters: clusters of ``'nmi'``, in ``[1, N]``; ``None`` means the number of classes.
    overcluster: factor ``> 0`` of NMI+, with ``round(overcluster * C)`` in ``[1, N]``.
    seed: the KMeans random state.

  Returns:
    ``{'nmi': ...}`` plus ``'nmi+'`` when ``overcluster`` is given; Python floats in
    ``[0, 1]``.
  """
  x = knn.as_embeddings("embeddings", embeddings)
  labels = _as_labels("labels", labels, x.shape[0])
  num_classes = int(np.unique(labels).shape[0])
  if n_clusters is None:
    n_clusters = num_classes
  _check_num_clusters("n_clusters", n_clusters, x.shape[0])
  if overcluster is not None:
    if (isinstance(overcluster, bool) or not isinstance(overcluster, (int, float, np.number))
        or not overcluster > 0):
      raise ValueError(f"overcluster must be a positive number, got {overcluster!r}.")
    k_plus = int(round(overcluster * num_classes))
    _check_num_clusters(f"overcluster * num_classes = {overcluster} * {num_classes}", k_plus,
                        x.shape[0])
  result = {"nmi": _kmeans_nmi(x, labels, n_clusters=n_clusters, seed=seed)}
  if overcluster is not None:
    result["nmi+"] = _kmeans_nmi(x, labels, n_clusters=k_plus, seed=seed)
  return result


def _kmeans_nmi(x: np.ndarray, labels: np.ndarray, *, n_clusters: int, seed: int) -> float:
  """NMI of ``labels [N]`` with a seeded KMeans clustering of ``x [N, D]`` into ``n_clusters``."""
  assignment = cluster.KMeans(n_clusters=n_clusters, n_init=KMEANS_N_INIT,
                              random_state=seed).fit_predict(x)
  return float(sk_metrics.normalized_mutual_info_score(labels, assignment))


def _hits_within_r(relevant, num_relevant) -> tuple[np.ndarray, np.ndarray]:
  """``relevant [Nq, k]`` masked to the first ``R_i`` columns of each row, and ``R [Nq]``."""
  relevant = np.asarray(relevant, dtype=bool)
  num_relevant = np.asarray(num_relevant)
  if relevant.ndim != 2 or num_relevant.shape != relevant.shape[:1]:
    raise ValueError(f"relevant must be [Nq, k] and num_relevant [Nq], got shapes "
                     f"{relevant.shape} and {num_relevant.shape}.")
  if num_relevant.size and num_relevant.max() > relevant.shape[1]:
    raise ValueError(f"relevant has {relevant.shape[1]} neighbours per query but R goes up "
                     f"to {num_relevant.max()}; MAP@R and R-precision need k >= max R.")
  within = np.arange(1, relevant.shape[1] + 1)[None, :] <= num_relevant[:, None]
  return relevant & within, num_relevant


def _num_rows(name: str, x) -> int:
  shape = np.shape(x)
  if len(shape) != 2:
    raise ValueError(f"{name} must have rank 2 [N, D], got shape {shape}.")
  return shape[0]


def _as_labels(name: str, labels, num_rows: int) -> np.ndarray:
  """``labels`` as a numpy int ``[num_rows]`` array."""
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"{name} must have rank 1 [N], got shape {labels.shape}.")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"{name} must be integers, got dtype {labels.dtype}.")
  if labels.shape[0] != num_rows:
    raise ValueError(f"{name} has {labels.shape[0]} entries but its embeddings have "
                     f"{num_rows} rows.")
  return labels


def _as_ks(ks, available: int) -> tuple[int, ...]:
  """``ks`` as a non-empty tuple of ints in ``[1, available]``."""
  ks = (ks,) if isinstance(ks, (int, np.integer)) else tuple(ks)
  if not ks:
    raise ValueError("ks must name at least one cut-off K.")
  for kk in ks:
    if isinstance(kk, bool) or not isinstance(kk, (int, np.integer)) or kk < 1:
      raise ValueError(f"ks must be positive integers, got {kk!r} in {ks}.")
    if kk > available:
      raise ValueError(f"Recall@{kk} asks for more neighbours than the {available} gallery "
                       f"items available (self excluded); use ks <= {available}.")
  return tuple(int(kk) for kk in ks)


def _check_num_clusters(name: str, k, num_points: int) -> None:
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= num_points:
    raise ValueError(f"{name} must be an integer number of clusters in [1, {num_points}] "
                     f"(the number of points), got {k!r}.")
