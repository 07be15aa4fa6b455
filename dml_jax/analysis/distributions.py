r"""Similarity distributions (EPHN paper Fig. 2, 3, 5).

* :func:`pair_similarities`: similarities of all same-class pairs ``i < j`` (and of the
  different-class pairs) of a split -- EPHN Fig. 2 (how spread out a class is under each
  mining scheme);
* :func:`closest_gallery_similarity`: for each query (test) item, the similarity of its closest
  gallery (train) item -- EPHN Fig. 3 (how far the unseen classes land from the training
  data);
* closest-positive vs closest-negative similarity per anchor, for train and for test -- EPHN
  Fig. 5; this is ``scatter.scatter_points``.

``max_pairs`` subsamples pairs uniformly (seeded) when a split has more. The tool draws the
four panels and writes the mean and quartiles of each sample (:func:`statistics`) beside them
(``similarity_distributions_step_<N>.png`` and ``.json``; ``python docs/tables.py summarize``
reads the JSON as the protocol ``distributions``).

  python -m dml_jax.analysis.distributions --workdir=W [--step=N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import numpy as np

from dml_jax.analysis import common
from dml_jax.analysis import scatter


def _unrank_pairs(t, n) -> tuple[np.ndarray, np.ndarray]:
  """``(i, j)`` int64 ``[K]`` of the row-major linear indices ``t [K]`` of the pairs ``i < j``
  of ``n`` items (an int, or ``[K]``: one count per index): ``(0, 1), (0, 2), ..., (0, n-1),
  (1, 2), ...``."""
  t, n = np.asarray(t, np.int64), np.asarray(n, np.int64)

  def before(i):   # pairs in the rows above row i
    return i * (2 * n - i - 1) // 2

  i = np.floor((2 * n - 1 - np.sqrt((2.0 * n - 1) ** 2 - 8.0 * t)) / 2).astype(np.int64)
  i = np.clip(i, 0, np.maximum(n - 2, 0))
  for _ in range(2):   # the float estimate is off by at most one near row boundaries
    i = np.where(before(i + 1) <= t, i + 1, i)
    i = np.where(before(i) > t, i - 1, i)
  return i, t - before(i) + i + 1


def _same_class_pairs(labels, *, max_pairs: int, rng) -> tuple[np.ndarray, np.ndarray]:
  """``(i, j)`` of every same-class pair ``i < j``, or ``max_pairs`` of them drawn uniformly
  without replacement when there are more."""
  order = np.argsort(labels, kind="stable")
  _, starts, sizes = np.unique(labels[order], return_index=True, return_counts=True)
  counts = sizes * (sizes - 1) // 2
  total = int(counts.sum())
  t = (np.arange(total, dtype=np.int64) if total <= max_pairs
       else np.sort(rng.choice(total, max_pairs, replace=False)))
  ends = np.cumsum(counts)
  cls = np.searchsorted(ends, t, side="right")          # the class of each pair
  local = t - (ends[cls] - counts[cls])
  a, b = _unrank_pairs(local, sizes[cls])              # within each pair's class
  members = order[starts[cls] + a], order[starts[cls] + b]
  return np.minimum(*members), np.maximum(*members)


def _different_class_pairs(labels, *, max_pairs: int, rng) -> tuple[np.ndarray, np.ndarray]:
  """``(i, j)`` of every different-class pair ``i < j``, or ``max_pairs`` of them drawn
  uniformly without replacement when there are more (all pairs drawn in a random order, the
  first ``max_pairs`` of different classes kept)."""
  n = len(labels)
  total = n * (n - 1) // 2
  _, sizes = np.unique(labels, return_counts=True)
  different = total - int((sizes * (sizes - 1) // 2).sum())
  if different <= max_pairs:
    i, j = _unrank_pairs(np.arange(total, dtype=np.int64), n)
    keep = labels[i] != labels[j]
    return i[keep], j[keep]
  draw = min(total, int(1.2 * max_pairs * total / different) + 1000)
  while True:
    i, j = _unrank_pairs(rng.choice(total, draw, replace=False), n)
    keep = np.flatnonzero(labels[i] != labels[j])
    if len(keep) >= max_pairs or draw == total:
      keep = keep[:max_pairs]
      return i[keep], j[keep]
    draw = min(total, 2 * draw)


def _gather(x, i, j, *, similarity: str, block_size: int) -> np.ndarray:
  """float32 ``S(x_i, x_j) [K]``, read from row blocks of the similarity matrix (memory
  ``O(block_size N)``; the same values as the whole matrix's)."""
  out = np.empty(len(i), np.float32)
  for start in range(0, len(x), block_size):
    sel = np.flatnonzero((i >= start) & (i < start + block_size))
    if sel.size:
      rows = common.similarity_matrix(x[start:start + block_size], x, kind=similarity)
      out[sel] = rows[i[sel] - start, j[sel]]
  return out


def pair_similarities(embeddings, labels, *, similarity: str = "cosine",
                      max_pairs: int = 200_000, seed: int = 0, block_size: int = 1024):
  """``(same [P], different [Q])`` float32 similarities of the unordered pairs ``i < j`` of
  ``embeddings [N, D]`` with ``labels [N]``: every pair of a kind when it has at most
  ``max_pairs``, else ``max_pairs`` drawn uniformly without replacement (``seed``). Memory
  ``O(block_size N + max_pairs)``: no ``[N, N]`` matrix or pair list."""
  x, labels = np.asarray(embeddings, np.float32), np.asarray(labels)
  if x.ndim != 2 or labels.shape != (x.shape[0],):
    raise ValueError(f"labels must have shape [{x.shape[0] if x.ndim else '?'}] and embeddings "
                     f"[N, D], got {labels.shape} and {x.shape}.")
  if max_pairs < 1:
    raise ValueError(f"max_pairs must be >= 1, got {max_pairs}.")
  rng = np.random.default_rng(seed)
  (i1, j1), (i2, j2) = (pairs(labels, max_pairs=max_pairs, rng=rng)
                        for pairs in (_same_class_pairs, _different_class_pairs))
  values = _gather(x, np.concatenate([i1, i2]), np.concatenate([j1, j2]),
                   similarity=similarity, block_size=block_size)   # one pass over the rows
  return values[:len(i1)], values[len(i1):]


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
  # the closest other training item: the nearer of the closest positive and negative
  out["train_to_train"] = np.fmax(out["train_s_ap"], out["train_s_an"])
  return out


SAMPLES = ("train_same", "train_different", "test_same", "test_different", "test_to_train",
           "train_to_train", "train_s_ap", "train_s_an", "test_s_ap", "test_s_an")
QUANTILES = {"q25": 25, "median": 50, "q75": 75}


def statistics(d: dict) -> dict[str, float]:
  """``{'<sample>/<statistic>': value}``: the mean and quartiles (``q25``, ``median``,
  ``q75``) of each similarity sample of :func:`distributions` (NaNs, anchors without a
  positive or a negative, left out; NaN for an empty sample), and ``'<split>_correct/mean'``."""
  out = {}
  for key in SAMPLES:
    v = np.asarray(d[key], np.float64)
    v = v[np.isfinite(v)]
    out[f"{key}/mean"] = float(v.mean()) if v.size else float("nan")
    for name, q in QUANTILES.items():
      out[f"{key}/{name}"] = float(np.percentile(v, q)) if v.size else float("nan")
  for split in ("train", "test"):
    out[f"{split}_correct/mean"] = float(np.mean(d[f"{split}_correct"]))
  return out


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
  stem = os.path.join(args.out or args.workdir, f"similarity_distributions_step_{step}")
  os.makedirs(os.path.dirname(stem), exist_ok=True)
  with open(stem + ".json", "w") as f:
    json.dump({"step": step, "similarity": config.eval.similarity, "statistics": statistics(d)},
              f, indent=1)
  plot_distributions(d, path=stem + ".png", title=f"{args.workdir} step {step}")
  print(f"Written: {stem}.png, {stem}.json")
  return 0


if __name__ == "__main__":
  sys.exit(common.run(main, "python -m dml_jax.analysis.distributions"))
