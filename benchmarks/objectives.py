r"""Forward+backward time and memory of every objective, against pytorch-metric-learning (PML).

  python benchmarks/objectives.py                    # B = 128, 512, 2048, D = 512 (~10 min, 2 CPUs)
  python benchmarks/objectives.py --smoke            # B = 32, 2 repeats (seconds)
  python benchmarks/objectives.py --objectives=triplet,nca --batch_sizes=512 --nopml

What is measured, per objective and batch size ``B``:

* the inputs: random L2-normalised embeddings ``[B, D]`` (Gaussian rows scaled to unit norm)
  and labels ``[B]`` with ``B / per_class`` classes of ``per_class`` examples (seeded);
* ours: ``jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))`` — the loss of
  ``objectives.make(name, **hparams).apply`` and its gradient w.r.t. the embeddings and the
  objective's parameters (``{}`` for parameter-free objectives; ``init`` with
  ``num_classes = B / per_class``), called with a PRNG key (random selections need one).
  Lowering + compilation is timed once (``compile s``); after ``warmup`` calls the median and
  inter-quartile range of ``repeats`` (20) calls, each ended by ``jax.block_until_ready``. A
  case whose timed calls exceed ``max_seconds`` (20 s) stops early, after at least 5 calls, so
  that the default run stays near 10 minutes on 2 CPUs (the table says ``capped``;
  ``--max_seconds=0`` always makes ``repeats`` calls);
* the floor: the bare similarity matmul ``S = X X^T`` contracted with a fixed random
  ``[B, B]`` matrix ``W``, forward and backward (``dX = (W + W^T) X``), timed the same way
  (row ``similarity matmul (floor)``). Every objective pays at least this;
* memory: the compiled executable's ``memory_analysis()``: ``temp`` (XLA scratch buffers: the
  intermediate ``[B, B]`` matrices live here), ``argument`` and ``output`` bytes, and
  ``peak = temp + argument + output - alias``. ``--memory_batch_sizes`` (default 4096) adds
  batch sizes that are compiled for this analysis only, not timed. An objective whose temp
  bytes grow faster than ``B^2.2`` between the two largest batch sizes (``> ~4.6x`` from 2048
  to 4096; ``B^2`` gives 4x, a ``[B, B, B]`` tensor 8x) is flagged;
* PML (when torch and pytorch-metric-learning import, see ``requirements-bench.txt``): the
  pairs of :data:`PML_PAIRS`, on the same numpy inputs (``torch.from_numpy``, the embeddings a
  leaf with ``requires_grad``), miner + loss forward and ``loss.backward()``, timed the same
  way. ``torch.set_num_threads`` is set to the number of CPUs this process may use
  (``os.sched_getaffinity``), which is the size of XLA:CPU's intra-op thread pool, so both
  sides use the same cores. PML cases stop after ``pml_max_seconds`` (15 s) of timed calls, with
  at least 2 (PML's margin miner and all-triplets loss take seconds per call at B = 2048; the
  table says ``capped``). PML memory is not measured (the PyTorch CPU allocator keeps no peak
  statistics).
* a value check on one small batch (``4 * per_class`` examples, ``D = 32``): PML's loss and
  gradient against ours; where the semantics match they must agree (float32 tolerances).

Other processes compete for the CPUs: the load average before and after the run is recorded
(``config.load_average``) — compare timings only between quiet runs. The process's address
space is capped at ``--memory_fraction`` (0.75) of the physical memory, so that a PML loss
that needs more (NTXent at B = 2048: ``[P, N]`` matrices of positive x negative pairs) fails
with an error, shown in the table, instead of getting the benchmark killed. On a loaded machine the
multi-threaded runs (XLA's pool and torch's OpenMP threads both) lose much time to preemption
— PML's small cases most, since every OpenMP barrier waits for a descheduled thread. Pinning
the process to one CPU gives both sides one thread and far steadier numbers:
``taskset -c 0 python benchmarks/objectives.py`` (the CPU count is read from the affinity).

The goal printed per row with a PML time at ``B >= 512``: where PML takes more than
``3x`` the floor, ours must be ``>= 3x`` faster than PML; elsewhere (PML itself near the
floor) ours must be within ``1.5x`` of the floor.

The markdown table is printed and everything is written as JSON to ``--out``
(``runs/bench_objectives.json``). Objectives registered later are picked up automatically:
every name of ``objectives.names()`` is benchmarked with its defaults, plus the PML comparison
variants whose objective is registered.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import sys
import time
import traceback
import types
from typing import Any, Callable, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from dml_jax import objectives  # pylint: disable=g-import-not-at-top,wrong-import-position

DEFAULT_BATCH_SIZES = (128, 512, 2048)
SMOKE_BATCH_SIZES = (32,)
SMOKE_REPEATS = 2
CUBIC_EXPONENT = 2.2       # temp bytes growing faster than B^2.2 are flagged (B^3 = a [B, B, B])
TARGET_RATIO = 3.0         # goal: PML time / ours >= 3 at B >= TARGET_MIN_BATCH ...
TARGET_MIN_BATCH = 512
FLOOR_PML_FACTOR = 3.0     # ... where PML takes more than 3x the floor; elsewhere ...
FLOOR_SLOWDOWN = 1.5       # ... ours within 1.5x of the floor
FLOOR_LABEL = "similarity matmul (floor)"
DEFAULT_MEMORY_BATCH_SIZES = (4096,)
MIN_REPEATS = 5            # a capped case of ours still gets this many timed calls
MIN_PML_REPEATS = 2        # ... and a capped PML case this many
CHECK_CLASSES = 4          # value check: 4 classes of per_class examples ...
CHECK_DIM = 32             # ... in 32 dimensions
LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-6
MIB = 2.0 ** 20


# ------------------------------------------------------------------------------------------
# The PML comparisons.


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


# ------------------------------------------------------------------------------------------
# Cases.


@dataclasses.dataclass(frozen=True)
class Case:
  """One of our objectives with fixed hyper-parameters, and its PML pair if any.

  Attributes:
    label: row name: the objective name, plus ``(key=value, ...)`` for non-default settings.
    name: the registry name.
    hparams: the hyper-parameters passed to ``objectives.make`` (others at their defaults).
    pair: the :class:`PmlPair` timed against it, or None.
  """
  label: str
  name: str
  hparams: dict[str, Any]
  pair: PmlPair | None = None


def _label(name: str, hparams: dict[str, Any]) -> str:
  if not hparams:
    return name
  return f"{name}({', '.join(f'{k}={v}' for k, v in hparams.items())})"


def _resolved(name: str, hparams: dict[str, Any]) -> dict[str, Any]:
  return {**objectives.hparam_defaults(name), **hparams}


def select_cases(names: Sequence[str] = ("all",)) -> tuple[list[Case], list[str]]:
  """The cases to run: every registered objective with defaults, plus the PML variants.

  Args:
    names: registry names, or ``('all',)`` for every registered objective.

  Returns:
    ``(cases, skipped)``: the cases (defaults first, then non-default PML variants; a PML pair
    whose settings are an objective's defaults is attached to that row) and one line per PML
    pair whose objective is not registered.

  Raises:
    ValueError: an unknown name (lists the registered ones).
  """
  registered = objectives.names()
  names = tuple(names)
  if names == ("all",) or not names:
    wanted = registered
  else:
    unknown = [n for n in names if n not in registered]
    if unknown:
      raise ValueError(f"Unknown objective(s) {', '.join(unknown)}; registered: "
                       f"{', '.join(registered)} (or 'all').")
    wanted = tuple(dict.fromkeys(names))
  cases = [Case(label=n, name=n, hparams={}) for n in wanted]
  skipped = []
  for pair in PML_PAIRS:
    if pair.objective not in registered:
      skipped.append(f"{pair.key}: objective {pair.objective!r} is not registered (yet); "
                     f"PML {pair.pml} not timed.")
      continue
    if pair.objective not in wanted:
      continue
    resolved = _resolved(pair.objective, pair.hparams)
    for i, case in enumerate(cases):
      if case.name == pair.objective and _resolved(case.name, case.hparams) == resolved:
        cases[i] = dataclasses.replace(case, pair=pair)
        break
    else:
      cases.append(Case(label=_label(pair.objective, pair.hparams), name=pair.objective,
                        hparams=dict(pair.hparams), pair=pair))
  return cases, skipped


# ------------------------------------------------------------------------------------------
# Inputs and timing.


def make_batch(batch_size: int, dim: int, *, per_class: int = 8, seed: int = 0):
  """Random unit embeddings and balanced labels.

  Args:
    batch_size: ``B``, a multiple of ``per_class``.
    dim: ``D``.
    per_class: examples per class; ``B / per_class`` classes, labels ``[0 0 .. 1 1 ..]``.
    seed: numpy seed.

  Returns:
    ``(x, y)``: float32 ``[B, D]`` with unit rows, int32 ``[B]``.
  """
  if per_class < 2 or batch_size % per_class or batch_size < 2 * per_class:
    raise ValueError(f"batch_size={batch_size} must be a multiple of per_class={per_class} "
                     "(>= 2) with at least 2 classes.")
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((batch_size, dim)).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  y = np.repeat(np.arange(batch_size // per_class, dtype=np.int32), per_class)
  return x, y


def timing_stats(seconds: Sequence[float]) -> dict[str, float]:
  """Median, quartiles, IQR and min of run times, in milliseconds; ``repeats`` = count."""
  ms = 1e3 * np.asarray(seconds, np.float64)
  q25, med, q75 = np.percentile(ms, [25, 50, 75])
  return {"median_ms": float(med), "q25_ms": float(q25), "q75_ms": float(q75),
          "iqr_ms": float(q75 - q25), "min_ms": float(ms.min()), "repeats": int(ms.size)}


def minor_faults() -> int | None:
  """This process's minor page faults so far (None where ``resource`` is unavailable)."""
  try:
    import resource  # pylint: disable=import-outside-toplevel
  except ImportError:   # not Unix
    return None
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_calls(fn: Callable[[], Any], *, repeats: int, warmup: int,
               max_seconds: float = 0.0, min_repeats: int = 1) -> tuple[dict, bool, Any]:
  """Times ``fn()`` (which must block until its result is ready).

  Args:
    fn: the call to time.
    repeats: the number of timed calls.
    warmup: untimed calls first.
    max_seconds: > 0: stop once the timed calls took this long and ``min_repeats`` are done.
    min_repeats: see ``max_seconds``.

  Returns:
    ``(timing_stats(...) + faults_per_call, capped, result)``: ``faults_per_call`` is the
    process's minor page faults per timed call (memory the allocator maps afresh and the call
    touches; None without ``resource``), ``capped`` is True when ``max_seconds`` cut the
    repeats; ``result`` is what the last call returned.
  """
  result = None
  for _ in range(warmup):
    result = fn()
  times = []
  faults = minor_faults()
  while len(times) < repeats:
    start = time.perf_counter()
    result = fn()
    times.append(time.perf_counter() - start)
    if max_seconds > 0 and len(times) >= min_repeats and sum(times) >= max_seconds:
      break
  stats = timing_stats(times)
  stats["faults_per_call"] = None if faults is None else (minor_faults() - faults) / len(times)
  return stats, len(times) < repeats, result


def memory_stats(compiled) -> dict[str, int] | None:
  """Bytes of a compiled executable's ``memory_analysis()`` (None where unavailable)."""
  try:
    ma = compiled.memory_analysis()
  except Exception:   # pylint: disable=broad-except  (backends without the analysis)
    return None
  if ma is None:
    return None
  mem = {"temp_bytes": int(ma.temp_size_in_bytes),
         "argument_bytes": int(ma.argument_size_in_bytes),
         "output_bytes": int(ma.output_size_in_bytes),
         "alias_bytes": int(ma.alias_size_in_bytes)}
  mem["peak_bytes"] = (mem["temp_bytes"] + mem["argument_bytes"] + mem["output_bytes"]
                       - mem["alias_bytes"])
  return mem


def _loss_and_grad(obj: objectives.Objective):
  """``jit(value_and_grad)`` of ``obj``'s loss w.r.t. (embeddings, params)."""
  def loss(embeddings, params, labels, key):
    return obj.apply(params, embeddings, labels, rng=key)[0]
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))   # jit: also called directly


