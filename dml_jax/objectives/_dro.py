"""DRO objectives (the DRO paper, "A simple and effective framework for pairwise deep metric
learning", §3.2 and eq. 7): ``dro_topk``, ``dro_topk_pn``, ``dro_kl``, ``dro_kl_grouped``.

A distributionally robust loss over the ordered pairs ``(i, j)``, ``i != j``, of the batch: a
pair loss (``'margin'`` or ``'binomial'``, ``_dro_pair_fn``) weighted by a distribution over the
pairs that ``mining`` computes under stop-gradient (top-K masks, KL weights or samples). Their
``aux`` is the pair objectives' (``pairs`` module docstring).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax import losses
from dml_jax import mining
from dml_jax.objectives import _common
from dml_jax.objectives._registry import register

DRO_PAIR_LOSSES = ("margin", "binomial")
DRO_KL_MODES = ("weight", "sample")


def _dro_pair_fn(*, pair_loss: str, margin: float, base: float, alpha: float,
                 beta: float) -> Callable:
  """Validates the DRO pair-loss hyper-parameters; returns ``pair_fn(S, pos) -> [B, B]``."""
  hparams.choice("pair_loss", pair_loss, DRO_PAIR_LOSSES)
  margin = hparams.number("margin", margin, positive=False)
  base = hparams.real("base", base)
  alpha = hparams.number("alpha", alpha, positive=True)
  beta = hparams.number("beta", beta, positive=True)
  if pair_loss == "margin":
    return lambda s, pos: losses.dro_margin(s, pos, margin=margin, base=base)
  return lambda s, pos: losses.binomial(s, pos, alpha=alpha, beta=beta, base=base)


@register("dro_topk", references=True)
def dro_topk(*, k: int = 160, pair_loss: str = "margin", margin: float = 0.2, base: float = 0.5,
             alpha: float = 40.0, beta: float = 2.0, similarity: str = "cosine"):
  """DRO-TopK (DRO paper §3.2): the mean of the ``K`` largest pair losses of the batch.

  ``F = (1/K) sum_{top-K (i, j)} l_ij`` over all ordered pairs ``(i, j)``, ``i != j``, positive
  and negative together (global over the batch, released code); the selection is made under
  stop-gradient (``mining.topk_pairs``, ties by the lower flat index). ``K`` larger than the
  ``B (B - 1)`` pairs of the batch is clamped to ``B (B - 1)`` with a ``warnings.warn`` when
  ``apply`` is traced. Default ``K = 160``: the paper's ``K = 2B`` at its batch size ``B = 80``
  (§4.2.2; tuned in {160, ..., 280} on CUB / Cars).

  Pair losses (``pair_loss``; the DRO released scripts): ``'margin'`` (default)
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
  k = hparams.integer("k", k, minimum=1)
  pair_fn = _dro_pair_fn(pair_loss=pair_loss, margin=margin, base=base, alpha=alpha, beta=beta)

  def terms(b):
    values = pair_fn(b.s, b.pos)
    k_eff = _common.clamp_k(k, _common.num_pairs(b.s), name="dro_topk")
    sel = mining.topk_pairs(values, b.pos | b.neg, k=k_eff)
    # the mean over the K pairs (fewer if fewer can enter)
    return _common.PairTerms(lambda x: pair_fn(x, b.pos), sel,
                             loss=losses.reduce(values, sel, "mean"))

  return _common.pair_objective(terms, name="dro_topk", similarity=similarity)


