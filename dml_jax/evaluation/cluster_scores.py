"""Scores of a clustering against the labels, from their contingency table: NMI, the adjusted
mutual information (AMI) and the pairwise F1 of Song et al., and the NMI of chance.

Each takes two labelings of the same ``N`` items (any integer values: ``labels`` the classes,
``assignment`` the clusters) and counts only the non-zero cells of their contingency table (at
most ``N``), never a dense ``[classes, clusters]`` table, which is gigabytes at Stanford Online
Products' scale. ``SCORES`` maps the names of ``eval.metrics`` and
``metrics.clustering_metrics(scores=...)`` to them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def nmi(labels, assignment) -> float:
  """Normalised mutual information of two labelings of the same ``N`` items.

  With the contingency counts ``n_ab = #{i : y_i = a, c_i = b}``, ``p_ab = n_ab / N`` and the
  marginals ``p_a``, ``p_b``:

    I(Y; C) = sum_ab p_ab log(p_ab / (p_a p_b)),   H(Y) = -sum_a p_a log p_a,
    NMI = I(Y; C) / ((H(Y) + H(C)) / 2)

  (the arithmetic normalisation, sklearn's default). Two single-cluster labelings give 1; one
  single-cluster labeling against a finer one gives 0.

  Args:
    labels: int ``[N]`` (any values).
    assignment: int ``[N]`` (any values).

  Returns:
    A Python float in ``[0, 1]``.
  """
  table = _contingency(labels, assignment)
  if table.num_classes == table.num_clusters == 1:
    return 1.0
  mutual, h_y, h_c = _information(table)
  return float(np.clip(mutual / max((h_y + h_c) / 2, np.finfo(np.float64).eps), 0.0, 1.0))


def ami(labels, assignment) -> float:
  """Adjusted mutual information of two labelings of the same ``N`` items (Vinh et al., 2010).

    AMI = (I(Y; C) - E[I]) / ((H(Y) + H(C)) / 2 - E[I])

  with ``I`` and ``H`` as in :func:`nmi` and ``E[I]`` the expected mutual information of two
  random labelings with the same class and cluster sizes (the hypergeometric model):

    E[I] = sum_ab sum_n (n / N) log(N n / (a_a b_b)) P(n | a_a, b_b, N),
    P(n | a, b, N) = C(a, n) C(N - a, b - n) / C(N, b),  max(1, a + b - N) <= n <= min(a, b)

  over the class sizes ``a_a`` and the cluster sizes ``b_b``. This is sklearn's
  ``adjusted_mutual_info_score`` with its default arithmetic normalisation (and PML's
  ``AMI``); ``E[I]`` is summed over the *distinct* sizes, weighted by how many classes and
  clusters have each, so it takes at most (distinct cluster sizes) x N terms instead of a
  loop over classes x clusters (SOP's 11,316 x 11,316). 0 is chance level, 1 identical labelings; it can be
  slightly negative. Two labelings equal up to renaming give 1, as do two single-cluster ones.

  Args:
    labels: int ``[N]`` (any values).
    assignment: int ``[N]`` (any values).

  Returns:
    A Python float, at most 1.
  """
  table = _contingency(labels, assignment)
  if table.identical:
    return 1.0
  mutual, h_y, h_c = _information(table)
  expected = expected_mutual_information(table.class_sizes, table.cluster_sizes)
  denominator = (h_y + h_c) / 2 - expected
  eps = np.finfo(np.float64).eps
  denominator = min(denominator, -eps) if denominator < 0 else max(denominator, eps)
  return float(min((mutual - expected) / denominator, 1.0))


def chance_nmi(labels, assignment) -> float:
  """The NMI that a random clustering with the assignment's cluster sizes scores on average.

  The entropies of :func:`nmi` depend on the class and cluster sizes only, so under the
  hypergeometric model of :func:`ami` the expected NMI is ``E[I] / ((H(Y) + H(C)) / 2)``
  exactly; equally ``(NMI - AMI) / (1 - AMI)``. It is the floor an NMI should be read
  against: near 0 for a few large classes, most of the scale for many small ones (a k-means
  with k = classes on Stanford Online Products' test split, about 5 images a class).

  Args:
    labels: int ``[N]`` (any values).
    assignment: int ``[N]`` (any values).

  Returns:
    A Python float in ``[0, 1]``; 1 for two single-cluster labelings, as :func:`nmi`.
  """
  table = _contingency(labels, assignment)
  if table.num_classes == table.num_clusters == 1:
    return 1.0
  _, h_y, h_c = _information(table)
  expected = expected_mutual_information(table.class_sizes, table.cluster_sizes)
  return float(np.clip(expected / max((h_y + h_c) / 2, np.finfo(np.float64).eps), 0.0, 1.0))


def expected_mutual_information(class_sizes, cluster_sizes) -> float:
  """``E[I]`` of :func:`ami`: the mean mutual information (nats) of two labelings of
  ``N = sum(class_sizes) = sum(cluster_sizes)`` items drawn uniformly among those with these
  class and cluster sizes.

  Args:
    class_sizes: int ``[R]``, positive.
    cluster_sizes: int ``[C]``, positive, with the same sum.

  Returns:
    A Python float ``>= 0``.
  """
  # imported here: only this metric needs SciPy, which takes a while to import
  from scipy import special  # pylint: disable=import-outside-toplevel
  class_sizes = np.asarray(class_sizes, dtype=np.int64)
  cluster_sizes = np.asarray(cluster_sizes, dtype=np.int64)
  n = int(class_sizes.sum())
  if n != int(cluster_sizes.sum()) or (class_sizes < 1).any() or (cluster_sizes < 1).any():
    raise ValueError(f"class and cluster sizes must be positive with one sum, got sums {n} "
                     f"and {int(cluster_sizes.sum())}.")
  a_values, a_counts = np.unique(class_sizes, return_counts=True)
  b_values, b_counts = np.unique(cluster_sizes, return_counts=True)
  b = b_values[:, None].astype(np.float64)   # [B, 1]
  log_fact_n = special.gammaln(n + 1)
  total = 0.0
  for a, count in zip(a_values.tolist(), a_counts.tolist()):
    # n_ab runs over 1..min(a, b) (and >= a + b - N); a row per distinct cluster size
    n_ab = np.arange(1, min(a, int(b_values[-1])) + 1, dtype=np.float64)[None, :]   # [1, M]
    valid = (n_ab <= np.minimum(a, b)) & (n_ab >= a + b - n)
    log_p = (special.gammaln(a + 1) + special.gammaln(b + 1) + special.gammaln(n - a + 1)
             + special.gammaln(n - b + 1) - log_fact_n - special.gammaln(n_ab + 1)
             - special.gammaln(np.maximum(a - n_ab, 0) + 1)
             - special.gammaln(np.maximum(b - n_ab, 0) + 1)
             - special.gammaln(np.maximum(n - a - b + n_ab, 0) + 1))
    probability = np.exp(np.where(valid, log_p, -np.inf))   # P(n_ab | a, b, N), 0 outside
    term = (n_ab / n) * (np.log(n) + np.log(n_ab) - np.log(a) - np.log(b)) * probability
    total += count * float((b_counts[:, None] * term).sum())
  return max(total, 0.0)


def pairwise_f1(labels, assignment) -> float:
  """The clustering F1 of Song et al. ("Deep Metric Learning via Lifted Structured Feature
  Embedding", CVPR 2016): the F-measure of the item pairs a clustering puts together.

  With ``TP`` the pairs in one class and one cluster, ``S_Y`` the pairs in one class and
  ``S_C`` the pairs in one cluster (all counted as ``n (n - 1) / 2`` per cell, class or
  cluster), precision ``TP / S_C`` and recall ``TP / S_Y``:

    F1 = 2 P R / (P + R) = 2 TP / (S_Y + S_C)

  symmetric in the two labelings. Two labelings with no pair together give 1 (they are
  equal).

  Args:
    labels: the classes, int ``[N]`` (any values).
    assignment: the clusters of the same items, int ``[N]`` (any values).

  Returns:
    A Python float in ``[0, 1]``.
  """
  table = _contingency(labels, assignment)

  def pairs(sizes):
    sizes = sizes.astype(np.int64)
    return int((sizes * (sizes - 1) // 2).sum())

  together = pairs(table.class_sizes) + pairs(table.cluster_sizes)
  return 1.0 if together == 0 else 2 * pairs(table.cell_sizes) / together


# The scores by name (``metrics.clustering_metrics(scores=...)``, ``eval.metrics``).
SCORES = {"nmi": nmi, "ami": ami, "f1": pairwise_f1}


class _Contingency(NamedTuple):
  """The non-zero cells of the contingency table of two labelings of ``num_items`` items."""
  cells: np.ndarray          # int64 [M], class id * num_clusters + cluster id
  cell_sizes: np.ndarray     # int64 [M]
  class_sizes: np.ndarray    # int64 [R]
  cluster_sizes: np.ndarray  # int64 [C]
  num_items: int

  @property
  def num_classes(self) -> int:
    return self.class_sizes.shape[0]

  @property
  def num_clusters(self) -> int:
    return self.cluster_sizes.shape[0]

  @property
  def identical(self) -> bool:
    """The two labelings are the same partition (up to renaming)."""
    return self.cells.shape[0] == self.num_classes == self.num_clusters


def _contingency(labels, assignment) -> _Contingency:
  """The contingency of ``labels [N]`` against ``assignment [N]``; ``ValueError`` on shapes."""
  labels, assignment = np.asarray(labels), np.asarray(assignment)
  if labels.ndim != 1 or labels.shape != assignment.shape or labels.size == 0:
    raise ValueError(f"labels and assignment must be non-empty [N] arrays of one length, got "
                     f"shapes {labels.shape} and {assignment.shape}.")
  _, y = np.unique(labels, return_inverse=True)
  _, c = np.unique(assignment, return_inverse=True)
  y, c = y.reshape(-1).astype(np.int64), c.reshape(-1).astype(np.int64)
  num_y, num_c = int(y.max()) + 1, int(c.max()) + 1
  cells, counts = np.unique(y * num_c + c, return_counts=True)
  return _Contingency(cells, counts.astype(np.int64), np.bincount(y, minlength=num_y),
                      np.bincount(c, minlength=num_c), labels.size)


def _information(table: _Contingency) -> tuple[float, float, float]:
  """``(I(Y; C), H(Y), H(C))`` in nats of a contingency table (:func:`nmi`)."""
  n = table.num_items
  p = table.cell_sizes / n
  p_y = table.class_sizes / n
  p_c = table.cluster_sizes / n
  num_c = table.num_clusters
  mutual = float(np.sum(p * np.log(p / (p_y[table.cells // num_c] * p_c[table.cells % num_c]))))
  h_y = float(-np.sum(p_y * np.log(p_y)))
  h_c = float(-np.sum(p_c * np.log(p_c)))
  return max(mutual, 0.0), h_y, h_c
