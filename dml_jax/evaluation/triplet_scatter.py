r"""Triplet scatter diagram (2nd-order paper §3, Fig. 1 and 6).

One point per anchor ``a`` of a split at ``(S_ap, S_an)``: the similarity of its *easiest*
positive (``max_{p != a, y_p = y_a} S_ap``) and of its *hardest* negative
(``max_{y_n != y_a} S_an``), coloured by whether the anchor is correctly retrieved (its nearest
neighbour, self excluded, shares its label). Points below the diagonal ``S_an = S_ap`` are the
correctly retrieved ones (ties aside: the nearest neighbour is the first index of the row
maximum).

Computed and drawn here, at ``config.scatter_every_steps`` of training; the command-line tool
is ``python -m dml_jax.analysis.scatter``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dml_jax import similarity as sim
from dml_jax.evaluation import knn
from dml_jax.evaluation import report


def scatter_points(embeddings, labels, *, similarity: str = "cosine", block_size: int = 1024):
  """``(s_ap, s_an, correct)`` of the triplet scatter diagram.

  Args:
    embeddings: float ``[N, D]``.
    labels: int ``[N]``.
    similarity: ``'cosine'`` (default; rows normalised), ``'dot'`` or ``'neg_sq_euclidean'``
      (computed, as the retrieval search, on the embeddings moved by
      ``knn.euclidean_shift``: the same distances, rounded as embeddings near the origin).
    block_size: rows per block (memory ``O(block_size N)``).

  Returns:
    float32 ``s_ap [N]`` (easiest positive; NaN when the anchor has no positive), float32
    ``s_an [N]`` (hardest negative; NaN when none) and bool ``correct [N]`` (the nearest
    neighbour, self excluded, has the anchor's label).
  """
  x = np.asarray(embeddings, np.float32)
  labels = np.asarray(labels)
  if labels.shape != (x.shape[0],):
    raise ValueError(f"labels must have shape [{x.shape[0]}], got {labels.shape}.")
  if x.shape[0] < 2:
    raise ValueError(f"Need at least 2 embeddings, got {x.shape[0]}.")
  x, = knn.near_origin(similarity, x)
  n = x.shape[0]
  s_ap, s_an = np.empty(n, np.float32), np.empty(n, np.float32)
  correct = np.empty(n, bool)
  for start in range(0, n, block_size):
    rows = np.arange(start, min(start + block_size, n))
    s = np.array(sim.pairwise_similarity(jnp.asarray(x[rows]), jnp.asarray(x), kind=similarity))
    s[np.arange(len(rows)), rows] = -np.inf                     # self excluded
    same = labels[rows][:, None] == labels[None, :]
    pos = np.where(same, s, -np.inf).max(1)
    neg = np.where(~same, s, -np.inf).max(1)
    s_ap[rows] = np.where(np.isfinite(pos), pos, np.nan)
    s_an[rows] = np.where(np.isfinite(neg), neg, np.nan)
    correct[rows] = labels[np.argmax(s, axis=1)] == labels[rows]
  return s_ap, s_an, correct


def plot_scatter(s_ap, s_an, correct, *, path: str, title: str = "",
                 similarity: str = "cosine") -> str:
  """PNG of the scatter diagram: green = correctly retrieved, red = not; the diagonal
  ``S_an = S_ap``; axes ``[-1, 1]`` for cosine, the data range otherwise. Anchors with a NaN
  coordinate are left out (their number is in the title)."""
  plt = report.pyplot()
  s_ap, s_an, correct = (np.asarray(v) for v in (s_ap, s_an, correct))
  ok = np.isfinite(s_ap) & np.isfinite(s_an)
  fig, ax = plt.subplots(figsize=(5, 5), dpi=80)
  for sel, colour, name in ((ok & correct, "tab:green", "correct"),
                            (ok & ~correct, "tab:red", "wrong")):
    ax.scatter(s_ap[sel], s_an[sel], s=5, alpha=0.5, c=colour,
               label=f"{name} ({int(sel.sum())})")
  if similarity == "cosine":
    lo, hi = -1.0, 1.0
  else:
    vals = np.concatenate([s_ap[ok], s_an[ok]]) if ok.any() else np.array([0.0, 1.0])
    lo, hi = float(vals.min()), float(vals.max())
    pad = 0.05 * max(hi - lo, 1e-6)
    lo, hi = lo - pad, hi + pad
  ax.plot([lo, hi], [lo, hi], "k--", lw=1)
  ax.set_xlim(lo, hi)
  ax.set_ylim(lo, hi)
  ax.set_xlabel("S_ap (easiest positive)")
  ax.set_ylabel("S_an (hardest negative)")
  dropped = int((~ok).sum())
  ax.set_title(title + (f" ({dropped} anchors without pos/neg)" if dropped else ""), fontsize=9)
  ax.legend(fontsize=8, loc="upper left", markerscale=3)
  return report.save(fig, path)


def split_pairs(s, labels) -> tuple[np.ndarray, np.ndarray]:
  """The similarities of the positive and of the negative pairs ``i < j`` of ``s [N, N]``
  (labels int ``[N]``), as float32 ``[P]`` and ``[M]`` (what the similarity histograms
  show)."""
  s, labels = np.asarray(s, np.float32), np.asarray(labels)
  i, j = np.triu_indices(len(labels), k=1)
  same = labels[i] == labels[j]
  values = s[i, j]
  return values[same], values[~same]


def pair_similarities(embeddings, labels, *, similarity: str = "cosine", max_points: int = 1000,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """:func:`split_pairs` of the similarities among at most ``max_points`` rows of
  ``embeddings [N, D]`` (drawn with ``seed`` when ``N > max_points``)."""
  x, labels = np.asarray(embeddings, np.float32), np.asarray(labels)
  if len(x) > max_points:
    rows = np.sort(np.random.default_rng(seed).choice(len(x), max_points, replace=False))
    x, labels = x[rows], labels[rows]
  x, = knn.near_origin(similarity, x)
  return split_pairs(sim.pairwise_similarity(jnp.asarray(x), kind=similarity), labels)
