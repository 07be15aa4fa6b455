r"""A metric against a numeric label of a seeds summary, one line per method: e.g. the EPHN
paper's Fig. 4 (R@1 of each mining strategy against the group size n).

  python experiments/group_size_figure.py \
      --summary=docs/results/reproductions/omniglot_ephn_fig4.json \
      --columns='letters R@1,train letters R@1' --out=docs/figures/ephn_fig4_omniglot.png

Draws from the summary alone (``python docs/tables.py summarize`` keeps every seed's results
of every run in it), so the figure always shows the runs of its table. The summary's first
label names the method (a blank cell continues the row above) and its last label the x value:
its leading number (``"2 (= EP)"`` is 2, ``"1,200"`` 1200). One panel per column, mean ± std
over the seeds; a row with a ``"step"`` reads its cells at that step, so rows over training
with a column per protocol draw each protocol against the step.
With ``--steps=test`` each row is a line over training instead, from its run's evaluations
``test@<step>`` (the summary's columns name them), and ``--columns`` names metrics:

  python experiments/group_size_figure.py \
      --summary=docs/results/reproductions/omniglot_ephn_long.json --steps=test \
      --columns=recall@1,map@r --out=docs/figures/ephn_fig4_long_omniglot.png
"""

import argparse
import json
import os
import re
import sys
import textwrap

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dml_jax.evaluation import report  # pylint: disable=g-import-not-at-top

