r"""The sweep runner: a grid of config overrides x seeds, run sequentially, mean ± std.

  python -m dml_jax.run.experiments sweep --config=configs/digits_evenodd_eps.py \
      --grid='loss.positive=easy,random' --seeds=5 --workdir=runs/sweep_eps \
      [--set=num_train_steps=300 ...] [--x=data.group_size] [--metric=recall@1]

Grid syntax (``--grid`` may be repeated; axes may also be separated by ``;``):

* ``key=v1,v2,...``: one axis over a config key (dotted, e.g. ``loss.positive``);
* ``key1+key2=a1+a2,b1+b2``: one axis that sets several keys together (e.g. an objective's
  ``positive`` and ``negative`` modes: ``loss.positive+loss.negative=easy+hard,hard+all``).

The grid is the Cartesian product of the axes. Values are converted to the type of the
config field they replace (bool, int, float, str; tuples via ``ast.literal_eval``, written as
Python: ``model.embedding_hidden=(),(512,),(512,128)``; commas inside brackets do not separate
values).

Each (grid point, seed) trains in ``<workdir>/<point>/seed_<s>`` through
``training.train_and_evaluate`` with ``config.seed = seed_offset + s``. A run is *finished*
when its final ``eval_step_<num_train_steps>.json`` exists; finished runs are skipped (their
results are read back), so an interrupted sweep resumes where it stopped (an unfinished run
resumes from its own newest checkpoint). The same sweep may run in several processes (e.g.
one per GPU): a run another process trains is left to it and read back once it has finished
(``workdir_lock``); ``python -m dml_jax.run.experiments status --workdir=W`` tells each run's
state. A run directory trained with a config that differs in
a key train.py would refuse on a rerun (``workdir.check_rerun``) stops the sweep with one line
before any run; a finished run whose length (``num_train_steps``, ``num_epochs``) or
evaluation (``eval.*``) changed is rerun, resuming from its checkpoint. At the end it writes
into ``<workdir>``:

* ``sweep.json``: ``{'axes', 'seeds', 'runs': [{'point', 'name', 'seed', 'workdir',
  'results'}], 'summary': {name: report.aggregate(...)}}``;
* ``sweep.md``: the mean ± std table (sample std, ``ddof=1``; metrics in percent);
* ``sweep.png``: ``metric`` on ``protocol`` per grid point with ±std error bars (bars), or
  against the numeric axis ``x`` (one line per other combination) when ``--x`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from absl import logging
import ml_collections
import numpy as np

from dml_jax.run import cli
from dml_jax.run import overrides as overrides_lib
from dml_jax.run import workdir as workdir_lib
from dml_jax.run import workdir_lock
from dml_jax.evaluation import report
from dml_jax.run import config as config_lib

SWEEP_JSON = "sweep.json"


# ------------------------------------------------------------------------------- grid


def parse_grid(specs: Sequence[str]) -> list[tuple[tuple[str, ...], list[tuple[str, ...]]]]:
  """Parses grid axes: ``['a.b=1,2', 'x+y=u+v,w+z']`` -> ``[(('a.b',), [('1',), ('2',)]),
  (('x', 'y'), [('u', 'v'), ('w', 'z')])]`` (values stay strings).

  Raises:
    ValueError: an axis without ``=``, an empty value list, a repeated key, or a value with
      the wrong number of ``+`` parts (naming the axis).
  """
  axes, seen = [], set()
  for spec in specs:
    for part in (p.strip() for p in spec.split(";")):
      if not part:
        continue
      if "=" not in part:
        raise ValueError(f"Grid axis {part!r} has no '='; write key=v1,v2 or k1+k2=a1+a2,b1+b2.")
      lhs, rhs = part.split("=", 1)
      keys = tuple(k.strip() for k in lhs.split("+"))
      if not all(keys):
        raise ValueError(f"Grid axis {part!r} has an empty key.")
      for key in keys:
        if key in seen:
          raise ValueError(f"Grid key {key!r} appears in more than one axis.")
        seen.add(key)
      values = []
      for raw in (v.strip() for v in _split_outside_brackets(rhs, ",")):
        if not raw:
          raise ValueError(f"Grid axis {part!r} has an empty value.")
        parts = (tuple(p.strip() for p in _split_outside_brackets(raw, "+")) if len(keys) > 1
                 else (raw,))
        if len(parts) != len(keys):
          raise ValueError(f"Grid axis {part!r}: value {raw!r} has {len(parts)} '+' parts, the "
                           f"axis sets {len(keys)} keys {keys}.")
        values.append(parts)
      axes.append((keys, values))
  return axes


def _split_outside_brackets(text: str, sep: str) -> list[str]:
  """``text`` split at each ``sep`` outside brackets: a tuple value ``(512, 128)`` of a grid
  axis stays one value."""
  parts, depth, start = [], 0, 0
  for i, ch in enumerate(text):
    depth += (ch in "([{") - (ch in ")]}")
    if ch == sep and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  return parts + [text[start:]]


def grid_points(axes) -> list[dict[str, str]]:
  """The Cartesian product of :func:`parse_grid` axes as ``[{key: value_string}]`` in order
  (the first axis varies slowest). No axis gives one empty point."""
  points = []
  for combo in itertools.product(*[values for _, values in axes]):
    point = {}
    for (keys, _), parts in zip(axes, combo):
      point.update(dict(zip(keys, parts)))
    points.append(point)
  return points


def point_name(point: Mapping[str, str]) -> str:
  """A directory-safe name of a grid point: ``'loss.positive=easy,data.group_size=4'``
  (``'base'`` for the empty point)."""
  if not point:
    return "base"
  name = ",".join(f"{k}={v}" for k, v in point.items())
  return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", name)


def final_results_path(workdir: str, num_train_steps: int) -> str:
  """The final evaluation JSON whose presence marks a finished run."""
  return report.results_path(workdir, num_train_steps)


def read_final_results(workdir: str, num_train_steps: int) -> dict | None:
  """The final results of a finished run, or ``None`` if it has not finished."""
  path = final_results_path(workdir, num_train_steps)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)["results"]


def results_stale(config: ml_collections.ConfigDict, run_dir: str) -> bool:
  """Whether ``run_dir``'s final results (if any) are not those ``config`` asks for: a
  resumable key that :func:`changes_results` changed; a conflicting key raises
  (``workdir.check_rerun``)."""
  changes = workdir_lib.check_rerun(config, run_dir, override_flag="--set=")
  return any(changes_results(key) for key, _, _ in changes)


def changes_results(key: str) -> bool:
  """Whether a resumable config ``key`` changed on a finished run changes its final results
  (the run's length, its evaluation), so the sweep reruns it instead of reading them back."""
  return key in ("num_train_steps", "num_epochs") or key.startswith("eval.")


def summarize(runs: Sequence[Mapping]) -> dict:
  """``{point name: report.aggregate(results of its seeds)}`` in first-seen order."""
  by_name: dict[str, list] = {}
  for run in runs:
    by_name.setdefault(run["name"], []).append(run["results"])
  return {name: report.aggregate(results) for name, results in by_name.items()}


def format_summary_table(summary: Mapping, *, metrics: Sequence[str] | None = None) -> str:
  """Markdown ``| point | protocol | metric ... |`` table of mean ± std (fractions in %); a
  metric a protocol does not report (e.g. NMI+ where the clusters do not fit) is left empty."""
  first = next(iter(summary.values()))
  keys = list(metrics) if metrics else sorted(
      dict.fromkeys(k for p in first.values() for k in p), key=report.metric_sort_key)
  n = len(next(iter(next(iter(first.values())).values()))["values"])
  lines = [f"mean ± std over {n} seed(s)", "",
           "| point | protocol | " + " | ".join(keys) + " |",
           "|---|---|" + "---|" * len(keys)]
  for name, per_protocol in summary.items():
    for protocol, row in per_protocol.items():
      cells = []
      for k in keys:
        if k not in row:
          cells.append("")
          continue
        scale, digits = (100.0, 1) if report.is_fraction(k) else (1.0, 3)
        cells.append(f"{scale * row[k]['mean']:.{digits}f} ± {scale * row[k]['std']:.{digits}f}")
      lines.append(f"| {name} | {protocol} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot_summary(summary: Mapping, points: Mapping[str, Mapping[str, str]], *, path: str,
                 metric: str = "recall@1", protocol: str | None = None,
                 x: str | None = None, title: str = "") -> str:
  """PNG of ``metric`` (mean ± std) on ``protocol`` (default: the first) per grid point.

  Without ``x``: a bar per point. With ``x`` (a numeric grid key): ``metric`` against ``x``,
  one line per combination of the other keys.
  """
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  protocol = protocol or next(iter(next(iter(summary.values()))))
  scale = 100.0 if report.is_fraction(metric) else 1.0

  def stat(name):
    row = summary[name][protocol]
    if metric not in row:
      raise ValueError(f"--metric={metric!r} is not a metric of protocol {protocol!r}; its "
                       f"metrics: {', '.join(sorted(row, key=report.metric_sort_key))}.")
    cell = row[metric]
    return scale * cell["mean"], scale * cell["std"]

  fig, ax = plt.subplots(figsize=(7, 4.5), dpi=90)
  if x is None:
    names = list(summary)
    means, stds = zip(*(stat(n) for n in names))
    ax.bar(range(len(names)), means, yerr=stds, capsize=4, color="tab:blue", alpha=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([n.replace(",", "\n") for n in names], fontsize=7)
  else:
    lines: dict[str, list] = {}
    for name in summary:
      point = points[name]
      if x not in point:
        raise ValueError(f"--x={x!r} is not a grid key; grid keys: {sorted(point)}.")
      rest = ",".join(f"{k}={v}" for k, v in point.items() if k != x) or "all"
      lines.setdefault(rest, []).append((float(point[x]), *stat(name)))
    for label, rows in lines.items():
      rows.sort()
      xs, means, stds = map(np.asarray, zip(*rows))
      ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=label)
    ax.set_xlabel(x)
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
  ax.set_ylabel(f"{metric} on {protocol}" + (" (%)" if scale == 100.0 else ""))
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path)
  plt.close(fig)
  return path


