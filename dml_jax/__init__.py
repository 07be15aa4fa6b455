"""dml_jax: deep metric learning in JAX/Flax.

Submodules are imported explicitly, e.g. ``from dml_jax import objectives, evaluation``.
"""

__version__ = "0.1.0"
