"""NMI, AMI and the pairwise F1 of a clustering: scikit-learn, loop oracles over (class,
cluster) pairs and item pairs, hand-worked answers and limits."""

import math

import numpy as np
import pytest

from dml_jax import evaluation
from dml_jax.evaluation import cluster_scores


@pytest.mark.parametrize("seed", range(4))
def test_nmi_equals_sklearn_on_the_same_assignment(seed):
  from sklearn import metrics as sk_metrics  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  n = int(rng.integers(5, 200))
  labels = rng.integers(0, int(rng.integers(1, 9)), size=n) * 7 - 3
  assignment = rng.integers(0, int(rng.integers(1, 12)), size=n)
  np.testing.assert_allclose(evaluation.nmi(labels, assignment),
                             sk_metrics.normalized_mutual_info_score(labels, assignment),
                             rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(evaluation.nmi(labels, labels), 1.0)
  assert evaluation.nmi(np.zeros(5, int), np.zeros(5, int)) == 1.0
  assert evaluation.nmi(np.zeros(4, int), np.array([0, 1, 0, 1])) == 0.0


def expected_mutual_information_oracle(labels, assignment) -> float:
  """E[I] over every (class, cluster) pair, with exact hypergeometric probabilities."""
  n = len(labels)
  total = 0.0
  for a in np.unique(labels, return_counts=True)[1].tolist():
    for b in np.unique(assignment, return_counts=True)[1].tolist():
      for k in range(max(1, a + b - n), min(a, b) + 1):
        p = math.comb(a, k) * math.comb(n - a, b - k) / math.comb(n, b)
        total += k / n * math.log(n * k / (a * b)) * p
  return total


@pytest.mark.parametrize("seed", range(6))
def test_ami_equals_sklearn_and_a_pair_by_pair_oracle(seed):
  from sklearn import metrics as sk_metrics  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  n = int(rng.integers(2, 120))
  labels = rng.integers(0, int(rng.integers(1, 12)), size=n) * 5 - 2
  assignment = rng.integers(0, int(rng.integers(1, 30)), size=n)
  if seed == 5:   # close to the labels: AMI near 1
    assignment = np.where(rng.random(n) < 0.8, labels, assignment)
  got = evaluation.ami(labels, assignment)
  np.testing.assert_allclose(got, sk_metrics.adjusted_mutual_info_score(labels, assignment),
                             rtol=1e-9, atol=1e-12)
  table = cluster_scores._contingency(labels, assignment)   # pylint: disable=protected-access
  np.testing.assert_allclose(
      cluster_scores.expected_mutual_information(table.class_sizes, table.cluster_sizes),
      expected_mutual_information_oracle(labels, assignment), rtol=1e-10, atol=1e-13)
  np.testing.assert_allclose(evaluation.ami(assignment, labels), got, rtol=1e-12, atol=1e-15)


def test_ami_limits_and_large_label_spaces():
  from sklearn import metrics as sk_metrics  # pylint: disable=import-outside-toplevel
  assert evaluation.ami([3, 3, 7, 7, 9], [1, 1, 0, 0, 5]) == 1.0   # the same partition
  assert evaluation.ami(np.zeros(5, int), np.zeros(5, int)) == 1.0
  assert evaluation.ami(np.arange(6), np.arange(6)) == 1.0
  assert abs(evaluation.ami(np.zeros(4, int), [0, 1, 0, 1])) < 1e-12   # nothing to explain
  assert abs(evaluation.ami(np.arange(6), [0, 0, 1, 1, 2, 2])) < 1e-12
  assert evaluation.ami([0, 0, 1, 1], [0, 1, 0, 1]) < 0   # worse than chance
  # a label space the size of SOP's classes (sklearn is given a tenth of it to compare)
  rng = np.random.default_rng(0)
  labels = np.repeat(np.arange(2000), 6)
  assignment = np.where(rng.random(labels.size) < 0.6, labels,
                        rng.integers(0, 2000, size=labels.size))
  np.testing.assert_allclose(evaluation.ami(labels, assignment),
                             sk_metrics.adjusted_mutual_info_score(labels, assignment),
                             rtol=1e-9)
  assert -0.01 < evaluation.ami(np.repeat(np.arange(11316), 5),
                                rng.integers(0, 11316, size=56580)) < 0.01
  with pytest.raises(ValueError, match="non-empty"):
    evaluation.ami(np.zeros(3, int), np.zeros(4, int))
  with pytest.raises(ValueError, match="one sum"):
    cluster_scores.expected_mutual_information([2, 3], [4])


def pairwise_f1_oracle(labels, assignment) -> float:
  """Precision and recall over the explicit item pairs i < j, then their harmonic mean."""
  tp = same_class = same_cluster = 0
  for i in range(len(labels)):
    for j in range(i + 1, len(labels)):
      same_class += labels[i] == labels[j]
      same_cluster += assignment[i] == assignment[j]
      tp += labels[i] == labels[j] and assignment[i] == assignment[j]
  precision, recall = tp / same_cluster, tp / same_class
  return 0.0 if tp == 0 else 2 * precision * recall / (precision + recall)


@pytest.mark.parametrize("seed", range(4))
def test_pairwise_f1_matches_the_pair_oracle(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(4, 90))
  labels = rng.integers(0, int(rng.integers(1, 8)), size=n)
  assignment = rng.integers(0, int(rng.integers(1, 10)), size=n) * 3 + 1
  labels[:2], assignment[:2] = 0, 1   # at least one pair together in each
  got = evaluation.pairwise_f1(labels, assignment)
  np.testing.assert_allclose(got, pairwise_f1_oracle(labels, assignment), rtol=1e-12)
  assert got == evaluation.pairwise_f1(assignment, labels)


def test_pairwise_f1_by_hand_and_limits():
  # classes {0,1,2} {3,4}, clusters {0,1} {2,3,4}: TP = 1 (0-1) + 1 (3-4), S_Y = 3 + 1,
  # S_C = 1 + 3, so F1 = 2 * 2 / 8
  assert evaluation.pairwise_f1([0, 0, 0, 1, 1], [5, 5, 6, 6, 6]) == 0.5
  assert evaluation.pairwise_f1([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0
  assert evaluation.pairwise_f1(np.arange(4), np.arange(4)) == 1.0   # no pair in either
  assert evaluation.pairwise_f1(np.arange(4), np.zeros(4, int)) == 0.0


def test_chance_nmi_is_the_mean_nmi_of_shuffled_clusterings():
  rng = np.random.default_rng(4)
  labels = np.repeat(np.arange(12), 5)              # 12 classes of 5
  assignment = rng.integers(0, 15, size=60)         # 15 clusters of uneven sizes
  want = cluster_scores.chance_nmi(labels, assignment)
  shuffled = [evaluation.nmi(labels, rng.permutation(assignment)) for _ in range(3000)]
  assert abs(np.mean(shuffled) - want) < 4 * np.std(shuffled) / np.sqrt(len(shuffled))
  assert 0.3 < want < 0.6   # many small classes: a large part of the scale
  nmi, ami = evaluation.nmi(labels, assignment), evaluation.ami(labels, assignment)
  np.testing.assert_allclose(want, (nmi - ami) / (1 - ami), rtol=1e-10)
  big = np.repeat(np.arange(2), 30)                 # 2 classes of 30: chance is near 0
  assert cluster_scores.chance_nmi(big, rng.permutation(big)) < 0.02
  assert cluster_scores.chance_nmi(np.zeros(4, int), np.zeros(4, int)) == 1.0
