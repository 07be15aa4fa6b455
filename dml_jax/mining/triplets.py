"""Triplet selections: positives and negatives per (anchor, positive) term as one fixed-shape
:class:`Selection` (the contract of every triplet-style objective).

Modes
-----
Positives (``P_a`` = positives of anchor ``a``, self excluded):

* ``'easy'``   ``argmax_{p in P_a} s_ap`` (EPHN paper §3.4, EPS paper §4.3);
* ``'hard'``   ``argmin_{p in P_a} s_ap`` (EPHN paper §3.3);
* ``'random'`` uniform over ``P_a`` (needs a PRNG key);
* ``'all'``    every ``p in P_a``.

Negatives (``N_a`` = negatives of anchor ``a``), per term ``(a, p)``:

* ``'hard'``            ``argmax_{n in N_a} s_an`` (EPHN paper §3.1);
* ``'semihard'``        *fixed* semi-hard: ``argmax {s_an : n in N_a, s_an <= s_ap}``, the hardest
  negative that is still not closer than the positive (EPHN paper §3.1, label-noise paper
  eq. 29, whose texts are strict, ``s_an < s_ap``: ``<=`` is the released EPHN code, a
  difference on exact ties only). If there is none the term is dropped, no fallback
  (released EPHN code);
* ``'semihard_random'`` the label-noise paper's *random* semi-hard (eq. 28): uniform over the
  negatives with a positive triplet loss, ``{n in N_a : s_an > s_ap - margin}``. With
  ``s = -d^2`` this is ``d_ap^2 - d_an^2 + margin > 0``; it includes negatives closer than the
  positive. ``margin`` is in the units of ``s``. Dropped if the set is empty. Needs a key;
* ``'semihard_band'``   Roth et al.'s semi-hard miner (the code the EPS paper built on): uniform
  over the band ``{n in N_a : s_ap - margin < s_an < s_ap}``, i.e. with ``s = -d`` (unsquared
  distances, what the triplet and margin objectives pass for this mode)
  ``d_ap < d_an < d_ap + margin``; if the band is empty, uniform over all of ``N_a`` (a
  fallback, so only anchors without a positive or without any negative are dropped). Like
  ``'semihard_random'`` it differs from the fixed ``'semihard'`` in being random; unlike it,
  it excludes negatives closer than the positive and never drops a term. Needs a key;
* ``'easy'``            ``argmin_{n in N_a} s_an`` (EPHN paper §3.2);
* ``'random'``          uniform over ``N_a``, drawn independently per term (needs a key);
* ``'all'``             every ``n in N_a`` (the loss sums over them);
* ``'distance_weighted'`` Wu et al.'s distance-weighted sampling: one negative per term drawn
  with ``Pr(n) ~ q(d_an)^-1`` on ``s = -d^2`` (needs a key and the embedding ``dim``); see
  :func:`distance_weighted_negatives` (module ``distance_weighted``).

The pair-dependent modes sort each anchor's negative scores once (``O(B N log N)``) and find the
admissible rank range of every term with ``searchsorted``; a random choice is a uniform draw in
that contiguous range. Ties are broken deterministically (first index for ``argmax``/``argmin``,
stable-sort order for the range modes). With one positive per anchor (``positive`` not
``'all'``), :func:`select` instead picks each anchor's negative in one ``O(B N)`` pass over its
row (:func:`negatives_per_anchor`: the same semi-hard negative, ties included; the random modes
draw from the same uniform distribution, by index order rather than score order, so a given key
gives a different draw than the sorted path). With every positive (``positive='all'``) and
``negative='semihard'``, :func:`select` compacts each anchor's positives into ``[B, P]`` for the
smallest static ``P`` in ``(8, 16, 32, 64)`` that holds the batch's largest count (chosen at run
time, ``lax.switch``) and finds every term's negative in one fused ``O(B P N)`` pass
(:func:`semihard_negatives`: the same negatives, ties included); batches with more positives
per anchor take the sorted path.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax.mining import _common
from dml_jax.mining.distance_weighted import distance_weighted_draws
from dml_jax.mining.distance_weighted import check_distance_weighted
from dml_jax.mining.distance_weighted import distance_weighted_negatives

POSITIVE_MODES = ("easy", "hard", "random", "all")
NEGATIVE_MODES = ("hard", "semihard", "semihard_random", "semihard_band", "easy", "random",
                  "all", "distance_weighted")
STOCHASTIC_POSITIVE_MODES = ("random",)
STOCHASTIC_NEGATIVE_MODES = ("semihard_random", "semihard_band", "random", "distance_weighted")
MARGIN_MODES = ("semihard_random", "semihard_band")   # negative modes that read ``margin``


class Selection(NamedTuple):
  """A fixed-shape triplet selection (see the module docstring).

  Attributes:
    pairs: bool ``[B, N]``, selected (anchor, positive) pairs.
    valid: bool ``[B, N]``, terms with a positive and a negative (a subset of ``pairs``).
    negative: int32 ``[B, N]``, per term the index of its negative (single-negative modes).
    negatives: bool ``[B, N]``, per anchor the candidate negatives (used by ``'all'``).
  """
  pairs: jax.Array
  valid: jax.Array
  negative: jax.Array
  negatives: jax.Array


def check_positive_mode(mode: str) -> str:
  """Returns ``mode`` or raises ``ValueError`` naming the positive modes."""
  return hparams.mode("positive mode", mode, POSITIVE_MODES)


def check_negative_mode(mode: str) -> str:
  """Returns ``mode`` or raises ``ValueError`` naming the negative modes."""
  return hparams.mode("negative mode", mode, NEGATIVE_MODES)


def is_stochastic(*, positive: str, negative: str) -> bool:
  """Whether the selection ``(positive, negative)`` draws random numbers (needs a PRNG key)."""
  return positive in STOCHASTIC_POSITIVE_MODES or negative in STOCHASTIC_NEGATIVE_MODES



def positives(s: jax.Array, pos_mask: jax.Array, *, mode: str,
              key: jax.Array | None = None):
  """Selects positives per anchor.

  ``'easy'``: ``p_a = argmax_{p in P_a} s_ap``; ``'hard'``: ``argmin``; ``'random'``: uniform
  over ``P_a`` (one ``u ~ U[0, 1)`` per anchor: the ``floor(u |P_a|)``-th positive in index
  order, ``O(B N)`` with ``B`` random numbers); ``'all'``: ``P_a``.

  Args:
    s: float ``[B, N]`` scores, higher = closer (stop-gradient is applied).
    pos_mask: bool ``[B, N]``, ``pos_mask[a, p]`` = ``p`` is a positive of ``a`` (self excluded).
    mode: one of ``POSITIVE_MODES``.
    key: PRNG key, required for ``'random'``.

  Returns:
    ``'easy'``, ``'hard'``, ``'random'``: ``(idx, valid)`` with ``idx`` int32 ``[B]`` and ``valid``
    bool ``[B]`` (the anchor has a positive; ``idx`` is arbitrary where not valid).
    ``'all'``: the bool ``[B, N]`` mask of selected pairs (``pos_mask`` itself).
  """
  check_positive_mode(mode)
  s = _common.check_inputs(s, pos_mask, "pos_mask")
  if mode == "all":
    return pos_mask
  has = jnp.any(pos_mask, axis=1)
  if mode == "easy":
    idx = jnp.argmax(jnp.where(pos_mask, s, -jnp.inf), axis=1)
  elif mode == "hard":
    idx = jnp.argmin(jnp.where(pos_mask, s, jnp.inf), axis=1)
  else:
    idx, _ = _uniform_member(_common.need_key(key, mode), pos_mask)
  return idx.astype(jnp.int32), has


def pairs_from_index(idx: jax.Array, valid: jax.Array, *, num: int) -> jax.Array:
  """One-hot pair mask from per-anchor indices: ``pairs[a, j] = valid[a] and j == idx[a]``.

  Args:
    idx: int ``[B]``.
    valid: bool ``[B]``.
    num: ``N``, the number of columns.

  Returns:
    bool ``[B, N]``.
  """
  return (jnp.arange(num)[None, :] == idx[:, None]) & valid[:, None]


def positive_pairs(s: jax.Array, pos_mask: jax.Array, *, mode: str,
                   key: jax.Array | None = None) -> jax.Array:
  """The positive selection of :func:`positives` as a bool ``[B, N]`` pair mask (any mode).

  Args:
    s: float ``[B, N]`` scores.
    pos_mask: bool ``[B, N]`` positive mask.
    mode: one of ``POSITIVE_MODES``.
    key: PRNG key, required for ``'random'``.

  Returns:
    bool ``[B, N]``: ``pairs[a, p]`` = ``(a, p)`` is selected; at most one per row except for
    ``'all'``.
  """
  sel = positives(s, pos_mask, mode=mode, key=key)
  if mode == "all":
    return sel
  return pairs_from_index(*sel, num=s.shape[1])



def negatives(s: jax.Array, neg_mask: jax.Array, pairs: jax.Array, *, mode: str,
              margin: float = 0.0, key: jax.Array | None = None, dim: int | None = None,
              cutoff: float = 0.5, nonzero_loss_cutoff: float = 1.4,
              fallback: str = "negatives"):
  """Selects one negative per (anchor, positive) term, or all negatives.

  With ``N_a`` the negatives of anchor ``a`` and ``s_ap`` the score of the term's positive:

  * ``'hard'``: ``argmax_{n in N_a} s_an``;  ``'easy'``: ``argmin_{n in N_a} s_an``;
  * ``'semihard'``: ``argmax {s_an : n in N_a, s_an <= s_ap}`` (none: term dropped);
  * ``'semihard_random'``: uniform over ``{n in N_a : s_an > s_ap - margin}`` (none: dropped);
  * ``'semihard_band'``: uniform over ``{n in N_a : s_ap - margin < s_an < s_ap}``; if that is
    empty, uniform over ``N_a`` (Roth et al.);
  * ``'random'``: uniform over ``N_a``, independently per term;
  * ``'all'``: ``N_a``;
  * ``'distance_weighted'``: ``Pr(n) ~ w_an`` (Wu et al.; ``s`` must be ``-d^2``), independently
    per term: :func:`distance_weighted_negatives`.

  Computed in ``O(B N log N)`` time and ``O(B N)`` memory: each row of negative scores is sorted
  once and every term's admissible ranks are a contiguous range found by ``searchsorted``.

  Args:
    s: float ``[B, N]`` scores, higher = closer (stop-gradient is applied).
    neg_mask: bool ``[B, N]``, ``neg_mask[a, n]`` = ``n`` is a negative of ``a``.
    pairs: bool ``[B, N]`` selected (anchor, positive) pairs, e.g. from :func:`positive_pairs`.
    mode: one of ``NEGATIVE_MODES``.
    margin: ``'semihard_random'`` and ``'semihard_band'`` only: the triplet margin (the band
      width) in the units of ``s``, a number ``>= 0``.
    key: PRNG key, required for ``'semihard_random'``, ``'semihard_band'``, ``'random'``,
      ``'distance_weighted'``.
    dim, cutoff, nonzero_loss_cutoff, fallback: ``'distance_weighted'`` only (see
      :func:`distance_weighted_negatives`); ``dim`` (the embedding dimension) is required.

  Returns:
    ``'all'``: ``neg_mask`` (bool ``[B, N]``). Otherwise ``(idx, valid)``: int32 ``[B, N]`` negative
    index per term and bool ``[B, N]`` validity, ``valid = pairs & (a negative was found)``.
  """
  check_negative_mode(mode)
  if mode in MARGIN_MODES and not isinstance(margin, jax.Array):   # arrays may be traced
    margin = hparams.number("margin", margin, positive=False)
  s = _common.check_inputs(s, neg_mask, "neg_mask")
  if pairs.shape != s.shape:
    raise ValueError(f"pairs must have the shape of the scores {s.shape}, got {pairs.shape}.")
  if mode == "all":
    return neg_mask
  if mode == "distance_weighted":
    return distance_weighted_negatives(s, neg_mask, pairs, dim=dim, cutoff=cutoff,
                                       nonzero_loss_cutoff=nonzero_loss_cutoff,
                                       fallback=fallback, key=key)
  b, n = s.shape
  n_neg = jnp.sum(neg_mask, axis=1, dtype=jnp.int32)   # [B]
  if mode in ("hard", "easy"):
    if mode == "hard":
      idx = jnp.argmax(jnp.where(neg_mask, s, -jnp.inf), axis=1)
    else:
      idx = jnp.argmin(jnp.where(neg_mask, s, jnp.inf), axis=1)
    idx = jnp.broadcast_to(idx.astype(jnp.int32)[:, None], (b, n))
    return idx, pairs & (n_neg > 0)[:, None]

  # Sort each anchor's negatives ascending; non-negatives (-inf) come first, so the real
  # negatives occupy the ranks [first, N).
  keys = jnp.where(neg_mask, s, -jnp.inf)
  order = jnp.argsort(keys, axis=1).astype(jnp.int32)
  sorted_keys = jnp.take_along_axis(keys, order, axis=1)
  first = jnp.broadcast_to((n - n_neg)[:, None], (b, n))
  if mode == "semihard":
    rank = _common.search_rows(sorted_keys, s, side="right") - 1   # last rank with s_an <= s_ap
    found = rank >= first
  else:
    if mode == "semihard_random":
      lo = jnp.maximum(_common.search_rows(sorted_keys, s - margin, side="right"), first)
      count = n - lo
    elif mode == "semihard_band":
      # Ranks with s_ap - margin < s_an < s_ap; an empty band falls back to all negatives.
      lo = jnp.maximum(_common.search_rows(sorted_keys, s - margin, side="right"), first)
      count = jnp.maximum(_common.search_rows(sorted_keys, s, side="left") - lo, 0)
      lo = jnp.where(count > 0, lo, first)
      count = jnp.where(count > 0, count, n - first)
    else:  # random
      lo = first
      count = n - lo
    found = count > 0
    rank = _common.uniform_in_range(_common.need_key(key, mode), lo, count)
  rank = jnp.clip(rank, 0, n - 1)
  idx = jnp.take_along_axis(order, rank, axis=1)
  return idx, pairs & found


# --- Per-anchor negatives (one positive per anchor): O(B N), no sort ---------------------
#
# With ``positive`` in ``'easy'``, ``'hard'``, ``'random'`` every anchor has at most one term,
# so a pair-dependent negative needs only the anchor's own ``s_ap``: one masked pass over the
# row replaces the row sort + ``searchsorted`` of :func:`negatives` (``O(B N)`` instead of
# ``O(B N log N)``). :func:`select` takes this path for those positive modes.

PER_ANCHOR_NEGATIVE_MODES = ("hard", "semihard", "semihard_random", "semihard_band", "easy",
                             "random")


def _last_argmax(x: jax.Array) -> jax.Array:
  """Row-wise ``argmax`` of ``x [B, N]`` breaking ties by the *last* index; int32 ``[B]``."""
  n = x.shape[1]
  return (n - 1 - jnp.argmax(x[:, ::-1], axis=1)).astype(jnp.int32)


def _uniform_member(key: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per row of ``mask [B, N]``, a uniform draw over its True entries (inverse CDF of counts).

  ``c = |mask_a|``, ``u ~ U[0, 1)``, ``j = min(floor(u c), c - 1)``; the drawn index is the
  ``j``-th True entry in index order (first ``n`` with ``cumsum(mask_a)_n > j``). Returns
  ``(idx int32 [B], found bool [B])``; ``idx`` is arbitrary where the row is empty.
  """
  count = jnp.sum(mask, axis=1, dtype=jnp.int32)
  j = _common.uniform_in_range(key, jnp.zeros_like(count), count)            # [B] in [0, count)
  csum = jnp.cumsum(mask, axis=1, dtype=jnp.int32)                     # [B, N]
  idx = jnp.argmax(csum > j[:, None], axis=1).astype(jnp.int32)
  return idx, count > 0


