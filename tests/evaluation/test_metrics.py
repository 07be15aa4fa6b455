"""Recall@K, MAP@R, R-precision, MRR, NMI and spectral decay: hand-worked answers, a numpy loop
oracle, edge cases."""

from absl import logging
import numpy as np
import pytest

from dml_jax import evaluation
from dml_jax.evaluation import metrics
from oracles import ranked_gallery

# Points on a line, similarity -d^2. Worked out by hand (neighbours by distance, ties by lower
# index; R = 2 for every query):
#   query  x  y  neighbours (labels)   rel        R@1 R@2 R@4  R-prec  AP@R
#     0    0  0  1 2 3 4 5 (0 1 1 0 1)  1 0 ...    1   1   1   1/2     1/2
#     1    1  0  0 2 3 4 5 (0 1 1 0 1)  1 0 ...    1   1   1   1/2     1/2   (0, 2 tie at d=1)
#     2    2  1  1 0 3 4 5 (0 0 1 0 1)  0 0 1 ..   0   0   1   0       0
#     3    5  1  4 2 1 5 0 (0 1 0 1 0)  0 1 ...    0   1   1   1/2     1/4   (1, 5 tie at d=4)
#     4    6  0  3 5 2 1 0 (1 1 1 0 0)  0 0 0 1    0   0   1   0       0
#     5    9  1  4 3 2 1 0 (0 1 1 0 0)  0 1 ...    0   1   1   1/2     1/4
LINE_X = np.array([[0.0], [1.0], [2.0], [5.0], [6.0], [9.0]])
LINE_Y = np.array([0, 0, 1, 1, 0, 1])
LINE_WANT = {"recall@1": 2 / 6, "recall@2": 4 / 6, "recall@4": 1.0, "map@r": 1.5 / 6,
             "r_precision": 2 / 6}


def oracle(query, query_labels, gallery, gallery_labels, ks, kind):
  """Musgrave et al.'s definitions, one query at a time, over explicit (query, item) pairs."""
  if gallery is None:
    gallery_labels = query_labels
  recalls, aps, rps = [], [], []
  for i, scored in enumerate(ranked_gallery(query, gallery, kind)):
    rel = [int(gallery_labels[j] == query_labels[i]) for _, j in scored]
    r = sum(rel)
    if r == 0:
      continue
    recalls.append([float(any(rel[:k])) for k in ks])
    rps.append(sum(rel[:r]) / r)
    aps.append(sum(sum(rel[:n]) / n * rel[n - 1] for n in range(1, r + 1)) / r)
  want = {f"recall@{k}": v for k, v in zip(ks, np.mean(recalls, axis=0))}
  want.update({"map@r": np.mean(aps), "r_precision": np.mean(rps)})
  return want


def assert_metrics_equal(got, want):
  assert list(got) == list(want)
  for key in want:
    assert isinstance(got[key], float), key
    np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-12, err_msg=key)


def test_points_on_a_line_by_hand():
  got = evaluation.retrieval_metrics(LINE_X, LINE_Y, ks=(1, 2, 4),
                                     similarity="neg_sq_euclidean")
  assert_metrics_equal(got, LINE_WANT)


def test_per_query_map_at_r_and_r_precision_by_hand():
  # rel = 1 0 1 1, R = 3: P(1) = 1, P(3) = 2/3 -> AP@R = (1 + 2/3) / 3; R-precision = 2/3.
  # rel = 0 1 0 0, R = 1: nothing relevant in the top 1 -> 0 and 0. R = 0 -> NaN.
  relevant = np.array([[1, 0, 1, 1], [0, 1, 0, 0], [1, 1, 1, 1]], bool)
  num_relevant = np.array([3, 1, 0])
  np.testing.assert_allclose(metrics.map_at_r(relevant, num_relevant), [5 / 9, 0, np.nan])
  np.testing.assert_allclose(metrics.r_precision(relevant, num_relevant), [2 / 3, 0, np.nan])
  np.testing.assert_array_equal(metrics.recall_at_k(relevant, ks=(1, 2)),
                                [[1, 1], [0, 1], [1, 1]])
  with pytest.raises(ValueError, match="k >= max R"):
    metrics.map_at_r(relevant, np.array([5, 1, 1]))