def check_plot_options(points: Sequence[Mapping[str, str]],
                       configs: Sequence[ml_collections.ConfigDict], *,
                       protocol: str | None, x: str | None) -> None:
  """Checks :func:`plot_summary`'s ``protocol`` and ``x`` against the grid before any run.

  Raises:
    ValueError: ``x`` is not a grid key or has a non-numeric value, or ``protocol`` is not
      one of the runs' ``eval.splits`` (one line naming what is allowed).
  """
  if x is not None:
    keys = sorted({k for point in points for k in point})
    if x not in keys:
      raise ValueError(f"--x={x!r} is not a grid key; grid keys: {keys}.")
    for point in points:
      try:
        float(point[x])
      except ValueError:
        raise ValueError(f"--x={x!r} must be a numeric grid key (the line plot's axis), got "
                         f"{point[x]!r}.") from None
  for cfg in configs if protocol is not None else ():
    if protocol not in tuple(cfg.eval.splits):
      raise ValueError(f"--protocol={protocol!r} is not one of the runs' eval.splits: "
                       f"{', '.join(cfg.eval.splits)}.")


def sweep(config: ml_collections.ConfigDict, *, grid: Sequence[str] = (), seeds: int = 1,
          workdir: str, seed_offset: int = 0, overrides: Mapping[str, str] | None = None,
          metric: str = "recall@1", protocol: str | None = None, x: str | None = None,
          train_fn: Callable | None = None, log: Callable[[str], None] = print,
          stop=None, poll_seconds: float = 10.0) -> dict:
  """Runs ``grid x seeds`` sequentially (skipping finished runs) and aggregates them.

  A run another process trains (its workdir's lock, ``workdir_lock``: the same sweep started
  in several processes, e.g. one per GPU) is left to it; once the others are done, the sweep
  reads its results when it has finished, or trains it here when that process left it
  unfinished (stopped, killed).

  Args:
    config: the base config (``overrides.load_config_file``).
    grid: axis specs (:func:`parse_grid`).
    seeds: number of seeds per point (``seed_offset .. seed_offset + seeds - 1``).
    workdir: the sweep directory.
    seed_offset: first seed.
    overrides: fixed ``key -> value string`` overrides applied before the grid.
    metric, protocol, x: what :func:`plot_summary` plots.
    train_fn: ``train_fn(config, workdir) -> results``; default
      ``training.train_and_evaluate`` without a progress bar.
    log: progress lines.
    stop: a ``signals.StopFlag``; set while waiting for another process's runs, the sweep
      stops (:class:`SweepInterrupted`).
    poll_seconds: how often it looks at the runs another process trains.

  Returns:
    The ``sweep.json`` content plus ``'table'``, ``'json'``, ``'md'``, ``'png'`` paths/text.
  """
  if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
    raise ValueError(f"seeds must be a positive integer, got {seeds!r}.")
  if isinstance(seed_offset, bool) or not isinstance(seed_offset, int) or seed_offset < 0:
    raise ValueError(f"seed_offset must be an integer >= 0 (the first seed), got "
                     f"{seed_offset!r}.")
  # pylint: disable=import-outside-toplevel  (JAX and the training stack, when a sweep runs)
  from dml_jax.run import training
  if train_fn is None:

    def train_fn(cfg, wd):
      return training.train_and_evaluate(cfg, wd, show_progress=False)

  base = overrides_lib.apply(config, overrides or {}, from_strings=True)
  axes = parse_grid(grid)
  points = grid_points(axes)
  configs = [(point, overrides_lib.apply(base, point, from_strings=True))
             for point in points]
  for _, cfg in configs:   # every point checked before the first run starts
    config_lib.validate(cfg)
    config_lib.validate_training(cfg)
    config_lib.make_objective(cfg)
  check_plot_options(points, [cfg for _, cfg in configs], protocol=protocol, x=x)
  # every run directory too: one trained with another config is refused, one whose
  # evaluation or length changed is rerun (resumed) instead of skipped
  stale = {}
  for point, cfg in configs:
    for s in range(seeds):
      run_dir = os.path.join(workdir, point_name(point), f"seed_{seed_offset + s}")
      run_cfg = overrides_lib.apply(cfg, {"seed": seed_offset + s})
      stale[run_dir] = results_stale(run_cfg, run_dir)
      workdir_lib.check_not_past_the_end(run_dir, run_cfg)   # a shortened rerun, refused now
  runs, pending, total = [], {}, len(points) * seeds

  def attempt(run_cfg, run_dir, first: bool = True) -> dict | None:
    """Trains (or resumes) the run; ``None`` while another process trains it (said once)."""
    try:
      train_fn(run_cfg, run_dir)
    except workdir_lock.WorkdirInUseError as e:
      if first:
        log(f"{run_dir}: {e.holder} is training it; the sweep takes the other runs first")
      return None
    last = workdir_lib.final_step(run_dir, run_cfg)
    results = read_final_results(run_dir, last)
    if results is None:
      raise RuntimeError(f"Run {run_dir} ended without writing "
                         f"{final_results_path(run_dir, last)}.")
    return results

  for point, cfg in configs:
    name = point_name(point)
    for s in range(seeds):
      seed = seed_offset + s
      run_dir = os.path.join(workdir, name, f"seed_{seed}")
      run_cfg = overrides_lib.apply(cfg, {"seed": seed})
      results = (read_final_results(run_dir, workdir_lib.final_step(run_dir, run_cfg))
                 if os.path.exists(run_dir) and not stale[run_dir] else None)
      if results is None:
        log(f"[{len(runs) + 1}/{total}] training {name} seed {seed} -> {run_dir}")
        results = attempt(run_cfg, run_dir)
        if results is None:
          pending[len(runs)] = run_cfg
      else:
        log(f"[{len(runs) + 1}/{total}] {name} seed {seed}: finished, skipped")
      runs.append({"point": point, "name": name, "seed": seed, "workdir": run_dir,
                   "results": results})
  if pending:
    log(f"waiting for {len(pending)} run(s) that another process trains (looking every "
        f"{poll_seconds:g} s; a run it leaves unfinished is trained here)")
  said = time.monotonic()
  while pending:
    if time.monotonic() - said >= WAIT_REPORT_SECONDS:
      log("still waiting: " + ", ".join(run_progress(runs[i]["workdir"], cfg)
                                        for i, cfg in pending.items()))
      said = time.monotonic()
    for i, run_cfg in list(pending.items()):
      run_dir = runs[i]["workdir"]
      results = (None if results_stale(run_cfg, run_dir) else
                 read_final_results(run_dir, workdir_lib.final_step(run_dir, run_cfg)))
      if results is not None:
        log(f"{run_dir}: finished by the other process")
      else:
        results = attempt(run_cfg, run_dir, first=False)
      if results is not None:
        runs[i]["results"] = results
        del pending[i]
    if pending:
      _wait(poll_seconds, stop)
  summary = summarize(runs)
  table = format_summary_table(summary)
  os.makedirs(workdir, exist_ok=True)
  out = {"axes": [[list(k), [list(v) for v in vals]] for k, vals in axes], "seeds": seeds,
         "seed_offset": seed_offset, "overrides": dict(overrides or {}), "runs": runs,
         "summary": summary}
  # whole files, also where the same sweep runs in several processes (each writes the same)
  json_path = os.path.join(workdir, SWEEP_JSON)
  report.write_text_atomic(json_path, json.dumps(out, indent=2, sort_keys=True))
  md_path = os.path.join(workdir, "sweep.md")
  report.write_text_atomic(md_path, table + "\n")
  png = os.path.join(workdir, "sweep.png")
  os.replace(plot_summary(summary, {point_name(p): p for p in points},
                          path=f"{png}.{os.getpid()}.tmp.png", metric=metric, protocol=protocol,
                          x=x, title=os.path.basename(os.path.abspath(workdir))), png)
  return {**out, "table": table, "json": json_path, "md": md_path, "png": png}


