"""Evaluation: exact blocked kNN, retrieval metrics (Recall@K, MAP@R, R-precision), NMI / NMI+.

``from dml_jax import evaluation``::

  evaluation.retrieval_metrics(query, query_labels, gallery=None, gallery_labels=None,
                               *, ks=(1, 2, 4, 8), similarity='cosine', block_size=None)
  evaluation.clustering_metrics(embeddings, labels, *, n_clusters=None, overcluster=None,
                                seed=0)
  evaluation.nearest_neighbors(query, gallery=None, *, k, similarity='cosine', ...)
"""

from dml_jax.evaluation.knn import nearest_neighbors
from dml_jax.evaluation.metrics import clustering_metrics
from dml_jax.evaluation.metrics import retrieval_metrics

__all__ = ["clustering_metrics", "nearest_neighbors", "retrieval_metrics"]