def test_perfect_embedding_scores_one():
  x = np.array([[1.0, 0.0], [0.9, 0.1], [0.95, 0.05], [0.0, 1.0], [0.1, 0.9], [0.05, 0.95]])
  got = evaluation.retrieval_metrics(x, np.array([3, 3, 3, 7, 7, 7]), ks=(1, 2))
  assert got == {"recall@1": 1.0, "recall@2": 1.0, "map@r": 1.0, "r_precision": 1.0}


@pytest.mark.parametrize("block_size", [1, 4, 7, None])  # 4 and 7 do not divide 30.
def test_self_gallery_matches_oracle(block_size):
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(30, 4)), rng.integers(0, 5, size=30)
  got = evaluation.retrieval_metrics(x, y, ks=(1, 3, 8), block_size=block_size)
  assert_metrics_equal(got, oracle(x, y, None, None, (1, 3, 8), "cosine"))


def test_the_query_arrays_as_gallery_exclude_self():
  # retrieval_metrics(x, y, x, y): the same objects are the query set as its own gallery (PML's
  # ref_includes_query); an equal copy is a separate gallery, where each item finds itself.
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(30, 4)), rng.integers(0, 5, size=30)
  assert evaluation.retrieval_metrics(x, y, x, y) == evaluation.retrieval_metrics(x, y)
  assert evaluation.retrieval_metrics(x, y, x.copy(), y.copy())["recall@1"] == 1.0


@pytest.mark.parametrize("kind", ["cosine", "neg_sq_euclidean"])
def test_separate_gallery_matches_oracle(kind):
  rng = np.random.default_rng(1)
  q, qy = rng.normal(size=(17, 4)), rng.integers(0, 4, size=17)
  g, gy = rng.normal(size=(23, 4)), rng.integers(0, 4, size=23)
  got = evaluation.retrieval_metrics(q, qy, g, gy, ks=(1, 2, 4, 8), similarity=kind,
                                     block_size=5)
  assert_metrics_equal(got, oracle(q, qy, g, gy, (1, 2, 4, 8), kind))


def test_squared_euclidean_far_from_the_origin_matches_oracle():
  # -|x - y|^2 as 2 <x, y> - |x|^2 - |y|^2 in float32 rounds with |x|^2 (here ~9e4): the search
  # centres the embeddings first (distances unchanged), so the ranking is the float64 one.
  rng = np.random.default_rng(3)
  x = (rng.normal(size=(600, 2)) + 300.0).astype(np.float32)
  y = rng.integers(0, 60, size=600)
  got = evaluation.retrieval_metrics(x, y, ks=(1, 4), similarity="neg_sq_euclidean")
  assert_metrics_equal(got, oracle(x, y, None, None, (1, 4), "neg_sq_euclidean"))


def test_integer_points_with_ties_match_oracle():
  # Exact float32 similarities with many ties: the metrics follow the lower-index tie order.
  rng = np.random.default_rng(2)
  x, y = rng.integers(-2, 3, size=(24, 2)).astype(np.float32), rng.integers(0, 3, size=24)
  got = evaluation.retrieval_metrics(x, y, ks=(1, 2, 4), similarity="neg_sq_euclidean",
                                     block_size=8)
  assert_metrics_equal(got, oracle(x, y, None, None, (1, 2, 4), "neg_sq_euclidean"))


def test_query_without_a_positive_is_excluded_and_counted(monkeypatch):
  # A seventh point of its own class, far away: R = 0 for it. It is excluded (else Recall@4
  # would be 6/7) and it is last for every other query, so the hand values do not change.
  warnings = []
  monkeypatch.setattr(logging, "warning", lambda msg, *args: warnings.append(msg % args))
  x, y = np.vstack([LINE_X, [[20.0]]]), np.append(LINE_Y, 2)
  got = evaluation.retrieval_metrics(x, y, ks=(1, 2, 4), similarity="neg_sq_euclidean")
  assert_metrics_equal(got, LINE_WANT)
  assert len(warnings) == 1 and "1 of 7 queries" in warnings[0]


