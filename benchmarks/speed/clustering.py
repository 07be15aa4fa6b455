"""k-means for NMI / NMI+: dml_jax's (``evaluation.kmeans``, JAX on the default device) beside
scikit-learn's ``KMeans``, on the same embeddings, in one run.

  python benchmarks/speed/clustering.py --out=runs/clustering.json         # Omniglot + SOP scale
  python benchmarks/speed/clustering.py --busy=1                           # with a CPU hog beside
  python benchmarks/speed/clustering.py --smoke                            # seconds

Cases (``--cases``):

* ``omniglot``: the clusterings of ``configs/omniglot_cpu.py``'s four protocols, on embeddings
  shaped like a trained 128-D Omniglot model's (unit vectors: an alphabet centre plus a
  character offset plus noise): the 13,180 test drawings into 659 letters, 20 languages and
  600 (NMI+, 30 x 20); the 19,280 training drawings into 30 languages, 900 (NMI+) and 964
  characters. One restart each (the config's ``eval.kmeans_n_init``). As in the evaluation,
  dml_jax's clusterings of one split share their k-means++ seeding (``kmeans(seedings=...)``:
  the 600 clusters take the first 600 centres of the 659 clusters' seeding, the 964 continue
  the 900's; the same clusterings as seeded apart); scikit-learn seeds each anew.
* ``sop``: Stanford Online Products' test set, 60,502 x 512 unit vectors in 11,316 clusters
  (the classes, ~5 images each, unstructured: an early model), one restart. scikit-learn only
  with ``--sklearn_sop`` (about 15 minutes here).

Each clustering is timed once per side after one untimed call of the same shape with another
seed (JAX's compilation, which a second evaluation of a run finds in the compilation cache;
scikit-learn's thread pools), with ``--busy`` processes spinning on the CPU beside it when asked (what
a shared machine does to each side). The table gives seconds, the ratio, and each side's
inertia and NMI with the classes. Writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from sklearn import cluster  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks.inputs import omniglot_like  # noqa: E402
from dml_jax.evaluation import cluster_scores  # noqa: E402
from dml_jax.evaluation import kmeans  # noqa: E402


def cases(names: list[str], smoke: bool) -> list[dict]:
  out = []
  if "omniglot" in names:
    scale = 10 if smoke else 1
    test = omniglot_like(0, 20, 659 // scale)
    train = omniglot_like(1, 30, 964 // scale)
    for split, (x, letter, alphabet) in (("test", test), ("train", train)):
      groups = ([("letters", letter, letter.max() + 1), ("languages", alphabet, 20),
                 ("languages NMI+", alphabet, 600 // scale)] if split == "test" else
                [("languages", alphabet, 30), ("languages NMI+", alphabet, 900 // scale),
                 ("characters", letter, letter.max() + 1)])
      for what, labels, k in groups:
        out.append({"case": f"omniglot {split} {what}", "x": x, "labels": labels, "k": int(k),
                    "split": split})
  if "sop" in names:
    n, d, k = (6050, 64, 1131) if smoke else (60502, 512, 11316)
    x = np.random.default_rng(2).normal(size=(n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    out.append({"case": "SOP test, unstructured", "x": x, "labels": np.arange(n) % k, "k": k,
                "split": "sop"})
  return out


def run_jax(x, k, seed, seedings):
  r = kmeans.kmeans(x, n_clusters=k, seed=seed, n_init=1, seedings=seedings)
  return r.assignment, r.inertia


def run_sklearn(x, k, seed, seedings):
  del seedings   # scikit-learn seeds every clustering anew
  km = cluster.KMeans(n_clusters=k, n_init=1, random_state=seed).fit(x)
  return km.labels_, float(km.inertia_)


def spin(stop):   # a CPU hog beside the measurement
  a = np.random.default_rng(0).normal(size=(400, 400))
  while not stop.is_set():
    a = np.tanh(a @ a)


def timed(fn, x, k, seed, seedings) -> dict:
  t0 = time.perf_counter()
  assignment, inertia = fn(x, k, seed, seedings)
  return {"seconds": time.perf_counter() - t0, "inertia": inertia, "assignment": assignment}


def table_row(r: dict) -> list[str]:
  """One table row's cells: seconds of each side, the speed-up, the inertia ratio, NMI."""
  def cell(side: str, key: str, spec: str) -> str:
    return format(r[side][key], spec) if side in r else "—"

  return [r["case"], f"{r['n']:,} x {r['d']}", f"{r['k']:,}", cell("dml_jax", "seconds", ".2f"),
          cell("sklearn", "seconds", ".2f"),
          f"{r['speedup']:.1f}x" if "speedup" in r else "—",
          harness.fmt(r.get("inertia_ratio"), ".4f"),
          f"{cell('dml_jax', 'nmi', '.3f')} / {cell('sklearn', 'nmi', '.3f')}"]


