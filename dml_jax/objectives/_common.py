"""Pieces shared by the objective families: input checks, ``init`` of parameter-free
objectives, the ``aux`` diagnostics and differentiable gathers of selected terms."""

from __future__ import annotations

import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dml_jax import hparams
from dml_jax import losses
from dml_jax import mining
from dml_jax import similarity as sim

PAIR_ACTIVE_WEIGHT = 1e-3              # a pair is active when |dl/dS| exceeds this


def check_batch(embeddings, labels):
  """Trace-time checks of ``apply``'s inputs; returns them as arrays."""
  embeddings, labels = jnp.asarray(embeddings), jnp.asarray(labels)
  if embeddings.ndim != 2:
    raise ValueError(f"embeddings must have rank 2 [B, D], got shape {embeddings.shape}.")
  if not jnp.issubdtype(embeddings.dtype, jnp.floating):
    raise ValueError(f"embeddings must be floating point, got dtype {embeddings.dtype}.")
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
  if labels.shape != embeddings.shape[:1]:
    raise ValueError(f"labels must have shape [B] = ({embeddings.shape[0]},), got {labels.shape}.")
  return embeddings, labels


class References(NamedTuple):
  """A reference set the anchors of a batch are compared with, instead of the batch itself.

  Cross-batch memory (``dml_jax.memory``) passes the batch followed by embeddings of earlier
  steps; any caller may pass its own. Gradients flow into ``embeddings`` only if the caller
  gives them a path (memory entries are constants; the batch's own rows may or may not be).

  Attributes:
    embeddings: float ``[N, D]`` reference embeddings.
    labels: int ``[N]`` their labels.
    mask: bool ``[B, N]``: ``mask[a, j]`` = the pair ``(anchor a, reference j)`` may be a
      positive or a negative. False where ``j`` is the anchor itself and for empty slots.
  """
  embeddings: jax.Array
  labels: jax.Array
  mask: jax.Array


def similarities(embeddings, labels, similarity: str, references: References | None = None):
  """``(s, pos, neg)``: float32 ``S [B, N]`` of the anchors against the references and the
  label masks, bool ``[B, N]``. Without ``references``, ``N = B``: the batch against itself,
  self pairs excluded (``similarity.label_masks``)."""
  embeddings, labels = check_batch(embeddings, labels)
  if references is None:
    s = sim.pairwise_similarity(embeddings, kind=similarity)
    pos, neg = sim.label_masks(labels)
    return s, pos, neg
  ref, ref_labels, mask = (jnp.asarray(x) for x in references)
  n = ref_labels.shape[0] if ref_labels.ndim == 1 else -1
  if ref.ndim != 2 or ref.shape != (n, embeddings.shape[1]) or mask.shape != (labels.shape[0], n):
    raise ValueError(
        f"references must be (embeddings [N, {embeddings.shape[1]}], labels [N], mask "
        f"[{labels.shape[0]}, N]); got shapes {ref.shape}, {ref_labels.shape}, {mask.shape}.")
  if mask.dtype != jnp.bool_ or not jnp.issubdtype(ref_labels.dtype, jnp.integer):
    raise ValueError(f"references' labels must be integers and mask boolean; got dtypes "
                     f"{ref_labels.dtype}, {mask.dtype}.")
  s = sim.pairwise_similarity(embeddings, ref.astype(embeddings.dtype), kind=similarity)
  pos, neg = sim.label_masks(labels, ref_labels, exclude_self=False)
  return s, pos & mask, neg & mask


def no_references(references, *, name: str,
                  what: str = "compares embeddings with learnable class weights") -> None:
  """``ValueError`` for an objective that takes no reference set (the proxy / classification
  objectives, ``npairs``) when it is given one (e.g. cross-batch memory)."""
  if references is not None:
    raise ValueError(f"objective {name!r} {what} and takes no reference set; set "
                     "memory.size=0 (cross-batch memory is for the pair- and triplet-based "
                     "objectives).")


