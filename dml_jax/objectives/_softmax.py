"""Classification-based objectives: a softmax over learnable class weights (proxies) on the
cosine, with a margin on the true class: ``normalized_softmax`` (Zhai & Wu 2019), ``cosface``
(Wang et al. 2018), ``arcface`` (Deng et al. 2019).

Each computes per anchor ``CE(scale * f(cos(x, w_c)), y)``, ``f`` the identity except for the
true class, averaged over the batch. ``params = {'proxies': float32 [C, D]}`` (one weight
vector per class, unit-norm at ``init``; their learning rate is
``optimizer.objective_learning_rate``, usually much larger than the backbone's). No mining and no
n-per-class batches needed. Labels must lie in ``[0, C)`` (as ``proxy_nca``). Equal to
pytorch-metric-learning 2.9's ``NormalizedSoftmaxLoss``, ``CosFaceLoss`` and ``ArcFaceLoss``
(whose ``W`` is our ``proxies.T``).

``aux``: every anchor is valid; ``active_fraction`` = anchors whose true-class softmax
probability is below ``1 - 1e-3``; ``mean_s_ap`` / ``mean_s_an`` = cosine to the own class
weight / mean cosine to the others.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax import similarity as sim
from dml_jax.objectives import _common

SOFTMAX_ACTIVE_WEIGHT = 1e-3   # active: 1 - p(true class) above this
ARCFACE_MIN_SIN_SQ = 1e-12     # sin^2(theta) floor: finite gradient at cos = +-1


def _softmax_objective(name: str, target_fn, scale: float):
  """``apply`` of a margin softmax: ``target_fn(cos_true [B]) -> logit of the true class``
  (before ``scale``)."""

  def apply(params, embeddings, labels, *, rng=None, references=None):
    del rng
    embeddings, labels, proxies, ok = _common.class_batch(params, embeddings, labels, references,
                                                          name=name)
    num = proxies.shape[0]
    cos = sim.pairwise_similarity(embeddings, proxies, kind="cosine")   # float32 [B, C]
    true = labels[:, None] == jnp.arange(num)[None, :]                  # [B, C]
    cos_true = jnp.sum(jnp.where(true, cos, 0.0), axis=1)
    logits = scale * jnp.where(true, target_fn(cos_true)[:, None], cos)
    log_p = jax.nn.log_softmax(logits, axis=1)
    terms = -jnp.sum(jnp.where(true, log_p, 0.0), axis=1)
    loss = jnp.mean(jnp.where(ok, terms, jnp.nan))
    col = lambda x: x[:, None]
    sg = jax.lax.stop_gradient(cos)
    active = 1.0 - jnp.exp(-jax.lax.stop_gradient(terms)) > SOFTMAX_ACTIVE_WEIGHT
    return loss, _common.aux(col(ok), col(active), col(jax.lax.stop_gradient(cos_true)),
                             col(_common.row_mean(sg, ~true)))

  return _common.init_proxies, apply


def normalized_softmax(*, temperature: float = 0.05):
  """NormSoftmax (Zhai & Wu, BMVC 2019): softmax cross-entropy on ``cos(x, w_c) / T``.

  Default ``T = 0.05`` (the paper's best on CUB / Cars / SOP).

  Args:
    temperature: ``T > 0``, default 0.05.

  Returns:
    ``(init, apply)``; use ``make('normalized_softmax', ...)``.
  """
  temperature = hparams.number("temperature", temperature, positive=True)
  return _softmax_objective("normalized_softmax", lambda c: c, 1.0 / temperature)


def cosface(*, margin: float = 0.35, scale: float = 64.0):
  """CosFace / large margin cosine loss (Wang et al., CVPR 2018, eq. 4).

  The true class's logit is ``s (cos(theta_y) - m)``, the others ``s cos(theta_j)``. Defaults
  ``m = 0.35``, ``s = 64`` (the paper).

  Args:
    margin: ``m``, default 0.35.
    scale: ``s > 0``, default 64.

  Returns:
    ``(init, apply)``; use ``make('cosface', ...)``.
  """
  margin = hparams.real("margin", margin)
  scale = hparams.number("scale", scale, positive=True)
  return _softmax_objective("cosface", lambda c: c - margin, scale)


def arcface_target(cos: jax.Array, margin: float) -> jax.Array:
  """ArcFace's true-class logit (before the scale): ``cos(theta + m)`` while ``theta <= pi -
  m``, else ``cos(theta) - m sin(m)`` (insightface's and PML's monotonic extension), with
  ``cos(theta + m) = cos(theta) cos(m) - sin(theta) sin(m)`` and
  ``sin(theta) = sqrt(max(1 - cos^2, ARCFACE_MIN_SIN_SQ))``. float ``[B]`` -> ``[B]``."""
  cos = jnp.clip(cos, -1.0, 1.0)
  sin = jnp.sqrt(jnp.maximum(1.0 - jnp.square(cos), ARCFACE_MIN_SIN_SQ))
  plus = cos * math.cos(margin) - sin * math.sin(margin)
  return jnp.where(cos >= -math.cos(margin), plus, cos - margin * math.sin(margin))


def arcface(*, margin: float = 0.5, scale: float = 64.0):
  """ArcFace / additive angular margin loss (Deng et al., CVPR 2019, eq. 3).

  The true class's logit is ``s cos(theta_y + m)`` (see :func:`arcface_target` for
  ``theta_y > pi - m``), the others ``s cos(theta_j)``. Defaults ``m = 0.5`` radians (28.6
  degrees; PML's ``margin`` is in degrees) and ``s = 64`` (the paper).

  Args:
    margin: ``m`` in radians, in ``[0, pi/2)``, default 0.5.
    scale: ``s > 0``, default 64.

  Returns:
    ``(init, apply)``; use ``make('arcface', ...)``.
  """
  margin = hparams.number("margin", margin, positive=False)
  if margin >= math.pi / 2:
    raise ValueError(f"margin={margin} is in radians and must be below pi/2 (ArcFace uses 0.5); "
                     "did you pass degrees?")
  scale = hparams.number("scale", scale, positive=True)
  return _softmax_objective("arcface", lambda c: arcface_target(c, margin), scale)