NUMBER = re.compile(r"\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


def _method_rows(summary: dict):
  """``(method, row)`` per row: a blank first cell continues the method of the row above."""
  method = None
  for row in summary["rows"]:
    method = row["cells"][0] or method
    if method is None:
      raise ValueError("the first row names no method (its first cell is blank).")
    yield method, row


def _seeds(summary: dict, run) -> dict:
  """``{seed: results}`` of ``run``; a run without results is one error line."""
  seeds = summary["runs"].get(run)
  if not seeds:
    raise ValueError(f"no results of run {run!r} in the summary: fill it with "
                     "python docs/tables.py summarize.")
  return seeds


def curves(summary: dict, header: str) -> dict[str, tuple[np.ndarray, np.ndarray,
                                                           np.ndarray]]:
  """``{method: (x [R], mean [R], std [R])}`` in percent of the column ``header``: one entry
  per row of the method, in the summary's order; mean and sample std over the seeds."""
  columns = summary["columns"]
  headers = [c["header"] for c in columns]
  if header not in headers:
    raise ValueError(f"the summary has no column {header!r}; its columns: {headers}.")
  column = columns[headers.index(header)]
  out = {}
  for method, row in _method_rows(summary):
    match = NUMBER.match(row["cells"][-1].replace(",", ""))   # "1,200" is 1200
    if not match:
      raise ValueError(f"the last label {row['cells'][-1]!r} of a {method!r} row does not "
                       "start with a number (the x value).")
    seeds = _seeds(summary, row["run"] if "run" in row else row["runs"][headers.index(header)])
    protocol = column.get("protocol", row["protocol"])
    if "step" in row:   # the run's evaluation at that step (docs/tables.py)
      protocol = f"{protocol}@{row['step']}"
    values = column.get("scale", 100) * np.array(
        [seeds[s][protocol][column["metric"]] for s in sorted(seeds, key=int)])
    xs, means, stds = out.setdefault(method, ([], [], []))
    xs.append(float(match.group(1)))
    means.append(values.mean())
    stds.append(values.std(ddof=1) if len(values) > 1 else 0.0)
  return {m: tuple(np.array(v) for v in c) for m, c in out.items()}


def step_curves(summary: dict, protocol: str, metric: str) -> dict[str, tuple[
    np.ndarray, np.ndarray, np.ndarray]]:
  """``{row: (steps [T], mean [T], std [T])}`` in percent: each row's ``metric`` of its run's
  evaluations ``<protocol>@<step>`` (those a column of the summary names; ``docs/tables.py
  summarize`` keeps them) against the step; the row is named by its labels."""
  labels, out = summary.get("labels", []), {}
  pattern = re.compile(re.escape(protocol) + r"@(\d+)")
  for method, row in _method_rows(summary):
    name = ", ".join([method, *(f"{label} = {cell}" for label, cell
                                in zip(labels[1:], row["cells"][1:]) if cell)])
    seeds = _seeds(summary, row.get("run"))
    order = sorted(seeds, key=int)
    steps = sorted({int(m.group(1)) for key in seeds[order[0]]
                    if (m := pattern.fullmatch(key))})
    if not steps:
      raise ValueError(f"run {row['run']!r} holds no {protocol}@<step> results: name them "
                       f"in the summary's columns (e.g. \"protocol\": \"{protocol}@600\").")
    have = seeds[order[0]][f"{protocol}@{steps[0]}"]
    if metric not in have:
      raise ValueError(f"the {protocol}@<step> results have no metric {metric!r}; they have "
                       f"{sorted(have)}.")
    values = 100 * np.array([[seeds[s][f"{protocol}@{t}"][metric] for t in steps]
                             for s in order])   # [S, T]
    out[name] = (np.array(steps, float), values.mean(0),
                 values.std(0, ddof=1) if len(order) > 1 else np.zeros(len(steps)))
  return out


def draw(summary: dict, headers: list[str], path: str, *, xlabel: str = "",
         steps: str = "") -> str:
  """Writes one panel per column of ``headers`` to ``path``, or with ``steps`` (a protocol)
  one per metric of ``headers`` against the step (``step_curves``); the x axis is log2 when
  every x is a positive power of two, and log when the steps span a decade or more."""
  plt = report.pyplot()
  fig, axes = plt.subplots(1, len(headers), figsize=(6.5 * len(headers), 4.8), dpi=90,
                           squeeze=False)
  for ax, header in zip(axes[0], headers):
    lines = step_curves(summary, steps, header) if steps else curves(summary, header)
    xs = np.concatenate([x for x, _, _ in lines.values()])
    for j, (method, (x, mean, std)) in enumerate(lines.items()):
      ax.errorbar(x, mean, yerr=std, fmt="-o", capsize=3, color=f"C{j}",
                  label=method.replace("`", ""))
    if np.all(xs > 0) and np.all(np.log2(xs) == np.round(np.log2(xs))):
      ax.set_xscale("log", base=2)
      ax.set_xticks(sorted(set(xs)), [f"{v:g}" for v in sorted(set(xs))])
    elif steps:   # the evaluations' steps, on a log axis when they span a decade or more
      if xs.min() > 0 and xs.max() >= 10 * xs.min():
        ax.set_xscale("log")
        ax.minorticks_off()
      ax.set_xticks(sorted(set(xs)), [f"{v:,.0f}" for v in sorted(set(xs))])
    ax.set_xlabel(xlabel or ("step" if steps else summary.get("labels", ["", "x"])[-1]))
    ax.set_ylabel(f"{steps} {header} (%)" if steps else f"{header} (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  seeds = sorted({int(s) for runs in summary["runs"].values() for s in runs})
  stamp = summary.get("stamp", {})
  title = (f"{summary['title']}: mean ± std over {len(seeds)} seeds "
           f"(commit {stamp.get('commit', '?')}, {stamp.get('date', '?')})")
  fig.suptitle(textwrap.fill(title, 80 * len(headers)), fontsize=10)
  return report.save(fig, path)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--summary", required=True,
                      help="a seeds summary of docs/tables.py summarize")
  parser.add_argument("--columns", required=True,
                      help="comma-separated column headers of the summary, one panel each")
  parser.add_argument("--steps", default="",
                      help="a protocol, e.g. test: each row's evaluations <protocol>@<step> "
                           "against the step; --columns then names metrics (recall@1,map@r)")
  parser.add_argument("--xlabel", default="", help="default: the summary's last label")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  headers = [h.strip() for h in args.columns.split(",") if h.strip()]
  try:
    if not headers:
      raise ValueError("--columns names no column.")
    with open(args.summary) as f:
      summary = json.load(f)
    print(draw(summary, headers, args.out, xlabel=args.xlabel, steps=args.steps))
  except (OSError, ValueError) as e:
    print(f"group_size_figure: {args.summary}: {e}", file=sys.stderr)
    return 2
  except (KeyError, TypeError) as e:
    print(f"group_size_figure: {args.summary} is not a seeds summary of docs/tables.py "
          f"summarize ({type(e).__name__}: {e}).", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
