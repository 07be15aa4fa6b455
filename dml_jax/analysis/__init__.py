"""Analysis tools: each a pure-function core plus ``python -m dml_jax.analysis.<tool>``.

* ``scatter``: triplet scatter diagram (2nd-order paper Fig. 1, 6);
* ``vector_field``: gradient vector fields on the scatter diagram (2nd-order paper Fig. 2);
* ``distributions``: similarity histograms and closest-positive/negative plots (EPHN Fig. 2, 3, 5);
* ``tsne``: t-SNE of train and test embeddings by class and sub-class label set;
* ``collapse``: class-collapse diagnostics (intra-class spread, modes per class, rho);
* ``skew``: the sampling skew of negative selections (label-noise paper §4.2, eta).

``common`` holds the shared checkpoint loading, similarity and plotting helpers.
"""
