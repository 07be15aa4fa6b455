"""The GPU tables of docs/performance.md, generated from the committed summaries of ``gpu_check.sh``.

  python benchmarks/device/gpu_table.py              # prints the markdown
  python docs/tables.py --write                      # rewrites every docs table, these included

Reads ``docs/results/gpu/{tests,cross_platform,throughput,omniglot}.json`` (each stamped by
``gpu_check.sh`` with its part, commit, date, device and JAX version); :func:`generate` is the
``<!-- table: gpu -->`` block of docs/performance.md, which ``docs/tables.py`` writes and
tests/test_docs_tables.py checks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "docs", "results", "gpu")
LOSS_FLOOR = 1e-3   # as cross_platform.loss_rel_diff: losses near 0 are compared absolutely

# EPS paper, Table 3 (ImageNet ResNet-50): letters R@1, NMI; languages R@1, NMI+
PAPER_OMNIGLOT = {"random": (49.4, 66.2, 71.0, 38.7), "easy": (68.4, 79.6, 85.2, 52.6)}
ROWS = {"random": "Trip. + SH", "easy": "EPS + Trip. + SH"}
OMNIGLOT_KEYS = ("test/recall@1", "test/nmi", "test:alphabet/recall@1", "test:alphabet/nmi+")
MODELS = {"resnet18": "ResNet-18", "resnet50": "ResNet-50"}
CROSS_NUM = 20000   # cross_platform.py's --num, for summaries that did not record it


def load(name: str) -> dict:
  with open(os.path.join(RESULTS, f"{name}.json")) as f:
    return json.load(f)


def stamp(d: dict) -> str:
  s = d["stamp"]
  return f"{s['device']}, JAX {s['jax']}, {s['date']}, commit `{s['commit']}`"


def num(x: float, digits: int = 0) -> str:
  return f"{x:,.{digits}f}"


def checks_table(tests: dict, cross: dict, tp: dict) -> list[str]:
  rows = ["| check | result |", "|---|---|"]
  rows.append(
      f"| `tests`: the numerics test files at the platform's default precision "
      f"({tests['seconds']} s) | {tests['passed']} passed, {tests['failed']} failed, "
      f"{tests['skipped']} skipped (kernel tests; multi-device) of {tests['tests']} |")
  full = cross["objectives"]
  loss = max(abs(r["loss_device"] - r["loss_cpu"]) / max(abs(r["loss_cpu"]), LOSS_FLOOR)
             for r in full)
  grad = max(r["grad_rel_diff"] for r in full)
  before = cross["objectives_platform_default"]
  grad_before = max(r["grad_rel_diff"] for r in before)
  names = ", ".join(r["objective"] for r in before)
  rows.append(
      f"| `cross`: {len(full)} objectives' loss and gradient, GPU against the CPU of the same "
      f"process (batch {cross['batch']}, {cross['dim']}-D) | loss ≤ {loss:.1e} (relative, "
      f"absolute below {LOSS_FLOOR:g}), gradient ≤ {grad:.1e} (relative to its largest entry); "
      f"with the similarity products at the platform's default (TF32) instead: gradient up to "
      f"{grad_before:.1e} ({names}) |")
  ret = cross["retrieval"]
  rows.append(
      f"| `cross`: exact kNN and retrieval metrics of {num(cross.get('num', CROSS_NUM))} "
      f"clustered {cross['dim']}-D embeddings, GPU against CPU | metrics differ by ≤ {ret['max_metric_abs_diff']:.1e}; neighbour lists "
      f"differ in {100 * ret['neighbour_lists_differ']:.2f} % of the queries |")
  ours = [r for row in tp["rows"] if "results" in row for r in row["results"]]
  torch = {r["mode"]: r for r in tp["rows"] if r.get("side") == "torch"}
  for r in ours:   # a row has the inputs its call measured (float32: synthetic alone)
    parts = []
    if "real" in r:
      parts.append(f"JPEG pipeline {num(r['real'])} ({r['num_workers']} workers × "
                   f"{r['num_threads']} threads)")
    if "cached" in r:
      parts.append(f"cached {num(r['cached'])} ({100 * r['cached'] / r['synthetic']:.1f} % of "
                   "synthetic)")
    parts.append(f"synthetic {num(r['synthetic'])}")
    line = (f"| `throughput`: {MODELS.get(r['model'], r['model'])} {r['image_size']} px {r['dtype']}, batch "
            f"{r['batch_size']}, images/s | dml_jax: {', '.join(parts)}")
    if torch and r["dtype"] == "bfloat16":   # the peer runs bf16 autocast
      peer = "; ".join(f"PyTorch {t['torch'].split('+')[0]} {mode} {num(t['synthetic'])}"
                       for mode, t in torch.items())
      ratio = r["synthetic"] / torch["compiled"]["synthetic"] if "compiled" in torch else None
      line += f"; {peer}" + (f"; dml_jax / torch.compile {ratio:.2f}×" if ratio else "")
    rows.append(line + " |")
  return rows


def _seeds(n: int) -> str:
  return f"{n} seed{'s' if n != 1 else ''}"


def omniglot_table(om: dict) -> list[str]:
  """The Omniglot rows (mean ± std over each row's finished seeds) and the runs' rates."""
  counts = {name: max(m["n"] for m in metrics.values()) for name, metrics in om["rows"].items()}
  same = len(set(counts.values())) == 1
  rows = [f"| row{f' ({_seeds(next(iter(counts.values())))})' if same else ''} | letters R@1 | "
          "letters NMI | languages R@1 | languages NMI+ | paper (ImageNet weights) |",
          "|---|---|---|---|---|---|"]
  for name, metrics in sorted(om["rows"].items(),
                              key=lambda item: list(ROWS).index(item[0].rsplit("=", 1)[-1])):
    pos = name.rsplit("=", 1)[-1]
    cells = [f"{metrics[k]['mean']:.1f} ± {metrics[k]['std']:.1f}" for k in OMNIGLOT_KEYS]
    paper = " / ".join(f"{v:.1f}" for v in PAPER_OMNIGLOT[pos])
    label = ROWS[pos] if same else f"{ROWS[pos]} ({_seeds(counts[name])})"
    rows.append(f"| {label} | " + " | ".join(cells) + f" | {paper} |")
  rates = [r["images_per_s"] for r in om["runs"] if r.get("images_per_s")]
  steps = {r["final_step"] for r in om["runs"] if r["finished"]}
  unfinished = sum(not r["finished"] for r in om["runs"])
  rows.append("")
  rows.append(
      f"{len(om['runs'])} runs{f' ({unfinished} of them unfinished)' if unfinished else ''} of "
      f"{', '.join(map(str, sorted(steps)))} steps, all at once on "
      f"the GPU beside the `tests` part: {om['wall_seconds_all_runs']:.0f} s for all of them "
      f"(compilation, cache, training, evaluation), each training at "
      f"{num(min(rates))}–{num(max(rates))} images/s ({stamp(om)}).")
  return rows


def checks_header(tests: dict, cross: dict, tp: dict) -> str:
  """Where and when the checks ran: the ``tests`` stamp, and ``cross``'s where it differs."""
  other = f"; cross: {stamp(cross)}" if stamp(cross) != stamp(tests) else ""
  return f"Checks: {stamp(tests)}{other}; throughput: {stamp(tp)}."


def generate() -> str:
  tests, cross, tp, om = (load(n) for n in ("tests", "cross_platform", "throughput", "omniglot"))
  lines = [checks_header(tests, cross, tp), ""]
  lines += checks_table(tests, cross, tp)
  lines += ["", "EPS paper, Table 3 on Omniglot at the paper's scale from random weights "
            "(`configs/omniglot_resnet50.py`, 15 epochs; `gpu_check.sh omniglot`; "
            "mean ± std over seeds, %):", ""]
  lines += omniglot_table(om)
  return "\n".join(lines)


def main(argv=None) -> int:
  argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
  print(generate())
  return 0


if __name__ == "__main__":
  sys.exit(main())
