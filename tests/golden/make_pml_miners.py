"""Writes tests/golden/pml_miners.npz: pytorch-metric-learning's miners on fixed inputs, which
tests/mining/test_pml_miners.py compares dml_jax's selections with (CI has no PyTorch).

Regenerate (in an environment with requirements-bench.txt: torch CPU + PML 2.9)::

  python3 -m venv .venv-bench && . .venv-bench/bin/activate && pip install -r requirements-bench.txt
  python tests/golden/make_pml_miners.py

Stored per case (a seed and a batch composition of 12 unit embeddings in 8 dimensions): the
embeddings and labels; the ``(anchor, positive, negative)`` triplets of ``BatchHardMiner`` and
of ``BatchEasyHardMiner`` for each pair of strategies that has a dml_jax counterpart; the pair
masks of ``MultiSimilarityMiner``; and the per-anchor sampling distribution of
``DistanceWeightedMiner`` (the weights it passes to its triplet sampler).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytorch_metric_learning
from pytorch_metric_learning import distances
from pytorch_metric_learning import miners
from pytorch_metric_learning.miners import distance_weighted_miner
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu
import torch

from make_pml_reference import COMPOSITIONS, DIM   # the objectives' batches of 12

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pml_miners.npz")
SEEDS = (0, 1, 2)
# BatchEasyHardMiner (pos_strategy, neg_strategy). PML names the closest negative 'hard' and
# the farthest 'easy', as dml_jax does.
EASY_HARD = [("easy", "hard"), ("easy", "semihard"), ("easy", "easy"), ("hard", "hard"),
             ("hard", "semihard"), ("hard", "easy")]
MS_EPSILONS = (0.1, 0.5)
DW_CUTOFFS = (1.4, 2.0)


def _triplets(a, p, n) -> np.ndarray:
  return np.stack([np.asarray(a), np.asarray(p), np.asarray(n)], axis=1).astype(np.int32)


def _dw_weights(x, labels, nonzero_loss_cutoff):
  """The row-normalised weights DistanceWeightedMiner samples its negatives from."""
  seen = {}
  sampler = lmu.get_random_triplet_indices

  def spy(labels, ref_labels=None, t_per_anchor=None, weights=None):
    seen["w"] = weights.clone()
    return sampler(labels, ref_labels=ref_labels, t_per_anchor=t_per_anchor, weights=weights)

  distance_weighted_miner.lmu.get_random_triplet_indices = spy
  try:
    miners.DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=nonzero_loss_cutoff)(x, labels)
  finally:
    distance_weighted_miner.lmu.get_random_triplet_indices = sampler
  return np.nan_to_num(seen["w"].numpy())   # rows without weight are 0 / 0 in PML


def main() -> int:
  torch.manual_seed(0)
  arrays, cases = {}, []
  for seed in SEEDS:
    rng = np.random.default_rng(seed)
    for comp, fixed in COMPOSITIONS.items():
      labels = np.asarray(fixed if fixed is not None else rng.integers(0, 5, 12), np.int64)
      x = rng.standard_normal((len(labels), DIM)).astype(np.float32)
      x /= np.linalg.norm(x, axis=1, keepdims=True)
      key = f"{comp}-{seed}"
      xt, lt = torch.tensor(x), torch.tensor(labels)
      arrays[f"{key}/x"], arrays[f"{key}/labels"] = x, labels
      lp = distances.LpDistance(normalize_embeddings=True)
      arrays[f"{key}/batch_hard"] = _triplets(*miners.BatchHardMiner(distance=lp)(xt, lt))
      for pos, neg in EASY_HARD:
        m = miners.BatchEasyHardMiner(pos_strategy=pos, neg_strategy=neg, distance=lp)
        a, p, _, n = m(xt, lt)
        arrays[f"{key}/easy_hard/{pos}/{neg}"] = _triplets(a, p, n)
      for eps in MS_EPSILONS:
        a1, p, a2, n = miners.MultiSimilarityMiner(epsilon=eps)(xt, lt)
        pos_kept = np.zeros((len(labels),) * 2, bool)
        neg_kept = np.zeros((len(labels),) * 2, bool)
        pos_kept[a1.numpy(), p.numpy()] = True
        neg_kept[a2.numpy(), n.numpy()] = True
        arrays[f"{key}/ms/{eps}/pos"], arrays[f"{key}/ms/{eps}/neg"] = pos_kept, neg_kept
      for cut in DW_CUTOFFS:
        arrays[f"{key}/dw/{cut}"] = _dw_weights(xt, lt, cut).astype(np.float32)
      cases.append(key)
  index = {"pml": pytorch_metric_learning.__version__, "torch": torch.__version__,
           "cases": cases, "easy_hard": EASY_HARD, "ms_epsilons": MS_EPSILONS,
           "dw_cutoffs": DW_CUTOFFS}
  np.savez_compressed(OUT, index=json.dumps(index), **arrays)
  print(f"wrote {OUT}: {len(cases)} cases")
  return 0


if __name__ == "__main__":
  sys.exit(main())