@register("dro_topk_pn", references=True)
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
    pair_loss, margin, base, alpha, beta, similarity: as :func:`dro_topk`.

  Returns:
    ``(init, apply)``; use ``make('dro_topk_pn', ...)``.
  """
  k = hparams.integer("k", k, minimum=2)
  pair_fn = _dro_pair_fn(pair_loss=pair_loss, margin=margin, base=base, alpha=alpha, beta=beta)

  def terms(b):
    values = pair_fn(b.s, b.pos)
    k_pos = _common.clamp_k(k // 2, _common.num_pairs(b.s), name="dro_topk_pn", what="k//2")
    k_neg = _common.clamp_k(k - k // 2, _common.num_pairs(b.s), name="dro_topk_pn",
                            what="k - k//2")
    sel = mining.topk_pairs(values, b.pos, k=k_pos) | mining.topk_pairs(values, b.neg, k=k_neg)
    return _common.PairTerms(lambda x: pair_fn(x, b.pos), sel,
                             loss=losses.reduce(values, sel, "mean"))

  return _common.pair_objective(terms, name="dro_topk_pn", similarity=similarity)


@register("dro_kl", references=True, randomness=True)
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
  gamma = hparams.number("gamma", gamma, positive=True)
  hparams.choice("mode", mode, DRO_KL_MODES)
  k = hparams.integer("k", k, minimum=1)
  hparams.flag("remove_zero_loss", remove_zero_loss)
  pair_fn = _dro_pair_fn(pair_loss=pair_loss, margin=margin, base=base, alpha=alpha, beta=beta)

  def terms(b):
    values = pair_fn(b.s, b.pos)
    cand = b.pos | b.neg
    if remove_zero_loss:
      cand = cand & (jax.lax.stop_gradient(values) > 0)
    if mode == "weight":
      p = mining.kl_weights(values, cand, gamma=gamma)
      loss = losses.reduce(p * values, None, "sum")              # p = 0 outside cand
      entering = cand
    else:
      counts = mining.kl_sample_pairs(b.rng, values, cand, gamma=gamma, num=k)
      entering = counts > 0
      loss = losses.reduce(counts.astype(jnp.float32) * values, None, "sum") / k
    return _common.PairTerms(lambda x: pair_fn(x, b.pos), entering, loss=loss)

  why = "with mode='sample' draws random pairs (or use mode='weight')" if mode == "sample" \
      else None
  return _common.pair_objective(terms, name="dro_kl", similarity=similarity, rng_reason=why)


@register("dro_kl_grouped", references=True)
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
  gamma_pos = hparams.number("gamma_pos", gamma_pos, positive=True)
  gamma_neg = hparams.number("gamma_neg", gamma_neg, positive=True)
  hparams.flag("pseudo_pairs", pseudo_pairs)
  if not pseudo_pairs and (c_pos is not None or c_neg is not None):
    raise ValueError("c_pos and c_neg set the pseudo pairs; they need pseudo_pairs=True, got "
                     f"c_pos={c_pos!r}, c_neg={c_neg!r}.")
  c_pos = None if c_pos is None else hparams.real("c_pos", c_pos)
  c_neg = None if c_neg is None else hparams.real("c_neg", c_neg)
  hparams.flag("remove_zero_loss", remove_zero_loss)
  pair_fn = _dro_pair_fn(pair_loss=pair_loss, margin=margin, base=base, alpha=alpha, beta=beta)

  def pseudo_loss(c, positive):
    if not pseudo_pairs:
      return None
    if c is None:
      return 0.0
    return pair_fn(jnp.full((1, 1), c, jnp.float32), jnp.full((1, 1), positive))[0, 0]

  def terms(b):
    values = pair_fn(b.s, b.pos)
    valid = (jnp.any(b.pos, axis=1) & jnp.any(b.neg, axis=1))[:, None]
    keep = (jax.lax.stop_gradient(values) > 0) if remove_zero_loss else True
    gp, gn = b.pos & valid & keep, b.neg & valid & keep
    w = (mining.kl_grouped_weights(values, gp, gamma=gamma_pos,
                                   pseudo_loss=pseudo_loss(c_pos, True))
         + mining.kl_grouped_weights(values, gn, gamma=gamma_neg,
                                     pseudo_loss=pseudo_loss(c_neg, False)))
    return _common.PairTerms(lambda x: pair_fn(x, b.pos), gp | gn,
                             loss=losses.reduce(w * values, gp | gn, "batch"))

  return _common.pair_objective(terms, name="dro_kl_grouped", similarity=similarity)
