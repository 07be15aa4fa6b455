"""pytorch-metric-learning (PML) as the other side of a comparison: its import, the
tolerances within which its loss and ours must agree, and which PML miner + loss each of our
objectives is timed against (:data:`PML_PAIRS`, with :func:`step`: one forward + backward).
See ``requirements-bench.txt``."""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any, Callable

import numpy as np

LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-6
MIN_REPEATS = 2            # a PML case capped by its max_seconds still gets this many calls


def import_pml() -> tuple[types.SimpleNamespace | None, str]:
  """``(namespace of torch + PML modules, versions)`` or ``(None, why not)``."""
  # pylint: disable=import-outside-toplevel
  try:
    import torch
    import pytorch_metric_learning as pml_root
    from pytorch_metric_learning import distances, losses, miners, reducers
  except ImportError as e:
    return None, f"torch / pytorch-metric-learning not importable ({e}); PML not timed."
  ns = types.SimpleNamespace(torch=torch, distances=distances, losses=losses, miners=miners,
                             reducers=reducers)
  return ns, f"torch {torch.__version__}, pytorch-metric-learning {pml_root.__version__}"


@dataclasses.dataclass(frozen=True)
class PmlPair:
  """One PML miner + loss against one of our objectives.

  Attributes:
    key: short identifier (JSON).
    objective: our registry name.
    hparams: our hyper-parameters (the rest at their defaults).
    pml: what PML runs, in words.
    build: ``build(pml, num_classes, dim) -> (loss_fn, modules)``; ``loss_fn(x, y)`` returns the
      scalar loss tensor (mining included); ``modules`` are the torch modules whose parameters
      get gradients.
    comparable: the two compute the same loss (the value check must agree).
    semantics: how the two differ (or that they agree), for the table and the JSON.
  """
  key: str
  objective: str
  hparams: dict[str, Any]
  pml: str
  build: Callable[[Any, int], tuple[Callable, list]]
  comparable: bool
  semantics: str


def _sq_lp(pml):
  """PML squared Euclidean distance of normalised embeddings: ``|x - y|^2 = 2 - 2S`` (ours)."""
  return pml.distances.LpDistance(normalize_embeddings=True, p=2, power=2)


def _build_triplet_easy_hard(pml, num_classes, dim):
  del num_classes, dim
  dist = _sq_lp(pml)
  loss = pml.losses.TripletMarginLoss(margin=0.2, distance=dist,
                                      reducer=pml.reducers.MeanReducer())
  miner = pml.miners.BatchEasyHardMiner(pos_strategy="easy", neg_strategy="hard", distance=dist)
  return (lambda x, y: loss(x, y, miner(x, y))), [loss]


def _build_triplet_semihard(pml, num_classes, dim):
  del num_classes, dim
  dist = _sq_lp(pml)
  loss = pml.losses.TripletMarginLoss(margin=0.2, distance=dist,
                                      reducer=pml.reducers.MeanReducer())
  miner = pml.miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard", distance=dist)
  return (lambda x, y: loss(x, y, miner(x, y))), [loss]


def _build_triplet_all(pml, num_classes, dim):
  del num_classes, dim
  loss = pml.losses.TripletMarginLoss(margin=0.2, distance=_sq_lp(pml),
                                      reducer=pml.reducers.MeanReducer())
  return (lambda x, y: loss(x, y)), [loss]


def _build_multi_similarity(pml, num_classes, dim):
  del num_classes, dim
  loss = pml.losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5)   # CosineSimilarity
  miner = pml.miners.MultiSimilarityMiner(epsilon=0.1)
  return (lambda x, y: loss(x, y, miner(x, y))), [loss]


def _build_margin(pml, num_classes, dim):
  del dim
  # Default LpDistance (plain Euclidean, normalised), which DistanceWeightedMiner requires.
  loss = pml.losses.MarginLoss(margin=0.2, beta=1.2, learn_beta=True, num_classes=num_classes)
  miner = pml.miners.DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)
  return (lambda x, y: loss(x, y, miner(x, y))), [loss]


def _build_plain(make):
  """``build`` of a PML loss without miner: ``make(pml, num_classes, dim) -> loss module``."""
  def build(pml, num_classes, dim):
    loss = make(pml, num_classes, dim)
    return (lambda x, y: loss(x, y)), [loss]
  return build


SAME_TESTED = "same loss (tests/objectives/test_pml_reference.py)"
SAME_WEIGHTS_DIFFER = ("same loss (tested with shared weights in tests/objectives/"
                       "test_pml_reference.py); here each side has its own random class weights")


def _plain_pair(key, objective, pml, make, *, comparable=True, semantics=SAME_TESTED,
                hparams=None):
  return PmlPair(key=key, objective=objective, hparams=hparams or {}, pml=pml,
                 build=_build_plain(make), comparable=comparable, semantics=semantics)


