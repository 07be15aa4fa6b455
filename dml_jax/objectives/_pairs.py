"""Pair-based objectives without DRO: ``contrastive``, ``binomial``, ``multi_similarity``,
``lifted_structure``, ``circle``, ``generalized_lifted_structure``, ``intra_pair_variance``.

Terms are the ordered pairs ``(i, j)``, ``i != j``, of the batch (self pairs are never
positives or negatives); ``multi_similarity`` and ``lifted_structure`` group them per anchor.
Their ``aux`` (shared with ``dro``, ``_common.pair_aux``): ``'valid_fraction'`` = fraction of
anchors with at least one pair entering the loss; ``'active_fraction'`` = fraction of the
entering pairs whose own gradient weight ``|dl/dS_ij|`` exceeds ``PAIR_ACTIVE_WEIGHT`` (of the
pair loss, or of the anchor's term for ``multi_similarity`` and ``lifted_structure``; before any
DRO weight); ``'mean_s_ap'`` / ``'mean_s_an'`` = mean ``S`` over the entering positive /
negative pairs (0 when there is none).
"""

from __future__ import annotations

import math

from typing import Callable

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax import losses
from dml_jax import mining
from dml_jax import similarity as sim
from dml_jax.objectives import _common
from dml_jax.objectives._registry import register

PAIR_REDUCTIONS = ("mean", "balanced")   # of losses.REDUCTIONS
MS_DUPLICATE_SIMILARITY = 1.0 - 1e-5     # released MS code keeps positives with S < 1 - 1e-5
GLS_MIN_SQ_DISTANCE = 1e-12              # d = sqrt(max(d^2, this)): finite gradient at d = 0
GLS_MAX_DISTANCE = 2.0                   # between unit vectors (up to rounding)
_GLS_E_MAX = math.exp(-GLS_MAX_DISTANCE)


def _every_pair(pair_fn: Callable, *, reduction: str) -> Callable:
  """The terms of an objective averaging an elementwise pair loss ``pair_fn(S, pos)`` over
  all pairs (``'mean'``) or over the positive and the negative pairs (``'balanced'``)."""

  def terms(b):
    pairs = b.pos | b.neg
    return _common.PairTerms(lambda x: pair_fn(x, b.pos), pairs,
                             pairs if reduction == "mean" else (b.pos, b.neg), reduction)

  return terms


@register("contrastive", references=True)
def contrastive(*, pos_margin: float = 1.0, neg_margin: float = 0.5, reduction: str = "mean",
                similarity: str = "cosine"):
  """Contrastive loss over all ordered pairs (Hadsell, Chopra & LeCun, CVPR 2006).

  ``l_ij = [pos_margin - S_ij]_+`` for positive pairs, ``[S_ij - neg_margin]_+`` for negative
  ones (``losses.contrastive``). Defaults: on the unit sphere (``d^2 = 2 - 2S``)
  ``pos_margin = 1`` gives ``[1 - S]_+ = d^2 / 2``, Hadsell et al.'s positive term ``D^2 / 2``
  (positives are pulled together until they coincide), and ``neg_margin = 0.5`` gives
  ``[1 - d^2]_+ / 2``: zero beyond their margin distance 1 (60 degrees), but linear in ``d^2``
  where their negative term is the squared hinge ``[1 - D]_+^2 / 2``; the cosine 0.5 is also
  the threshold ``lambda`` of the MS, binomial and DRO losses here.

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
  pos_margin = hparams.real("pos_margin", pos_margin)
  neg_margin = hparams.real("neg_margin", neg_margin)
  hparams.choice("reduction", reduction, PAIR_REDUCTIONS)
  pair_fn = lambda s, pos: losses.contrastive(s, pos, pos_margin=pos_margin,
                                              neg_margin=neg_margin)
  return _common.pair_objective(_every_pair(pair_fn, reduction=reduction), name="contrastive",
                                similarity=similarity)


@register("binomial", references=True)
def binomial(*, alpha: float = 40.0, beta: float = 2.0, base: float = 0.5,
             reduction: str = "balanced", similarity: str = "cosine"):
  """Binomial deviance loss over all ordered pairs (Yi, Lei & Li 2014; DRO paper §4).

  The DRO released scripts' form (``losses.binomial``): positives
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
  alpha = hparams.number("alpha", alpha, positive=True)
  beta = hparams.number("beta", beta, positive=True)
  base = hparams.real("base", base)
  hparams.choice("reduction", reduction, PAIR_REDUCTIONS)
  pair_fn = lambda s, pos: losses.binomial(s, pos, alpha=alpha, beta=beta, base=base)
  return _common.pair_objective(_every_pair(pair_fn, reduction=reduction), name="binomial",
                                similarity=similarity)


