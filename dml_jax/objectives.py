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

The pair-based objectives (``contrastive``, ``binomial``, ``multi_similarity``,
``lifted_structure``, ``dro_*``) use pair selections and per-pair weights instead of
``mining.select``; their terms are pairs and their ``aux`` is defined in the section "Pair-based
objectives" below.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp

from dml_jax import losses
from dml_jax import mining
from dml_jax import similarity as sim

DUPLICATE_SIMILARITY = 0.9999   # released EPHN code: positives above this are duplicates
NCA_ACTIVE_WEIGHT = 1e-3        # an NCA term is active when its negative weight q exceeds this
NCA_NEGATIVE_MODES = ("hard", "semihard", "easy", "random", "all")   # no margin: no semihard_*
TRIPLET_SIMILARITIES = ("cosine", "neg_sq_euclidean")                 # kinds that define d^2
TRIPLET_DISTANCES = ("squared", "euclidean")     # hinge on d^2 (FaceNet, EPS) or d (label noise)
TRIPLET_MIN_SQ_DISTANCE = 1e-12                  # d = sqrt(max(d^2, this)) for 'euclidean'


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


def _negative_of_term(x: jax.Array, sel: mining.Selection, *, positive: str) -> jax.Array:
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


# ------------------------------------------------------------------------------------------
# Builders. Keyword-only arguments = hyper-parameters (the config keys).


