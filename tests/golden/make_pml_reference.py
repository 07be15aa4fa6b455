"""Writes tests/golden/pml_reference.npz: pytorch-metric-learning's loss values and gradients
on fixed inputs, which tests/objectives/test_pml_reference.py compares dml_jax with (CI has no
PyTorch).

Regenerate (in an environment with requirements-bench.txt: torch CPU + PML 2.9)::

  python3 -m venv .venv-bench && . .venv-bench/bin/activate
  pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  pip install -r requirements-bench.txt
  python tests/golden/make_pml_reference.py

Each case is ``(name, our objective, its hyper-parameters, PML's loss)``, evaluated on several
seeds and batch compositions (n-per-class, a class with a single example, anchors without a
negative in a two-class batch); cross-batch memory cases run a sequence of batches through PML's
``CrossBatchMemory``. The file stores inputs, loss and gradients (float32) and a JSON index.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import pytorch_metric_learning
from pytorch_metric_learning import distances
from pytorch_metric_learning import losses
from pytorch_metric_learning import reducers
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pml_reference.npz")
DIM = 8
NUM_CLASSES = 6

# Batch compositions (labels of a batch of 12): n per class; a singleton class (an anchor
# without a positive); two classes only (few negatives); random.
COMPOSITIONS = {
    "n_per_class": [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3],
    "singleton": [0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 5],
    "two_classes": [4, 4, 4, 4, 4, 4, 4, 4, 1, 1, 1, 1],
    "random": None,
    # as many classes as their size, in contiguous blocks: the batches on which PML's
    # SmoothAPLoss groups the classes right (it reshapes to [size, classes]); smooth_ap only
    "square": [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3],
}

# (our name, our hyper-parameters, PML loss factory(num_classes, dim), proxies attribute)
PAIR_CASES = [
    ("ntxent", {"temperature": 0.07}, lambda c, d: losses.NTXentLoss(temperature=0.07)),
    ("ntxent", {"temperature": 0.5}, lambda c, d: losses.NTXentLoss(temperature=0.5)),
    ("supcon", {"temperature": 0.1}, lambda c, d: losses.SupConLoss(temperature=0.1)),
    ("supcon", {"temperature": 0.3}, lambda c, d: losses.SupConLoss(temperature=0.3)),
    ("circle", {"m": 0.4, "gamma": 80.0}, lambda c, d: losses.CircleLoss(m=0.4, gamma=80)),
    ("circle", {"m": 0.25, "gamma": 32.0}, lambda c, d: losses.CircleLoss(m=0.25, gamma=32)),
    ("generalized_lifted_structure", {"pos_margin": 0.0, "neg_margin": 1.0},
     lambda c, d: losses.GeneralizedLiftedStructureLoss(neg_margin=1.0, pos_margin=0.0)),
    ("generalized_lifted_structure", {"pos_margin": 0.2, "neg_margin": 0.8},
     lambda c, d: losses.GeneralizedLiftedStructureLoss(neg_margin=0.8, pos_margin=0.2)),
    ("tuplet_margin", {"margin": 0.1, "scale": 64.0},
     lambda c, d: losses.TupletMarginLoss(margin=math.degrees(0.1), scale=64)),
    ("tuplet_margin", {"margin": 0.3, "scale": 16.0},
     lambda c, d: losses.TupletMarginLoss(margin=math.degrees(0.3), scale=16)),
    # PML's AngularLoss leaves the negatives unnormalised: compared on unit embeddings.
    ("angular", {"alpha": 40.0}, lambda c, d: losses.AngularLoss(alpha=40)),
    ("angular", {"alpha": 50.0}, lambda c, d: losses.AngularLoss(alpha=50)),
    ("npairs", {}, lambda c, d: losses.NPairsLoss()),
    ("fastap", {"num_bins": 10}, lambda c, d: losses.FastAPLoss(num_bins=10)),
    ("fastap", {"num_bins": 4}, lambda c, d: losses.FastAPLoss(num_bins=4)),
    ("ranked_list", {"margin": 0.4, "alpha": 1.2, "imbalance": 0.5, "tp": 0.0, "tn": 10.0},
     lambda c, d: losses.RankedListLoss(margin=0.4, Tn=10, imbalance=0.5, alpha=1.2, Tp=0)),
    ("ranked_list", {"margin": 0.2, "alpha": 1.0, "imbalance": 0.3, "tp": 2.0, "tn": 4.0},
     lambda c, d: losses.RankedListLoss(margin=0.2, Tn=4, imbalance=0.3, alpha=1.0, Tp=2)),
    ("histogram", {"num_bins": 100}, lambda c, d: losses.HistogramLoss(n_bins=100)),
    ("histogram", {"num_bins": 20}, lambda c, d: losses.HistogramLoss(n_bins=20)),
    ("snr_contrastive", {"pos_margin": 0.0, "neg_margin": 1.0},
     lambda c, d: losses.SignalToNoiseRatioContrastiveLoss(pos_margin=0.0, neg_margin=1.0)),
    ("snr_contrastive", {"pos_margin": 0.1, "neg_margin": 0.8},
     lambda c, d: losses.SignalToNoiseRatioContrastiveLoss(pos_margin=0.1, neg_margin=0.8)),
    ("intra_pair_variance", {"pos_eps": 0.01, "neg_eps": 0.01},
     lambda c, d: losses.IntraPairVarianceLoss(pos_eps=0.01, neg_eps=0.01)),
    ("intra_pair_variance", {"pos_eps": 0.1, "neg_eps": 0.05},
     lambda c, d: losses.IntraPairVarianceLoss(pos_eps=0.1, neg_eps=0.05)),
    ("pnp", {"variant": "O", "temperature": 0.01, "alpha": 1.0, "b": 2.0},
     lambda c, d: losses.PNPLoss(b=2, alpha=1, anneal=0.01, variant="O")),
    ("pnp", {"variant": "Ds", "temperature": 0.05, "alpha": 1.0, "b": 2.0},
     lambda c, d: losses.PNPLoss(b=2, alpha=1, anneal=0.05, variant="Ds")),
    ("pnp", {"variant": "Dq", "temperature": 0.05, "alpha": 2.0, "b": 2.0},
     lambda c, d: losses.PNPLoss(b=2, alpha=2, anneal=0.05, variant="Dq")),
    ("pnp", {"variant": "Iu", "temperature": 0.1, "alpha": 1.0, "b": 2.0},
     lambda c, d: losses.PNPLoss(b=2, alpha=1, anneal=0.1, variant="Iu")),
    ("pnp", {"variant": "Ib", "temperature": 0.05, "alpha": 1.0, "b": 3.0},
     lambda c, d: losses.PNPLoss(b=3, alpha=1, anneal=0.05, variant="Ib")),
    ("smooth_ap", {"temperature": 0.01}, lambda c, d: losses.SmoothAPLoss(temperature=0.01)),
    ("smooth_ap", {"temperature": 0.1}, lambda c, d: losses.SmoothAPLoss(temperature=0.1)),
]
UNIT_INPUTS = {"angular"}   # cases whose inputs are L2-normalised first
ONLY_COMPOSITIONS = {"smooth_ap": {"square"}}   # the others: every composition but "square"
CLASS_CASES = [
    ("proxy_anchor", {"margin": 0.1, "alpha": 32.0},
     lambda c, d: losses.ProxyAnchorLoss(c, d, margin=0.1, alpha=32), "proxies", False),
    ("proxy_anchor", {"margin": 0.2, "alpha": 16.0},
     lambda c, d: losses.ProxyAnchorLoss(c, d, margin=0.2, alpha=16), "proxies", False),
    ("normalized_softmax", {"temperature": 0.05},
     lambda c, d: losses.NormalizedSoftmaxLoss(c, d, temperature=0.05), "W", True),
    ("cosface", {"margin": 0.35, "scale": 64.0},
     lambda c, d: losses.CosFaceLoss(c, d, margin=0.35, scale=64), "W", True),
    ("cosface", {"margin": 0.2, "scale": 16.0},
     lambda c, d: losses.CosFaceLoss(c, d, margin=0.2, scale=16), "W", True),
    ("arcface", {"margin": 0.5, "scale": 64.0},
     lambda c, d: losses.ArcFaceLoss(c, d, margin=math.degrees(0.5), scale=64), "W", True),
    ("arcface", {"margin": 0.3, "scale": 16.0},
     lambda c, d: losses.ArcFaceLoss(c, d, margin=math.degrees(0.3), scale=16), "W", True),
    ("subcenter_arcface", {"margin": 0.5, "scale": 64.0, "sub_centers": 3},
     lambda c, d: losses.SubCenterArcFaceLoss(num_classes=c, embedding_size=d,
                                              margin=math.degrees(0.5), scale=64, sub_centers=3),
     "W", True),
    ("subcenter_arcface", {"margin": 0.3, "scale": 16.0, "sub_centers": 2},
     lambda c, d: losses.SubCenterArcFaceLoss(num_classes=c, embedding_size=d,
                                              margin=math.degrees(0.3), scale=16, sub_centers=2),
     "W", True),
    ("softtriple", {"centers_per_class": 10, "la": 20.0, "gamma": 0.1, "margin": 0.01},
     lambda c, d: losses.SoftTripleLoss(c, d, centers_per_class=10, la=20, gamma=0.1,
                                        margin=0.01), "fc", True),
    ("softtriple", {"centers_per_class": 3, "la": 8.0, "gamma": 0.5, "margin": 0.1},
     lambda c, d: losses.SoftTripleLoss(c, d, centers_per_class=3, la=8, gamma=0.5,
                                        margin=0.1), "fc", True),
    ("large_margin_softmax", {"margin": 4, "scale": 1.0},
     lambda c, d: losses.LargeMarginSoftmaxLoss(c, d, margin=4, scale=1), "W", True),
    ("large_margin_softmax", {"margin": 2, "scale": 2.0},
     lambda c, d: losses.LargeMarginSoftmaxLoss(c, d, margin=2, scale=2), "W", True),
    ("sphereface", {"margin": 4, "scale": 1.0},
     lambda c, d: losses.SphereFaceLoss(c, d, margin=4, scale=1), "W", True),
    ("sphereface", {"margin": 3, "scale": 2.0},
     lambda c, d: losses.SphereFaceLoss(c, d, margin=3, scale=2), "W", True),
    ("p2sgrad", {}, lambda c, d: losses.P2SGradLoss(descriptors_dim=d, num_classes=c),
     "weight", True),
]
CENTERS = {"subcenter_arcface": "sub_centers", "softtriple": "centers_per_class"}
# P2SGradLoss renormalises its weights to unit length in every forward pass: given unit ones.
UNIT_WEIGHTS = {"p2sgrad"}
# Cross-batch memory: our memory.size M = PML's memory_size - B (PML's memory holds the current
# batch too); our references detached (reference_gradient=False), as PML's.
MEMORY_BATCH, MEMORY_STEPS, MEMORY_SIZE = 8, 5, 16
MEMORY_CASES = [
    ("contrastive", {"pos_margin": 1.0, "neg_margin": 0.5, "reduction": "balanced"},
     lambda: losses.ContrastiveLoss(pos_margin=1.0, neg_margin=0.5,
                                    distance=distances.CosineSimilarity(),
                                    reducer=reducers.MeanReducer())),
    ("multi_similarity", {"alpha": 2.0, "beta": 50.0, "base": 0.5, "positive": "all",
                          "negative": "all"},
     lambda: losses.MultiSimilarityLoss(alpha=2.0, beta=50.0, base=0.5)),
    ("supcon", {"temperature": 0.1}, lambda: losses.SupConLoss(temperature=0.1)),
    ("ntxent", {"temperature": 0.07}, lambda: losses.NTXentLoss(temperature=0.07)),
]


def _labels(name: str, rng) -> np.ndarray:
  fixed = COMPOSITIONS[name]
  if fixed is None:
    return rng.integers(0, NUM_CLASSES, size=12).astype(np.int64)
  return np.asarray(fixed, np.int64)


def _value_and_grads(loss_fn, emb: np.ndarray, labels: np.ndarray, weights=None):
  """PML loss on float32 inputs -> (loss, d/d embeddings, d/d weights or None)."""
  e = torch.tensor(emb, requires_grad=True)
  value = loss_fn(e, torch.tensor(labels))
  value.backward()
  grad_w = None if weights is None else weights.grad.detach().numpy().copy()
  return np.float32(value.item()), e.grad.numpy().copy(), grad_w


def main() -> int:
  torch.manual_seed(0)
  arrays, index = {}, []
  for seed in (0, 1):
    rng = np.random.default_rng(seed)
    for comp in COMPOSITIONS:
      labels = _labels(comp, rng)
      emb = rng.normal(size=(len(labels), DIM)).astype(np.float32)
      proxies = rng.normal(size=(NUM_CLASSES, DIM)).astype(np.float32)
      for name, hp, make in PAIR_CASES:
        if comp not in ONLY_COMPOSITIONS.get(name, set(COMPOSITIONS) - {"square"}):
          continue
        key = f"case{len(index)}"
        x = emb / np.linalg.norm(emb, axis=1, keepdims=True) if name in UNIT_INPUTS else emb
        loss, ge, _ = _value_and_grads(make(NUM_CLASSES, DIM), x, labels)
        arrays.update({f"{key}/embeddings": x, f"{key}/labels": labels, f"{key}/loss": loss,
                       f"{key}/grad_embeddings": ge})
        index.append({"key": key, "objective": name, "hparams": hp, "seed": seed,
                      "composition": comp, "kind": "pairs"})
      for name, hp, make, attr, transposed in CLASS_CASES if comp != "square" else ():
        key = f"case{len(index)}"
        fn = make(NUM_CLASSES, DIM)
        weights = getattr(fn, attr)
        rows = NUM_CLASSES * hp.get(CENTERS.get(name, ""), 1)   # centres c * K + k
        w = np.random.default_rng(100 + seed).normal(size=(rows, DIM)).astype(np.float32) \
            if rows != NUM_CLASSES else proxies
        if name in UNIT_WEIGHTS:
          w = w / np.linalg.norm(w, axis=1, keepdims=True)
        with torch.no_grad():
          weights.copy_(torch.tensor(w.T if transposed else w))
        loss, ge, gw = _value_and_grads(fn, emb, labels, weights)
        arrays.update({f"{key}/embeddings": emb, f"{key}/labels": labels, f"{key}/loss": loss,
                       f"{key}/grad_embeddings": ge, f"{key}/proxies": w,
                       f"{key}/grad_proxies": gw.T if transposed else gw})
        index.append({"key": key, "objective": name, "hparams": hp, "seed": seed,
                      "composition": comp, "kind": "classes"})
  for name, hp, make in MEMORY_CASES:
    rng = np.random.default_rng(7)
    key = f"case{len(index)}"
    xbm = losses.CrossBatchMemory(make(), DIM, memory_size=MEMORY_SIZE + MEMORY_BATCH)
    embs = rng.normal(size=(MEMORY_STEPS, MEMORY_BATCH, DIM)).astype(np.float32)
    # n-per-class batches (4 classes x 2 of 6): every anchor has a positive and a negative.
    # (Elsewhere our multi_similarity follows the released MS code, where an anchor without
    # a positive or a negative contributes 0; PML keeps its one-sided term.)
    labs = np.stack([np.repeat(rng.choice(NUM_CLASSES, 4, replace=False), 2)
                     for _ in range(MEMORY_STEPS)]).astype(np.int64)
    values, grads = [], []
    for t in range(MEMORY_STEPS):
      loss, ge, _ = _value_and_grads(xbm, embs[t], labs[t])
      values.append(loss)
      grads.append(ge)
    arrays.update({f"{key}/embeddings": embs, f"{key}/labels": labs,
                   f"{key}/loss": np.asarray(values, np.float32),
                   f"{key}/grad_embeddings": np.stack(grads)})
    index.append({"key": key, "objective": name, "hparams": hp, "kind": "memory",
                  "memory_size": MEMORY_SIZE})
  meta = {"pytorch_metric_learning": pytorch_metric_learning.__version__,
          "torch": torch.__version__, "cases": index}
  np.savez_compressed(OUT, index=np.asarray(json.dumps(meta)), **arrays)
  print(f"wrote {len(index)} cases to {OUT} (PML {meta['pytorch_metric_learning']}, "
        f"torch {meta['torch']})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
