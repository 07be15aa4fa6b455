r"""The documentation's result tables, generated from the committed summaries in docs/results/.

  python docs/tables.py              # check: exit 1 naming every table that differs
  python docs/tables.py --write      # rewrite every table block of the docs pages
  python docs/tables.py summarize RUN_ROOT --summary=docs/results/reproductions/NAME.json \
      [--commit=SHA] [--machine=TEXT]   # fill a summary's per-seed results from its runs

A table block in a docs page (or README.md) is

  <!-- table: reproductions/mnist_table1 -->
  ... generated ...
  <!-- end table -->

and ``reproductions/mnist_table1`` names ``docs/results/reproductions/mnist_table1.json``, a
*seeds summary*: what to show and the measured values, nothing derived::

  {"title": ..., "command": [...],              # the commands that made the runs
   "stamp": {"commit", "date", "machine", "jax"},
   "labels": ["positive", "protocol"],          # headers of the leading label columns
   "columns": [{"header": "R@1", "metric": "recall@1", "bold": true,
                "scale": 100, "digits": 1}],     # scale / digits optional (100, 1); a
                                                 # "protocol" overrides the row's
   "paper": "paper R@1",                         # optional last column's header
   "rows": [{"cells": ["easy (EPS)", "test digits 6–9"], "run": "loss.positive=easy",
             "protocol": "test", "paper": "42.31"}],   # or "runs": [one per column];
                                                 # "step": N reads each cell's protocol
                                                 # at step N (below)
   "runs": {"loss.positive=easy": {"0": {"test": {"recall@1": 0.464, ...}}, ...}}}

A row's cell is ``mean ± std`` over the seeds of its run (sample std, ``ddof=1``). ``runs``
holds each seed's final ``eval_step_<N>.json`` results (``summarize`` reads them from
``RUN_ROOT/<run>/seed_<s>/``; a column or row protocol ``<protocol>@<step>``, e.g.
``test@600``, adds that protocol's results of the run's evaluation at step 600 (a row's
``"step": 600`` does this for each of its cells' protocols); a run's
``collapse_<split>_step_<N>.json`` of
``python -m dml_jax.analysis.collapse`` (the newest ``N``'s) adds the protocol
``collapse:<split>`` with the mean over classes of ``relative_spread`` and ``rho``; a
``sampling_skew_<split>_step_<N>.json`` of ``python -m dml_jax.analysis.skew`` adds
``skew:<split>:step_<N>`` with ``<strategy>/eta_hat`` and the tool's other values; the newest
``similarity_distributions_step_<N>.json`` of ``python -m dml_jax.analysis.distributions``
adds ``distributions`` with its statistics, e.g. ``train_same/median``). Blocks
named ``gpu`` are the GPU tables of ``benchmarks/device/gpu_table.py``; a summary with a
``"script"`` is a benchmark's own report (e.g. ``performance/retrieval`` of
``benchmarks/speed/evaluation.py --summary=...``), rendered by that script's
``table(report)``. tests/test_docs_tables.py checks every block equals its
summary, so a number in a results table cannot drift from the measurement behind it.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib.util
import json
import math
import os
import platform
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "docs", "results")
BLOCK = re.compile(r"(<!-- table: ([\w/.-]+) -->\n)(.*?)(<!-- end table -->)", re.S)


def load_summary(name: str) -> dict:
  path = os.path.join(RESULTS, f"{name}.json")
  if not os.path.isfile(path):
    raise ValueError(f"table {name!r}: no summary {os.path.relpath(path, REPO)}")
  with open(path) as f:
    return json.load(f)


def mean_std(values: list[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for one value)."""
  n = len(values)
  mean = sum(values) / n
  if n == 1:
    return mean, 0.0
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def cell_protocol(row: dict, column: dict | None = None) -> str:
  """The protocol a cell reads: its column's, else its row's; ``<protocol>@<step>`` where the
  row names a ``step`` (the run's evaluation at that step)."""
  protocol = (column or {}).get("protocol", row.get("protocol"))
  return f"{protocol}@{row['step']}" if "step" in row else protocol


