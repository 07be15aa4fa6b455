"""Reporting evaluation results: ``eval_step_<N>.json``, metrics.jsonl rows, markdown tables
(one run, a history of steps, runs side by side, mean ± std over seeds), metric curves and
embedding scatter plots. Fractions are shown in percent.
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping, Sequence

import numpy as np


# Metrics in [0, 1], shown in percent in tables; others (rho) are shown as they are.
_FRACTION_KEYS = ("map@r", "r_precision", "mrr", "nmi", "nmi+", "ami", "ami+", "f1", "f1+")


def flatten(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
  """``{'test': {'recall@1': x}}`` -> ``{'eval/test/recall@1': x}`` for metrics.jsonl."""
  return {f"eval/{p}/{k}": v for p, row in results.items() for k, v in row.items()}


def results_path(workdir: str, step: int, tag: str = "") -> str:
  """``<workdir>/eval_step_<step>.json``, the run's own evaluation; with a ``tag`` (an
  evaluation under other settings, e.g. ``'ks=1,2,4'``) ``eval_step_<step>.<tag>.json``."""
  return os.path.join(workdir, f"eval_step_{step}{'.' + tag if tag else ''}.json")


def write_text_atomic(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` through a temporary file renamed over it: a reader (another
  process) sees the old file or the new one, and a kill or a second Ctrl-C mid-way leaves the
  old file whole, never a cut one."""
  tmp = f"{path}.{os.getpid()}.tmp"
  try:
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_results(results: Mapping, *, workdir: str, step: int, tag: str = "",
                  settings: Mapping | None = None) -> str:
  """Writes ``{'step': N, 'results': {protocol: metrics}}`` to :func:`results_path` (whole:
  :func:`write_text_atomic`; a sweep reads it from another process); ``settings`` (the
  evaluation settings a ``tag`` stands for) are recorded beside them."""
  path = results_path(workdir, step, tag)
  record = {"step": step, "results": results, **({"settings": dict(settings)} if settings else {})}
  write_text_atomic(path, json.dumps(record, indent=2, sort_keys=True))
  return path


def is_fraction(metric: str) -> bool:
  """Metrics in ``[0, 1]`` (shown in percent; higher is better): recall@K, map@r,
  r_precision, mrr, nmi, nmi+, ami and ami+ (which can dip below 0), f1, f1+."""
  return metric.startswith("recall@") or metric in _FRACTION_KEYS


def format_value(metric: str, value: float) -> str:
  return f"{100 * value:.2f}" if is_fraction(metric) else f"{value:.4f}"


# Column order of every metric table (eval.py, train.py, the sweep): Recall@K by K, then these,
# then any other metric alphabetically.
METRIC_ORDER = ("map@r", "r_precision", "mrr", "nmi", "nmi+", "ami", "ami+", "f1", "f1+", "rho")


def metric_sort_key(metric: str) -> tuple:
  """Sort key giving the one column order of all metric tables (see ``METRIC_ORDER``)."""
  if metric.startswith("recall@") and metric[7:].isdigit():
    return (0, int(metric[7:]), "")
  if metric in METRIC_ORDER:
    return (1, METRIC_ORDER.index(metric), "")
  return (2, 0, metric)


def _metric_keys(rows) -> list[str]:
  keys = []
  for row in rows:
    keys += [k for k in row if k not in keys]
  return sorted(keys, key=metric_sort_key)


