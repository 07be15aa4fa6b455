"""Distance-weighted negative sampling (Wu, Manmatha, Smola, Krahenbuhl, "Sampling matters in
deep embedding learning", ICCV 2017, §4; released code: apache/mxnet
example/gluon/embedding_learning/model.py, DistanceWeightedSampling): the weights, the draws
and the checks of their options. ``triplets.select`` plugs them in as
``negative='distance_weighted'``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax.mining import _common

DW_FALLBACKS = ("negatives", "batch", "drop")
DW_NO_CUTOFF = 2.0  # nonzero_loss_cutoff = the sphere's diameter: no negative is cut off
_DW_TINY = 1e-12   # floor of 1 - d^2/4 inside the log (reached only at d = 2, without cut-off)


def check_distance_weighted(*, dim, cutoff: float, nonzero_loss_cutoff: float,
                            fallback: str) -> None:
  """Raises ``ValueError`` unless the distance-weighted options are usable.

  Args:
    dim: the embedding dimension ``D``, an int ``>= 1``.
    cutoff: lower clip of the distance, ``0 < cutoff < nonzero_loss_cutoff``.
    nonzero_loss_cutoff: negatives at ``d >= nonzero_loss_cutoff`` get weight 0, ``<= 2``;
      ``2`` (``DW_NO_CUTOFF``, the sphere's diameter) cuts nothing off.
    fallback: one of ``DW_FALLBACKS``.
  """
  if not hparams.is_integer(dim) or dim < 1:
    raise ValueError("negative='distance_weighted' needs the embedding dimension dim, an int "
                     f">= 1; got dim={dim!r}.")
  hparams.real("cutoff", cutoff, finite=False)
  hparams.real("nonzero_loss_cutoff", nonzero_loss_cutoff, finite=False)
  if not 0 < cutoff < nonzero_loss_cutoff <= 2:
    raise ValueError("distance-weighted sampling needs 0 < cutoff < nonzero_loss_cutoff <= 2 "
                     f"(distances on the unit sphere); got cutoff={cutoff!r}, "
                     f"nonzero_loss_cutoff={nonzero_loss_cutoff!r}.")
  hparams.mode("distance-weighted fallback", fallback, DW_FALLBACKS)


def distance_weights(s: jax.Array, neg_mask: jax.Array, *, dim: int, cutoff: float = 0.5,
                     nonzero_loss_cutoff: float = 1.4) -> jax.Array:
  """Unnormalised sampling weights of distance-weighted negative sampling (Wu et al. §4).

  The scores are squared-distance scores ``s = -d^2`` (what the triplet and margin objectives
  mine on; on the unit sphere ``d^2 = 2 - 2 S``). With ``D = dim``:

  * ``d = max(sqrt(-s), cutoff)`` (the cut-off avoids the huge weights of very close pairs;
    it plays the role of the paper's ``min(lambda, q(d)^-1)``, as in the released code);
  * ``log w_an = (2 - D) log d - ((D - 3) / 2) log(1 - d^2 / 4)`` = ``-log q(d)``, ``q`` the
    density of the distance between two points uniform on the sphere ``S^{D-1}`` (Wu et al. §4,
    ``q(d) ~ d^{D-2} (1 - d^2/4)^{(D-3)/2}``);
  * ``w_an = exp(log w_an - max_n' log w_an')`` (max over the anchor's admissible negatives;
    the released code subtracts the batch-wide max, which gives the same distribution) for
    ``n in N_a`` with ``d_an < nonzero_loss_cutoff``, else 0 (same class and self: 0).
    ``nonzero_loss_cutoff = 2`` (the sphere's diameter) admits every negative: Roth et al.'s
    code, which the EPS paper used, has this cut-off commented out ("cutting of values with
    high distances made the results slightly worse"). ``1 - d^2/4`` is floored at ``1e-12``
    inside the log, so an antipodal negative (``d = 2``) gets a large finite weight.

  Args:
    s: float ``[B, N]`` scores ``-d^2`` (stop-gradient is applied).
    neg_mask: bool ``[B, N]`` negatives of each anchor.
    dim: the embedding dimension ``D``.
    cutoff: lower clip of ``d``, default 0.5 (released code).
    nonzero_loss_cutoff: weight 0 from this distance on, default 1.4 (Wu et al.'s released
      code: with the margin loss, ``beta + alpha`` at initialisation); 2 = no cut-off.

  Returns:
    float32 ``[B, N]`` weights in ``[0, 1]``; each row's maximum is 1 unless the row is all 0.
  """
  check_distance_weighted(dim=dim, cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff,
                          fallback=DW_FALLBACKS[0])
  s = _common.check_inputs(s, neg_mask, "neg_mask")
  d2 = jnp.maximum(-s, 0.0)
  d = jnp.maximum(jnp.sqrt(d2), cutoff)
  log_w = ((2.0 - dim) * jnp.log(d)
           - 0.5 * (dim - 3.0) * jnp.log(jnp.maximum(1.0 - 0.25 * jnp.square(d), _DW_TINY)))
  if nonzero_loss_cutoff >= DW_NO_CUTOFF:
    admissible = neg_mask
  else:
    admissible = neg_mask & (jnp.sqrt(d2) < nonzero_loss_cutoff)
  m = jnp.max(jnp.where(admissible, log_w, -jnp.inf), axis=1, keepdims=True)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  return jnp.where(admissible, jnp.exp(jnp.where(admissible, log_w, m) - m), 0.0)



def distance_weighted_negatives(s: jax.Array, neg_mask: jax.Array, pairs: jax.Array, *,
                                dim: int, cutoff: float = 0.5,
                                nonzero_loss_cutoff: float = 1.4,
                                fallback: str = "negatives",
                                key: jax.Array | None = None):
  """One distance-weighted negative per (anchor, positive) term (Wu et al. §4).

  Each term ``(a, p)`` draws ``n`` independently with ``Pr(n | a) = w_an / sum_n' w_an'``,
  ``w`` from :func:`distance_weights` (it does not depend on ``p``). An anchor whose weights
  are all zero (every negative at ``d >= nonzero_loss_cutoff``, or no negative) uses
  ``fallback``:

  * ``'negatives'`` (default): uniform over the anchor's negatives ``N_a`` (term dropped if
    ``N_a`` is empty);
  * ``'batch'``: the released code (``np.random.choice(n, k-1)`` when the weights are not a
    distribution): uniform over all ``N`` batch items, the anchor itself and its positives
    included; such terms stay valid even without a negative;
  * ``'drop'``: the term is dropped.

  Memory ``O(B N)``: the ``[B, N]`` weights are turned into a per-anchor cumulative row once and
  every term draws from it by inverse CDF (``searchsorted``), never a ``[B, N, N]`` tensor.

  Args:
    s: float ``[B, N]`` scores ``-d^2`` (stop-gradient is applied).
    neg_mask: bool ``[B, N]`` negatives.
    pairs: bool ``[B, N]`` selected (anchor, positive) pairs.
    dim: the embedding dimension ``D``.
    cutoff: default 0.5.
    nonzero_loss_cutoff: default 1.4; 2 = no cut-off (see :func:`distance_weights`).
    fallback: ``'negatives'`` (default), ``'batch'`` or ``'drop'``.
    key: PRNG key (required).

  Returns:
    ``(idx, valid)``: int32 ``[B, N]`` negative per term and bool ``[B, N]`` validity.
  """
  check_distance_weighted(dim=dim, cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff,
                          fallback=fallback)
  if pairs.shape != s.shape:
    raise ValueError(f"pairs must have the shape of the scores {s.shape}, got {pairs.shape}.")
  idx, found = distance_weighted_draws(s, neg_mask, dim=dim, cutoff=cutoff,
                                        nonzero_loss_cutoff=nonzero_loss_cutoff,
                                        fallback=fallback, key=key, num_draws=s.shape[1])
  return idx, pairs & found[:, None]


def distance_weighted_draws(s, neg_mask, *, dim, cutoff, nonzero_loss_cutoff, fallback, key,
                             num_draws: int):
  """``num_draws`` distance-weighted negatives per anchor (see
  :func:`distance_weighted_negatives`): ``(idx int32 [B, num_draws], found bool [B])``."""
  w = distance_weights(s, neg_mask, dim=dim, cutoff=cutoff,
                       nonzero_loss_cutoff=nonzero_loss_cutoff)
  has_weight = jnp.any(w > 0, axis=1)                                     # [B]
  if fallback == "negatives":
    w = jnp.where(has_weight[:, None], w, neg_mask.astype(jnp.float32))
    found = jnp.any(w > 0, axis=1)
  elif fallback == "batch":
    w = jnp.where(has_weight[:, None], w, 1.0)
    found = jnp.ones_like(has_weight)
  else:  # drop
    found = has_weight
  return _common.inverse_cdf_rows(_common.need_key(key, "distance_weighted"), w, num_draws), found