def seed_values(summary: dict, row: dict, metric: str) -> list[float]:
  seeds = summary["runs"].get(row["run"])
  if not seeds:
    raise ValueError(f"{summary['title']!r}: no runs of {row['run']!r}")
  protocol = cell_protocol(row)
  return [float(seeds[s][protocol][metric]) for s in sorted(seeds, key=int)]


def row_runs(row: dict, num_columns: int) -> list:
  """The run behind each column of ``row``: its ``run`` for all, or its ``runs`` list (one
  per column, ``None`` for an empty cell) when each column shows another run."""
  return list(row["runs"]) if "runs" in row else [row["run"]] * num_columns


def seeds_note(summary: dict) -> str:
  seeds = sorted({int(s) for runs in summary["runs"].values() for s in runs})
  stamp = summary["stamp"]
  span = f"seeds {seeds[0]}–{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"
  unit = " in percent" if all(c.get("scale", 100) == 100 for c in summary["columns"]) else ""
  departures = f" Departures from the paper: {summary['departures']}" if summary.get(
      "departures") else ""
  return (f"<small>Mean ± std over {span}{unit}; measured at commit `{stamp['commit']}` on "
          f"{stamp['machine']}, JAX {stamp['jax']}, {stamp['date']}; summary "
          f"`docs/results/{summary['name']}.json`.{departures}</small>")


def render_seeds(summary: dict) -> str:
  """Markdown table of a seeds summary: label cells, ``mean ± std`` per column, paper value."""
  columns = summary["columns"]
  headers = list(summary["labels"]) + [c["header"] for c in columns]
  if summary.get("paper"):
    headers.append(summary["paper"])
  lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
  for row in summary["rows"]:
    cells = list(row["cells"])
    for column, run in zip(columns, row_runs(row, len(columns))):
      if run is None:
        cells.append("—")
        continue
      mean, std = mean_std(seed_values(
          summary, {"run": run, "protocol": cell_protocol(row, column)}, column["metric"]))
      scale, digits = column.get("scale", 100), column.get("digits", 1)
      text = f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"
      cells.append(f"**{text}**" if column.get("bold") else text)
    if summary.get("paper"):
      cells.append(row.get("paper", "—"))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n\n" + seeds_note(summary) + "\n"


def source_values(ref: dict) -> list[float]:
  """The per-seed values a claims row cites: ``{"summary", "row", "metric"}`` (and
  ``"column"``: that cell's run and protocol, for a row with a run per column or a column
  with its own protocol) of a seeds summary, or ``{"summary", "run", "metric"}`` of a GPU
  run summary (its ``runs`` list)."""
  summary = load_summary(ref["summary"])
  if "row" in ref:
    row = summary["rows"][ref["row"]]
    if "column" in ref:
      column = summary["columns"][ref["column"]]
      row = {"run": row_runs(row, len(summary["columns"]))[ref["column"]],
             "protocol": cell_protocol(row, column)}
    return seed_values(summary, row, ref["metric"])
  values = [float(r["metrics"][ref["metric"]]) for r in summary["runs"] if r["name"] == ref["run"]]
  if not values:
    raise ValueError(f"{ref['summary']}: no run named {ref['run']!r}")
  return values


def render_claims(summary: dict) -> str:
  """Markdown table of claims: each row's ``ours`` cells are ``mean ± std`` of cited seeds
  (``" / "``-joined), or its literal ``ours_text`` where no summary holds the measurement."""
  lines = ["| " + " | ".join(summary["headers"]) + " |", "|" + "---|" * len(summary["headers"])]
  for row in summary["rows"]:
    if "ours" in row:
      parts = []
      for ref in row["ours"]:
        mean, std = mean_std(source_values(ref))
        scale, digits = ref.get("scale", 100), ref.get("digits", 1)
        parts.append(f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}")
      ours = " / ".join(parts) if len(parts) != 2 or not row.get("arrow") else " → ".join(parts)
    else:
      ours = row["ours_text"]
    lines.append("| " + " | ".join([row["result"], row["protocol"], row["paper"], ours,
                                     row["holds"]]) + " |")
  return "\n".join(lines) + "\n"


