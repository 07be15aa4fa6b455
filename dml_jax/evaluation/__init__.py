"""Evaluation: exact blocked kNN, retrieval metrics (Recall@K, MAP@R, R-precision, MRR), NMI /
NMI+, AMI and the pairwise F1 of a clustering (``cluster_scores``), spectral decay rho; the
protocols (``protocols``), computing them (``compute``), reporting (``report``), retrieval
grids (``retrieval_grid``), the triplet scatter diagram (``triplet_scatter``) and the projector
export (``projector``). Evaluating a workdir's checkpoints (eval.py) is the application's:
``dml_jax.run.eval_checkpoints``.

``from dml_jax import evaluation``::

  evaluation.retrieval_metrics(query, query_labels, gallery=None, gallery_labels=None,
                               *, ks=(1, 2, 4, 8), similarity='cosine', block_size=None,
                               reciprocal_rank=False)
  evaluation.clustering_metrics(embeddings, labels, *, n_clusters=None, overcluster=None,
                                seed=0, n_init=10, scores=('nmi',))   # or 'ami', 'f1'
  evaluation.spectral_decay(embeddings, *, skip_largest=0)
  evaluation.nmi(labels, assignment)
  evaluation.ami(labels, assignment)
  evaluation.pairwise_f1(labels, assignment)
  evaluation.nearest_neighbors(query, gallery=None, *, k, similarity='cosine', ...)
  evaluation.DEFAULT_KS   # Recall@K cut-offs of the literature per dataset

The neighbour search computes its similarities in float32 at full precision on every platform
(no TF32 on GPUs), so the retrieval metrics of the same embeddings are the same on the CPU, a
GPU or a TPU (``knn``, "Precision").
"""

from dml_jax.evaluation.protocols import DEFAULT_KS
from dml_jax.evaluation.knn import nearest_neighbors
from dml_jax.evaluation.knn import neighbor_relevance
from dml_jax.evaluation.cluster_scores import ami
from dml_jax.evaluation.cluster_scores import nmi
from dml_jax.evaluation.cluster_scores import pairwise_f1
from dml_jax.evaluation.metrics import clustering_metrics
from dml_jax.evaluation.metrics import retrieval_metrics
from dml_jax.evaluation.metrics import spectral_decay

__all__ = ["DEFAULT_KS", "ami", "clustering_metrics", "nearest_neighbors", "neighbor_relevance",
           "nmi", "pairwise_f1", "retrieval_metrics", "spectral_decay"]
