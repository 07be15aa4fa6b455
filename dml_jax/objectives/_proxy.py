"""Proxy-based objectives: ``proxy_nca`` and ``proxy_anchor`` (one learnable proxy per class,
no mining, no n-per-class batches needed).

The parameters are the proxies ``{'proxies': float32 [C, D]}``, which ``init`` draws and
``apply`` differentiates through (their learning rate: ``optimizer.objective_learning_rate``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax import losses
from dml_jax import similarity as sim
from dml_jax.objectives import _common
from dml_jax.objectives._registry import register

PROXY_ACTIVE_WEIGHT = 1e-3   # a proxy-NCA anchor is active when 1 - p(true proxy) exceeds this


@register("proxy_nca", parameters=True)
def proxy_nca(*, temperature: float = 1.0, denominator: str = "negatives",
              proxy_norm: float = 1.0):
  """Proxy-NCA (Movshovitz-Attias et al. 2017): one learnable proxy per class, no mining.

  ``init(rng, num_classes=C, dim=D)`` returns ``{'proxies': float32 [C, D]}``: rows drawn from
  a standard normal and L2-normalised (``C >= 2``). ``apply`` L2-normalises the embeddings
  ``x`` and the proxies ``p`` (cosine similarity), so ``d^2(x, p) = 2 - 2 cos(x, p)``, and
  averages over the anchors (``losses.proxy_nca``)

  ``L_a = d^2(x_a, p_y) / T + log sum_{z != y} exp(-d^2(x_a, p_z) / T)``

  (``denominator='negatives'``, the paper's NCA form, which excludes the true proxy and can be
  negative), or with the sum over all ``C`` proxies (``'all'``: softmax cross-entropy on
  ``-d^2 / T``, as most re-implementations). ``temperature=1`` is the paper's formula; a
  smaller ``T`` is the usual "scale" (e.g. ``T = 1/9`` = embeddings and proxies scaled to norm
  3). Gradients reach both the embeddings and the proxies.

  Labels must lie in ``[0, C)``: the shapes cannot show it, so ``apply`` raises ``ValueError``
  when it sees concrete labels and, under ``jit``, an anchor with an out-of-range label makes
  the loss NaN (never a wrong proxy). ``rng`` is unused. ``aux``: every anchor is valid;
  ``active_fraction`` = anchors whose true-proxy softmax probability (over all proxies, ``T``)
  is below ``1 - 1e-3``; ``mean_s_ap`` / ``mean_s_an`` = cosine to the true proxy / the mean
  cosine to the other proxies.

  Args:
    temperature: ``T > 0``, default 1.
    denominator: ``'negatives'`` (default, the paper) or ``'all'``.
    proxy_norm: length of the class vectors at ``init`` (``> 0``), default 1 (see
      ``objectives._common.init_proxies``).

  Returns:
    ``(init, apply)``; use ``make('proxy_nca', ...)``.
  """
  temperature = hparams.number("temperature", temperature, positive=True)
  hparams.choice("denominator", denominator, losses.PROXY_DENOMINATORS)

  def body(b):
    s, true, ok = b.s, b.true, b.ok                                   # float32 [B, C], [B, C]
    d2 = sim.squared_distance(s, kind="cosine")
    terms = losses.proxy_nca(d2, true, temperature=temperature, denominator=denominator)
    loss = losses.reduce(jnp.where(ok, terms, jnp.nan), jnp.ones_like(ok), "batch")
    p_true = jnp.sum(jnp.where(true, jax.nn.softmax(-d2 / temperature, axis=1), 0.0), axis=1)
    s_ap = jnp.sum(jnp.where(true, s, 0.0), axis=1)
    s_an = _common.row_mean(s, ~true)
    col = lambda x: x[:, None]
    return loss, _common.aux(col(ok), col(1.0 - p_true > PROXY_ACTIVE_WEIGHT), col(s_ap), col(s_an))

  return _common.proxy_init(proxy_norm), _common.class_objective(body, name="proxy_nca")


@register("proxy_anchor", parameters=True)
def proxy_anchor(*, margin: float = 0.1, alpha: float = 32.0, proxy_norm: float = 1.0):
  """Proxy-Anchor loss (Kim et al., CVPR 2020, eq. 4): proxies as anchors.

  With ``s(x, p)`` the cosine of an embedding and a proxy, ``P+`` the proxies of the classes in
  the batch and ``X_p+`` / ``X_p-`` the batch's embeddings of / not of class ``p``:

  ``L = (1/|P+|) sum_{p in P+} log(1 + sum_{x in X_p+} e^{-alpha (s(x, p) - margin)})
  + (1/C) sum_{p} log(1 + sum_{x in X_p-} e^{alpha (s(x, p) + margin)})``.

  Defaults ``margin = 0.1``, ``alpha = 32`` (the paper). ``init`` draws unit-norm Gaussian
  proxies (the paper: Kaiming normal, norm ``sqrt(2 D / C)``; the loss does not depend on the
  norm, but a unit proxy turns ``sqrt(2 D / C)`` times faster at the same learning rate, see
  ``init_proxies``; ``proxy_norm = sqrt(2 D / C)`` starts at the paper's length). The paper
  trains the proxies with a 100x larger learning rate: ``optimizer.objective_learning_rate``.
  Labels must lie in ``[0, C)`` (as ``proxy_nca``). ``aux``: every anchor is valid;
  ``active_fraction`` = pairs (embedding, proxy) with a gradient weight above ``1e-3``;
  ``mean_s_ap`` / ``mean_s_an`` = cosine to the own proxy / mean cosine to the others.

  Args:
    margin: ``delta``, default 0.1.
    alpha: scale ``> 0``, default 32.
    proxy_norm: length of the class vectors at ``init`` (``> 0``), default 1 (see
      ``objectives._common.init_proxies``).

  Returns:
    ``(init, apply)``; use ``make('proxy_anchor', ...)``.
  """
  margin = hparams.real("margin", margin)
  alpha = hparams.number("alpha", alpha, positive=True)

  def terms(s, true):
    lse_p, _ = losses.masked_logsumexp(-alpha * (s - margin), true, axis=0)        # [C]
    lse_n, _ = losses.masked_logsumexp(alpha * (s + margin), ~true, axis=0)
    with_pos = jnp.any(true, axis=0)
    pos = jnp.sum(jnp.where(with_pos, jax.nn.softplus(lse_p), 0.0))
    neg = jnp.sum(jnp.where(jnp.any(~true, axis=0), jax.nn.softplus(lse_n), 0.0))
    return pos / jnp.maximum(jnp.sum(with_pos), 1) + neg / s.shape[1]

  def body(b):
    s, true, ok = b.s, b.true, b.ok                                   # float32 [B, C], [B, C]
    loss = jnp.where(jnp.all(ok), terms(s, true), jnp.nan)
    sg = jax.lax.stop_gradient(s)
    weight = jax.grad(lambda x: terms(x, true))(sg)
    col = lambda x: x[:, None]
    aux = _common.aux(col(ok), col(ok), col(jnp.sum(jnp.where(true, sg, 0.0), axis=1)),
                      col(_common.row_mean(sg, ~true)))
    aux["active_fraction"] = jnp.mean((jnp.abs(weight) > PROXY_ACTIVE_WEIGHT).astype(jnp.float32))
    return loss, aux

  return _common.proxy_init(proxy_norm), _common.class_objective(body, name="proxy_anchor")
