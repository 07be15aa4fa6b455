r"""A static HTML report comparing runs (no server, no JavaScript, images inline).

  python -m dml_jax.run.summary runs/digits_seeds [more dirs ...] [--out=report.html] [--title=T]

Every directory under the given ones that holds a ``config.json`` is a run. The page shows:

* the resolved configs' differences: a row per run, a column per key whose value differs
  (keys that only say where data is read from or how it is logged are left out);
* the final metrics: runs that differ only by ``seed`` form a group, shown as mean ± std
  (sample std; ``evaluation.report.aggregate``) with the number of runs; fractions in percent.
  A run's final metrics are those of its newest ``eval_step_<N>.json``;
* per group, the learning curves (training loss of ``metrics.jsonl`` and every evaluated
  metric against the step, averaged over the group's runs);
* per run, the retrieval grids of its final step (``eval.py --retrieval_grid`` or
  ``config.eval.retrieval_grid``).

Images are embedded as base64 ``data:`` URIs, so the one file is the whole report. A run
without any evaluation is named on stderr and left out; when no run has one, the tool stops
with a one-line error (exit code 1).
"""

from __future__ import annotations

import argparse
import base64
import glob
import html
import json
import os
import re
import sys
from collections.abc import Sequence

import numpy as np

from dml_jax.run import workdir as workdir_lib
from dml_jax.evaluation import report

# Resumable keys that still change what a metric means (the others say where data is read
# from, how often to log, on how many devices).
_COMPARED_RESUMABLE = ("num_train_steps", "num_epochs")


def find_workdirs(roots: Sequence[str]) -> list[str]:
  """Every directory under ``roots`` (themselves included) holding a ``config.json``, sorted.

  Raises:
    FileNotFoundError: a root that does not exist, or no run under any root.
  """
  found = set()
  for root in roots:
    if not os.path.isdir(root):
      raise FileNotFoundError(f"{root} is not a directory.")
    for folder, dirs, files in os.walk(root):
      dirs[:] = sorted(d for d in dirs if d not in ("checkpoints", "tensorboard"))
      if workdir_lib.CONFIG_FILE in files:
        found.add(os.path.normpath(folder))
  if not found:
    raise FileNotFoundError(f"No run (a directory with {workdir_lib.CONFIG_FILE}) under "
                            f"{', '.join(roots)}.")
  return sorted(found)


def eval_history(workdir: str) -> dict[int, dict]:
  """``{step: results}`` of every ``eval_step_<N>.json`` in ``workdir``."""
  history = {}
  for path in glob.glob(os.path.join(glob.escape(workdir), "eval_step_*.json")):
    match = re.fullmatch(r"eval_step_(\d+)\.json", os.path.basename(path))
    if match:
      with open(path) as f:
        history[int(match.group(1))] = json.load(f)["results"]
  return dict(sorted(history.items()))


def load_run(workdir: str, *, name: str | None = None) -> dict:
  """One run: ``{'name', 'workdir', 'config' (flat), 'history', 'step', 'results', 'train'
  ({step: loss}), 'grids' (paths)}``.

  Raises:
    ValueError: the run has no evaluation (the message says how to make one).
  """
  history = eval_history(workdir)
  if not history:
    raise ValueError(f"{workdir} has no evaluation (no eval_step_<N>.json): run python "
                     f"eval.py --workdir={workdir}")
  step = max(history)
  return {"name": name or workdir, "workdir": workdir,
          "config": workdir_lib.flatten(workdir_lib.read_config_json(workdir)),
          "history": history, "step": step, "results": history[step],
          "train": report.train_curve(workdir_lib.read_metrics(workdir)),
          "grids": sorted(glob.glob(os.path.join(glob.escape(workdir),
                                                 f"retrieval_grid_*_step_{step}.png")))}


def compared_key(key: str) -> bool:
  """Whether ``key`` enters the config differences (see the module docstring)."""
  if key in _COMPARED_RESUMABLE or key.startswith("eval."):
    return True
  return not workdir_lib.is_resumable(key)


def differing_keys(runs: Sequence[dict]) -> list[str]:
  """The compared config keys whose values are not the same in every run, sorted."""
  keys = sorted({k for r in runs for k in r["config"]})
  return [k for k in keys if compared_key(k)
          and len({repr(r["config"].get(k)) for r in runs}) > 1]


