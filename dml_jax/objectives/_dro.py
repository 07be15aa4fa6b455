"""DRO objectives (the DRO paper, "A simple and effective framework for pairwise deep metric
learning", §3.2 and eq. 7): ``dro_topk``, ``dro_topk_pn``, ``dro_kl``, ``dro_kl_grouped``.

A distributionally robust loss over the ordered pairs ``(i, j)``, ``i != j``, of the batch: a
pair loss (``'margin'`` or ``'binomial'``, ``_dro_pair_fn``) weighted by a distribution over the
pairs that ``mining`` computes under stop-gradient (top-K masks, KL weights or samples). Their
``aux`` is the pair objectives' (``pairs`` module docstring).

``k`` is the paper's ``K``, a number of distinct pairs: the paper counts pairs once (§4.2.3:
``B = 640`` in classes of 5 has ``|P| = 1280`` positive pairs) and its released code selects
``2K`` ordered pairs for it. A distinct pair ``{i, j}`` is the two ordered pairs ``(i, j)`` and
``(j, i)`` of equal loss, so the objectives select (or draw) ``2K`` ordered pairs; with a
reference set (cross-batch memory) they select ``2K`` (anchor, reference) pairs.
"""

from __future__ import annotations

import warnings
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


def _ordered(k: int, s: jax.Array, *, name: str, what: str = "k") -> int:
  """``2 k``, the ordered pairs of ``k`` distinct ones, clamped to the ordered pairs of ``S``
  with a warning (at trace time)."""
  available = _common.num_pairs(s)
  if 2 * k > available:
    warnings.warn(f"objective {name!r}: {what}={k} ({2 * k} ordered pairs) exceeds the "
                  f"{available} ordered pairs of the batch; using all {available}.",
                  stacklevel=5)
    return available
  return 2 * k


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

  ``F = (1/K) sum_{top-K {i, j}} l_ij`` over the distinct pairs ``{i, j}``, ``i != j``,
  positive and negative together (global over the batch), computed as the mean of the ``2K``
  largest losses of the ordered pairs (the released code; module docstring); the selection is
  made under stop-gradient (``mining.topk_pairs``, ties by the lower flat index). ``2K`` larger
  than the ``B (B - 1)`` ordered pairs of the batch is clamped to ``B (B - 1)`` (the mean of
  every pair) with a ``warnings.warn`` when ``apply`` is traced. Default ``K = 160``: the
  paper's ``K = 2B`` at its batch size ``B = 80`` (§4.2.2; tuned in {160, ..., 280} on CUB /
  Cars).

  Pair losses (``pair_loss``; the DRO released scripts): ``'margin'`` (default)
  ``l_ij = [m + y_ij (lambda - S_ij)]_+``, i.e. positives ``[m + lambda - S]_+`` and negatives
  ``[m + S - lambda]_+`` with ``m = margin = 0.2``, ``lambda = base = 0.5``; ``'binomial'``
  positives ``(2/beta) log(1 + e^{-beta (S - lambda)})``, negatives
  ``(2/alpha) log(1 + e^{alpha (S - lambda)})`` with ``alpha = 40``, ``beta = 2``. ``margin``
  is used only by ``'margin'``, ``alpha`` / ``beta`` only by ``'binomial'``.

  Args:
    k: ``K``, distinct pairs, an int ``>= 1``, default 160.
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
    sel = mining.topk_pairs(values, b.pos | b.neg, k=_ordered(k, b.s, name="dro_topk"))
    # the mean over the 2K ordered pairs (fewer if fewer can enter)
    return _common.PairTerms(lambda x: pair_fn(x, b.pos), sel,
                             loss=losses.reduce(values, sel, "mean"))

  return _common.pair_objective(terms, name="dro_topk", similarity=similarity)