def test_query_label_absent_from_separate_gallery_is_excluded():
  rng = np.random.default_rng(1)
  q, qy = rng.normal(size=(17, 4)), rng.integers(0, 4, size=17)
  g, gy = rng.normal(size=(23, 4)), rng.integers(0, 4, size=23)
  base = evaluation.retrieval_metrics(q, qy, g, gy, block_size=5)
  with_extra = evaluation.retrieval_metrics(np.vstack([q, q[:3]]), np.append(qy, [9, 9, 9]),
                                            g, gy, block_size=5)
  assert with_extra == base


def test_no_query_with_a_positive_raises():
  with pytest.raises(ValueError, match="R = 0 for all 3 queries"):
    evaluation.retrieval_metrics(np.eye(3), np.array([0, 1, 2]), ks=(1,))


def test_invariant_to_renaming_labels():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(30, 4)), rng.integers(0, 5, size=30)
  renamed = np.array([40, -3, 7, 1000, 5])[y]
  assert (evaluation.retrieval_metrics(x, renamed, ks=(1, 3, 8))
          == evaluation.retrieval_metrics(x, y, ks=(1, 3, 8)))


@pytest.mark.parametrize("kwargs,match", [
    (dict(query=np.zeros((4, 2)), query_labels=np.zeros(3, int)), "3 entries but .* 4 rows"),
    (dict(query=np.zeros(4), query_labels=np.zeros(4, int)), "rank 2"),
    (dict(query=np.zeros((4, 2)), query_labels=np.zeros((4, 1), int)), "rank 1"),
    (dict(query=np.zeros((4, 2)), query_labels=np.zeros(4)), "integers"),
    (dict(query=np.zeros((4, 2)), query_labels=np.zeros(4, int), gallery=np.zeros((4, 2))),
     "together"),
    (dict(query=np.zeros((4, 2)), query_labels=np.zeros(4, int), gallery=np.zeros((5, 2)),
          gallery_labels=np.zeros(4, int)), "gallery_labels has 4 entries"),
    (dict(query=np.zeros((4, 2)), query_labels=np.zeros(4, int), gallery=np.zeros((5, 3)),
          gallery_labels=np.zeros(5, int), ks=(1,)), r"\[Ng, 2\]"),
    (dict(query=np.zeros((4, 2)), query_labels=np.zeros(4, int)), r"Recall@4 .* 3 gallery"),
    (dict(query=np.zeros((4, 2)), query_labels=np.zeros(4, int), ks=(1, 0)), "positive"),
    (dict(query=np.zeros((4, 2)), query_labels=np.zeros(4, int), ks=(1,),
          similarity="euclid"), "allowed"),
])
def test_retrieval_bad_input_raises_clear_value_error(kwargs, match):
  kwargs.setdefault("ks", (1, 2, 4, 8))
  with pytest.raises(ValueError, match=match):
    evaluation.retrieval_metrics(**kwargs)


def blobs(centers, per_class=20, spread=0.05, seed=0):
  """Points around 1-D ``centers`` [C]: float [C * per_class, 2] and labels [C * per_class]."""
  rng = np.random.default_rng(seed)
  x = np.repeat(np.asarray(centers, float), per_class)
  x = np.stack([x, np.zeros_like(x)], axis=1) + spread * rng.normal(size=(x.size, 2))
  return x, np.repeat(np.arange(len(centers)), per_class)


def test_nmi_is_one_for_separated_clusters_and_nmi_plus_only_when_asked():
  x, y = blobs([0.0, 5.0, 10.0])
  got = evaluation.clustering_metrics(x, y)
  assert list(got) == ["nmi"] and isinstance(got["nmi"], float)
  np.testing.assert_allclose(got["nmi"], 1.0)


def test_n_clusters_and_nmi_plus_by_hand():
  # Two classes, each two tight sub-clusters: class 0 at 0 and 1, class 1 at 10 and 11.
  # k = 2 recovers the classes (NMI 1). k = 4 finds the sub-clusters: I(Y; C) = H(Y) = 1 bit,
  # H(C) = 2 bits, NMI = 1 / ((1 + 2) / 2) = 2/3; NMI+ with factor 2 is the same clustering.
  x, sub = blobs([0.0, 1.0, 10.0, 11.0])
  y = sub // 2
  np.testing.assert_allclose(evaluation.clustering_metrics(x, y)["nmi"], 1.0)
  got = evaluation.clustering_metrics(x, y, n_clusters=4, overcluster=2)
  assert list(got) == ["nmi", "nmi+"]
  np.testing.assert_allclose([got["nmi"], got["nmi+"]], [2 / 3, 2 / 3])


