r"""What keeping freed host memory (``dml_jax/run/host_memory.py``) does to a model's CPU step:
ms per step, minor page faults per step and system time per step, with glibc's defaults and
with the settings, each in a fresh process (the settings are process-wide), the two taking
turns round by round.

  python benchmarks/speed/host_memory.py                                   # docs/performance.md
  python benchmarks/speed/host_memory.py --cases=small_cnn:28:128 --rounds=3
  python benchmarks/speed/host_memory.py --smoke                           # seconds

A case is ``arch:image_size:batch`` of ``benchmarks/speed/backbones.py`` (its jitted forward +
backward of ``mean(E E^T)``, ``conv_impl='auto'``). Each process builds the model, runs
``--warmup`` untimed steps, then ``--steps`` steps, timing each and reading ``getrusage``
around them. Prints a markdown table (medians over rounds), writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CASES = "small_cnn:28:128,resnet18:224:8,resnet50:224:8"
SMOKE_CASES = "small_cnn:8:4"
MODES = ("default", "keep")


def measure(case: str, mode: str, *, warmup: int, steps: int) -> dict:
  """In this process: apply ``mode``, build ``case``, time ``steps`` steps after ``warmup``."""
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  from dml_jax.run import host_memory  # pylint: disable=import-outside-toplevel
  kept = host_memory.keep_freed_memory() if mode == "keep" else None
  import resource  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  from benchmarks import backbone_step  # pylint: disable=import-outside-toplevel
  model = backbone_step.JaxModel(backbone_step.parse_case(case), dtype="float32",
                                 conv_impl="auto")
  model.run(warmup)
  ms = []
  before = resource.getrusage(resource.RUSAGE_SELF)
  for _ in range(steps):
    start = time.perf_counter()
    model.run(1)
    ms.append((time.perf_counter() - start) * 1e3)
  after = resource.getrusage(resource.RUSAGE_SELF)
  return {"case": case, "mode": mode, "kept": kept, "ms_per_step": ms,
          "faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
          "system_ms_per_step": (after.ru_stime - before.ru_stime) * 1e3 / steps}


def run_process(case: str, mode: str, *, warmup: int, steps: int) -> dict:
  """:func:`measure` in a fresh process (``--worker``)."""
  out = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--worker", f"--cases={case}",
       f"--modes={mode}", f"--warmup={warmup}", f"--steps={steps}"],
      check=True, capture_output=True, text=True, cwd=REPO)
  return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict]) -> list[dict]:
  """One row per (case, mode): medians over the rounds' per-step medians."""
  rows = {}
  for r in runs:
    rows.setdefault((r["case"], r["mode"]), []).append(r)
  return [{"case": case, "mode": mode, "rounds": len(rs),
           "ms_per_step": statistics.median(statistics.median(r["ms_per_step"]) for r in rs),
           "faults_per_step": statistics.median(r["faults_per_step"] for r in rs),
           "system_ms_per_step": statistics.median(r["system_ms_per_step"] for r in rs)}
          for (case, mode), rs in rows.items()]


def table(report: dict) -> str:
  """The docs table of a written report (:func:`rows_table` of its rows)."""
  return rows_table(report["rows"])


def rows_table(rows: list[dict]) -> str:
  from benchmarks import harness  # pylint: disable=import-outside-toplevel
  return harness.markdown_table(
      ["case", "host memory", "ms/step", "minor faults/step", "system ms/step"],
      [[r["case"], r["mode"], f"{r['ms_per_step']:.1f}", f"{r['faults_per_step']:,.0f}",
        f"{r['system_ms_per_step']:.1f}"] for r in rows])


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated arch:size:batch")
  parser.add_argument("--modes", default=",".join(MODES), help="default and/or keep")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--warmup", type=int, default=3, help="untimed steps per process")
  parser.add_argument("--steps", type=int, default=5, help="timed steps per process")
  parser.add_argument("--smoke", action="store_true", help=f"--cases={SMOKE_CASES}, 1 round")
  parser.add_argument("--out", default="")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  modes = [m for m in args.modes.split(",") if m]
  if set(modes) - set(MODES):
    raise ValueError(f"unknown --modes {sorted(set(modes) - set(MODES))}; allowed: "
                     f"{', '.join(MODES)}.")
  if args.worker:
    print(json.dumps(measure(args.cases, modes[0], warmup=args.warmup, steps=args.steps)))
    return 0
  if args.smoke:
    args.cases, args.rounds, args.warmup, args.steps = SMOKE_CASES, 1, 1, 2
  runs = []
  for r in range(args.rounds):
    for case in [c for c in args.cases.split(",") if c]:
      for mode in modes:
        runs.append(run_process(case, mode, warmup=args.warmup, steps=args.steps))
    print(f"round {r + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}",
          flush=True)
  rows = summarize(runs)
  print(rows_table(rows))
  if args.out:
    from benchmarks import harness  # pylint: disable=import-outside-toplevel
    harness.write_json({"script": "benchmarks/speed/host_memory.py", "rows": rows,
                        "runs": runs, "cpu_count": os.cpu_count(), "stamp": harness.stamp()},
                       args.out, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