def group_runs(runs: Sequence[dict], keys: Sequence[str]) -> dict[str, list[dict]]:
  """Runs grouped by their values of ``keys`` other than ``seed``, named ``k=v, ...`` by the
  keys they set (a key a run lacks or sets to None, e.g. another objective's
  hyper-parameter, is left out of its name; named by those alone when it sets none)."""
  groups: dict[str, list[dict]] = {}
  for run in runs:
    values = {k: run["config"].get(k) for k in keys if k != "seed"}
    label = (", ".join(f"{k}={v}" for k, v in values.items() if v is not None)
             or ", ".join(f"{k}={v}" for k, v in values.items()))
    groups.setdefault(label or "all runs", []).append(run)
  return groups


def count(n: int, noun: str) -> str:
  """``'1 run'``, ``'3 runs'``."""
  return f"{n} {noun}{'' if n == 1 else 's'}"


def mean_history(runs: Sequence[dict]) -> tuple[dict, dict]:
  """The mean over ``runs`` of their evaluations and training losses at the steps all of
  them have: ``({step: results}, {step: loss})``."""
  steps = sorted(set.intersection(*(set(r["history"]) for r in runs)))
  history = {}
  for s in steps:
    first = runs[0]["history"][s]
    history[s] = {p: {m: float(np.mean([r["history"][s].get(p, {}).get(m, np.nan)
                                        for r in runs])) for m in row}
                  for p, row in first.items()}
  loss_steps = sorted(set.intersection(*(set(r["train"]) for r in runs)))
  loss = {s: float(np.mean([r["train"][s] for r in runs])) for s in loss_steps}
  return history, loss


def _png_uri(data: bytes) -> str:
  return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def curves_png(runs: Sequence[dict], title: str) -> bytes:
  """The learning curves of a group (mean over its runs) as PNG bytes."""
  import tempfile  # pylint: disable=import-outside-toplevel
  history, loss = mean_history(runs)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "curves.png")
    report.plot_curves(history, path=path, title=title, train={"train/loss": loss})
    with open(path, "rb") as f:
      return f.read()


def metrics_rows(groups: dict[str, list[dict]]) -> list[dict]:
  """A row per (group, protocol): ``{'group', 'runs', 'protocol', 'cells': {metric: text}}``
  with ``mean ± std`` (percent for fractions); groups whose runs were evaluated differently
  get a row per run."""
  rows = []
  for label, runs in groups.items():
    try:
      summary = report.aggregate([r["results"] for r in runs])
    except ValueError:
      for r in runs:
        rows += metrics_rows({f"{label} ({r['name']})": [r]})
      continue
    for protocol, row in summary.items():
      cells = {}
      for metric, s in row.items():
        scale, digits = (100.0, 2) if report.is_fraction(metric) else (1.0, 4)
        cells[metric] = (f"{scale * s['mean']:.{digits}f} ± {scale * s['std']:.{digits}f}"
                         if len(runs) > 1 else f"{scale * s['mean']:.{digits}f}")
      rows.append({"group": label, "runs": len(runs), "protocol": protocol, "cells": cells,
                   "steps": sorted({r["step"] for r in runs})})
  return rows


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], cls: str) -> str:
  esc = html.escape
  head = "".join(f"<th>{esc(h)}</th>" for h in header)
  body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>"
                 for row in rows)
  return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


_STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:1400px}
table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #bbb;
padding:3px 8px;text-align:right;font-size:13px}th{background:#eee}
td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #ddd}
h2{border-bottom:1px solid #ccc}details{margin:0.4em 0}"""


# Marks the page as this tool's: --out replaces such a page (and an older one, recognised by
# its first paragraph), nothing else.
GENERATOR = "<meta name='generator' content='dml_jax.run.summary'>"
_OLDER_PAGE = "(runs differing only by seed)"


def check_out(out: str) -> None:
  """``ValueError`` when ``out`` holds something other than an earlier page of this tool
  (a run's ``config.json``, a page of the user's), which is left as it is."""
  if not os.path.lexists(out):
    return
  try:
    with open(out, errors="replace") as f:
      head = f.read(1 << 16)
  except OSError:
    head = ""
  if not (head.startswith("<!DOCTYPE html>") and (GENERATOR in head or _OLDER_PAGE in head)):
    raise ValueError(f"--out={out} exists and is not an earlier page of this tool; it is left "
                     "as it is: choose another --out.")


def render(runs: Sequence[dict], *, title: str = "dml_jax runs",
           skipped: Sequence[str] = ()) -> str:
  """The report page of ``runs`` (:func:`load_run`) as one HTML string."""
  esc = html.escape
  keys = differing_keys(runs)
  groups = group_runs(runs, keys)
  parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'>{GENERATOR}"
           f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body><h1>{esc(title)}</h1>",
           f"<p>{count(len(runs), 'run')} in {count(len(groups), 'group')} (runs differing "
           "only by seed).</p>"]
  if skipped:
    parts.append(f"<p>Left out (no evaluation): {esc(', '.join(skipped))}</p>")
  parts.append("<h2>Config differences</h2>")
  if keys:
    parts.append(_table(["run", "final step"] + keys,
                        [[r["name"], r["step"]] + [r["config"].get(k, "") for k in keys]
                         for r in runs], "config"))
  else:
    parts.append("<p>The runs have the same resolved config.</p>")
  parts.append("<h2>Final metrics</h2><p>mean ± std over the runs of a group (fractions in "
               "percent).</p>")
  rows = metrics_rows(groups)
  metrics = sorted({m for r in rows for m in r["cells"]}, key=report.metric_sort_key)
  parts.append(_table(["group", "runs", "protocol"] + metrics,
                      [[r["group"], r["runs"], r["protocol"]] +
                       [r["cells"].get(m, "") for m in metrics] for r in rows], "metrics"))
  parts.append("<h2>Learning curves</h2>")
  for label, members in groups.items():
    png = curves_png(members, f"{label} ({'mean of ' if len(members) > 1 else ''}"
                              f"{count(len(members), 'run')})")
    parts.append(f"<h3>{esc(label)}</h3><img alt='learning curves {esc(label)}' "
                 f"src='{_png_uri(png)}'>")
  with_grids = [r for r in runs if r["grids"]]
  if with_grids:
    parts.append("<h2>Retrieval grids</h2>")
    for r in with_grids:
      parts.append(f"<details open><summary>{esc(r['name'])} (step {r['step']})</summary>")
      for path in r["grids"]:
        with open(path, "rb") as f:
          parts.append(f"<img alt='{esc(os.path.basename(path))}' "
                       f"src='{_png_uri(f.read())}'>")
      parts.append("</details>")
  parts.append("</body></html>\n")
  return "\n".join(parts)


def build_report(roots: Sequence[str], *, out: str, title: str | None = None) -> dict:
  """Finds the runs under ``roots``, writes the page to ``out``.

  Returns:
    ``{'out', 'runs' (names), 'skipped' (names without evaluation)}``.

  Raises:
    FileNotFoundError: no run under ``roots``. ValueError: no run has an evaluation, or
      ``out`` holds something else (:func:`check_out`).
  """
  check_out(out)
  workdirs = find_workdirs(roots)
  base = os.path.commonpath([os.path.abspath(r) for r in roots])
  runs, skipped, reasons = [], [], []
  for w in workdirs:
    name = os.path.relpath(os.path.abspath(w), base)
    name = os.path.basename(os.path.abspath(w)) if name == "." else name
    try:
      runs.append(load_run(w, name=name))
    except ValueError as e:
      skipped.append(name)
      reasons.append(str(e))
  if not runs:
    raise ValueError(f"No run under {', '.join(roots)} has an evaluation (eval_step_<N>.json);"
                     " train to the end or run python eval.py --workdir=<run>.")
  for reason in reasons:
    print(f"python -m dml_jax.run.summary: left out {reason}", file=sys.stderr)
  page = render(runs, title=title or f"dml_jax runs: {', '.join(roots)}", skipped=skipped)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    f.write(page)
  return {"out": out, "runs": [r["name"] for r in runs], "skipped": skipped}


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dml_jax.run.summary",
                                   description="A static HTML page comparing runs.")
  parser.add_argument("roots", nargs="+", help="run directories or directories of runs")
  parser.add_argument("--out", default="", help="default: <first root>/report.html")
  parser.add_argument("--title", default=None)
  args = parser.parse_args(argv)
  out = args.out or os.path.join(args.roots[0], "report.html")
  try:
    result = build_report(args.roots, out=out, title=args.title)
  except (FileNotFoundError, ValueError) as e:
    print(f"python -m dml_jax.run.summary: {e}", file=sys.stderr)
    return 1
  print(f"{count(len(result['runs']), 'run')}; written {result['out']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