def negatives_per_anchor(s: jax.Array, neg_mask: jax.Array, pos_idx: jax.Array, *, mode: str,
                         margin: float = 0.0, key: jax.Array | None = None):
  """One negative per anchor for its single positive ``p_a = pos_idx[a]`` (``O(B N)``, no sort).

  The selections of :func:`negatives` for a selection with one positive per anchor, with
  ``s_ap = s[a, p_a]`` and ``N_a`` the anchor's negatives:

  * ``'hard'`` / ``'easy'``: ``argmax`` / ``argmin_{n in N_a} s_an`` (first index on ties);
  * ``'semihard'``: ``argmax {s_an : n in N_a, s_an <= s_ap}``, ties by the *last* index —
    exactly the negative of the sorted path (the last stable-sort rank with ``s_an <= s_ap``);
  * ``'semihard_random'``: uniform over ``{n in N_a : s_an > s_ap - margin}``;
  * ``'semihard_band'``: uniform over ``{n in N_a : s_ap - margin < s_an < s_ap}``, or over
    ``N_a`` when that band is empty;
  * ``'random'``: uniform over ``N_a``.

  The random modes draw one ``u ~ U[0, 1)`` per anchor and take the ``floor(u c)``-th admissible
  negative in index order (``c`` admissible negatives): the same uniform distribution over the
  same set as the sorted path, but not the same draw for a given key (the sorted path indexes
  the admissible set in score order, with a ``u`` per ``[B, N]`` entry).

  Args:
    s: float ``[B, N]`` scores, higher = closer (stop-gradient is applied).
    neg_mask: bool ``[B, N]`` negatives.
    pos_idx: int ``[B]`` each anchor's positive (arbitrary where the anchor has none: its term
      is invalid anyway).
    mode: one of ``PER_ANCHOR_NEGATIVE_MODES``.
    margin: ``'semihard_random'`` and ``'semihard_band'`` only, in the units of ``s``, ``>= 0``.
    key: PRNG key, required for ``'semihard_random'``, ``'semihard_band'`` and ``'random'``.

  Returns:
    ``(idx, found)``: int32 ``[B]`` negative per anchor, bool ``[B]`` whether one was found.
  """
  hparams.mode("per-anchor negative mode", mode, PER_ANCHOR_NEGATIVE_MODES)
  if mode in MARGIN_MODES and not isinstance(margin, jax.Array):   # arrays may be traced
    margin = hparams.number("margin", margin, positive=False)
  s = _common.check_inputs(s, neg_mask, "neg_mask")
  if pos_idx.shape != s.shape[:1]:
    raise ValueError(f"pos_idx must have shape [{s.shape[0]}], got {pos_idx.shape}.")
  if mode == "hard":
    return (jnp.argmax(jnp.where(neg_mask, s, -jnp.inf), axis=1).astype(jnp.int32),
            jnp.any(neg_mask, axis=1))
  if mode == "easy":
    return (jnp.argmin(jnp.where(neg_mask, s, jnp.inf), axis=1).astype(jnp.int32),
            jnp.any(neg_mask, axis=1))
  s_ap = jnp.take_along_axis(s, pos_idx.astype(jnp.int32)[:, None], axis=1)   # [B, 1]
  if mode == "semihard":
    admissible = neg_mask & (s <= s_ap)
    return (_last_argmax(jnp.where(admissible, s, -jnp.inf)),
            jnp.any(admissible, axis=1))
  if mode == "semihard_random":
    admissible = neg_mask & (s > s_ap - margin)
  elif mode == "semihard_band":
    band = neg_mask & (s > s_ap - margin) & (s < s_ap)
    admissible = jnp.where(jnp.any(band, axis=1, keepdims=True), band, neg_mask)
  else:
    admissible = neg_mask
  return _uniform_member(_common.need_key(key, mode), admissible)


