"""Retrieval (Recall@K, MAP@R, R-precision, MRR), clustering (NMI, NMI+, AMI, F1) and spectral
(rho) metrics.

Retrieval follows Musgrave et al., "A Metric Learning Reality Check" (2020). For a query ``q``
with label ``y_q`` let ``n_1, n_2, ...`` be its gallery neighbours by decreasing similarity
(ties: lower gallery index first; self excluded when the query set is its own gallery),
``rel(i) = [y_{n_i} = y_q]`` and ``R`` the number of gallery items with label ``y_q`` (self
excluded). Then

  Recall@K    = [sum_{i <= K} rel(i) > 0]
  R-precision = (1/R) sum_{i <= R} rel(i)
  MAP@R       = (1/R) sum_{i <= R} P(i) rel(i),   P(i) = (1/i) sum_{j <= i} rel(j)
  MRR         = 1 / min{i : rel(i) = 1}   (on request; the whole gallery ranked)

each averaged over the queries. Queries with ``R = 0`` (no other item of their class in the
gallery) have no defined MAP@R / R-precision and can never score Recall@K; they are excluded
from *all* averages (as in Musgrave et al.'s code) and their number is logged as a warning.

The neighbour search is the exact blocked search of :mod:`dml_jax.evaluation.knn` with
``k = max(max(ks), max R)``, so MAP@R and R-precision are exact; on the device it reduces each
query block to the rank of the first relevant neighbour (Recall@K for every K) and the
relevance of the first ``max R`` neighbours (MAP@R, R-precision), so the host never holds an
``[Nq, k]`` array. The per-query functions below are plain numpy (float64) on a relevance
matrix ``relevant [Nq, k]``.

Clustering: NMI and NMI+ of a seeded k-means clustering (``evaluation.kmeans`` in JAX by
default, scikit-learn's KMeans with ``eval.kmeans='sklearn'``; ``n_init`` restarts) with the
labels, NMI computed by :func:`cluster_scores.nmi` (arithmetic normalisation, as scikit-learn,
PML and Roth et al.'s code; the label-noise paper defines the geometric one); on request also
the adjusted mutual information and the pairwise F1 of Song et al. of the same clustering
(:mod:`dml_jax.evaluation.cluster_scores`). Spectral decay ``rho`` (Roth et
al., "Revisiting Training Strategies and Generalization Performance in Deep Metric Learning",
ICML 2020) is a class-collapse / compression diagnostic: see :func:`spectral_decay`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from absl import logging
import numpy as np

from dml_jax.evaluation import cluster_scores
from dml_jax.evaluation import kmeans as kmeans_lib
from dml_jax.evaluation import knn

KMEANS_N_INIT = 10  # k-means restarts (best inertia kept) for NMI / NMI+.
KMEANS_IMPLEMENTATIONS = ("jax", "sklearn")
SPECTRUM_FLOOR = 1e-12  # Normalised singular values are clipped below to this in rho.


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
                      block_size: int | None = None,
                      memory_bytes: int = knn.DEFAULT_MEMORY_BYTES,
                      reciprocal_rank: bool = False,
                      show_progress: bool = False) -> dict[str, float]:
  """Recall@K, MAP@R and R-precision of a query set against a gallery (and the MRR).

  See the module docstring for the formulas; each metric is the mean over the queries with
  ``R > 0`` (queries without another item of their class in the gallery are excluded and
  counted in a logged warning).

  Args:
    query: float ``[Nq, D]`` embeddings.
    query_labels: int ``[Nq]``.
    gallery: float ``[Ng, D]``; ``None`` means the query set is its own gallery, self excluded
      (so does the query array itself, ``gallery is query`` with ``gallery_labels is
      query_labels``, as PML's ``ref_includes_query``).
    gallery_labels: int ``[Ng]``; given exactly when ``gallery`` is.
    ks: the cut-offs of Recall@K, each in ``[1, Ng]`` (``Ng - 1`` when self is excluded).
    similarity: ``'cosine'``, ``'dot'`` or ``'neg_sq_euclidean'`` (a kind of
      :func:`dml_jax.similarity.pairwise_similarity`; higher = closer).
    block_size: queries per block of the neighbour search; ``None`` derives it from a
      memory budget (:func:`dml_jax.evaluation.knn.block_sizes`).
    memory_bytes: that budget (default 256 MiB of temporaries per query block).
    reciprocal_rank: also ``'mrr'``, the mean reciprocal rank ``1 / rank`` of each query's
      first item of its class, the rank exact over the whole gallery (no cut-off).
    show_progress: a progress bar over the query blocks.

  Returns:
    ``{'recall@K': ... for K in ks, 'map@r': ..., 'r_precision': ...}`` (and ``'mrr'``),
    Python floats in ``[0, 1]``.

  Raises:
    ValueError: bad shapes or dtypes, non-finite embeddings (the rows are named), label and
      embedding counts that differ, an empty gallery, a ``K`` larger than the gallery, or no
      query with an item of its class in the gallery.
  """
  if gallery is query and gallery_labels is query_labels:   # the query set itself
    gallery = gallery_labels = None
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
  if query_labels.shape[0] == 0:
    raise ValueError("the query set is empty (0 items).")
  available = gallery_labels.shape[0] - int(exclude_self)
  if available < 1:
    raise ValueError("the gallery is empty (0 items)." if not exclude_self else
                     "the query set has a single item, so its gallery (the other items) is "
                     "empty.")
  ks = check_ks(ks, available)
  num_relevant = positive_counts(query_labels, gallery_labels, exclude_self=exclude_self)
  valid = num_relevant > 0
  if not valid.any():
    raise ValueError("no query has an item of its class in the gallery (R = 0 for all "
                     f"{valid.shape[0]} queries); retrieval metrics are undefined.")
  if not valid.all():
    logging.warning("retrieval_metrics: %d of %d queries have no item of their class in the "
                    "gallery (R = 0) and are excluded.", int((~valid).sum()), valid.shape[0])
  max_r = int(num_relevant.max())
  # the rank of each query's first item of its class is exact below k (capped at k), so the
  # reciprocal rank searches the whole gallery: the same top-m search, the rank counted exactly
  first, relevant = knn.neighbor_relevance(
      query, query_labels, gallery, None if exclude_self else gallery_labels,
      k=available if reciprocal_rank else max(max(ks), max_r), num_columns=max_r,
      similarity=similarity, block_size=block_size, memory_bytes=memory_bytes,
      show_progress=show_progress)
  first, relevant, num_relevant = first[valid], relevant[valid], num_relevant[valid]
  recalls = (first[:, None] < np.asarray(ks)[None, :]).mean(axis=0)
  result = {f"recall@{kk}": float(r) for kk, r in zip(ks, recalls)}
  result["map@r"] = float(map_at_r(relevant, num_relevant).mean())
  result["r_precision"] = float(r_precision(relevant, num_relevant).mean())
  if reciprocal_rank:
    result["mrr"] = float(np.mean(1.0 / (first.astype(np.float64) + 1.0)))
  return result


def clustering_metrics(embeddings, labels, *, n_clusters: int | None = None,
                       overcluster: float | None = None, seed: int = 0,
                       n_init: int = KMEANS_N_INIT, kmeans: str = "jax",
                       seedings: dict | None = None, scores: Sequence[str] = ("nmi",),
                       show_progress: bool = False) -> dict[str, float]:
  """NMI of a k-means clustering of the embeddings with the labels, and the over-clustered NMI+.

  ``NMI(Y, C) = I(Y; C) / ((H(Y) + H(C)) / 2)`` (:func:`nmi`, arithmetic mean, equal to
  sklearn's ``normalized_mutual_info_score``), where ``C`` is the k-means assignment of the
  given embeddings (Euclidean; pass L2-normalised embeddings for the cosine geometry), the
  restart of lowest inertia of ``n_init``:

  * ``kmeans='jax'`` (default): :func:`dml_jax.evaluation.kmeans.kmeans` on the default
    device (k-means++ seeding in rounds, Lloyd iterations; seconds on a GPU, and its time does
    not depend on other processes' threads);
  * ``kmeans='sklearn'``: ``sklearn.cluster.KMeans(n_clusters=k, n_init=n_init,
    random_state=seed)`` (greedy k-means++, Lloyd), what the library used before; the two
    reach inertias within a fraction of a percent of each other, but not the same partitions,
    so NMI moves by about the spread of k-means between seeds.

  * ``'nmi'``: ``k = n_clusters``, or the number of distinct labels ``C``;
  * ``'ami'`` and ``'f1'`` (when ``scores`` names them): the adjusted mutual information
    and the pairwise F1 of Song et al. of that same clustering (:mod:`cluster_scores`);
  * ``'nmi+'`` (only when ``overcluster`` is given): ``k = round(overcluster * C)``, the
    over-clustered NMI of the EPS paper (Levi et al., which uses factors 10 and 30); with
    ``'ami'`` / ``'f1'`` in ``scores`` also ``'ami+'`` / ``'f1+'`` of that clustering.

  Args:
    embeddings: float ``[N, D]``.
    labels: int ``[N]``.
    n_clusters: clusters of ``'nmi'``, in ``[1, N]``; ``None`` means the number of classes.
    overcluster: factor ``> 0`` of NMI+, with ``round(overcluster * C)`` in ``[1, N]``.
    seed: the k-means random seed.
    n_init: k-means restarts (default ``KMEANS_N_INIT`` = 10).
    kmeans: ``'jax'`` or ``'sklearn'`` (above).
    seedings: ``'jax'`` only: a dict kept for these embeddings across calls, in which the
      k-means++ seedings are kept and shared (:func:`dml_jax.evaluation.kmeans.kmeans`); the
      same numbers as without it.
    scores: the scores of the ``n_clusters`` clustering, one or more of ``'nmi'``, ``'ami'``,
      ``'f1'`` (``cluster_scores.SCORES``).
    show_progress: a progress line per k-means restart.

  Returns:
    ``{'nmi': ...}`` (the ``scores``) plus ``'nmi+'`` (and the other scores with a ``+``) when
    ``overcluster`` is given; Python floats in ``[0, 1]`` (AMI can be slightly negative).
  """
  x = knn.as_embeddings("embeddings", embeddings)
  labels = _as_labels("labels", labels, x.shape[0])
  num_classes = int(np.unique(labels).shape[0])
  if n_clusters is None:
    n_clusters = num_classes
  _check_num_clusters("n_clusters", n_clusters, x.shape[0])
  if isinstance(n_init, bool) or not isinstance(n_init, (int, np.integer)) or n_init < 1:
    raise ValueError(f"n_init must be a positive integer (KMeans restarts), got {n_init!r}.")
  if kmeans not in KMEANS_IMPLEMENTATIONS:
    raise ValueError(f"kmeans must be one of {', '.join(KMEANS_IMPLEMENTATIONS)}, got "
                     f"{kmeans!r}.")
  scores = (scores,) if isinstance(scores, str) else tuple(scores)
  if not scores or any(score not in cluster_scores.SCORES for score in scores):
    raise ValueError(f"scores must name one or more of {', '.join(cluster_scores.SCORES)}, got "
                     f"{scores!r}.")
  if overcluster is not None:
    if (isinstance(overcluster, bool) or not isinstance(overcluster, (int, float, np.number))
        or not overcluster > 0):
      raise ValueError(f"overcluster must be a positive number, got {overcluster!r}.")
    k_plus = int(round(overcluster * num_classes))
    _check_num_clusters(f"overcluster * num_classes = {overcluster} * {num_classes}", k_plus,
                        x.shape[0])
  assign = functools.partial(kmeans_assignment, x, seed=seed, n_init=n_init,
                             implementation=kmeans, seedings=seedings,
                             show_progress=show_progress)
  assignment = assign(n_clusters=n_clusters)
  result = {score: cluster_scores.SCORES[score](labels, assignment) for score in scores}
  if overcluster is not None:
    assignment = assign(n_clusters=k_plus)
    result.update({f"{score}+": cluster_scores.SCORES[score](labels, assignment)
                   for score in dict.fromkeys(("nmi", *scores))})
  return result


def kmeans_assignment(x, *, n_clusters: int, seed: int = 0, n_init: int = KMEANS_N_INIT,
                      implementation: str = "jax", seedings: dict | None = None,
                      show_progress: bool = False) -> np.ndarray:
  """Cluster ids int ``[N]`` of k-means on ``x [N, D]``: ``kmeans.kmeans`` (``'jax'``, with
  its ``seedings``) or ``sklearn.cluster.KMeans(n_clusters, n_init, random_state=seed)``
  (``'sklearn'``)."""
  if implementation == "sklearn":
    # imported here: scikit-learn (and the SciPy it loads) takes seconds to import, and only
    # this option uses it
    from sklearn import cluster  # pylint: disable=import-outside-toplevel
    return cluster.KMeans(n_clusters=n_clusters, n_init=n_init,
                          random_state=seed).fit_predict(np.asarray(x))
  return kmeans_lib.kmeans(x, n_clusters=n_clusters, seed=seed, n_init=n_init,
                           seedings=seedings, show_progress=show_progress).assignment


def singular_values(embeddings) -> np.ndarray:
  """The singular values of ``X = embeddings [N, D]`` (not centred), float64, descending.

  ``sigma_i = sqrt(lambda_i(X^T X))`` (or of ``X X^T`` when ``N < D``), computed in float64
  from the ``min(N, D) x min(N, D)`` Gram matrix in row chunks (memory ``O(D^2)`` beyond
  ``X``).

  Returns:
    float64 ``[min(N, D)]``.
  """
  x = knn.as_embeddings("embeddings", embeddings)
  if x.shape[0] < x.shape[1]:
    x64 = x.astype(np.float64)
    gram = x64 @ x64.T
  else:
    gram = np.zeros((x.shape[1], x.shape[1]))
    for start in range(0, x.shape[0], 8192):
      chunk = x[start:start + 8192].astype(np.float64)
      gram += chunk.T @ chunk
  eigenvalues = np.linalg.eigvalsh(gram)[::-1]
  return np.sqrt(np.clip(eigenvalues, 0.0, None))


def spectral_decay(embeddings, *, skip_largest: int = 0) -> float:
  """Spectral decay ``rho`` of Roth et al. (ICML 2020, sec. 5): ``KL(U || S)``.

  ``S`` is the normalised singular value spectrum of the (uncentred) embedding matrix
  ``[N, D]`` after dropping its ``skip_largest`` largest values, ``s_i / sum_j s_j``
  (``n = min(N, D) - skip_largest`` values), and ``U`` the uniform distribution over them:

    rho = sum_i (1/n) log((1/n) / S_i) = -log n - (1/n) sum_i log S_i

  ``rho = 0`` for a flat spectrum (the embedding uses every direction equally); it grows as
  the spectrum decays, i.e. as the embedding is compressed into few directions (the
  class-collapse regime). Roth et al. find a lower ``rho`` generalises better.

  Relation to the released code (``metrics/rho_spectrum.py`` of
  Confusezius/Revisiting_Deep_Metric_Learning_PyTorch): its ``rho_spectrum@m`` with
  ``m >= 1`` is ``skip_largest = m - 1`` (``@1``, the paper's formula, is our default 0; the
  code's note suggests ``@k+1`` to exclude the ``k`` largest values "for a more robust
  estimate", since the largest value of uncentred embeddings mostly measures their mean).
  Differences: we take the full spectrum (the code's torch path; its numpy path uses
  ``TruncatedSVD(embed_dim - 1)``, which drops the smallest value), and normalised values
  below ``SPECTRUM_FLOOR`` (1e-12) are clipped to it, so that a rank-deficient embedding has
  a large finite ``rho`` instead of ``inf``.

  Args:
    embeddings: float ``[N, D]`` (the evaluation passes L2-normalised rows for cosine).
    skip_largest: largest singular values excluded, ``0 <= skip_largest < min(N, D)``.

  Returns:
    A Python float ``>= 0``.
  """
  s = singular_values(embeddings)
  if (isinstance(skip_largest, bool) or not isinstance(skip_largest, (int, np.integer))
      or not 0 <= skip_largest < s.shape[0]):
    raise ValueError(f"skip_largest must be an integer in [0, {s.shape[0] - 1}] (fewer than "
                     f"the min(N, D) = {s.shape[0]} singular values), got {skip_largest!r}.")
  s = s[skip_largest:]
  total = s.sum()
  if total <= 0:
    raise ValueError("spectral_decay: the embeddings are all zero; their spectrum is empty.")
  p = np.maximum(s / total, SPECTRUM_FLOOR)
  n = p.shape[0]
  return float(max(-np.log(n) - np.mean(np.log(p)), 0.0))


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


def check_ks(ks, available: int) -> tuple[int, ...]:
  """``ks`` (Recall@K cut-offs) as a non-empty tuple of ints in ``[1, available]``, where
  ``available`` is the gallery's size (self excluded); ``ValueError`` naming a bad K."""
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
