"""Scoring a clustering against the labels: dml_jax's NMI, AMI and pairwise F1
(``evaluation.nmi``, ``evaluation.ami``, ``evaluation.pairwise_f1``) beside scikit-learn's
``normalized_mutual_info_score``, ``adjusted_mutual_info_score`` and the F1 of its
``pair_confusion_matrix``, on the same labelings, in one run.

  python benchmarks/speed/clustering_scores.py --out=runs/clustering_scores.json
  python benchmarks/speed/clustering_scores.py --smoke                    # seconds

Cases (``--cases``): the test sets of CUB-200-2011 (5,924 images, 100 classes), Cars196
(8,131, 98), Omniglot's evaluation alphabets by letter (13,180, 659) and Stanford Online
Products (60,502, 11,316), each with a clustering into as many clusters as classes that keeps
an item's class with probability ``--agreement`` (default 0.6) and otherwise puts it in a
random cluster (what a k-means of a half-trained model's embeddings looks like to the
scores). The scores take the two label arrays only, so the embeddings do not matter here.

Each score is timed after one untimed call on a small labeling (imports), ``--repeats`` times
up to ``--max_seconds`` per side and score (the median is reported). The table gives
milliseconds, the speed-up, the largest difference between the two sides' values, and the NMI
that a random clustering with the case's cluster sizes scores on average
(``cluster_scores.chance_nmi``). Writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
from sklearn import metrics as sk_metrics  # noqa: E402

from benchmarks import harness  # noqa: E402
from dml_jax import evaluation  # noqa: E402
from dml_jax.evaluation import cluster_scores  # noqa: E402

# (name, test images, classes) of each benchmark's test split
SHAPES = {"cub": ("CUB-200-2011 test", 5924, 100), "cars": ("Cars196 test", 8131, 98),
          "omniglot": ("Omniglot evaluation letters", 13180, 659),
          "sop": ("SOP test", 60502, 11316)}
SCORES = ("nmi", "ami", "f1")


def sklearn_pairwise_f1(labels, assignment) -> float:
  """The pairwise F1 from scikit-learn's pair confusion matrix (ordered pairs, so each
  unordered pair twice; the ratio is the same)."""
  (_, fp), (fn, tp) = sk_metrics.cluster.pair_confusion_matrix(labels, assignment)
  return float(2 * tp / (2 * tp + fp + fn)) if tp + fp + fn else 1.0


SIDES = {
    "dml_jax": {"nmi": evaluation.nmi, "ami": evaluation.ami, "f1": evaluation.pairwise_f1},
    "sklearn": {"nmi": sk_metrics.normalized_mutual_info_score,
                "ami": sk_metrics.adjusted_mutual_info_score, "f1": sklearn_pairwise_f1},
}


def labeling(n: int, classes: int, agreement: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """``(labels [n], assignment [n])``: classes of near-equal size (``i mod classes``) and a
  clustering into ``classes`` clusters that keeps each item's class with probability
  ``agreement``, else draws a cluster uniformly."""
  rng = np.random.default_rng(seed)
  labels = np.arange(n) % classes
  assignment = np.where(rng.random(n) < agreement, labels, rng.integers(0, classes, size=n))
  return labels, assignment


def cases(names: list[str], smoke: bool) -> list[dict]:
  scale = 10 if smoke else 1
  return [{"case": SHAPES[name][0], "n": SHAPES[name][1] // scale,
           "classes": max(2, SHAPES[name][2] // scale)} for name in names]


def _ms(value: float | None) -> str:
  """Milliseconds to three digits (whole ones from 100 on)."""
  return harness.fmt(value, ",.0f" if value is not None and value >= 100 else ".3g")


def table_row(r: dict) -> list[str]:
  """One row's cells: the case, N, classes, then per score each side's milliseconds and the
  speed-up, and the largest difference of the values."""
  cells = [r["case"], f"{r['n']:,}", f"{r['classes']:,}"]
  for score in SCORES:
    sides = [r.get(side, {}).get(score) for side in ("dml_jax", "sklearn")]
    ours, theirs = (1e3 * s["seconds"] if s else None for s in sides)
    cells.append(f"{_ms(ours)} / {_ms(theirs)}"
                 + (f" ({theirs / ours:,.0f}x)" if ours and theirs else ""))
  cells.append(harness.fmt(r.get("max_difference"), ".1e"))
  cells.append(harness.fmt(r.get("chance_nmi"), ".3f"))
  return cells


def table(report: dict) -> str:
  return harness.markdown_table(
      ["case", "N", "classes", "NMI ms (dml_jax / sklearn)", "AMI ms", "F1 ms",
       "largest difference", "NMI of chance"], [table_row(r) for r in report["rows"]])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--cases", default="cub,cars,omniglot,sop")
  p.add_argument("--sides", default="dml_jax,sklearn")
  p.add_argument("--agreement", type=float, default=0.6)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--max_seconds", type=float, default=20.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--smoke", action="store_true", help="a tenth of the sizes")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  chosen = [s for s in args.sides.split(",") if s]
  names = [c for c in args.cases.split(",") if c]
  bad = sorted(set(chosen) - set(SIDES)) + sorted(set(names) - set(SHAPES))
  if bad:
    raise SystemExit(f"unknown sides/cases {bad}; sides: {', '.join(SIDES)}; cases: "
                     f"{', '.join(SHAPES)}")
  if not 0 <= args.agreement <= 1:
    raise SystemExit(f"--agreement={args.agreement}: use a probability in [0, 1].")
  small = labeling(200, 10, args.agreement, args.seed)
  for side in chosen:   # untimed: the first call imports (SciPy, scikit-learn's parts)
    for fn in SIDES[side].values():
      fn(*small)
  rows = []
  for case in cases(names, args.smoke):
    labels, assignment = labeling(case["n"], case["classes"], args.agreement, args.seed)
    row = dict(case, chance_nmi=cluster_scores.chance_nmi(labels, assignment))
    values = {}
    for side in chosen:
      row[side] = {}
      for score, fn in SIDES[side].items():
        stats, _, value = harness.time_calls(lambda f=fn: f(labels, assignment),
                                             repeats=args.repeats, warmup=0,
                                             max_seconds=args.max_seconds)
        row[side][score] = {"seconds": stats["median_ms"] / 1e3, "value": float(value)}
        values.setdefault(score, []).append(float(value))
    if len(chosen) == 2:
      row["max_difference"] = max(abs(v[0] - v[1]) for v in values.values())
    rows.append(row)
    print(json.dumps(row), flush=True)
  report = {"rows": rows, "agreement": args.agreement}
  print()
  print(table(report))
  if args.out:
    stamp = harness.stamp([__file__, *(sys.argv[1:] if argv is None else argv)])
    harness.write_json({"script": "benchmarks/speed/clustering_scores.py", **report,
                        "stamp": stamp}, args.out, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