# --- Semi-hard negatives of many positives per anchor: compacted rows, no sort ------------
#
# With ``positive='all'`` an anchor has several terms, but in n-per-class batches only a few
# (``n - 1``). :func:`semihard_negatives` compacts each anchor's positives into ``[B, P]``
# (``P`` the smallest static size that holds the batch's largest count, chosen at run time by
# ``lax.switch``) and finds every term's semi-hard negative in one fused ``[B, P, N]`` pass
# (``O(B P N)``), falling back to the sorted :func:`negatives` when no size is large enough.


def semihard_compacted(s: jax.Array, neg_mask: jax.Array, pairs: jax.Array, *,
                       size: int) -> tuple[jax.Array, jax.Array]:
  """:func:`negatives` ``mode='semihard'`` for pair masks with at most ``size`` pairs per row.

  Per term ``(a, p)``: ``argmax {s_an : n in N_a, s_an <= s_ap}``, ties by the *last* index
  (the last stable-sort rank of the sorted path), over the row's first ``size`` pairs
  (compacted, :func:`_common.compact_rows`), in ``O(B size N)`` time without a sort.

  Args:
    s: float ``[B, N]`` scores, higher = closer (stop-gradient is applied).
    neg_mask: bool ``[B, N]`` negatives.
    pairs: bool ``[B, N]`` selected (anchor, positive) pairs, at most ``size`` per row.
    size: static ``P``.

  Returns:
    ``(idx, valid)``: int32 ``[B, N]`` negative per term (0 off ``valid``), bool ``[B, N]``
    ``valid = pairs & (a semi-hard negative exists)``.
  """
  s = _common.check_inputs(s, neg_mask, "neg_mask")
  b, n = s.shape
  pidx, ok = _common.compact_rows(pairs, size)                               # [B, P]
  s_ap = jnp.take_along_axis(s, jnp.minimum(pidx, n - 1), axis=1)            # [B, P]
  keys = jnp.where(neg_mask, s, -jnp.inf)                                    # [B, N]
  z = jnp.where(keys[:, None, :] <= s_ap[:, :, None], keys[:, None, :], -jnp.inf)  # [B, P, N]
  idx = (n - 1 - jnp.argmax(z[:, :, ::-1], axis=2)).astype(jnp.int32)      # last argmax
  best = jnp.take_along_axis(keys, idx, axis=1)                              # [B, P]
  found = ok & (best > -jnp.inf) & (best <= s_ap)
  idx_full = _common.scatter_rows(jnp.where(found, idx, 0), pidx, ok, num=n)
  valid = _common.scatter_rows(found.astype(jnp.int32), pidx, ok, num=n) > 0
  return idx_full, valid


