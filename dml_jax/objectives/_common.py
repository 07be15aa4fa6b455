"""Pieces shared by the objective families: the one ``apply`` preamble (:func:`batch_objective`
for the objectives that compare the anchors with the batch or a reference set,
:func:`pair_objective` for a pair objective given as its term function, :func:`class_objective`
for the proxy / class-weight objectives), input checks, ``init`` of parameter-free objectives,
the ``aux`` diagnostics and differentiable gathers of selected terms."""

from __future__ import annotations

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
  if 0 in embeddings.shape:
    raise ValueError(f"embeddings must be non-empty [B, D] with B, D >= 1, got shape "
                     f"{embeddings.shape}.")
  if not jnp.issubdtype(embeddings.dtype, jnp.floating):
    raise ValueError(f"embeddings must be floating point, got dtype {embeddings.dtype}.")
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
  if labels.shape != embeddings.shape[:1]:
    raise ValueError(f"labels must have shape [B] = ({embeddings.shape[0]},), got {labels.shape}.")
  if not isinstance(embeddings, jax.core.Tracer):   # traced: the loss is NaN (batch_objective)
    bad = np.flatnonzero(~np.isfinite(np.asarray(embeddings, np.float32)).all(axis=1))
    if bad.size:
      listed = ", ".join(map(str, bad[:10])) + (" ..." if bad.size > 10 else "")
      raise ValueError(f"embeddings have non-finite entries (NaN or inf) in {bad.size} of "
                       f"{embeddings.shape[0]} rows: rows [{listed}].")
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


# --- The shared ``apply`` preamble ----------------------------------------------------------


class Batch(NamedTuple):
  """What an objective's body sees (:func:`batch_objective`): the checked inputs and the
  similarities of the anchors to the batch (or to the reference set).

  Attributes:
    params: ``apply``'s parameters (``{}`` for parameter-free objectives).
    embeddings: float ``[B, D]``.
    labels: int ``[B]``.
    s: float32 ``S [B, N]`` (``N = B`` without a reference set), differentiable.
    sg: its stop-gradient (for selections and weights).
    pos, neg: bool ``[B, N]`` label masks (self pairs and masked references excluded).
    rng: the PRNG key or ``None`` (checked when the objective needs one).
    references: the :class:`References` or ``None``.
  """
  params: object
  embeddings: jax.Array
  labels: jax.Array
  s: jax.Array
  sg: jax.Array
  pos: jax.Array
  neg: jax.Array
  rng: jax.Array | None
  references: References | None


def batch_objective(body: Callable, *, name: str, similarity: str = "cosine",
                    kinds: tuple[str, ...] = sim.KINDS, references: bool = True,
                    rng_reason: str | None = None,
                    no_references_why: str = "builds its terms from the batch") -> Callable:
  """``apply`` of an objective that compares the anchors with the batch (or a reference set):
  the one place for the preamble every such objective shares.

  At build time it checks ``similarity`` against ``kinds``. Each call checks the batch,
  refuses a reference set when ``references`` is False (``no_references_why`` says why),
  refuses a missing ``rng`` when ``rng_reason`` is given (e.g. ``"with mode='sample' draws
  random pairs"``), computes ``S`` and the label masks (:func:`similarities`) and returns
  ``body(Batch(...))``, i.e. ``(loss, aux)``, the loss NaN where ``S`` is not finite (concrete
  non-finite embeddings raise ``ValueError`` naming their rows). A builder returns
  ``(no_params, apply)`` for a parameter-free objective (``pair_objective`` returns both
  itself).
  """
  hparams.choice("similarity", similarity, kinds)
  takes_references = references

  def apply(params, embeddings, labels, *, rng=None, references=None):
    if not takes_references:
      no_references(references, name=name, what=no_references_why)
    if rng_reason is not None:
      check_rng(rng, name=name, reason=rng_reason)
    embeddings, labels = check_batch(embeddings, labels)
    s, pos, neg = similarities(embeddings, labels, similarity, references)
    sg = jax.lax.stop_gradient(s)
    loss, aux = body(Batch(params, embeddings, labels, s, sg, pos, neg, rng, references))
    # Mining leaves a non-finite row out (comparisons with NaN are False), which would give a
    # finite loss; a NaN loss instead lets the caller (the trainer's guard) see it.
    return jnp.where(jnp.all(jnp.isfinite(sg)), loss, jnp.nan), aux

  return apply


