"""dml_jax: deep metric learning in JAX/Flax.

Submodules are imported explicitly, e.g. ``from dml_jax import objectives, evaluation``.

Two layers: the library (similarity, mining, losses, objectives, models, data, memory, parallel,
optimizers, evaluation's search and metrics) never imports the application, ``dml_jax.run``
(training loop, workdirs, checkpoints, writers, command-line plumbing, the evaluation of a
workdir), on which the analysis tools (``dml_jax.analysis``) and train.py / eval.py sit.
"""

__version__ = "0.1.0"
