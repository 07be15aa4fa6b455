r"""Gradient vector fields on the triplet scatter diagram (2nd-order paper §4-5, Fig. 2, App. A-F).

One gradient step of a triplet loss moves the unit vectors ``f_a, f_p, f_n`` directly (learning
rate ``alpha``); after the step the similarities are cosines again (eqs. 9-10):

  dS_ap = S_ap^new / (|f_a^new| |f_p^new|) - S_ap,   dS_an = S_an^new / (|f_a^new| |f_n^new|) - S_an

Every loss of the paper gives an update of the same shape,

  f_p^new = c_p f_p + b_p f_a,   f_n^new = c_n f_n - b_n f_a,   f_a^new = f_a + b_p f_p - b_n f_n

so, with ``S_pn = S_ap S_an + gamma sqrt(1 - S_ap^2) sqrt(1 - S_an^2)`` (eq. 19; ``gamma`` is the
cosine between the components of ``f_p`` and ``f_n`` orthogonal to ``f_a``, *not* a step
size),

  S_ap^new = c_p S_ap + b_p (1 + c_p) + b_p^2 S_ap - b_n c_p S_pn - b_n b_p S_an
  S_an^new = c_n S_an - b_n (1 + c_n) + b_n^2 S_an + b_p c_n S_pn - b_p b_n S_ap
  |f_p^new|^2 = (c_p + b_p S_ap)^2 + b_p^2 (1 - S_ap^2)
  |f_n^new|^2 = (c_n - b_n S_an)^2 + b_n^2 (1 - S_an^2)
  |f_a^new|^2 = (1 + b_p S_ap - b_n S_an)^2 + (b_p sqrt(1 - S_ap^2) - gamma b_n sqrt(1 - S_an^2))^2
                + (b_n sqrt(1 - gamma^2) sqrt(1 - S_an^2))^2

which is, per loss (``T`` = ``temperature``, 1 in the paper):

* ``'nca'`` (L^1st, eq. 1): ``c_p = c_n = 1``, ``b_p = b_n = beta = alpha q / T`` with
  ``q = e^{S_an/T} / (e^{S_ap/T} + e^{S_an/T})`` -> eqs. 7-8, 20-22;
* ``'nca_2nd'`` (L^2nd, eq. 16): ``c_p = c_n = 1``, ``b_p = beta_w (1 - S_ap)``,
  ``b_n = beta_w S_an`` with ``beta_w = alpha q_w / T``, ``q_w`` the softmax weight of
  ``S_an^2/2`` against ``S_ap - S_ap^2/2`` -> eqs. 23-27;
* ``'triplet'`` (vanilla, eq. 28, on ``|f_a - f_p|^2`` as in App. E): ``b_p = b_n = beta``,
  ``c_p = 1 - beta``, ``c_n = 1 + beta`` with ``beta = 2 alpha`` -> eqs. 32-39. The paper
  writes ``beta = 2`` and leaves the step size out of eqs. 32-34; we keep ``alpha`` so all
  three losses take the same step. The paper assumes the hinge is active (``D > 0``)
  everywhere (``triplet_margin=None``, default); a number instead zeroes the update where
  ``D = (2 - 2 S_ap) - (2 - 2 S_an) + margin <= 0``.

Entanglement (eqs. 11-12) with strength ``p``:

  dS_ap^total = dS_ap + p sqrt(S_ap S_an) dS_an,   dS_an^total = dS_an + p sqrt(S_ap S_an) dS_ap

(``sqrt`` of ``max(S_ap S_an, 0)``, so the model also runs outside ``[0, 1]^2``).

:func:`autodiff_step` takes the same step with ``jax.grad`` of the library's losses
(``losses.nca``, ``losses.nca_2nd``, ``losses.triplet``) on explicit unit vectors in 3-D
(``f_a = e1``, ``f_p`` in the e1-e2 plane, ``f_n`` at angle ``arccos(gamma)`` out of it), so the
closed forms can be checked (the tests do).

The paper does not state the learning rate behind Fig. 2; our default ``learning_rate=0.1``
(the signs of the fields, which the figure's argument rests on, hardly depend on it).

  python -m dml_jax.analysis.vector_field --workdir=docs/figures --gamma=0.5 --p=0.4,0.8
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dml_jax import losses
from dml_jax.analysis import common

LOSSES = ("nca", "triplet", "nca_2nd")
TITLES = {"nca": "1st order (NCA)", "triplet": "vanilla triplet", "nca_2nd": "2nd order"}


def _check(loss: str, gamma: float, learning_rate: float, temperature: float) -> None:
  if loss not in LOSSES:
    raise ValueError(f"Unknown loss {loss!r}; allowed: {', '.join(LOSSES)}.")
  if not -1.0 <= gamma <= 1.0:
    raise ValueError(f"gamma must be in [-1, 1] (a cosine), got {gamma}.")
  if not learning_rate > 0:
    raise ValueError(f"learning_rate must be > 0, got {learning_rate}.")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}.")


def update_coefficients(s_ap, s_an, *, loss: str, learning_rate: float = 0.1,
                        temperature: float = 1.0, triplet_margin: float | None = None):
  """``(c_p, c_n, b_p, b_n)`` of the update (module docstring), each the shape of ``s_ap``.

  Args:
    s_ap, s_an: float ``[...]`` similarities in ``[-1, 1]`` (broadcastable).
    loss: one of ``LOSSES``.
    learning_rate: ``alpha > 0``.
    temperature: ``T > 0`` of the NCA losses (1 = the paper).
    triplet_margin: ``None`` (hinge always active, the paper) or the margin of ``'triplet'``.
  """
  _check(loss, 0.0, learning_rate, temperature)
  s_ap, s_an = np.broadcast_arrays(np.asarray(s_ap, np.float64), np.asarray(s_an, np.float64))
  one = np.ones_like(s_ap)
  if loss == "nca":
    beta = learning_rate * _sigmoid((s_an - s_ap) / temperature) / temperature
    return one, one, beta, beta
  if loss == "nca_2nd":
    lp, ln = s_ap - 0.5 * s_ap ** 2, 0.5 * s_an ** 2
    beta_w = learning_rate * _sigmoid((ln - lp) / temperature) / temperature
    return one, one, beta_w * (1.0 - s_ap), beta_w * s_an
  beta = 2.0 * learning_rate * one
  if triplet_margin is not None:
    active = (2 - 2 * s_ap) - (2 - 2 * s_an) + triplet_margin > 0
    beta = np.where(active, beta, 0.0)
  return 1.0 - beta, 1.0 + beta, beta, beta


def _sigmoid(x):
  return 0.5 * (1.0 + np.tanh(0.5 * x))


def closed_form_step(s_ap, s_an, *, loss: str, gamma: float, learning_rate: float = 0.1,
                     temperature: float = 1.0, triplet_margin: float | None = None):
  """``(dS_ap, dS_an)`` after one step, from the paper's closed forms (eqs. 7-10, 17-27, 32-39).

  Args:
    s_ap, s_an: float ``[...]`` in ``[-1, 1]``.
    loss: ``'nca'`` (L^1st), ``'nca_2nd'`` (L^2nd) or ``'triplet'`` (vanilla).
    gamma: relative orientation of ``f_p`` and ``f_n`` around ``f_a``, in ``[-1, 1]`` (eq. 19).
    learning_rate, temperature, triplet_margin: see :func:`update_coefficients`.

  Returns:
    float64 ``(dS_ap, dS_an)`` of the broadcast shape.
  """
  _check(loss, gamma, learning_rate, temperature)
  c_p, c_n, b_p, b_n = update_coefficients(s_ap, s_an, loss=loss, learning_rate=learning_rate,
                                           temperature=temperature,
                                           triplet_margin=triplet_margin)
  s_ap, s_an = np.broadcast_arrays(np.asarray(s_ap, np.float64), np.asarray(s_an, np.float64))
  r_ap = np.sqrt(np.clip(1 - s_ap ** 2, 0, None))
  r_an = np.sqrt(np.clip(1 - s_an ** 2, 0, None))
  s_pn = s_ap * s_an + gamma * r_ap * r_an                                     # eq. 19
  new_ap = c_p * s_ap + b_p * (1 + c_p) + b_p ** 2 * s_ap - b_n * c_p * s_pn - b_n * b_p * s_an
  new_an = c_n * s_an - b_n * (1 + c_n) + b_n ** 2 * s_an + b_p * c_n * s_pn - b_p * b_n * s_ap
  norm_p = np.sqrt((c_p + b_p * s_ap) ** 2 + b_p ** 2 * (1 - s_ap ** 2))
  norm_n = np.sqrt((c_n - b_n * s_an) ** 2 + b_n ** 2 * (1 - s_an ** 2))
  norm_a = np.sqrt((1 + b_p * s_ap - b_n * s_an) ** 2 + (b_p * r_ap - gamma * b_n * r_an) ** 2
                   + (b_n * np.sqrt(max(1 - gamma ** 2, 0.0)) * r_an) ** 2)
  return new_ap / (norm_a * norm_p) - s_ap, new_an / (norm_a * norm_n) - s_an


def entangle(d_ap, d_an, s_ap, s_an, *, p: float):
  """Entangled totals (eqs. 11-12): ``dS_ap + p sqrt(S_ap S_an) dS_an`` and the converse."""
  if not p >= 0:
    raise ValueError(f"entanglement p must be >= 0, got {p}.")
  q = p * np.sqrt(np.clip(np.asarray(s_ap) * np.asarray(s_an), 0, None))
  return d_ap + q * d_an, d_an + q * d_ap


def triplet_vectors(s_ap, s_an, *, gamma: float):
  """Unit vectors ``f_a, f_p, f_n`` ``[..., 3]`` with the given ``S_ap``, ``S_an`` and ``gamma``:
  ``f_a = e1``, ``f_p = S_ap e1 + sqrt(1 - S_ap^2) e2``,
  ``f_n = S_an e1 + sqrt(1 - S_an^2) (gamma e2 + sqrt(1 - gamma^2) e3)``."""
  s_ap, s_an = jnp.broadcast_arrays(jnp.asarray(s_ap, jnp.float32),
                                    jnp.asarray(s_an, jnp.float32))
  r_ap, r_an = jnp.sqrt(jnp.clip(1 - s_ap ** 2, 0)), jnp.sqrt(jnp.clip(1 - s_an ** 2, 0))
  zero, one = jnp.zeros_like(s_ap), jnp.ones_like(s_ap)
  f_a = jnp.stack([one, zero, zero], -1)
  f_p = jnp.stack([s_ap, r_ap, zero], -1)
  f_n = jnp.stack([s_an, gamma * r_an, np.sqrt(max(1 - gamma ** 2, 0.0)) * r_an], -1)
  return f_a, f_p, f_n


def _loss_of_vectors(f_a, f_p, f_n, *, loss: str, temperature: float, triplet_margin):
  """The loss of one triplet of (not necessarily unit) vectors ``[3]``, via ``dml_jax.losses``."""
  if loss == "triplet":
    margin = 8.0 if triplet_margin is None else triplet_margin  # 8 > max D: always active
    return losses.triplet(jnp.sum((f_a - f_p) ** 2), jnp.sum((f_a - f_n) ** 2), margin=margin)
  s_ap, s_an = jnp.sum(f_a * f_p), jnp.sum(f_a * f_n)
  if loss == "nca":
    return losses.nca(s_ap, s_an, temperature=temperature)
  return losses.nca_2nd(s_ap, s_an, temperature=temperature)


def autodiff_step(s_ap, s_an, *, loss: str, gamma: float, learning_rate: float = 0.1,
                  temperature: float = 1.0, triplet_margin: float | None = None):
  """``(dS_ap, dS_an)`` after one ``jax.grad`` step ``f <- f - alpha dL/df`` on the vectors of
  :func:`triplet_vectors`, similarities re-measured as cosines (eqs. 9-10). float32 arrays."""
  _check(loss, gamma, learning_rate, temperature)
  f_a, f_p, f_n = triplet_vectors(s_ap, s_an, gamma=gamma)
  shape = f_a.shape[:-1]
  fn = jax.vmap(jax.grad(lambda a, p_, n: _loss_of_vectors(
      a, p_, n, loss=loss, temperature=temperature, triplet_margin=triplet_margin),
      argnums=(0, 1, 2)))
  flat = [x.reshape(-1, 3) for x in (f_a, f_p, f_n)]
  g_a, g_p, g_n = fn(*flat)
  a, p_, n = (x - learning_rate * g for x, g in zip(flat, (g_a, g_p, g_n)))

  def cos(x, y):
    return jnp.sum(x * y, -1) / (jnp.linalg.norm(x, axis=-1) * jnp.linalg.norm(y, axis=-1))

  s_ap_f, s_an_f = (jnp.broadcast_to(jnp.asarray(v, jnp.float32), shape).reshape(-1)
                    for v in (s_ap, s_an))
  return ((cos(a, p_) - s_ap_f).reshape(shape), (cos(a, n) - s_an_f).reshape(shape))


def similarity_grid(*, num: int = 21, low: float = 0.0, high: float = 1.0):
  """``(S_ap, S_an)`` float64 ``[num, num]`` meshgrid (``S_an`` along rows, ``S_ap`` along
  columns) over ``[low, high]^2``; the default is the paper's ``Omega_s = [0, 1]^2``."""
  if not (-1.0 <= low < high <= 1.0) or num < 2:
    raise ValueError(f"Need -1 <= low < high <= 1 and num >= 2, got low={low}, high={high}, "
                     f"num={num}.")
  axis = np.linspace(low, high, num)
  return np.meshgrid(axis, axis)