def check_rng(rng, *, name: str, reason: str) -> None:
  """``ValueError`` unless ``rng`` is one PRNG key (``jax.random.key(seed)``, or a raw
  ``jax.random.PRNGKey(seed)``) for objective ``name``, which ``reason`` (e.g. ``"with
  mode='sample' draws random pairs"``); a plain seed, a batch of keys or ``None`` is named."""
  if rng is None:
    raise ValueError(f"objective {name!r} {reason}; pass rng=<PRNG key> to apply.")
  dtype = getattr(rng, "dtype", None)
  try:
    typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    one_key = (rng if typed else jax.random.wrap_key_data(rng)).shape == ()
  except TypeError:
    one_key = False
  if not one_key:
    got = (f"{dtype} {tuple(rng.shape)}" if dtype is not None
           else f"{rng!r:.40} ({type(rng).__name__})")
    raise ValueError(f"objective {name!r} {reason}; rng must be one PRNG key "
                     f"(jax.random.key(seed) or jax.random.PRNGKey(seed)), got {got}.")


def stochastic_reason(*, positive: str, negative: str) -> str | None:
  """``rng_reason`` of :func:`batch_objective` for a ``mining.select`` selection: a reason
  when ``(positive, negative)`` draws random numbers, else ``None``."""
  if mining.is_stochastic(positive=positive, negative=negative):
    return f"with positive={positive!r}, negative={negative!r} draws random numbers"
  return None


class PairTerms(NamedTuple):
  """A pair objective's terms (:func:`pair_objective`).

  Attributes:
    fn: ``S [B, N] -> terms``, differentiable; its gradient weights ``|dl/dS_ij|`` say which
      entering pairs are active (:func:`pair_aux`).
    entering: bool ``[B, N]``, the pairs that enter the loss.
    where: the mask of ``losses.reduce(fn(S), where, reduction)`` (``None``, ``[B]``,
      ``[B, N]`` or ``(pos, neg)`` for ``'balanced'``).
    reduction: of ``losses.REDUCTIONS``.
    loss: the loss itself when it is not that reduction (e.g. weighted or sampled pairs).
  """
  fn: Callable
  entering: jax.Array
  where: object = None
  reduction: str = "mean"
  loss: jax.Array | None = None


def pair_objective(terms: Callable, *, name: str, similarity: str = "cosine",
                   kinds: tuple[str, ...] = sim.KINDS, references: bool = True,
                   rng_reason: str | None = None,
                   no_references_why: str = "builds its terms from the batch") -> tuple:
  """``(init, apply)`` of a parameter-free pair objective given its term function
  ``terms(Batch) -> PairTerms``: the preamble is :func:`batch_objective`'s (same keywords),
  the loss ``losses.reduce`` of the terms (or ``PairTerms.loss``) and ``aux``
  :func:`pair_aux`'s."""

  def body(b: Batch):
    t = terms(b)
    loss = losses.reduce(t.fn(b.s), t.where, t.reduction) if t.loss is None else t.loss
    return loss, pair_aux(t.entering, t.fn, b.sg, b.pos, b.neg)

  return no_params, batch_objective(body, name=name, similarity=similarity, kinds=kinds,
                                    references=references, rng_reason=rng_reason,
                                    no_references_why=no_references_why)


def no_references(references, *, name: str,
                  what: str = "compares embeddings with learnable class weights") -> None:
  """``ValueError`` for an objective that takes no reference set (the proxy / classification
  objectives, ``npairs``) when it is given one (e.g. cross-batch memory)."""
  if references is not None:
    raise ValueError(f"objective {name!r} {what} and takes no reference set; set "
                     "memory.size=0 (cross-batch memory is for the pair- and triplet-based "
                     "objectives).")


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