@register("multi_similarity", references=True)
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
  S_a,easy``: fewer, harder negatives; this library's earlier rule). They differ only
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
  alpha = hparams.number("alpha", alpha, positive=True)
  beta = hparams.number("beta", beta, positive=True)
  base = hparams.real("base", base)
  epsilon = hparams.number("epsilon", epsilon, positive=False)
  hparams.choice("positive", positive, mining.MS_POSITIVE_MODES)
  hparams.choice("negative", negative, mining.MS_NEGATIVE_MODES)
  hparams.choice("negative_reference", negative_reference, mining.MS_NEGATIVE_REFERENCES)
  hparams.flag("skip_duplicate_positives", skip_duplicate_positives)
  if skip_duplicate_positives and similarity != "cosine":
    raise ValueError("skip_duplicate_positives is a threshold on the cosine similarity; it needs "
                     f"similarity='cosine', got {similarity!r}.")

  def terms(b):
    pos = b.pos & (b.sg < MS_DUPLICATE_SIMILARITY) if skip_duplicate_positives else b.pos
    pk, nk = mining.multi_similarity_pairs(b.sg, pos, b.neg, epsilon=epsilon,
                                           positive=positive, negative=negative,
                                           negative_reference=negative_reference)
    valid = (jnp.any(pk, axis=1) & jnp.any(nk, axis=1))[:, None]
    pk, nk = pk & valid, nk & valid
    return _common.PairTerms(
        lambda x: losses.multi_similarity(x, pk, nk, alpha=alpha, beta=beta, base=base),
        pk | nk, valid[:, 0], "batch")

  return _common.pair_objective(terms, name="multi_similarity", similarity=similarity)


@register("lifted_structure", references=True)
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
  base = hparams.real("base", base)
  margin = hparams.real("margin", margin)

  def terms(b):
    valid = (jnp.any(b.pos, axis=1) & jnp.any(b.neg, axis=1))[:, None]
    p, n = b.pos & valid, b.neg & valid
    return _common.PairTerms(lambda x: losses.lifted_structure(x, p, n, base=base,
                                                               margin=margin),
                             p | n, valid[:, 0], "batch")

  return _common.pair_objective(terms, name="lifted_structure", similarity=similarity)


@register("circle", references=True)
def circle(*, m: float = 0.4, gamma: float = 80.0, similarity: str = "cosine"):
  """Circle loss with pair labels (Sun et al., CVPR 2020, eq. 6), per anchor.

  ``L_a = softplus( log sum_{P_a} e^{-gamma a_p (S_ap - Delta_p)}
  + log sum_{N_a} e^{gamma a_n (S_an - Delta_n)} )`` with the self-paced weights
  ``a_p = [1 + m - S_ap]_+``, ``a_n = [S_an + m]_+`` (under stop-gradient, as the paper's
  "detached" optimisation), ``Delta_p = 1 - m``, ``Delta_n = m``; averaged over the anchors
  with a positive and a negative. Defaults ``m = 0.4``, ``gamma = 80`` (the paper's
  fine-grained image retrieval setting; PML's defaults). PML's ``AvgNonZeroReducer`` also drops
  the anchors whose term rounds to 0 in float32 (``L_a`` can reach ``softplus(-2 gamma m^2)``,
  which is 0 once ``2 gamma m^2`` exceeds about 103, e.g. ``m = 0.25``, ``gamma = 1024``): there
  its mean is larger than ours.

  Args:
    m: relaxation ``m``, default 0.4.
    gamma: scale ``> 0``, default 80.
    similarity: ``'cosine'`` (default; the paper's margins assume ``S`` in ``[-1, 1]``).

  Returns:
    ``(init, apply)``; use ``make('circle', ...)``.
  """
  m = hparams.real("m", m)
  gamma = hparams.number("gamma", gamma, positive=True)

  def terms(b):
    valid = jnp.any(b.pos, axis=1) & jnp.any(b.neg, axis=1)             # [B]
    a_p, a_n = jnp.maximum(1.0 + m - b.sg, 0.0), jnp.maximum(b.sg + m, 0.0)

    def term_fn(x):
      lse_p, _ = losses.masked_logsumexp(-gamma * a_p * (x - (1.0 - m)), b.pos, axis=1)
      lse_n, _ = losses.masked_logsumexp(gamma * a_n * (x - m), b.neg, axis=1)
      return jnp.where(valid, jax.nn.softplus(jnp.where(valid, lse_p + lse_n, 0.0)), 0.0)

    return _common.PairTerms(term_fn, (b.pos | b.neg) & valid[:, None], valid, "mean")

  return _common.pair_objective(terms, name="circle", similarity=similarity)


