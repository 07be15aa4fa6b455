r"""Class-collapse diagnostics (EPS paper §3-5): measure collapse, not only see it.

For embeddings ``x [N, D]`` (L2-normalised first when ``similarity='cosine'``) with labels
``y``:

* **intra-class spread** of class ``c``: ``spread_c = mean_{i in c} |x_i - mu_c|^2`` (``mu_c``
  the class mean), and ``relative_spread_c = spread_c / mean_i |x_i - mu|^2`` (``mu`` the
  global mean): 0 = the class is one point (collapsed), ~1 = as spread as the whole set;
* **modes per class**: ``method='bic'`` (default) fits a Gaussian mixture with ``k = 1 ..
  max_modes`` components (``covariance_type='diag'``, ``reg_covar=1e-4``, 3 initialisations,
  seeded) to the class's points and keeps the ``k`` of lowest BIC; ``method='silhouette'``
  runs KMeans for ``k = 2 .. max_modes`` and keeps the best-silhouette ``k`` if its silhouette
  exceeds ``silhouette_threshold`` (default 0.5), else 1. A class with fewer than
  ``4 * max_modes`` points is tested up to ``max(1, n // 4)`` modes. Collapse (EPS paper)
  shows as one mode where the class has several sub-classes;
* **spectral decay** ``rho`` (Roth et al.): ``dml_jax.evaluation.metrics.spectral_decay``.

With a sub-class labelling (e.g. the digit inside even/odd: ``--sub_label_set=digit``) the
report also gives each class's number of sub-classes, to compare with the modes found.

  python -m dml_jax.analysis.collapse --workdir=W [--split=train] [--sub_label_set=digit]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import numpy as np

from dml_jax.analysis import common
from dml_jax.evaluation import metrics as metrics_lib

MODE_METHODS = ("bic", "silhouette")


def _prepare(embeddings, labels, similarity: str):
  x = np.asarray(embeddings, np.float64)
  labels = np.asarray(labels)
  if x.ndim != 2 or labels.shape != (x.shape[0],):
    raise ValueError(f"Need embeddings [N, D] and labels [N], got {x.shape} and {labels.shape}.")
  if similarity not in common.SIMILARITIES:
    raise ValueError(f"Unknown similarity {similarity!r}; allowed: {common.SIMILARITIES}.")
  if similarity == "cosine":
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
  return x, labels


def intra_class_spread(embeddings, labels, *, similarity: str = "cosine") -> dict:
  """``{'classes': [C], 'spread': [C], 'relative_spread': [C], 'mean_relative_spread'}``."""
  x, labels = _prepare(embeddings, labels, similarity)
  total = np.mean(np.sum((x - x.mean(0)) ** 2, 1))
  classes = np.unique(labels)
  spread = np.array([np.mean(np.sum((x[labels == c] - x[labels == c].mean(0)) ** 2, 1))
                     for c in classes])
  rel = spread / max(total, 1e-12)
  return {"classes": classes, "spread": spread, "relative_spread": rel,
          "mean_relative_spread": float(rel.mean())}


def count_modes(points, *, max_modes: int = 5, method: str = "bic", seed: int = 0,
                silhouette_threshold: float = 0.5) -> int:
  """Number of modes of ``points [n, D]`` (module docstring)."""
  if method not in MODE_METHODS:
    raise ValueError(f"Unknown method {method!r}; allowed: {', '.join(MODE_METHODS)}.")
  if max_modes < 1:
    raise ValueError(f"max_modes must be >= 1, got {max_modes}.")
  x = np.asarray(points, np.float64)
  top = min(max_modes, max(1, x.shape[0] // 4))
  if top == 1:
    return 1
  if method == "bic":
    from sklearn.mixture import GaussianMixture  # pylint: disable=import-outside-toplevel
    bics = [GaussianMixture(k, covariance_type="diag", reg_covar=1e-4, n_init=3,
                            random_state=seed).fit(x).bic(x) for k in range(1, top + 1)]
    return int(np.argmin(bics)) + 1
  from sklearn.cluster import KMeans  # pylint: disable=import-outside-toplevel
  from sklearn.metrics import silhouette_score  # pylint: disable=import-outside-toplevel
  best_k, best = 1, silhouette_threshold
  for k in range(2, top + 1):
    assign = KMeans(k, n_init=5, random_state=seed).fit_predict(x)
    if len(np.unique(assign)) < 2:
      continue
    score = silhouette_score(x, assign)
    if score > best:
      best_k, best = k, score
  return best_k


def modes_per_class(embeddings, labels, *, similarity: str = "cosine", max_modes: int = 5,
                    method: str = "bic", seed: int = 0,
                    silhouette_threshold: float = 0.5) -> dict:
  """``{'classes': [C], 'modes': [C] int}`` (:func:`count_modes` per class)."""
  x, labels = _prepare(embeddings, labels, similarity)
  classes = np.unique(labels)
  modes = np.array([count_modes(x[labels == c], max_modes=max_modes, method=method, seed=seed,
                                silhouette_threshold=silhouette_threshold) for c in classes])
  return {"classes": classes, "modes": modes}


def collapse_report(embeddings, labels, sub_labels=None, *, similarity: str = "cosine",
                    max_modes: int = 5, method: str = "bic", seed: int = 0) -> dict:
  """Spread, modes, ``rho`` and (with ``sub_labels [N]``) sub-classes per class, as plain
  JSON-able Python values."""
  spread = intra_class_spread(embeddings, labels, similarity=similarity)
  modes = modes_per_class(embeddings, labels, similarity=similarity, max_modes=max_modes,
                          method=method, seed=seed)
  x, labels_np = _prepare(embeddings, labels, similarity)
  report = {
      "classes": spread["classes"].tolist(),
      "spread": spread["spread"].tolist(),
      "relative_spread": spread["relative_spread"].tolist(),
      "mean_relative_spread": spread["mean_relative_spread"],
      "modes": modes["modes"].tolist(),
      "rho": metrics_lib.spectral_decay(x.astype(np.float32)),
      "method": method,
  }
  if sub_labels is not None:
    sub = np.asarray(sub_labels)
    report["subclasses"] = [int(len(np.unique(sub[labels_np == c]))) for c in spread["classes"]]
  return report


PER_CLASS_PLOT_LIMIT = 50   # more classes: histograms over the classes instead of a bar each


def plot_collapse(report: dict, *, path: str, title: str = "") -> str:
  """PNG: modes found per class (and sub-classes, when known) and relative spread per class;
  with more than ``PER_CLASS_PLOT_LIMIT`` classes, their histograms over the classes."""
  plt = common.pyplot()
  classes = np.arange(len(report["classes"]))
  fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=80)
  if len(classes) > PER_CLASS_PLOT_LIMIT:
    edges = np.arange(0.5, max(max(report["modes"]), max(report.get("subclasses", [1]))) + 1.5)
    a1.hist(report["modes"], edges, alpha=0.7, rwidth=0.8, label=f"modes ({report['method']})")
    if "subclasses" in report:
      a1.hist(report["subclasses"], edges, alpha=0.7, rwidth=0.8, label="sub-classes")
    a1.set_xticks(np.arange(1, len(edges)))
    a1.set_xlabel("modes per class")
    a1.set_ylabel("classes")
    a1.legend(fontsize=8)
    a2.hist(report["relative_spread"], 40)
    a2.set_xlabel("relative intra-class spread")
    a2.set_ylabel("classes")
    fig.suptitle(f"{title}  {len(classes)} classes  rho={report['rho']:.3f}", fontsize=9)
    return common.save(fig, path)
  width = 0.4 if "subclasses" in report else 0.8
  a1.bar(classes - (width / 2 if "subclasses" in report else 0), report["modes"], width,
         label=f"modes ({report['method']})")
  if "subclasses" in report:
    a1.bar(classes + width / 2, report["subclasses"], width, label="sub-classes")
  a1.set_xticks(classes)
  a1.set_xticklabels([str(c) for c in report["classes"]])
  a1.set_xlabel("class")
  a1.legend(fontsize=8)
  a2.bar(classes, report["relative_spread"])
  a2.set_xticks(classes)
  a2.set_xticklabels([str(c) for c in report["classes"]])
  a2.set_xlabel("class")
  a2.set_ylabel("relative intra-class spread")
  fig.suptitle(f"{title}  rho={report['rho']:.3f}", fontsize=9)
  return common.save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dml_jax.analysis.collapse",
                                   description="Class-collapse diagnostics of a checkpoint.")
  common.add_workdir_args(parser)
  parser.add_argument("--split", default="train")
  parser.add_argument("--label_set", default="", help="class labels (default: split labels)")
  parser.add_argument("--sub_label_set", default="", help="e.g. digit (sub-classes)")
  parser.add_argument("--method", default="bic", choices=MODE_METHODS)
  parser.add_argument("--max_modes", type=int, default=5)
  args = common.parse_args(parser, argv)
  step, data, config = common.load_embeddings(args.workdir, step=args.step,
                                              data=common.data_paths(args), at_init=args.at_init,
                                              splits=(args.split,))
  emb, split = data[args.split]
  labels = common.labels_of(split, args.label_set)
  sub = common.labels_of(split, args.sub_label_set) if args.sub_label_set else None
  report = collapse_report(emb, labels, sub, similarity=config.eval.similarity,
                           max_modes=args.max_modes, method=args.method, seed=config.seed)
  out_dir = args.out or args.workdir
  os.makedirs(out_dir, exist_ok=True)
  stem = os.path.join(out_dir, f"collapse_{args.split}_step_{step}")
  with open(stem + ".json", "w") as f:
    json.dump(report, f, indent=2)
  plot_collapse(report, path=stem + ".png", title=f"{args.split} step {step}")
  print(json.dumps({k: v for k, v in report.items()}, indent=None))
  print(f"Written: {stem}.png, {stem}.json")
  return 0


if __name__ == "__main__":
  sys.exit(common.run(main, "python -m dml_jax.analysis.collapse"))