def _nca_family(*, name: str, order: int, positive: str, negative: str, temperature: float,
                similarity: str, skip_duplicate_positives: bool,
                positive_similarity_only: bool):
  """``(init, apply)`` of the 1st (``order=1``) or 2nd (``order=2``) order NCA objective."""
  _choice("positive", positive, mining.POSITIVE_MODES)
  if negative in mining.MARGIN_MODES:
    raise ValueError(f"negative={negative!r} needs a triplet margin, which objective "
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
      s_an = _negative_of_term(s, sel, positive=positive)
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


def _triplet_terms(embeddings, labels, key, *, positive: str, negative: str, margin: float,
                   similarity: str, negative_reduction: str, distance: str = "squared"):
  """Per-term triplet losses of a batch (shared by ``triplet`` and ``trimmed_triplet``).

  ``distance='squared'`` uses ``d^2``; ``'euclidean'`` uses ``d = sqrt(d^2)`` (clipped at
  ``TRIPLET_MIN_SQ_DISTANCE`` below, so identical points have a zero, not infinite, gradient).
  Mining runs on ``-d`` (or ``-d^2``), so ``'semihard_random'``'s margin is in the same units
  as the loss; ``'distance_weighted'`` always sees ``-d^2`` (its own definition) and
  ``'semihard_band'`` always ``-d`` on unsquared distances (Roth et al.'s miner, whose band
  ``d_ap < d_an < d_ap + margin`` uses the loss's margin on plain distances even though their
  hinge is on ``d^2``).

  Returns:
    ``(terms, valid, s, s_an)``: float32 ``[B, B]`` per-term losses, bool ``[B, B]`` valid terms,
    the similarity ``S [B, B]`` and each term's ``S_an`` (``[B, B]`` for ``positive='all'``;
    ``[B, 1]`` for a single positive, or the mean over the anchor's negatives for
    ``negative='all'``).
  """
  s = sim.pairwise_similarity(embeddings, kind=similarity)            # float32 [B, B]
  d2 = sim.squared_distance(s, kind=similarity)
  d = d2 if distance == "squared" else jnp.sqrt(jnp.maximum(d2, TRIPLET_MIN_SQ_DISTANCE))
  pos_mask, neg_mask = sim.label_masks(labels)
  if negative == "distance_weighted":
    mined = d2
  elif negative == "semihard_band" and distance == "squared":
    mined = jnp.sqrt(jnp.maximum(d2, TRIPLET_MIN_SQ_DISTANCE))
  else:
    mined = d
  score = -jax.lax.stop_gradient(mined)
  sel = mining.select(score, pos_mask, neg_mask, positive=positive,
                      negative=negative, margin=margin, key=key, dim=embeddings.shape[1])
  if negative == "all":
    terms = losses.triplet_all_negatives(d, d, sel.negatives, margin=margin,
                                         reduction=negative_reduction)
    s_an = _row_mean(s, sel.negatives)[:, None]
  else:
    d_an = _negative_of_term(d, sel, positive=positive)
    terms = losses.triplet(d, d_an, margin=margin)
    s_an = _negative_of_term(s, sel, positive=positive)
  return terms, sel.valid, s, s_an


def _check_triplet_hparams(*, positive, negative, margin, similarity, negative_reduction,
                           distance="squared"):
  """Validates the triplet hyper-parameters; returns ``margin`` as a float."""
  _choice("distance", distance, TRIPLET_DISTANCES)
  _choice("positive", positive, mining.POSITIVE_MODES)
  _choice("negative", negative, mining.NEGATIVE_MODES)
  margin = _number("margin", margin, positive=False)
  _choice("similarity", similarity, TRIPLET_SIMILARITIES)
  _choice("negative_reduction", negative_reduction, losses.TRIPLET_REDUCTIONS)
  if negative == "distance_weighted" and similarity != "cosine":
    raise ValueError("negative='distance_weighted' weights distances on the unit sphere; it "
                     f"needs similarity='cosine', got {similarity!r}.")
  return margin


def triplet(*, positive: str = "random", negative: str = "semihard", margin: float = 0.2,
            similarity: str = "cosine", negative_reduction: str = "mean",
            distance: str = "squared"):
  """Triplet margin loss on squared distances (FaceNet; EPS paper §4.3 with EPS positives).

  ``distance='euclidean'`` puts the hinge on plain distances instead,
  ``[d_ap - d_an + margin]_+`` (the label-noise paper's eq. 3, ``d = ||f_i - f_j||``); all
  ``d^2`` below then read ``d``.

  One negative per term: ``L = [d_ap^2 - d_an^2 + margin]_+`` with
  ``d^2 = similarity.squared_distance(S)`` (``2 - 2S`` for cosine, ``-S`` for
  ``'neg_sq_euclidean'``). Mining runs on the score ``-d^2``, so ``'semihard'`` is the hardest
  negative with ``d_an^2 >= d_ap^2`` (term dropped if none) and ``'semihard_random'`` is uniform
  over the negatives with ``d_ap^2 - d_an^2 + margin > 0`` (label-noise paper eq. 28; it
  includes negatives closer than the positive). ``'semihard_band'`` is Roth et al.'s semi-hard
  miner (the framework the EPS paper used): uniform over the band
  ``d_ap < d_an < d_ap + margin`` on *unsquared* distances ``d = sqrt(d^2)`` whatever
  ``distance`` is (their code compares plain distances with the loss's margin), and uniform
  over all the anchor's negatives when the band is empty, so every anchor with a positive keeps
  its term. ``negative='all'``: the mean (or sum, see ``negative_reduction``) of the hinge over
  all the anchor's negatives.
  ``'distance_weighted'``: Wu et al.'s sampling ``Pr(n) ~ q(d_an)^-1`` (``mining``), with
  ``D`` the embedding dimension and the sampler's defaults (cutoff 0.5, weight 0 from
  ``d = 1.4``, uniform over the negatives when no weight is left); cosine only.

  Variants: the default is random-positive semi-hard triplet; EPS = ``positive='easy'``
  (EPS paper §5.2.2: EPS + semi-hard); EPS as run in Roth et al.'s framework =
  ``positive='easy', negative='semihard_band'``.

  Args:
    positive: ``'random'`` (default), ``'easy'``, ``'hard'``, ``'all'``.
    negative: ``'semihard'`` (default), ``'semihard_random'``, ``'semihard_band'``, ``'hard'``,
      ``'easy'``, ``'random'``, ``'all'``, ``'distance_weighted'``.
    margin: ``>= 0`` in the units of the hinge (``d^2``, or ``d`` for ``'euclidean'``), default
      0.2; also the band width of ``'semihard_band'`` (on ``d``).
    similarity: ``'cosine'`` (default) or ``'neg_sq_euclidean'`` (``'dot'`` defines no distance).
    negative_reduction: ``negative='all'`` only: ``'mean'`` (default, over all the anchor's
      negatives, zero hinges included) or ``'sum'``.
    distance: ``'squared'`` (default) or ``'euclidean'``.

  Returns:
    ``(init, apply)``; use ``make('triplet', ...)``.
  """
  margin = _check_triplet_hparams(positive=positive, negative=negative, margin=margin,
                                  similarity=similarity, negative_reduction=negative_reduction,
                                  distance=distance)

  def apply(params, embeddings, labels, *, rng=None):
    del params
    embeddings, labels = _check_batch(embeddings, labels)
    key = _check_rng(rng, name="triplet", positive=positive, negative=negative)
    terms, valid, s, s_an = _triplet_terms(
        embeddings, labels, key, positive=positive, negative=negative, margin=margin,
        similarity=similarity, negative_reduction=negative_reduction, distance=distance)
    loss = losses.masked_mean(terms, valid)
    return loss, _aux(valid, terms > 0, s, s_an)

  return _no_params, apply


# --- Margin / proxy / trimmed objectives (issue 3) -------------------------------------------

MARGIN_BETA_MODES = ("class", "global", "fixed")
MARGIN_NEGATIVE_MODES = ("distance_weighted", "semihard", "semihard_random", "semihard_band",
                         "hard", "easy", "random")
MARGIN_REDUCTIONS = ("nonzero", "mean")
PROXY_ACTIVE_WEIGHT = 1e-3   # a proxy-NCA anchor is active when 1 - p(true proxy) exceeds this


def _int_at_least(name: str, value, *, minimum: int) -> int:
  if isinstance(value, bool) or not hasattr(value, "__index__") or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
  return int(value)


def _check_label_range(labels: jax.Array, num: int, *, what: str) -> jax.Array:
  """bool ``[B]``: ``0 <= labels < num``. Concrete (not traced) labels out of range raise.

  Under ``jit`` label values are unknown at trace time: callers turn out-of-range anchors into
  NaN losses (the trainer's NaN guard then stops, naming the step) instead of silently
  clamping the gather.
  """
  if not isinstance(labels, jax.core.Tracer) and labels.size:
    lo, hi = int(jnp.min(labels)), int(jnp.max(labels))
    if lo < 0 or hi >= num:
      raise ValueError(f"labels must lie in [0, {num}) (the {what} were initialised with "
                       f"num_classes={num}); got labels in [{lo}, {hi}].")
  return (labels >= 0) & (labels < num)


def _param(params, key: str, *, name: str) -> jax.Array:
  if not isinstance(params, dict) or key not in params:
    raise ValueError(f"objective {name!r} needs params[{key!r}]; pass the dict returned by "
                     f"init(rng, num_classes=..., dim=...), got {params!r:.80}.")
  return jnp.asarray(params[key])


def margin(*, positive: str = "random", negative: str = "distance_weighted",
           alpha: float = 0.2, beta: str = "class", beta0: float = 1.2, nu: float = 0.0,
           similarity: str = "cosine", cutoff: float = 0.5, nonzero_loss_cutoff: float = 1.4,
           fallback: str = "negatives", reduction: str = "nonzero"):
  """Margin loss with distance-weighted sampling (Wu et al. 2017; EPS paper §3, §5.2.2).

  Every valid term ``(a, p)`` with its negative ``n`` contributes two hinges on plain Euclidean
  distances ``d = sqrt(d^2 + 1e-8)`` (``d^2 = 2 - 2S`` for cosine, released code's ``1e-8``):
  ``[d_ap - beta_a + alpha]_+ + [beta_a - d_an + alpha]_+`` (``losses.margin``), with
  ``beta_a`` the learnable boundary of the anchor's class. The loss is

  ``L = (sum_terms (pos + neg) + nu sum_terms beta_a) / max(1, #non-zero hinges)``

  (``reduction='nonzero'``, the released code's normalisation, which there is 0/0 = NaN when
  no hinge is open; here 0), or divided by the number of hinges ``2 #valid`` (``'mean'``).
  ``nu`` is Wu et al.'s regulariser on ``beta`` (gradient ``nu`` per term pushes ``beta``
  down); the released code and Wu et al.'s experiments use ``nu = 0`` (default).

  Sampling: ``positive='random'`` (one uniform positive per anchor, the DESIGN default),
  ``'easy'`` = EPS + distance-weighted (EPS paper §5.2.2), ``'all'`` = the released sampler
  (every (anchor, positive) pair, each with its own negative) and the label-noise paper's 1-1
  scheme (§5.2: "for each positive pair, 1 negative pair is chosen with 1 common end point";
  with ``negative='semihard_random'``, ``beta='fixed'``, ``beta0=1.4``).
  ``negative='distance_weighted'`` draws ``Pr(n | a) ~ q(d_an)^-1`` over the anchor's negatives
  with ``d_an < nonzero_loss_cutoff``, ``d`` clipped below at ``cutoff``
  (``mining.distance_weights``);
  ``fallback`` handles anchors with no weight left (``mining.distance_weighted_negatives``:
  ``'negatives'`` uniform over the negatives [default], ``'batch'`` the released code's
  uniform over the whole batch, ``'drop'``). ``nonzero_loss_cutoff=2`` (the sphere's
  diameter) switches the zero-weight cut-off off: Wu et al.'s sampler (and our default 1.4)
  gives weight 0 to negatives at ``d >= 1.4``, whose hinge is closed at initialisation; Roth et
  al.'s code, which the EPS paper ran, has that line commented out. The other negative modes
  mine on ``-d``;
  ``'semihard_random'`` is then the label-noise paper's random semi-hard (eq. 28) with the
  margin ``alpha`` in distance units, ``{n : d_ap - d_an + alpha > 0}``, and
  ``'semihard_band'`` Roth et al.'s band ``d_ap < d_an < d_ap + alpha`` (random negative when
  empty).

  ``beta``: ``'class'`` (default; Wu et al. / released code: one ``beta`` per class, params
  ``{'beta': float32 [num_classes]}``, every entry ``beta0``), ``'global'`` (one shared
  ``beta``, ``[1]``) or ``'fixed'`` (the constant ``beta0``, no params; the label-noise paper's
  marginal loss, there with ``beta0 = 1.4``). The learnable ``beta`` gets gradients
  ``dL/dbeta_c = (sum_{terms of class c} (-[pos > 0] + [neg > 0]) + nu #terms_c) / count``;
  the trainer gives it ``optimizer.objective_learning_rate`` (the released code: SGD with
  momentum 0.9 and learning rate 0.1, on a loss averaged over the batch). Labels must lie in
  ``[0, num_classes)``: checked when ``apply`` sees concrete labels; under ``jit`` an anchor
  with an out-of-range label gives a NaN loss instead of a silently clamped ``beta``.

  ``aux`` adds ``'mean_beta'`` (mean of the ``beta`` vector); ``active_fraction`` counts terms
  with either hinge open.

  Args:
    positive: ``'random'`` (default), ``'easy'`` (EPS), ``'hard'``, ``'all'`` (released code).
    negative: ``'distance_weighted'`` (default), ``'semihard'``, ``'semihard_random'``,
      ``'semihard_band'``, ``'hard'``, ``'easy'``, ``'random'``.
    alpha: the margin ``>= 0``, default 0.2.
    beta: ``'class'`` (default), ``'global'`` or ``'fixed'``.
    beta0: initial (or fixed) ``beta > 0``, default 1.2.
    nu: ``>= 0``, default 0 (must be 0 with ``beta='fixed'``).
    similarity: ``'cosine'`` (default) or ``'neg_sq_euclidean'`` (not with distance weighting).
    cutoff: distance-weighted lower clip of ``d``, default 0.5.
    nonzero_loss_cutoff: distance-weighted zero-weight distance, default 1.4 (= ``beta0 +
      alpha``, the distance beyond which a negative's hinge is closed at initialisation; Wu et
      al.); 2 = no cut-off (Roth et al.'s code, used by the EPS paper).
    fallback: ``'negatives'`` (default), ``'batch'`` (released code) or ``'drop'``.
    reduction: ``'nonzero'`` (default, released code) or ``'mean'``.

  Returns:
    ``(init, apply)``; use ``make('margin', ...)``.
  """
  _choice("positive", positive, mining.POSITIVE_MODES)
  _choice("negative", negative, MARGIN_NEGATIVE_MODES)
  alpha = _number("alpha", alpha, positive=False)
  _choice("beta", beta, MARGIN_BETA_MODES)
  beta0 = _number("beta0", beta0, positive=True)
  nu = _number("nu", nu, positive=False)
  if beta == "fixed" and nu:
    raise ValueError(f"nu={nu!r} regularises a learnable beta; with beta='fixed' use nu=0.")
  _choice("similarity", similarity, TRIPLET_SIMILARITIES)
  _choice("fallback", fallback, mining.DW_FALLBACKS)
  mining.check_distance_weighted(dim=1, cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff,
                                 fallback=fallback)
  _choice("reduction", reduction, MARGIN_REDUCTIONS)
  if negative == "distance_weighted" and similarity != "cosine":
    raise ValueError("negative='distance_weighted' weights distances on the unit sphere; it "
                     f"needs similarity='cosine', got {similarity!r}.")

  def init(rng, *, num_classes: int, dim: int) -> dict:
    """``{'beta': float32 [num_classes]}`` (``'class'``), ``[1]`` (``'global'``), ``{}``."""
    del rng
    num_classes = _int_at_least("num_classes", num_classes, minimum=1)
    _int_at_least("dim", dim, minimum=1)
    if beta == "fixed":
      return {}
    return {"beta": jnp.full((num_classes if beta == "class" else 1,), beta0, jnp.float32)}

  def beta_per_anchor(params, labels):
    """float32 ``[B]`` ``beta`` of each anchor (NaN for an out-of-range label) and the vector."""
    if beta == "fixed":
      return jnp.full(labels.shape, beta0, jnp.float32), jnp.full((1,), beta0, jnp.float32)
    table = _param(params, "beta", name="margin").astype(jnp.float32)
    want = "[num_classes]" if beta == "class" else "[1]"
    if table.ndim != 1 or (beta == "global" and table.shape != (1,)):
      raise ValueError(f"params['beta'] must have shape {want} for beta={beta!r}, "
                       f"got {table.shape}.")
    if beta == "global":
      return jnp.broadcast_to(table[0], labels.shape), table
    ok = _check_label_range(labels, table.shape[0], what="class betas")
    return jnp.where(ok, table[jnp.clip(labels, 0, table.shape[0] - 1)], jnp.nan), table

  def apply(params, embeddings, labels, *, rng=None):
    embeddings, labels = _check_batch(embeddings, labels)
    key = _check_rng(rng, name="margin", positive=positive, negative=negative)
    beta_a, table = beta_per_anchor(params, labels)                   # [B]
    s = sim.pairwise_similarity(embeddings, kind=similarity)          # float32 [B, B]
    d2 = sim.squared_distance(s, kind=similarity)
    d = losses.euclidean_distance(d2)
    score = -d2 if negative == "distance_weighted" else -d
    pos_mask, neg_mask = sim.label_masks(labels)
    sel = mining.select(jax.lax.stop_gradient(score), pos_mask, neg_mask, positive=positive,
                        negative=negative, margin=alpha, key=key, dim=embeddings.shape[1],
                        cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff,
                        fallback=fallback)
    valid = sel.valid
    d_an = _negative_of_term(d, sel, positive=positive)
    pos, neg = losses.margin(d, d_an, beta_a[:, None], alpha=alpha)   # [B, B] each
    total = jnp.sum(jnp.where(valid, pos + neg + nu * beta_a[:, None], 0.0))
    if reduction == "nonzero":
      open_hinges = (pos > 0).astype(jnp.float32) + (neg > 0).astype(jnp.float32)
      count = jnp.sum(jnp.where(valid, jax.lax.stop_gradient(open_hinges), 0.0))
    else:
      count = 2.0 * jnp.sum(valid, dtype=jnp.float32)
    loss = total / jnp.maximum(count, 1.0)
    s_an = _negative_of_term(s, sel, positive=positive)
    aux = _aux(valid, (pos > 0) | (neg > 0), s, s_an)
    aux["mean_beta"] = jnp.mean(jax.lax.stop_gradient(table))
    return loss, aux

  return init, apply


def proxy_nca(*, temperature: float = 1.0, denominator: str = "negatives"):
  """Proxy-NCA (Movshovitz-Attias et al. 2017): one learnable proxy per class, no mining.

  ``init(rng, num_classes=C, dim=D)`` returns ``{'proxies': float32 [C, D]}``: rows drawn from
  a standard normal and L2-normalised (``C >= 2``). ``apply`` L2-normalises the embeddings
  ``x`` and the proxies ``p`` (cosine similarity), so ``d^2(x, p) = 2 - 2 cos(x, p)``, and
  averages over the anchors (``losses.proxy_nca``)

  ``L_a = d^2(x_a, p_y) / T + log sum_{z != y} exp(-d^2(x_a, p_z) / T)``

  (``denominator='negatives'``, the paper's NCA form, which excludes the true proxy and can be
  negative), or with the sum over all ``C`` proxies (``'all'``: softmax cross-entropy on
  ``-d^2 / T``, as most re-implementations). ``temperature=1`` is the paper's formula; a
  smaller ``T`` is the usual "scale" (e.g. ``T = 1/9`` = embeddings and proxies scaled to norm
  3). Gradients reach both the embeddings and the proxies.

  Labels must lie in ``[0, C)``: the shapes cannot show it, so ``apply`` raises ``ValueError``
  when it sees concrete labels and, under ``jit``, an anchor with an out-of-range label makes
  the loss NaN (never a wrong proxy). ``rng`` is unused. ``aux``: every anchor is valid;
  ``active_fraction`` = anchors whose true-proxy softmax probability (over all proxies, ``T``)
  is below ``1 - 1e-3``; ``mean_s_ap`` / ``mean_s_an`` = cosine to the true proxy / the mean
  cosine to the other proxies.

  Args:
    temperature: ``T > 0``, default 1.
    denominator: ``'negatives'`` (default, the paper) or ``'all'``.

  Returns:
    ``(init, apply)``; use ``make('proxy_nca', ...)``.
  """
  temperature = _number("temperature", temperature, positive=True)
  _choice("denominator", denominator, losses.PROXY_DENOMINATORS)

  def init(rng, *, num_classes: int, dim: int) -> dict:
    """``{'proxies': float32 [num_classes, dim]}``, unit-norm Gaussian rows."""
    num_classes = _int_at_least("num_classes", num_classes, minimum=2)
    dim = _int_at_least("dim", dim, minimum=1)
    proxies = jax.random.normal(rng, (num_classes, dim), jnp.float32)
    return {"proxies": sim.l2_normalize(proxies)}

  def apply(params, embeddings, labels, *, rng=None):
    del rng
    embeddings, labels = _check_batch(embeddings, labels)
    proxies = _param(params, "proxies", name="proxy_nca")
    if proxies.ndim != 2 or proxies.shape[1] != embeddings.shape[1] or proxies.shape[0] < 2:
      raise ValueError(f"params['proxies'] must have shape [C >= 2, {embeddings.shape[1]}], "
                       f"got {proxies.shape}.")
    num = proxies.shape[0]
    ok = _check_label_range(labels, num, what="proxies")
    s = sim.pairwise_similarity(embeddings, proxies, kind="cosine")   # float32 [B, C]
    d2 = sim.squared_distance(s, kind="cosine")
    true = labels[:, None] == jnp.arange(num)[None, :]                # [B, C]
    terms = losses.proxy_nca(d2, true, temperature=temperature, denominator=denominator)
    loss = jnp.mean(jnp.where(ok, terms, jnp.nan))
    p_true = jnp.sum(jnp.where(true, jax.nn.softmax(-d2 / temperature, axis=1), 0.0), axis=1)
    s_ap = jnp.sum(jnp.where(true, s, 0.0), axis=1)
    s_an = _row_mean(s, ~true)
    col = lambda x: x[:, None]
    return loss, _aux(col(ok), col(1.0 - p_true > PROXY_ACTIVE_WEIGHT), col(s_ap), col(s_an))

  return init, apply


def trimmed_triplet(*, positive: str = "random", negative: str = "semihard",
                    margin: float = 0.2, similarity: str = "cosine",
                    negative_reduction: str = "mean", keep_fraction: float = 0.9,
                    distance: str = "squared"):
  """Trimmed triplet loss: back-propagate only the easiest terms (a label-noise baseline).

  The triplet objective (:func:`triplet`, same selections and arguments) where only the
  ``k = ceil(keep_fraction * n_valid)`` valid terms with the *lowest* current loss enter the
  mean (``mining.keep_easiest``, under stop-gradient; ties by index): the trimmed loss of
  Shen & Sanghavi (2019) as tested in the EPS paper (App. C, Fig. 6, on randomly sampled
  positives), which drops the terms most likely to come from noisy labels. ``keep_fraction=1``
  is the triplet loss. ``L = sum_{kept} l_t / k``.

  ``aux``: ``valid_fraction`` counts anchors with a valid term before trimming;
  ``active_fraction``, ``mean_s_ap``, ``mean_s_an`` are over the kept terms; ``kept_fraction``
  is ``k / n_valid`` (0 when nothing is valid).

  Args:
    positive: ``'random'`` (default), ``'easy'``, ``'hard'``, ``'all'``.
    negative: ``'semihard'`` (default) or any other triplet mode.
    margin: ``>= 0``, default 0.2 (squared-distance units).
    similarity: ``'cosine'`` (default) or ``'neg_sq_euclidean'``.
    negative_reduction: ``negative='all'`` only, ``'mean'`` (default) or ``'sum'``.
    keep_fraction: in ``(0, 1]``, default 0.9 (our choice: the EPS paper sweeps the trimming
      percentage and reports no single value).
    distance: ``'squared'`` (default) or ``'euclidean'`` (as :func:`triplet`).

  Returns:
    ``(init, apply)``; use ``make('trimmed_triplet', ...)``.
  """
  margin = _check_triplet_hparams(positive=positive, negative=negative, margin=margin,
                                  similarity=similarity, negative_reduction=negative_reduction,
                                  distance=distance)
  ok = isinstance(keep_fraction, numbers.Real) and not isinstance(keep_fraction, bool)
  if not ok or not 0 < keep_fraction <= 1:
    raise ValueError(f"keep_fraction must be a number in (0, 1], got {keep_fraction!r}.")
  keep_fraction = float(keep_fraction)

  def apply(params, embeddings, labels, *, rng=None):
    del params
    embeddings, labels = _check_batch(embeddings, labels)
    key = _check_rng(rng, name="trimmed_triplet", positive=positive, negative=negative)
    terms, valid, s, s_an = _triplet_terms(
        embeddings, labels, key, positive=positive, negative=negative, margin=margin,
        similarity=similarity, negative_reduction=negative_reduction, distance=distance)
    if positive == "all":
      kept = mining.keep_easiest(terms, valid, keep_fraction=keep_fraction)
    else:
      # At most one valid term per row: rank the B row terms (same order: row-major flat
      # index = row index) instead of all B^2 entries.
      row_terms = jnp.sum(jnp.where(valid, terms, 0.0), axis=1)           # [B]
      row_kept = mining.keep_easiest(row_terms, jnp.any(valid, axis=1),
                                     keep_fraction=keep_fraction)
      kept = valid & row_kept[:, None]
    loss = losses.masked_mean(terms, kept)
    aux = _aux(kept, terms > 0, s, s_an)
    aux["valid_fraction"] = jnp.mean(jnp.any(valid, axis=1).astype(jnp.float32))
    aux["kept_fraction"] = (jnp.sum(kept, dtype=jnp.float32)
                            / jnp.maximum(jnp.sum(valid, dtype=jnp.float32), 1.0))
    return loss, aux

  return _no_params, apply


# ------------------------------------------------------------------------------------------
# --- Pair-based objectives: contrastive, multi-similarity, lifted structure, binomial, DRO ---
#
# Terms are the ordered pairs (i, j), i != j, of the batch (self pairs are never positives or
# negatives). Their ``aux``: 'valid_fraction' = fraction of anchors with at least one pair
# entering the loss; 'active_fraction' = fraction of the entering pairs whose own gradient weight
# |dl/dS_ij| exceeds 1e-3 (of the pair loss, or of the anchor's term for multi_similarity and
# lifted_structure; before any DRO weight); 'mean_s_ap' / 'mean_s_an' = mean S over the entering
# positive / negative pairs (0 when there is none).

PAIR_ACTIVE_WEIGHT = 1e-3              # a pair is active when |dl/dS| exceeds this
PAIR_REDUCTIONS = ("mean", "balanced")
MS_DUPLICATE_SIMILARITY = 1.0 - 1e-5   # released MS code keeps positives with S < 1 - 1e-5
DRO_PAIR_LOSSES = ("margin", "binomial")
DRO_KL_MODES = ("weight", "sample")


def _real(name: str, value) -> float:
  if (isinstance(value, bool) or not isinstance(value, numbers.Real)
      or not -float("inf") < value < float("inf")):
    raise ValueError(f"{name} must be a finite number, got {value!r}.")
  return float(value)


def _count(name: str, value, *, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
  return int(value)


def _pair_batch(embeddings, labels, similarity: str):
  """``(s, sg, pos, neg)``: float32 ``S [B, B]``, its stop-gradient and the label masks."""
  embeddings, labels = _check_batch(embeddings, labels)
  s = sim.pairwise_similarity(embeddings, kind=similarity)
  pos, neg = sim.label_masks(labels)
  return s, jax.lax.stop_gradient(s), pos, neg


def _pair_aux(entering: jax.Array, term_fn: Callable, sg: jax.Array, pos: jax.Array,
              neg: jax.Array) -> dict:
  """The diagnostics of a pair objective (section comment); ``term_fn(S)`` -> its terms."""
  weight = jax.grad(lambda x: jnp.sum(term_fn(x)))(sg)          # dl/dS_ij per pair
  aux = _aux(entering, jnp.abs(weight) > PAIR_ACTIVE_WEIGHT, sg, sg)
  aux["mean_s_ap"] = losses.masked_mean(sg, entering & pos)
  aux["mean_s_an"] = losses.masked_mean(sg, entering & neg)
  return aux


def _clamp_k(k: int, available: int, *, name: str, what: str = "k") -> int:
  """``min(k, available)``, with a warning (at trace time) when ``k`` is clamped."""
  if k > available:
    warnings.warn(f"objective {name!r}: {what}={k} exceeds the {available} ordered pairs of "
                  f"the batch; using {what}={available}.", stacklevel=3)
    return available
  return k


def _pairwise_apply(pair_fn: Callable, *, reduction: str, similarity: str) -> Callable:
  """``apply`` of an objective averaging an elementwise pair loss over all pairs."""

  def apply(params, embeddings, labels, *, rng=None):
    del params, rng
    s, sg, pos, neg = _pair_batch(embeddings, labels, similarity)
    pairs = pos | neg
    values = pair_fn(s, pos)                                           # [B, B]
    if reduction == "mean":
      loss = losses.masked_mean(values, pairs)
    else:
      loss = losses.masked_mean(values, pos) + losses.masked_mean(values, neg)
    return loss, _pair_aux(pairs, lambda x: pair_fn(x, pos), sg, pos, neg)

  return apply


def contrastive(*, pos_margin: float = 1.0, neg_margin: float = 0.5, reduction: str = "mean",
                similarity: str = "cosine"):
  """Contrastive loss over all ordered pairs (Hadsell, Chopra & LeCun, CVPR 2006).

  ``l_ij = [pos_margin - S_ij]_+`` for positive pairs, ``[S_ij - neg_margin]_+`` for negative
  ones (``losses.contrastive``). Defaults: on the unit sphere (``d^2 = 2 - 2S``)
  ``pos_margin = 1`` gives ``[1 - S]_+ = d^2 / 2``, Hadsell et al.'s positive term ``D^2 / 2``
  (positives are pulled together until they coincide), and ``neg_margin = 0.5`` gives
  ``[1 - d^2]_+ / 2``, their hinge on negatives with margin distance 1 (60 degrees), at the
  cosine 0.5 that is also the threshold ``lambda`` of the MS, binomial and DRO losses here.

  Reduction over the pairs ``(i, j)``, ``i != j``: ``'mean'`` (default, Hadsell et al.'s
  average over all pairs) or ``'balanced'`` (mean over positive pairs + mean over negative
  pairs, the 1/n+ and 1/n- weights of Yi et al. 2014, against the pair imbalance). A batch with
  no pair (``B = 1``) gives 0.

  Args:
    pos_margin: default 1.0 (similarity units).
    neg_margin: default 0.5.
    reduction: ``'mean'`` (default) or ``'balanced'``.
    similarity: ``'cosine'`` (default), ``'dot'`` or ``'neg_sq_euclidean'`` (margins are in the
      units of ``S``).

  Returns:
    ``(init, apply)``; use ``make('contrastive', ...)``.
  """
  pos_margin = _real("pos_margin", pos_margin)
  neg_margin = _real("neg_margin", neg_margin)
  _choice("reduction", reduction, PAIR_REDUCTIONS)
  _choice("similarity", similarity, sim.KINDS)
  pair_fn = lambda s, pos: losses.contrastive(s, pos, pos_margin=pos_margin,
                                              neg_margin=neg_margin)
  return _no_params, _pairwise_apply(pair_fn, reduction=reduction, similarity=similarity)


def binomial(*, alpha: float = 40.0, beta: float = 2.0, base: float = 0.5,
             reduction: str = "balanced", similarity: str = "cosine"):
  """Binomial deviance loss over all ordered pairs (Yi, Lei & Li 2014; DRO paper §4).

  The DRO released scripts' form (DESIGN §4, ``losses.binomial``): positives
  ``(2/beta) log(1 + e^{-beta (S - lambda)})``, negatives ``(2/alpha) log(1 + e^{alpha (S -
  lambda)})`` with ``alpha = 40``, ``beta = 2``, ``lambda = base = 0.5``. (Yi et al. write one
  scale and a cost ``C`` on negatives; the two scales here play those roles.) Note ``beta``
  scales the positives and ``alpha`` the negatives, the opposite of ``multi_similarity``.

  Reduction: ``'balanced'`` (default; Yi et al.'s pair weights 1/n+ for positive and 1/n- for
  negative pairs: mean over positive pairs + mean over negative pairs) or ``'mean'`` (all pairs
  alike, the DRO paper's ``F_avg``).

  Args:
    alpha: negative scale ``> 0``, default 40.
    beta: positive scale ``> 0``, default 2.
    base: ``lambda``, default 0.5.
    reduction: ``'balanced'`` (default) or ``'mean'``.
    similarity: default ``'cosine'``.

  Returns:
    ``(init, apply)``; use ``make('binomial', ...)``.
  """
  alpha = _number("alpha", alpha, positive=True)
  beta = _number("beta", beta, positive=True)
  base = _real("base", base)
  _choice("reduction", reduction, PAIR_REDUCTIONS)
  _choice("similarity", similarity, sim.KINDS)
  pair_fn = lambda s, pos: losses.binomial(s, pos, alpha=alpha, beta=beta, base=base)
  return _no_params, _pairwise_apply(pair_fn, reduction=reduction, similarity=similarity)


def multi_similarity(*, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5,
                     epsilon: float = 0.1, positive: str = "ms", negative: str = "ms",
                     negative_reference: str = "hardest", skip_duplicate_positives: bool = False,
                     similarity: str = "cosine"):
  """Multi-similarity loss with MS mining (Wang et al. 2019; DRO paper eq. 2), official code.

  Per anchor ``a`` with mined sets ``P'_a``, ``N'_a`` (``mining.multi_similarity_pairs``):
  ``L_a = (1/alpha) log(1 + sum_{P'_a} e^{-alpha (S_ap - lambda)})
  + (1/beta) log(1 + sum_{N'_a} e^{beta (S_an - lambda)})``; ``L = sum_a L_a / B`` over all
  ``B`` anchors (released code), where an anchor with an empty ``P'_a`` or ``N'_a`` contributes
  0. Mining (official code): positives exclude self; keep negatives with
  ``S_an + epsilon > min_{P_a} S_ap`` and positives with ``S_ap - epsilon < max_{N_a} S_an``.

  Variants (``positive``, ``negative``): MS = (``'ms'``, ``'ms'``) [default]; no mining =
  (``'all'``, ``'all'``), eq. 2 over every pair, the loss whose gradient DRO-KL grouped with
  pseudo pairs recovers (DRO paper eqs. 25-27); EPS + MS = (``'easy'``, ``'ms'``) (EPS paper
  §5.2.2: "we replace the positive hard-mining method with EPS and use the same hard-negative
  method": the single easiest positive replaces MS positive mining).

  ``negative_reference`` says which ``S_ap`` the MS negative rule compares with:
  ``'hardest'`` (default) ``min_{P_a} S_ap`` over all positives, the MS rule unchanged, as the
  paper's "same hard-negative method" and Roth et al.'s code (computed from all positives
  before the positive filter) read; ``'selected'`` the minimum over the positives the loss
  sees, i.e. with EPS the easy positive's own ``S_ap`` (keeps only ``S_an + epsilon >
  S_a,easy``: fewer, harder negatives; this library's rule before issue 18). They differ only
  with ``positive='easy'``.

  Defaults: ``alpha = 2``, ``beta = 50``, ``lambda = base = 0.5``, ``epsilon = 0.1`` (MS paper;
  the official repository's configs use ``beta = 40``, the EPS paper ``lambda = 1``).

  Args:
    alpha: positive scale ``> 0``, default 2.
    beta: negative scale ``> 0``, default 50.
    base: ``lambda``, default 0.5.
    epsilon: mining margin ``>= 0``, default 0.1.
    positive: ``'ms'`` (default), ``'all'`` or ``'easy'``.
    negative: ``'ms'`` (default) or ``'all'``.
    negative_reference: ``'hardest'`` (default) or ``'selected'``.
    skip_duplicate_positives: released MS code selects positives by ``S < 1 - 1e-5``, which also
      drops duplicates of the anchor; True reproduces that (cosine only). Default False: only the
      anchor itself is excluded (by index).
    similarity: default ``'cosine'``.

  Returns:
    ``(init, apply)``; use ``make('multi_similarity', ...)``.
  """
  alpha = _number("alpha", alpha, positive=True)
  beta = _number("beta", beta, positive=True)
  base = _real("base", base)
  epsilon = _number("epsilon", epsilon, positive=False)
  _choice("positive", positive, mining.MS_POSITIVE_MODES)
  _choice("negative", negative, mining.MS_NEGATIVE_MODES)
  _choice("negative_reference", negative_reference, mining.MS_NEGATIVE_REFERENCES)
  _flag("skip_duplicate_positives", skip_duplicate_positives)
  _choice("similarity", similarity, sim.KINDS)
  if skip_duplicate_positives and similarity != "cosine":
    raise ValueError("skip_duplicate_positives is a threshold on the cosine similarity; it needs "
                     f"similarity='cosine', got {similarity!r}.")

  def apply(params, embeddings, labels, *, rng=None):
    del params, rng
    s, sg, pos, neg = _pair_batch(embeddings, labels, similarity)
    if skip_duplicate_positives:
      pos = pos & (sg < MS_DUPLICATE_SIMILARITY)
    pk, nk = mining.multi_similarity_pairs(sg, pos, neg, epsilon=epsilon, positive=positive,
                                           negative=negative,
                                           negative_reference=negative_reference)
    valid = (jnp.any(pk, axis=1) & jnp.any(nk, axis=1))[:, None]
    pk, nk = pk & valid, nk & valid
    term_fn = lambda x: losses.multi_similarity(x, pk, nk, alpha=alpha, beta=beta, base=base)
    loss = jnp.sum(term_fn(s)) / s.shape[0]
    return loss, _pair_aux(pk | nk, term_fn, sg, pos, neg)

  return _no_params, apply


def lifted_structure(*, base: float = 0.5, margin: float = 0.0, similarity: str = "cosine"):
  """Generalised lifted structure loss (DRO paper eq. 3; Wang et al. 2019).

  ``L_a = [log sum_{P_a} e^{lambda - S_ap} + log sum_{N_a} e^{S_an - lambda} + margin]_+``
  (``losses.lifted_structure``) over all positives and negatives (no mining);
  ``L = sum_a L_a / B`` over all ``B`` anchors (eq. 3 is a sum; we divide by ``B`` as
  ``multi_similarity`` does, so the scale does not grow with the batch). An anchor without a
  positive or a negative contributes 0.

  ``lambda = base`` cancels between the two logs: it is kept for fidelity to eq. 3 and does not
  change the loss. ``margin`` (default 0 = eq. 3) shifts the hinge, as in the generalised lifted
  structure of Hermans et al. (2017). Gradient while the hinge is open (eq. 6):
  ``dL_a/dS_ap = -softmax_{P_a}(-S)``, ``dL_a/dS_an = softmax_{N_a}(S)`` — what
  ``dro_kl_grouped`` with ``gamma_pos = gamma_neg = 1`` recovers (eqs. 19-22).

  Args:
    base: ``lambda``, default 0.5 (no effect, see above).
    margin: default 0.0.
    similarity: default ``'cosine'``.

  Returns:
    ``(init, apply)``; use ``make('lifted_structure', ...)``.
  """
  base = _real("base", base)
  margin = _real("margin", margin)
  _choice("similarity", similarity, sim.KINDS)

  def apply(params, embeddings, labels, *, rng=None):
    del params, rng
    s, sg, pos, neg = _pair_batch(embeddings, labels, similarity)
    valid = (jnp.any(pos, axis=1) & jnp.any(neg, axis=1))[:, None]
    p, n = pos & valid, neg & valid
    term_fn = lambda x: losses.lifted_structure(x, p, n, base=base, margin=margin)
    loss = jnp.sum(term_fn(s)) / s.shape[0]
    return loss, _pair_aux(p | n, term_fn, sg, pos, neg)

  return _no_params, apply


def _dro_pair_fn(*, pair_loss: str, margin: float, base: float, alpha: float,
                 beta: float) -> Callable:
  """Validates the DRO pair-loss hyper-parameters; returns ``pair_fn(S, pos) -> [B, B]``."""
  _choice("pair_loss", pair_loss, DRO_PAIR_LOSSES)
  margin = _number("margin", margin, positive=False)
  base = _real("base", base)
  alpha = _number("alpha", alpha, positive=True)
  beta = _number("beta", beta, positive=True)
  if pair_loss == "margin":
    return lambda s, pos: losses.dro_margin(s, pos, margin=margin, base=base)
  return lambda s, pos: losses.binomial(s, pos, alpha=alpha, beta=beta, base=base)


def dro_topk(*, k: int = 160, pair_loss: str = "margin", margin: float = 0.2, base: float = 0.5,
             alpha: float = 40.0, beta: float = 2.0, similarity: str = "cosine"):
  """DRO-TopK (DRO paper §3.2): the mean of the ``K`` largest pair losses of the batch.

  ``F = (1/K) sum_{top-K (i, j)} l_ij`` over all ordered pairs ``(i, j)``, ``i != j``, positive
  and negative together (global over the batch, released code); the selection is made under
  stop-gradient (``mining.topk_pairs``, ties by the lower flat index). ``K`` larger than the
  ``B (B - 1)`` pairs of the batch is clamped to ``B (B - 1)`` with a ``warnings.warn`` when
  ``apply`` is traced. Default ``K = 160``: the paper's ``K = 2B`` at its batch size ``B = 80``
  (§4.2.2; tuned in {160, ..., 280} on CUB / Cars).

  Pair losses (``pair_loss``; DESIGN §4, DRO released scripts): ``'margin'`` (default)
  ``l_ij = [m + y_ij (lambda - S_ij)]_+``, i.e. positives ``[m + lambda - S]_+`` and negatives
  ``[m + S - lambda]_+`` with ``m = margin = 0.2``, ``lambda = base = 0.5``; ``'binomial'``
  positives ``(2/beta) log(1 + e^{-beta (S - lambda)})``, negatives
  ``(2/alpha) log(1 + e^{alpha (S - lambda)})`` with ``alpha = 40``, ``beta = 2``. ``margin``
  is used only by ``'margin'``, ``alpha`` / ``beta`` only by ``'binomial'``.

  Args:
    k: ``K``, an int ``>= 1``, default 160.
    pair_loss: ``'margin'`` (default) or ``'binomial'``.
    margin: ``m >= 0``, default 0.2.
    base: ``lambda``, default 0.5.
    alpha: binomial negative scale, default 40.
    beta: binomial positive scale, default 2.
    similarity: default ``'cosine'``.

  Returns:
    ``(init, apply)``; use ``make('dro_topk', ...)``.
  """
  k = _count("k", k, minimum=1)
  pair_fn = _dro_pair_fn(pair_loss=pair_loss, margin=margin, base=base, alpha=alpha, beta=beta)
  _choice("similarity", similarity, sim.KINDS)

  def apply(params, embeddings, labels, *, rng=None):
    del params, rng
    s, sg, pos, neg = _pair_batch(embeddings, labels, similarity)
    b = s.shape[0]
    values = pair_fn(s, pos)
    k_eff = _clamp_k(k, b * (b - 1), name="dro_topk")
    sel = mining.topk_pairs(values, pos | neg, k=k_eff)
    loss = jnp.sum(jnp.where(sel, values, 0.0)) / max(k_eff, 1)
    return loss, _pair_aux(sel, lambda x: pair_fn(x, pos), sg, pos, neg)

  return _no_params, apply


def dro_topk_pn(*, k: int = 160, pair_loss: str = "margin", margin: float = 0.2,
                base: float = 0.5, alpha: float = 40.0, beta: float = 2.0,
                similarity: str = "cosine"):
  """DRO-TopK-PN (DRO paper §3.2): the top ``K/2`` positive and top ``K/2`` negative pairs.

  Selects (under stop-gradient) the ``floor(K/2)`` positive pairs and the ``K - floor(K/2)``
  negative pairs of largest loss and returns the mean loss of the selected pairs (the paper's
  "averaged gradient of the pairwise losses of the selected pairs"). The constraints are
  ``<= K/2``: with fewer positive (negative) pairs in the batch, all of them are taken and the
  mean is over what was selected. A per-group count above the ``B (B - 1)`` pairs of the batch
  is clamped with a ``warnings.warn`` at trace time. Default ``K = 160`` as ``dro_topk``.

  Pair losses (``pair_loss``, ``margin``, ``base``, ``alpha``, ``beta``) as :func:`dro_topk`.

  Args:
    k: ``K``, an int ``>= 2``, default 160.
    pair_loss: ``'margin'`` (default) or ``'binomial'``.
    margin: ``m >= 0``, default 0.2.
    base: ``lambda``, default 0.5.
    alpha: binomial negative scale, default 40.
    beta: binomial positive scale, default 2.
    similarity: default ``'cosine'``.

  Returns:
    ``(init, apply)``; use ``make('dro_topk_pn', ...)``.
  """
  k = _count("k", k, minimum=2)
  pair_fn = _dro_pair_fn(pair_loss=pair_loss, margin=margin, base=base, alpha=alpha, beta=beta)
  _choice("similarity", similarity, sim.KINDS)

  def apply(params, embeddings, labels, *, rng=None):
    del params, rng
    s, sg, pos, neg = _pair_batch(embeddings, labels, similarity)
    b = s.shape[0]
    values = pair_fn(s, pos)
    k_pos = _clamp_k(k // 2, b * (b - 1), name="dro_topk_pn", what="k//2")
    k_neg = _clamp_k(k - k // 2, b * (b - 1), name="dro_topk_pn", what="k - k//2")
    sel = mining.topk_pairs(values, pos, k=k_pos) | mining.topk_pairs(values, neg, k=k_neg)
    loss = losses.masked_mean(values, sel)
    return loss, _pair_aux(sel, lambda x: pair_fn(x, pos), sg, pos, neg)

  return _no_params, apply


def dro_kl(*, gamma: float = 0.1, mode: str = "sample", k: int = 160,
           remove_zero_loss: bool = True, pair_loss: str = "margin", margin: float = 0.2,
           base: float = 0.5, alpha: float = 40.0, beta: float = 2.0,
           similarity: str = "cosine"):
  """DRO-KL (DRO paper §3.2): pairs weighted or sampled by ``p* ~ exp(l / gamma)``.

  ``p*`` maximises ``sum_ij p_ij l_ij - gamma KL(p || uniform)`` over the candidate pairs:
  ``p*_ij = e^{l_ij/gamma} / sum_kl e^{l_kl/gamma}``, computed under stop-gradient
  (``mining.kl_weights``). Candidates: all ordered pairs ``(i, j)``, ``i != j``; with
  ``remove_zero_loss`` (default True, §3.2: "zero losses do not contribute to the subgradient
  ... we can simply eliminate those") pairs with ``l_ij = 0`` are removed before ``p*`` is
  computed.

  * ``mode='weight'``: ``L = sum_ij p*_ij l_ij`` (exact gradient of the robust loss, Lemma 1);
  * ``mode='sample'`` (default, the paper's p-sampling, DRO-KL_M of Table 1): ``k`` pairs drawn
    i.i.d. with replacement from ``p*`` (``mining.kl_sample_pairs``; needs ``rng``),
    ``L = (1/k) sum_draws l``; its expectation is the ``'weight'`` loss. The paper does not
    state the number of draws; the default ``k = 160`` is the top-K default. ``k`` is unused
    by ``'weight'``; ``k`` above the number of pairs is allowed (draws with replacement).

  No candidate pair (e.g. every loss 0 with ``remove_zero_loss``, or ``B = 1``) gives 0.
  Default ``gamma = 0.1`` (§4.2.4; tuned in {0.1, 0.3, ..., 0.9}).

  Pair losses (``pair_loss``, ``margin``, ``base``, ``alpha``, ``beta``) as :func:`dro_topk`.

  Args:
    gamma: ``> 0``, default 0.1.
    mode: ``'sample'`` (default) or ``'weight'``.
    k: number of sampled pairs, an int ``>= 1``, default 160.
    remove_zero_loss: default True.
    pair_loss: ``'margin'`` (default) or ``'binomial'``.
    margin: ``m >= 0``, default 0.2.
    base: ``lambda``, default 0.5.
    alpha: binomial negative scale, default 40.
    beta: binomial positive scale, default 2.
    similarity: default ``'cosine'``.

  Returns:
    ``(init, apply)``; use ``make('dro_kl', ...)``.
  """
  gamma = _number("gamma", gamma, positive=True)
  _choice("mode", mode, DRO_KL_MODES)
  k = _count("k", k, minimum=1)
  _flag("remove_zero_loss", remove_zero_loss)
  pair_fn = _dro_pair_fn(pair_loss=pair_loss, margin=margin, base=base, alpha=alpha, beta=beta)
  _choice("similarity", similarity, sim.KINDS)

  def apply(params, embeddings, labels, *, rng=None):
    del params
    if mode == "sample" and rng is None:
      raise ValueError("objective 'dro_kl' with mode='sample' draws random pairs; pass "
                       "rng=<PRNG key> to apply (or use mode='weight').")
    s, sg, pos, neg = _pair_batch(embeddings, labels, similarity)
    values = pair_fn(s, pos)
    cand = pos | neg
    if remove_zero_loss:
      cand = cand & (jax.lax.stop_gradient(values) > 0)
    if mode == "weight":
      p = mining.kl_weights(values, cand, gamma=gamma)
      loss = jnp.sum(p * values)
      entering = cand
    else:
      counts = mining.kl_sample_pairs(rng, values, cand, gamma=gamma, num=k)
      loss = jnp.sum(counts.astype(jnp.float32) * values) / k
      entering = counts > 0
    return loss, _pair_aux(entering, lambda x: pair_fn(x, pos), sg, pos, neg)

  return _no_params, apply


def dro_kl_grouped(*, gamma_pos: float = 0.01, gamma_neg: float = 0.01,
                   pseudo_pairs: bool = False, c_pos: float | None = None,
                   c_neg: float | None = None, remove_zero_loss: bool = True,
                   pair_loss: str = "margin", margin: float = 0.2, base: float = 0.5,
                   alpha: float = 40.0, beta: float = 2.0, similarity: str = "cosine"):
  """DRO-KL grouped per anchor (DRO paper eq. 7; DRO-KL-G of Tables 2 and 4).

  Every anchor ``a`` has a positive group ``P_a`` and a negative group ``N_a``, each with its own
  KL-regularised distribution (eq. 7, closed form eq. 19):
  ``p+_aj = e^{l_aj/gamma_pos} / (c_a^+ + sum_{k in P_a} e^{l_ak/gamma_pos})`` and likewise
  ``p-`` with ``gamma_neg`` over ``N_a`` (``mining.kl_grouped_weights``, under stop-gradient);
  ``L = (1/B) sum_a (sum_{P_a} p+ l + sum_{N_a} p- l)`` (eq. 20 divided by ``B``, as the MS
  loss). Anchors without a positive or without a negative contribute 0.

  ``c_a = 0`` without pseudo pairs. With ``pseudo_pairs=True`` each group gets one extra pair of
  constant loss ``l0`` (eq. 23), ``c_a = e^{l0/gamma}``: ``l0 = 0`` by default (the paper's
  zero-loss pseudo pairs), or the pair loss of a phantom positive at similarity ``c_pos`` /
  phantom negative at ``c_neg`` when those are given (``[m + lambda - c_pos]_+`` and
  ``[m + c_neg - lambda]_+`` for ``'margin'``, so ``c_pos = lambda + m``, ``c_neg = lambda - m``
  are exactly the zero-loss pairs). The pseudo pair only changes ``p*``; its loss is constant.

  Identities (while every pair loss is ``> 0``, e.g. ``margin`` large, and
  ``remove_zero_loss`` irrelevant): with ``'margin'``, ``gamma_pos = gamma_neg = 1`` and no
  pseudo pairs the gradient is the lifted-structure gradient (eqs. 5-6, 19-22; objective
  ``lifted_structure`` while its hinge is open); with pseudo pairs at ``c_pos``, ``c_neg``,
  ``gamma_pos = 1/alpha``, ``gamma_neg = 1/beta`` it is the gradient of the multi-similarity
  loss *without mining* (``multi_similarity(positive='all', negative='all')``) whose positive
  term uses ``lambda = c_pos`` and negative term ``lambda = c_neg`` (eqs. 25-27). The paper's
  zero-loss pseudo pairs give ``c_pos = lambda + m``, ``c_neg = lambda - m``; the usual
  single-``lambda`` MS needs ``c_pos = c_neg = lambda_MS`` (pseudo losses then non-zero).

  Defaults: ``gamma_pos = gamma_neg = 0.01`` (best R@1 of Table 2 on CUB and of Table 4 on
  In-Shop), ``remove_zero_loss=True`` (§4.2.1: "we remove the pairs with zero loss"), margin
  pair loss with ``m = 0.2``, ``lambda = 0.5`` (§4.2.1).

  Pair losses (``pair_loss``, ``margin``, ``base``, ``alpha``, ``beta``) as :func:`dro_topk`.

  Args:
    gamma_pos: ``> 0``, default 0.01.
    gamma_neg: ``> 0``, default 0.01.
    pseudo_pairs: add one pseudo pair per group, default False.
    c_pos: ``None`` (default: zero-loss pseudo positive) or the phantom positive's similarity;
      needs ``pseudo_pairs=True``.
    c_neg: likewise for the pseudo negative.
    remove_zero_loss: drop pairs with ``l = 0`` from the groups, default True.
    pair_loss: ``'margin'`` (default) or ``'binomial'``.
    margin: ``m >= 0``, default 0.2.
    base: ``lambda``, default 0.5.
    alpha: binomial negative scale, default 40.
    beta: binomial positive scale, default 2.
    similarity: default ``'cosine'``.

  Returns:
    ``(init, apply)``; use ``make('dro_kl_grouped', ...)``.
  """
  gamma_pos = _number("gamma_pos", gamma_pos, positive=True)
  gamma_neg = _number("gamma_neg", gamma_neg, positive=True)
  _flag("pseudo_pairs", pseudo_pairs)
  if not pseudo_pairs and (c_pos is not None or c_neg is not None):
    raise ValueError("c_pos and c_neg set the pseudo pairs; they need pseudo_pairs=True, got "
                     f"c_pos={c_pos!r}, c_neg={c_neg!r}.")
  c_pos = None if c_pos is None else _real("c_pos", c_pos)
  c_neg = None if c_neg is None else _real("c_neg", c_neg)
  _flag("remove_zero_loss", remove_zero_loss)
  pair_fn = _dro_pair_fn(pair_loss=pair_loss, margin=margin, base=base, alpha=alpha, beta=beta)
  _choice("similarity", similarity, sim.KINDS)

  def pseudo_loss(c, positive):
    if not pseudo_pairs:
      return None
    if c is None:
      return 0.0
    return pair_fn(jnp.full((1, 1), c, jnp.float32), jnp.full((1, 1), positive))[0, 0]

  def apply(params, embeddings, labels, *, rng=None):
    del params, rng
    s, sg, pos, neg = _pair_batch(embeddings, labels, similarity)
    values = pair_fn(s, pos)
    valid = (jnp.any(pos, axis=1) & jnp.any(neg, axis=1))[:, None]
    keep = (jax.lax.stop_gradient(values) > 0) if remove_zero_loss else True
    gp, gn = pos & valid & keep, neg & valid & keep
    w = (mining.kl_grouped_weights(values, gp, gamma=gamma_pos,
                                   pseudo_loss=pseudo_loss(c_pos, True))
         + mining.kl_grouped_weights(values, gn, gamma=gamma_neg,
                                     pseudo_loss=pseudo_loss(c_neg, False)))
    loss = jnp.sum(w * values) / s.shape[0]
    return loss, _pair_aux(gp | gn, lambda x: pair_fn(x, pos), sg, pos, neg)

  return _no_params, apply


REGISTRY: dict[str, Callable[..., tuple[Callable, Callable]]] = {
    "nca": nca,
    "nca_2nd": nca_2nd,
    "triplet": triplet,
    "margin": margin,
    "proxy_nca": proxy_nca,
    "trimmed_triplet": trimmed_triplet,
    "contrastive": contrastive,
    "multi_similarity": multi_similarity,
    "lifted_structure": lifted_structure,
    "binomial": binomial,
    "dro_topk": dro_topk,
    "dro_topk_pn": dro_topk_pn,
    "dro_kl": dro_kl,
    "dro_kl_grouped": dro_kl_grouped,
}


def register(name: str, builder: Callable | None = None):
  """Adds a user's objective to the registry, as ``register(name, builder)`` or as a decorator
  ``@register(name)`` over the builder.

  The builder follows the built-in ones: its keyword-only arguments (with defaults) are the
  hyper-parameters (``--config.loss.<arg>``), it validates them and returns ``(init, apply)``
  with ``init(rng, *, num_classes, dim) -> params`` and
  ``apply(params, embeddings [B, D], labels [B], *, rng=None) -> (loss, aux)``.
  ``train.py --module=M`` / ``config.user_modules`` import the module that registers it, so
  ``eval.py`` and the analysis tools find it too.

  Raises:
    ValueError: ``name`` is taken by another builder, or the builder has a positional or
      default-less parameter.
  """
  def add(fn: Callable) -> Callable:
    old = REGISTRY.get(name)
    same = old is None or (old.__module__, old.__qualname__) == (fn.__module__, fn.__qualname__)
    if not same:  # a module imported twice re-registers the same builder: fine
      raise ValueError(f"Objective {name!r} is already registered ({REGISTRY[name]!r}); "
                       "choose another name.")
    for p in inspect.signature(fn).parameters.values():
      if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty:
        raise ValueError(f"Objective builder {fn.__name__} for {name!r}: parameter {p.name!r} "
                         "must be keyword-only with a default (hyper-parameters are "
                         "config keys).")
    REGISTRY[name] = fn
    return fn

  return add if builder is None else add(builder)


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