def _gpu_tables() -> str:
  path = os.path.join(REPO, "benchmarks", "device", "gpu_table.py")
  spec = importlib.util.spec_from_file_location("gpu_table", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.generate()


def _script(path: str):
  """The module of a benchmark script (by path: the benchmarks are scripts, not a package)."""
  spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0],
                                                os.path.join(REPO, path))
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module   # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def render_benchmark(summary: dict) -> str:
  """A benchmark report (``"script"`` names the benchmark): its table, by the script's own
  ``table(report)``, and the line saying where and when it was measured: the device when it
  is not the CPU, the CPU, and the JAX and torch versions the stamp holds."""
  stamp = summary["stamp"]
  dates = " to ".join(dict.fromkeys(stamp["dates"])) if "dates" in stamp else stamp["date"]
  device = (f"on {stamp['device']} ({stamp['backend']}), "
            if stamp.get("backend", "cpu") != "cpu" and stamp.get("device") else "")
  versions = ", ".join(f"{name} {stamp[key]}" for name, key in (("JAX", "jax"), ("torch", "torch"))
                       if stamp.get(key))
  return (_script(summary["script"]).table(summary) + "\n\n"
          f"`{stamp['command']}` at commit `{stamp['commit']}`, {dates}, {device}"
          f"{stamp['cpu_count']} CPU cores ({stamp.get('cpu', stamp['machine'])})"
          f"{'; ' + versions if versions else ''}.\n")


def render(name: str) -> str:
  """The generated text of the block named ``name``."""
  if name == "gpu":
    return _gpu_tables() + "\n"
  summary = load_summary(name)
  summary["name"] = name
  if "script" in summary:
    return render_benchmark(summary)
  return render_claims(summary) if summary.get("kind") == "claims" else render_seeds(summary)


def pages() -> list[str]:
  return sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))) + [os.path.join(REPO, "README.md")]


def regenerate(text: str) -> str:
  """``text`` with every table block replaced by its generated content."""
  return BLOCK.sub(lambda m: m.group(1) + render(m.group(2)) + m.group(4), text)


def blocks(text: str) -> list[str]:
  return [m.group(2) for m in BLOCK.finditer(text)]


def check(write: bool) -> int:
  stale = []
  for path in pages():
    with open(path) as f:
      text = f.read()
    new = regenerate(text)
    if new != text:
      stale.append(f"{os.path.relpath(path, REPO)}: {', '.join(blocks(text))}")
      if write:
        with open(path, "w") as f:
          f.write(new)
  for line in stale:
    print(("rewrote " if write else "differs from its summary: ") + line)
  return 0 if write or not stale else 1