PML_BASELINES: tuple[PmlPair, ...] = (
    _plain_pair("ntxent", "ntxent", "NTXentLoss(0.07)",
                lambda pml, c, d: pml.losses.NTXentLoss(temperature=0.07)),
    _plain_pair("supcon", "supcon", "SupConLoss(0.1)",
                lambda pml, c, d: pml.losses.SupConLoss(temperature=0.1)),
    _plain_pair("circle", "circle", "CircleLoss(0.4, 80)",
                lambda pml, c, d: pml.losses.CircleLoss(m=0.4, gamma=80)),
    _plain_pair("generalized_lifted_structure", "generalized_lifted_structure",
                "GeneralizedLiftedStructureLoss(1, 0)",
                lambda pml, c, d: pml.losses.GeneralizedLiftedStructureLoss(neg_margin=1,
                                                                         pos_margin=0)),
    _plain_pair("tuplet_margin", "tuplet_margin", "TupletMarginLoss(5.73 deg, 64)",
                lambda pml, c, d: pml.losses.TupletMarginLoss(margin=math.degrees(0.1), scale=64)),
    _plain_pair("angular", "angular", "AngularLoss(40)",
                lambda pml, c, d: pml.losses.AngularLoss(alpha=40), comparable=False,
                semantics="same value on unit embeddings; PML leaves the negatives "
                          "unnormalised, so its gradient has a radial part ours has not"),
    _plain_pair("npairs", "npairs", "NPairsLoss()", lambda pml, c, d: pml.losses.NPairsLoss()),
    _plain_pair("fastap", "fastap", "FastAPLoss(10)",
                lambda pml, c, d: pml.losses.FastAPLoss(num_bins=10)),
    _plain_pair("ranked_list", "ranked_list", "RankedListLoss(0.4, Tn=10, alpha=1.2)",
                lambda pml, c, d: pml.losses.RankedListLoss(margin=0.4, Tn=10, imbalance=0.5,
                                                            alpha=1.2, Tp=0)),
    _plain_pair("histogram", "histogram", "HistogramLoss(100 bins)",
                lambda pml, c, d: pml.losses.HistogramLoss(n_bins=100)),
    _plain_pair("snr_contrastive", "snr_contrastive", "SignalToNoiseRatioContrastiveLoss(0, 1)",
                lambda pml, c, d: pml.losses.SignalToNoiseRatioContrastiveLoss(
                    pos_margin=0.0, neg_margin=1.0)),
    _plain_pair("proxy_anchor", "proxy_anchor", "ProxyAnchorLoss(C, D, 0.1, 32)",
                lambda pml, c, d: pml.losses.ProxyAnchorLoss(c, d, margin=0.1, alpha=32),
                comparable=False, semantics=SAME_WEIGHTS_DIFFER),
    _plain_pair("normalized_softmax", "normalized_softmax", "NormalizedSoftmaxLoss(C, D, 0.05)",
                lambda pml, c, d: pml.losses.NormalizedSoftmaxLoss(c, d, temperature=0.05),
                comparable=False, semantics=SAME_WEIGHTS_DIFFER),
    _plain_pair("cosface", "cosface", "CosFaceLoss(C, D, 0.35, 64)",
                lambda pml, c, d: pml.losses.CosFaceLoss(c, d, margin=0.35, scale=64),
                comparable=False, semantics=SAME_WEIGHTS_DIFFER),
    _plain_pair("arcface", "arcface", "ArcFaceLoss(C, D, 28.6 deg, 64)",
                lambda pml, c, d: pml.losses.ArcFaceLoss(c, d, margin=28.6, scale=64),
                comparable=False, semantics=SAME_WEIGHTS_DIFFER),
    _plain_pair("subcenter_arcface", "subcenter_arcface", "SubCenterArcFaceLoss(C, D, K=3)",
                lambda pml, c, d: pml.losses.SubCenterArcFaceLoss(
                    num_classes=c, embedding_size=d, margin=28.6, scale=64,
                    sub_centers=3), comparable=False, semantics=SAME_WEIGHTS_DIFFER),
    _plain_pair("softtriple", "softtriple", "SoftTripleLoss(C, D, K=10)",
                lambda pml, c, d: pml.losses.SoftTripleLoss(c, d, centers_per_class=10),
                comparable=False, semantics=SAME_WEIGHTS_DIFFER),
    _plain_pair("large_margin_softmax", "large_margin_softmax",
                "LargeMarginSoftmaxLoss(C, D, 4, 1)",
                lambda pml, c, d: pml.losses.LargeMarginSoftmaxLoss(c, d, margin=4, scale=1),
                comparable=False, semantics=SAME_WEIGHTS_DIFFER),
    _plain_pair("sphereface", "sphereface", "SphereFaceLoss(C, D, 4, 1)",
                lambda pml, c, d: pml.losses.SphereFaceLoss(c, d, margin=4, scale=1),
                comparable=False, semantics=SAME_WEIGHTS_DIFFER),
    _plain_pair("p2sgrad", "p2sgrad", "P2SGradLoss(D, C)",
                lambda pml, c, d: pml.losses.P2SGradLoss(descriptors_dim=d, num_classes=c),
                comparable=False, semantics=SAME_WEIGHTS_DIFFER),
    _plain_pair("pnp", "pnp", "PNPLoss(b=2, alpha=1, anneal=0.01, 'O')",
                lambda pml, c, d: pml.losses.PNPLoss(b=2, alpha=1, anneal=0.01, variant="O")),
    _plain_pair("smooth_ap", "smooth_ap", "SmoothAPLoss(0.01)",
                lambda pml, c, d: pml.losses.SmoothAPLoss(temperature=0.01), comparable=False,
                semantics="PML groups the batch into the right classes only when it has as many "
                          "classes as examples per class (compared there in tests/objectives/"
                          "test_pml_reference.py)"),
    _plain_pair("intra_pair_variance", "intra_pair_variance", "IntraPairVarianceLoss(0.01, 0.01)",
                lambda pml, c, d: pml.losses.IntraPairVarianceLoss(pos_eps=0.01, neg_eps=0.01)),
)


