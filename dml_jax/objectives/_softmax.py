"""Classification-based objectives: a softmax over learnable class weights (proxies) on the
cosine, with a margin on the true class: ``normalized_softmax`` (Zhai & Wu 2019), ``cosface``
(Wang et al. 2018), ``arcface`` (Deng et al. 2019), ``subcenter_arcface`` (Deng et al. 2020),
``softtriple`` (Qian et al. 2019; several centres per class), the multiplicative angular
margins ``large_margin_softmax`` (Liu et al. 2016) and ``sphereface`` (Liu et al. 2017), whose
logits also carry the lengths of the embedding (and of the class weight), and ``p2sgrad``
(Zhang et al. 2019: the cosines regressed onto the one-hot labels).

Each computes per anchor ``CE(scale * f(cos(x, w_c)), y)``, ``f`` the identity except for the
true class, averaged over the batch (``p2sgrad``: the mean squared error of the cosines). ``params
= {'proxies': float32 [C, D]}`` (one weight vector per class, unit-norm at ``init``; their
learning rate is ``optimizer.objective_learning_rate``, usually much larger than the
backbone's). No mining and no n-per-class batches needed. Labels must lie in ``[0, C)`` (as
``proxy_nca``). Equal to pytorch-metric-learning 2.9's ``NormalizedSoftmaxLoss``,
``CosFaceLoss``, ``ArcFaceLoss``, ``SubCenterArcFaceLoss``, ``SoftTripleLoss``,
``LargeMarginSoftmaxLoss``, ``SphereFaceLoss`` and ``P2SGradLoss`` (whose ``W`` / ``fc`` /
``weight`` is our ``proxies.T``).

``aux``: every anchor is valid; ``active_fraction`` = anchors whose true-class softmax
probability is below ``1 - 1e-3`` (``p2sgrad``: whose squared error exceeds ``1e-3``);
``mean_s_ap`` / ``mean_s_an`` = cosine to the own class weight / mean cosine to the others.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from dml_jax import hparams
from dml_jax import kernels
from dml_jax import similarity as sim
from dml_jax.objectives import _common
from dml_jax.objectives._registry import register

SOFTMAX_ACTIVE_WEIGHT = 1e-3   # active: 1 - p(true class) above this
ARCFACE_MIN_SIN_SQ = 1e-12     # sin^2(theta) floor: finite gradient at cos = +-1
MIN_NORM = 1e-12               # |x| floor of the lengths in the logits (l2_normalize's eps)


def _softmax_objective(name: str, target_fn, scale: float, proxy_norm: float, *,
                       per_class: int = 1, class_cos=_common.max_over_centers):
  """``apply`` of a margin softmax: ``target_fn(cos_true [B]) -> logit of the true class``
  (before ``scale``); ``class_cos(embeddings [B, D], proxies [C * K, D], K) -> [B, C]`` is
  the class similarity (the centres of a class pooled)."""

  def body(b):
    cos, true, ok, labels = b.s, b.true, b.ok, b.labels                # float32 [B, C]
    terms = margin_cross_entropy(cos, labels, target_fn, scale)
    loss = jnp.mean(jnp.where(ok, terms, jnp.nan))
    active = 1.0 - jnp.exp(-jax.lax.stop_gradient(terms)) > SOFTMAX_ACTIVE_WEIGHT
    return loss, _class_aux(ok, active, cos, true)

  apply = _common.class_objective(body, name=name, per_class=per_class,
                                  class_similarity=class_cos)
  return _common.proxy_init(proxy_norm, per_class=per_class), apply


def _class_aux(ok: jax.Array, active: jax.Array, cos: jax.Array, true: jax.Array) -> dict:
  """``aux`` of a class objective (module docstring) from bool ``[B]`` anchors in range and
  active anchors, the class cosines ``[B, C]`` and the true-class mask ``[B, C]``."""
  col = lambda x: x[:, None]
  sg = jax.lax.stop_gradient(cos)
  cos_true = jnp.sum(jnp.where(true, sg, 0.0), axis=1)
  return _common.aux(col(ok), col(active), col(cos_true), col(_common.row_mean(sg, ~true)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def margin_cross_entropy(cos: jax.Array, labels: jax.Array, target_fn, scale: float) -> jax.Array:
  """Per anchor ``CE(scale * l, y) = logsumexp_c(scale * l_c) - scale * l_y`` with logits
  ``l_c = cos_c`` except ``l_y = target_fn(cos_y)``: float ``[B, C]``, int ``[B]`` -> ``[B]``.

  The same as ``-log_softmax`` at the true class, with a custom VJP (``p`` the softmax,
  ``f = target_fn``) ``dcos_c = scale g p_c`` for ``c != y`` and ``dcos_y = scale g (p_y - 1)
  f'(cos_y)``, which recomputes ``p`` from the cosines and the stored ``logsumexp``, so XLA
  keeps no ``[B, C]`` logits or probabilities between the passes. ``target_fn`` acts
  elementwise on ``[B]``."""
  return _margin_ce_fwd(cos, labels, target_fn, scale)[0]


def _margin_ce_fwd(cos, labels, target_fn, scale):
  true = labels[:, None] == jnp.arange(cos.shape[1])[None, :]
  cos_true = jnp.sum(jnp.where(true, cos, 0.0), axis=1)
  target = target_fn(cos_true)
  lse = jax.nn.logsumexp(scale * jnp.where(true, target[:, None], cos), axis=1)
  return lse - scale * target, (cos, labels, cos_true, lse)


def _margin_ce_bwd(target_fn, scale, residuals, g):
  cos, labels, cos_true, lse = residuals
  true = labels[:, None] == jnp.arange(cos.shape[1])[None, :]
  target, target_vjp = jax.vjp(target_fn, cos_true)
  d_true = target_vjp(scale * g * (jnp.exp(scale * target - lse) - 1.0))[0]     # [B]
  p = jnp.exp(scale * cos - lse[:, None])
  return jnp.where(true, d_true[:, None], (scale * g)[:, None] * p), None


margin_cross_entropy.defvjp(_margin_ce_fwd, _margin_ce_bwd)


@register("normalized_softmax", parameters=True)
def normalized_softmax(*, temperature: float = 0.05, proxy_norm: float = 1.0):
  """NormSoftmax (Zhai & Wu, BMVC 2019): softmax cross-entropy on ``cos(x, w_c) / T``.

  Default ``T = 0.05`` (the paper's best on CUB / Cars / SOP).

  Args:
    temperature: ``T > 0``, default 0.05.
    proxy_norm: length of the class vectors at ``init`` (``> 0``), default 1 (see
      ``objectives._common.init_proxies``).

  Returns:
    ``(init, apply)``; use ``make('normalized_softmax', ...)``.
  """
  temperature = hparams.number("temperature", temperature, positive=True)
  return _softmax_objective("normalized_softmax", lambda c: c, 1.0 / temperature, proxy_norm)


@register("cosface", parameters=True)
def cosface(*, margin: float = 0.35, scale: float = 64.0, proxy_norm: float = 1.0):
  """CosFace / large margin cosine loss (Wang et al., CVPR 2018, eq. 4).

  The true class's logit is ``s (cos(theta_y) - m)``, the others ``s cos(theta_j)``. Defaults
  ``m = 0.35``, ``s = 64`` (the paper).

  Args:
    margin: ``m``, default 0.35.
    scale: ``s > 0``, default 64.
    proxy_norm: length of the class vectors at ``init`` (``> 0``), default 1 (see
      ``objectives._common.init_proxies``).

  Returns:
    ``(init, apply)``; use ``make('cosface', ...)``.
  """
  margin = hparams.real("margin", margin)
  scale = hparams.number("scale", scale, positive=True)
  return _softmax_objective("cosface", lambda c: c - margin, scale, proxy_norm)


def arcface_target(cos: jax.Array, margin: float) -> jax.Array:
  """ArcFace's true-class logit (before the scale): ``cos(theta + m)`` while ``theta <= pi -
  m``, else ``cos(theta) - m sin(m)`` (insightface's and PML's monotonic extension), with
  ``cos(theta + m) = cos(theta) cos(m) - sin(theta) sin(m)`` and
  ``sin(theta) = sqrt(max(1 - cos^2, ARCFACE_MIN_SIN_SQ))``. float ``[B]`` -> ``[B]``."""
  cos = jnp.clip(cos, -1.0, 1.0)
  sin = jnp.sqrt(jnp.maximum(1.0 - jnp.square(cos), ARCFACE_MIN_SIN_SQ))
  plus = cos * math.cos(margin) - sin * math.sin(margin)
  return jnp.where(cos >= -math.cos(margin), plus, cos - margin * math.sin(margin))


@register("arcface", parameters=True)
def arcface(*, margin: float = 0.5, scale: float = 64.0, proxy_norm: float = 1.0):
  """ArcFace / additive angular margin loss (Deng et al., CVPR 2019, eq. 3).

  The true class's logit is ``s cos(theta_y + m)`` (see :func:`arcface_target` for
  ``theta_y > pi - m``), the others ``s cos(theta_j)``. Defaults ``m = 0.5`` radians (28.6
  degrees; PML's ``margin`` is in degrees) and ``s = 64`` (the paper).

  Args:
    margin: ``m`` in radians, in ``[0, pi/2)``, default 0.5.
    scale: ``s > 0``, default 64.
    proxy_norm: length of the class vectors at ``init`` (``> 0``), default 1 (see
      ``objectives._common.init_proxies``).

  Returns:
    ``(init, apply)``; use ``make('arcface', ...)``.
  """
  margin = _check_arcface_margin(margin)
  scale = hparams.number("scale", scale, positive=True)
  return _softmax_objective("arcface", lambda c: arcface_target(c, margin), scale, proxy_norm)


def _check_arcface_margin(margin) -> float:
  margin = hparams.number("margin", margin, positive=False)
  if margin >= math.pi / 2:
    raise ValueError(f"margin={margin} is in radians and must be below pi/2 (ArcFace uses 0.5); "
                     "did you pass degrees?")
  return margin


@register("subcenter_arcface", parameters=True)
def subcenter_arcface(*, margin: float = 0.5, scale: float = 64.0, sub_centers: int = 3,
                      proxy_norm: float = 1.0):
  """Sub-center ArcFace (Deng et al., ECCV 2020): ArcFace with ``K`` centres per class, the
  class cosine being the largest of its centres' (robust to label noise: noisy examples gather
  at non-dominant centres).

  ``params['proxies']`` is ``[C * K, D]``, rows ``c * K + k`` (PML's ``W.T``). Defaults
  ``m = 0.5`` radians, ``s = 64``, ``K = 3`` (the paper's). The paper's later step of dropping
  non-dominant centres and outliers is not part of the loss.

  Args:
    margin: ``m`` in radians, in ``[0, pi/2)``, default 0.5.
    scale: ``s > 0``, default 64.
    sub_centers: ``K >= 1``, default 3.
    proxy_norm: length of the class vectors at ``init`` (``> 0``), default 1 (see
      ``objectives._common.init_proxies``).

  Returns:
    ``(init, apply)``; use ``make('subcenter_arcface', ...)``.
  """
  margin = _check_arcface_margin(margin)
  scale = hparams.number("scale", scale, positive=True)
  sub_centers = hparams.integer("sub_centers", sub_centers, minimum=1)
  return _softmax_objective("subcenter_arcface", lambda c: arcface_target(c, margin), scale,
                            proxy_norm, per_class=sub_centers)


def multiple_angle_target(cos: jax.Array, margin: int) -> jax.Array:
  """The multiplicative angular margin's true-class function of L-Softmax (Liu et al., ICML
  2016, eqs. 6-7) and SphereFace: ``psi(theta) = (-1)^k cos(m theta) - 2k`` for ``theta`` in
  ``[k pi / m, (k + 1) pi / m]``, monotonically decreasing over ``[0, pi]``.

  ``cos(m theta)`` is the Chebyshev polynomial ``T_m(cos theta)`` (``T_0 = 1``, ``T_1 = c``,
  ``T_{j+1} = 2 c T_j - T_{j-1}``: the paper's eq. 7 summed), so the gradient is that of a
  polynomial in the cosine and finite at ``cos = +-1``; ``k`` (from the clipped cosine) is a
  constant of the gradient. float ``[B]`` -> ``[B]``; ``margin`` an int ``m >= 1``.
  """
  t_prev, t = jnp.ones_like(cos), cos
  for _ in range(margin - 1):
    t_prev, t = t, 2.0 * cos * t - t_prev
  theta = jnp.arccos(jnp.clip(jax.lax.stop_gradient(cos), -1.0, 1.0))
  k = jnp.floor(theta / (math.pi / margin))
  return jnp.where(jnp.mod(k, 2.0) == 0.0, t, -t) - 2.0 * k


def _row_norms(x: jax.Array) -> jax.Array:
  """``[R, D]`` -> float32 ``[R]``: ``max(|x_r|, MIN_NORM)`` (finite gradient at 0)."""
  sq = jnp.sum(jnp.square(x.astype(jnp.float32)), axis=1)
  return jnp.sqrt(jnp.maximum(sq, MIN_NORM * MIN_NORM))


def _multiplicative_margin_objective(name: str, margin: int, scale: float, proxy_norm: float,
                                     *, weight_lengths: bool):
  """``(init, apply)`` of L-Softmax (``weight_lengths``: logits ``scale |w_c| |x| f(cos)``)
  or SphereFace (``scale |x| f(cos)``), ``f`` = :func:`multiple_angle_target` for the true
  class and the identity for the others; softmax cross-entropy averaged over the batch."""

  def body(b):
    cos, true, ok = b.s, b.true, b.ok                                   # float32 [B, C]
    cos_true = jnp.sum(jnp.where(true, cos, 0.0), axis=1)
    length = scale * _row_norms(b.embeddings)[:, None]                  # [B, 1]
    if weight_lengths:
      length = length * _row_norms(b.proxies)[None, :]                  # [B, C]
    logits = length * jnp.where(true, multiple_angle_target(cos_true, margin)[:, None], cos)
    terms = jax.nn.logsumexp(logits, axis=1) - jnp.sum(jnp.where(true, logits, 0.0), axis=1)
    loss = jnp.mean(jnp.where(ok, terms, jnp.nan))
    active = 1.0 - jnp.exp(-jax.lax.stop_gradient(terms)) > SOFTMAX_ACTIVE_WEIGHT
    return loss, _class_aux(ok, active, cos, true)

  return _common.proxy_init(proxy_norm), _common.class_objective(body, name=name)


@register("large_margin_softmax", parameters=True)
def large_margin_softmax(*, margin: int = 4, scale: float = 1.0, proxy_norm: float = 1.0):
  """Large-margin softmax, L-Softmax (Liu et al., ICML 2016; its ``psi``: eqs. 6-7).

  The logits are ``s |w_c| |x| cos(theta_c)``, the true class's ``s |w_y| |x| psi(theta_y)``
  with the multiplicative angular margin ``psi`` (:func:`multiple_angle_target`, ``m`` an
  integer). The lengths are those of the raw embedding and class weight, so the loss is meant
  for unnormalised embeddings (``model.normalize=False``, as the paper); with the default
  unit-norm embeddings only ``|w_c|`` and ``s`` scale the logits. The paper's annealing of
  ``psi`` towards ``cos`` (``lambda``) is not included (PML neither). Defaults ``m = 4``,
  ``s = 1`` (PML's; the paper's ``m`` is 2 to 4).

  Args:
    margin: ``m``, an int ``>= 1`` (``m = 1`` is the plain softmax), default 4.
    scale: ``s > 0``, default 1.
    proxy_norm: length of the class vectors at ``init`` (``> 0``), default 1 (see
      ``objectives._common.init_proxies``; here it also sets the logits' initial scale).

  Returns:
    ``(init, apply)``; use ``make('large_margin_softmax', ...)``.
  """
  margin = hparams.integer("margin", margin, minimum=1)
  scale = hparams.number("scale", scale, positive=True)
  return _multiplicative_margin_objective("large_margin_softmax", margin, scale, proxy_norm,
                                          weight_lengths=True)


@register("sphereface", parameters=True)
def sphereface(*, margin: int = 4, scale: float = 1.0, proxy_norm: float = 1.0):
  """SphereFace / angular softmax, A-Softmax (Liu et al., CVPR 2017).

  L-Softmax with unit class weights: the logits are ``s |x| cos(theta_c)``, the true class's
  ``s |x| psi(theta_y)`` (:func:`multiple_angle_target`). Meant for unnormalised embeddings
  (``model.normalize=False``, as the paper); with the default unit-norm embeddings set the
  scale ``s`` (e.g. 64, as CosFace and ArcFace). The paper's annealing of ``psi`` towards
  ``cos`` during training (``lambda``) is not included (PML neither). Defaults ``m = 4`` (the
  paper's), ``s = 1`` (PML's).

  Args:
    margin: ``m``, an int ``>= 1``, default 4.
    scale: ``s > 0``, default 1.
    proxy_norm: length of the class vectors at ``init`` (``> 0``), default 1 (see
      ``objectives._common.init_proxies``).

  Returns:
    ``(init, apply)``; use ``make('sphereface', ...)``.
  """
  margin = hparams.integer("margin", margin, minimum=1)
  scale = hparams.number("scale", scale, positive=True)
  return _multiplicative_margin_objective("sphereface", margin, scale, proxy_norm,
                                          weight_lengths=False)


P2SGRAD_ACTIVE_ERROR = 1e-3   # p2sgrad: an anchor is active when its squared error exceeds this


@register("p2sgrad", parameters=True)
def p2sgrad(*, proxy_norm: float = 1.0):
  """P2SGrad (Zhang et al., CVPR 2019, eq. 11): the cosines to the class weights regressed onto
  the one-hot labels, ``mean_{a, c} (cos(theta_ac) - [c = y_a])^2`` over the batch and the
  ``C`` classes (cosines clipped to ``[-1, 1]``); its gradient is the paper's, free of scale
  and margin hyper-parameters.

  The class weights enter through their direction only, so their gradient is tangent to them
  (PML renormalises its weights before every step instead, and its gradient has a radial part
  as well; the tangent parts agree).

  Args:
    proxy_norm: length of the class vectors at ``init`` (``> 0``), default 1 (see
      ``objectives._common.init_proxies``).

  Returns:
    ``(init, apply)``; use ``make('p2sgrad', ...)``.
  """

  def body(b):
    cos, true, ok = jnp.clip(b.s, -1.0, 1.0), b.true, b.ok               # float32 [B, C]
    terms = jnp.mean(jnp.square(cos - true.astype(jnp.float32)), axis=1)
    loss = jnp.mean(jnp.where(ok, terms, jnp.nan))
    return loss, _class_aux(ok, jax.lax.stop_gradient(terms) > P2SGRAD_ACTIVE_ERROR, cos, true)

  return _common.proxy_init(proxy_norm), _common.class_objective(body, name="p2sgrad")


@register("softtriple", parameters=True)
def softtriple(*, centers_per_class: int = 10, la: float = 20.0, gamma: float = 0.1,
               margin: float = 0.01, proxy_norm: float = 1.0):
  """SoftTriple loss (Qian et al., ICCV 2019, eq. 10), without the centre regulariser.

  ``K`` centres per class; the class similarity is the soft maximum
  ``S'_c = sum_k softmax_k(S_ck / gamma) S_ck``, and the loss the softmax cross-entropy of
  ``la (S'_c - margin [c = y])``. Defaults ``K = 10``, ``la = 20``, ``gamma = 0.1``,
  ``margin = 0.01`` (the paper's). The paper's regulariser merging similar centres
  (``tau``) is not included (PML neither). ``params['proxies']``: ``[C * K, D]``.

  Args:
    centers_per_class: ``K >= 1``, default 10.
    la: scale ``lambda > 0``, default 20.
    gamma: softmax temperature over a class's centres ``> 0``, default 0.1.
    margin: ``delta``, default 0.01.
    proxy_norm: length of the class vectors at ``init`` (``> 0``), default 1 (see
      ``objectives._common.init_proxies``).

  Returns:
    ``(init, apply)``; use ``make('softtriple', ...)``.
  """
  centers_per_class = hparams.integer("centers_per_class", centers_per_class, minimum=1)
  la = hparams.number("la", la, positive=True)
  gamma = hparams.number("gamma", gamma, positive=True)
  margin = hparams.real("margin", margin)

  return _softmax_objective("softtriple", lambda c: c - margin, la, proxy_norm,
                            per_class=centers_per_class,
                            class_cos=functools.partial(soft_class_similarity, gamma=gamma))


def soft_class_similarity(embeddings: jax.Array, proxies: jax.Array, per_class: int, *,
                          gamma: float) -> jax.Array:
  """SoftTriple's class similarity ``S'_c = sum_k softmax_k(S_ck / gamma) S_ck`` (paper eq. 7)
  of cosines ``S_ck`` to the centres: ``[B, D]``, ``[C * K, D]`` (rows ``c * K + k``) ->
  ``[B, C]``.

  The cosines are computed against the centres reordered ``k``-major (columns ``k * C + c``),
  so the pooling over a class's centres reads ``K`` contiguous rows of ``C``, not strided
  groups of ``K``, with a custom VJP ``dS_ck = g_c p_ck (1 + (S_ck - S'_c) / gamma)``; the
  softmax is shifted by the cosine's bound 1 when ``2 / gamma`` leaves ``exp`` far from
  underflow, by the row maximum otherwise.
  """
  k = per_class
  c = proxies.shape[0] // k
  by_center = proxies.reshape(c, k, -1).transpose(1, 0, 2).reshape(c * k, -1)
  return _soft_pool(sim.pairwise_similarity(embeddings, by_center, kind="cosine"), k, gamma)


SOFT_POOL_MAX_SPAN = 60.0   # (max - min) / gamma below which the fixed shift cannot underflow


def _soft_pool(cos: jax.Array, k: int, gamma: float) -> jax.Array:
  """``[..., K * C]`` (column ``k * C + c``) -> ``[..., C]``: ``sum_k softmax_k(cos / gamma)
  cos``; on the CPU by the C++ kernel of ``dml_jax/kernels/soft_pool.cc``
  (:func:`soft_pool_kernel`), elsewhere (or without a C++ compiler) by XLA
  (:func:`soft_pool_xla`). Same values and gradients."""
  if kernels.choose("soft_pool.cc") is None:
    return soft_pool_xla(cos, k, gamma)
  return soft_pool_kernel(cos, k, gamma)


def _max_shift(gamma: float) -> bool:
  """Whether the softmax is shifted by the maximum over ``K`` (else by the bound 1)."""
  return 2.0 / gamma > SOFT_POOL_MAX_SPAN   # cos in [-1, 1]: exponents in [-2 / gamma, 0]


def _by_centre(cos: jax.Array, k: int) -> jax.Array:
  """``[..., K * C]`` -> ``[..., K, C]``."""
  return cos.reshape(*cos.shape[:-1], k, cos.shape[-1] // k)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def soft_pool_xla(cos: jax.Array, k: int, gamma: float) -> jax.Array:
  """:func:`_soft_pool` in XLA, with a custom VJP from the stored exponentials."""
  return _soft_pool_xla_fwd(cos, k, gamma)[0]


def _soft_pool_xla_fwd(cos, k, gamma):
  cos = _by_centre(cos, k)
  shift = jnp.max(cos, axis=-2, keepdims=True) if _max_shift(gamma) else 1.0
  e = jnp.exp((cos - shift) / gamma)
  z = jnp.sum(e, axis=-2)
  pooled = jnp.sum(e * cos, axis=-2) / z
  return pooled, (cos, e, z, pooled)


def _soft_pool_xla_bwd(k, gamma, residuals, g):
  cos, e, z, pooled = residuals
  w = (g / z)[..., None, :]
  dcos = w * e * (1.0 + (cos - pooled[..., None, :]) / gamma)
  return (dcos.reshape(*dcos.shape[:-2], -1),)


soft_pool_xla.defvjp(_soft_pool_xla_fwd, _soft_pool_xla_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def soft_pool_kernel(cos: jax.Array, k: int, gamma: float, vectorized: bool = True) -> jax.Array:
  """:func:`_soft_pool` by the C++ kernel: the forward pass returns ``pooled`` and ``z``
  ``[..., C]``; the backward pass recomputes the shift and the exponentials and writes ``dcos``
  over the cosines (nothing ``[..., K * C]`` is stored but the cosines, and no second buffer of
  that size is allocated). ``vectorized=False`` runs the kernel's scalar form."""
  return _soft_pool_kernel_fwd(cos, k, gamma, vectorized)[0]


def _soft_pool_kernel_fwd(cos, k, gamma, vectorized):
  cos = cos.astype(jnp.float32)
  row = jax.ShapeDtypeStruct(cos.shape[:-1] + (cos.shape[-1] // k,), jnp.float32)
  # The cosines come back as the first result, the same buffer (aliased): the backward pass
  # is then their only reader and may overwrite them in place (XLA copies an operand that a
  # custom call overwrites when another op, here the forward pass, also reads it).
  kept, pooled, z = jax.ffi.ffi_call(
      kernels.require("soft_pool.cc")["forward"],
      (jax.ShapeDtypeStruct(cos.shape, jnp.float32), row, row),
      vmap_method="broadcast_all", input_output_aliases={0: 0})(
          cos, centres=np.int32(k), gamma=np.float32(gamma),
          max_shift=np.int32(_max_shift(gamma)), vectorized=np.int32(vectorized))
  return pooled, (kept, pooled, z)


def _soft_pool_kernel_bwd(k, gamma, vectorized, residuals, g):
  cos, pooled, z = residuals
  dcos = jax.ffi.ffi_call(
      kernels.require("soft_pool.cc")["backward"], jax.ShapeDtypeStruct(cos.shape, jnp.float32),
      vmap_method="broadcast_all", input_output_aliases={0: 0})(
          cos, g.astype(jnp.float32), pooled, z, centres=np.int32(k), gamma=np.float32(gamma),
          max_shift=np.int32(_max_shift(gamma)), vectorized=np.int32(vectorized))
  return (dcos,)


soft_pool_kernel.defvjp(_soft_pool_kernel_fwd, _soft_pool_kernel_bwd)