def vector_field(*, loss: str, gamma: float, p: float, learning_rate: float = 0.1,
                 temperature: float = 1.0, triplet_margin: float | None = None,
                 num: int = 21, low: float = 0.0, high: float = 1.0) -> dict:
  """The field of one loss on :func:`similarity_grid`: ``{'s_ap', 's_an', 'd_ap', 'd_an',
  'total_ap', 'total_an'}`` float64 ``[num, num]`` plus the settings."""
  s_ap, s_an = similarity_grid(num=num, low=low, high=high)
  d_ap, d_an = closed_form_step(s_ap, s_an, loss=loss, gamma=gamma, learning_rate=learning_rate,
                                temperature=temperature, triplet_margin=triplet_margin)
  total_ap, total_an = entangle(d_ap, d_an, s_ap, s_an, p=p)
  return {"loss": loss, "gamma": gamma, "p": p, "learning_rate": learning_rate,
          "s_ap": s_ap, "s_an": s_an, "d_ap": d_ap, "d_an": d_an,
          "total_ap": total_ap, "total_an": total_an}


def plot_vector_fields(fields: Sequence[dict], *, path: str, title: str = "") -> str:
  """PNG with one row per field: heat maps of dS_ap, dS_an, dS_ap^total, dS_an^total (red =
  increase, blue = decrease, black line = 0) and the quiver plot of the totals."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  keys = (("d_ap", "ΔS_ap"), ("d_an", "ΔS_an"), ("total_ap", "ΔS_ap total"),
          ("total_an", "ΔS_an total"))
  fig, axes = plt.subplots(len(fields), 5, figsize=(16, 3.1 * len(fields)), dpi=50,
                           squeeze=False)
  for row, f in zip(axes, fields):
    extent = (f["s_ap"].min(), f["s_ap"].max(), f["s_an"].min(), f["s_an"].max())
    for ax, (key, name) in zip(row, keys):
      v = f[key]
      lim = max(np.abs(v).max(), 1e-12)
      im = ax.imshow(v, origin="lower", extent=extent, cmap="RdBu_r", vmin=-lim, vmax=lim,
                     aspect="auto")
      ax.contour(f["s_ap"], f["s_an"], v, levels=[0.0], colors="k", linewidths=1)
      fig.colorbar(im, ax=ax, fraction=0.046)
      ax.set_title(f"{TITLES[f['loss']]}: {name}\nγ={f['gamma']}, p={f['p']}", fontsize=8)
      ax.set_xlabel("S_ap", fontsize=8)
      ax.set_ylabel("S_an", fontsize=8)
    ax = row[4]
    step = max(1, f["s_ap"].shape[0] // 11)
    sl = (slice(None, None, step), slice(None, None, step))
    u, w = f["total_ap"][sl], f["total_an"][sl]
    norm = np.sqrt(u ** 2 + w ** 2) + 1e-12
    ax.quiver(f["s_ap"][sl], f["s_an"][sl], u / norm, w / norm, color="k", angles="xy",
              scale=22, width=0.006)
    ax.set_xlim(extent[0] - 0.05, extent[1] + 0.05)
    ax.set_ylim(extent[2] - 0.05, extent[3] + 0.05)
    ax.set_aspect("equal")
    ax.set_title(f"{TITLES[f['loss']]}: field of totals\nγ={f['gamma']}, p={f['p']}",
                 fontsize=8)
    ax.set_xlabel("S_ap", fontsize=8)
    ax.set_ylabel("S_an", fontsize=8)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path)
  plt.close(fig)
  return path


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dml_jax.analysis.vector_field",
                                   description="Gradient vector fields (2nd-order paper Fig. 2).")
  parser.add_argument("--workdir", required=True, help="output directory of the PNG")
  parser.add_argument("--losses", default="nca,nca_2nd", help=f"comma list of {LOSSES}")
  parser.add_argument("--gamma", type=float, default=0.5)
  parser.add_argument("--p", default="0.4,0.8", help="comma list of entanglement strengths")
  parser.add_argument("--learning_rate", type=float, default=0.1)
  parser.add_argument("--temperature", type=float, default=1.0)
  parser.add_argument("--num", type=int, default=41)
  parser.add_argument("--low", type=float, default=0.0)
  parser.add_argument("--high", type=float, default=1.0)
  parser.add_argument("--check", action="store_true",
                      help="also compare with a jax.grad step and print the max difference")
  args = parser.parse_args(argv)
  names = [n.strip() for n in args.losses.split(",") if n.strip()]
  ps = [float(v) for v in args.p.split(",") if v.strip()]
  fields = [vector_field(loss=n, gamma=args.gamma, p=p, learning_rate=args.learning_rate,
                         temperature=args.temperature, num=args.num, low=args.low,
                         high=args.high) for n in names for p in ps]
  if args.check:
    for f in fields:
      a_ap, a_an = autodiff_step(f["s_ap"], f["s_an"], loss=f["loss"], gamma=args.gamma,
                                 learning_rate=args.learning_rate,
                                 temperature=args.temperature)
      err = max(np.abs(np.asarray(a_ap) - f["d_ap"]).max(),
                np.abs(np.asarray(a_an) - f["d_an"]).max())
      print(f"{f['loss']}: max |closed form - jax.grad step| = {err:.2e}")
  path = os.path.join(args.workdir, f"vector_field_gamma{args.gamma:g}.png")
  plot_vector_fields(fields, path=path,
                     title=f"2nd-order paper Fig. 2: γ={args.gamma}, α={args.learning_rate}")
  print(f"Written: {path}")
  return 0


if __name__ == "__main__":
  sys.exit(common.run(main, "python -m dml_jax.analysis.vector_field"))