def compile_and_time(fn: Callable, args: Sequence, *, repeats: int, warmup: int,
                     max_seconds: float = 0.0) -> dict:
  """``jax.jit(fn)`` lowered and compiled on ``args`` (timed once), then timed with
  :func:`time_calls`; ``fn``'s first output is the loss. Returns the timing stats,
  ``capped``, ``max_seconds``, ``compile_s``, ``memory`` and ``loss``."""
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - start
  timing, capped, out = time_calls(
      lambda: jax.block_until_ready(compiled(*args)), repeats=repeats, warmup=warmup,
      max_seconds=max_seconds, min_repeats=min(repeats, MIN_REPEATS))
  return {**timing, "capped": capped, "max_seconds": max_seconds, "compile_s": compile_s,
          "memory": memory_stats(compiled), "loss": float(out[0])}


def write_json(report: dict, out: str) -> None:
  """Writes ``report`` to ``out`` (creating its folder); nothing when ``out`` is ''."""
  if out:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
      json.dump(report, f, indent=2)


def bench_ours(case: Case, x: np.ndarray, y: np.ndarray, *, per_class: int, repeats: int,
               warmup: int, seed: int = 0, max_seconds: float = 0.0) -> dict:
  """Compile time, memory and run time of ``case`` on ``(x, y)`` (see the module docstring)."""
  obj = objectives.make(case.name, **case.hparams)
  key = jax.random.key(seed)
  params = obj.init(key, num_classes=x.shape[0] // per_class, dim=x.shape[1])
  return compile_and_time(_loss_and_grad(obj), (jax.device_put(x), params, jax.device_put(y),
                                                key),
                          repeats=repeats, warmup=warmup, max_seconds=max_seconds)


def bench_floor(x: np.ndarray, *, repeats: int, warmup: int, seed: int = 0,
                max_seconds: float = 0.0) -> dict:
  """The floor: forward + backward of ``sum(W * (X X^T))`` for a fixed random ``W [B, B]``.

  Its gradient ``(W + W^T) X`` is the backward matmul an objective on ``S [B, B]`` pays (JAX
  differentiates both operands of ``X X^T``: ``W X + W^T X``, so three GEMMs in all, as in
  every objective here), so the time is the least any objective of this benchmark can take.
  Same fields as :func:`bench_ours`.
  """
  b = x.shape[0]
  w = jax.device_put(np.random.default_rng(seed).standard_normal((b, b)).astype(np.float32))
  return compile_and_time(jax.value_and_grad(lambda e, w: jax.numpy.sum(w * (e @ e.T))),
                          (jax.device_put(x), w), repeats=repeats, warmup=warmup,
                          max_seconds=max_seconds)


def memory_only(case: Case, x: np.ndarray, y: np.ndarray, *, per_class: int,
                seed: int = 0) -> dict:
  """Compile time and ``memory_analysis()`` of ``case`` on ``(x, y)``, without running it."""
  obj = objectives.make(case.name, **case.hparams)
  key = jax.random.key(seed)
  params = obj.init(key, num_classes=x.shape[0] // per_class, dim=x.shape[1])
  start = time.perf_counter()
  compiled = _loss_and_grad(obj).lower(jax.device_put(x), params, jax.device_put(y),
                                       key).compile()
  return {"memory_only": True, "compile_s": time.perf_counter() - start,
          "memory": memory_stats(compiled)}


# ------------------------------------------------------------------------------------------
# PML.


def limit_address_space(fraction: float) -> int | None:
  """Caps this process's address space at ``fraction`` of the physical memory (Linux).

  PML's NTXent and tuple losses build ``[positive pairs, negative pairs]`` matrices (O(B^3)):
  at B = 2048 they ask for more memory than the machine has, and the kernel would kill the
  whole benchmark. Under the cap such an allocation fails with a ``RuntimeError`` instead,
  which is recorded as that case's ``pml_error``. Returns the cap in bytes (None: not set).
  """
  import resource  # pylint: disable=import-outside-toplevel
  if fraction <= 0:
    return None
  try:
    limit = int(fraction * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
  except (ValueError, OSError, AttributeError):   # not Linux, or a lower hard limit
    return None
  return limit


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


def _pml_step(pml, pair: PmlPair, x: np.ndarray, y: np.ndarray, *, per_class: int):
  """``(step, leaves)``: ``step()`` runs miner + loss + backward and returns the loss tensor."""
  torch = pml.torch
  xt = torch.from_numpy(x.copy()).requires_grad_(True)
  yt = torch.from_numpy(y.astype(np.int64))
  loss_fn, modules = pair.build(pml, x.shape[0] // per_class, x.shape[1])
  leaves = [xt] + [p for m in modules for p in m.parameters()]

  def step():
    for leaf in leaves:
      leaf.grad = None
    loss = loss_fn(xt, yt)
    if loss.requires_grad:   # PML returns a constant 0 when the miner finds nothing
      loss.backward()
    return loss

  return step, xt


def bench_pml(pml, pair: PmlPair, x: np.ndarray, y: np.ndarray, *, per_class: int,
              repeats: int, warmup: int, max_seconds: float) -> dict:
  """Run time of PML's miner + loss forward and backward on ``(x, y)``."""
  step, _ = _pml_step(pml, pair, x, y, per_class=per_class)
  timing, capped, loss = time_calls(step, repeats=repeats, warmup=warmup,
                                    max_seconds=max_seconds,
                                    min_repeats=min(repeats, MIN_PML_REPEATS))
  return {**timing, "capped": capped, "max_seconds": max_seconds, "loss": loss.item()}


def value_check(pml, pair: PmlPair, *, per_class: int, seed: int = 0) -> dict:
  """PML's loss and gradient against ours on one small batch (``CHECK_CLASSES`` classes).

  Returns:
    dict with both losses, ``loss_abs_diff``, ``grad_max_abs_diff`` (w.r.t. the embeddings),
    ``comparable`` and ``agree`` (None where the semantics differ by design).
  """
  x, y = make_batch(CHECK_CLASSES * per_class, CHECK_DIM, per_class=per_class, seed=seed + 1)
  obj = objectives.make(pair.objective, **pair.hparams)
  key = jax.random.key(seed)
  params = obj.init(key, num_classes=CHECK_CLASSES, dim=CHECK_DIM)
  ours_loss, (ours_grad, _) = _loss_and_grad(obj)(x, params, y, key)
  ours_loss, ours_grad = float(ours_loss), np.asarray(ours_grad)
  step, xt = _pml_step(pml, pair, x, y, per_class=per_class)
  pml_loss = step().item()
  pml_grad = (np.zeros_like(x) if xt.grad is None else xt.grad.detach().numpy())
  loss_diff = abs(ours_loss - pml_loss)
  grad_diff = float(np.max(np.abs(ours_grad - pml_grad)))
  agree = None
  if pair.comparable:
    agree = bool(loss_diff <= LOSS_ATOL + LOSS_RTOL * abs(pml_loss)
                 and grad_diff <= GRAD_ATOL + GRAD_RTOL * float(np.max(np.abs(pml_grad))))
  return {"pair": pair.key, "objective": _label(pair.objective, pair.hparams),
          "batch_size": int(x.shape[0]), "dim": CHECK_DIM, "ours_loss": ours_loss,
          "pml_loss": pml_loss, "loss_abs_diff": loss_diff, "grad_max_abs_diff": grad_diff,
          "comparable": pair.comparable, "agree": agree, "semantics": pair.semantics}


# ------------------------------------------------------------------------------------------
# Summaries.


def memory_growth(results: Sequence[dict]) -> list[dict]:
  """Temp-byte growth of each case between its two largest batch sizes (memory-only included).

  ``exponent = log(temp_large / temp_small) / log(B_large / B_small)``; ``cubic`` flags
  ``exponent > CUBIC_EXPONENT`` (a ``[B, B, B]`` intermediate; ``[B, B]`` gives 2).
  """
  by_label: dict[str, dict[int, int]] = {}
  for r in results:
    mem = (r.get("ours") or {}).get("memory")
    if mem and mem["temp_bytes"] > 0:
      by_label.setdefault(r["label"], {})[r["batch_size"]] = mem["temp_bytes"]
  rows = []
  for label, temps in by_label.items():
    sizes = sorted(temps)
    if len(sizes) < 2:
      continue
    small, large = sizes[-2:]
    ratio = temps[large] / temps[small]
    exponent = math.log(ratio) / math.log(large / small)
    rows.append({"label": label, "b_small": small, "b_large": large, "temp_ratio": ratio,
                 "exponent": exponent, "cubic": exponent > CUBIC_EXPONENT})
  return rows


def goals(results: Sequence[dict]) -> list[dict]:
  """The speed goal of every row with a PML time at ``B >= TARGET_MIN_BATCH``.

  With ``F`` the floor's median at that ``B``: if PML takes more than ``FLOOR_PML_FACTOR F``,
  the goal is ``PML / ours >= TARGET_RATIO``; otherwise ``ours <= FLOOR_SLOWDOWN F`` (PML is
  itself near the floor, and nobody can be 3x faster than the matmul both must do). Without a
  floor row at that ``B`` the goal is ``PML / ours >= TARGET_RATIO``.

  Returns:
    one dict per row: ``label``, ``batch_size``, ``kind`` (``'vs_pml'`` | ``'vs_floor'``),
    ``value`` (the ratio compared), ``goal``, ``met`` and a text ``line``.
  """
  floor = {r["batch_size"]: r["ours"]["median_ms"] for r in results
           if r["label"] == FLOOR_LABEL and r.get("ours")}
  out = []
  for r in results:
    if r.get("ratio") is None or r["batch_size"] < TARGET_MIN_BATCH:
      continue
    b, f = r["batch_size"], floor.get(r["batch_size"])
    if f is not None and r["pml"]["median_ms"] <= FLOOR_PML_FACTOR * f:
      kind, value, goal = "vs_floor", r["ours"]["median_ms"] / f, FLOOR_SLOWDOWN
      met = value <= goal
      text = (f"ours / floor {value:.2f}x (goal <= {goal:g}x; PML / floor "
              f"{r['pml']['median_ms'] / f:.2f}x)")
    else:
      kind, value, goal = "vs_pml", r["ratio"], TARGET_RATIO
      met = value >= goal
      text = f"PML / ours {value:.2f}x (goal >= {goal:g}x" + (
          f"; PML / floor {r['pml']['median_ms'] / f:.1f}x)" if f else ")")
    out.append({"label": r["label"], "batch_size": b, "kind": kind, "value": value,
                "goal": goal, "met": bool(met),
                "line": f"goal {'met' if met else 'NOT met'}: {r['label']} B={b}: {text}"})
  return out


def fmt(value, spec: str, empty: str = "—") -> str:
  return empty if value is None else format(value, spec)


def markdown_table(report: dict) -> str:
  """The results as a markdown table (one row per case and batch size)."""
  lines = ["| objective | B | ours ms (median) | IQR ms | compile s | temp MB | PML ms | "
           "PML/ours | PML pair, notes |", "|---|---|---|---|---|---|---|---|---|"]
  for r in report["results"]:
    ours, pml = r.get("ours"), r.get("pml")
    notes = []
    if r.get("pml_pair"):
      notes.append(r["pml_pair"]["pml"])
      if not r["pml_pair"]["comparable"]:
        notes.append("semantics differ (see checks)")
    if ours is None:
      notes.append(f"ours failed: {r.get('error', '?')}")
    elif ours.get("memory_only"):
      notes.append("memory only (compiled, not run)")
    elif ours.get("capped"):
      notes.append(f"ours {ours['repeats']} runs (capped)")
    if pml and pml.get("capped"):
      notes.append(f"PML {pml['repeats']} runs (capped at {pml['max_seconds']:.0f} s)")
    if r.get("pml_error"):
      notes.append(f"PML failed: {r['pml_error']}")
    mem = (ours or {}).get("memory") or {}
    temp = mem.get("temp_bytes")
    lines.append("| " + " | ".join([
        r["label"], str(r["batch_size"]),
        fmt((ours or {}).get("median_ms"), ".1f"), fmt((ours or {}).get("iqr_ms"), ".1f"),
        fmt((ours or {}).get("compile_s"), ".2f"),
        fmt(None if temp is None else temp / MIB, ".1f"),
        fmt((pml or {}).get("median_ms"), ".1f"), fmt(r.get("ratio"), ".2f"),
        "; ".join(notes)]) + " |")
  return "\n".join(lines)


def summary_lines(report: dict) -> list[str]:
  """Value checks, memory-growth flags, the speed target and skipped pairs, as text lines."""
  lines = []
  for c in report["checks"]:
    if "error" in c:
      lines.append(f"check {c['pair']}: failed to run: {c['error']}")
      continue
    verdict = ("agree" if c["agree"] else "DISAGREE") if c["comparable"] else "not compared"
    lines.append(f"check {c['objective']} vs PML (B={c['batch_size']}, D={c['dim']}): "
                 f"ours {c['ours_loss']:.6f}, PML {c['pml_loss']:.6f}, |d loss| "
                 f"{c['loss_abs_diff']:.2e}, max |d grad| {c['grad_max_abs_diff']:.2e}: "
                 f"{verdict} ({c['semantics']})")
  for g in report["memory_growth"]:
    if g["cubic"]:
      lines.append(f"MEMORY: {g['label']}: temp bytes x{g['temp_ratio']:.1f} from B="
                   f"{g['b_small']} to {g['b_large']} (~B^{g['exponent']:.2f}): a [B, B, B] "
                   "intermediate?")
  if report["memory_growth"] and not any(g["cubic"] for g in report["memory_growth"]):
    worst = max(report["memory_growth"], key=lambda g: g["exponent"])
    lines.append(f"memory: no objective grows like B^3 (largest: {worst['label']} "
                 f"~B^{worst['exponent']:.2f})")
  lines.extend(g["line"] for g in goals(report["results"]))
  lines.extend(f"skipped: {s}" for s in report["skipped"])
  return lines


# ------------------------------------------------------------------------------------------
# The run.


def available_cpus() -> int:
  """CPUs this process may run on (XLA:CPU sizes its intra-op thread pool by this)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:   # not Linux
    return os.cpu_count() or 1


def run(*, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, dim: int = 512,
        per_class: int = 8, repeats: int = 20, warmup: int = 1,
        memory_batch_sizes: Sequence[int] = (), floor: bool = True,
        objective_names: Sequence[str] = ("all",), pml: bool = True, threads: int = 0,
        pml_max_seconds: float = 15.0, max_seconds: float = 20.0, check: bool = True,
        seed: int = 0, out: str = "", log: Callable[[str], None] = print) -> dict:
  """Runs the benchmark and returns the report (also written as JSON to ``out`` if given).

  Args:
    batch_sizes: the ``B`` values, multiples of ``per_class``.
    dim: ``D``.
    per_class: examples per class.
    repeats: timed calls per case (>= 1).
    warmup: untimed calls before them (after compilation).
    memory_batch_sizes: more ``B`` values, compiled for ``memory_analysis()`` only (not run).
    floor: time the bare similarity matmul (:func:`bench_floor`) at every ``B`` first.
    objective_names: registry names or ``('all',)``.
    pml: time the PML pairs when torch and PML import.
    threads: torch threads; 0 = :func:`available_cpus` (what XLA:CPU uses).
    pml_max_seconds: > 0: stop timing a PML case once its timed calls took this long
      (at least ``MIN_PML_REPEATS`` calls); 0 = always ``repeats`` calls.
    max_seconds: the same cap for our cases (at least ``MIN_REPEATS`` calls).
    check: run the value check of each PML pair.
    seed: inputs and PRNG keys.
    out: JSON path ('' = do not write).
    log: progress printer.

  Returns:
    ``{'config', 'results', 'memory_growth', 'goals', 'checks', 'skipped'}``; ``results`` has
    one dict per case and batch size (the floor first, labelled ``FLOOR_LABEL``): ``label``,
    ``objective``, ``hparams``, ``batch_size``, ``dim``, ``ours`` (timing stats,
    ``compile_s``, ``memory``, ``loss``; only ``memory_only``, ``compile_s`` and ``memory`` at
    a memory-only ``B``; None if it failed), ``pml_pair``, ``pml`` (timing stats or None) and
    ``ratio`` (PML median / ours median); ``goals`` is :func:`goals` of the results.
  """
  if repeats < 1 or warmup < 0:
    raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}.")
  batch_sizes = tuple(int(b) for b in batch_sizes)
  memory_batch_sizes = tuple(int(b) for b in memory_batch_sizes if int(b) not in batch_sizes)
  for b in batch_sizes + memory_batch_sizes:
    make_batch(b, 1, per_class=per_class)   # validates B and per_class
  cases, skipped = select_cases(objective_names)
  cpus = available_cpus()
  pml_ns, pml_info = import_pml() if pml else (None, "PML disabled (--nopml).")
  if pml_ns is None:
    skipped.append(pml_info)
  else:
    pml_ns.torch.set_num_threads(threads or cpus)
  config = {
      "batch_sizes": list(batch_sizes), "memory_batch_sizes": list(memory_batch_sizes),
      "dim": dim, "per_class": per_class, "repeats": repeats,
      "warmup": warmup, "objectives": [c.label for c in cases], "seed": seed,
      "pml_max_seconds": pml_max_seconds, "max_seconds": max_seconds,
      "jax": jax.__version__, "jax_backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()], "cpus": cpus,
      "torch_threads": pml_ns.torch.get_num_threads() if pml_ns else None,
      "pml": pml_info if pml_ns else None, "python": platform.python_version(),
      "machine": platform.machine(), "load_average": {"start": list(os.getloadavg())},
      "grad_wrt": "embeddings and objective params",
  }
  log(f"JAX {jax.__version__} on {config['devices']}, {cpus} CPUs; "
      f"{pml_info if pml_ns else 'no PML'}; torch threads {config['torch_threads']}")
  results, checks = [], []
  start_all = time.perf_counter()
  for b in batch_sizes if floor else ():
    x, _ = make_batch(b, dim, per_class=per_class, seed=seed)
    row = {"label": FLOOR_LABEL, "objective": None, "hparams": {}, "batch_size": b, "dim": dim,
           "ours": bench_floor(x, repeats=repeats, warmup=warmup, seed=seed,
                               max_seconds=max_seconds),
           "pml": None, "ratio": None, "pml_pair": None}
    results.append(row)
    log(_progress(row, time.perf_counter() - start_all))
  for case in cases:
    if pml_ns is not None and check and case.pair is not None:
      try:
        checks.append(value_check(pml_ns, case.pair, per_class=per_class, seed=seed))
      except Exception as e:   # pylint: disable=broad-except  (recorded, the run goes on)
        checks.append({"pair": case.pair.key, "error": f"{type(e).__name__}: {e}"})
    for b in batch_sizes:
      x, y = make_batch(b, dim, per_class=per_class, seed=seed)
      row = {"label": case.label, "objective": case.name,
             "hparams": _jsonable(_resolved(case.name, case.hparams)), "batch_size": b,
             "dim": dim, "ours": None, "pml": None, "ratio": None,
             "pml_pair": None if case.pair is None else {
                 "key": case.pair.key, "pml": case.pair.pml,
                 "comparable": case.pair.comparable, "semantics": case.pair.semantics}}
      try:
        row["ours"] = bench_ours(case, x, y, per_class=per_class, repeats=repeats,
                                 warmup=warmup, seed=seed, max_seconds=max_seconds)
      except Exception as e:   # pylint: disable=broad-except  (recorded, the run goes on)
        row["error"] = f"{type(e).__name__}: {e}"
        log(traceback.format_exc())
      if pml_ns is not None and case.pair is not None:
        try:
          row["pml"] = bench_pml(pml_ns, case.pair, x, y, per_class=per_class,
                                 repeats=repeats, warmup=warmup, max_seconds=pml_max_seconds)
        except Exception as e:   # pylint: disable=broad-except
          row["pml_error"] = f"{type(e).__name__}: {e}"
      if row["ours"] and row["pml"]:
        row["ratio"] = row["pml"]["median_ms"] / row["ours"]["median_ms"]
      results.append(row)
      log(_progress(row, time.perf_counter() - start_all))
    for b in memory_batch_sizes:
      x, y = make_batch(b, dim, per_class=per_class, seed=seed)
      row = {"label": case.label, "objective": case.name,
             "hparams": _jsonable(_resolved(case.name, case.hparams)), "batch_size": b,
             "dim": dim, "ours": None, "pml": None, "ratio": None, "pml_pair": None}
      try:
        row["ours"] = memory_only(case, x, y, per_class=per_class, seed=seed)
      except Exception as e:   # pylint: disable=broad-except  (recorded, the run goes on)
        row["error"] = f"{type(e).__name__}: {e}"
      results.append(row)
      log(_progress(row, time.perf_counter() - start_all))
  config["load_average"]["end"] = list(os.getloadavg())
  config["total_s"] = time.perf_counter() - start_all
  report = {"config": config, "results": results, "memory_growth": memory_growth(results),
            "goals": goals(results), "checks": checks, "skipped": skipped}
  write_json(report, out)
  return report


def _jsonable(d: dict) -> dict:
  return {k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)
          for k, v in d.items()}


def _progress(row: dict, elapsed: float) -> str:
  ours, pml = row["ours"], row["pml"]
  text = f"[{elapsed:6.0f} s] {row['label']} B={row['batch_size']}: "
  if ours is None:
    text += "failed"
  elif ours.get("memory_only"):
    temp = (ours["memory"] or {}).get("temp_bytes")
    text += f"temp {fmt(None if temp is None else temp / MIB, '.1f')} MB (compile only)"
  else:
    text += f"{ours['median_ms']:.1f} ms (compile {ours['compile_s']:.1f} s"
    if ours.get("faults_per_call") is not None:
      text += f", {ours['faults_per_call']:,.0f} page faults a call"
    text += ")"
  if pml:
    text += f", PML {pml['median_ms']:.1f} ms, x{row['ratio']:.2f}" if row["ratio"] else ""
  return text


# ------------------------------------------------------------------------------------------
# Binary.


def define_flags():
  """The command-line flags (defined here, not at import, so tests can import the module)."""
  from absl import flags  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  flags.DEFINE_list("batch_sizes", [str(b) for b in DEFAULT_BATCH_SIZES], "Batch sizes B.")
  flags.DEFINE_list("memory_batch_sizes", [str(b) for b in DEFAULT_MEMORY_BATCH_SIZES],
                    "More batch sizes, compiled for memory_analysis() only (not timed).")
  flags.DEFINE_bool("floor", True, "Time the bare similarity matmul (the floor row).")
  flags.DEFINE_integer("dim", 512, "Embedding dimension D.")
  flags.DEFINE_integer("per_class", 8, "Examples per class (B / per_class classes).")
  flags.DEFINE_integer("repeats", 20, "Timed calls per case.")
  flags.DEFINE_integer("warmup", 1, "Untimed calls after compilation.")
  flags.DEFINE_list("objectives", ["all"], "Registry names, or 'all'.")
  flags.DEFINE_string("out", "runs/bench_objectives.json", "JSON output ('' = none).")
  flags.DEFINE_bool("pml", True, "Time pytorch-metric-learning too (if importable).")
  flags.DEFINE_integer("threads", 0, "torch threads (0 = the CPUs XLA uses).")
  flags.DEFINE_float("pml_max_seconds", 15.0,
                     f"Cap on one PML case's timed calls (>= {MIN_PML_REPEATS} calls; 0 = none).")
  flags.DEFINE_float("max_seconds", 20.0,
                     f"Cap on one of our cases' timed calls (>= {MIN_REPEATS} calls; 0 = none).")
  flags.DEFINE_bool("check", True, "Compare PML's and our loss values on a small batch.")
  flags.DEFINE_float("memory_fraction", 0.75,
                     "Cap the process's address space at this fraction of the physical memory "
                     "(PML's O(B^3) losses then fail with an error instead of being killed; "
                     "0 = no cap).")
  flags.DEFINE_bool("smoke", False, f"B={SMOKE_BATCH_SIZES[0]}, {SMOKE_REPEATS} repeats.")
  flags.DEFINE_integer("seed", 0, "Inputs and PRNG keys.")
  flags.DEFINE_enum("host_memory", "default", ["default", "keep"],
                    "keep: this process (ours, the floor and PML alike) keeps freed host memory "
                    "(dml_jax/run/host_memory.py, applied before JAX starts); default: glibc's.")
  return flags.FLAGS


def main(argv):
  del argv
  f = FLAGS
  smoke = f.smoke
  if f.host_memory == "keep":
    from dml_jax.run import host_memory  # pylint: disable=import-outside-toplevel
    print(host_memory.describe(host_memory.keep_freed_memory()))
  cap = limit_address_space(f.memory_fraction)
  report = run(
      batch_sizes=SMOKE_BATCH_SIZES if smoke else [int(b) for b in f.batch_sizes],
      memory_batch_sizes=() if smoke else [int(b) for b in f.memory_batch_sizes],
      floor=f.floor, dim=f.dim, per_class=f.per_class, repeats=SMOKE_REPEATS if smoke else f.repeats,
      warmup=1 if smoke else f.warmup, objective_names=f.objectives, pml=f.pml,
      threads=f.threads, pml_max_seconds=f.pml_max_seconds, max_seconds=f.max_seconds,
      check=f.check, seed=f.seed, out=f.out)
  print()
  print(markdown_table(report))
  print()
  for line in summary_lines(report):
    print(line)
  la = report["config"]["load_average"]
  if cap:
    print(f"\naddress space capped at {cap / 2**30:.1f} GiB (--memory_fraction)", end="")
  print(f"\n{report['config']['total_s']:.0f} s; load average (1 min) {la['start'][0]:.2f} "
        f"at start, {la['end'][0]:.2f} at end on {report['config']['cpus']} CPUs"
        + (f"; results written to {f.out}" if f.out else ""))


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  FLAGS = define_flags()
  app.run(main)