def check_rng(rng, *, name: str, positive: str, negative: str):
  """``rng``, or ``ValueError`` when the selection ``(positive, negative)`` needs one."""
  if rng is None and mining.is_stochastic(positive=positive, negative=negative):
    raise ValueError(f"objective {name!r} with positive={positive!r}, negative={negative!r} "
                     "draws random numbers; pass rng=<PRNG key> to apply.")
  return rng


def check_label_range(labels: jax.Array, num: int, *, what: str) -> jax.Array:
  """bool ``[B]``: ``0 <= labels < num``. Concrete (not traced) labels out of range raise.

  Under ``jit`` label values are unknown at trace time: callers turn out-of-range anchors into
  NaN losses (the trainer's NaN guard then stops, naming the step) instead of silently
  clamping the gather.
  """
  if not isinstance(labels, jax.core.Tracer) and labels.size:
    # numpy, not jnp: concrete labels closed over by a jitted function are still concrete
    # here, but a jnp reduction of them would be staged into the trace
    lo, hi = int(np.min(np.asarray(labels))), int(np.max(np.asarray(labels)))
    if lo < 0 or hi >= num:
      raise ValueError(f"labels must lie in [0, {num}) (the {what} were initialised with "
                       f"num_classes={num}); got labels in [{lo}, {hi}].")
  return (labels >= 0) & (labels < num)


def param(params, key: str, *, name: str) -> jax.Array:
  """``params[key]`` as an array, or ``ValueError`` saying ``init``'s dict is needed."""
  if not isinstance(params, dict) or key not in params:
    raise ValueError(f"objective {name!r} needs params[{key!r}]; pass the dict returned by "
                     f"init(rng, num_classes=..., dim=...), got {params!r:.80}.")
  return jnp.asarray(params[key])


def init_proxies(rng, *, num_classes: int, dim: int) -> dict:
  """``init`` of the proxy / class-weight objectives: ``{'proxies': float32 [num_classes,
  dim]}``, unit-norm Gaussian rows (``num_classes >= 2``)."""
  num_classes = hparams.integer("num_classes", num_classes, minimum=2)
  dim = hparams.integer("dim", dim, minimum=1)
  proxies = jax.random.normal(rng, (num_classes, dim), jnp.float32)
  return {"proxies": sim.l2_normalize(proxies)}


