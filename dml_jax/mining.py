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
* ``'easy'``            ``argmin_{n in N_a} s_an`` (EPHN paper §3.2);
* ``'random'``          uniform over ``N_a``, drawn independently per term (needs a key);
* ``'all'``             every ``n in N_a`` (the loss sums over them).

The pair-dependent modes sort each anchor's negative scores once (``O(B N log N)``) and find the
admissible rank range of every term with ``searchsorted``; a random choice is a uniform draw in
that contiguous range. Ties are broken deterministically (first index for ``argmax``/``argmin``,
stable-sort order for the range modes).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

POSITIVE_MODES = ("easy", "hard", "random", "all")
NEGATIVE_MODES = ("hard", "semihard", "semihard_random", "easy", "random", "all")
STOCHASTIC_POSITIVE_MODES = ("random",)
STOCHASTIC_NEGATIVE_MODES = ("semihard_random", "random")


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
  over ``P_a`` (Gumbel-max: ``argmax_{p in P_a} g_ap``, ``g ~ Gumbel``); ``'all'``: ``P_a``.

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
    g = jax.random.gumbel(_need_key(key, mode), s.shape, jnp.float32)
    idx = jnp.argmax(jnp.where(pos_mask, g, -jnp.inf), axis=1)
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
              margin: float = 0.0, key: jax.Array | None = None):
  """Selects one negative per (anchor, positive) term, or all negatives.

  With ``N_a`` the negatives of anchor ``a`` and ``s_ap`` the score of the term's positive:

  * ``'hard'``: ``argmax_{n in N_a} s_an``;  ``'easy'``: ``argmin_{n in N_a} s_an``;
  * ``'semihard'``: ``argmax {s_an : n in N_a, s_an <= s_ap}`` (none: term dropped);
  * ``'semihard_random'``: uniform over ``{n in N_a : s_an > s_ap - margin}`` (none: dropped);
  * ``'random'``: uniform over ``N_a``, independently per term;
  * ``'all'``: ``N_a``.

  Computed in ``O(B N log N)`` time and ``O(B N)`` memory: each row of negative scores is sorted
  once and every term's admissible ranks are a contiguous range found by ``searchsorted``.

  Args:
    s: float ``[B, N]`` scores, higher = closer (stop-gradient is applied).
    neg_mask: bool ``[B, N]``, ``neg_mask[a, n]`` = ``n`` is a negative of ``a``.
    pairs: bool ``[B, N]`` selected (anchor, positive) pairs, e.g. from :func:`positive_pairs`.
    mode: one of ``NEGATIVE_MODES``.
    margin: ``'semihard_random'`` only: the triplet margin in the units of ``s``.
    key: PRNG key, required for ``'semihard_random'`` and ``'random'``.

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
    else:  # random
      lo = first
    count = n - lo
    found = count > 0
    rank = _uniform_in_range(_need_key(key, mode), lo, count)
  rank = jnp.clip(rank, 0, n - 1)
  idx = jnp.take_along_axis(order, rank, axis=1)
  return idx, pairs & found


def select(s: jax.Array, pos_mask: jax.Array, neg_mask: jax.Array, *, positive: str,
           negative: str, margin: float = 0.0, key: jax.Array | None = None) -> Selection:
  """Positive and negative selection of a batch as one :class:`Selection`.

  ``key`` is split into a positive and a negative key (``jax.random.split(key)``), so a given
  key always gives the same selection.

  Args:
    s: float ``[B, N]`` scores, higher = closer (stop-gradient is applied).
    pos_mask: bool ``[B, N]`` positives (self excluded), e.g. from ``similarity.label_masks``.
    neg_mask: bool ``[B, N]`` negatives.
    positive: one of ``POSITIVE_MODES``.
    negative: one of ``NEGATIVE_MODES``.
    margin: ``'semihard_random'`` margin, in the units of ``s``.
    key: PRNG key, required when :func:`is_stochastic`.

  Returns:
    :class:`Selection` of ``[B, N]`` arrays.
  """
  check_positive_mode(positive)
  check_negative_mode(negative)
  if is_stochastic(positive=positive, negative=negative):
    kp, kn = jax.random.split(_need_key(key, f"{positive}/{negative}"))
  else:
    kp = kn = None
  pairs = positive_pairs(s, pos_mask, mode=positive, key=kp)
  if negative == "all":
    sg = _check_inputs(s, neg_mask, "neg_mask")
    hardest = jnp.argmax(jnp.where(neg_mask, sg, -jnp.inf), axis=1).astype(jnp.int32)
    idx = jnp.broadcast_to(hardest[:, None], s.shape)
    valid = pairs & jnp.any(neg_mask, axis=1)[:, None]
  else:
    idx, valid = negatives(s, neg_mask, pairs, mode=negative, margin=margin, key=kn)
  return Selection(pairs=pairs, valid=valid, negative=idx, negatives=neg_mask)
