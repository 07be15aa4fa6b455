"""The NCA family: EPHN-style mining with the 1st-order (``nca``) or 2nd-order (``nca_2nd``)
NCA loss.

Every term is a selected (anchor, positive) pair with its negative(s) (``mining.select``); the
loss is ``losses.reduce(..., reduction)`` over the valid terms (their mean, or their sum as
the EPHN paper's released code). A term is *active* when the
softmax weight of its negatives ``q = 1 - exp(-L)`` exceeds ``NCA_ACTIVE_WEIGHT``: ``q`` scales
the term's whole gradient (``dL/dS_ap = -q/T`` for 1st order).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax import losses
from dml_jax import mining
from dml_jax.objectives import _common
from dml_jax.objectives._registry import register

DUPLICATE_SIMILARITY = 0.9999   # released EPHN code: positives above this are duplicates
NCA_ACTIVE_WEIGHT = 1e-3        # an NCA term is active when its negative weight q exceeds this
NCA_NEGATIVE_MODES = ("hard", "semihard", "easy", "random", "all")   # no margin: no semihard_*
NCA_REDUCTIONS = ("mean", "sum")


def _nca_family(*, name: str, order: int, positive: str, negative: str, temperature: float,
                similarity: str, skip_duplicate_positives: bool,
                positive_similarity_only: bool, reduction: str):
  """``(init, apply)`` of the 1st (``order=1``) or 2nd (``order=2``) order NCA objective."""
  hparams.choice("positive", positive, mining.POSITIVE_MODES)
  if negative in mining.MARGIN_MODES:
    raise ValueError(f"negative={negative!r} needs a triplet margin, which objective "
                     f"{name!r} has not; choose one of: {', '.join(NCA_NEGATIVE_MODES)} "
                     "(or use objective 'triplet').")
  hparams.choice("negative", negative, NCA_NEGATIVE_MODES)
  temperature = hparams.number("temperature", temperature, positive=True)
  hparams.flag("skip_duplicate_positives", skip_duplicate_positives)
  hparams.flag("positive_similarity_only", positive_similarity_only)
  hparams.choice("reduction", reduction, NCA_REDUCTIONS)
  if (skip_duplicate_positives or positive_similarity_only) and similarity != "cosine":
    raise ValueError("skip_duplicate_positives and positive_similarity_only are thresholds on "
                     f"the cosine similarity; they need similarity='cosine', got {similarity!r}.")
  single = losses.nca if order == 1 else losses.nca_2nd

  def body(b):
    s, sg, pos_mask, neg_mask = b.s, b.sg, b.pos, b.neg              # float32 [B, N]
    if skip_duplicate_positives:
      pos_mask = pos_mask & (sg <= DUPLICATE_SIMILARITY)
    if positive_similarity_only and negative == "all":
      neg_mask = neg_mask & (sg > 0)
    sel = mining.select(sg, pos_mask, neg_mask, positive=positive, negative=negative, key=b.rng)
    valid = sel.valid
    if negative == "all":
      terms = losses.nca_all_negatives(s, s, sel.negatives, temperature=temperature, order=order)
      s_an = _common.row_mean(s, sel.negatives)[:, None]
    else:
      s_an = _common.negative_of_term(s, sel, positive=positive)
      terms = single(s, s_an, temperature=temperature)
      if positive_similarity_only:
        valid = valid & (jax.lax.stop_gradient(s_an) > 0)
    if positive_similarity_only:
      valid = valid & (sg > 0)
    loss = losses.reduce(terms, valid, reduction)
    active = -jnp.expm1(-terms) > NCA_ACTIVE_WEIGHT
    return loss, _common.aux(valid, active, s, s_an)

  return _common.no_params, _common.batch_objective(
      body, name=name, similarity=similarity,
      rng_reason=_common.stochastic_reason(positive=positive, negative=negative))


@register("nca", references=True, randomness=True)
def nca(*, positive: str = "easy", negative: str = "hard", temperature: float = 0.1,
        similarity: str = "cosine", skip_duplicate_positives: bool = False,
        positive_similarity_only: bool = False, reduction: str = "mean"):
  """The EPHN family, 1st-order NCA (EPHN paper §4; 2nd-order paper eq. 1).

  One negative per term: ``L = softplus((S_an - S_ap) / T)``. ``negative='all'``:
  ``L = -log(e^{S_ap/T} / (e^{S_ap/T} + sum_{n in N_a} e^{S_an/T}))`` (N-pair form, logsumexp).
  ``S`` is used directly whatever the ``similarity`` kind. The loss is the mean over valid
  terms (one term per anchor for single positives, per (anchor, positive) pair for
  ``positive='all'``), or with ``reduction='sum'`` their sum: the EPHN paper's released code
  (its learning rates are for the sum: at batch 128 the mean's gradient is 128 times smaller).

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
    positive_similarity_only: released EPHN code (its 2020 version): keep only triplets with
      ``S_ap > 0`` and ``S_an > 0``; with ``negative='all'`` negatives with ``S_an <= 0``
      leave the sum (default False; cosine only).
    reduction: ``'mean'`` (default) or ``'sum'`` over the valid terms.

  Returns:
    ``(init, apply)``; use ``make('nca', ...)``.
  """
  return _nca_family(name="nca", order=1, positive=positive, negative=negative,
                     temperature=temperature, similarity=similarity,
                     skip_duplicate_positives=skip_duplicate_positives,
                     positive_similarity_only=positive_similarity_only, reduction=reduction)


@register("nca_2nd", references=True, randomness=True)
def nca_2nd(*, positive: str = "easy", negative: str = "hard", temperature: float = 0.1,
            similarity: str = "cosine", skip_duplicate_positives: bool = False,
            positive_similarity_only: bool = False, reduction: str = "mean"):
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
    reduction: ``'mean'`` (default) or ``'sum'`` (see :func:`nca`).

  Returns:
    ``(init, apply)``; use ``make('nca_2nd', ...)``.
  """
  return _nca_family(name="nca_2nd", order=2, positive=positive, negative=negative,
                     temperature=temperature, similarity=similarity,
                     skip_duplicate_positives=skip_duplicate_positives,
                     positive_similarity_only=positive_similarity_only, reduction=reduction)