PML_PAIRS: tuple[PmlPair, ...] = PML_BASELINES + (
    PmlPair(
        key="triplet_easy_hard", objective="triplet",
        hparams={"positive": "easy", "negative": "hard"},
        pml="TripletMarginLoss(margin=0.2) + BatchEasyHardMiner(EASY, HARD), squared Lp",
        build=_build_triplet_easy_hard, comparable=True,
        semantics="same loss (PML with MeanReducer; its default AvgNonZeroReducer averages "
                  "only the non-zero triplets)"),
    PmlPair(
        key="triplet_semihard", objective="triplet",
        hparams={"positive": "all", "negative": "semihard"},
        pml="TripletMarginLoss(margin=0.2) + TripletMarginMiner('semihard'), squared Lp",
        build=_build_triplet_semihard, comparable=False,
        semantics="differs: PML keeps every semi-hard triplet (0 < d_an^2 - d_ap^2 <= margin); "
                  "ours takes, per (anchor, positive), the hardest negative with "
                  "d_an^2 >= d_ap^2 (hinge 0 beyond the margin)"),
    PmlPair(
        key="multi_similarity", objective="multi_similarity", hparams={},
        pml="MultiSimilarityLoss(2, 50, 0.5) + MultiSimilarityMiner(0.1), cosine",
        build=_build_multi_similarity, comparable=True,
        semantics="same loss where every anchor keeps a positive and a negative (PML keeps an "
                  "anchor's positive term when its negative set is empty; the official code, "
                  "and ours, drop it)"),
    PmlPair(
        key="margin", objective="margin", hparams={},
        pml="MarginLoss(0.2, beta=1.2 per class, learned) + DistanceWeightedMiner(0.5, 1.4)",
        build=_build_margin, comparable=False,
        semantics="stochastic negatives, so values are not compared; PML samples n_p triplets "
                  "per anchor with random positives, ours one negative per (anchor, positive)"),
    PmlPair(
        key="triplet_all", objective="triplet",
        hparams={"positive": "all", "negative": "all"},
        pml="TripletMarginLoss(margin=0.2), no miner (all triplets), squared Lp",
        build=_build_triplet_all, comparable=True,
        semantics="same loss with equal class sizes (ours: mean over (a, p) of the mean over "
                  "negatives; PML: mean over all triplets, MeanReducer)"),
)


def step(pml, pair: PmlPair, x: np.ndarray, y: np.ndarray, *, per_class: int):
  """``(call, x)``: ``call()`` runs ``pair``'s miner + loss forward and backward on ``(x, y)``
  and returns the loss tensor; ``x`` is the embeddings leaf (its ``grad`` after a call)."""
  torch = pml.torch
  xt = torch.from_numpy(x.copy()).requires_grad_(True)
  yt = torch.from_numpy(y.astype(np.int64))
  loss_fn, modules = pair.build(pml, x.shape[0] // per_class, x.shape[1])
  leaves = [xt] + [p for m in modules for p in m.parameters()]

  def call():
    for leaf in leaves:
      leaf.grad = None
    loss = loss_fn(xt, yt)
    if loss.requires_grad:   # PML returns a constant 0 when the miner finds nothing
      loss.backward()
    return loss

  return call, xt