# how often a sweep waiting for another process's runs says where they are
WAIT_REPORT_SECONDS = 300.0


def run_progress(run_dir: str, config: ml_collections.ConfigDict) -> str:
  """``'<run_dir> at step 340 of 1500'``: the newest step ``metrics.jsonl`` logged (0 before the
  first log step) and the run's final step (``'?'`` before its ``run.json``, with epochs)."""
  try:
    final = workdir_lib.final_step(run_dir, config)
  except ValueError:
    final = "?"
  return f"{run_dir} at step {newest_logged_step(run_dir)} of {final}"


def newest_logged_step(run_dir: str) -> int:
  """The newest step of ``run_dir``'s ``metrics.jsonl`` (0 before the first log step)."""
  return max((row["step"] for row in workdir_lib.read_metrics(run_dir)), default=0)


def status(workdir: str) -> str:
  """The state of every run folder ``<workdir>/<point>/seed_<s>`` of a sweep, read without
  taking a lock (``python -m dml_jax.run.experiments status``): a markdown table (run,
  ``finished`` / ``training: <holder>`` / ``stopped at checkpoint N`` / ``not started``, the
  newest logged step of the final one) and a line of counts.

  Raises:
    ValueError: ``workdir`` holds no run folder.
  """
  rows, counts = [], {}
  for run_dir in sorted(glob.glob(os.path.join(glob.escape(workdir), "*", "seed_*"))):
    if not os.path.isdir(run_dir):
      continue
    tree = workdir_lib.read_config_json(run_dir)
    final = "?"
    if tree is not None:
      with contextlib.suppress(ValueError):
        final = workdir_lib.final_step(run_dir, ml_collections.ConfigDict(tree))
    holder = workdir_lock.live_holder(run_dir)
    newest = workdir_lib.newest_checkpoint_step(run_dir)
    if holder is not None:
      kind, state = "training", f"training: {holder}"
    elif final != "?" and os.path.exists(final_results_path(run_dir, final)):
      kind = state = "finished"
    elif newest is not None:
      kind, state = "stopped", f"stopped at checkpoint {newest}"
    else:
      kind = state = "not started"
    counts[kind] = counts.get(kind, 0) + 1
    rows.append(f"| {os.path.relpath(run_dir, workdir)} | {state} | "
                f"{newest_logged_step(run_dir)} / {final} |")
  if not rows:
    raise ValueError(f"{workdir} holds no run folder (a sweep trains in "
                     "<workdir>/<point>/seed_<s>).")
  return "\n".join(["| run | state | step |", "|---|---|---|", *rows, "",
                    f"{len(rows)} runs: " + ", ".join(f"{n} {k}" for k, n in counts.items())])


