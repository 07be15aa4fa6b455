"""The objective registry: a name and hyper-parameters -> ``Objective(init, apply)``.

::

  obj = objectives.make("nca", positive="easy", negative="semihard")   # EPSHN
  params = obj.init(rng, num_classes=C, dim=D)                         # {} if parameter-free
  loss, aux = obj.apply(params, embeddings, labels, rng=rng)

``REGISTRY`` is a plain dict ``name -> builder``. A builder's keyword-only arguments *are* the
objective's hyper-parameters, with their defaults (config keys equal these argument names);
:func:`make` checks the given names against the builder's signature, fills in the defaults and
records all of them in ``Objective.hparams``. The builder validates the values and returns
``(init, apply)`` closures with the hyper-parameters baked in, so ``apply`` is ``jax.jit``-able
with nothing static to declare, and differentiable w.r.t. ``embeddings`` and ``params``.

Every ``apply`` composes ``similarity`` -> ``mining.select`` (under stop-gradient) -> a
``losses`` form per term -> ``losses.masked_mean`` over the valid terms (loss 0, finite
gradients, when no term is valid), and returns these float32 scalar diagnostics in ``aux``:

* ``'valid_fraction'``: fraction of anchors with at least one valid term (a positive and an
  admissible negative);
* ``'active_fraction'``: fraction of valid terms that are *active*. NCA losses:
  ``q = 1 - exp(-L) > 1e-3``, where ``q`` is the softmax weight of the negatives, which scales
  the term's whole gradient (``dL/dS_ap = -q/T`` for 1st order); triplet: ``L > 0`` (the hinge
  is open, else the gradient is exactly 0);
* ``'mean_s_ap'``, ``'mean_s_an'``: mean similarity ``S`` (not distance) of the selected
  positive / negative over valid terms; with ``negative='all'`` a term's ``S_an`` is the mean
  over its anchor's negatives. 0 when no term is valid.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp

from dml_jax import losses
from dml_jax import mining
from dml_jax import similarity as sim

DUPLICATE_SIMILARITY = 0.9999   # released EPHN code: positives above this are duplicates
NCA_ACTIVE_WEIGHT = 1e-3        # an NCA term is active when its negative weight q exceeds this
NCA_NEGATIVE_MODES = ("hard", "semihard", "easy", "random", "all")   # no margin: no semihard_random
TRIPLET_SIMILARITIES = ("cosine", "neg_sq_euclidean")                 # kinds that define d^2


@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
  """A loss with its resolved hyper-parameters (immutable; hashed and compared by identity).

  Attributes:
    name: the registry name.
    hparams: every hyper-parameter of the builder, defaults included (JSON-serialisable).
    init: ``init(rng, *, num_classes, dim) -> params`` (``{}`` for parameter-free objectives).
    apply: ``apply(params, embeddings [B, D], labels [B], *, rng=None) -> (loss, aux)``; ``loss``
      a float32 scalar, ``aux`` a dict of float32 scalars.
  """
  name: str
  hparams: dict[str, Any]
  init: Callable[..., Any]
  apply: Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


# ------------------------------------------------------------------------------------------
# Validation helpers.


def _choice(name: str, value, allowed) -> str:
  if not isinstance(value, str) or value not in allowed:
    raise ValueError(f"{name}={value!r} is not allowed; choose one of: {', '.join(allowed)}.")
  return value


def _number(name: str, value, *, positive: bool) -> float:
  ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
  if not ok or not (value > 0 if positive else value >= 0):
    raise ValueError(f"{name} must be a number {'> 0' if positive else '>= 0'}, got {value!r}.")
  return float(value)


def _flag(name: str, value) -> bool:
  if not isinstance(value, bool):
    raise ValueError(f"{name} must be True or False, got {value!r}.")
  return value


def _check_batch(embeddings, labels):
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


def _check_rng(rng, *, name: str, positive: str, negative: str):
  if rng is None and mining.is_stochastic(positive=positive, negative=negative):
    raise ValueError(f"objective {name!r} with positive={positive!r}, negative={negative!r} "
                     "draws random numbers; pass rng=<PRNG key> to apply.")
  return rng


def _no_params(rng, *, num_classes: int, dim: int) -> dict:
  """``init`` of a parameter-free objective: returns ``{}``."""
  del rng, num_classes, dim
  return {}


# ------------------------------------------------------------------------------------------
# Shared pieces of apply.


def _row_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """``[B, N]`` -> ``[B]``: mean of ``x`` over the masked entries of each row (0 if none)."""
  count = jnp.sum(mask, axis=1, dtype=jnp.float32)
  return jnp.sum(jnp.where(mask, x, 0.0), axis=1) / jnp.maximum(count, 1.0)


def _aux(valid: jax.Array, active: jax.Array, s_ap: jax.Array, s_an: jax.Array) -> dict:
  """The diagnostics of every objective (see the module docstring); all ``[B, N]`` inputs."""
  s_ap, s_an = jax.lax.stop_gradient(s_ap), jax.lax.stop_gradient(s_an)
  return {
      "valid_fraction": jnp.mean(jnp.any(valid, axis=1).astype(jnp.float32)),
      "active_fraction": losses.masked_mean(active.astype(jnp.float32), valid),
      "mean_s_ap": losses.masked_mean(s_ap, valid),
      "mean_s_an": losses.masked_mean(jnp.broadcast_to(s_an, valid.shape), valid),
  }


# ------------------------------------------------------------------------------------------
# Builders. Keyword-only arguments = hyper-parameters (the config keys).


def _nca_family(*, name: str, order: int, positive: str, negative: str, temperature: float,
                similarity: str, skip_duplicate_positives: bool,
                positive_similarity_only: bool):
  """``(init, apply)`` of the 1st (``order=1``) or 2nd (``order=2``) order NCA objective."""
  _choice("positive", positive, mining.POSITIVE_MODES)
  if negative == "semihard_random":
    raise ValueError(f"negative='semihard_random' needs a triplet margin, which objective "
                     f"{name!r} has not; choose one of: {', '.join(NCA_NEGATIVE_MODES)} "
                     "(or use objective 'triplet').")
  _choice("negative", negative, NCA_NEGATIVE_MODES)
  temperature = _number("temperature", temperature, positive=True)
  _choice("similarity", similarity, sim.KINDS)
  _flag("skip_duplicate_positives", skip_duplicate_positives)
  _flag("positive_similarity_only", positive_similarity_only)
  if (skip_duplicate_positives or positive_similarity_only) and similarity != "cosine":
    raise ValueError("skip_duplicate_positives and positive_similarity_only are thresholds on "
                     f"the cosine similarity; they need similarity='cosine', got {similarity!r}.")
  single = losses.nca if order == 1 else losses.nca_2nd

  def apply(params, embeddings, labels, *, rng=None):
    del params
    embeddings, labels = _check_batch(embeddings, labels)
    key = _check_rng(rng, name=name, positive=positive, negative=negative)
    s = sim.pairwise_similarity(embeddings, kind=similarity)          # float32 [B, B]
    sg = jax.lax.stop_gradient(s)
    pos_mask, neg_mask = sim.label_masks(labels)
    if skip_duplicate_positives:
      pos_mask = pos_mask & (sg <= DUPLICATE_SIMILARITY)
    if positive_similarity_only and negative == "all":
      neg_mask = neg_mask & (sg > 0)
    sel = mining.select(sg, pos_mask, neg_mask, positive=positive, negative=negative, key=key)
    valid = sel.valid
    if negative == "all":
      terms = losses.nca_all_negatives(s, s, sel.negatives, temperature=temperature, order=order)
      s_an = _row_mean(s, sel.negatives)[:, None]
    else:
      s_an = jnp.take_along_axis(s, sel.negative, axis=1)
      terms = single(s, s_an, temperature=temperature)
      if positive_similarity_only:
        valid = valid & (jax.lax.stop_gradient(s_an) > 0)
    if positive_similarity_only:
      valid = valid & (sg > 0)
    loss = losses.masked_mean(terms, valid)
    active = -jnp.expm1(-terms) > NCA_ACTIVE_WEIGHT
    return loss, _aux(valid, active, s, s_an)

  return _no_params, apply


def nca(*, positive: str = "easy", negative: str = "hard", temperature: float = 0.1,
        similarity: str = "cosine", skip_duplicate_positives: bool = False,
        positive_similarity_only: bool = False):
  """The EPHN family, 1st-order NCA (EPHN paper §4; 2nd-order paper eq. 1).

  One negative per term: ``L = softplus((S_an - S_ap) / T)``. ``negative='all'``:
  ``L = -log(e^{S_ap/T} / (e^{S_ap/T} + sum_{n in N_a} e^{S_an/T}))`` (N-pair form, logsumexp).
  ``S`` is used directly whatever the ``similarity`` kind. The loss is the mean over valid
  terms (one term per anchor for single positives, per (anchor, positive) pair for
  ``positive='all'``).

  Named variants (``positive``, ``negative``): EP = ('easy', 'all'), EPHN = ('easy', 'hard')
  [default], EPSHN = ('easy', 'semihard'), HP = ('hard', 'all'), HPHN = ('hard', 'hard'),
  batch-all = ('all', 'all').

  Args:
    positive: ``'easy'`` (default), ``'hard'``, ``'random'``, ``'all'`` (see ``mining``).
    negative: ``'hard'`` (default), ``'semihard'``, ``'easy'``, ``'random'``, ``'all'``.
      Semi-hard is the hardest negative with ``S_an <= S_ap``; the term is dropped if none.
    temperature: ``T > 0``, default 0.1 (EPHN paper §5.1).
    similarity: ``'cosine'`` (default), ``'dot'`` or ``'neg_sq_euclidean'``.
    skip_duplicate_positives: released EPHN code: positives with ``S > 0.9999`` are not
      candidates (default False; cosine only).
    positive_similarity_only: released EPHN code: keep only triplets with ``S_ap > 0`` and
      ``S_an > 0``; with ``negative='all'`` negatives with ``S_an <= 0`` leave the sum (default
      False; cosine only).

  Returns:
    ``(init, apply)``; use ``make('nca', ...)``.
  """
  return _nca_family(name="nca", order=1, positive=positive, negative=negative,
                     temperature=temperature, similarity=similarity,
                     skip_duplicate_positives=skip_duplicate_positives,
                     positive_similarity_only=positive_similarity_only)


def nca_2nd(*, positive: str = "easy", negative: str = "hard", temperature: float = 0.1,
            similarity: str = "cosine", skip_duplicate_positives: bool = False,
            positive_similarity_only: bool = False):
  """The 2nd-order triplet loss (2nd-order paper eq. 16) with EPHN-family mining.

  ``L = -log(e^{l_p/T} / (e^{l_p/T} + e^{l_n/T}))`` with ``l_p = S_ap - S_ap^2/2`` and
  ``l_n = S_an^2/2``; ``negative='all'`` sums ``e^{l_n/T}`` over the anchor's negatives. The
  paper states no temperature: ``temperature=1`` is its exact formula (gradients
  ``dL/dS_ap = -(1 - S_ap) q``, ``dL/dS_an = S_an q``, ``q`` the softmax weight of the
  negative); the default 0.1 matches the EPHN configs. Arguments and variants as :func:`nca`.

  Args:
    positive: default ``'easy'``.
    negative: default ``'hard'``.
    temperature: ``T > 0``, default 0.1; 1 = eq. 16 exactly.
    similarity: default ``'cosine'``.
    skip_duplicate_positives: default False (see :func:`nca`).
    positive_similarity_only: default False (see :func:`nca`).

  Returns:
    ``(init, apply)``; use ``make('nca_2nd', ...)``.
  """
  return _nca_family(name="nca_2nd", order=2, positive=positive, negative=negative,
                     temperature=temperature, similarity=similarity,
                     skip_duplicate_positives=skip_duplicate_positives,
                     positive_similarity_only=positive_similarity_only)


def triplet(*, positive: str = "random", negative: str = "semihard", margin: float = 0.2,
            similarity: str = "cosine", negative_reduction: str = "mean"):
  """Triplet margin loss on squared distances (FaceNet; EPS paper §4.3 with EPS positives).

  One negative per term: ``L = [d_ap^2 - d_an^2 + margin]_+`` with
  ``d^2 = similarity.squared_distance(S)`` (``2 - 2S`` for cosine, ``-S`` for
  ``'neg_sq_euclidean'``). Mining runs on the score ``-d^2``, so ``'semihard'`` is the hardest
  negative with ``d_an^2 >= d_ap^2`` (term dropped if none) and ``'semihard_random'`` is uniform
  over the negatives with ``d_ap^2 - d_an^2 + margin > 0`` (label-noise paper eq. 28; it
  includes negatives closer than the positive). ``negative='all'``: the mean (or sum, see
  ``negative_reduction``) of the hinge over all the anchor's negatives.

  Variants: the default is random-positive semi-hard triplet; EPS = ``positive='easy'``.

  Args:
    positive: ``'random'`` (default), ``'easy'``, ``'hard'``, ``'all'``.
    negative: ``'semihard'`` (default), ``'semihard_random'``, ``'hard'``, ``'easy'``,
      ``'random'``, ``'all'``.
    margin: ``>= 0`` in squared-distance units, default 0.2.
    similarity: ``'cosine'`` (default) or ``'neg_sq_euclidean'`` (``'dot'`` defines no distance).
    negative_reduction: ``negative='all'`` only: ``'mean'`` (default, over all the anchor's
      negatives, zero hinges included) or ``'sum'``.

  Returns:
    ``(init, apply)``; use ``make('triplet', ...)``.
  """
  _choice("positive", positive, mining.POSITIVE_MODES)
  _choice("negative", negative, mining.NEGATIVE_MODES)
  margin = _number("margin", margin, positive=False)
  _choice("similarity", similarity, TRIPLET_SIMILARITIES)
  _choice("negative_reduction", negative_reduction, losses.TRIPLET_REDUCTIONS)

  def apply(params, embeddings, labels, *, rng=None):
    del params
    embeddings, labels = _check_batch(embeddings, labels)
    key = _check_rng(rng, name="triplet", positive=positive, negative=negative)
    s = sim.pairwise_similarity(embeddings, kind=similarity)          # float32 [B, B]
    d2 = sim.squared_distance(s, kind=similarity)
    pos_mask, neg_mask = sim.label_masks(labels)
    sel = mining.select(-jax.lax.stop_gradient(d2), pos_mask, neg_mask, positive=positive,
                        negative=negative, margin=margin, key=key)
    if negative == "all":
      terms = losses.triplet_all_negatives(d2, d2, sel.negatives, margin=margin,
                                           reduction=negative_reduction)
      s_an = _row_mean(s, sel.negatives)[:, None]
    else:
      d2_an = jnp.take_along_axis(d2, sel.negative, axis=1)
      terms = losses.triplet(d2, d2_an, margin=margin)
      s_an = jnp.take_along_axis(s, sel.negative, axis=1)
    loss = losses.masked_mean(terms, sel.valid)
    return loss, _aux(sel.valid, terms > 0, s, s_an)

  return _no_params, apply


REGISTRY: dict[str, Callable[..., tuple[Callable, Callable]]] = {
    "nca": nca,
    "nca_2nd": nca_2nd,
    "triplet": triplet,
}


def names() -> tuple[str, ...]:
  """The registered objective names, sorted."""
  return tuple(sorted(REGISTRY))


def hparam_defaults(name: str) -> dict[str, Any]:
  """The hyper-parameters of objective ``name`` with their defaults (its builder's keywords)."""
  if name not in REGISTRY:
    raise ValueError(f"Unknown objective {name!r}; available: {', '.join(names())}.")
  params = inspect.signature(REGISTRY[name]).parameters.values()
  return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def make(name: str, **hparams) -> Objective:
  """Builds the objective ``name`` with ``hparams`` (the rest at their defaults).

  Args:
    name: one of :func:`names`.
    **hparams: keyword arguments of the builder ``REGISTRY[name]``.

  Returns:
    :class:`Objective` with ``hparams`` holding every resolved hyper-parameter.

  Raises:
    ValueError: unknown ``name`` (lists the names), unknown hyper-parameter (lists the valid
      ones) or a bad value (e.g. ``temperature <= 0``, an unknown or unusable mining mode).
  """
  resolved = hparam_defaults(name)
  unknown = sorted(set(hparams) - set(resolved))
  if unknown:
    raise ValueError(f"Unknown hyper-parameter(s) {', '.join(unknown)} for objective {name!r}; "
                     f"valid: {', '.join(resolved)}.")
  resolved.update(hparams)
  init, apply = REGISTRY[name](**resolved)
  return Objective(name=name, hparams=resolved, init=init, apply=apply)
