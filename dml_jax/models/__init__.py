"""Embedding models (Flax NNX) and their registry.

``MODELS`` is a plain dict ``name -> model class``; ``make(name, embedding_dim=D, rngs=...)``
builds one. Every model maps float images ``[B, H, W, C]`` to float32 embeddings ``[B, D]``,
L2-normalised unless ``normalize=False``; ``model.train()`` / ``model.eval()`` switch
BatchNorm between batch statistics and running averages.
"""

from __future__ import annotations

import inspect

from flax import nnx

from dml_jax.models.heads import LinearEmbedding, finalize_embedding, global_average_pool
from dml_jax.models.small_cnn import SmallCNN
# --- backbones ---
from dml_jax.models.bn_inception import BNInception
from dml_jax.models.heads import EmbeddingHead, global_pool
from dml_jax.models.resnet import ResNet, ResNet18, ResNet34, ResNet50

MODELS: dict[str, type[nnx.Module]] = {
    "small_cnn": SmallCNN,
    "resnet18": ResNet18,
    "resnet34": ResNet34,
    "resnet50": ResNet50,
    "bn_inception": BNInception,
}


def names() -> tuple[str, ...]:
  """The registered model names, sorted."""
  return tuple(sorted(MODELS))


def make(name: str, *, embedding_dim: int, normalize: bool = True, rngs: nnx.Rngs,
         **kwargs) -> nnx.Module:
  """Builds ``MODELS[name](embedding_dim=.., normalize=.., rngs=.., **kwargs)``.

  Args:
    name: a key of ``MODELS``.
    embedding_dim: ``D``.
    normalize: L2-normalise the embeddings.
    rngs: ``nnx.Rngs`` for the initialisation.
    **kwargs: further constructor arguments of that model (e.g. ``image_size``).

  Raises:
    ValueError: an unknown name or keyword argument (the message lists the valid ones).
  """
  if name not in MODELS:
    raise ValueError(f"Unknown model {name!r}; valid names: {', '.join(names())}.")
  cls = MODELS[name]
  params = inspect.signature(cls.__init__).parameters
  valid = sorted(p for p in params if p not in ("self", "embedding_dim", "normalize", "rngs")
                 and params[p].kind is not inspect.Parameter.VAR_KEYWORD)
  takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
  unknown = sorted(set(kwargs) - set(valid))
  if unknown and not takes_any:
    raise ValueError(f"Unknown argument(s) {unknown} for model {name!r}; valid: "
                     f"{', '.join(valid)}.")
  return cls(embedding_dim=embedding_dim, normalize=normalize, rngs=rngs, **kwargs)


def __getattr__(name: str):
  """``load_pretrained`` and ``param_labels`` come from ``pretrained``, imported on first use so
  that ``python -m dml_jax.models.pretrained`` runs a module not imported before (no runpy
  warning)."""
  if name in ("load_pretrained", "param_labels"):
    from dml_jax.models import pretrained  # pylint: disable=import-outside-toplevel
    return getattr(pretrained, name)
  raise AttributeError(f"module 'dml_jax.models' has no attribute {name!r}")


__all__ = ["MODELS", "LinearEmbedding", "SmallCNN", "finalize_embedding",
           "global_average_pool", "make", "names",
           "BNInception", "EmbeddingHead", "ResNet", "ResNet18", "ResNet34", "ResNet50",
           "global_pool", "load_pretrained", "param_labels"]
