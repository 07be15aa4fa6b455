"""Pure loss forms: per-term values from selected similarities or distances; reduction separate.

A *term* is one selected (anchor, positive) pair with its negative(s) (see ``mining``). Every
loss here maps arrays of ``S_ap`` / ``S_an`` (or squared distances) to per-term values of the same
shape, computed in float32 whatever the input dtype; :func:`masked_mean` reduces them over the
valid terms. The ``*_all_negatives`` forms take, for each anchor ``a``, its whole row of
negatives ``[B, N]`` with a mask, and return one value per term ``[B, P]`` in ``O(B (N + P))``
memory (``O(B N log N)`` for the triplet form), never ``[B, P, N]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dml_jax import hparams

# The reductions of per-term values to a loss (see :func:`reduce`); every objective reduces with
# it, and each family accepts the subset its papers use as a hyper-parameter.
REDUCTIONS = ("mean", "sum", "batch", "balanced", "nonzero")
TRIPLET_REDUCTIONS = ("mean", "sum")   # over an anchor's negatives (``triplet_all_negatives``)
_EMPTY_LOGSUMEXP = -1e30   # stand-in for log(0): finite, so gradients stay finite


def _f32(*xs):
  return tuple(jnp.asarray(x).astype(jnp.float32) for x in xs)


def masked_mean(values: jax.Array, valid: jax.Array) -> jax.Array:
  """Mean of ``values`` over the valid terms; exactly 0 (with zero gradient) when none is valid.

  ``mean = sum_t [valid_t] v_t / max(1, sum_t [valid_t])``. Invalid entries are selected away
  with ``where`` (their gradient is 0), so they must be finite — every loss here is.

  Args:
    values: float, any shape (e.g. per-term losses ``[B, P]``).
    valid: bool, the shape of ``values``.

  Returns:
    float32 scalar.
  """
  values, = _f32(values)
  count = jnp.sum(valid, dtype=jnp.float32)
  total = jnp.sum(jnp.where(valid, values, 0.0))
  return total / jnp.maximum(count, 1.0)


def reduce(values: jax.Array, mask, mode: str = "mean", *,
           counts: jax.Array | float | None = None) -> jax.Array:
  """Reduces per-term values to a loss over the terms in ``mask``; the one vocabulary of
  reductions of every objective (each family accepts a subset as a hyper-parameter).

  With ``m_t`` the mask and ``v_t`` the values:

  * ``'mean'``: ``sum_t [m_t] v_t / max(1, sum_t [m_t] c_t)``, ``c_t = counts`` (default 1: the
    mean over the valid terms, :func:`masked_mean`; e.g. ``counts=2`` per margin term = the
    mean over its two hinges);
  * ``'nonzero'``: the same with ``c_t`` the number of non-zero parts of the term (``counts``;
    default ``[v_t > 0]``): the mean over non-zero terms (released margin-loss code);
  * ``'sum'``: ``sum_t [m_t] v_t`` (e.g. values already weighted by a distribution);
  * ``'batch'``: ``sum_t [m_t] v_t / R`` with ``R = values.shape[0]`` the number of rows
    (anchors), valid or not (the multi-similarity and lifted-structure normalisation);
  * ``'balanced'``: ``mask`` is a tuple of group masks (e.g. ``(positive pairs, negative
    pairs)``): the sum of the groups' means (pair losses: the 1/n+ and 1/n- weights of Yi et
    al. 2014).

  Every mode gives exactly 0 with zero gradient when the mask is empty; ``mask=None`` takes
  every entry (e.g. values already multiplied by weights that vanish outside the candidates).
  ``counts`` and the mask carry no gradient (``counts`` is read under stop-gradient).

  Args:
    values: float, any shape (e.g. per-term ``[B, P]`` or per-anchor ``[B]``); finite where
      masked out.
    mask: bool, broadcastable to ``values``, or ``None`` (every entry); for ``'balanced'`` a
      tuple of such masks.
    mode: one of ``REDUCTIONS``.
    counts: ``'mean'`` / ``'nonzero'`` only: float, broadcastable to ``values``.

  Returns:
    float32 scalar.
  """
  hparams.mode("reduction", mode, REDUCTIONS)
  if mode == "balanced":
    if not isinstance(mask, tuple):
      raise ValueError("reduction 'balanced' needs a tuple of group masks, e.g. (pos, neg).")
    total = masked_mean(values, mask[0])
    for group in mask[1:]:
      total = total + masked_mean(values, group)
    return total
  if mask is None and mode in ("mean", "nonzero"):
    mask = jnp.ones(jnp.shape(values), bool)
  if mode == "mean" and counts is None:
    return masked_mean(values, mask)
  values, = _f32(values)
  total = jnp.sum(values if mask is None else jnp.where(mask, values, 0.0))
  if mode == "sum":
    return total
  if mode == "batch":
    return total / values.shape[0]
  if counts is None:   # 'nonzero'
    counts = (values > 0).astype(jnp.float32)
  count = jnp.sum(jnp.where(mask, jax.lax.stop_gradient(counts), 0.0))
  return total / jnp.maximum(count, 1.0)


def masked_logsumexp(x: jax.Array, mask: jax.Array, *, axis: int = -1):
  """Stable ``log sum_{j: mask_j} exp(x_j)`` along ``axis``, with finite gradients.

  Args:
    x: float array, e.g. ``[B, N]``.
    mask: bool, the shape of ``x``.
    axis: the reduced axis.

  Returns:
    ``(lse, nonempty)``: float32 with ``axis`` removed, and bool of that shape. An empty row gives
    ``lse = -1e30`` (a finite stand-in for ``-inf``) and zero gradient.
  """
  x, = _f32(x)
  m = jax.lax.stop_gradient(jnp.max(jnp.where(mask, x, -jnp.inf), axis=axis, keepdims=True))
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  e = jnp.where(mask, jnp.exp(jnp.where(mask, x, m) - m), 0.0)
  total = jnp.sum(e, axis=axis)
  nonempty = jnp.any(mask, axis=axis)
  lse = jnp.squeeze(m, axis) + jnp.log(jnp.where(nonempty, total, 1.0))
  return jnp.where(nonempty, lse, _EMPTY_LOGSUMEXP), nonempty


def second_order_logits(s_ap: jax.Array, s_an: jax.Array):
  """Logits of the 2nd-order triplet loss (2nd-order paper eq. 16).

  ``l_p = S_ap - S_ap^2 / 2``, ``l_n = S_an^2 / 2``; their gradients weight the positive by
  ``1 - S_ap`` and the negative by ``S_an`` (eqs. 13-15).

  Args:
    s_ap: float, any shape.
    s_an: float, any shape.

  Returns:
    ``(l_p, l_n)`` float32, the shapes of the inputs.
  """
  s_ap, s_an = _f32(s_ap, s_an)
  return s_ap - 0.5 * jnp.square(s_ap), 0.5 * jnp.square(s_an)


def nca(s_ap: jax.Array, s_an: jax.Array, *, temperature: float = 0.1) -> jax.Array:
  """1st-order NCA triplet loss with one negative (EPHN paper §4; 2nd-order paper eq. 1).

  ``L = -log(e^{S_ap/T} / (e^{S_ap/T} + e^{S_an/T})) = softplus((S_an - S_ap) / T)``.
  ``dL/dS_ap = -q / T``, ``dL/dS_an = q / T`` with ``q = sigmoid((S_an - S_ap) / T)``.

  Args:
    s_ap: float ``[...]`` anchor-positive similarities.
    s_an: float ``[...]`` anchor-negative similarities (broadcastable with ``s_ap``).
    temperature: ``T > 0`` (EPHN paper: 0.1).

  Returns:
    float32 per-term losses.
  """
  hparams.positive_if_static("temperature", temperature)
  s_ap, s_an = _f32(s_ap, s_an)
  return jax.nn.softplus((s_an - s_ap) / temperature)


def nca_2nd(s_ap: jax.Array, s_an: jax.Array, *, temperature: float = 1.0) -> jax.Array:
  """2nd-order triplet loss with one negative (2nd-order paper eq. 16), logits divided by ``T``.

  ``L = -log(e^{l_p/T} / (e^{l_p/T} + e^{l_n/T}))``, ``l_p = S_ap - S_ap^2/2``, ``l_n = S_an^2/2``.
  ``T = 1`` is the paper's exact formula; then ``dL/dS_ap = -(1 - S_ap) q`` and
  ``dL/dS_an = S_an q`` with ``q = e^{l_n} / (e^{l_p} + e^{l_n})`` the softmax weight of the
  negative. For general ``T`` both gradients are divided by ``T`` (and ``q`` uses ``l / T``).

  Args:
    s_ap: float ``[...]`` anchor-positive similarities.
    s_an: float ``[...]`` anchor-negative similarities (broadcastable with ``s_ap``).
    temperature: ``T > 0``; 1 reproduces eq. 16.

  Returns:
    float32 per-term losses.
  """
  hparams.positive_if_static("temperature", temperature)
  lp, ln = second_order_logits(s_ap, s_an)
  return jax.nn.softplus((ln - lp) / temperature)


def nca_all_negatives(s_ap: jax.Array, s_neg: jax.Array, neg_mask: jax.Array, *,
                      temperature: float = 0.1, order: int = 1) -> jax.Array:
  """NCA loss of every term against all of its anchor's negatives (N-pair / EP / batch-all).

  ``L_ap = -log(e^{l_p(S_ap)/T} / (e^{l_p(S_ap)/T} + sum_{n in N_a} e^{l_n(S_an)/T}))
  = softplus(LSE_a - l_p(S_ap)/T)`` with ``LSE_a = log sum_{n in N_a} e^{l_n(S_an)/T}``.
  ``order=1``: ``l_p(S) = l_n(S) = S`` (EPHN paper §4, L_EP); ``order=2``: the logits of
  :func:`second_order_logits` (2nd-order paper eq. 16 with a sum over negatives).
  An anchor without negatives gives 0.

  Args:
    s_ap: float ``[B, P]`` the similarity of each term's positive (e.g. ``S`` itself, ``P = N``).
    s_neg: float ``[B, N]`` the similarities of the anchors to the batch.
    neg_mask: bool ``[B, N]`` the negatives ``N_a`` of each anchor.
    temperature: ``T > 0``.
    order: 1 or 2.

  Returns:
    float32 ``[B, P]`` per-term losses.
  """
  hparams.positive_if_static("temperature", temperature)
  if order not in (1, 2):
    raise ValueError(f"order must be 1 or 2, got {order!r}.")
  s_ap, s_neg = _f32(s_ap, s_neg)
  if order == 1:
    lp, ln = s_ap, s_neg
  else:
    lp = s_ap - 0.5 * jnp.square(s_ap)
    ln = 0.5 * jnp.square(s_neg)
  lse, _ = masked_logsumexp(ln / temperature, neg_mask, axis=1)
  return jax.nn.softplus(lse[:, None] - lp / temperature)


def triplet(d2_ap: jax.Array, d2_an: jax.Array, *, margin: float = 0.2) -> jax.Array:
  """Triplet margin loss on squared distances (FaceNet form; EPHN paper §2.1).

  ``L = [d_ap^2 - d_an^2 + margin]_+``; on the unit sphere ``d^2 = 2 - 2 S``.

  Args:
    d2_ap: float ``[...]`` anchor-positive squared distances.
    d2_an: float ``[...]`` anchor-negative squared distances (broadcastable).
    margin: ``margin >= 0``, in squared-distance units.

  Returns:
    float32 per-term losses.
  """
  d2_ap, d2_an = _f32(d2_ap, d2_an)
  return jax.nn.relu(d2_ap - d2_an + margin)


def triplet_all_negatives(d2_ap: jax.Array, d2_neg: jax.Array, neg_mask: jax.Array, *,
                          margin: float = 0.2, reduction: str = "mean") -> jax.Array:
  """Triplet margin loss of every term against all of its anchor's negatives (batch-all form).

  ``reduction='sum'``: ``L_ap = sum_{n in N_a} [d_ap^2 - d_an^2 + margin]_+``;
  ``reduction='mean'``: that sum divided by ``|N_a|`` (all negatives, zero hinges included).
  With ``x = d_ap^2 + margin`` the active negatives are those with ``d_an^2 < x``, so
  ``sum = c x - sum_{d_an^2 < x} d_an^2`` where ``c`` is their count: each anchor's negative
  distances are sorted once (order under stop-gradient) and ``c`` and the prefix sum are found
  with ``searchsorted`` — ``O(B N log N)`` time, ``O(B (N + P))`` memory. An anchor without
  negatives gives 0.

  Args:
    d2_ap: float ``[B, P]`` each term's anchor-positive squared distance.
    d2_neg: float ``[B, N]`` squared distances of the anchors to the batch.
    neg_mask: bool ``[B, N]`` the negatives ``N_a``.
    margin: ``margin >= 0``.
    reduction: ``'mean'`` or ``'sum'`` over the negatives.

  Returns:
    float32 ``[B, P]`` per-term losses.
  """
  hparams.mode("reduction", reduction, TRIPLET_REDUCTIONS)
  d2_ap, d2_neg = _f32(d2_ap, d2_neg)
  b = d2_neg.shape[0]
  keys = jnp.where(neg_mask, jax.lax.stop_gradient(d2_neg), jnp.inf)
  order = jnp.argsort(keys, axis=1)
  sorted_keys = jnp.take_along_axis(keys, order, axis=1)
  sorted_vals = jnp.take_along_axis(jnp.where(neg_mask, d2_neg, 0.0), order, axis=1)
  prefix = jnp.concatenate([jnp.zeros((b, 1), jnp.float32), jnp.cumsum(sorted_vals, axis=1)],
                           axis=1)                                      # [B, N + 1]
  x = d2_ap + margin
  count = jax.vmap(lambda row, v: jnp.searchsorted(row, v, side="left"))(
      sorted_keys, jax.lax.stop_gradient(x))                             # [B, P]
  below = jnp.take_along_axis(prefix, count, axis=1)
  total = jnp.maximum(count.astype(jnp.float32) * x - below, 0.0)
  if reduction == "sum":
    return total
  n_neg = jnp.sum(neg_mask, axis=1, dtype=jnp.float32)
  return total / jnp.maximum(n_neg, 1.0)[:, None]


# --- Margin loss (Wu et al.) and proxy-NCA ---------------------------------------------------

MARGIN_DISTANCE_EPS = 1e-8        # released margin-loss code: d = sqrt(d^2 + 1e-8)
PROXY_DENOMINATORS = ("negatives", "all")


def euclidean_distance(d2: jax.Array, *, eps: float = MARGIN_DISTANCE_EPS) -> jax.Array:
  """Plain Euclidean distance from a squared one: ``d = sqrt(max(d^2, 0) + eps)``.

  ``eps > 0`` keeps the gradient finite at ``d^2 = 0`` (``dd/dd^2 <= 1 / (2 sqrt(eps))``); the
  default 1e-8 is the released margin-loss code's (Wu et al.).

  Args:
    d2: float, any shape (e.g. ``2 - 2 S`` on the unit sphere).
    eps: ``> 0``.

  Returns:
    float32, the shape of ``d2``.
  """
  hparams.positive_if_static("eps", eps)
  d2, = _f32(d2)
  return jnp.sqrt(jnp.maximum(d2, 0.0) + eps)


def margin(d_ap: jax.Array, d_an: jax.Array, beta: jax.Array, *, alpha: float = 0.2):
  """Margin loss of one (anchor, positive, negative) term (Wu et al. 2017 §5; EPS paper §3,
  which writes it on the squared distance; Wu et al.'s plain distance is used).

  Per pair ``[alpha + t_ij (d_ij - beta)]_+`` with ``t = +1`` for the positive and ``-1`` for the
  negative (label-noise paper eq. 2, there with a fixed ``beta``):

  ``pos = [d_ap - beta + alpha]_+``, ``neg = [beta - d_an + alpha]_+``, with plain (not squared)
  distances ``d`` and the boundary ``beta`` (``beta^(0) + beta^(class(a))`` in Wu et al.; here
  whatever the caller gathers, e.g. the anchor's class).

  Args:
    d_ap: float ``[...]`` anchor-positive distances.
    d_an: float ``[...]`` anchor-negative distances (broadcastable).
    beta: float ``[...]`` boundaries (broadcastable).
    alpha: the margin ``>= 0``, default 0.2.

  Returns:
    ``(pos, neg)``: float32 per-term hinge values of the broadcast shape.
  """
  d_ap, d_an, beta = _f32(d_ap, d_an, beta)
  return jax.nn.relu(d_ap - beta + alpha), jax.nn.relu(beta - d_an + alpha)


def proxy_nca(d2: jax.Array, class_mask: jax.Array, *, temperature: float = 1.0,
              denominator: str = "negatives") -> jax.Array:
  """Proxy-NCA loss per anchor (Movshovitz-Attias et al. 2017, "No fuss distance metric
  learning using proxies", the proxy NCA loss of §3, static proxy assignment).

  With ``d2[a, z] = |x_a - p_z|^2`` (normalised embeddings and proxies) and ``y = y_a``:
  ``'negatives'`` (the paper): ``L_a = -log(e^{-d2_ay/T} / sum_{z != y} e^{-d2_az/T})
  = d2_ay / T + LSE_{z != y}(-d2_az / T)`` (can be negative; ``dL/dd2_ay = 1/T`` always);
  ``'all'``: the denominator sums over every proxy, the true one included (softmax
  cross-entropy over ``-d2/T``, ``>= 0``; what most re-implementations use).

  Args:
    d2: float ``[B, C]`` squared distances of the anchors to the ``C`` proxies.
    class_mask: bool ``[B, C]``, ``class_mask[a, z] = (z == y_a)`` (one true proxy per row).
    temperature: ``T > 0``, default 1 (the paper's formula).
    denominator: ``'negatives'`` (default) or ``'all'``.

  Returns:
    float32 ``[B]`` per-anchor losses.
  """
  hparams.positive_if_static("temperature", temperature)
  hparams.mode("denominator", denominator, PROXY_DENOMINATORS)
  d2, = _f32(d2)
  logits = -d2 / temperature
  positive = -jnp.sum(jnp.where(class_mask, logits, 0.0), axis=1)
  mask = ~class_mask if denominator == "negatives" else jnp.ones_like(class_mask)
  lse, _ = masked_logsumexp(logits, mask, axis=1)
  return positive + lse


# --- Pair losses: contrastive, DRO margin, binomial, multi-similarity, lifted structure ----
#
# ``s`` is a similarity matrix ``[B, N]`` (higher = closer) and ``pos_mask`` / ``neg_mask`` the
# bool ``[B, N]`` label masks (self excluded). The elementwise forms return one value per pair
# ``[B, N]`` (positive form where ``pos_mask``, negative form elsewhere; the caller masks out
# non-pairs); the anchor forms return one value per anchor ``[B]``.


def contrastive(s: jax.Array, pos_mask: jax.Array, *, pos_margin: float = 1.0,
                neg_margin: float = 0.5) -> jax.Array:
  """Contrastive pair loss in similarity units (Hadsell, Chopra & LeCun, CVPR 2006).

  ``l_ij = [pos_margin - S_ij]_+`` for positive pairs and ``[S_ij - neg_margin]_+`` otherwise.
  On the unit sphere (``d^2 = 2 - 2S``) with the defaults: ``[1 - S]_+ = d^2 / 2`` (Hadsell
  et al.'s positive term ``D^2 / 2``) and ``[S - 0.5]_+ = [1 - d^2]_+ / 2``, a hinge at their
  margin distance 1 (60 degrees) but linear in ``d^2``, not their squared hinge
  ``[1 - D]_+^2 / 2`` (whose gradient vanishes at the margin).

  Args:
    s: float ``[B, N]`` similarities.
    pos_mask: bool ``[B, N]``, True for positive pairs.
    pos_margin: positives pay below this similarity, default 1.0.
    neg_margin: negatives pay above this similarity, default 0.5.

  Returns:
    float32 ``[B, N]`` pair losses.
  """
  s, = _f32(s)
  return jnp.where(pos_mask, jax.nn.relu(pos_margin - s), jax.nn.relu(s - neg_margin))


def dro_margin(s: jax.Array, pos_mask: jax.Array, *, margin: float = 0.2,
               base: float = 0.5) -> jax.Array:
  """The DRO paper's margin pair loss ``l_ij = [m + y_ij (lambda - S_ij)]_+`` (§3.3).

  ``y = +1`` for positive pairs, ``-1`` for negative ones: positives ``[m + lambda - S]_+``,
  negatives ``[m + S - lambda]_+`` (released code: ``m = 0.2``, ``lambda = 0.5``, so positives
  pay below 0.7 and negatives above 0.3). Equals :func:`contrastive` with
  ``pos_margin = lambda + m``, ``neg_margin = lambda - m``.

  Args:
    s: float ``[B, N]`` similarities.
    pos_mask: bool ``[B, N]``, True for positive pairs.
    margin: ``m``, default 0.2.
    base: ``lambda``, the threshold, default 0.5.

  Returns:
    float32 ``[B, N]`` pair losses.
  """
  return contrastive(s, pos_mask, pos_margin=base + margin, neg_margin=base - margin)


def binomial(s: jax.Array, pos_mask: jax.Array, *, alpha: float = 40.0, beta: float = 2.0,
             base: float = 0.5) -> jax.Array:
  """Binomial deviance pair loss (Yi, Lei & Li 2014), in the DRO released scripts' form.

  Positives ``(2 / beta) log(1 + exp(-beta (S - lambda)))``, negatives
  ``(2 / alpha) log(1 + exp(alpha (S - lambda)))`` (softplus, stable for any scale). Note the
  naming: ``beta`` scales the *positives* and ``alpha`` the *negatives* here (DRO code), the
  opposite of the multi-similarity loss.

  Args:
    s: float ``[B, N]`` similarities.
    pos_mask: bool ``[B, N]``, True for positive pairs.
    alpha: negative scale ``> 0``, default 40.
    beta: positive scale ``> 0``, default 2.
    base: ``lambda``, default 0.5.

  Returns:
    float32 ``[B, N]`` pair losses (all ``> 0``).
  """
  hparams.positive_if_static("alpha", alpha)
  hparams.positive_if_static("beta", beta)
  s, = _f32(s)
  pos = (2.0 / beta) * jax.nn.softplus(-beta * (s - base))
  neg = (2.0 / alpha) * jax.nn.softplus(alpha * (s - base))
  return jnp.where(pos_mask, pos, neg)


def multi_similarity(s: jax.Array, pos_mask: jax.Array, neg_mask: jax.Array, *,
                     alpha: float = 2.0, beta: float = 50.0, base: float = 0.5) -> jax.Array:
  """Multi-similarity loss per anchor (Wang et al. 2019, eq. 2 of the DRO paper).

  ``L_a = (1/alpha) log(1 + sum_{p in P_a} e^{-alpha (S_ap - lambda)})
  + (1/beta) log(1 + sum_{n in N_a} e^{beta (S_an - lambda)})``, each term computed as
  ``softplus(logsumexp(.))`` (finite at ``beta = 50`` and in bf16). An empty set contributes 0.
  Gradients (DRO paper eq. 27): ``dL/dS_ap = -1 / (e^{alpha (S_ap - lambda)}
  + sum_k e^{alpha (S_ap - S_ak)})``, ``dL/dS_an = 1 / (e^{beta (lambda - S_an)}
  + sum_k e^{beta (S_ak - S_an)})``.

  Args:
    s: float ``[B, N]`` similarities.
    pos_mask: bool ``[B, N]`` the (mined) positives ``P_a``.
    neg_mask: bool ``[B, N]`` the (mined) negatives ``N_a``.
    alpha: positive scale ``> 0``, default 2.
    beta: negative scale ``> 0``, default 50.
    base: ``lambda``, default 0.5.

  Returns:
    float32 ``[B]`` per-anchor losses.
  """
  hparams.positive_if_static("alpha", alpha)
  hparams.positive_if_static("beta", beta)
  s, = _f32(s)
  lse_p, _ = masked_logsumexp(-alpha * (s - base), pos_mask, axis=1)
  lse_n, _ = masked_logsumexp(beta * (s - base), neg_mask, axis=1)
  return jax.nn.softplus(lse_p) / alpha + jax.nn.softplus(lse_n) / beta


def lifted_structure(s: jax.Array, pos_mask: jax.Array, neg_mask: jax.Array, *,
                     base: float = 0.5, margin: float = 0.0) -> jax.Array:
  """Generalised lifted structure loss per anchor (DRO paper eq. 3; Wang et al. 2019).

  ``L_a = [log sum_{p in P_a} e^{lambda - S_ap} + log sum_{n in N_a} e^{S_an - lambda}
  + margin]_+``. ``lambda`` cancels between the two logs (``L_a`` does not depend on ``base``
  in exact arithmetic); ``margin`` (default 0 = eq. 3) shifts the hinge, as the margin of the
  generalised lifted structure of Hermans et al. (2017). Gradients (eq. 6) while the hinge is
  open: ``dL/dS_ap = -softmax_{P_a}(-S)_p``, ``dL/dS_an = softmax_{N_a}(S)_n``. An anchor with
  an empty ``P_a`` or ``N_a`` gives 0.

  Args:
    s: float ``[B, N]`` similarities.
    pos_mask: bool ``[B, N]`` positives ``P_a``.
    neg_mask: bool ``[B, N]`` negatives ``N_a``.
    base: ``lambda`` of eq. 3, default 0.5.
    margin: added inside the hinge, default 0.

  Returns:
    float32 ``[B]`` per-anchor losses.
  """
  s, = _f32(s)
  lse_p, has_p = masked_logsumexp(base - s, pos_mask, axis=1)
  lse_n, has_n = masked_logsumexp(s - base, neg_mask, axis=1)
  both = has_p & has_n
  return jnp.where(both, jax.nn.relu(jnp.where(both, lse_p + lse_n, 0.0) + margin), 0.0)
