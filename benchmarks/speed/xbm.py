r"""Cross-batch memory (XBM): step time and memory against the memory size M, beside PML's.

  python benchmarks/speed/xbm.py                        # B = 128, M = 0, 4096, 16384, D = 512
  python benchmarks/speed/xbm.py --smoke                # B = 16, M = 0, 64 (seconds)

For each objective and memory size ``M`` (``memory.size``), one training step's objective work
at batch ``B``, with a full memory:

* ours: ``jax.jit`` of the loss and its gradient w.r.t. the batch embeddings with
  ``references = memory.references(mem, x, y, reference_gradient=False)`` (``S`` is
  ``[B, B + M]``), followed by ``memory.enqueue`` (the new memory is an output, as in the
  train step). ``M = 0`` is the plain batch objective (no memory). Time as in
  ``benchmarks/speed/objectives.py`` (median of ``repeats`` calls after compilation) and XLA's
  ``memory_analysis()`` temp bytes;
* PML (when torch and pytorch-metric-learning import): ``CrossBatchMemory(loss, D,
  memory_size = M + B)`` (PML's memory holds the current batch too, which is what
  ``reference_gradient=False`` equals, tested in ``tests/objectives/test_pml_reference.py``),
  filled with ``(M + B) / B`` earlier batches by its ``add_to_memory`` (ours by enqueueing
  the same batches), then ``loss(x, y)`` + ``backward()`` timed the same way; ``M = 0`` is
  the bare PML loss. The first call's loss is compared with ours (``loss_agrees``). PML
  cases stop after ``--pml_max_seconds`` of timed calls; the address space is capped as in
  ``benchmarks/speed/objectives.py`` (PML's NTXent builds ``[P, N]`` pair matrices that outgrow
  the machine at M = 16384), so such a case fails with an error in the table.

The objectives and hyper-parameters are those whose equality with PML's ``CrossBatchMemory`` is
tested. Embeddings are random unit vectors, labels ``B / per_class`` classes per batch drawn
from ``num_classes``. The table is printed and
everything written as JSON to ``--out``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
from benchmarks import harness
from benchmarks import pml as pml_lib
from dml_jax import memory as memory_lib
from dml_jax import objectives
# pylint: enable=g-import-not-at-top,wrong-import-position

DEFAULT_MEMORY_SIZES = (0, 4096, 16384)
SMOKE_MEMORY_SIZES = (0, 64)

# (our registry name, our hyper-parameters, PML loss builder): the cases of
# tests/golden/make_pml_reference.py's MEMORY_CASES.
CASES: tuple[tuple[str, dict[str, Any], Callable], ...] = (
    ("contrastive", {"pos_margin": 1.0, "neg_margin": 0.5, "reduction": "balanced"},
     lambda pml: pml.losses.ContrastiveLoss(pos_margin=1.0, neg_margin=0.5,
                                            distance=pml.distances.CosineSimilarity(),
                                            reducer=pml.reducers.MeanReducer())),
    ("multi_similarity", {"alpha": 2.0, "beta": 50.0, "base": 0.5, "positive": "all",
                          "negative": "all"},
     lambda pml: pml.losses.MultiSimilarityLoss(alpha=2.0, beta=50.0, base=0.5)),
    ("supcon", {"temperature": 0.1}, lambda pml: pml.losses.SupConLoss(temperature=0.1)),
    ("ntxent", {"temperature": 0.07}, lambda pml: pml.losses.NTXentLoss(temperature=0.07)),
)


def make_batches(count: int, batch_size: int, dim: int, *, per_class: int, num_classes: int,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
  """``count`` batches of unit embeddings ``[count, B, D]`` and labels ``[count, B]``
  (``B / per_class`` distinct classes of ``num_classes`` per batch, ``per_class`` each)."""
  if batch_size % per_class or batch_size // per_class > num_classes:
    raise ValueError(f"batch_size={batch_size} must be a multiple of per_class={per_class} "
                     f"with at most num_classes={num_classes} classes.")
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((count, batch_size, dim)).astype(np.float32)
  x /= np.linalg.norm(x, axis=-1, keepdims=True)
  y = np.stack([np.repeat(rng.choice(num_classes, batch_size // per_class, replace=False),
                          per_class) for _ in range(count)]).astype(np.int32)
  return x, y


def filled_memory(xs: np.ndarray, ys: np.ndarray, size: int) -> dict:
  """A memory of ``size`` rows after enqueueing the batches ``xs [T, B, D]``, ``ys [T, B]``."""
  mem = memory_lib.init(size, xs.shape[2])
  for x, y in zip(xs, ys) if size else ():
    mem = memory_lib.enqueue(mem, x, y)
  return mem


def bench_ours(name: str, hp: dict, xs: np.ndarray, ys: np.ndarray, size: int, *,
               num_classes: int, repeats: int, warmup: int, seed: int) -> dict:
  """Time and memory of one step's objective work on the last batch of ``xs``, with a memory
  of ``size`` rows filled by the others."""
  x, y = xs[-1], ys[-1]
  obj = objectives.make(name, **hp)
  params = obj.init(jax.random.key(seed), num_classes=num_classes, dim=x.shape[1])

  def loss(e, y, mem, key):
    refs = memory_lib.references(mem, e, y, reference_gradient=False) if size else None
    return obj.apply(params, e, y, rng=key, references=refs)[0]

  def step(e, y, mem, key):
    value, grad = jax.value_and_grad(loss)(e, y, mem, key)
    return value, grad, (memory_lib.enqueue(mem, e, y) if size else mem)

  args = (jax.device_put(x), jax.device_put(y), filled_memory(xs[:-1], ys[:-1], size),
          jax.random.key(seed))
  return harness.compile_and_time(step, args, repeats=repeats, warmup=warmup)


def bench_pml(pml, make: Callable, xs: np.ndarray, ys: np.ndarray, size: int, *,
              repeats: int, warmup: int, max_seconds: float = 0.0) -> dict:
  """Time of PML's ``CrossBatchMemory`` (or the bare loss at ``size = 0``) forward + backward
  on the last batch of ``xs``, after the others filled its memory; ``loss`` is the first
  call's (later calls see the batch in the memory again)."""
  torch = pml.torch
  b, d = xs.shape[1], xs.shape[2]
  loss_fn = make(pml) if size == 0 else pml.losses.CrossBatchMemory(
      make(pml), d, memory_size=size + b)
  for t in range(xs.shape[0] - 1) if size else ():   # fill the memory (no loss computed)
    loss_fn.add_to_memory(torch.from_numpy(xs[t]), torch.from_numpy(ys[t].astype(np.int64)), b)
  xt = torch.from_numpy(xs[-1].copy()).requires_grad_(True)
  yt = torch.from_numpy(ys[-1].astype(np.int64))

  def call():
    xt.grad = None
    value = loss_fn(xt, yt)
    value.backward()
    return value

  first = call().item()
  timing, capped, _ = harness.time_calls(call, repeats=repeats, warmup=max(warmup - 1, 0),
                                         max_seconds=max_seconds, min_repeats=pml_lib.MIN_REPEATS)
  return {**timing, "capped": capped, "loss": first}


