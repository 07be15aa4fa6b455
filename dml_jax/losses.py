"""Pure loss forms: per-term values from selected similarities or distances; reduction separate.

A *term* is one selected (anchor, positive) pair with its negative(s) (see ``mining``). Every
loss here maps arrays of ``S_ap`` / ``S_an`` (or squared distances) to per-term values of the same
shape, computed in float32 whatever the input dtype; :func:`masked_mean` reduces them over the
valid terms. The ``*_all_negatives`` forms take, for each anchor ``a``, its whole row of
negatives ``[B, N]`` with a mask, and return one value per term ``[B, P]`` in ``O(B (N + P))``
memory (``O(B N log N)`` for the triplet form), never ``[B, P, N]``.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

TRIPLET_REDUCTIONS = ("mean", "sum")
_EMPTY_LOGSUMEXP = -1e30   # stand-in for log(0): finite, so gradients stay finite


def _f32(*xs):
  return tuple(jnp.asarray(x).astype(jnp.float32) for x in xs)


def _check_temperature(temperature) -> None:
  if isinstance(temperature, numbers.Real) and not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature!r}.")


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
  _check_temperature(temperature)
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
  _check_temperature(temperature)
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
  _check_temperature(temperature)
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
  if reduction not in TRIPLET_REDUCTIONS:
    raise ValueError(f"Unknown reduction {reduction!r}; allowed: {', '.join(TRIPLET_REDUCTIONS)}.")
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