def test_nmi_near_zero_for_random_labels_and_seeded():
  x, _ = blobs([0.0, 5.0, 10.0], per_class=200)
  y = np.random.default_rng(3).integers(0, 3, size=x.shape[0])
  got = evaluation.clustering_metrics(x, y, overcluster=1.5, seed=4)
  assert 0.0 <= got["nmi"] < 0.02 and 0.0 <= got["nmi+"] < 0.03
  assert evaluation.clustering_metrics(x, y, overcluster=1.5, seed=4) == got


@pytest.mark.parametrize("kwargs,match", [
    (dict(embeddings=np.zeros((4, 2)), labels=np.zeros(5, int)), "5 entries but .* 4 rows"),
    (dict(embeddings=np.zeros(4), labels=np.zeros(4, int)), "rank 2"),
    (dict(embeddings=np.zeros((4, 2)), labels=np.zeros(4, int), n_clusters=5), r"\[1, 4\]"),
    (dict(embeddings=np.zeros((4, 2)), labels=np.arange(4), overcluster=2),
     r"2 \* 4 .* \[1, 4\]"),
    (dict(embeddings=np.zeros((4, 2)), labels=np.arange(4), overcluster=0), "positive"),
    (dict(embeddings=np.full((4, 2), np.inf), labels=np.arange(4)), "non-finite"),
])
def test_clustering_bad_input_raises_clear_value_error(kwargs, match):
  with pytest.raises(ValueError, match=match):
    evaluation.clustering_metrics(**kwargs)