def summarize(run_root: str, summary_path: str, commit: str | None, machine: str | None) -> None:
  """Fills ``runs`` and ``stamp`` of the summary at ``summary_path`` from ``run_root``."""
  with open(summary_path) as f:
    summary = json.load(f)
  runs = {}
  wanted = {run for r in summary["rows"] for run in row_runs(r, len(summary["columns"]))}
  # "<protocol>@<step>": the protocol's results of the run's evaluation at that step, for
  # each run the (protocol, step) pairs its cells read
  at_steps = {}
  for row in summary["rows"]:
    shown = row_runs(row, len(summary["columns"]))
    cells = list(zip(summary["columns"], shown))
    cells += [({}, run) for run in shown] if "protocol" in row else []   # a claim's citation
    for column, run in cells:
      if run is not None and (m := re.fullmatch(r"(.+)@(\d+)", cell_protocol(row, column) or "")):
        at_steps.setdefault(run, set()).add((m.group(1), int(m.group(2))))
  for run in sorted(wanted - {None}):
    folders = sorted(glob.glob(os.path.join(run_root, run, "seed_*")),
                     key=lambda p: int(p.rsplit("_", 1)[1]))
    if not folders:
      raise SystemExit(f"summarize: no {os.path.join(run_root, run, 'seed_*')} folders")
    runs[run] = {}
    for folder in folders:
      # the run's own evaluations (not eval.py --set's eval_step_<N>.<tag>.json)
      evals = sorted((p for p in glob.glob(os.path.join(folder, "eval_step_*.json"))
                      if re.fullmatch(r"eval_step_\d+\.json", os.path.basename(p))),
                     key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]))
      if not evals:
        raise SystemExit(f"summarize: {folder} has no eval_step_<N>.json (unfinished run?)")
      with open(evals[-1]) as f:
        results = json.load(f)["results"]
      run_steps = at_steps.get(run, set())
      for step in sorted({step for _, step in run_steps}):   # earlier evaluations asked for
        path = os.path.join(folder, f"eval_step_{step}.json")
        if not os.path.exists(path):
          raise SystemExit(f"summarize: {folder} has no eval_step_{step}.json (the summary "
                           f"asks for step {step}; eval_every_steps must divide {step})")
        with open(path) as f:
          earlier = json.load(f)["results"]
        for protocol in sorted(p for p, s in run_steps if s == step):
          if protocol not in earlier:
            raise SystemExit(f"summarize: {path} has no protocol {protocol!r}; it has "
                             f"{sorted(earlier)}")
          results[f"{protocol}@{step}"] = earlier[protocol]
      # the newest step's report last (steps as numbers: 1500 after 200), so it is the one kept
      for extra in sorted(glob.glob(os.path.join(folder, "collapse_*_step_*.json")),
                          key=lambda p: int(re.findall(r"_step_(\d+)\.json$", p)[0])):
        with open(extra) as f:
          report = json.load(f)
        split = re.match(r"collapse_(.+)_step_\d+\.json", os.path.basename(extra)).group(1)
        results[f"collapse:{split}"] = {
            "relative_spread": mean_std(report["relative_spread"])[0], "rho": report["rho"]}
      distributions = sorted(
          glob.glob(os.path.join(folder, "similarity_distributions_step_*.json")),
          key=lambda p: int(re.findall(r"_step_(\d+)\.json$", p)[0]))
      if distributions:   # the newest step's
        with open(distributions[-1]) as f:
          results["distributions"] = json.load(f)["statistics"]
      for extra in sorted(glob.glob(os.path.join(folder, "sampling_skew_*_step_*.json"))):
        with open(extra) as f:
          report = json.load(f)
        split, step = re.match(r"sampling_skew_(.+)_step_(\d+)\.json",
                               os.path.basename(extra)).groups()
        results[f"skew:{split}:step_{step}"] = {
            f"{strategy}/{metric}": value for strategy, row in report.items()
            for metric, value in row.items()}
      runs[run][folder.rsplit("_", 1)[1]] = {
          p: {k: round(float(v), 6) for k, v in row.items() if isinstance(v, (int, float))}
          for p, row in results.items()}
  import jax  # pylint: disable=g-import-not-at-top
  summary["runs"] = runs
  summary["stamp"] = {
      "commit": commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                         capture_output=True, text=True).stdout.strip(),
      "date": datetime.date.today().isoformat(),
      "machine": machine or f"a {os.cpu_count()}-core {platform.machine()} CPU",
      "jax": jax.__version__}
  with open(summary_path, "w") as f:
    json.dump(summary, f, indent=1, ensure_ascii=False)
    f.write("\n")


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command")
  parser.add_argument("--write", action="store_true", help="rewrite the stale blocks")
  fill = sub.add_parser("summarize", help="fill a summary's runs from a folder of runs")
  fill.add_argument("run_root")
  fill.add_argument("--summary", required=True)
  fill.add_argument("--commit")
  fill.add_argument("--machine")
  args = parser.parse_args(argv)
  if args.command == "summarize":
    summarize(args.run_root, args.summary, args.commit, args.machine)
    return 0
  try:
    return check(args.write)
  except ValueError as e:
    print(f"docs/tables.py: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