def semihard_negatives(s: jax.Array, neg_mask: jax.Array, pairs: jax.Array, *,
                       sizes: tuple[int, ...] = _common.COMPACT_SIZES
                       ) -> tuple[jax.Array, jax.Array]:
  """:func:`negatives` ``mode='semihard'`` (the same selection, ties included) for any pairs,
  by the smallest size ``P`` of ``sizes`` that holds every row's pairs
  (:func:`semihard_compacted`, ``O(B P N)``), or the sorted path when none does.

  The size is chosen at run time (``lax.switch`` over ``_common.compact_sizes(N, sizes)`` and
  the sorted path; one trace). Entries off ``valid`` are arbitrary (0 on the compacted paths).

  Args:
    s: float ``[B, N]`` scores, higher = closer (stop-gradient is applied).
    neg_mask: bool ``[B, N]`` negatives.
    pairs: bool ``[B, N]`` selected (anchor, positive) pairs.
    sizes: ascending static sizes ``P`` to try.

  Returns:
    ``(idx, valid)``: int32 ``[B, N]``, bool ``[B, N]``.
  """
  s = _common.check_inputs(s, neg_mask, "neg_mask")
  return _common.by_row_count(
      pairs, lambda p, s, neg, pairs: semihard_compacted(s, neg, pairs, size=p),
      lambda s, neg, pairs: negatives(s, neg, pairs, mode="semihard"), s, neg_mask, pairs,
      sizes=sizes)


