"""Pair selections of the pair-based objectives: multi-similarity mining, DRO top-K /
top-K-PN, DRO-KL weights (global and per anchor) and samples.


Pair-based objectives treat every ordered pair ``(i, j)``, ``i != j``, of the batch as a term
(``pos_mask | neg_mask`` of ``similarity.label_masks``). The selections below read a score or
a pair-loss matrix ``[B, N]`` under stop-gradient and return fixed-shape ``[B, N]`` masks,
weights or counts; the objectives multiply them with the differentiable pair losses, so the
gradient flows only through the selected similarities. Multi-similarity: Wang et al., "Multi-
similarity loss with general pair weighting", CVPR 2019 (released code: MalongTech/research-
ms-loss). DRO: "A simple and effective framework for pairwise deep metric learning" (the DRO
paper), §3.2 and eq. 7.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax.mining import _common
from dml_jax.mining.triplets import positive_pairs

MS_POSITIVE_MODES = ("ms", "all", "easy")
MS_NEGATIVE_MODES = ("ms", "all")
MS_NEGATIVE_REFERENCES = ("hardest", "selected")


def multi_similarity_pairs(s: jax.Array, pos_mask: jax.Array, neg_mask: jax.Array, *,
                           epsilon: float = 0.1, positive: str = "ms",
                           negative: str = "ms",
                           negative_reference: str = "hardest") -> tuple[jax.Array, jax.Array]:
  """Multi-similarity pair mining (Wang et al. 2019 §3.3, released code), or EPS positives.

  First the positive set ``P'_a`` the loss sees before MS filtering: ``P_a`` for
  ``positive='ms'`` / ``'all'``; ``{argmax_{p in P_a} s_ap}`` for ``positive='easy'`` (EPS
  paper §5.2.2: EPS replaces MS positive mining by the single easiest positive). Then:

  * ``negative='ms'``: keep ``n in N_a`` with ``s_an + epsilon > ref_a``, where ``ref_a`` is
    ``min_{p in P_a} s_ap``, the hardest positive of all (``negative_reference='hardest'``,
    default: the MS rule unchanged, the EPS paper's "same hard-negative method" and Roth et
    al.'s code, which computes the negative rule from all positives), or
    ``min_{p in P'_a} s_ap`` (``'selected'``: with ``positive='easy'`` the easy positive's own
    ``s_ap``, the MS rule applied to the tuple ``(a, p_a)`` that EPS trains on; it keeps fewer,
    harder negatives). The two coincide unless ``positive='easy'``. ``negative='all'``: keep
    ``N_a``.
  * ``positive='ms'``: keep ``p in P_a`` with ``s_ap - epsilon < max_{n in N_a} s_an``
    (the max over *all* negatives, as in the released code); ``'all'``: ``P_a``; ``'easy'``:
    the easy positive, unfiltered.

  Inequalities are strict, as in the released code. Under ``negative='ms'`` an anchor without
  positives keeps no negative (``min`` of an empty set is ``+inf``), and under
  ``positive='ms'`` one without negatives keeps no positive; the ``'all'`` and ``'easy'`` modes
  keep their sets regardless. The objective drops anchors whose kept positive or negative set
  is empty.

  Args:
    s: float ``[B, N]`` similarities (stop-gradient is applied).
    pos_mask: bool ``[B, N]`` positives (self excluded).
    neg_mask: bool ``[B, N]`` negatives.
    epsilon: the mining margin ``>= 0``, default 0.1 (MS paper).
    positive: one of ``MS_POSITIVE_MODES``, default ``'ms'``.
    negative: one of ``MS_NEGATIVE_MODES``, default ``'ms'``.
    negative_reference: one of ``MS_NEGATIVE_REFERENCES``, default ``'hardest'``.

  Returns:
    ``(pos_kept, neg_kept)``: bool ``[B, N]`` each.
  """
  hparams.mode("multi-similarity positive mode", positive, MS_POSITIVE_MODES)
  hparams.mode("multi-similarity negative mode", negative, MS_NEGATIVE_MODES)
  hparams.mode("multi-similarity negative_reference", negative_reference,
               MS_NEGATIVE_REFERENCES)
  hparams.number("epsilon", epsilon, positive=False)
  s = _common.check_inputs(s, pos_mask, "pos_mask")
  _common.check_inputs(s, neg_mask, "neg_mask")
  cand = positive_pairs(s, pos_mask, mode="easy") if positive == "easy" else pos_mask
  if negative == "ms":
    ref_set = cand if negative_reference == "selected" else pos_mask
    ref = jnp.min(jnp.where(ref_set, s, jnp.inf), axis=1, keepdims=True)
    neg_kept = neg_mask & (s + epsilon > ref)
  else:
    neg_kept = neg_mask
  if positive == "ms":
    hardest_neg = jnp.max(jnp.where(neg_mask, s, -jnp.inf), axis=1, keepdims=True)
    pos_kept = pos_mask & (s - epsilon < hardest_neg)
  else:
    pos_kept = cand
  return pos_kept, neg_kept


def topk_pairs(values: jax.Array, mask: jax.Array, *, k: int,
               count: jax.Array | int | None = None) -> jax.Array:
  """The ``k`` masked entries of largest value, over the whole matrix (DRO-TopK, §3.2).

  ``jax.lax.top_k`` over the flattened ``where(mask, values, -inf)``; ties are broken by the
  lower flat (row-major) index. Fewer than ``k`` masked entries: all of them are selected.

  Args:
    values: float ``[B, N]``, e.g. pair losses (stop-gradient is applied).
    mask: bool ``[B, N]`` candidate pairs.
    k: static int, ``0 <= k <= B N`` (the objectives clamp ``k`` with a warning first).
    count: optional int scalar (may be traced), at most ``k``: only the ``count`` largest of
      the ``k`` are selected (a data-dependent number under one static shape).

  Returns:
    bool ``[B, N]``, at most ``k`` (``count``) entries True, a subset of ``mask``.
  """
  if not hparams.is_integer(k) or not 0 <= k <= values.size:
    raise ValueError(f"k must be an int in [0, {values.size}] (the number of entries), "
                     f"got {k!r}.")
  v = _common.check_inputs(values, mask, "mask")
  if k == 0:
    return jnp.zeros(v.shape, bool)
  _, idx = jax.lax.top_k(jnp.where(mask, v, -jnp.inf).ravel(), k)
  keep = True if count is None else jnp.arange(k) < count
  picked = jnp.zeros(v.size, bool).at[idx].set(keep).reshape(v.shape)
  return picked & mask


def kl_weights(losses: jax.Array, mask: jax.Array, *, gamma: float) -> jax.Array:
  """The optimal DRO-KL distribution over the masked pairs (DRO paper §3.2, DRO-KL).

  ``p*_ij = exp(l_ij / gamma) / sum_{(k, l) in mask} exp(l_kl / gamma)``, the maximiser of
  ``sum p l - gamma KL(p || uniform)`` over the simplex; computed under stop-gradient with the
  maximum subtracted. 0 outside ``mask``; all 0 when ``mask`` is empty.

  Args:
    losses: float ``[B, N]`` pair losses (stop-gradient is applied).
    mask: bool ``[B, N]`` candidate pairs.
    gamma: ``> 0``, the KL regularisation weight.

  Returns:
    float32 ``[B, N]`` weights summing to 1 (0 if no candidate).
  """
  hparams.number("gamma", gamma, positive=True)
  z = _common.check_inputs(losses, mask, "mask") / gamma
  m = jnp.max(jnp.where(mask, z, -jnp.inf))
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  e = jnp.where(mask, jnp.exp(jnp.where(mask, z, m) - m), 0.0)
  total = jnp.sum(e)
  return e / jnp.where(total > 0, total, 1.0)


def kl_grouped_weights(losses: jax.Array, mask: jax.Array, *, gamma: float,
                       pseudo_loss: float | jax.Array | None = None) -> jax.Array:
  """Per-anchor DRO-KL weights of one group (DRO paper eq. 7; eq. 23 with a pseudo pair).

  For each row ``a`` (anchor) and its group ``G_a = {j : mask[a, j]}`` (its positives or its
  negatives): ``p*_aj = exp(l_aj / gamma) / (c_a + sum_{k in G_a} exp(l_ak / gamma))`` with
  ``c_a = 0`` without a pseudo pair and ``c_a = exp(pseudo_loss / gamma)`` with one (the pseudo
  pair of eq. 23, whose own weight ``1 - sum_j p*_aj`` multiplies a constant loss and is not
  returned). Computed under stop-gradient, stabilised by the row maximum. An empty group gives
  zero weights.

  Args:
    losses: float ``[B, N]`` pair losses (stop-gradient is applied).
    mask: bool ``[B, N]`` the group of each anchor.
    gamma: ``> 0`` (``gamma_i^+`` or ``gamma_i^-`` of eq. 7, shared by all anchors).
    pseudo_loss: ``None`` (no pseudo pair) or the pseudo pair's loss, a float or ``[B]``.

  Returns:
    float32 ``[B, N]`` weights; each non-empty row sums to 1 without a pseudo pair, < 1 with.
  """
  hparams.number("gamma", gamma, positive=True)
  z = _common.check_inputs(losses, mask, "mask") / gamma
  m = jnp.max(jnp.where(mask, z, -jnp.inf), axis=1, keepdims=True)
  if pseudo_loss is not None:
    z0 = jnp.broadcast_to(jnp.asarray(pseudo_loss, jnp.float32) / gamma, (z.shape[0],))[:, None]
    m = jnp.maximum(m, z0)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  e = jnp.where(mask, jnp.exp(jnp.where(mask, z, m) - m), 0.0)
  total = jnp.sum(e, axis=1, keepdims=True)
  if pseudo_loss is not None:
    total = total + jnp.exp(z0 - m)
  return e / jnp.where(total > 0, total, 1.0)


def kl_sample_pairs(key: jax.Array, losses: jax.Array, mask: jax.Array, *, gamma: float,
                    num: int) -> jax.Array:
  """``num`` pairs drawn i.i.d. (with replacement) from the DRO-KL distribution ``p*``.

  The DRO paper's p-sampling (§3.2): instead of weighting every pair by ``p*``
  (:func:`kl_weights`), sample pairs from ``p*`` and average their gradients. Inverse CDF over
  the weights in two stages, a row from the row totals and then an entry of that row
  (``O(B N + num log(B N))`` time, ``O(B N + num)`` memory): one float32 CDF over all ``B N``
  pairs would round away the lighter pairs of large batches. ``E[counts] = num p*``.

  Args:
    key: PRNG key.
    losses: float ``[B, N]`` pair losses (stop-gradient is applied).
    mask: bool ``[B, N]`` candidate pairs.
    gamma: ``> 0``.
    num: static int ``>= 1``, the number of draws.

  Returns:
    int32 ``[B, N]`` draw counts (summing to ``num``; all 0 when ``mask`` is empty).
  """
  hparams.integer("num", num, minimum=1)
  p = kl_weights(losses, mask, gamma=gamma)
  idx = _common.inverse_cdf_matrix(key, p, num)
  counts = jnp.zeros(p.size, jnp.int32).at[idx].add(1).reshape(p.shape)
  return jnp.where(mask, counts, 0)