def table(report: dict) -> str:
  """The markdown table of a report (``main``'s JSON) and the Omniglot protocols' total."""
  text = harness.markdown_table(
      ["case", "N x D", "k", "dml_jax (s)", "scikit-learn (s)", "speed-up", "inertia ratio",
       "NMI dml_jax / sklearn"], [table_row(r) for r in report["rows"]])
  total = report.get("omniglot_total_seconds", {})
  if len(total) == 2 and all(total.values()):
    text += (f"\n\nOmniglot protocols together: dml_jax {total['dml_jax']:.1f} s, "
             f"scikit-learn {total['sklearn']:.1f} s "
             f"({total['sklearn'] / total['dml_jax']:.1f}x); {report['busy']} CPU-hog "
             "processes beside.")
  return text


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--cases", default="omniglot,sop")
  p.add_argument("--sides", default="dml_jax,sklearn")
  p.add_argument("--sklearn_sop", action="store_true", help="also scikit-learn on the SOP case")
  p.add_argument("--busy", type=int, default=0, help="CPU-hog processes beside the timing")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--smoke", action="store_true", help="a tenth of the sizes")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  sides = {"dml_jax": run_jax, "sklearn": run_sklearn}
  chosen = [s for s in args.sides.split(",") if s]
  bad = sorted(set(chosen) - set(sides)) + sorted(set(args.cases.split(",")) - {"omniglot", "sop"})
  if bad:
    raise SystemExit(f"unknown sides/cases {bad}; sides: dml_jax, sklearn; cases: omniglot, sop")
  spawn = multiprocessing.get_context("spawn")   # not forked from a process running JAX
  stop = spawn.Event()
  hogs = [spawn.Process(target=spin, args=(stop,), daemon=True) for _ in range(args.busy)]
  rows = []
  seedings: dict[str, dict] = {}   # per split, as evaluate_splits keeps them
  try:
    for case in cases(args.cases.split(","), args.smoke):
      row = {"case": case["case"], "n": int(case["x"].shape[0]), "d": int(case["x"].shape[1]),
             "k": case["k"]}
      for side in chosen:
        if side == "sklearn" and case["case"].startswith("SOP") and not args.sklearn_sop:
          continue
        shared = seedings.setdefault(case["split"], {})
        sides[side](case["x"], case["k"], args.seed + 1, shared)   # untimed: compilation
        for h in hogs:
          if not h.is_alive():
            h.start()
        r = timed(sides[side], case["x"], case["k"], args.seed, shared)
        row[side] = {"seconds": r["seconds"], "inertia": r["inertia"],
                     "nmi": cluster_scores.nmi(case["labels"], r["assignment"])}
      if "dml_jax" in row and "sklearn" in row:
        row["speedup"] = row["sklearn"]["seconds"] / row["dml_jax"]["seconds"]
        row["inertia_ratio"] = row["dml_jax"]["inertia"] / row["sklearn"]["inertia"]
      rows.append(row)
      print(json.dumps(row), flush=True)
  finally:
    stop.set()
    for h in hogs:
      if h.is_alive():
        h.join(timeout=5)
  total = {s: sum(r[s]["seconds"] for r in rows if s in r and r["case"].startswith("omniglot"))
           for s in chosen}
  print(f"\n{jax.default_backend()} ({jax.devices()[0].device_kind}), {os.cpu_count()} CPUs, "
        f"{args.busy} busy processes beside\n")
  report = {"rows": rows, "busy": args.busy, "omniglot_total_seconds": total}
  print(table(report))
  if args.out:
    stamp = harness.stamp([__file__, *(sys.argv[1:] if argv is None else argv)])
    harness.write_json({"script": "benchmarks/speed/clustering.py",
                        "rows": rows, "busy": args.busy, "backend": jax.default_backend(),
                        "commit": stamp["commit"], "date": stamp["date"],
                        "command": stamp["command"], "device": jax.devices()[0].device_kind,
                        "cpus": os.cpu_count(), "machine": platform.machine(),
                        "omniglot_total_seconds": total, "stamp": stamp}, args.out, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
