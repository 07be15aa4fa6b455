"""Proxy-based objectives: ``proxy_nca`` (one learnable proxy per class, no mining).

Terms are the anchors (every anchor is valid); the parameters are the proxies, which ``init``
draws and ``apply`` differentiates through.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax import losses
from dml_jax import similarity as sim
from dml_jax.objectives import _common

PROXY_ACTIVE_WEIGHT = 1e-3   # a proxy-NCA anchor is active when 1 - p(true proxy) exceeds this


def proxy_nca(*, temperature: float = 1.0, denominator: str = "negatives"):
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

  Returns:
    ``(init, apply)``; use ``make('proxy_nca', ...)``.
  """
  temperature = hparams.number("temperature", temperature, positive=True)
  hparams.choice("denominator", denominator, losses.PROXY_DENOMINATORS)

  def init(rng, *, num_classes: int, dim: int) -> dict:
    """``{'proxies': float32 [num_classes, dim]}``, unit-norm Gaussian rows."""
    num_classes = hparams.integer("num_classes", num_classes, minimum=2)
    dim = hparams.integer("dim", dim, minimum=1)
    proxies = jax.random.normal(rng, (num_classes, dim), jnp.float32)
    return {"proxies": sim.l2_normalize(proxies)}

  def apply(params, embeddings, labels, *, rng=None):
    del rng
    embeddings, labels = _common.check_batch(embeddings, labels)
    proxies = _common.param(params, "proxies", name="proxy_nca")
    if proxies.ndim != 2 or proxies.shape[1] != embeddings.shape[1] or proxies.shape[0] < 2:
      raise ValueError(f"params['proxies'] must have shape [C >= 2, {embeddings.shape[1]}], "
                       f"got {proxies.shape}.")
    num = proxies.shape[0]
    ok = _common.check_label_range(labels, num, what="proxies")
    s = sim.pairwise_similarity(embeddings, proxies, kind="cosine")   # float32 [B, C]
    d2 = sim.squared_distance(s, kind="cosine")
    true = labels[:, None] == jnp.arange(num)[None, :]                # [B, C]
    terms = losses.proxy_nca(d2, true, temperature=temperature, denominator=denominator)
    loss = losses.reduce(jnp.where(ok, terms, jnp.nan), jnp.ones_like(ok), "batch")
    p_true = jnp.sum(jnp.where(true, jax.nn.softmax(-d2 / temperature, axis=1), 0.0), axis=1)
    s_ap = jnp.sum(jnp.where(true, s, 0.0), axis=1)
    s_an = _common.row_mean(s, ~true)
    col = lambda x: x[:, None]
    return loss, _common.aux(col(ok), col(1.0 - p_true > PROXY_ACTIVE_WEIGHT), col(s_ap), col(s_an))

  return init, apply