def format_table(results: Mapping[str, Mapping[str, float]]) -> str:
  """A markdown table: a row per protocol, a column per metric (fractions in percent)."""
  keys = _metric_keys(results.values())
  lines = ["| protocol | " + " | ".join(keys) + " |",
           "|---|" + "---|" * len(keys)]
  for protocol, row in results.items():
    cells = [format_value(k, row[k]) if k in row else "" for k in keys]
    lines.append(f"| {protocol} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def format_history_table(history: Mapping[int, Mapping[str, Mapping[str, float]]]) -> str:
  """A markdown table with a row per (step, protocol)."""
  return format_runs_table({step: history[step] for step in sorted(history)}, column="step")


def format_runs_table(runs: Mapping, *, column: str = "run") -> str:
  """A markdown table with a row per (run, protocol) of ``{run name: {protocol: {metric:
  value}}}`` (fractions in percent); ``column`` heads the run names."""
  keys = _metric_keys(row for results in runs.values() for row in results.values())
  lines = [f"| {column} | protocol | " + " | ".join(keys) + " |",
           "|---|---|" + "---|" * len(keys)]
  for name, results in runs.items():
    for protocol, row in results.items():
      cells = [format_value(k, row[k]) if k in row else "" for k in keys]
      lines.append(f"| {name} | {protocol} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def aggregate(runs: Sequence[Mapping[str, Mapping[str, float]]]) -> dict:
  """Mean and sample standard deviation (``ddof=1``; 0 for one run) over runs (e.g. seeds).

  Args:
    runs: one ``{protocol: {metric: value}}`` per run; all with the same protocols and
      metrics.

  Returns:
    ``{protocol: {metric: {'mean': m, 'std': s, 'values': [...]}}}``.

  Raises:
    ValueError: no run, or runs whose protocols / metrics differ (naming the run index).
  """
  if not runs:
    raise ValueError("aggregate needs at least one run.")
  reference = {p: sorted(row) for p, row in runs[0].items()}
  for i, run in enumerate(runs[1:], start=1):
    got = {p: sorted(row) for p, row in run.items()}
    if got != reference:
      raise ValueError(f"Run {i} has protocols / metrics {got}, run 0 has {reference}; "
                       "aggregate runs evaluated the same way.")
  summary = {}
  for protocol, row in runs[0].items():
    summary[protocol] = {}
    for metric in row:
      values = [float(run[protocol][metric]) for run in runs]
      std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
      summary[protocol][metric] = {"mean": float(np.mean(values)), "std": std,
                                   "values": values}
  return summary


def format_aggregate_table(summary: Mapping) -> str:
  """Markdown ``mean ± std`` table of :func:`aggregate` (fractions in percent)."""
  keys = _metric_keys(summary.values())
  lines = ["| protocol | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
  for protocol, row in summary.items():
    cells = []
    for k in keys:
      scale, digits = (100.0, 2) if is_fraction(k) else (1.0, 4)
      cells.append(f"{scale * row[k]['mean']:.{digits}f} ± {scale * row[k]['std']:.{digits}f}")
    lines.append(f"| {protocol} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def train_curve(rows: Sequence[Mapping], key: str = "train/loss") -> dict[int, float]:
  """``{step: value}`` of ``key`` in metrics.jsonl ``rows`` (the log steps)."""
  return {int(r["step"]): float(r[key]) for r in rows if key in r}


def _single_point(xs) -> dict:
  """Plot options of a series: one point (a run evaluated once) is a marker, not a line."""
  return {"marker": "o", "linestyle": "none"} if len(xs) == 1 else {}


def plot_curves(history: Mapping[int, Mapping[str, Mapping[str, float]]], *,
                path: str, title: str = "",
                train: Mapping[str, Mapping[int, float]] | None = None) -> str:
  """Learning curves PNG: a panel per ``train`` series (e.g. ``{'train/loss': {step: v}}``,
  every log step) and a panel per evaluation metric (its value against the step, a line per
  protocol), on one figure; a series of one point is a marker."""
  plt = pyplot()

  train = {k: v for k, v in (train or {}).items() if v}
  steps = sorted(history)
  keys = _metric_keys(row for results in history.values() for row in results.values())
  protocols = _metric_keys(history.values())
  panels = len(train) + len(keys)
  cols = min(3, panels)
  rows = math.ceil(panels / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), dpi=100,
                           squeeze=False)
  for ax, (name, series) in zip(axes.flat, train.items()):
    xs = sorted(series)
    ax.plot(xs, [series[x] for x in xs], color="tab:gray", lw=1, **_single_point(xs))
    ax.set_title(name, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  for ax, key in zip(list(axes.flat)[len(train):], keys):
    scale = 100.0 if is_fraction(key) else 1.0
    for protocol in protocols:
      points = [(s, scale * history[s][protocol][key]) for s in steps
                if key in history[s].get(protocol, {})]
      if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, label=protocol, **{"marker": "o", **_single_point(xs)})
    ax.set_title(key + (" (%)" if scale == 100.0 else ""), fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[panels:]:
    ax.axis("off")
  if keys:
    axes.flat[len(train)].legend(fontsize=8)
  if title:
    fig.suptitle(title, fontsize=11)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path


def plot_embedding(embeddings: np.ndarray, labels: np.ndarray, *, path: str,
                   title: str) -> str:
  """Scatter PNG of ``embeddings [N, D]`` coloured by ``labels [N]`` (PCA to 2-D if D > 2)."""
  plt = pyplot()

  x = np.asarray(embeddings, np.float64)
  if x.shape[1] > 2:
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    x = x @ vt[:2].T
    title += " (PCA)"
  elif x.shape[1] == 1:
    x = np.concatenate([x, np.zeros_like(x)], axis=1)
  fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
  for label in np.unique(labels):
    sel = labels == label
    ax.scatter(x[sel, 0], x[sel, 1], s=6, alpha=0.7, label=str(label))
  ax.legend(markerscale=3, fontsize=8, loc="best")
  ax.set_title(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path


def pyplot():
  """``matplotlib.pyplot`` with the non-interactive Agg backend."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def save(fig, path: str) -> str:
  """Saves and closes ``fig``; creates the directory. Returns ``path``."""
  plt = pyplot()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path