@register("generalized_lifted_structure", references=True)
def generalized_lifted_structure(*, pos_margin: float = 0.0, neg_margin: float = 1.0):
  """Generalised lifted structure loss on Euclidean distances (Hermans, Beyer & Leibe 2017,
  eq. 5; PML's ``GeneralizedLiftedStructureLoss``), per anchor.

  ``L_a = [log sum_{P_a} e^{d_ap - pos_margin} + log sum_{N_a} e^{neg_margin - d_an}]_+`` with
  ``d`` the Euclidean distance of the L2-normalised embeddings, averaged over all ``B``
  anchors. An anchor without positives keeps its negative term alone (and vice versa), as in
  PML; one with neither gives 0. ``lifted_structure`` is the DRO paper's similarity form.
  Defaults ``pos_margin = 0``, ``neg_margin = 1`` (PML's).

  Args:
    pos_margin: default 0.
    neg_margin: default 1.

  Returns:
    ``(init, apply)``; use ``make('generalized_lifted_structure', ...)``.
  """
  pos_margin = hparams.real("pos_margin", pos_margin)
  neg_margin = hparams.real("neg_margin", neg_margin)

  def terms(b):
    pos, neg = b.pos, b.neg

    def term_fn(x):
      # d is in [0, 2] (unit vectors), so the log-sum-exps need no row maximum: shifted by
      # their bounds, e^{d - 2} = e^{-2} / e^{-d} and e^{-d} lie in [e^-2, 1] whatever the
      # margins, and one exp over [B, N] serves both.
      d = jnp.sqrt(jnp.maximum(sim.squared_distance(x, kind="cosine"), GLS_MIN_SQ_DISTANCE))
      e = jnp.exp(-d)
      has_p, has_n = jnp.any(pos, axis=1), jnp.any(neg, axis=1)
      sum_p = jnp.sum(jnp.where(pos, _GLS_E_MAX / e, 0.0), axis=1)     # sum e^{d - 2}
      sum_n = jnp.sum(jnp.where(neg, e, 0.0), axis=1)                  # sum e^{-d}
      lse_p = GLS_MAX_DISTANCE - pos_margin + jnp.log(jnp.where(has_p, sum_p, 1.0))
      lse_n = neg_margin + jnp.log(jnp.where(has_n, sum_n, 1.0))
      total = jnp.where(has_p, lse_p, 0.0) + jnp.where(has_n, lse_n, 0.0)
      return jnp.where(has_p | has_n, jax.nn.relu(total), 0.0)

    return _common.PairTerms(term_fn, pos | neg, None, "batch")

  return _common.pair_objective(terms, name="generalized_lifted_structure")


@register("intra_pair_variance", references=True)
def intra_pair_variance(*, pos_eps: float = 0.01, neg_eps: float = 0.01):
  """Intra-pair variance loss (Yu & Tao, ICCV 2019), on the cosine: the positive pairs
  kept near their mean similarity ``mu+`` and the negative pairs near theirs ``mu-``,

  ``mean_{positive pairs} [(1 - pos_eps) mu+ - S_ij]_+^2 + mean_{negative pairs}
  [S_ij - (1 + neg_eps) mu-]_+^2``,

  the means taken over the batch's pairs (or the anchors' pairs with the reference set) and
  differentiated through. The paper adds it to ``tuplet_margin``; alone it only tightens each
  similarity distribution (PML offers it alone too). Defaults ``0.01`` (PML's).

  Args:
    pos_eps: ``epsilon+ >= 0``, default 0.01.
    neg_eps: ``epsilon- >= 0``, default 0.01.

  Returns:
    ``(init, apply)``; use ``make('intra_pair_variance', ...)``.
  """
  pos_eps = hparams.number("pos_eps", pos_eps, positive=False)
  neg_eps = hparams.number("neg_eps", neg_eps, positive=False)

  def terms(b):
    pos, neg = b.pos, b.neg

    def loss_fn(x):
      mu_pos, mu_neg = losses.masked_mean(x, pos), losses.masked_mean(x, neg)
      below = jnp.square(jax.nn.relu((1.0 - pos_eps) * mu_pos - x))
      above = jnp.square(jax.nn.relu(x - (1.0 + neg_eps) * mu_neg))
      return losses.masked_mean(below, pos) + losses.masked_mean(above, neg)

    return _common.PairTerms(loss_fn, pos | neg, loss=loss_fn(b.s))

  return _common.pair_objective(terms, name="intra_pair_variance")