def hard_case(seed, n, num_classes):
  """Integer points (exact ties), some rows duplicated, labels with singleton classes and
  classes smaller than the largest K."""
  rng = np.random.default_rng(seed)
  x = rng.integers(-2, 3, size=(n, 3)).astype(np.float32)
  x[n // 2:n // 2 + 4] = x[:4]   # exact duplicates of other rows
  y = rng.integers(0, num_classes, size=n)
  y[-2:] = [100, 101]            # two singleton classes
  return x, y


@pytest.mark.parametrize("kind", ["dot", "neg_sq_euclidean"])
@pytest.mark.parametrize("block_size,memory_bytes", [
    (None, None),   # one block
    (7, 16 * 60),   # 7 does not divide 29; a budget so small that the gallery is scanned too
])
def test_self_protocol_with_ties_singletons_and_large_k_matches_oracle(kind, block_size,
                                                                      memory_bytes):
  x, y = hard_case(5, 29, 5)
  ks = (1, 2, 4, 8, 16)   # 16 exceeds every class size
  kwargs = {} if memory_bytes is None else {"memory_bytes": memory_bytes}
  got = evaluation.retrieval_metrics(x, y, ks=ks, similarity=kind, block_size=block_size,
                                     **kwargs)
  assert_metrics_equal(got, oracle(x, y, None, None, ks, kind))


@pytest.mark.parametrize("block_size,memory_bytes", [(None, None), (5, 16 * 50)])
def test_query_gallery_protocol_with_ties_and_absent_classes_matches_oracle(block_size,
                                                                           memory_bytes):
  qx, qy = hard_case(6, 17, 4)
  gx, gy = hard_case(7, 23, 4)
  gx[:3] = qx[:3]   # a query with an identical gallery twin
  ks = (1, 3, 10, 20)
  kwargs = {} if memory_bytes is None else {"memory_bytes": memory_bytes}
  got = evaluation.retrieval_metrics(qx, qy, gx, gy, ks=ks, similarity="neg_sq_euclidean",
                                     block_size=block_size, **kwargs)
  assert_metrics_equal(got, oracle(qx, qy, gx, gy, ks, "neg_sq_euclidean"))


def test_blocked_equals_unblocked_on_random_embeddings():
  rng = np.random.default_rng(8)
  x, y = rng.normal(size=(41, 6)), rng.integers(0, 6, size=41)
  whole = evaluation.retrieval_metrics(x, y, ks=(1, 5, 20), block_size=41)
  for block_size, memory_bytes in ((3, 1 << 28), (10, 16 * 70), (None, 16 * 200)):
    assert evaluation.retrieval_metrics(x, y, ks=(1, 5, 20), block_size=block_size,
                                        memory_bytes=memory_bytes) == whole


def test_empty_gallery_and_single_query_are_clear_errors():
  with pytest.raises(ValueError, match="gallery is empty"):
    evaluation.retrieval_metrics(np.zeros((3, 2)), np.zeros(3, int), np.zeros((0, 2)),
                                 np.zeros(0, int), ks=(1,))
  with pytest.raises(ValueError, match="single item"):
    evaluation.retrieval_metrics(np.zeros((1, 2)), np.zeros(1, int), ks=(1,))
  for gallery in ((None, None), (np.zeros((3, 2)), np.zeros(3, int))):
    with pytest.raises(ValueError, match=r"^the query set is empty \(0 items\).$"):
      evaluation.retrieval_metrics(np.zeros((0, 2)), np.zeros(0, int), *gallery, ks=(1,))


def test_nan_query_rows_are_named():
  x = np.random.default_rng(0).normal(size=(6, 2))
  x[4, 0] = np.nan
  with pytest.raises(ValueError, match=r"query has 1 non-finite .* rows \[4\]"):
    evaluation.retrieval_metrics(x, np.array([0, 0, 1, 1, 2, 2]), ks=(1,))


def test_clustering_nmi_with_kmeans_sklearn_is_sklearn_nmi_of_the_seeded_kmeans():
  from sklearn import cluster as sk_cluster  # pylint: disable=import-outside-toplevel
  from sklearn import metrics as sk_metrics  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(1)
  x, y = rng.normal(size=(90, 3)), rng.integers(0, 4, size=90)
  got = evaluation.clustering_metrics(x, y, overcluster=2, seed=3, n_init=4, kmeans="sklearn")
  for key, k in (("nmi", 4), ("nmi+", 8)):
    assignment = sk_cluster.KMeans(n_clusters=k, n_init=4, random_state=3).fit_predict(x)
    np.testing.assert_allclose(got[key], sk_metrics.normalized_mutual_info_score(y, assignment),
                               rtol=1e-10)
  with pytest.raises(ValueError, match="n_init"):
    evaluation.clustering_metrics(x, y, n_init=0)


def test_spectral_decay_by_hand_and_against_numpy_svd():
  # Singular values 3 and 1: S = (3/4, 1/4), rho = 1/2 log(2/3) + 1/2 log(2) = 1/2 log(4/3).
  x = np.array([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
  np.testing.assert_allclose(evaluation.spectral_decay(x), 0.5 * np.log(4 / 3), rtol=1e-12)
  # Orthonormal rows: a flat spectrum, rho = 0; dropping the largest keeps it flat.
  np.testing.assert_allclose(evaluation.spectral_decay(np.eye(4)), 0.0, atol=1e-12)
  rng = np.random.default_rng(2)
  x = rng.normal(size=(50, 6)) * np.array([5.0, 3, 2, 1, 0.5, 0.1])
  for skip in (0, 1, 3):
    s = np.linalg.svd(x, compute_uv=False)[skip:]
    p = s / s.sum()
    want = np.sum(np.log((1 / len(p)) / p)) / len(p)
    np.testing.assert_allclose(evaluation.spectral_decay(x, skip_largest=skip), want,
                               rtol=1e-7)
  # N < D uses the N x N Gram matrix; the spectrum is the same.
  np.testing.assert_allclose(evaluation.spectral_decay(x.T), evaluation.spectral_decay(x),
                             rtol=1e-7)
  # A collapsed (rank-1) embedding gets a large but finite rho.
  collapsed = np.outer(rng.normal(size=20), rng.normal(size=4))
  assert 10 < evaluation.spectral_decay(collapsed) < np.inf
  with pytest.raises(ValueError, match=r"skip_largest must be an integer in \[0, 5\]"):
    evaluation.spectral_decay(x, skip_largest=6)


# ------------------------------------------------------------ the mean reciprocal rank


def reciprocal_rank_oracle(query, query_labels, gallery, gallery_labels, kind):
  """The mean over queries with a positive of 1 / (rank of the first item of their class)."""
  if gallery is None:
    gallery_labels = query_labels
  ranks = []
  for i, scored in enumerate(ranked_gallery(query, gallery, kind)):
    rel = [gallery_labels[j] == query_labels[i] for _, j in scored]
    if any(rel):
      ranks.append(1 / (rel.index(True) + 1))
  return float(np.mean(ranks))


@pytest.mark.parametrize("kind", ["dot", "neg_sq_euclidean"])
def test_mean_reciprocal_rank_matches_oracle_with_ties(kind):
  x, y = hard_case(5, 29, 5)
  got = evaluation.retrieval_metrics(x, y, ks=(1, 2), similarity=kind, reciprocal_rank=True)
  assert list(got)[-1] == "mrr"
  np.testing.assert_allclose(got["mrr"], reciprocal_rank_oracle(x, y, None, None, kind),
                             rtol=1e-12)
  qx, qy = hard_case(6, 17, 4)
  gx, gy = hard_case(7, 23, 4)
  got = evaluation.retrieval_metrics(qx, qy, gx, gy, ks=(1,), similarity=kind,
                                     reciprocal_rank=True)
  np.testing.assert_allclose(got["mrr"], reciprocal_rank_oracle(qx, qy, gx, gy, kind),
                             rtol=1e-12)
  assert "mrr" not in evaluation.retrieval_metrics(x, y, ks=(1, 2), similarity=kind)


def test_mean_reciprocal_rank_counts_first_items_far_down_the_ranking():
  """Unstructured embeddings and small classes: most queries find their class only after the
  neighbours the search keeps (m = max(R, 16)), so the rank comes from the counting pass."""
  rng = np.random.default_rng(3)
  x = rng.normal(size=(150, 8)).astype(np.float32)
  y = np.repeat(np.arange(50), 3)
  got = evaluation.retrieval_metrics(x, y, ks=(1,), similarity="dot", reciprocal_rank=True)
  want = reciprocal_rank_oracle(x, y, None, None, "dot")
  assert want < 0.2   # the first item of the class is mostly far beyond 16
  np.testing.assert_allclose(got["mrr"], want, rtol=1e-12)
  # the line worked out by hand at the top: first hits at ranks 1, 1, 3, 2, 4, 2
  got = evaluation.retrieval_metrics(LINE_X, LINE_Y, ks=(1,), similarity="neg_sq_euclidean",
                                     reciprocal_rank=True)
  np.testing.assert_allclose(got["mrr"], (1 + 1 + 1 / 3 + 1 / 2 + 1 / 4 + 1 / 2) / 6)


def test_clustering_scores_come_from_the_clustering_of_nmi():
  from sklearn import cluster as sk_cluster  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(2)
  x, y = rng.normal(size=(80, 3)), rng.integers(0, 4, size=80)
  got = evaluation.clustering_metrics(x, y, overcluster=2, seed=1, n_init=3, kmeans="sklearn",
                                      scores=("f1", "nmi", "ami"))
  assert list(got) == ["f1", "nmi", "ami", "nmi+", "f1+", "ami+"]
  for suffix, k in (("", 4), ("+", 8)):
    assignment = sk_cluster.KMeans(n_clusters=k, n_init=3, random_state=1).fit_predict(x)
    assert got["nmi" + suffix] == evaluation.nmi(y, assignment)
    assert got["ami" + suffix] == evaluation.ami(y, assignment)
    assert got["f1" + suffix] == evaluation.pairwise_f1(y, assignment)
  default = evaluation.clustering_metrics(x, y, overcluster=2, seed=1, n_init=3,
                                          kmeans="sklearn")
  assert default == {"nmi": got["nmi"], "nmi+": got["nmi+"]}
  for bad in ((), ("nmi", "purity")):
    with pytest.raises(ValueError, match=r"^scores must name one or more of nmi, ami, f1"):
      evaluation.clustering_metrics(x, y, scores=bad)