def init_proxies(rng, *, num_classes: int, dim: int, norm: float = 1.0) -> dict:
  """``init`` of the proxy / class-weight objectives: ``{'proxies': float32 [num_classes,
  dim]}``, Gaussian directions of length ``norm`` (``num_classes >= 2``; the objectives'
  ``proxy_norm``, default 1).

  The losses see only cosines, but the norm sets how fast a proxy turns: its gradient is
  orthogonal to it and scales as ``1 / |p|``, so with Adam a proxy of norm ``r`` turns about
  ``lr / r`` per step (SGD: ``lr / r^2``). The papers' and pytorch-metric-learning's inits are
  larger (standard normal, norm ``sqrt(D)``, for NormSoftmax / CosFace / ArcFace / Proxy-NCA;
  Kaiming normal with fan_out, norm ``sqrt(2 D / C)``, for Proxy-Anchor), so at the same
  learning rate unit proxies move that many times faster (``proxy_norm`` sets the length:
  e.g. ``sqrt(D)`` for the former's step at their learning rates)."""
  num_classes = hparams.integer("num_classes", num_classes, minimum=2)
  dim = hparams.integer("dim", dim, minimum=1)
  proxies = jax.random.normal(rng, (num_classes, dim), jnp.float32)
  return {"proxies": sim.l2_normalize(proxies) * jnp.float32(norm)}


def proxy_init(proxy_norm, *, per_class: int = 1):
  """The ``init`` of a proxy objective whose class vectors start at length ``proxy_norm``
  (checked: a finite number ``> 0``), ``per_class`` of them per class."""
  proxy_norm = hparams.number("proxy_norm", proxy_norm, positive=True)

  def init(rng, *, num_classes: int, dim: int) -> dict:
    num_classes = hparams.integer("num_classes", num_classes, minimum=2)
    return init_proxies(rng, num_classes=num_classes * per_class, dim=dim, norm=proxy_norm)

  return init


def max_over_centers(embeddings: jax.Array, proxies: jax.Array, per_class: int) -> jax.Array:
  """Each class's most similar of its ``K`` centres: ``[B, D]``, ``[C * K, D]`` (rows
  ``c * K + k``) -> cosine ``[B, C]`` (the plain cosine to the proxies when ``K = 1``)."""
  cos = sim.pairwise_similarity(embeddings, proxies, kind="cosine")     # float32 [B, C * K]
  if per_class == 1:
    return cos
  return jnp.max(cos.reshape(cos.shape[0], -1, per_class), axis=2)


class ClassBatch(NamedTuple):
  """What a proxy / class-weight objective's body sees (:func:`class_objective`).

  Attributes:
    embeddings: float ``[B, D]``; labels: int ``[B]``.
    proxies: ``params['proxies']``, ``[C * K, D]`` (rows ``c * K + k``: class ``c``'s centres).
    ok: bool ``[B]``, labels in ``[0, C)`` (concrete labels out of range raise, see
      :func:`check_label_range`).
    s: float32 ``[B, C]`` the class similarity (cosine; the centres of a class pooled).
    true: bool ``[B, C]``, the anchor's own class.
  """
  embeddings: jax.Array
  labels: jax.Array
  proxies: jax.Array
  ok: jax.Array
  s: jax.Array
  true: jax.Array


def class_objective(body: Callable, *, name: str, per_class: int = 1,
                    class_similarity: Callable = max_over_centers) -> Callable:
  """``apply`` of a proxy / class-weight objective: the preamble they share (no reference set,
  the batch and ``params['proxies']`` checked, the class similarity
  ``class_similarity(embeddings, proxies, per_class) -> [B, C]``, cosine by default), then
  ``body(ClassBatch(...)) -> (loss, aux)``; ``rng`` is unused."""

  def apply(params, embeddings, labels, *, rng=None, references=None):
    del rng
    no_references(references, name=name)
    embeddings, labels = check_batch(embeddings, labels)
    proxies = param(params, "proxies", name=name)
    rows = proxies.shape[0] if proxies.ndim == 2 else 0
    if proxies.ndim != 2 or proxies.shape[1] != embeddings.shape[1] or rows < 2 * per_class \
        or rows % per_class:
      raise ValueError(f"params['proxies'] must have shape [C * {per_class} (C >= 2), "
                       f"{embeddings.shape[1]}], got {proxies.shape}.")
    ok = check_label_range(labels, rows // per_class, what="proxies")
    s = class_similarity(embeddings, proxies, per_class)               # float32 [B, C]
    true = labels[:, None] == jnp.arange(rows // per_class)[None, :]  # [B, C]
    return body(ClassBatch(embeddings, labels, proxies, ok, s, true))

  return apply


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
  batch (an upper bound when pairs are masked out, e.g. empty memory slots; a reference set
  without the batch has ``B N``)."""
  return s.shape[0] * (s.shape[1] - 1)
