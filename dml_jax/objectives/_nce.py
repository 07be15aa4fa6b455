"""Softmax-over-pairs objectives: ``ntxent`` (Chen et al. 2020) and ``supcon`` (Khosla et al.
2020), with labels deciding the positives (every other example of the anchor's class).

Both work on ``S [B, N]`` (cosine, the batch or a reference set such as cross-batch memory) at a
temperature ``T``; their ``aux`` is that of the pair objectives (``_pairs`` docstring). They
equal pytorch-metric-learning 2.9's ``NTXentLoss`` and ``SupConLoss`` (default reducers) in value
and gradient (``tests/objectives/test_pml_reference.py``), except where PML's float32 rounding
decides: its ``SupConLoss`` reducer (``AvgNonZeroReducer``) also leaves out the anchors whose
loss rounds to exactly 0 (one positive far ahead of every negative at a small ``T``), so its
mean is then larger than ours; its ``NTXentLoss`` caps each term at ``-log(1.2e-38) = 87.3``
(ours is not capped), a value cosines reach only at ``T`` below about 0.03.
"""

from __future__ import annotations

import jax.numpy as jnp

from dml_jax import hparams
from dml_jax import losses
from dml_jax.objectives import _common
from dml_jax.objectives._registry import register


@register("ntxent", references=True)
def ntxent(*, temperature: float = 0.07, similarity: str = "cosine"):
  """NT-Xent / InfoNCE with labels (SimCLR, Chen et al. 2020): one term per positive pair.

  ``l_ap = -log( e^{S_ap/T} / (e^{S_ap/T} + sum_{n in N_a} e^{S_an/T}) )`` for every positive
  pair ``(a, p)`` (the other positives of ``a`` are not in the denominator), averaged over all
  positive pairs. A pair whose anchor has no negative gives 0 (and still counts in the mean, as
  in PML). With two views per class it is SimCLR's loss. Default ``T = 0.07`` (PML's; SimCLR
  tunes it per batch size).

  Args:
    temperature: ``T > 0``, default 0.07.
    similarity: ``'cosine'`` (default), ``'dot'`` or ``'neg_sq_euclidean'``.

  Returns:
    ``(init, apply)``; use ``make('ntxent', ...)``.
  """
  temperature = hparams.number("temperature", temperature, positive=True)

  def terms(s, pos, neg):
    z = s / temperature
    neg_lse, _ = losses.masked_logsumexp(z, neg, axis=1)                 # [B], -1e30 if none
    return jnp.where(pos, jnp.logaddexp(z, neg_lse[:, None]) - z, 0.0)   # [B, N]

  def pair_terms(b):
    return _common.PairTerms(lambda x: terms(x, b.pos, b.neg),
                             b.pos | (b.neg & jnp.any(b.pos, axis=1, keepdims=True)),
                             b.pos, "mean")

  return _common.pair_objective(pair_terms, name="ntxent", similarity=similarity)


@register("supcon", references=True)
def supcon(*, temperature: float = 0.1, similarity: str = "cosine"):
  """Supervised contrastive loss (Khosla et al. 2020, ``L^sup_out``): one term per anchor.

  ``L_a = -(1/|P_a|) sum_{p in P_a} log( e^{S_ap/T} / sum_{j in P_a u N_a} e^{S_aj/T} )``,
  averaged over the anchors with a positive and at least one other pair (an anchor whose only
  pair is one positive has ``L_a = 0``): PML's ``AvgNonZeroReducer``, which in float32 also
  drops an anchor whose ``L_a`` rounds to 0 (a single positive far more similar than every
  negative, at a small ``T``; ours keeps it in the count). A batch without a negative pair
  gives 0 (PML). Default ``T = 0.1`` (the paper's and PML's).

  Args:
    temperature: ``T > 0``, default 0.1.
    similarity: ``'cosine'`` (default), ``'dot'`` or ``'neg_sq_euclidean'``.

  Returns:
    ``(init, apply)``; use ``make('supcon', ...)``.
  """
  temperature = hparams.number("temperature", temperature, positive=True)

  def terms(b):
    pos, neg = b.pos, b.neg
    n_pos = jnp.sum(pos, axis=1)
    valid = (n_pos > 0) & (n_pos + jnp.sum(neg, axis=1) > 1) & jnp.any(neg)      # [B]

    def term_fn(x):
      z = x / temperature
      lse, _ = losses.masked_logsumexp(z, pos | neg, axis=1)
      log_prob = jnp.where(pos, z - lse[:, None], 0.0)
      return jnp.where(valid, -jnp.sum(log_prob, axis=1) / jnp.maximum(n_pos, 1), 0.0)

    return _common.PairTerms(term_fn, (pos | neg) & valid[:, None], valid, "mean")

  return _common.pair_objective(terms, name="supcon", similarity=similarity)
