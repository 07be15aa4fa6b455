r"""Sampling skew of negative selections (label-noise paper §4.2, eqs. 26-29).

The paper's robustness bound (eqs. 26-27) weakens with ``eta``, the factor by which a mining
scheme over-samples some negative pairs relative to uniform sampling; it conjectures
``eta_random < eta_fixed`` for random semi-hard (eq. 28) vs fixed semi-hard (eq. 29) mining.
This tool measures it on real embeddings: for a batch it takes the negatives each strategy
selects (via ``dml_jax.mining.select``, exactly as the triplet objective does: scores
``-d^2``, ``d^2`` the squared Euclidean distance of ``similarity.squared_distance``, or ``-d``
for a run whose triplet hinge is on plain distances, ``loss.distance='euclidean'``, so that
the semi-hard margins are in the loss's units; ``'distance_weighted'`` always on ``-d^2``) and
compares the distribution of their distances ``d = sqrt(d^2)`` with that of *all* negative
pairs of the batch:

* ``eta_hat = max_b P_sel(b) / P_all(b)`` over the distance bins ``b`` (``bins`` equal-width
  bins over the range of all negative distances) holding at least ``min_count`` negative
  pairs (sparse bins make the ratio noise) -- the empirical over-sampling factor, 1 for a
  uniform sampler;
* ``kl = KL(P_sel || P_all)`` over the same bins (0 for a uniform sampler; bins where
  ``P_all = 0`` cannot hold selections);
* ``mean_shift = (mean d_sel - mean d_all) / std d_all`` (negative = harder than average).

Strategies (``STRATEGIES``): ``'semihard_random'`` (random semi-hard, eq. 28),
``'semihard'`` (fixed semi-hard, eq. 29), ``'hard'``, ``'distance_weighted'`` (Wu et al.),
plus ``'random'`` as the uniform reference. Positives: ``positive='all'`` by default (every
anchor-positive pair is a term, as in FaceNet's semi-hard mining); selections of several
batches are pooled.

  python -m dml_jax.analysis.skew --workdir=W [--step=N] [--split=train] [--num_batches=20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dml_jax import mining
from dml_jax import similarity as sim
from dml_jax.analysis import common

STRATEGIES = ("semihard_random", "semihard", "hard", "distance_weighted", "random")
DISTANCES = ("squared", "euclidean")     # the triplet objective's ``distance``


def selected_negative_distances(embeddings, labels, *, strategy: str, key,
                                positive: str = "all", margin: float = 0.2,
                                distance: str = "squared",
                                similarity: str = "cosine"):
  """Distances of the selected negatives and of all negative pairs of one batch.

  Args:
    embeddings: float ``[B, D]``.
    labels: int ``[B]``.
    strategy: one of ``STRATEGIES`` (a ``mining`` negative mode).
    key: PRNG key (used by the stochastic strategies).
    positive: the positive mode (``mining.POSITIVE_MODES``).
    margin: triplet margin in the units of ``distance`` (random semi-hard).
    distance: ``'squared'`` (mining on ``-d^2``) or ``'euclidean'`` (on ``-d``), as the
      triplet objective's ``distance``.
    similarity: ``similarity.pairwise_similarity`` kind.

  Returns:
    ``(selected, all_negatives)``: float32 numpy ``[T]`` distances of the valid terms'
    negatives and ``[M]`` distances of all ordered negative pairs.
  """
  if strategy not in STRATEGIES:
    raise ValueError(f"Unknown strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}.")
  if distance not in DISTANCES:
    raise ValueError(f"Unknown distance {distance!r}; allowed: {', '.join(DISTANCES)}.")
  sel, valid, d2 = _select(jnp.asarray(embeddings, jnp.float32), jnp.asarray(labels), key,
                           strategy=strategy, positive=positive, margin=float(margin),
                           similarity=similarity, distance=distance)
  d = np.sqrt(np.maximum(np.asarray(d2), 0.0))
  _, neg = sim.label_masks(jnp.asarray(labels))
  chosen = np.take_along_axis(d, np.asarray(sel), axis=1)[np.asarray(valid)]
  return chosen.astype(np.float32), d[np.asarray(neg)].astype(np.float32)


@jax.jit(static_argnames=("strategy", "positive", "margin", "similarity", "distance"))
def _select(embeddings, labels, key, *, strategy, positive, margin, similarity, distance):
  s = sim.pairwise_similarity(embeddings, kind=similarity)
  d2 = sim.squared_distance(s, kind=similarity)
  pos, neg = sim.label_masks(labels)
  plain = distance == "euclidean" and strategy != "distance_weighted"
  score = -jnp.sqrt(jnp.maximum(d2, 0.0)) if plain else -d2
  selection = mining.select(score, pos, neg, positive=positive, negative=strategy, margin=margin,
                            key=key, dim=embeddings.shape[1])
  return selection.negative, selection.valid, d2


def skew_measures(selected, reference, *, bins: int = 20, min_count: int = 20) -> dict:
  """``{'eta_hat', 'kl', 'mean_shift', 'num_selected'}`` of ``selected`` distances against the
  ``reference`` distances (module docstring). NaN values when nothing was selected."""
  selected, reference = np.asarray(selected, np.float64), np.asarray(reference, np.float64)
  if reference.size == 0:
    raise ValueError("The reference (all negatives) is empty: the batch has one class.")
  if selected.size == 0:
    return {"eta_hat": float("nan"), "kl": float("nan"), "mean_shift": float("nan"),
            "num_selected": 0}
  edges = np.linspace(reference.min(), reference.max() + 1e-9, bins + 1)
  ref_counts = np.histogram(reference, edges)[0]
  sel_counts = np.histogram(np.clip(selected, edges[0], edges[-1] - 1e-12), edges)[0]
  p_ref = ref_counts / ref_counts.sum()
  p_sel = sel_counts / sel_counts.sum()
  dense = ref_counts >= min_count
  eta = float(np.max(p_sel[dense] / p_ref[dense])) if dense.any() else float("nan")
  nz = p_sel > 0
  kl = float(np.sum(p_sel[nz] * np.log(p_sel[nz] / np.maximum(p_ref[nz], 1e-12))))
  shift = float((selected.mean() - reference.mean()) / max(reference.std(), 1e-12))
  return {"eta_hat": eta, "kl": kl, "mean_shift": shift, "num_selected": int(selected.size)}


def skew_report(batches, *, strategies: Sequence[str] = STRATEGIES[:4], seed: int = 0,
                positive: str = "all", margin: float = 0.2, similarity: str = "cosine",
                distance: str = "squared", bins: int = 20, min_count: int = 20) -> dict:
  """Pools every strategy's selections over ``batches`` (``[(embeddings [B, D], labels [B])]``).

  Returns:
    ``{strategy: {'eta_hat', 'kl', 'mean_shift', 'num_selected', 'distances': [T]}}`` and
    ``'all_negatives': [M]`` (numpy arrays).
  """
  if not batches:
    raise ValueError("Sampling skew of no batches: give at least one (embeddings, labels).")
  out, reference = {}, []
  key = jax.random.key(seed)
  pooled = {s: [] for s in strategies}
  for i, (emb, lab) in enumerate(batches):
    for j, strategy in enumerate(strategies):
      chosen, all_neg = selected_negative_distances(
          emb, lab, strategy=strategy, key=jax.random.fold_in(key, i * 64 + j),
          positive=positive, margin=margin, similarity=similarity, distance=distance)
      pooled[strategy].append(chosen)
    reference.append(all_neg)
  reference = np.concatenate(reference)
  for strategy, parts in pooled.items():
    d = np.concatenate(parts)
    out[strategy] = {**skew_measures(d, reference, bins=bins, min_count=min_count),
                     "distances": d}
  out["all_negatives"] = reference
  return out


def plot_skew(report: dict, *, path: str, title: str = "", bins: int = 30) -> str:
  """PNG: density of all negative distances (grey) and of each strategy's selections."""
  plt = common.pyplot()
  reference = report["all_negatives"]
  edges = np.linspace(reference.min(), reference.max() + 1e-9, bins + 1)
  fig, ax = plt.subplots(figsize=(6.5, 4), dpi=80)
  ax.hist(reference, edges, density=True, color="0.7", label="all negatives")
  for name, r in report.items():
    if name == "all_negatives" or not r["num_selected"]:
      continue
    ax.hist(r["distances"], edges, density=True, histtype="step", lw=2,
            label=f"{name}: η̂={r['eta_hat']:.2f}, KL={r['kl']:.2f}")
  ax.set_xlabel("anchor-negative distance d")
  ax.set_ylabel("density")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7)
  return common.save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dml_jax.analysis.skew",
                                   description="Sampling skew of negative mining strategies.")
  common.add_workdir_args(parser)
  parser.add_argument("--split", default="train")
  parser.add_argument("--num_batches", type=int, default=20)
  parser.add_argument("--margin", type=float, default=None,
                      help="default: config.loss.margin or 0.2")
  parser.add_argument("--strategies", default=",".join(STRATEGIES[:4]))
  parser.add_argument("--batch_size", type=int, default=0, help="default: config.batch_size")
  parser.add_argument("--group_size", type=int, default=0, help="default: config.data.group_size")
  args = common.parse_args(parser, argv)
  if args.num_batches < 1:
    raise ValueError(f"--num_batches={args.num_batches}: use 1 or more batches.")
  from dml_jax import data as data_lib  # pylint: disable=import-outside-toplevel
  step, data, config = common.load_embeddings(args.workdir, step=args.step,
                                              data=common.data_paths(args), at_init=args.at_init,
                                              splits=(args.split,))
  emb, split = data[args.split]
  batch_size = args.batch_size or config.batch_size
  sampler = data_lib.NPerClassSampler(split.labels, batch_size=batch_size,
                                      group_size=args.group_size or config.data.group_size,
                                      seed=config.seed)
  batches = [(emb[idx], split.labels[idx])
             for idx in (sampler.batch_indices(t) for t in range(args.num_batches))]
  margin = args.margin if args.margin is not None else float(config.loss.get("margin", 0.2))
  similarity = config.loss.get("similarity", "cosine")
  distance = config.loss.get("distance", "squared")
  report = skew_report(batches, strategies=tuple(args.strategies.split(",")), seed=config.seed,
                       margin=margin, similarity=similarity, distance=distance)
  out_dir = args.out or args.workdir
  path = os.path.join(out_dir, f"sampling_skew_{args.split}_step_{step}.png")
  plot_skew(report, path=path, title=f"{args.split} step {step}, {args.num_batches} batches "
            f"of {batch_size}, margin {margin} on {'d' if distance == 'euclidean' else 'd²'}")
  summary = {k: {m: v for m, v in r.items() if m != "distances"}
             for k, r in report.items() if k != "all_negatives"}
  with open(os.path.join(out_dir, f"sampling_skew_{args.split}_step_{step}.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print("| strategy | eta_hat | KL | mean shift (std) | terms |\n|---|---|---|---|---|")
  for k, r in summary.items():
    print(f"| {k} | {r['eta_hat']:.2f} | {r['kl']:.3f} | {r['mean_shift']:.2f} | "
          f"{r['num_selected']} |")
  print(f"Written: {path}")
  return 0


if __name__ == "__main__":
  sys.exit(common.run(main, "python -m dml_jax.analysis.skew"))
