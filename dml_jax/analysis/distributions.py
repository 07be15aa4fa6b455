r"""Similarity distributions (EPHN paper Fig. 2, 3, 5).

* :func:`pair_similarities`: similarities of all same-class pairs ``i < j`` (and of the
  different-class pairs) of a split -- EPHN Fig. 2 (how spread out a class is under each
  mining scheme);
* :func:`closest_gallery_similarity`: for each query (test) item, the similarity of its closest
  gallery (train) item -- EPHN Fig. 3 (how far the unseen classes land from the training
  data);
* closest-positive vs closest-negative similarity per anchor, for train and for test -- EPHN
  Fig. 5; this is ``scatter.scatter_points``.

``max_pairs`` subsamples pairs uniformly (seeded) when a split has more.

  python -m dml_jax.analysis.distributions --workdir=W [--step=N]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np

from dml_jax.analysis import common
from dml_jax.analysis import scatter


def pair_similarities(embeddings, labels, *, similarity: str = "cosine",
                      max_pairs: int = 200_000, seed: int = 0):
  """``(same [P], different [Q])`` float32 similarities of the unordered pairs ``i < j``."""
  labels = np.asarray(labels)
  s = common.similarity_matrix(embeddings, kind=similarity)
  if labels.shape != (s.shape[0],):
    raise ValueError(f"labels must have shape [{s.shape[0]}], got {labels.shape}.")
  i, j = np.triu_indices(s.shape[0], k=1)
  same = labels[i] == labels[j]
  rng = np.random.default_rng(seed)
  out = []
  for sel in (same, ~same):
    values = s[i[sel], j[sel]]
    if values.size > max_pairs:
      values = rng.choice(values, max_pairs, replace=False)
    out.append(values.astype(np.float32))
  return tuple(out)


def closest_gallery_similarity(query, gallery, *, similarity: str = "cosine",
                               block_size: int = 1024) -> np.ndarray:
  """float32 ``[Nq]``: ``max_g S(q, g)`` for each query row (query and gallery are disjoint)."""
  query = np.asarray(query, np.float32)
  return np.concatenate([common.similarity_matrix(query[k:k + block_size], gallery,
                                                  kind=similarity).max(1)
                         for k in range(0, query.shape[0], block_size)])


def distributions(train, train_labels, test, test_labels, *, similarity: str = "cosine",
                  seed: int = 0) -> dict:
  """All three diagnostics for a train and a test embedding (numpy arrays)."""
  out = {"similarity": similarity}
  for name, x, y in (("train", train, train_labels), ("test", test, test_labels)):
    out[f"{name}_same"], out[f"{name}_different"] = pair_similarities(
        x, y, similarity=similarity, seed=seed)
    s_ap, s_an, correct = scatter.scatter_points(x, y, similarity=similarity)
    out[f"{name}_s_ap"], out[f"{name}_s_an"], out[f"{name}_correct"] = s_ap, s_an, correct
  out["test_to_train"] = closest_gallery_similarity(test, train, similarity=similarity)
  out["train_to_train"] = _closest_other(train, similarity)
  return out


def _closest_other(x, similarity):
  s = common.similarity_matrix(x, kind=similarity)
  np.fill_diagonal(s, -np.inf)
  return s.max(1)


def plot_distributions(d: dict, *, path: str, title: str = "", bins: int = 40) -> str:
  """PNG with four panels: same/different-class histograms (train, test), test-to-closest-train
  (with train-to-closest-other-train for reference), closest positive vs negative (train and
  test, Fig. 5 style)."""
  plt = common.pyplot()
  fig, axes = plt.subplots(1, 4, figsize=(17, 4), dpi=60)
  ax = axes[0]
  for key, colour, style in (("train_same", "tab:blue", "-"), ("test_same", "tab:orange", "-"),
                             ("train_different", "tab:blue", ":"),
                             ("test_different", "tab:orange", ":")):
    ax.hist(d[key], bins, density=True, histtype="step", color=colour, ls=style, lw=1.5,
            label=key.replace("_", " "))
  ax.set_title("pair similarities (Fig. 2)", fontsize=9)
  ax.set_xlabel("S")
  ax.legend(fontsize=7)
  ax = axes[1]
  ax.hist(d["test_to_train"], bins, density=True, alpha=0.6, label="test -> closest train")
  ax.hist(d["train_to_train"], bins, density=True, alpha=0.6, label="train -> closest other train")
  ax.set_title("closest training item (Fig. 3)", fontsize=9)
  ax.set_xlabel("S")
  ax.legend(fontsize=7)
  for ax, name in zip(axes[2:], ("train", "test")):
    s_ap, s_an, ok = d[f"{name}_s_ap"], d[f"{name}_s_an"], d[f"{name}_correct"]
    ax.scatter(s_ap[ok], s_an[ok], s=4, alpha=0.4, c="tab:green", label="correct")
    ax.scatter(s_ap[~ok], s_an[~ok], s=4, alpha=0.4, c="tab:red", label="wrong")
    finite = np.concatenate([s_ap[np.isfinite(s_ap)], s_an[np.isfinite(s_an)]])
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xlabel("closest positive S")
    ax.set_ylabel("closest negative S")
    ax.set_title(f"{name}: closest positive vs negative (Fig. 5)", fontsize=9)
    ax.legend(fontsize=7, markerscale=3)
  if title:
    fig.suptitle(title, fontsize=10)
  return common.save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dml_jax.analysis.distributions",
                                   description="Similarity distributions of a checkpoint.")
  common.add_workdir_args(parser)
  parser.add_argument("--train_label_set", default="", help="default: train labels")
  parser.add_argument("--test_label_set", default="", help="default: test labels")
  args = common.parse_args(parser, argv)
  step, data, config = common.load_embeddings(args.workdir, step=args.step,
                                              data=common.data_paths(args), at_init=args.at_init)
  (train, train_split), (test, test_split) = data["train"], data["test"]
  d = distributions(train, common.labels_of(train_split, args.train_label_set), test,
                    common.labels_of(test_split, args.test_label_set),
                    similarity=config.eval.similarity, seed=config.seed)
  path = os.path.join(args.out or args.workdir, f"similarity_distributions_step_{step}.png")
  plot_distributions(d, path=path, title=f"{args.workdir} step {step}")
  print(f"Written: {path}")
  return 0


if __name__ == "__main__":
  sys.exit(common.run(main, "python -m dml_jax.analysis.distributions"))