def select(s: jax.Array, pos_mask: jax.Array, neg_mask: jax.Array, *, positive: str,
           negative: str, margin: float = 0.0, key: jax.Array | None = None,
           dim: int | None = None, cutoff: float = 0.5, nonzero_loss_cutoff: float = 1.4,
           fallback: str = "negatives") -> Selection:
  """Positive and negative selection of a batch as one :class:`Selection`.

  ``key`` is split into a positive and a negative key (``jax.random.split(key)``), so a given
  key always gives the same selection.

  With one positive per anchor (``positive`` not ``'all'``) and ``negative`` in
  ``PER_ANCHOR_NEGATIVE_MODES`` the negatives come from :func:`negatives_per_anchor`
  (``O(B N)``, no sort; the same deterministic selections as :func:`negatives`, and the same
  uniform distributions for the random modes, drawn differently) and ``negative`` is that
  per-anchor index broadcast over the row; ``'distance_weighted'`` then draws one negative per
  anchor (same distribution as :func:`distance_weighted_negatives`, which draws one per
  ``[B, N]`` entry). ``positive='all'`` with ``'semihard'``: :func:`semihard_negatives` (the
  same selection, sort-free when the batch has at most 64 positives per anchor; ``negative`` is
  0 off ``valid`` there). Otherwise :func:`negatives` (sorted rows).

  Args:
    s: float ``[B, N]`` scores, higher = closer (stop-gradient is applied).
    pos_mask: bool ``[B, N]`` positives (self excluded), e.g. from ``similarity.label_masks``.
    neg_mask: bool ``[B, N]`` negatives.
    positive: one of ``POSITIVE_MODES``.
    negative: one of ``NEGATIVE_MODES``.
    margin: ``'semihard_random'`` / ``'semihard_band'`` margin, in the units of ``s``.
    key: PRNG key, required when :func:`is_stochastic`.
    dim, cutoff, nonzero_loss_cutoff, fallback: ``negative='distance_weighted'`` only (see
      :func:`distance_weighted_negatives`); ``dim`` (the embedding dimension) is required.

  Returns:
    :class:`Selection` of ``[B, N]`` arrays.
  """
  check_positive_mode(positive)
  check_negative_mode(negative)
  if is_stochastic(positive=positive, negative=negative):
    kp, kn = jax.random.split(_common.need_key(key, f"{positive}/{negative}"))
  else:
    kp = kn = None
  if positive != "all" and negative in PER_ANCHOR_NEGATIVE_MODES:
    # One positive per anchor: per-anchor negatives in O(B N) (same selection as below).
    pos_idx, has = positives(s, pos_mask, mode=positive, key=kp)
    pairs = pairs_from_index(pos_idx, has, num=s.shape[1])
    neg_idx, found = negatives_per_anchor(s, neg_mask, pos_idx, mode=negative, margin=margin,
                                          key=kn)
    return Selection(pairs=pairs, valid=pairs & found[:, None],
                     negative=jnp.broadcast_to(neg_idx[:, None], s.shape), negatives=neg_mask)
  if positive != "all" and negative == "distance_weighted":
    # One term per anchor: one draw per anchor instead of one per [B, N] entry.
    check_distance_weighted(dim=dim, cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff,
                            fallback=fallback)
    pos_idx, has = positives(s, pos_mask, mode=positive, key=kp)
    pairs = pairs_from_index(pos_idx, has, num=s.shape[1])
    neg_idx, found = distance_weighted_draws(
        _common.check_inputs(s, neg_mask, "neg_mask"), neg_mask, dim=dim, cutoff=cutoff,
        nonzero_loss_cutoff=nonzero_loss_cutoff, fallback=fallback, key=kn, num_draws=1)
    return Selection(pairs=pairs, valid=pairs & found[:, None],
                     negative=jnp.broadcast_to(neg_idx, s.shape), negatives=neg_mask)
  pairs = positive_pairs(s, pos_mask, mode=positive, key=kp)
  if negative == "all":
    sg = _common.check_inputs(s, neg_mask, "neg_mask")
    hardest = jnp.argmax(jnp.where(neg_mask, sg, -jnp.inf), axis=1).astype(jnp.int32)
    idx = jnp.broadcast_to(hardest[:, None], s.shape)
    valid = pairs & jnp.any(neg_mask, axis=1)[:, None]
  elif negative == "semihard":
    idx, valid = semihard_negatives(s, neg_mask, pairs)
  else:
    idx, valid = negatives(s, neg_mask, pairs, mode=negative, margin=margin, key=kn, dim=dim,
                           cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff,
                           fallback=fallback)
  return Selection(pairs=pairs, valid=valid, negative=idx, negatives=neg_mask)
