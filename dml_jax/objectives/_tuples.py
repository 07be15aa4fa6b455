"""Tuple objectives: one term per positive pair ``(a, p)`` against the anchor's negatives,
``log(1 + sum_n e^{f(a, p, n)})``: ``tuplet_margin`` (Yu & Tao 2019), ``angular`` (Wang et al.
2017), and ``npairs`` (Sohn 2016: one pair per class, the other classes' positives as
negatives).

They work on ``S [B, N]`` (cosine) and, except ``npairs``, accept a reference set (cross-batch
memory). ``aux`` as the pair objectives (``_pairs`` docstring), the entering pairs being the
positive pairs of anchors that have a negative (a positive pair without negatives has loss 0
and still counts in the mean over positive pairs, as in PML). Equal to pytorch-metric-learning 2.9's ``TupletMarginLoss``, ``AngularLoss`` and
``NPairsLoss`` (``tests/objectives/test_pml_reference.py``; differences in the docstrings).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax import losses
from dml_jax import similarity as sim
from dml_jax.mining import _common as mining_common
from dml_jax.objectives import _common
from dml_jax.objectives._registry import register

TUPLET_MAX_COS = 1.0 - 1e-7   # arccos' gradient is infinite at 1: S_ap is clipped below it
COMPACT_SIZES = mining_common.COMPACT_SIZES   # angular: positives per anchor of the O(B P N) path


def _per_positive_pair(f_ap, g_an, pos, neg):
  """float32 ``[B, N]``: ``log(1 + sum_{n in N_a} e^{f_ap + g_an})`` at the positive pairs, 0
  elsewhere, for a term separable in ``p`` and ``n`` (``f_ap``, ``g_an``: float ``[B, N]``)."""
  lse_n, _ = losses.masked_logsumexp(g_an, neg, axis=1)                   # [B]
  return jnp.where(pos, jax.nn.softplus(f_ap + lse_n[:, None]), 0.0)


# --- angular on compacted positive pairs (no reference set) ------------------------------
#
# Its per-pair sum ``sum_n w_an v_pn`` is a [B, N] x [N, N] matmul (O(B N^2)) when taken for
# every (a, p); only the positive pairs need it, and an n-per-class batch has few per anchor.
# On the positives compacted to [B, P] (``mining._common.compact_rows``) it is O(B P N): P row
# gathers. Without a reference set the positive relation is symmetric, so the anchors whose
# list holds p are p's own positives, which gives the gradient w.r.t. v the same form.


GATHER_BLOCK_BYTES = 1 << 24   # the [rows, P, N] row gathers are made this many bytes at a time


def _by_row_blocks(fn, num_rows: int, row_bytes: int, *args):
  """``fn(*args)`` on blocks of the leading (row) axis of every ``args`` (``lax.map``), each
  block's temporaries at most about ``GATHER_BLOCK_BYTES`` (``row_bytes`` per row): O(B N)
  memory for an O(B P N) computation. Rows are padded to whole blocks (and cut off after)."""
  rows = max(1, min(num_rows, GATHER_BLOCK_BYTES // max(row_bytes, 1)))
  if rows == num_rows:
    return fn(*args)
  blocks = -(-num_rows // rows)
  pad = blocks * rows - num_rows
  padded = [jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)) for a in args]
  out = jax.lax.map(lambda xs: fn(*xs), [a.reshape(blocks, rows, *a.shape[1:])
                                         for a in padded])
  return out.reshape(blocks * rows, *out.shape[2:])[:num_rows]


def _gathered_row_sums(m: jax.Array, idx: jax.Array, coef: jax.Array) -> jax.Array:
  """``out[a, n] = sum_k coef[a, k] m[idx[a, k], n]``: ``m [N, N]``, ``idx``/``coef [B, P]``
  -> float32 ``[B, N]`` (row gathers, by row blocks)."""
  rows = lambda i, c: jnp.einsum("bk,bkn->bn", c, m[i], precision=sim.PRECISION)
  return _by_row_blocks(rows, idx.shape[0], 4 * idx.shape[1] * m.shape[1], idx, coef)


@jax.custom_vjp
def _pair_row_dots(w, v, pidx, ok, tidx):
  """``t[a, k] = sum_n w[a, n] v[pidx[a, k], n]`` -> float32 ``[B, P]`` (``w``, ``v``
  ``[B, B]``; ``pidx``, ``ok`` from ``compact_rows`` of a symmetric mask; ``tidx[p, q]`` the
  slot of ``p`` in the list of anchor ``pidx[p, q]``), 0 where not ``ok``."""
  del tidx   # the backward pass's
  return _pair_row_dots_value(w, v, pidx, ok)


def _pair_row_dots_value(w, v, pidx, ok):
  """:func:`_pair_row_dots` without its custom VJP: the forward rule calls this, so that
  forward-over-reverse differentiation (``jax.hessian``) can differentiate it."""
  dots = lambda w_, i: jnp.einsum("bn,bkn->bk", w_, v[i], precision=sim.PRECISION)
  total = _by_row_blocks(dots, pidx.shape[0], 4 * pidx.shape[1] * v.shape[1], w, pidx)
  return jnp.where(ok, total, 0.0)


def _pair_row_dots_fwd(w, v, pidx, ok, tidx):
  return _pair_row_dots_value(w, v, pidx, ok), (w, v, pidx, ok, tidx)


def _pair_row_dots_bwd(res, g):
  w, v, pidx, ok, tidx = res
  g = jnp.where(ok, g, 0.0)
  dw = _gathered_row_sums(v, pidx, g)                       # sum_k g[a, k] v[p_ak, n]
  # dv[p, n] = sum over the anchors a holding p (p's positives, slot tidx) of g[a, slot] w[a, n]
  g_t = jnp.take_along_axis(g[pidx], tidx[..., None], axis=2)[..., 0]     # g[p_pq, tidx[p, q]]
  dv = _gathered_row_sums(w, pidx, jnp.where(ok, g_t, 0.0))
  return dw.astype(w.dtype), dv.astype(v.dtype), None, None, None


_pair_row_dots.defvjp(_pair_row_dots_fwd, _pair_row_dots_bwd)


def _angular_compacted(s, pos, neg, *, tan2: float, size: int):
  """``angular``'s per-pair terms ``[B, B]`` (no reference set) on the positives compacted to
  ``[B, size]`` (``size >=`` every anchor's positive count)."""
  pidx, ok = mining_common.compact_rows(pos, size)                            # [B, P]
  # The slot of p in the list of a = pidx[p, q] (both lists: their class's members in index
  # order, without the list's owner): with r_p = #(p's positives below p), a's rank in the
  # class is q (q < r_p: below p, so p's slot is r_p - 1) or q + 1 (above p: slot r_p).
  # O(B P), no cumsum over [B, N] (which XLA:CPU runs as a quadratic reduce-window).
  below = jnp.sum(ok & (pidx < jnp.arange(pidx.shape[0])[:, None]), axis=1, dtype=jnp.int32)
  q = jnp.arange(size, dtype=jnp.int32)[None, :]
  tidx = jnp.clip(jnp.where(q < below[:, None], below[:, None] - 1, below[:, None]), 0,
                  size - 1)
  v = jnp.exp(4.0 * tan2 * (s - 1.0))
  w = jnp.where(neg, v, 0.0)
  total = _pair_row_dots(w, v, pidx, ok, tidx)                                # [B, P]
  s_ap = jnp.take_along_axis(s, pidx, axis=1)
  good = ok & (total > 0)
  lse = jnp.log(jnp.where(good, total, 1.0)) + 8.0 * tan2
  t = jnp.where(good, jax.nn.softplus(lse - 2.0 * (1.0 + tan2) * s_ap), 0.0)
  return mining_common.scatter_rows(t, pidx, ok, num=s.shape[1])


@register("tuplet_margin", references=True)
def tuplet_margin(*, margin: float = 0.1, scale: float = 64.0):
  """Tuplet margin loss (Yu & Tao, ICCV 2019, eq. 5), one term per positive pair.

  ``l_ap = log(1 + sum_{n in N_a} e^{s (cos(theta_an) - cos(theta_ap - beta))})``, averaged over
  the positive pairs (a pair whose anchor has no negative gives 0 and still counts, as in PML).
  Defaults ``beta = margin = 0.1`` radians (5.73 degrees, the paper's; PML takes degrees) and
  ``s = scale = 64``. The paper's optional rescaling of hard positives is not included (PML
  neither).

  Args:
    margin: ``beta`` in radians, default 0.1.
    scale: ``s > 0``, default 64.

  Returns:
    ``(init, apply)``; use ``make('tuplet_margin', ...)``.
  """
  margin = hparams.real("margin", margin)
  scale = hparams.number("scale", scale, positive=True)

  def terms(x, pos, neg):
    theta = jnp.arccos(jnp.clip(x, -TUPLET_MAX_COS, TUPLET_MAX_COS))
    return _per_positive_pair(-scale * jnp.cos(theta - margin), scale * x, pos, neg)

  def pair_terms(b):
    return _common.PairTerms(lambda x: terms(x, b.pos, b.neg),
                             b.pos & jnp.any(b.neg, axis=1, keepdims=True), b.pos, "mean")

  return _common.pair_objective(pair_terms, name="tuplet_margin")


@register("angular", references=True)
def angular(*, alpha: float = 40.0):
  """Angular loss (Wang et al., ICCV 2017, eq. 8 in its N-pair form), per positive pair.

  With unit embeddings, ``l_ap = log(1 + sum_{n in N_a} e^{4 tan^2(alpha) (x_a + x_p)^T x_n
  - 2 (1 + tan^2(alpha)) x_a^T x_p})``, averaged over the positive pairs. ``alpha`` in degrees
  (the paper's; default 40, PML's). PML normalises anchors and positives but not the negatives
  in ``(x_a + x_p)^T x_n``; we normalise all three: on unit embeddings the values are equal and
  the gradients agree on their tangent part, the part that moves a normalised embedding
  (tested). With a reference set, the references' own similarities ``[N, N]`` are computed.

  Args:
    alpha: the angle in degrees, in ``(0, 90)``, default 40.

  Returns:
    ``(init, apply)``; use ``make('angular', ...)``.
  """
  alpha = hparams.number("alpha", alpha, positive=True)
  if alpha >= 90:
    raise ValueError(f"alpha={alpha} must be an angle in degrees in (0, 90) (the paper uses "
                     "36-55).")
  tan2 = math.tan(math.radians(alpha)) ** 2

  def terms(s, r, pos, neg):
    # sum_n [n in N_a] e^{4 t (S_an + R_pn)} = (W V^T)[a, p] with W = [N_a] e^{4 t (S_an - 1)},
    # V = e^{4 t (R_pn - 1)} (bounded by 1: S, R <= 1), R the references' own similarities.
    w = jnp.where(neg, jnp.exp(4.0 * tan2 * (s - 1.0)), 0.0)             # [B, N]
    total = sim.inner_products(w, jnp.exp(4.0 * tan2 * (r - 1.0)))           # [B, N]
    ok = pos & (total > 0)
    lse = jnp.log(jnp.where(ok, total, 1.0)) + 8.0 * tan2
    return jnp.where(ok, jax.nn.softplus(lse - 2.0 * (1.0 + tan2) * s), 0.0)

  def batch_terms(s, pos, neg, sizes=COMPACT_SIZES):
    # No reference set: the smallest static P that holds every anchor's positives (run-time
    # switch, one trace), the dense form when none does.
    return mining_common.by_row_count(
        pos, lambda p, s: _angular_compacted(s, pos, neg, tan2=tan2, size=p),
        lambda s: terms(s, s, pos, neg), s, sizes=sizes)

  def pair_terms(b):
    pos, neg = b.pos, b.neg
    if b.references is None:
      term_fn = lambda x: batch_terms(x, pos, neg)
    else:
      r = sim.pairwise_similarity(jnp.asarray(b.references[0]), kind="cosine")
      term_fn = lambda x: terms(x, r, pos, neg)
    return _common.PairTerms(term_fn, pos & jnp.any(neg, axis=1, keepdims=True), pos, "mean")

  return _common.pair_objective(pair_terms, name="angular")


@register("npairs")
def npairs(*, similarity: str = "cosine"):
  """Multi-class N-pair loss (Sohn, NeurIPS 2016, eq. 6): one (anchor, positive) pair per class.

  For each class with at least two examples, the anchor is its first example in the batch and
  the positive its second (PML's choice); with ``K`` such pairs,
  ``L = (1/K) sum_i log(1 + sum_{j != i} e^{S(x_i, x_j^+) - S(x_i, x_i^+)})`` — a softmax over
  the other classes' positives. The paper's L2 penalty on the embeddings is left to the user (PML
  too). ``similarity='cosine'`` (default; PML's ``DotProductSimilarity`` normalises by default)
  or ``'dot'`` (the paper's inner product). No reference set (the pairs are built from the
  batch).

  Args:
    similarity: ``'cosine'`` (default) or ``'dot'``.

  Returns:
    ``(init, apply)``; use ``make('npairs', ...)``.
  """

  def apply(batch):
    embeddings, labels = batch.embeddings, batch.labels
    b = embeddings.shape[0]
    idx = jnp.arange(b)
    same = labels[:, None] == labels[None, :]                              # [B, B], self incl.
    first = jnp.argmax(same, axis=1)                                       # [B]
    second = jnp.argmax(same & (idx[None, :] != first[:, None]), axis=1)   # positive of the class
    is_anchor = (first == idx) & (jnp.sum(same, axis=1) > 1)               # [B] one per class
    # The K <= B/2 anchors (each has a positive) packed to the front: the softmax is over
    # S(anchor_i, positive_j) [K, K], a quarter of the batch's [B, B] at most.
    # (At least one slot: a batch of one has no pair, and its one masked slot gives 0.)
    k = max(b // 2, 1)
    (rows,) = jnp.nonzero(is_anchor, size=k, fill_value=0)                # [K]
    count = jnp.sum(is_anchor)
    row_valid = (jnp.arange(k) < count) & (count >= 2)        # one pair alone has no negative
    c = sim.pairwise_similarity(embeddings[rows], embeddings[second[rows]], kind=similarity)
    valid = row_valid[:, None] & row_valid[None, :]           # (anchor i, positive of class j)
    diag = jnp.eye(k, dtype=bool)

    def term_fn(x):
      lse, _ = losses.masked_logsumexp(x, valid, axis=1)
      return jnp.where(row_valid, lse - jnp.diagonal(x), 0.0)

    loss = losses.reduce(term_fn(c), row_valid, "mean")
    cg = jax.lax.stop_gradient(c)
    weight = jax.grad(lambda x: jnp.sum(term_fn(x)))(cg)
    aux = {"valid_fraction": jnp.sum(row_valid, dtype=jnp.float32) / b,
           "active_fraction": losses.masked_mean(
               (jnp.abs(weight) > _common.PAIR_ACTIVE_WEIGHT).astype(jnp.float32), valid),
           "mean_s_ap": losses.masked_mean(cg, valid & diag),
           "mean_s_an": losses.masked_mean(cg, valid & ~diag)}
    return loss, aux

  # The batch's own S [B, B] goes unused (XLA drops it under jit): the pairs are built first.
  return _common.no_params, _common.batch_objective(
      apply, name="npairs", similarity=similarity, kinds=("cosine", "dot"), references=False,
      no_references_why="builds its pairs from the batch")