class SweepInterrupted(Exception):
  """SIGINT / SIGTERM while the sweep waited for runs that another process trains."""

  def __init__(self, signum: int):
    super().__init__("interrupted while waiting for the runs another process trains; rerun "
                     "the same command to resume")
    self.signum = signum


def _wait(seconds: float, stop) -> None:
  """Sleeps ``seconds``, or raises :class:`SweepInterrupted` as soon as ``stop`` is set."""
  end = time.monotonic() + seconds
  while True:
    if stop is not None and stop.is_set():
      raise SweepInterrupted(stop.signum)
    if (left := end - time.monotonic()) <= 0:
      return
    time.sleep(min(left, 0.2))


# ------------------------------------------------------------------------------- CLI

PROGRAM = "python -m dml_jax.run.experiments"


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog=PROGRAM,
                                   description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("sweep", help="run a grid of overrides x seeds and aggregate")
  p.add_argument("--config", required=True, help="configs/X.py[:arg]")
  p.add_argument("--grid", action="append", default=[], help="key=v1,v2 or k1+k2=a1+a2,b1+b2")
  p.add_argument("--seeds", type=int, default=1)
  p.add_argument("--seed_offset", type=int, default=0)
  p.add_argument("--workdir", required=True)
  p.add_argument("--set", action="append", default=[], dest="overrides",
                 help="fixed override key=value (repeatable)")
  p.add_argument("--metric", default="recall@1")
  p.add_argument("--protocol", default=None)
  p.add_argument("--x", default=None, help="numeric grid key for a line plot")
  p.add_argument("--module", action="append", default=[],
                 help="a module to import first (own objective; dotted name or .py path)")
  p = sub.add_parser("status", help="the state of each run of a sweep folder (finished, "
                     "training and where, stopped), while the sweep runs too")
  p.add_argument("--workdir", required=True)
  args = parser.parse_args(argv)
  if args.command == "status":
    try:
      print(status(args.workdir))
    except cli.USER_ERRORS as e:
      cli.fail(PROGRAM, str(e))
    return 0
  try:
    overrides = overrides_lib.parse_assignments(args.overrides)
  except ValueError as e:
    parser.error(str(e))
  # pylint: disable=import-outside-toplevel  (the training stack, once the flags are read)
  from dml_jax.run import signals
  from dml_jax.run import training
  cli.quiet_logs()
  logging.set_verbosity(logging.INFO)   # each run's log line per log step: the sweep's progress
  try:
    modules = overrides_lib.user_modules(args.module)
    overrides_lib.import_user_modules(modules)
    config = overrides_lib.load_config_file(args.config)
    config.user_modules = overrides_lib.user_modules(config.get("user_modules", ()), modules)
    overrides_lib.import_user_modules(config.user_modules, from_config=True)
    # Ctrl-C / SIGTERM: the running point saves a checkpoint of its step and the sweep stops;
    # the same command resumes it
    with signals.stop_on_signals() as stop:
      out = sweep(config, grid=args.grid, seeds=args.seeds,
                  workdir=args.workdir, seed_offset=args.seed_offset, overrides=overrides,
                  metric=args.metric, protocol=args.protocol, x=args.x, stop=stop,
                  train_fn=lambda cfg, wd: training.train_and_evaluate(
                      cfg, wd, show_progress=False, stop=stop))
  except (training.TrainingInterrupted, SweepInterrupted) as e:
    cli.fail(PROGRAM, str(e), code=128 + e.signum)   # "... rerun the same command to resume"
  except cli.USER_ERRORS as e:
    cli.fail(PROGRAM, str(e))
  print(out["table"])
  print(f"Written: {out['json']}, {out['md']}, {out['png']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
