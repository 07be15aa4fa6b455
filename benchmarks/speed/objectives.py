r"""Forward+backward time and memory of every objective, against pytorch-metric-learning (PML).

  python benchmarks/speed/objectives.py               # B = 128, 512, 2048, D = 512 (~10 min)
  python benchmarks/speed/objectives.py --smoke       # B = 32, 2 repeats (seconds)
  python benchmarks/speed/objectives.py --objectives=triplet,nca --batch_sizes=512 --nopml

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
``taskset -c 0 python benchmarks/speed/objectives.py`` (the CPU count is read from the affinity).

The goal printed per row with a PML time at ``B >= 512``: where PML takes more than
``3x`` the floor, ours must be ``>= 3x`` faster than PML; elsewhere (PML itself near the
floor) ours must be within ``1.5x`` of the floor.

The markdown table is printed and everything is written as JSON to ``--out``
(``runs/bench_objectives.json``). Objectives registered later are picked up automatically:
every name of ``objectives.names()`` is benchmarked with its defaults, plus the PML comparison
variants whose objective is registered.

One file of about 600 lines: the cases, the four measurements, the value checks and the
summaries (memory growth, the speed targets) make one report; the PML pairs are in
``benchmarks/pml.py``.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import platform
import re
import sys
import time
import traceback
from typing import Any, Callable, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
from benchmarks import harness
from benchmarks import pml as pml_lib
from benchmarks.pml import PML_PAIRS, PmlPair
from benchmarks.inputs import make_batch
from dml_jax import objectives
# pylint: enable=g-import-not-at-top,wrong-import-position

DEFAULT_BATCH_SIZES = (128, 512, 2048)
SMOKE_BATCH_SIZES = (32,)
SMOKE_REPEATS = 2
CUBIC_EXPONENT = 2.2       # temp bytes growing faster than B^2.2 are flagged (B^3 = a [B, B, B])
TARGET_RATIO = 3.0         # goal: PML time / ours >= 3 at B >= TARGET_MIN_BATCH ...
TARGET_MIN_BATCH = 512
FLOOR_PML_FACTOR = 3.0     # ... where PML takes more than 3x the floor; elsewhere ...
FLOOR_SLOWDOWN = 1.5       # ... ours within 1.5x of the floor
FLOOR_LABEL = "similarity matmul (floor)"
SCRIPT = "benchmarks/speed/objectives.py"
DEFAULT_MEMORY_BATCH_SIZES = (4096,)
MIN_REPEATS = 5            # a capped case of ours still gets this many timed calls
MIN_PML_REPEATS = pml_lib.MIN_REPEATS   # ... and a capped PML case this many
CHECK_CLASSES = 4          # value check: 4 classes of per_class examples ...
CHECK_DIM = 32             # ... in 32 dimensions


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


def _loss_and_grad(obj: objectives.Objective):
  """``jit(value_and_grad)`` of ``obj``'s loss w.r.t. (embeddings, params)."""
  def loss(embeddings, params, labels, key):
    return obj.apply(params, embeddings, labels, rng=key)[0]
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))   # jit: also called directly


def bench_ours(case: Case, x: np.ndarray, y: np.ndarray, *, per_class: int, repeats: int,
               warmup: int, seed: int = 0, max_seconds: float = 0.0) -> dict:
  """Compile time, memory and run time of ``case`` on ``(x, y)`` (see the module docstring)."""
  obj = objectives.make(case.name, **case.hparams)
  key = jax.random.key(seed)
  params = obj.init(key, num_classes=x.shape[0] // per_class, dim=x.shape[1])
  return harness.compile_and_time(
      _loss_and_grad(obj), (jax.device_put(x), params, jax.device_put(y), key),
      repeats=repeats, warmup=warmup, max_seconds=max_seconds, min_repeats=MIN_REPEATS)


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
  return harness.compile_and_time(
      jax.value_and_grad(lambda e, w: jax.numpy.sum(w * (e @ e.T))), (jax.device_put(x), w),
      repeats=repeats, warmup=warmup, max_seconds=max_seconds, min_repeats=MIN_REPEATS)


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
          "memory": harness.memory_stats(compiled)}


# ------------------------------------------------------------------------------------------
# PML.


