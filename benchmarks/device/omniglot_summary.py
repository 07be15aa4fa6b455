"""The Omniglot protocol's summary (``gpu_check.sh omniglot``): per run its final metrics and how
fast it trained, per row the mean ± std over seeds, as JSON.

  python benchmarks/device/omniglot_summary.py --workdir=/tmp/omniglot_resnet50 --seconds=420 \
      --out=omniglot.json

Reads ``<workdir>/sweep.json`` (``python -m dml_jax.experiments sweep``) and each run's
``metrics.jsonl`` (the training rows' ``examples_per_sec``: their median is the run's training
rate; the first row, which holds the compilation, is left out when there are others).
``--seconds`` is the wall time of all runs together (they ran at once on one GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

METRICS = (("test", "recall@1"), ("test", "nmi"), ("test:alphabet", "recall@1"),
           ("test:alphabet", "nmi+"))


def training_rate(run_dir: str) -> dict:
  """``{'steps', 'images_per_s'}`` of a run from its ``metrics.jsonl`` training rows."""
  rows = []
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if "examples_per_sec" in row:
        rows.append(row)
  rates = [r["examples_per_sec"] for r in rows[1:] or rows]
  return {"steps": max((r.get("step", 0) for r in rows), default=0),
          "images_per_s": statistics.median(rates) if rates else None}


def summarize(workdir: str, seconds: float) -> dict:
  sweep = json.load(open(os.path.join(workdir, "sweep.json")))
  runs, rows = [], {}
  for run in sweep["runs"]:
    metrics = {f"{p}/{m}": run["results"].get(p, {}).get(m) for p, m in METRICS}
    runs.append({"name": run["name"], "seed": run["seed"], "metrics": metrics,
                 **training_rate(run["workdir"])})
    rows.setdefault(run["name"], []).append(metrics)
  table = {}
  for name, per_seed in rows.items():
    table[name] = {}
    for key in per_seed[0]:
      values = [100 * m[key] for m in per_seed if m[key] is not None]
      if values:
        table[name][key] = {"mean": statistics.mean(values),
                            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                            "n": len(values)}
  return {"runs": runs, "rows": table, "wall_seconds_all_runs": seconds,
          "overrides": sweep.get("overrides", {})}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--seconds", type=float, default=0.0)
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)
  result = summarize(args.workdir, args.seconds)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  for name, row in result["rows"].items():
    print(name, "  ".join(f"{k} {v['mean']:.1f} ± {v['std']:.1f}" for k, v in row.items()))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
