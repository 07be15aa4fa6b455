"""The triplet family: ``triplet``, ``trimmed_triplet`` and the margin loss ``margin``.

One term per selected (anchor, positive) pair with one negative (or all of the anchor's
negatives), selected by ``mining.select`` on distance scores ``-d^2`` or ``-d`` under
stop-gradient; hinge losses on distances ``d^2 = similarity.squared_distance(S)`` (``2 - 2S`` on
the unit sphere) or ``d = sqrt(d^2)``. A term is *active* when a hinge is open (``L > 0``; else
its gradient is exactly 0).

``negative='all'`` sums the hinge over all of an anchor's negatives per term without a sort:
each anchor's terms are compacted to ``[B, P]`` for the smallest static ``P`` in
``COMPACT_SIZES`` that holds the batch (run-time ``lax.switch``) and every term's sum is one
fused ``[B, P, N]`` pass (:func:`triplet_all_negatives`); batches with more terms per anchor
take the sorted ``losses.triplet_all_negatives``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax import losses
from dml_jax import mining
from dml_jax import similarity as sim
from dml_jax.mining import _common as mining_common
from dml_jax.objectives import _common
from dml_jax.objectives._registry import register

TRIPLET_SIMILARITIES = ("cosine", "neg_sq_euclidean")                 # kinds that define d^2
TRIPLET_DISTANCES = ("squared", "euclidean")     # hinge on d^2 (FaceNet, EPS) or d (label noise)
TRIPLET_MIN_SQ_DISTANCE = 1e-12                  # d = sqrt(max(d^2, this)) for 'euclidean'
MARGIN_BETA_MODES = ("class", "global", "fixed")
MARGIN_NEGATIVE_MODES = ("distance_weighted", "semihard", "semihard_random", "semihard_band",
                         "hard", "easy", "random")
MARGIN_REDUCTIONS = ("nonzero", "mean")          # of losses.REDUCTIONS
COMPACT_SIZES = mining_common.COMPACT_SIZES      # terms per anchor of the sort-free paths


@jax.custom_vjp
def _hinge_sums(x: jax.Array, dd: jax.Array) -> jax.Array:
  """``t[a, k] = sum_n [x[a, k] - dd[a, n]]_+`` for ``x [B, P]``, ``dd [B, N]`` -> ``[B, P]``.

  One fused ``[B, P, N]`` pass (``dd = +inf`` drops an entry). The gradient is that of the
  sorted form ``c x - sum_{dd < x} dd`` (``c = #{n : dd_an < x}``): ``dt/dx = c`` and
  ``dt/d dd_n = -[dd_n < x]``, 0 at ``dd_n = x`` (``jnp.maximum``'s own would be 1/2 there).
  """
  return _hinge_sums_value(x, dd)


def _hinge_sums_value(x: jax.Array, dd: jax.Array) -> jax.Array:
  """:func:`_hinge_sums` without its custom VJP: the forward rule calls this, so that
  forward-over-reverse differentiation (``jax.hessian``) can differentiate it."""
  return jnp.sum(jnp.maximum(x[:, :, None] - dd[:, None, :], 0.0), axis=2)


def _hinge_sums_fwd(x, dd):
  return _hinge_sums_value(x, dd), (x, dd)


def _hinge_sums_bwd(res, g):
  x, dd = res
  # c[a, k] = #{n : dd_an < x_ak}; sign(max(., 0)) keeps the reduction vectorised on XLA:CPU.
  count = jnp.sum(jnp.sign(jnp.maximum(x[:, :, None] - dd[:, None, :], 0.0)), axis=2)
  if x.shape[1] > max(COMPACT_SIZES):   # a reduction over P (slower on XLA:CPU)
    g_dd = -jnp.sum(jnp.where(dd[:, None, :] < x[:, :, None], g[:, :, None], 0.0), axis=1)
  else:                                 # P elementwise terms in one fused [B, N] pass
    g_dd = jnp.zeros_like(dd)
    for k in range(x.shape[1]):
      g_dd = g_dd - jnp.where(dd < x[:, k:k + 1], g[:, k:k + 1], 0.0)
  return g * count, g_dd


_hinge_sums.defvjp(_hinge_sums_fwd, _hinge_sums_bwd)


def triplet_all_negatives_compacted(d2: jax.Array, pairs: jax.Array, neg_mask: jax.Array, *,
                                    margin: float, reduction: str, size: int) -> jax.Array:
  """``losses.triplet_all_negatives(d2, d2, neg_mask)`` on the terms of ``pairs`` (at most
  ``size`` per row), without a sort: each row's pairs are compacted to ``[B, P]``
  (``mining._common.compact_rows``) and every term sums its hinges over all negatives in one
  fused ``[B, P, N]`` pass (:func:`_hinge_sums`), ``O(B P N)`` time, ``O(B (N + P))`` memory.

  ``L_ap = sum_{n in N_a} [d_ap^2 - d_an^2 + margin]_+`` (``'sum'``), divided by ``|N_a|``
  (``'mean'``); 0 off ``pairs``.

  Args:
    d2: float ``[B, N]`` squared distances (or ``d`` for the euclidean hinge).
    pairs: bool ``[B, N]`` the terms.
    neg_mask: bool ``[B, N]`` the negatives ``N_a``.
    margin: ``>= 0``.
    reduction: ``'mean'`` or ``'sum'`` over the negatives.
    size: static ``P``.

  Returns:
    float32 ``[B, N]`` per-term losses.
  """
  d2 = d2.astype(jnp.float32)
  n = d2.shape[1]
  pidx, ok = mining_common.compact_rows(pairs, size)                        # [B, P]
  x = jnp.take_along_axis(d2, jnp.minimum(pidx, n - 1), axis=1) + margin    # [B, P]
  dd = jnp.where(neg_mask, d2, jnp.inf)
  total = _hinge_sums(x, dd)                                                # [B, P]
  if reduction == "mean":
    total = total / jnp.maximum(jnp.sum(neg_mask, axis=1, dtype=jnp.float32), 1.0)[:, None]
  return mining_common.scatter_rows(jnp.where(ok, total, 0.0), pidx, ok, num=n)


def triplet_all_negatives(d2: jax.Array, pairs: jax.Array, neg_mask: jax.Array, *,
                          margin: float, reduction: str,
                          sizes: tuple[int, ...] = COMPACT_SIZES) -> jax.Array:
  """Per-term batch-all triplet losses (``losses.triplet_all_negatives``) on the terms of
  ``pairs``, by the smallest size ``P`` of ``sizes`` that holds every row's pairs
  (:func:`triplet_all_negatives_compacted`, ``O(B P N)``), chosen at run time
  (``lax.switch``, one trace), or the sorted ``losses.triplet_all_negatives`` when none does.

  Args:
    d2: float ``[B, N]`` squared distances (or ``d``).
    pairs: bool ``[B, N]`` the terms.
    neg_mask: bool ``[B, N]`` the negatives.
    margin: ``>= 0``.
    reduction: ``'mean'`` or ``'sum'``.
    sizes: ascending static sizes to try.

  Returns:
    float32 ``[B, N]``: the loss of every term of ``pairs``; 0 elsewhere on the compacted
    paths (the sorted path's value of ``(a, n)`` as a term elsewhere).
  """
  hparams.mode("reduction", reduction, losses.TRIPLET_REDUCTIONS)
  return mining_common.by_row_count(
      pairs, lambda p, d2, pairs, neg: triplet_all_negatives_compacted(
          d2, pairs, neg, margin=margin, reduction=reduction, size=p),
      lambda d2, pairs, neg: losses.triplet_all_negatives(
          d2, d2, neg, margin=margin, reduction=reduction),
      d2, pairs, neg_mask, sizes=sizes)


def _triplet_terms(b: _common.Batch, *, positive: str, negative: str, margin: float,
                   similarity: str, negative_reduction: str, distance: str = "squared"):
  """Per-term triplet losses of a batch (shared by ``triplet`` and ``trimmed_triplet``).

  ``distance='squared'`` uses ``d^2``; ``'euclidean'`` uses ``d = sqrt(d^2)`` (clipped at
  ``TRIPLET_MIN_SQ_DISTANCE`` below, so identical points have a zero, not infinite, gradient).
  Mining runs on ``-d`` (or ``-d^2``), so ``'semihard_random'``'s margin is in the same units
  as the loss; ``'distance_weighted'`` always sees ``-d^2`` (its own definition) and
  ``'semihard_band'`` always ``-d`` on unsquared distances (Roth et al.'s miner, whose band
  ``d_ap < d_an < d_ap + margin`` uses the loss's margin on plain distances even though their
  hinge is on ``d^2``).

  Returns:
    ``(terms, valid, s, s_an)``: float32 ``[B, N]`` per-term losses, bool ``[B, N]`` valid terms,
    the similarity ``S [B, N]`` (``N = B`` without ``references``) and each term's ``S_an``
    (``[B, N]`` for ``positive='all'``;
    ``[B, 1]`` for a single positive, or the mean over the anchor's negatives for
    ``negative='all'``).
  """
  s, pos_mask, neg_mask = b.s, b.pos, b.neg
  d2 = sim.squared_distance(s, kind=similarity)
  d = d2 if distance == "squared" else jnp.sqrt(jnp.maximum(d2, TRIPLET_MIN_SQ_DISTANCE))
  if negative == "distance_weighted":
    mined = d2
  elif negative == "semihard_band" and distance == "squared":
    mined = jnp.sqrt(jnp.maximum(d2, TRIPLET_MIN_SQ_DISTANCE))
  else:
    mined = d
  score = -jax.lax.stop_gradient(mined)
  sel = mining.select(score, pos_mask, neg_mask, positive=positive,
                      negative=negative, margin=margin, key=b.rng, dim=b.embeddings.shape[1])
  if negative == "all":
    if positive == "all":
      terms = triplet_all_negatives(d, sel.pairs, sel.negatives, margin=margin,
                                    reduction=negative_reduction)
    else:   # at most one term per anchor
      terms = triplet_all_negatives_compacted(d, sel.pairs, sel.negatives, margin=margin,
                                              reduction=negative_reduction, size=1)
    s_an = _common.row_mean(s, sel.negatives)[:, None]
  else:
    d_an = _common.negative_of_term(d, sel, positive=positive)
    terms = losses.triplet(d, d_an, margin=margin)
    s_an = _common.negative_of_term(s, sel, positive=positive)
  return terms, sel.valid, s, s_an


def _check_triplet_hparams(*, positive, negative, margin, similarity, negative_reduction,
                           distance="squared"):
  """Validates the triplet hyper-parameters; returns ``margin`` as a float."""
  hparams.choice("distance", distance, TRIPLET_DISTANCES)
  hparams.choice("positive", positive, mining.POSITIVE_MODES)
  hparams.choice("negative", negative, mining.NEGATIVE_MODES)
  margin = hparams.number("margin", margin, positive=False)
  hparams.choice("negative_reduction", negative_reduction, losses.TRIPLET_REDUCTIONS)
  if negative == "distance_weighted" and similarity != "cosine":
    raise ValueError("negative='distance_weighted' weights distances on the unit sphere; it "
                     f"needs similarity='cosine', got {similarity!r}.")
  return margin


@register("triplet", references=True, randomness=True)
def triplet(*, positive: str = "random", negative: str = "semihard", margin: float = 0.2,
            similarity: str = "cosine", negative_reduction: str = "mean",
            distance: str = "squared"):
  """Triplet margin loss on squared distances (FaceNet; EPS paper §4.3 with EPS positives).

  ``distance='euclidean'`` puts the hinge on plain distances instead,
  ``[d_ap - d_an + margin]_+`` (the label-noise paper's eq. 3, ``d = ||f_i - f_j||``); all
  ``d^2`` below then read ``d``.

  One negative per term: ``L = [d_ap^2 - d_an^2 + margin]_+`` with
  ``d^2 = similarity.squared_distance(S)`` (``2 - 2S`` for cosine, ``-S`` for
  ``'neg_sq_euclidean'``). Mining runs on the score ``-d^2``, so ``'semihard'`` is the hardest
  negative with ``d_an^2 >= d_ap^2`` (term dropped if none) and ``'semihard_random'`` is uniform
  over the negatives with ``d_ap^2 - d_an^2 + margin > 0`` (label-noise paper eq. 28; it
  includes negatives closer than the positive). ``'semihard_band'`` is Roth et al.'s semi-hard
  miner (the framework the EPS paper used): uniform over the band
  ``d_ap < d_an < d_ap + margin`` on *unsquared* distances ``d = sqrt(d^2)`` whatever
  ``distance`` is (their code compares plain distances with the loss's margin), and uniform
  over all the anchor's negatives when the band is empty, so every anchor with a positive keeps
  its term. ``negative='all'``: the mean (or sum, see ``negative_reduction``) of the hinge over
  all the anchor's negatives.
  ``'distance_weighted'``: Wu et al.'s sampling ``Pr(n) ~ q(d_an)^-1`` (``mining``), with
  ``D`` the embedding dimension and the sampler's defaults (cutoff 0.5, weight 0 from
  ``d = 1.4``, uniform over the negatives when no weight is left); cosine only.

  Variants: the default is random-positive semi-hard triplet; EPS = ``positive='easy'``
  (EPS paper §5.2.2: EPS + semi-hard); EPS as run in Roth et al.'s framework =
  ``positive='easy', negative='semihard_band'``.

  Args:
    positive: ``'random'`` (default), ``'easy'``, ``'hard'``, ``'all'``.
    negative: ``'semihard'`` (default), ``'semihard_random'``, ``'semihard_band'``, ``'hard'``,
      ``'easy'``, ``'random'``, ``'all'``, ``'distance_weighted'``.
    margin: ``>= 0`` in the units of the hinge (``d^2``, or ``d`` for ``'euclidean'``), default
      0.2; also the band width of ``'semihard_band'`` (on ``d``).
    similarity: ``'cosine'`` (default) or ``'neg_sq_euclidean'`` (``'dot'`` defines no distance).
    negative_reduction: ``negative='all'`` only: ``'mean'`` (default, over all the anchor's
      negatives, zero hinges included) or ``'sum'``.
    distance: ``'squared'`` (default) or ``'euclidean'``.

  Returns:
    ``(init, apply)``; use ``make('triplet', ...)``.
  """
  margin = _check_triplet_hparams(positive=positive, negative=negative, margin=margin,
                                  similarity=similarity, negative_reduction=negative_reduction,
                                  distance=distance)

  def body(b):
    terms, valid, s, s_an = _triplet_terms(
        b, positive=positive, negative=negative, margin=margin, similarity=similarity,
        negative_reduction=negative_reduction, distance=distance)
    loss = losses.reduce(terms, valid, "mean")
    return loss, _common.aux(valid, terms > 0, s, s_an)

  return _common.no_params, _common.batch_objective(
      body, name="triplet", similarity=similarity, kinds=TRIPLET_SIMILARITIES,
      rng_reason=_common.stochastic_reason(positive=positive, negative=negative))


@register("trimmed_triplet", references=True, randomness=True)
def trimmed_triplet(*, positive: str = "random", negative: str = "semihard",
                    margin: float = 0.2, similarity: str = "cosine",
                    negative_reduction: str = "mean", keep_fraction: float = 0.9,
                    distance: str = "squared"):
  """Trimmed triplet loss: back-propagate only the easiest terms (a label-noise baseline).

  The triplet objective (:func:`triplet`, same selections and arguments) where only the
  ``k = ceil(keep_fraction * n_valid)`` valid terms with the *lowest* current loss enter the
  mean (``mining.keep_easiest``, under stop-gradient; ties by index): the trimmed loss of
  Shen & Sanghavi (2019) as tested in the EPS paper (App. C, Fig. 6, "on random sampled
  triplets"; the default negative here is ``'semihard'``, ``negative='random'`` is that
  reading), which drops the terms most likely to come from noisy labels. ``keep_fraction=1``
  is the triplet loss. ``L = sum_{kept} l_t / k``.

  ``aux``: ``valid_fraction`` counts anchors with a valid term before trimming;
  ``active_fraction``, ``mean_s_ap``, ``mean_s_an`` are over the kept terms; ``kept_fraction``
  is ``k / n_valid`` (0 when nothing is valid).

  Args:
    positive: ``'random'`` (default), ``'easy'``, ``'hard'``, ``'all'``.
    negative: ``'semihard'`` (default) or any other triplet mode.
    margin: ``>= 0``, default 0.2 (squared-distance units).
    similarity: ``'cosine'`` (default) or ``'neg_sq_euclidean'``.
    negative_reduction: ``negative='all'`` only, ``'mean'`` (default) or ``'sum'``.
    keep_fraction: in ``(0, 1]``, default 0.9 (our choice: the EPS paper sweeps the trimming
      percentage and reports no single value).
    distance: ``'squared'`` (default) or ``'euclidean'`` (as :func:`triplet`).

  Returns:
    ``(init, apply)``; use ``make('trimmed_triplet', ...)``.
  """
  margin = _check_triplet_hparams(positive=positive, negative=negative, margin=margin,
                                  similarity=similarity, negative_reduction=negative_reduction,
                                  distance=distance)
  keep_fraction = hparams.fraction("keep_fraction", keep_fraction)

  def body(b):
    terms, valid, s, s_an = _triplet_terms(
        b, positive=positive, negative=negative, margin=margin, similarity=similarity,
        negative_reduction=negative_reduction, distance=distance)
    if positive == "all":
      kept = mining.keep_easiest(terms, valid, keep_fraction=keep_fraction)
    else:
      # At most one valid term per row: rank the B row terms (same order: row-major flat
      # index = row index) instead of all B^2 entries.
      row_terms = jnp.sum(jnp.where(valid, terms, 0.0), axis=1)           # [B]
      row_kept = mining.keep_easiest(row_terms, jnp.any(valid, axis=1),
                                     keep_fraction=keep_fraction)
      kept = valid & row_kept[:, None]
    loss = losses.reduce(terms, kept, "mean")
    aux = _common.aux(kept, terms > 0, s, s_an)
    aux["valid_fraction"] = jnp.mean(jnp.any(valid, axis=1).astype(jnp.float32))
    aux["kept_fraction"] = (jnp.sum(kept, dtype=jnp.float32)
                            / jnp.maximum(jnp.sum(valid, dtype=jnp.float32), 1.0))
    return loss, aux

  return _common.no_params, _common.batch_objective(
      body, name="trimmed_triplet", similarity=similarity, kinds=TRIPLET_SIMILARITIES,
      rng_reason=_common.stochastic_reason(positive=positive, negative=negative))


@register("margin", references=True, parameters=True, randomness=True)
def margin(*, positive: str = "random", negative: str = "distance_weighted",
           alpha: float = 0.2, beta: str = "class", beta0: float = 1.2, nu: float = 0.0,
           similarity: str = "cosine", cutoff: float = 0.5, nonzero_loss_cutoff: float = 1.4,
           fallback: str = "negatives", reduction: str = "nonzero"):
  """Margin loss with distance-weighted sampling (Wu et al. 2017; EPS paper §3, §5.2.2).

  Every valid term ``(a, p)`` with its negative ``n`` contributes two hinges on plain Euclidean
  distances ``d = sqrt(d^2 + 1e-8)`` (``d^2 = 2 - 2S`` for cosine, released code's ``1e-8``;
  Wu et al. and their code; the EPS paper's §3 writes the loss on the squared distance ``D``,
  but ``alpha = 0.2`` and ``beta0 = 1.2`` are Wu et al.'s values for the plain distance):
  ``[d_ap - beta_a + alpha]_+ + [beta_a - d_an + alpha]_+`` (``losses.margin``), with
  ``beta_a`` the learnable boundary of the anchor's class. The loss is

  ``L = (sum_terms (pos + neg) + nu sum_terms beta_a) / max(1, #non-zero hinges)``

  (``reduction='nonzero'``, the released code's normalisation, which there is 0/0 = NaN when
  no hinge is open; here 0), or divided by the number of hinges ``2 #valid`` (``'mean'``).
  ``nu`` is Wu et al.'s regulariser on ``beta`` (gradient ``nu`` per term pushes ``beta``
  down); the released code and Wu et al.'s experiments use ``nu = 0`` (default).

  Sampling: ``positive='random'`` (one uniform positive per anchor, the default),
  ``'easy'`` = EPS + distance-weighted (EPS paper §5.2.2), ``'all'`` = the released sampler
  (every (anchor, positive) pair, each with its own negative) and the label-noise paper's 1-1
  scheme (§5.2: "for each positive pair, 1 negative pair is chosen with 1 common end point";
  with ``negative='semihard_random'``, ``beta='fixed'``, ``beta0=1.4``).
  ``negative='distance_weighted'`` draws ``Pr(n | a) ~ q(d_an)^-1`` over the anchor's negatives
  with ``d_an < nonzero_loss_cutoff``, ``d`` clipped below at ``cutoff``
  (``mining.distance_weights``);
  ``fallback`` handles anchors with no weight left (``mining.distance_weighted_negatives``:
  ``'negatives'`` uniform over the negatives [default], ``'batch'`` the released code's
  uniform over the whole batch, ``'drop'``). ``nonzero_loss_cutoff=2`` (the sphere's
  diameter) switches the zero-weight cut-off off: Wu et al.'s sampler (and our default 1.4)
  gives weight 0 to negatives at ``d >= 1.4``, whose hinge is closed at initialisation; Roth et
  al.'s code, which the EPS paper ran, has that line commented out. The other negative modes
  mine on ``-d``;
  ``'semihard_random'`` is then the label-noise paper's random semi-hard (eq. 28) with the
  margin ``alpha`` in distance units, ``{n : d_ap - d_an + alpha > 0}``, and
  ``'semihard_band'`` Roth et al.'s band ``d_ap < d_an < d_ap + alpha`` (random negative when
  empty).

  ``beta``: ``'class'`` (default; Wu et al. / released code: one ``beta`` per class, params
  ``{'beta': float32 [num_classes]}``, every entry ``beta0``), ``'global'`` (one shared
  ``beta``, ``[1]``) or ``'fixed'`` (the constant ``beta0``, no params; the label-noise paper's
  marginal loss, there with ``beta0 = 1.4``). The learnable ``beta`` gets gradients
  ``dL/dbeta_c = (sum_{terms of class c} (-[pos > 0] + [neg > 0]) + nu #terms_c) / count``;
  the trainer gives it ``optimizer.objective_learning_rate`` (the released code: SGD with
  momentum 0.9 and learning rate 0.1, on a loss averaged over the batch). Labels must lie in
  ``[0, num_classes)``: checked when ``apply`` sees concrete labels; under ``jit`` an anchor
  with an out-of-range label gives a NaN loss instead of a silently clamped ``beta``.

  ``aux`` adds ``'mean_beta'`` (mean of the ``beta`` vector); ``active_fraction`` counts terms
  with either hinge open.

  Args:
    positive: ``'random'`` (default), ``'easy'`` (EPS), ``'hard'``, ``'all'`` (released code).
    negative: ``'distance_weighted'`` (default), ``'semihard'``, ``'semihard_random'``,
      ``'semihard_band'``, ``'hard'``, ``'easy'``, ``'random'``.
    alpha: the margin ``>= 0``, default 0.2.
    beta: ``'class'`` (default), ``'global'`` or ``'fixed'``.
    beta0: initial (or fixed) ``beta > 0``, default 1.2.
    nu: ``>= 0``, default 0 (must be 0 with ``beta='fixed'``).
    similarity: ``'cosine'`` (default) or ``'neg_sq_euclidean'`` (not with distance weighting).
    cutoff: distance-weighted lower clip of ``d``, default 0.5.
    nonzero_loss_cutoff: distance-weighted zero-weight distance, default 1.4 (= ``beta0 +
      alpha``, the distance beyond which a negative's hinge is closed at initialisation; Wu et
      al.); 2 = no cut-off (Roth et al.'s code, used by the EPS paper).
    fallback: ``'negatives'`` (default), ``'batch'`` (released code) or ``'drop'``.
    reduction: ``'nonzero'`` (default, released code) or ``'mean'``.

  Returns:
    ``(init, apply)``; use ``make('margin', ...)``.
  """
  hparams.choice("positive", positive, mining.POSITIVE_MODES)
  hparams.choice("negative", negative, MARGIN_NEGATIVE_MODES)
  alpha = hparams.number("alpha", alpha, positive=False)
  hparams.choice("beta", beta, MARGIN_BETA_MODES)
  beta0 = hparams.number("beta0", beta0, positive=True)
  nu = hparams.number("nu", nu, positive=False)
  if beta == "fixed" and nu:
    raise ValueError(f"nu={nu!r} regularises a learnable beta; with beta='fixed' use nu=0.")
  hparams.choice("fallback", fallback, mining.DW_FALLBACKS)
  mining.check_distance_weighted(dim=1, cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff,
                                 fallback=fallback)
  hparams.choice("reduction", reduction, MARGIN_REDUCTIONS)
  if negative == "distance_weighted" and similarity != "cosine":
    raise ValueError("negative='distance_weighted' weights distances on the unit sphere; it "
                     f"needs similarity='cosine', got {similarity!r}.")

  def init(rng, *, num_classes: int, dim: int) -> dict:
    """``{'beta': float32 [num_classes]}`` (``'class'``), ``[1]`` (``'global'``), ``{}``."""
    del rng
    num_classes = hparams.integer("num_classes", num_classes, minimum=1)
    hparams.integer("dim", dim, minimum=1)
    if beta == "fixed":
      return {}
    return {"beta": jnp.full((num_classes if beta == "class" else 1,), beta0, jnp.float32)}

  def beta_per_anchor(params, labels):
    """float32 ``[B]`` ``beta`` of each anchor (NaN for an out-of-range label) and the vector."""
    if beta == "fixed":
      return jnp.full(labels.shape, beta0, jnp.float32), jnp.full((1,), beta0, jnp.float32)
    table = _common.param(params, "beta", name="margin").astype(jnp.float32)
    want = "[num_classes]" if beta == "class" else "[1]"
    if table.ndim != 1 or (beta == "global" and table.shape != (1,)):
      raise ValueError(f"params['beta'] must have shape {want} for beta={beta!r}, "
                       f"got {table.shape}.")
    if beta == "global":
      return jnp.broadcast_to(table[0], labels.shape), table
    ok = _common.check_label_range(labels, table.shape[0], what="class betas")
    return jnp.where(ok, table[jnp.clip(labels, 0, table.shape[0] - 1)], jnp.nan), table

  def body(b):
    beta_a, table = beta_per_anchor(b.params, b.labels)               # [B]
    s, pos_mask, neg_mask = b.s, b.pos, b.neg
    d2 = sim.squared_distance(s, kind=similarity)                     # float32 [B, N]
    d = losses.euclidean_distance(d2)
    score = -d2 if negative == "distance_weighted" else -d
    sel = mining.select(jax.lax.stop_gradient(score), pos_mask, neg_mask, positive=positive,
                        negative=negative, margin=alpha, key=b.rng, dim=b.embeddings.shape[1],
                        cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff,
                        fallback=fallback)
    valid = sel.valid
    d_an = _common.negative_of_term(d, sel, positive=positive)
    pos, neg = losses.margin(d, d_an, beta_a[:, None], alpha=alpha)   # [B, B] each
    if reduction == "nonzero":   # per open hinge
      hinges = (pos > 0).astype(jnp.float32) + (neg > 0).astype(jnp.float32)
    else:                        # 'mean': per hinge, two per term
      hinges = 2.0
    loss = losses.reduce(pos + neg + nu * beta_a[:, None], valid, reduction, counts=hinges)
    s_an = _common.negative_of_term(s, sel, positive=positive)
    aux = _common.aux(valid, (pos > 0) | (neg > 0), s, s_an)
    aux["mean_beta"] = jnp.mean(jax.lax.stop_gradient(table))
    return loss, aux

  return init, _common.batch_objective(
      body, name="margin", similarity=similarity, kinds=TRIPLET_SIMILARITIES,
      rng_reason=_common.stochastic_reason(positive=positive, negative=negative))
