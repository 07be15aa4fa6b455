r"""t-SNE (scikit-learn) of train and test embeddings, coloured by class and by every sub-class
label set of the split (e.g. the digit inside even/odd: ``Split.label_sets['digit']``).

Embeddings are L2-normalised first for ``similarity='cosine'``; more than ``max_points``
points are subsampled uniformly (seeded). ``sklearn.manifold.TSNE(perplexity=30,
init='pca', random_state=seed)``; the perplexity is lowered to ``(n - 1) / 3`` for tiny sets.

  python -m dml_jax.analysis.tsne --workdir=W [--step=N] [--splits=train,test]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from dml_jax.analysis import common


def tsne_2d(embeddings, *, perplexity: float = 30.0, seed: int = 0, max_points: int = 2000,
            similarity: str = "cosine", max_iter: int = 1000):
  """``(points [M, 2], indices [M])``: t-SNE of (a subsample of) ``embeddings [N, D]``
  (``max_iter`` optimisation iterations, scikit-learn's default 1000)."""
  from sklearn.manifold import TSNE  # pylint: disable=import-outside-toplevel
  x = np.asarray(embeddings, np.float32)
  if x.ndim != 2 or x.shape[0] < 4:
    raise ValueError(f"t-SNE needs embeddings [N >= 4, D], got {x.shape}.")
  if max_points < 4:
    raise ValueError(f"max_points={max_points}: t-SNE needs at least 4 points.")
  if similarity == "cosine":
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
  idx = np.arange(x.shape[0])
  if x.shape[0] > max_points:
    idx = np.sort(np.random.default_rng(seed).choice(x.shape[0], max_points, replace=False))
  perplexity = min(perplexity, (len(idx) - 1) / 3.0)
  points = TSNE(2, perplexity=perplexity, init="pca", random_state=seed,
                max_iter=max_iter).fit_transform(x[idx])
  return points.astype(np.float32), idx


def plot_tsne(panels: Sequence[tuple[str, np.ndarray, Mapping[str, np.ndarray]]], *,
              path: str, title: str = "") -> str:
  """PNG: one row per ``(name, points [M, 2], {labelling: labels [M]})``, one panel per
  labelling."""
  plt = common.pyplot()
  cols = max(len(l) for _, _, l in panels)
  fig, axes = plt.subplots(len(panels), cols, figsize=(4.2 * cols, 4 * len(panels)), dpi=60,
                           squeeze=False)
  for row, (name, points, labellings) in zip(axes, panels):
    for ax, (lname, labels) in zip(row, labellings.items()):
      for value in np.unique(labels):
        sel = labels == value
        ax.scatter(points[sel, 0], points[sel, 1], s=4, alpha=0.7, label=str(value))
      ax.set_title(f"{name}: by {lname}", fontsize=9)
      ax.set_xticks([])
      ax.set_yticks([])
      if len(np.unique(labels)) <= 12:
        ax.legend(fontsize=6, markerscale=2, loc="best")
    for ax in row[len(labellings):]:
      ax.axis("off")
  if title:
    fig.suptitle(title, fontsize=10)
  return common.save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dml_jax.analysis.tsne",
                                   description="t-SNE of a checkpoint's embeddings.")
  common.add_workdir_args(parser)
  parser.add_argument("--splits", default="train,test")
  parser.add_argument("--perplexity", type=float, default=30.0)
  parser.add_argument("--max_points", type=int, default=2000)
  parser.add_argument("--max_iter", type=int, default=1000)
  args = common.parse_args(parser, argv)
  names = tuple(s for s in args.splits.split(",") if s)
  step, data, config = common.load_embeddings(args.workdir, step=args.step,
                                              data=common.data_paths(args), at_init=args.at_init,
                                              splits=names)
  panels = []
  for name in names:
    emb, split = data[name]
    points, idx = tsne_2d(emb, perplexity=args.perplexity, seed=config.seed,
                          max_points=args.max_points, similarity=config.eval.similarity,
                          max_iter=args.max_iter)
    labellings = {"class": np.asarray(split.labels)[idx]}
    labellings.update({k: np.asarray(v)[idx] for k, v in split.label_sets.items()})
    panels.append((name, points, labellings))
  path = os.path.join(args.out or args.workdir, f"tsne_step_{step}.png")
  plot_tsne(panels, path=path, title=f"{args.workdir} step {step}")
  print(f"Written: {path}")
  return 0


if __name__ == "__main__":
  sys.exit(common.run(main, "python -m dml_jax.analysis.tsne"))
