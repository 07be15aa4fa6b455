"""Triplet mining: fixed-shape positive and negative selections, computed under stop-gradient.

Every miner reads a score matrix ``s [B, N]`` where *higher = closer* (a similarity ``S`` for the
NCA losses, ``-d^2`` for distance losses) together with the boolean label masks of
``similarity.label_masks`` (``N = B`` for a batch against itself). Scores are wrapped in
``jax.lax.stop_gradient``: the miners choose *which* terms exist; gradients flow only through the
selected similarities, which the objectives gather from the differentiable ``S``.

Representation
--------------
A selection over ``B`` anchors is a :class:`Selection` of four ``[B, N]`` arrays, whatever the
modes (memory ``O(B N)``, never ``[B, N, N]``). One *term* is one selected (anchor, positive) pair
``(a, p)``:

* ``pairs[a, p]``   bool: ``(a, p)`` is a selected anchor-positive pair (``positive='easy'``,
  ``'hard'`` or ``'random'`` select at most one per row; ``'all'`` every positive).
* ``valid[a, p]``   bool: the term has its positive *and* a negative; only valid terms enter a
  loss. Anchors without a positive, or without an admissible negative, have no valid term.
* ``negative[a, p]`` int32: the index ``n`` of the negative of the term for the single-negative
  modes (it may depend on ``S_ap``, e.g. semi-hard). For ``negative='all'`` it holds the
  anchor's hardest negative (for diagnostics). Where ``valid`` is False it is an arbitrary
  in-range index.
* ``negatives[a, n]`` bool: the anchor's candidate negatives; a ``negative='all'`` loss sums
  over them.

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
  eq. 29). If there is none the term is dropped, no fallback (released EPHN code);
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
  :func:`distance_weighted_negatives` (the section at the end of this module, with
  :func:`keep_easiest`, the trimming of trimmed losses).

The pair-dependent modes sort each anchor's negative scores once (``O(B N log N)``) and find the
admissible rank range of every term with ``searchsorted``; a random choice is a uniform draw in
that contiguous range. Ties are broken deterministically (first index for ``argmax``/``argmin``,
stable-sort order for the range modes). With one positive per anchor (``positive`` not
``'all'``), :func:`select` instead picks each anchor's negative in one ``O(B N)`` pass over its
row (:func:`negatives_per_anchor`: the same semi-hard negative, ties included; the random modes
draw from the same uniform distribution, by index order rather than score order, so a given key
gives a different draw than the sorted path).

Pair selections (pair-based objectives: every ordered pair ``(i, j)``, ``i != j``, is a term):
multi-similarity mining (:func:`multi_similarity_pairs`), DRO top-K / top-K-PN
(:func:`topk_pairs`), DRO-KL weights (:func:`kl_weights`, :func:`kl_grouped_weights`) and
samples (:func:`kl_sample_pairs`) return fixed-shape ``[B, N]`` masks, weights or counts; see
the section "Pair selections" at the end of this module.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

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
  if mode not in POSITIVE_MODES:
    raise ValueError(f"Unknown positive mode {mode!r}; allowed: {', '.join(POSITIVE_MODES)}.")
  return mode


def check_negative_mode(mode: str) -> str:
  """Returns ``mode`` or raises ``ValueError`` naming the negative modes."""
  if mode not in NEGATIVE_MODES:
    raise ValueError(f"Unknown negative mode {mode!r}; allowed: {', '.join(NEGATIVE_MODES)}.")
  return mode


def is_stochastic(*, positive: str, negative: str) -> bool:
  """Whether the selection ``(positive, negative)`` draws random numbers (needs a PRNG key)."""
  return positive in STOCHASTIC_POSITIVE_MODES or negative in STOCHASTIC_NEGATIVE_MODES


def _check_inputs(s: jax.Array, mask: jax.Array, what: str) -> jax.Array:
  if s.ndim != 2:
    raise ValueError(f"scores must have rank 2 [B, N], got shape {s.shape}.")
  if mask.shape != s.shape or mask.dtype != jnp.bool_:
    raise ValueError(f"{what} must be bool with the shape of the scores {s.shape}, "
                     f"got {mask.dtype} {mask.shape}.")
  return jax.lax.stop_gradient(s.astype(jnp.float32))


def _need_key(key, mode: str):
  if key is None:
    raise ValueError(f"mode {mode!r} draws random numbers; pass a PRNG key (key=...).")
  return key


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
  s = _check_inputs(s, pos_mask, "pos_mask")
  if mode == "all":
    return pos_mask
  has = jnp.any(pos_mask, axis=1)
  if mode == "easy":
    idx = jnp.argmax(jnp.where(pos_mask, s, -jnp.inf), axis=1)
  elif mode == "hard":
    idx = jnp.argmin(jnp.where(pos_mask, s, jnp.inf), axis=1)
  else:
    idx, _ = _uniform_member(_need_key(key, mode), pos_mask)
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


def _search_rows(sorted_rows: jax.Array, values: jax.Array, *, side: str) -> jax.Array:
  """Row-wise ``searchsorted``: ``[B, N]`` sorted rows, ``[B, P]`` values -> int32 ``[B, P]``."""
  fn = lambda row, v: jnp.searchsorted(row, v, side=side)
  return jax.vmap(fn)(sorted_rows, values).astype(jnp.int32)


def _uniform_in_range(key: jax.Array, lo: jax.Array, count: jax.Array) -> jax.Array:
  """A uniform integer in ``[lo, lo + count)`` per entry (``lo`` where ``count == 0``)."""
  u = jax.random.uniform(key, lo.shape, jnp.float32)
  offset = jnp.minimum(jnp.floor(u * count).astype(jnp.int32), jnp.maximum(count - 1, 0))
  return lo + offset


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
      width) in the units of ``s``.
    key: PRNG key, required for ``'semihard_random'``, ``'semihard_band'``, ``'random'``,
      ``'distance_weighted'``.
    dim, cutoff, nonzero_loss_cutoff, fallback: ``'distance_weighted'`` only (see
      :func:`distance_weighted_negatives`); ``dim`` (the embedding dimension) is required.

  Returns:
    ``'all'``: ``neg_mask`` (bool ``[B, N]``). Otherwise ``(idx, valid)``: int32 ``[B, N]`` negative
    index per term and bool ``[B, N]`` validity, ``valid = pairs & (a negative was found)``.
  """
  check_negative_mode(mode)
  s = _check_inputs(s, neg_mask, "neg_mask")
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
    rank = _search_rows(sorted_keys, s, side="right") - 1   # last rank with s_an <= s_ap
    found = rank >= first
  else:
    if mode == "semihard_random":
      lo = jnp.maximum(_search_rows(sorted_keys, s - margin, side="right"), first)
      count = n - lo
    elif mode == "semihard_band":
      # Ranks with s_ap - margin < s_an < s_ap; an empty band falls back to all negatives.
      lo = jnp.maximum(_search_rows(sorted_keys, s - margin, side="right"), first)
      count = jnp.maximum(_search_rows(sorted_keys, s, side="left") - lo, 0)
      lo = jnp.where(count > 0, lo, first)
      count = jnp.where(count > 0, count, n - first)
    else:  # random
      lo = first
      count = n - lo
    found = count > 0
    rank = _uniform_in_range(_need_key(key, mode), lo, count)
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
  j = _uniform_in_range(key, jnp.zeros_like(count), count)            # [B] in [0, count)
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
    margin: ``'semihard_random'`` and ``'semihard_band'`` only, in the units of ``s``.
    key: PRNG key, required for ``'semihard_random'``, ``'semihard_band'`` and ``'random'``.

  Returns:
    ``(idx, found)``: int32 ``[B]`` negative per anchor, bool ``[B]`` whether one was found.
  """
  if mode not in PER_ANCHOR_NEGATIVE_MODES:
    raise ValueError(f"Unknown per-anchor negative mode {mode!r}; allowed: "
                     f"{', '.join(PER_ANCHOR_NEGATIVE_MODES)}.")
  s = _check_inputs(s, neg_mask, "neg_mask")
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
  return _uniform_member(_need_key(key, mode), admissible)


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
  ``[B, N]`` entry). Otherwise :func:`negatives` (sorted rows).

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
    kp, kn = jax.random.split(_need_key(key, f"{positive}/{negative}"))
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
    neg_idx, found = _distance_weighted_draws(
        _check_inputs(s, neg_mask, "neg_mask"), neg_mask, dim=dim, cutoff=cutoff,
        nonzero_loss_cutoff=nonzero_loss_cutoff, fallback=fallback, key=kn, num_draws=1)
    return Selection(pairs=pairs, valid=pairs & found[:, None],
                     negative=jnp.broadcast_to(neg_idx, s.shape), negatives=neg_mask)
  pairs = positive_pairs(s, pos_mask, mode=positive, key=kp)
  if negative == "all":
    sg = _check_inputs(s, neg_mask, "neg_mask")
    hardest = jnp.argmax(jnp.where(neg_mask, sg, -jnp.inf), axis=1).astype(jnp.int32)
    idx = jnp.broadcast_to(hardest[:, None], s.shape)
    valid = pairs & jnp.any(neg_mask, axis=1)[:, None]
  else:
    idx, valid = negatives(s, neg_mask, pairs, mode=negative, margin=margin, key=kn, dim=dim,
                           cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff,
                           fallback=fallback)
  return Selection(pairs=pairs, valid=valid, negative=idx, negatives=neg_mask)


# --- Distance-weighted negatives (Wu et al.) and trimming ------------------------------------
#
# Wu, Manmatha, Smola, Krahenbuhl, "Sampling matters in deep embedding learning", ICCV 2017, §4;
# released code: apache/mxnet example/gluon/embedding_learning/model.py (DistanceWeightedSampling).

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
  if isinstance(dim, bool) or not hasattr(dim, "__index__") or dim < 1:
    raise ValueError("negative='distance_weighted' needs the embedding dimension dim, an int "
                     f">= 1; got dim={dim!r}.")
  for name, value in (("cutoff", cutoff), ("nonzero_loss_cutoff", nonzero_loss_cutoff)):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ValueError(f"{name} must be a number, got {value!r}.")
  if not 0 < cutoff < nonzero_loss_cutoff <= 2:
    raise ValueError("distance-weighted sampling needs 0 < cutoff < nonzero_loss_cutoff <= 2 "
                     f"(distances on the unit sphere); got cutoff={cutoff!r}, "
                     f"nonzero_loss_cutoff={nonzero_loss_cutoff!r}.")
  if fallback not in DW_FALLBACKS:
    raise ValueError(f"Unknown distance-weighted fallback {fallback!r}; allowed: "
                     f"{', '.join(DW_FALLBACKS)}.")


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
  s = _check_inputs(s, neg_mask, "neg_mask")
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


def _inverse_cdf_rows(key: jax.Array, weights: jax.Array, num_draws: int) -> jax.Array:
  """Per row of ``weights [B, N]`` (>= 0), ``num_draws`` independent draws ``j ~ w_j / sum w``.

  Inverse CDF: ``c = cumsum(w)``, ``u ~ U[0, 1)``, ``j = min{j : c_j > u c_N}`` via a row-wise
  ``searchsorted`` (``O(B N log N)`` time, ``O(B N)`` memory). A zero-weight entry is never
  drawn (clamped to the row's last positive entry against rounding). Rows that are all zero
  give an arbitrary index. Returns int32 ``[B, num_draws]``.
  """
  b, n = weights.shape
  cdf = jnp.cumsum(weights, axis=1)
  u = jax.random.uniform(key, (b, num_draws), jnp.float32)
  idx = _search_rows(cdf, u * cdf[:, -1:], side="right")
  last = (n - 1 - jnp.argmax(weights[:, ::-1] > 0, axis=1)).astype(jnp.int32)
  return jnp.minimum(idx, last[:, None])


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
  idx, found = _distance_weighted_draws(s, neg_mask, dim=dim, cutoff=cutoff,
                                        nonzero_loss_cutoff=nonzero_loss_cutoff,
                                        fallback=fallback, key=key, num_draws=s.shape[1])
  return idx, pairs & found[:, None]


def _distance_weighted_draws(s, neg_mask, *, dim, cutoff, nonzero_loss_cutoff, fallback, key,
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
  return _inverse_cdf_rows(_need_key(key, "distance_weighted"), w, num_draws), found


def keep_easiest(values: jax.Array, valid: jax.Array, *, keep_fraction: float) -> jax.Array:
  """Trimming: the ``k = ceil(keep_fraction * n_valid)`` valid terms of lowest value.

  The trimmed loss of Shen & Sanghavi (2019) as tested in the EPS paper (App. C, "Trimmed loss
  comparison"): back-propagate only the terms of the batch with the lowest current loss.
  Computed under stop-gradient: rank all valid terms by value (invalid ones last; ties by
  flat index, row-major, stable sort) and keep ranks ``< k``. ``O(T log T)`` for ``T`` terms,
  computed without the rank scatter: the ``k``-th smallest value ``v_k`` by a plain sort, then
  the terms ``< v_k`` and the first ``k - #{< v_k}`` valid terms equal to ``v_k`` (cumulative
  count in flat order): the same selection.
  ``k >= 1`` whenever a term is valid; ``keep_fraction = 1`` keeps every valid term.

  Args:
    values: float, any shape (e.g. per-term losses ``[B, N]``).
    valid: bool, the shape of ``values``.
    keep_fraction: in ``(0, 1]``.

  Returns:
    bool of the shape of ``values``: the kept terms (a subset of ``valid``).
  """
  if (isinstance(keep_fraction, bool) or not isinstance(keep_fraction, (int, float))
      or not 0 < keep_fraction <= 1):
    raise ValueError(f"keep_fraction must be a number in (0, 1], got {keep_fraction!r}.")
  if valid.shape != values.shape:
    raise ValueError(f"valid must have the shape of the values {values.shape}, "
                     f"got {valid.shape}.")
  ok = valid.ravel()
  v = jnp.where(ok, jax.lax.stop_gradient(values).astype(jnp.float32).ravel(), jnp.inf)
  n_valid = jnp.sum(valid, dtype=jnp.float32)
  # ceil(f n); the factor 1 - 1e-6 absorbs float32 rounding of f * n at exact integers.
  k = jnp.ceil(keep_fraction * n_valid * (1.0 - 1e-6)).astype(jnp.int32)
  # The k-th smallest valid value by a keys-only sort; keep everything below it and, of the
  # valid terms equal to it, the first ones in flat order: the ranks < k of a stable sort.
  thr = jnp.sort(v)[jnp.maximum(k - 1, 0)]
  below = ok & (v < thr)
  ties = ok & (v == thr)
  tie_rank = jnp.cumsum(ties, dtype=jnp.int32) - 1
  keep = below | (ties & (tie_rank < k - jnp.sum(below, dtype=jnp.int32)))
  return (keep & (k > 0)).reshape(values.shape)


# --- Pair selections: multi-similarity mining, DRO top-K / top-K-PN, KL weights and samples ---
#
# Pair-based objectives treat every ordered pair ``(i, j)``, ``i != j``, of the batch as a term
# (``pos_mask | neg_mask`` of ``similarity.label_masks``). The selections below read a score or
# a pair-loss matrix ``[B, N]`` under stop-gradient and return fixed-shape ``[B, N]`` masks,
# weights or counts; the objectives multiply them with the differentiable pair losses, so the
# gradient flows only through the selected similarities. Multi-similarity: Wang et al., "Multi-
# similarity loss with general pair weighting", CVPR 2019 (released code: MalongTech/research-
# ms-loss). DRO: "A simple and effective framework for pairwise deep metric learning" (the DRO
# paper, ``papers/dro-pairwise-metric-learning.txt``), §3.2 and eq. 7.

MS_POSITIVE_MODES = ("ms", "all", "easy")
MS_NEGATIVE_MODES = ("ms", "all")
MS_NEGATIVE_REFERENCES = ("hardest", "selected")


def _check_gamma(gamma, name: str = "gamma") -> None:
  if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not gamma > 0:
    raise ValueError(f"{name} must be a number > 0, got {gamma!r}.")


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

  Inequalities are strict, as in the released code. An anchor without positives keeps no
  negative (``min`` of an empty set is ``+inf``) and one without negatives keeps no positive.
  The objective drops anchors whose kept positive or negative set is empty.

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
  if positive not in MS_POSITIVE_MODES:
    raise ValueError(f"Unknown multi-similarity positive mode {positive!r}; allowed: "
                     f"{', '.join(MS_POSITIVE_MODES)}.")
  if negative not in MS_NEGATIVE_MODES:
    raise ValueError(f"Unknown multi-similarity negative mode {negative!r}; allowed: "
                     f"{', '.join(MS_NEGATIVE_MODES)}.")
  if negative_reference not in MS_NEGATIVE_REFERENCES:
    raise ValueError(f"Unknown multi-similarity negative_reference {negative_reference!r}; "
                     f"allowed: {', '.join(MS_NEGATIVE_REFERENCES)}.")
  if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0:
    raise ValueError(f"epsilon must be a number >= 0, got {epsilon!r}.")
  s = _check_inputs(s, pos_mask, "pos_mask")
  _check_inputs(s, neg_mask, "neg_mask")
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


def topk_pairs(values: jax.Array, mask: jax.Array, *, k: int) -> jax.Array:
  """The ``k`` masked entries of largest value, over the whole matrix (DRO-TopK, §3.2).

  ``jax.lax.top_k`` over the flattened ``where(mask, values, -inf)``; ties are broken by the
  lower flat (row-major) index. Fewer than ``k`` masked entries: all of them are selected.

  Args:
    values: float ``[B, N]``, e.g. pair losses (stop-gradient is applied).
    mask: bool ``[B, N]`` candidate pairs.
    k: static int, ``0 <= k <= B N`` (the objectives clamp ``k`` with a warning first).

  Returns:
    bool ``[B, N]``, at most ``k`` entries True, a subset of ``mask``.
  """
  if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= values.size:
    raise ValueError(f"k must be an int in [0, {values.size}] (the number of entries), "
                     f"got {k!r}.")
  v = _check_inputs(values, mask, "mask")
  if k == 0:
    return jnp.zeros(v.shape, bool)
  _, idx = jax.lax.top_k(jnp.where(mask, v, -jnp.inf).ravel(), k)
  picked = jnp.zeros(v.size, bool).at[idx].set(True).reshape(v.shape)
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
  _check_gamma(gamma)
  z = _check_inputs(losses, mask, "mask") / gamma
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
  _check_gamma(gamma)
  z = _check_inputs(losses, mask, "mask") / gamma
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
  the flattened ``[B N]`` weights (``O(B N + num log(B N))`` time, ``O(B N + num)`` memory).
  ``E[counts] = num p*``.

  Args:
    key: PRNG key.
    losses: float ``[B, N]`` pair losses (stop-gradient is applied).
    mask: bool ``[B, N]`` candidate pairs.
    gamma: ``> 0``.
    num: static int ``>= 1``, the number of draws.

  Returns:
    int32 ``[B, N]`` draw counts (summing to ``num``; all 0 when ``mask`` is empty).
  """
  if isinstance(num, bool) or not isinstance(num, int) or num < 1:
    raise ValueError(f"num must be an int >= 1, got {num!r}.")
  p = kl_weights(losses, mask, gamma=gamma)
  idx = _inverse_cdf_rows(key, p.reshape(1, -1), num)[0]
  counts = jnp.zeros(p.size, jnp.int32).at[idx].add(1).reshape(p.shape)
  return jnp.where(mask, counts, 0)