def run(*, batch_size: int = 128, memory_sizes: Sequence[int] = DEFAULT_MEMORY_SIZES,
        dim: int = 512, per_class: int = 8, num_classes: int = 1000, repeats: int = 10,
        warmup: int = 1, pml: bool = True, pml_max_seconds: float = 15.0, seed: int = 0,
        out: str = "",
        log: Callable[[str], None] = print) -> dict:
  """Runs every case at every memory size; returns the report (written as JSON to ``out``).

  Returns:
    ``{'config', 'results'}``; one result per (objective, ``M``): ``objective``, ``hparams``,
    ``memory_size``, ``ours`` (timing stats, ``compile_s``, ``memory``, ``loss``), ``pml``
    (timing stats and ``loss``, or None; ``pml_error`` says why not), ``ratio`` (PML median
    / ours median) and, with PML, ``loss_agrees`` (the two losses on the same batch and
    memory agree).
  """
  memory_sizes = tuple(int(m) for m in memory_sizes)
  for m in memory_sizes:
    memory_lib.check(m, 0, batch_size=batch_size)
  pml_ns, pml_info = pml_lib.import_pml() if pml else (None, "PML disabled (--nopml).")
  cpus = harness.available_cpus()
  if pml_ns is not None:
    pml_ns.torch.set_num_threads(cpus)
  config = {"batch_size": batch_size, "memory_sizes": list(memory_sizes), "dim": dim,
            "per_class": per_class, "num_classes": num_classes, "repeats": repeats,
            "warmup": warmup, "seed": seed, "jax": jax.__version__, "cpus": cpus,
            "devices": [str(d) for d in jax.devices()], "pml": pml_info,
            "load_average": {"start": harness.load_average()}}
  log(f"JAX {jax.__version__}, {cpus} CPUs; {pml_info}")
  results = []
  start_all = time.perf_counter()
  for name, hp, make in CASES:
    for m in memory_sizes:
      fills = -(-(m + batch_size) // batch_size)
      xs, ys = make_batches(fills + 1, batch_size, dim, per_class=per_class,
                            num_classes=num_classes, seed=seed)
      row = {"objective": name, "hparams": hp, "memory_size": m, "pml": None, "ratio": None,
             "ours": bench_ours(name, hp, xs, ys, m, num_classes=num_classes,
                                repeats=repeats, warmup=warmup, seed=seed)}
      if pml_ns is not None:
        try:
          row["pml"] = bench_pml(pml_ns, make, xs, ys, m, repeats=repeats, warmup=warmup,
                                 max_seconds=pml_max_seconds)
        except Exception as e:   # pylint: disable=broad-except  (e.g. out of memory)
          row["pml_error"] = f"{type(e).__name__}: {str(e)[:200]}"
      if row["pml"]:
        row["ratio"] = row["pml"]["median_ms"] / row["ours"]["median_ms"]
        row["loss_agrees"] = bool(np.isclose(row["ours"]["loss"], row["pml"]["loss"],
                                             rtol=pml_lib.LOSS_RTOL, atol=pml_lib.LOSS_ATOL))
      results.append(row)
      log(f"[{time.perf_counter() - start_all:5.0f} s] {name} M={m}: "
          f"{row['ours']['median_ms']:.1f} ms" + (
              f", PML {row['pml']['median_ms']:.1f} ms, x{row['ratio']:.2f}"
              if row["pml"] else "") + (f", PML failed: {row['pml_error']}"
                                        if "pml_error" in row else ""))
  config["load_average"]["end"] = harness.load_average()
  config["total_s"] = time.perf_counter() - start_all
  report = {"script": "benchmarks/speed/xbm.py", "config": config, "results": results,
            "stamp": harness.stamp()}
  harness.write_json(report, out)
  return report


def _pml_failure(error: str) -> str:
  if "alloc" in error.lower() or "memory" in error.lower():
    return "PML out of memory"
  return f"PML failed: {error[:80]}"


def markdown_table(report: dict) -> str:
  """One row per (objective, M): our time and temp memory, PML's time, the ratio."""
  b = report["config"]["batch_size"]
  rows = []
  for r in report["results"]:
    temp = (r["ours"].get("memory") or {}).get("temp_bytes")
    pml = r["pml"] or {}
    rows.append([
        r["objective"], r["memory_size"], f"{b} × {b + r['memory_size']}",
        f"{r['ours']['median_ms']:.1f}",
        harness.fmt(None if temp is None else temp / harness.MIB, ".1f"),
        harness.fmt(pml.get("median_ms"), ".1f"), harness.fmt(r["ratio"], ".2f"),
        {True: "yes", False: "NO", None: "—"}[r.get("loss_agrees")],
        (_pml_failure(r["pml_error"]) if "pml_error" in r else
         f"PML {pml['repeats']} runs (capped)" if pml.get("capped") else "")])
  return harness.markdown_table(["objective", "M", "S", "ours ms", "temp MB", "PML ms",
                                 "PML/ours", "same loss", "notes"], rows)


def table(report: dict) -> str:
  """The docs table of a written report (:func:`markdown_table`)."""
  return markdown_table(report)


def define_flags():
  """The command-line flags (defined here, not at import, so tests can import the module)."""
  from absl import flags  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  flags.DEFINE_integer("batch_size", 128, "Batch size B.")
  flags.DEFINE_list("memory_sizes", [str(m) for m in DEFAULT_MEMORY_SIZES], "Memory sizes M.")
  flags.DEFINE_integer("dim", 512, "Embedding dimension D.")
  flags.DEFINE_integer("repeats", 10, "Timed calls per case.")
  flags.DEFINE_bool("pml", True, "Time pytorch-metric-learning's CrossBatchMemory too.")
  flags.DEFINE_float("pml_max_seconds", 15.0, "Cap on one PML case's timed calls (0 = none).")
  flags.DEFINE_float("memory_fraction", 0.75,
                     "Address-space cap, as in benchmarks/speed/objectives.py.")
  flags.DEFINE_bool("smoke", False, f"B=16, M={SMOKE_MEMORY_SIZES}, 2 repeats.")
  flags.DEFINE_string("out", "runs/bench_xbm.json", "JSON output ('' = none).")
  return flags.FLAGS


def main(argv):
  del argv
  f = FLAGS
  harness.limit_address_space(f.memory_fraction)
  report = run(batch_size=16 if f.smoke else f.batch_size,
               memory_sizes=SMOKE_MEMORY_SIZES if f.smoke else [int(m) for m in f.memory_sizes],
               dim=f.dim, repeats=2 if f.smoke else f.repeats, pml=f.pml,
               pml_max_seconds=f.pml_max_seconds, out=f.out)
  print()
  print(markdown_table(report))
  la = report["config"]["load_average"]
  print(f"\n{report['config']['total_s']:.0f} s; load average (1 min) {la['start'][0]:.2f} at "
        f"start, {la['end'][0]:.2f} at end" + (f"; results written to {f.out}" if f.out else ""))


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  FLAGS = define_flags()
  app.run(main)
