"""Ranking and distribution objectives: ``fastap`` (Cakir et al. 2019), ``ranked_list`` (Wang et
al. 2019), ``histogram`` (Ustinova & Lempitsky 2016), the SNR-distance contrastive loss
``snr_contrastive`` (Yuan et al. 2019), and the smoothed-rank losses ``smooth_ap`` (Brown et al.
2020) and ``pnp`` (Li et al. 2022).

They work on the batch (``fastap``, ``ranked_list`` and ``snr_contrastive`` also on a reference
set, row by row; ``histogram`` pools pairs of the batch, ``smooth_ap`` and ``pnp`` rank each
anchor's batch, and take none) and equal pytorch-metric-learning 2.9's ``FastAPLoss``,
``RankedListLoss``, ``HistogramLoss``, ``SignalToNoiseRatioContrastiveLoss``, ``SmoothAPLoss``
and ``PNPLoss`` (``tests/objectives/test_pml_reference.py``). ``aux`` as the pair objectives
(``_pairs`` docstring).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax import losses
from dml_jax import similarity as sim
from dml_jax.mining import _common as mining_common
from dml_jax.objectives import _common
from dml_jax.objectives._registry import register

RLL_WEIGHT_EPS = 1e-5      # PML adds this to every weight of a row in the normalisers
MIN_SQ_DISTANCE = 1e-12    # d = sqrt(max(d^2, this)): finite gradient at d = 0
SNR_MIN_VARIANCE = 1e-12   # an anchor whose variance is not above this has no SNR distance


@register("fastap", references=True)
def fastap(*, num_bins: int = 10):
  """FastAP (Cakir et al., CVPR 2019, eqs. 9-11): 1 - a histogram approximation of each
  anchor's average precision, on squared Euclidean distances of unit embeddings (``[0, 4]``,
  ``num_bins`` bins with triangular kernels), averaged over the anchors with a positive.

  ``AP_a = (1/N+_a) sum_l h+_l H+_l / H_l`` with ``h+`` the soft positive histogram, ``H+``
  and ``H`` the cumulative positive and total histograms (terms with ``h+_l H+_l = 0`` or
  ``H_l = 0`` are 0). Default 10 bins (the paper's).

  Args:
    num_bins: ``L >= 1``, default 10.

  Returns:
    ``(init, apply)``; use ``make('fastap', ...)``.
  """
  num_bins = hparams.integer("num_bins", num_bins, minimum=1)

  def terms(b):
    pos, neg = b.pos, b.neg
    n_pos = jnp.sum(pos, axis=1)
    valid = n_pos > 0

    def term_fn(x):
      d2 = sim.squared_distance(x, kind="cosine")                           # [B, N]
      h_pos, h_all = soft_histograms(d2, pos, pos | neg, num_bins)          # [B, L+1]
      cum_pos, cum_all = jnp.cumsum(h_pos, axis=1), jnp.cumsum(h_all, axis=1)
      num = h_pos * cum_pos
      ok = (num > 0) & (cum_all > 0)
      ap = jnp.sum(jnp.where(ok, num / jnp.where(ok, cum_all, 1.0), 0.0), axis=1)
      return jnp.where(valid, 1.0 - ap / jnp.maximum(n_pos, 1), 0.0)

    return _common.PairTerms(term_fn, (pos | neg) & valid[:, None], valid, "mean")

  return _common.pair_objective(terms, name="fastap")


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def soft_histograms(d2: jax.Array, first: jax.Array, second: jax.Array,
                    num_bins: int) -> tuple[jax.Array, jax.Array]:
  """FastAP's soft histograms of squared distances in ``[0, 4]``: ``L + 1`` bins centred at
  ``c_l = l delta`` (``delta = 4 / L``), triangular kernels ``max(0, 1 - |d2 - c_l| / delta)``.

  Each distance falls in exactly two kernels (bins ``l0 = clip(floor(d2 / delta), 0, L - 1)``
  and ``l0 + 1``), so the forward sums those two weights per bin and the custom VJP gathers
  the two bins' cotangents per pair (``dh/dd2 = -+1 / delta`` inside a kernel, 0 outside)
  instead of differentiating ``[B, N, L + 1]`` kernels. Equal to the kernel form in values,
  and in gradients wherever ``d2`` is not a kink ``c_l`` or ``c_l +- delta``.

  Args:
    d2: float ``[B, N]`` squared distances (>= 0).
    first, second: bool ``[B, N]``, the pairs each histogram counts.
    num_bins: ``L``.

  Returns:
    ``(h_first, h_second)``, float ``[B, L + 1]``.
  """
  return _soft_histograms_fwd(d2, first, second, num_bins)[0]


def _histogram_bins(d2, num_bins):
  t = d2 * (num_bins / 4.0)
  low = jnp.clip(jnp.floor(t), 0, num_bins - 1)
  return low.astype(jnp.int32), t - low      # lower bin, offset from its centre (in bins)


def _soft_histograms_fwd(d2, first, second, num_bins):
  low, u = _histogram_bins(d2, num_bins)
  bins = jnp.arange(num_bins + 1)
  pulse = (jnp.where(low[..., None] == bins, jax.nn.relu(1.0 - jnp.abs(u))[..., None], 0.0)
           + jnp.where(low[..., None] + 1 == bins,
                       jax.nn.relu(1.0 - jnp.abs(u - 1.0))[..., None], 0.0))  # [B, N, L+1]
  hists = tuple(jnp.sum(jnp.where(m[..., None], pulse, 0.0), axis=1) for m in (first, second))
  return hists, (low, u, first, second)


def _soft_histograms_bwd(num_bins, residuals, g):
  low, u, first, second = residuals

  def pick(table, index):   # [B, L+1] at [B, N] -> [B, N]
    out = jnp.zeros(index.shape, table.dtype)
    for b in range(num_bins + 1):
      out = jnp.where(index == b, table[:, b:b + 1], out)
    return out

  def cotangent(index):     # both histograms' cotangents of each pair's bin ``index``
    return jnp.where(first, pick(g[0], index), 0.0) + jnp.where(second, pick(g[1], index), 0.0)

  slope_low = jnp.where(jnp.abs(u) < 1.0, -jnp.sign(u), 0.0)
  slope_high = jnp.where(jnp.abs(u - 1.0) < 1.0, -jnp.sign(u - 1.0), 0.0)
  dd2 = (cotangent(low) * slope_low + cotangent(low + 1) * slope_high) * (num_bins / 4.0)
  return dd2, None, None


soft_histograms.defvjp(_soft_histograms_fwd, _soft_histograms_bwd)


def _weighted_mean(logw: jax.Array, x: jax.Array, sel: jax.Array, eps: jax.Array) -> jax.Array:
  """``sum_j w_j x_j / (sum_j w_j + eps)`` per row over ``sel``, ``w = e^{logw}``: ``[B, N]``,
  ``eps [B]`` -> ``[B]``. The weights are shifted by the row's largest positive exponent
  (``eps`` with them), so a large temperature cannot overflow ``exp``; equal otherwise."""
  shift = jax.lax.stop_gradient(jnp.maximum(
      jnp.max(jnp.where(sel, logw, 0.0), axis=1, keepdims=True), 0.0))        # [B, 1]
  w = jnp.where(sel, jnp.exp(jnp.where(sel, logw, 0.0) - shift), 0.0)
  return jnp.sum(w * x, axis=1) / (jnp.sum(w, axis=1) + eps * jnp.exp(-shift[:, 0]))


@register("ranked_list", references=True)
def ranked_list(*, margin: float = 0.4, alpha: float = 1.2, imbalance: float = 0.5,
                tp: float = 0.0, tn: float = 10.0):
  """Ranked list loss (Wang et al., CVPR 2019, eqs. 3-9) on Euclidean distances of unit
  embeddings, per anchor.

  Positives farther than ``alpha - margin`` and negatives closer than ``alpha`` are mined;
  ``L_P = sum w_p (d_p - (alpha - margin)) / sum w_p`` with ``w_p = e^{tp (d_p - (alpha -
  margin))}``, ``L_N = sum w_n (alpha - d_n) / sum w_n`` with ``w_n = e^{tn (alpha - d_n)}``,
  ``L = (1 - imbalance) L_P + imbalance L_N``, averaged over all anchors. As PML, the weights are
  not detached and each normaliser adds ``1e-5`` per reference. Defaults: the paper's ``m =
  0.4``, ``alpha = 1.2``, ``T_n = 10``, ``T_p = 0`` (RLL-Simpler), ``lambda = 0.5``.

  Args:
    margin: ``m``, default 0.4.
    alpha: the negatives' boundary, default 1.2.
    imbalance: ``lambda`` in ``[0, 1]``, default 0.5.
    tp: positive temperature, default 0.
    tn: negative temperature, default 10.

  Returns:
    ``(init, apply)``; use ``make('ranked_list', ...)``.
  """
  margin = hparams.real("margin", margin)
  alpha = hparams.real("alpha", alpha)
  imbalance = hparams.number("imbalance", imbalance, positive=False)
  if imbalance > 1:
    raise ValueError(f"imbalance={imbalance} must lie in [0, 1].")
  tp = hparams.real("tp", tp)
  tn = hparams.real("tn", tn)

  def terms(b):
    pos, neg = b.pos, b.neg

    def term_fn(x):
      d = jnp.sqrt(jnp.maximum(sim.squared_distance(x, kind="cosine"), MIN_SQ_DISTANCE))
      p_sel = pos & (d > alpha - margin)
      n_sel = neg & (d < alpha)
      # PML's 1e-5 per column of the anchor's row (the batch, itself included): counted over
      # the references the anchor is compared with, so that empty or masked slots of a
      # reference set (cross-batch memory) add nothing.
      eps = RLL_WEIGHT_EPS * (1.0 + jnp.sum(pos | neg, axis=1, dtype=jnp.float32))
      l_p = _weighted_mean(tp * (d - (alpha - margin)), d - (alpha - margin), p_sel, eps)
      l_n = _weighted_mean(tn * (alpha - d), alpha - d, n_sel, eps)
      return (1.0 - imbalance) * l_p + imbalance * l_n

    return _common.PairTerms(term_fn, pos | neg, None, "batch")

  return _common.pair_objective(terms, name="ranked_list")


@register("histogram")
def histogram(*, num_bins: int = 100):
  """Histogram loss (Ustinova & Lempitsky, NeurIPS 2016, eqs. 2-4): the probability that a
  random negative pair is more similar than a random positive pair, from soft histograms
  (linear interpolation into ``num_bins`` bins of width ``2 / num_bins`` over the cosine
  ``[-1, 1]``): ``L = sum_r p-_r Phi+_r``, ``Phi+`` the cumulative positive histogram.

  The pairs are PML's: the unordered positive pairs of classes that have a negative in the batch
  and the unordered negative pairs with an endpoint that has a positive (the pairs of the batch's
  triplets). No reference set. Default 100 bins (PML's).

  Args:
    num_bins: ``>= 1``, default 100.

  Returns:
    ``(init, apply)``; use ``make('histogram', ...)``.
  """
  num_bins = hparams.integer("num_bins", num_bins, minimum=1)
  delta = 2.0 / num_bins

  def density(x, mask):
    """float32 ``[num_bins + 1]``: the soft histogram of ``x`` over ``mask``, summing to 1."""
    r = jnp.clip(jnp.floor((jax.lax.stop_gradient(x) + 1.0) / delta), 0, num_bins - 1)
    a = (x + 1.0 - r * delta) / delta              # weight of bin r + 1
    b = ((r + 1.0) * delta - 1.0 - x) / delta      # weight of bin r
    r = r.astype(jnp.int32).ravel()
    hist = jnp.zeros(num_bins + 1, jnp.float32).at[r + 1].add(jnp.where(mask, a, 0.0).ravel())
    hist = hist.at[r].add(jnp.where(mask, b, 0.0).ravel())
    return hist / jnp.maximum(jnp.sum(mask), 1)

  def terms(batch):
    pos, neg = batch.pos, batch.neg
    b = pos.shape[0]
    upper = jnp.arange(b)[:, None] < jnp.arange(b)[None, :]
    has_pos, has_neg = jnp.any(pos, axis=1), jnp.any(neg, axis=1)
    pp = pos & upper & has_neg[:, None]
    nn = neg & upper & (has_pos[:, None] | has_pos[None, :])
    some = jnp.any(pp) & jnp.any(nn)

    def loss_fn(x):
      return jnp.where(some, jnp.sum(density(x, nn) * jnp.cumsum(density(x, pp))), 0.0)

    entering = (pp | nn) & some
    return _common.PairTerms(loss_fn, entering | entering.T, loss=loss_fn(batch.s))

  return _common.pair_objective(terms, name="histogram", references=False,
                                no_references_why="pools the pairs of the batch")


@register("snr_contrastive", references=True)
def snr_contrastive(*, pos_margin: float = 0.0, neg_margin: float = 1.0):
  """Contrastive loss on the signal-to-noise-ratio distance (Yuan et al., CVPR 2019, eq. 6).

  ``d(a, j) = var(x_j - x_a) / var(x_a)`` over the dimensions of the L2-normalised embeddings;
  ``[d - pos_margin]_+`` on positive pairs, ``[neg_margin - d]_+`` on negative pairs, each
  averaged over its non-zero terms and summed (PML's ``AvgNonZeroReducer``). The paper's
  regulariser on the embeddings' mean is not included (PML neither). An anchor with
  ``var(x_a) = 0`` (a zero or constant embedding) has no distance and is left out (PML's loss
  is infinite there). Defaults ``pos_margin = 0``, ``neg_margin = 1`` (PML's).

  Args:
    pos_margin: default 0.
    neg_margin: default 1.

  Returns:
    ``(init, apply)``; use ``make('snr_contrastive', ...)``.
  """
  pos_margin = hparams.real("pos_margin", pos_margin)
  neg_margin = hparams.real("neg_margin", neg_margin)

  def snr(x, means, anchor_var, ref_has_var, dim):
    """``[B, N]`` SNR distances from cosines ``x`` of unit anchors and unit or zero references
    (``|x_a - x_j|^2 = 2 - 2S``); exactly 1 for a reference without variance (a zero or
    constant one: ``var(x_a - c) / var(x_a)``), which the cosine form rounds to either side of
    the default ``neg_margin`` (``ref_has_var`` bool ``[N]``)."""
    diff_var = (2.0 - 2.0 * x) / dim - jnp.square(means[0][:, None] - means[1][None, :])
    return jnp.where(ref_has_var[None, :], diff_var / anchor_var[:, None], 1.0)

  def terms(d, pos, neg):
    return jnp.where(pos, jax.nn.relu(d - pos_margin), jax.nn.relu(neg_margin - d))

  def pair_terms(b):
    unit = sim.l2_normalize(b.embeddings.astype(jnp.float32))
    ref = unit if b.references is None else sim.l2_normalize(
        jnp.asarray(b.references[0]).astype(jnp.float32))
    means = (jnp.mean(unit, axis=1), jnp.mean(ref, axis=1))
    row_var = lambda v, m: jnp.mean(jnp.square(v - m[:, None]), axis=1)
    anchor_var = row_var(unit, means[0])
    ref_has_var = (anchor_var if b.references is None else row_var(ref, means[1])) \
        > SNR_MIN_VARIANCE
    has_var = anchor_var > SNR_MIN_VARIANCE
    pos, neg = b.pos & has_var[:, None], b.neg & has_var[:, None]
    anchor_var = jnp.where(has_var, anchor_var, 1.0)
    dim = unit.shape[1]
    values = terms(snr(b.s, means, anchor_var, ref_has_var, dim), pos, neg)
    loss = losses.reduce(values, pos, "nonzero") + losses.reduce(values, neg, "nonzero")
    fixed = jax.lax.stop_gradient((means, anchor_var, ref_has_var))
    return _common.PairTerms(lambda x: terms(snr(x, *fixed, dim), pos, neg), pos | neg,
                             loss=loss)

  return _common.pair_objective(pair_terms, name="snr_contrastive")


def _ranked_candidates(b, include_query: bool):
  """``(ranked, candidates, valid)`` of the batch-ranking objectives (``smooth_ap``, ``pnp``):
  bool ``[B, B]`` the items whose rank each anchor's loss scores (its positives, and itself
  with ``include_query``), the anchor's retrieval set (every other item, and itself with
  ``include_query``), and bool ``[B]`` the anchors with a positive (the others are left out,
  as PML leaves them out)."""
  eye = jnp.eye(b.pos.shape[0], dtype=bool)
  valid = jnp.any(b.pos, axis=1)
  ranked = ((b.pos | eye) & valid[:, None]) if include_query else b.pos
  candidates = (b.pos | b.neg | eye) if include_query else (b.pos | b.neg)
  return ranked, candidates, valid


RANK_CHUNK_ELEMENTS = 1 << 24   # smooth_ap / pnp: [anchors, P, B] chunks of at most this size


def by_anchor_chunks(row_fn, width: int, *rows: jax.Array) -> jax.Array:
  """``row_fn(*rows) -> [A]`` over all anchors, each of ``rows`` ``[B, ...]`` cut into
  chunks of ``A`` anchors whose ``[A, width, N]`` arrays (``N = rows[0].shape[1]``) hold at
  most ``RANK_CHUNK_ELEMENTS`` (read when traced): the whole batch at once when it fits, else a
  ``lax.map`` over chunks, so memory stays ``O(B N)``. The backward pass recomputes
  ``row_fn`` from its inputs (``jax.checkpoint``): nothing ``[A, width, N]`` is kept between
  the passes, which also spares the other branches of :func:`by_ranked_items`' ``lax.switch``
  from carrying (zero-filled) buffers of that size. The same values; gradients equal to
  rounding."""
  b = rows[0].shape[0]
  chunk = max(1, RANK_CHUNK_ELEMENTS // (width * rows[0].shape[1]))
  row_fn = jax.checkpoint(row_fn)
  if chunk >= b:
    return row_fn(*rows)
  steps = -(-b // chunk)
  pad = lambda a: jnp.pad(a, ((0, steps * chunk - b), (0, 0))).reshape(steps, chunk, -1)
  out = jax.lax.map(lambda r: row_fn(*r), tuple(map(pad, rows)))
  return out.reshape(-1)[:b]


def by_ranked_items(items_fn, x: jax.Array, ranked: jax.Array, *masks: jax.Array) -> jax.Array:
  """Per anchor, ``items_fn(x, idx, ok, *masks) -> [A]`` on its ranked items (``ranked``
  bool ``[B, N]``) compacted to ``idx``, ``ok`` ``[A, P]`` (``mining._common.compact_rows``):
  ``P`` the smallest of 8, 16, 32, 64 that holds the batch's largest count (chosen at run
  time), so the work is ``O(B P N)`` instead of ``B N^2``; larger counts take every item
  (``P = N``). Chunked over anchors by :func:`by_anchor_chunks`; ``x`` and ``masks``
  ``[B, N]``."""
  n = x.shape[1]

  def compacted(size, x, ranked, *masks):
    idx, ok = mining_common.compact_rows(ranked, size)
    return by_anchor_chunks(items_fn, size, x, idx, ok, *masks)

  def every_item(x, ranked, *masks):
    idx = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), x.shape)
    return by_anchor_chunks(items_fn, n, x, idx, ranked, *masks)

  return mining_common.by_row_count(ranked, compacted, every_item, x, ranked, *masks)


def _ahead(x: jax.Array, idx: jax.Array, temperature: float) -> tuple[jax.Array, jax.Array]:
  """``(ahead, other)`` of anchor rows ``x [A, N]`` and their items ``idx [A, P]``:
  ``ahead[a, k, j] = sigmoid((S_aj - S_ap) / T)`` for ``p = idx[a, k]``, how far item ``j``
  is ranked ahead of ``p`` in anchor ``a``'s list, and ``other = j != p``; both
  ``[A, P, N]``."""
  s_p = jnp.take_along_axis(x, idx, axis=1)                               # [A, P]
  ahead = jax.nn.sigmoid((x[:, None, :] - s_p[:, :, None]) / temperature)
  other = idx[:, :, None] != jnp.arange(x.shape[1], dtype=jnp.int32)[None, None, :]
  return ahead, other


@register("smooth_ap")
def smooth_ap(*, temperature: float = 0.01, include_query: bool = True):
  """Smooth-AP (Brown et al., ECCV 2020): ``1 - AP`` per anchor, its ranks smoothed
  by a sigmoid of temperature ``T``, averaged over the anchors.

  ``AP_a = (1 / |P_a|) sum_{p in P_a} (1 + sum_{j in P_a, j != p} G(S_aj - S_ap)) /
  (1 + sum_{j in Omega_a, j != p} G(S_aj - S_ap))``, ``G(t) = sigmoid(t / T)``, ``P_a`` the
  anchor's positives and ``Omega_a`` its retrieval set; anchors without a positive are left
  out. With ``include_query`` (default) the anchor is one of its own positives and in its own
  retrieval set (its self-similarity 1 ranks it first), as PML's implementation, adapted from
  the released code, builds them; ``False`` leaves the anchor out of both, as the paper
  defines the retrieval set. Any batch composition: the released code and PML need classes of
  equal size in contiguous blocks, and PML's ``SmoothAPLoss`` moreover cuts the batch into the
  right class blocks only when there are as many classes as examples per class (there the two
  agree). No reference set; ``O(B^2 P)`` time for ``P`` ranked items per anchor, ``O(B^2)``
  memory (:func:`by_ranked_items`). Default ``T = 0.01`` (the paper's and PML's).

  Args:
    temperature: ``T > 0``, default 0.01.
    include_query: count the anchor among its positives and its retrieval set, default True.

  Returns:
    ``(init, apply)``; use ``make('smooth_ap', ...)``.
  """
  temperature = hparams.number("temperature", temperature, positive=True)
  include_query = hparams.flag("include_query", include_query)

  def items_fn(x, idx, ok, ranked, candidates):     # [A, N], [A, P] -> 1 - AP [A]
    ahead, other = _ahead(x, idx, temperature)                          # [A, P, N]
    rank_pos = 1.0 + jnp.sum(jnp.where(ranked[:, None, :] & other, ahead, 0.0), axis=2)
    rank_all = 1.0 + jnp.sum(jnp.where(candidates[:, None, :] & other, ahead, 0.0), axis=2)
    ap = jnp.sum(jnp.where(ok, rank_pos / rank_all, 0.0), axis=1)
    return 1.0 - ap / jnp.maximum(jnp.sum(ok, axis=1, dtype=jnp.float32), 1.0)

  def terms(b):
    ranked, candidates, valid = _ranked_candidates(b, include_query)
    term_fn = lambda x: jnp.where(
        valid, by_ranked_items(items_fn, x, ranked, ranked, candidates), 0.0)
    return _common.PairTerms(term_fn, candidates & valid[:, None], valid, "mean")

  return _common.pair_objective(terms, name="smooth_ap", references=False,
                                no_references_why="ranks each anchor's batch")


PNP_VARIANTS = ("O", "Ds", "Dq", "Iu", "Ib")


@register("pnp")
def pnp(*, variant: str = "O", temperature: float = 0.01, alpha: float = 1.0, b: float = 2.0,
        include_query: bool = True):
  """PNP loss (Li et al., AAAI 2022): penalises only the negatives ranked before each
  positive. Per positive ``p`` of anchor ``a``, ``R_ap = sum_{n in N_a} sigmoid((S_an - S_ap) /
  T)`` (the smoothed count of negatives ahead of it); the loss averages ``f(R_ap)`` over the
  anchor's positives, then over the anchors.

  ``variant`` picks ``f``: ``'O'`` ``R`` (PNP-O), ``'Ds'`` ``log(1 + R)``, ``'Dq'`` ``1 - 1 / (1
  + R)^alpha``, ``'Iu'`` ``(1 + R) log(1 + R)``, ``'Ib'`` ``(b R - log(1 + b R)) / b^2`` (the
  paper's decreasing and increasing weightings PNP-D_s, PNP-D_q, PNP-I_u, PNP-I_b). Anchors
  without a positive are left out. With ``include_query`` (default, as PML) the anchor is one
  of its own positives (``S_aa = 1``: few negatives ahead of it); ``False`` ranks its positives
  only. No reference set; ``O(B^2 P)`` time for ``P`` ranked items per anchor, ``O(B^2)``
  memory (:func:`by_ranked_items`).
  Defaults PML's: ``'O'``, ``T = 0.01``, ``alpha = 1``, ``b = 2``.

  Args:
    variant: one of ``PNP_VARIANTS``, default ``'O'``.
    temperature: ``T > 0`` (PML's ``anneal``), default 0.01.
    alpha: the exponent of ``'Dq'`` (``> 0``), default 1.
    b: the slope of ``'Ib'`` (``> 0``), default 2.
    include_query: count the anchor among its positives, default True.

  Returns:
    ``(init, apply)``; use ``make('pnp', ...)``.
  """
  variant = hparams.choice("variant", variant, PNP_VARIANTS)
  temperature = hparams.number("temperature", temperature, positive=True)
  alpha = hparams.number("alpha", alpha, positive=True)
  slope = hparams.number("b", b, positive=True)
  include_query = hparams.flag("include_query", include_query)
  weigh = {"O": lambda r: r, "Ds": jnp.log1p, "Dq": lambda r: 1.0 - (1.0 + r) ** -alpha,
           "Iu": lambda r: (1.0 + r) * jnp.log1p(r),
           "Ib": lambda r: (slope * r - jnp.log1p(slope * r)) / slope ** 2}[variant]

  def items_fn(x, idx, ok, neg):          # [A, N], [A, P] -> mean f(R) [A]
    ahead = jnp.sum(jnp.where(neg[:, None, :], _ahead(x, idx, temperature)[0], 0.0), axis=2)
    per = jnp.sum(jnp.where(ok, weigh(ahead), 0.0), axis=1)
    return per / jnp.maximum(jnp.sum(ok, axis=1, dtype=jnp.float32), 1.0)

  def terms(batch):
    ranked, candidates, valid = _ranked_candidates(batch, include_query)
    term_fn = lambda x: jnp.where(valid, by_ranked_items(items_fn, x, ranked, batch.neg), 0.0)
    return _common.PairTerms(term_fn, candidates & valid[:, None], valid, "mean")

  return _common.pair_objective(terms, name="pnp", references=False,
                                no_references_why="ranks each anchor's batch")
