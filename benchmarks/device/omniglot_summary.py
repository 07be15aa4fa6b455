"""The Omniglot protocol's summary (``gpu_check.sh omniglot``): per run its final metrics and how
fast it trained, per row the mean ± std over seeds, as JSON.

  python benchmarks/device/omniglot_summary.py --workdir=/tmp/omniglot_resnet50 --seconds=420 \
      --out=omniglot.json

Reads every run of ``<workdir>/<point>/seed_<s>`` (the layout of ``python -m
dml_jax.run.experiments sweep``): its final ``eval_step_<N>.json`` (a run without one did not
finish and is listed as such) and its ``metrics.jsonl`` (the training rows'
``examples_per_sec``: their median is the run's training rate; the first row, which holds the
compilation, is left out when there are others). ``--seconds`` is the wall time of all runs
together (they ran at once on one GPU).
"""

from __future__ import annotations

import argparse
import glob
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


def final_results(run_dir: str) -> tuple[int, dict] | None:
  """``(step, results)`` of the run's final evaluation, or ``None`` if it did not finish."""
  config = json.load(open(os.path.join(run_dir, "config.json")))
  run = json.load(open(os.path.join(run_dir, "run.json"))) if os.path.exists(
      os.path.join(run_dir, "run.json")) else {}
  last = run.get("num_train_steps") or config.get("num_train_steps")
  path = os.path.join(run_dir, f"eval_step_{last}.json")
  if not last or not os.path.exists(path):
    return None
  return int(last), json.load(open(path))["results"]


def summarize(workdir: str, seconds: float) -> dict:
  runs, rows = [], {}
  for run_dir in sorted(glob.glob(os.path.join(workdir, "*", "seed_*"))):
    name = os.path.basename(os.path.dirname(run_dir))
    seed = int(os.path.basename(run_dir).removeprefix("seed_"))
    final = final_results(run_dir)
    entry = {"name": name, "seed": seed, "finished": final is not None,
             **training_rate(run_dir)}
    if final is not None:
      entry["final_step"], results = final
      entry["metrics"] = {f"{p}/{m}": results.get(p, {}).get(m) for p, m in METRICS}
      rows.setdefault(name, []).append(entry["metrics"])
    runs.append(entry)
  table = {}
  for name, per_seed in rows.items():
    table[name] = {}
    for key in per_seed[0]:
      values = [100 * m[key] for m in per_seed if m[key] is not None]
      if values:
        table[name][key] = {"mean": statistics.mean(values),
                            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                            "n": len(values)}
  return {"runs": runs, "rows": table, "wall_seconds_all_runs": seconds}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--seconds", type=float, default=0.0)
  p.add_argument("--out", required=True)
  p.add_argument("--md", default="", help="also a markdown table here")
  args = p.parse_args(argv)
  result = summarize(args.workdir, args.seconds)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  table = markdown(result)
  print(table)
  if args.md:
    with open(args.md, "w") as f:
      f.write(table + "\n")
  return 0


def markdown(result: dict) -> str:
  """Mean ± std (percent) per row, with the number of finished seeds."""
  keys = [f"{p}/{m}" for p, m in METRICS]
  lines = ["| row | seeds | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
  for name, row in result["rows"].items():
    n = max(v["n"] for v in row.values())
    cells = [f"{row[k]['mean']:.1f} ± {row[k]['std']:.1f}" if k in row else "—" for k in keys]
    lines.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
  unfinished = [f"{r['name']} seed {r['seed']}" for r in result["runs"] if not r["finished"]]
  if unfinished:
    lines.append(f"\nnot finished: {', '.join(unfinished)}")
  return "\n".join(lines)


if __name__ == "__main__":
  raise SystemExit(main())