def bench_pml(pml, pair: PmlPair, x: np.ndarray, y: np.ndarray, *, per_class: int,
              repeats: int, warmup: int, max_seconds: float) -> dict:
  """Run time of PML's miner + loss forward and backward on ``(x, y)``."""
  step, _ = pml_lib.step(pml, pair, x, y, per_class=per_class)
  timing, capped, loss = harness.time_calls(step, repeats=repeats, warmup=warmup,
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
  step, xt = pml_lib.step(pml, pair, x, y, per_class=per_class)
  pml_loss = step().item()
  pml_grad = (np.zeros_like(x) if xt.grad is None else xt.grad.detach().numpy())
  loss_diff = abs(ours_loss - pml_loss)
  grad_diff = float(np.max(np.abs(ours_grad - pml_grad)))
  agree = None
  if pair.comparable:
    grad_scale = float(np.max(np.abs(pml_grad)))
    agree = bool(loss_diff <= pml_lib.LOSS_ATOL + pml_lib.LOSS_RTOL * abs(pml_loss)
                 and grad_diff <= pml_lib.GRAD_ATOL + pml_lib.GRAD_RTOL * grad_scale)
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


def markdown_table(report: dict) -> str:
  """The results as a markdown table (one row per case and batch size)."""
  rows = []
  for r in report["results"]:
    ours, pml = r.get("ours") or {}, r.get("pml")
    notes = []
    if r.get("pml_pair"):
      notes.append(r["pml_pair"]["pml"])
      if not r["pml_pair"]["comparable"]:
        notes.append("semantics differ (see checks)")
    if r.get("ours") is None:
      notes.append(f"ours failed: {r.get('error', '?')}")
    elif ours.get("memory_only"):
      notes.append("memory only (compiled, not run)")
    elif ours.get("capped"):
      notes.append(f"ours {ours['repeats']} runs (capped)")
    if pml and pml.get("capped"):
      notes.append(f"PML {pml['repeats']} runs (capped at {pml['max_seconds']:.0f} s)")
    if r.get("pml_error"):
      notes.append(f"PML failed: {r['pml_error']}")
    temp = (ours.get("memory") or {}).get("temp_bytes")
    rows.append([r["label"], r["batch_size"], harness.fmt(ours.get("median_ms"), ".1f"),
                 harness.fmt(ours.get("iqr_ms"), ".1f"), harness.fmt(ours.get("compile_s"), ".2f"),
                 harness.fmt(None if temp is None else temp / harness.MIB, ".1f"),
                 harness.fmt((pml or {}).get("median_ms"), ".1f"),
                 harness.fmt(r.get("ratio"), ".2f"), "; ".join(notes)])
  return harness.markdown_table(["objective", "B", "ours ms (median)", "IQR ms", "compile s",
                                 "temp MB", "PML ms", "PML/ours", "PML pair, notes"], rows)


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


def merge_paths(patterns: Sequence[str]) -> list[str]:
  """The report files of ``--merge``: each entry a path or a glob pattern, expanded here (the
  shell leaves ``--merge=runs/objectives/*.json`` as it is), sorted within a pattern.

  Raises:
    ValueError: a pattern that matches no file, or a path that does not exist (naming it).
  """
  paths = []
  for pattern in patterns:
    found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    missing = [p for p in found if not os.path.isfile(p)]
    if not found or missing:
      raise ValueError(f"{pattern!r} names no report file (a JSON that --out wrote).")
    paths.extend(found)
  return paths


def merge(reports: Sequence[dict]) -> dict:
  """One report of several runs (one process per objective, the way the docs table is made),
  with the timings' summaries only. Each row keeps its run's index: a row is compared with the
  floor of its own run.

  Args:
    reports: reports of :func:`run` (as read from their JSON), of the same commit.

  Returns:
    ``{'script', 'runs', 'results', 'checks', 'skipped', 'stamp'}``:
    ``results`` is every run's rows with ``run`` (the run's index) added; ``stamp`` is the first
    run's, with ``command`` the runs' distinct command lines (``--objectives=NAME``) and
    ``dates`` their first and last date.

  Raises:
    ValueError: no reports, or reports of different commits.
  """
  if not reports:
    raise ValueError("merge needs at least one report.")
  commits = sorted({r["stamp"]["commit"] for r in reports})
  if len(commits) > 1:
    raise ValueError(f"the reports were measured at different commits {commits}; merge runs "
                     "of one commit.")
  results, checks, skipped = [], [], []
  for i, r in enumerate(reports):
    rows = [{**_slim(row), "run": i} for row in r["results"]]
    results.extend(rows)
    checks.extend({k: c[k] for k in CHECK_KEYS if k in c} for c in r["checks"])
    skipped.extend(s for s in r["skipped"] if s not in skipped)
  dates = sorted(r["stamp"]["date"] for r in reports)
  commands = [re.sub(r"--out=\S+", "--out=RUN.json",
                     re.sub(r"--objectives=\S+", "--objectives=NAME", r["stamp"]["command"]))
              for r in reports]
  stamp = {**reports[0]["stamp"], "dates": [dates[0], dates[-1]],
           "command": " ; ".join(dict.fromkeys(commands))}
  return {"script": SCRIPT, "runs": [{"objectives": r["config"]["objectives"],
                                      "batch_sizes": r["config"]["batch_sizes"],
                                      "date": r["stamp"]["date"],
                                      "total_s": r["config"].get("total_s")}
                                     for r in reports],
          "results": results, "checks": checks, "skipped": skipped, "stamp": stamp}


CHECK_KEYS = ("pair", "objective", "comparable", "agree", "loss_abs_diff", "grad_max_abs_diff",
              "error")
SLIM_KEYS = ("median_ms", "iqr_ms", "repeats", "capped", "faults_per_call", "compile_s",
             "memory_only", "loss")


def _round(value):
  return float(f"{value:.5g}") if isinstance(value, float) else value


def _slim(row: dict) -> dict:
  """A result row with the timings' summary only (the merged report is a docs summary)."""
  out = {k: row[k] for k in ("label", "batch_size", "error", "pml_error") if k in row}
  if row.get("pml_pair"):
    out["pml_pair"] = {k: row["pml_pair"][k] for k in ("key", "pml", "comparable")}
  if row.get("ratio") is not None:
    out["ratio"] = _round(row["ratio"])
  for side in ("ours", "pml"):
    if row.get(side):
      out[side] = {k: _round(row[side][k]) for k in SLIM_KEYS if k in row[side]}
      temp = (row[side].get("memory") or {}).get("temp_bytes")
      if temp is not None:
        out[side]["memory"] = {"temp_bytes": temp}
  return out


def _ms(timing: dict | None) -> str:
  return "—" if not timing else f"{timing['median_ms']:,.1f}"


def _temp_mib(row: dict | None) -> float | None:
  temp = (((row or {}).get("ours") or {}).get("memory") or {}).get("temp_bytes")
  return None if temp is None else temp / harness.MIB


def _pml_cell(row: dict) -> str:
  if row.get("pml"):
    return _ms(row["pml"]) + (" ᶜ" if row["pml"].get("capped") else "")
  if row.get("pml_error"):
    return "out of memory" if "memory" in row["pml_error"].lower() else "failed"
  return "—"


def table(report: dict) -> str:
  """The docs table of a report of :func:`run` or :func:`merge`: per objective (and PML
  variant), ms per forward + backward of ours (/ PML) at each timed batch size, PML / ours and
  ours / the floor of the same run, the temp memory at the two largest batch sizes, the page
  faults a call and the value check against PML (the PML columns only where PML ran)."""
  runs = report.get("runs") or [report]
  results = [r if "run" in r else {**r, "run": 0} for r in report["results"]]
  has_pml = any(r.get("pml") or r.get("pml_error") for r in results)
  floors = {(r["run"], r["batch_size"]): r["ours"]["median_ms"] for r in results
            if r["label"] == FLOOR_LABEL and r.get("ours")}
  checks = {c["objective"]: c for c in report["checks"]}
  timed = sorted({r["batch_size"] for r in results
                  if r.get("ours") and not r["ours"].get("memory_only")})
  cells: dict[str, dict[int, dict]] = {}
  for r in results:
    if r["label"] != FLOOR_LABEL:
      cells.setdefault(r["label"], {})[r["batch_size"]] = r
  memory_sizes = sorted({b for by_b in cells.values() for b, r in by_b.items()
                         if _temp_mib(r) is not None})[-2:]
  rows = []
  for label, by_b in cells.items():
    pair = next((r["pml_pair"] for r in by_b.values() if r.get("pml_pair")), None)
    row = [f"`{label}`"] + ([pair["pml"] if pair else "—"] if has_pml else [])
    for b in timed:
      r = by_b.get(b)
      if r is None or not r.get("ours") or r["ours"].get("memory_only"):
        row += ["failed" if r is not None and r.get("error") else "—"] + [""] * (
            2 if has_pml else 1)
        continue
      floor = floors.get((r["run"], b))
      ratio = r.get("ratio")
      row += ([f"{_ms(r['ours'])} / {_pml_cell(r)}",
               harness.fmt(ratio, ".1f" if (ratio or 0) < 10 else ",.0f")
               + ("×" if ratio else "")] if has_pml else [_ms(r["ours"])])
      row.append(harness.fmt(None if floor is None else r["ours"]["median_ms"] / floor, ".2f")
                 + ("×" if floor else ""))
    row.append(" / ".join(harness.fmt(_temp_mib(by_b.get(b)), ",.0f") for b in memory_sizes))
    faults = ((by_b.get(timed[-1]) or {}).get("ours") or {}).get("faults_per_call")
    row.append(harness.fmt(faults, ",.0f"))
    if has_pml:
      c = checks.get(label)
      row.append("—" if c is None else "error" if "error" in c else
                 ("agree" if c["agree"] else "**differ**") if c["comparable"]
                 else "not compared")
    rows.append(row)
  head = ["objective"] + (["PML"] if has_pml else [])
  for b in timed:
    head += ([f"B = {b}: ours / PML ms", "PML / ours"] if has_pml else [f"B = {b}: ms"])
    head.append("ours / floor")
  head += [f"temp MB at {' / '.join(str(b) for b in memory_sizes)}",
           f"page faults a call at {timed[-1]}"] + (["loss + gradient vs PML"] if has_pml else [])
  span = lambda v, f: (f"{min(v):{f}}–{max(v):{f}}" if len(v) > 1  # noqa: E731
                       else f"{v[0]:{f}}")
  floor_text = "; ".join(
      f"B = {b}: {span(v, ',.1f')} ms"
      for b in timed for v in [[f for (_, fb), f in sorted(floors.items()) if fb == b]] if v)
  faults = [r["ours"]["faults_per_call"] for r in results
            if r["label"] == FLOOR_LABEL and r["batch_size"] == timed[-1] and r.get("ours")
            and r["ours"].get("faults_per_call") is not None]
  text = (f"The floor (`{FLOOR_LABEL}`, forward + backward of `X Xᵀ`) took {floor_text}"
          + (f" ({span(faults, ',.0f')} page faults a call at {timed[-1]})" if faults else "")
          + f" over {len(runs)} run{'s' if len(runs) != 1 else ''}; each row is divided by "
          "its own run's floor.")
  if any((r.get("pml") or {}).get("capped") for r in results):
    text += (f" ᶜ: PML's timing stopped after {MIN_PML_REPEATS} or more calls at "
             "`--pml_max_seconds`.")
  return harness.markdown_table(head, rows) + "\n\n" + text


# ------------------------------------------------------------------------------------------
# The run.


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
    threads: torch threads; 0 = ``harness.available_cpus()`` (what XLA:CPU uses).
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
  cpus = harness.available_cpus()
  pml_ns, pml_info = pml_lib.import_pml() if pml else (None, "PML disabled (--nopml).")
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
      "machine": platform.machine(), "load_average": {"start": harness.load_average()},
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
  config["load_average"]["end"] = harness.load_average()
  config["total_s"] = time.perf_counter() - start_all
  report = {"script": SCRIPT, "config": config, "results": results,
            "memory_growth": memory_growth(results),
            "goals": goals(results), "checks": checks, "skipped": skipped,
            "stamp": harness.stamp()}
  harness.write_json(report, out)
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
    temp_mb = None if temp is None else temp / harness.MIB
    text += f"temp {harness.fmt(temp_mb, '.1f')} MB (compile only)"
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
  flags.DEFINE_list("merge", [], "Instead of running: merge these reports (one run per "
                    "objective, one commit; paths or glob patterns) into --out, and print "
                    "their table.")
  flags.DEFINE_bool("smoke", False, f"B={SMOKE_BATCH_SIZES[0]}, {SMOKE_REPEATS} repeats.")
  flags.DEFINE_integer("seed", 0, "Inputs and PRNG keys.")
  flags.DEFINE_enum("host_memory", "default", ["default", "keep"],
                    "keep: this process (ours, the floor and PML alike) keeps freed host memory "
                    "(dml_jax/run/host_memory.py, applied before JAX starts); default: glibc's.")
  return flags.FLAGS


def main(argv):
  del argv
  f = FLAGS
  if f.merge:
    try:
      reports = []
      for path in merge_paths(f.merge):
        with open(path) as fh:
          reports.append(json.load(fh))
      merged = merge(reports)
    except ValueError as e:
      raise SystemExit(f"--merge: {e}") from None
    print(table(merged) + "\n")
    harness.write_json(merged, f.out, indent=None)
    return
  smoke = f.smoke
  if f.host_memory == "keep":
    from dml_jax.run import host_memory  # pylint: disable=import-outside-toplevel
    print(host_memory.describe(host_memory.keep_freed_memory()))
  cap = harness.limit_address_space(f.memory_fraction)
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