def class_batch(params, embeddings, labels, references, *, name: str, per_class: int = 1):
  """``(embeddings, labels, proxies [C * per_class, D], ok [B])`` of a proxy / class-weight
  objective: checks the inputs and ``params['proxies']`` (rows ``c * per_class + k``: the
  ``per_class`` centres of class ``c``); ``ok`` = labels in ``[0, C)`` (concrete labels out of
  range raise, see :func:`check_label_range`)."""
  no_references(references, name=name)
  embeddings, labels = check_batch(embeddings, labels)
  proxies = param(params, "proxies", name=name)
  rows = proxies.shape[0] if proxies.ndim == 2 else 0
  if proxies.ndim != 2 or proxies.shape[1] != embeddings.shape[1] or rows < 2 * per_class \
      or rows % per_class:
    raise ValueError(f"params['proxies'] must have shape [C * {per_class} (C >= 2), "
                     f"{embeddings.shape[1]}], got {proxies.shape}.")
  ok = check_label_range(labels, rows // per_class, what="proxies")
  return embeddings, labels, proxies, ok


def no_params(rng, *, num_classes: int, dim: int) -> dict:
  """``init`` of a parameter-free objective: returns ``{}``."""
  del rng, num_classes, dim
  return {}


def row_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """``[B, N]`` -> ``[B]``: mean of ``x`` over the masked entries of each row (0 if none)."""
  count = jnp.sum(mask, axis=1, dtype=jnp.float32)
  return jnp.sum(jnp.where(mask, x, 0.0), axis=1) / jnp.maximum(count, 1.0)


def aux(valid: jax.Array, active: jax.Array, s_ap: jax.Array, s_an: jax.Array) -> dict:
  """The diagnostics of every objective (package docstring); all ``[B, N]`` inputs."""
  s_ap, s_an = jax.lax.stop_gradient(s_ap), jax.lax.stop_gradient(s_an)
  return {
      "valid_fraction": jnp.mean(jnp.any(valid, axis=1).astype(jnp.float32)),
      "active_fraction": losses.masked_mean(active.astype(jnp.float32), valid),
      "mean_s_ap": losses.masked_mean(s_ap, valid),
      "mean_s_an": losses.masked_mean(jnp.broadcast_to(s_an, valid.shape), valid),
  }


def negative_of_term(x: jax.Array, sel: mining.Selection, *, positive: str) -> jax.Array:
  """Each term's ``x[a, n]`` at its negative ``n = sel.negative[a, p]``, differentiably.

  With one positive per anchor (``positive`` not ``'all'``) only the term ``(a, p_a)`` counts:
  its negative ``i_a = sum_p [pairs_ap] negative_ap`` is gathered as ``[B, 1]`` (broadcasts over
  the row; the gradient is a ``B``-entry scatter instead of ``B^2``). Equal to the ``[B, N]``
  gather on every selected term; invalid terms are masked by the callers.

  Args:
    x: float ``[B, N]`` (e.g. ``S`` or ``d^2``).
    sel: the :class:`mining.Selection`.
    positive: the positive mode of ``sel``.

  Returns:
    float ``[B, 1]`` (single positive) or ``[B, N]`` (``'all'``).
  """
  if positive == "all":
    return jnp.take_along_axis(x, sel.negative, axis=1)
  i = jnp.sum(jnp.where(sel.pairs, sel.negative, 0), axis=1, dtype=jnp.int32)   # [B]
  return jnp.take_along_axis(x, i[:, None], axis=1)


# --- Pair-based objectives (``pairs``, ``dro``) ---------------------------------------------


def pair_batch(embeddings, labels, similarity: str, references: References | None = None):
  """``(s, sg, pos, neg)``: float32 ``S [B, N]`` (:func:`similarities`), its stop-gradient
  and the label masks."""
  s, pos, neg = similarities(embeddings, labels, similarity, references)
  return s, jax.lax.stop_gradient(s), pos, neg


def pair_aux(entering: jax.Array, term_fn: Callable, sg: jax.Array, pos: jax.Array,
             neg: jax.Array) -> dict:
  """The diagnostics of a pair objective (``pairs`` module docstring); ``term_fn(S)`` -> its
  terms, whose gradient weights ``|dl/dS_ij|`` say which entering pairs are active."""
  weight = jax.grad(lambda x: jnp.sum(term_fn(x)))(sg)          # dl/dS_ij per pair
  out = aux(entering, jnp.abs(weight) > PAIR_ACTIVE_WEIGHT, sg, sg)
  out["mean_s_ap"] = losses.masked_mean(sg, entering & pos)
  out["mean_s_an"] = losses.masked_mean(sg, entering & neg)
  return out


def num_pairs(s: jax.Array) -> int:
  """The ordered pairs ``(anchor, reference)`` of ``S [B, N]`` that are not self pairs:
  ``B (B - 1)`` for the batch against itself, ``B (N - 1)`` with a reference set that holds the
  batch (an upper bound otherwise)."""
  return s.shape[0] * (s.shape[1] - 1)


def clamp_k(k: int, available: int, *, name: str, what: str = "k") -> int:
  """``min(k, available)``, with a warning (at trace time) when ``k`` is clamped."""
  if k > available:
    warnings.warn(f"objective {name!r}: {what}={k} exceeds the {available} ordered pairs of "
                  f"the batch; using {what}={available}.", stacklevel=3)
    return available
  return k