@register("dro_topk_pn", references=True)
def dro_topk_pn(*, k: int = 160, balanced: bool = False, pair_loss: str = "margin",
                margin: float = 0.2, base: float = 0.5, alpha: float = 40.0, beta: float = 2.0,
                similarity: str = "cosine"):
  """DRO-TopK-PN (DRO paper §3.2): the top ``K/2`` positive and top ``K/2`` negative pairs.

  Selects (under stop-gradient) the ``floor(K/2)`` distinct positive pairs and the
  ``K - floor(K/2)`` distinct negative pairs of largest loss (twice as many ordered pairs, as
  :func:`dro_topk`) and returns the mean loss of the selected pairs (the paper's "averaged
  gradient of the pairwise losses of the selected pairs"). The paper's constraints are
  ``<= K/2``: with fewer positive (negative) pairs in the batch, all of them are taken and the
  mean is over what was selected. ``balanced=True`` follows the released code instead: with
  fewer positive pairs than ``floor(K/2)``, all of them and as many negative pairs are taken
  (small groups, e.g. 2 per class, or a large ``K``). A per-group count above the
  ``B (B - 1)`` ordered pairs of the batch is clamped with a ``warnings.warn`` at trace time.
  Default ``K = 160`` as ``dro_topk``.

  Pair losses (``pair_loss``, ``margin``, ``base``, ``alpha``, ``beta``) as :func:`dro_topk`.

  Args:
    k: ``K``, distinct pairs, an int ``>= 2``, default 160.
    balanced: default False (the paper's constraints); True: as many negative as positive
      pairs when the batch has fewer than ``K/2`` positive pairs (the released code).
    pair_loss, margin, base, alpha, beta, similarity: as :func:`dro_topk`.

  Returns:
    ``(init, apply)``; use ``make('dro_topk_pn', ...)``.
  """
  k = hparams.integer("k", k, minimum=2)
  hparams.flag("balanced", balanced)
  pair_fn = _dro_pair_fn(pair_loss=pair_loss, margin=margin, base=base, alpha=alpha, beta=beta)

  def terms(b):
    values = pair_fn(b.s, b.pos)
    k_pos = _ordered(k // 2, b.s, name="dro_topk_pn", what="k//2")
    k_neg = _ordered(k - k // 2, b.s, name="dro_topk_pn", what="k - k//2")
    sel_pos = mining.topk_pairs(values, b.pos, k=k_pos)
    count = None
    if balanced:   # short of positives: as many negatives as positives (released code)
      n_pos = jnp.sum(sel_pos)
      count = jnp.where(n_pos < k_pos, n_pos, k_neg)
    sel = sel_pos | mining.topk_pairs(values, b.neg, k=k_neg, count=count)
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
  * ``mode='sample'`` (default, the paper's p-sampling, DRO-KL_M of Table 1): ``2k`` ordered
    pairs drawn i.i.d. with replacement from ``p*`` (``mining.kl_sample_pairs``; needs
    ``rng``), ``L = (1/2k) sum_draws l``; its expectation is the ``'weight'`` loss. The paper
    does not state the number of draws; ``k`` counts distinct pairs as in :func:`dro_topk`
    (the released code draws ``2K`` ordered pairs) and its default ``k = 160`` is the top-K
    default. ``k`` is unused by ``'weight'``; ``2k`` above the number of pairs is allowed
    (draws with replacement).

  No candidate pair (e.g. every loss 0 with ``remove_zero_loss``, or ``B = 1``) gives 0.
  Default ``gamma = 0.1`` (§4.2.4; tuned in {0.1, 0.3, ..., 0.9}).

  Pair losses (``pair_loss``, ``margin``, ``base``, ``alpha``, ``beta``) as :func:`dro_topk`.

  Args:
    gamma: ``> 0``, default 0.1.
    mode: ``'sample'`` (default) or ``'weight'``.
    k: ``K``, distinct pairs (``2k`` ordered pairs are drawn), an int ``>= 1``, default 160.
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
      counts = mining.kl_sample_pairs(b.rng, values, cand, gamma=gamma, num=2 * k)
      entering = counts > 0
      loss = losses.reduce(counts.astype(jnp.float32) * values, None, "sum") / (2 * k)
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
