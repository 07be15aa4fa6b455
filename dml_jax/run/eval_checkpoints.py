"""Evaluating a workdir's checkpoints, the logic of ``eval.py``: the newest or a given step,
every step (learning curves, best checkpoint by a validation metric), and several workdirs
(mean ± std over seeds). Restores the model and the evaluation data with
``restore.restore_model`` from the workdir's ``config.json``: no sampler, objective or
optimizer is built. The evaluated image splits come from the evaluation cache
(``eval.cache``, ``eval_input``): after ``train.py`` on the same workdir they are mapped from
its ``data_cache/``, not decoded.

``overrides`` (eval.py's ``--set=eval.KEY=VALUE``) evaluate a checkpoint under other
evaluation settings than the run's (other protocols, K list, metrics, similarity, k-means
restarts): their results go to ``eval_step_<N>.<tag>.json`` (``overrides.evaluation_tag``)
with the settings recorded in it, so the run's own ``eval_step_<N>.json``, its drawings and
its TensorBoard curves stay as they are."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import logging

from dml_jax.evaluation import compute
from dml_jax.evaluation import projector
from dml_jax.evaluation import protocols as protocols_lib
from dml_jax.evaluation import report
from dml_jax.run import checkpointing
from dml_jax.run import config as config_lib
from dml_jax.run import eval_input
from dml_jax.run import overrides as overrides_lib
from dml_jax.run import restore
from dml_jax.run import summary as summary_lib
from dml_jax.run import workdir as workdir_lib
from dml_jax.run import writers


# What eval.py's --output holds, by mode: the JSON's keys and the file written beside it.
OUTPUTS = {"all_steps": (("workdir", "steps", "best"), ".png"),
           "workdirs": (("workdirs", "steps", "runs", "summary"), ".md")}


def check_output(path: str, mode: str) -> None:
  """``path`` and the file beside it (``OUTPUTS[mode]``) may be written: each is absent, or
  ``path`` is an earlier result of that mode (then both are replaced). Creates the folder.

  Raises:
    ValueError: naming the folder that cannot be created, or the file that cannot be written
      or holds something else (a run's ``config.json``, a figure of the user's), which is
      left as it is.
  """
  keys, beside = OUTPUTS[mode]
  folder = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError as e:
    raise ValueError(f"--output={path}: its folder cannot be created "
                     f"({e.strerror or e}).") from None
  try:
    with open(path) as f:
      earlier = set(keys) <= set(json.load(f))
  except (OSError, ValueError, TypeError):   # absent, a folder, not JSON, not an object
    earlier = False
  for name in (path, os.path.splitext(path)[0] + beside):
    if os.path.lexists(name) and not os.path.isdir(name) and not earlier:
      raise ValueError(f"--output={path}: {name} exists and is not an earlier eval.py result; "
                       "it is left as it is: choose another --output.")
  existed = os.path.exists(path)
  try:
    with open(path, "a"):   # can be written (nothing in it is changed)
      pass
  except OSError as e:
    raise ValueError(f"--output={path} cannot be written ({e.strerror or e}).") from None
  if not existed:
    os.remove(path)


def print_line(line: str) -> None:
  """Prints ``dml_jax: <line>`` on process 0 (eval.py's lines about its input)."""
  if workdir_lib.is_main_process():
    print(f"dml_jax: {line}", flush=True)


# The workdir's config.json with this machine's settings (restore.load_config).
load_config = restore.load_config


def evaluate_checkpoint(workdir: str, *, step: int | None = None,
                        plot: bool | None = None, show_progress: bool = False,
                        protocols: tuple[str, ...] | None = None, grid: dict | None = None,
                        export_embeddings: bool = False,
                        tensorboard: bool | None = None,
                        machine: Mapping[str, Any] | None = None,
                        overrides: Sequence[str] = ()) -> tuple[int, dict]:
  """Restores a checkpoint of ``workdir`` (newest readable when ``step`` is None) and
  evaluates it as ``train_and_evaluate`` does at the end (:func:`evaluate_with_config`);
  writes ``eval_step_<N>.json``.

  Args:
    workdir: a directory written by ``train.py``.
    step: the checkpoint step; ``None`` means the newest readable one.
    plot: write the embedding PNGs; ``None`` means ``config.eval.plot``.
    show_progress: progress bars for the embedding and the neighbour search.
    protocols: evaluate these instead of ``config.eval.splits``.
    grid: the retrieval grid (``retrieval_grid.write_grid`` keywords ``num_queries``, ``k``,
      ``mode``, ``seed``); ``None``: the config's (``eval.retrieval_grid``), ``{}``: none.
    export_embeddings: write the first protocol's embeddings for TensorBoard's projector and
      as ``.npz`` (``projector.export``).
    tensorboard: log the metrics, histograms and images to ``<workdir>/tensorboard/eval``;
      ``None``: ``config.log.tensorboard``.
    machine: this machine's input settings (:func:`load_config`), e.g. decoding threads.
    overrides: ``'eval.KEY=VALUE'`` strings: evaluate under these settings instead of the
      run's, into ``eval_step_<N>.<tag>.json``, drawing nothing and logging nothing to
      TensorBoard (the module docstring); no ``grid`` or ``export_embeddings`` with them.

  Returns:
    ``(step, {protocol: {metric: value}})``.

  Raises:
    FileNotFoundError: ``workdir`` has no config or no checkpoint.
    ValueError: ``step`` does not exist, or a bad evaluation setting (named).
  """
  model, tag, settings = model_with_settings(workdir, machine, overrides, grid,
                                             export_embeddings)
  with eval_writer(model.config, workdir, False if tag else tensorboard) as writer:
    (restored_step, results), = evaluate_checkpoints(
        model, workdir, steps=None if step is None else (step,),
        plot=False if tag else plot, show_progress=show_progress, protocols=protocols,
        grid={} if tag else grid, export_embeddings=export_embeddings, writer=writer,
        results_tag=tag, settings=settings).items()
  return restored_step, results


def model_with_settings(workdir: str, machine, overrides: Sequence[str], grid: dict | None,
                        export_embeddings: bool) -> tuple[Any, str, dict]:
  """``(model, tag, settings)``: the untrained model of ``workdir``'s config under the
  ``overrides`` (:func:`with_settings`), ready for its checkpoints. Refuses a retrieval grid
  or an embedding export with ``overrides``: both draw the run's own settings into the run's
  own files."""
  config, tag, settings = with_settings(load_config(workdir, machine), overrides)
  if tag and (grid or export_embeddings):
    raise ValueError("--set evaluates under other settings than the run's; the retrieval grid "
                     "and the embedding export draw the run's own: give them without --set.")
  return restore.initial_model(config, pretrained=False), tag, settings


def with_settings(config, overrides: Sequence[str]) -> tuple[Any, str, dict]:
  """``(config, tag, settings)``: ``config`` with eval.py's ``--set`` ``overrides``
  (``'eval.KEY=VALUE'``) in place of the run's values, the results-file tag they make
  (``''`` without any) and their typed values (``overrides.evaluation_overrides``)."""
  settings = overrides_lib.evaluation_overrides(config, overrides) if overrides else {}
  for key, value in settings.items():
    config.eval[key.split(".", 1)[1]] = value
  return config, overrides_lib.evaluation_tag(settings) if settings else "", settings


def results_file(workdir: str, step: int, overrides: Sequence[str] = ()) -> str:
  """The file :func:`evaluate_checkpoint` of ``step`` with these ``overrides`` wrote its
  results to: ``eval_step_<N>.json``, or ``eval_step_<N>.<tag>.json`` with overrides."""
  _, tag, _ = with_settings(workdir_lib.load_config(workdir), overrides)
  return report.results_path(workdir, step, tag)


def extra_outputs(workdir: str, step: int, *, grid: dict | None = None,
                  export_embeddings: bool = False) -> list[str]:
  """The files besides ``eval_step_<N>.json`` that :func:`evaluate_checkpoint` of ``step``
  with these ``grid`` and ``export_embeddings`` wrote into ``workdir``: its retrieval grid
  (not one of another mode an earlier command left), the embeddings ``.npz`` and the
  projector config, those that exist."""
  config = workdir_lib.load_config(workdir)
  grid = compute.grid_options(config) if grid is None else grid
  paths = []
  if grid:
    paths.append(compute.grid_path(workdir, config.eval.splits[0], step,
                                   grid.get("mode", "random")))
  if export_embeddings:
    paths += [os.path.join(workdir, f"embeddings_step_{step}.npz"),
              os.path.join(workdir, "tensorboard", "eval", projector.CONFIG_FILE)]
  return [p for p in paths if os.path.exists(p)]


def eval_writer(config, workdir: str, tensorboard: bool | None) -> writers.MetricWriter:
  """eval.py's writer: TensorBoard run ``<workdir>/tensorboard/eval`` when ``tensorboard``
  (``None``: ``config.log.tensorboard``); never metrics.jsonl or W&B, which belong to
  training. Earlier evaluations stay: each eval.py adds its steps to those of the earlier ones
  (nothing is purged; a step evaluated again shows its equal values twice)."""
  on = config.get("log", {}).get("tensorboard", False) if tensorboard is None else tensorboard
  return writers.make_writer(config, workdir, run="eval", jsonl=False, start_step=None,
                             backends=("tensorboard",) if on else ())


def checkpoint_steps(workdir: str) -> list[int]:
  """The checkpointed steps of ``workdir``, ascending.

  Raises:
    FileNotFoundError: no checkpoint at all (the message says how to make one).
  """
  manager = checkpointing.make_manager(workdir, read_only=True)
  try:
    available = checkpointing.steps(manager)
  finally:
    manager.close()
  if not available:
    raise FileNotFoundError(
        f"No checkpoint in {checkpointing.checkpoint_dir(workdir)}: train first with "
        f"python train.py --config=<config> --workdir={workdir}")
  return available


def evaluate_checkpoints(model: restore.RestoredModel, workdir: str, *, steps=None,
                         plot: bool | None = False, show_progress: bool = False,
                         protocols: tuple[str, ...] | None = None, grid: dict | None = None,
                         export_embeddings: bool = False,
                         writer: writers.MetricWriter | None = None,
                         log: Callable[[str], None] | None = print_line,
                         results_tag: str = "",
                         settings: Mapping[str, Any] | None = None) -> dict[int, dict]:
  """Evaluates several checkpoints of ``workdir`` with one ``model`` (data and model built
  once); writes ``eval_step_<N>.json`` for each.

  Args:
    model: ``restore.initial_model(config, pretrained=False)`` of the workdir's config; its
      variables are replaced by each checkpoint's.
    workdir: a directory written by ``train.py``.
    steps: ``None`` (the newest readable checkpoint), ``'all'`` (every checkpoint; one that a
      run training there deletes before its turn is skipped, said through ``log``) or a
      sequence of steps.
    plot: write the embedding PNGs; ``None`` means ``config.eval.plot``.
    show_progress: progress bars.
    protocols: evaluate these instead of ``config.eval.splits``.
    grid, export_embeddings, machine: as :func:`evaluate_checkpoint`, at every step.
    writer: receives each step's metrics, histograms and images.
    log: receives the line saying which splits the evaluation cache holds (``eval.cache``,
      ``eval_input.cached_splits``, built once for all the steps) and its progress lines
      (``None``: silent).
    results_tag, settings: write ``eval_step_<N>.<results_tag>.json`` recording ``settings``
      (:func:`with_settings`) instead of ``eval_step_<N>.json``.

  Returns:
    ``{step: {protocol: {metric: value}}}`` in increasing step order.

  Raises:
    FileNotFoundError: no checkpoint. ValueError: a missing or unreadable step, or a bad
      evaluation setting (checked before anything is restored).
  """
  config, splits = model.config, model.splits
  config_lib.validate(config, splits)
  for protocol in protocols or ():
    protocols_lib.parse_protocol(protocol, splits)
  if (grid or export_embeddings) and not (protocols or tuple(config.eval.splits)):
    raise ValueError(f"{'the retrieval grid' if grid else 'the embedding export'} draws the "
                     "first evaluation protocol, and the run's config.eval.splits is empty "
                     "(no evaluation).")
  if grid:
    protocols_lib.check_retrieval_grid((protocols or tuple(config.eval.splits))[0],
                                       splits, num_queries=grid["num_queries"],
                                       mode=grid.get("mode", "random"),
                                       k=grid.get("k", 8))
  plot = config.eval.plot if plot is None else plot
  embed_fn = model.embed_fn()
  available = checkpoint_steps(workdir)
  wanted = [None] if steps is None else available if steps == "all" else sorted(steps)
  history, eval_splits = {}, None
  for step in wanted:
    try:
      restored = model.at(workdir, step)
    except Exception:  # pylint: disable=broad-except
      if steps != "all" or step in checkpoint_steps(workdir):
        raise
      # a run training in the workdir deleted it since (max_checkpoints_to_keep)
      if log:
        log(f"step {step}: deleted since it was listed (max_checkpoints_to_keep of the run "
            "training there); skipped")
      continue
    if eval_splits is None:   # after the first restore: a missing step fails before decoding
      eval_splits = eval_input.cached_splits(config, splits, protocols=protocols,
                                             workdir=workdir, log=log)
    cache = {}
    history[restored.step] = compute.evaluate_with_config(
        config, eval_splits, restored.variables, embed_fn, workdir=workdir, step=restored.step,
        plot=plot, show_progress=show_progress, protocols=protocols, writer=writer, grid=grid,
        embedding_cache=cache, results_tag=results_tag, settings=settings)
    if writer is not None:
      writer.scalars(restored.step, report.flatten(history[restored.step]))
    if export_embeddings and workdir_lib.is_main_process():
      projector.export(cache, eval_splits, workdir=workdir, step=restored.step,
                       protocol=(protocols or tuple(config.eval.splits))[0])
  if not history:
    raise ValueError(f"every checkpoint of {workdir} listed at the start ({available}) was "
                     "deleted before its turn by the run training there; evaluate again.")
  return history


def evaluate_all_steps(workdir: str, *, best_by: str | None = None,
                       output: str | None = None, show_progress: bool = False,
                       grid: dict | None = None, export_embeddings: bool = False,
                       machine: Mapping[str, Any] | None = None,
                       overrides: Sequence[str] = ()) -> dict:
  """Evaluates every checkpoint of ``workdir`` (``eval.py --all_steps``).

  Writes ``eval_step_<N>.json`` per step, ``output`` (default
  ``<workdir>/eval_all_steps.json``: ``{'steps': {N: results}, 'best': ...}``) and the
  learning curves next to it (same name, ``.png``): the training loss of metrics.jsonl and
  every metric against the step, on one figure.

  Args:
    workdir: a directory written by ``train.py``.
    best_by: ``'PROTOCOL/METRIC'`` selects the best checkpoint on that protocol, which must
      not use a test split (``report.parse_selection``); it is evaluated even when
      ``config.eval.splits`` lacks it.
    output: the JSON path.
    show_progress: progress bars.
    grid, export_embeddings, overrides: as :func:`evaluate_checkpoint`, at every step; with
      ``overrides`` the default ``output`` is ``eval_all_steps.<tag>.json``.

  Returns:
    ``{'steps': {step: results}, 'best': None or {'step', 'protocol', 'metric', 'value'},
    'json': path, 'png': path}``.
  """
  selection = protocols_lib.parse_selection(best_by) if best_by else None
  model, tag, settings = model_with_settings(workdir, machine, overrides, grid,
                                             export_embeddings)
  protocols = tuple(model.config.eval.splits)
  if selection and selection[0] not in protocols:
    protocols += (selection[0],)
  with eval_writer(model.config, workdir, False if tag else None) as writer:
    history = evaluate_checkpoints(model, workdir, steps="all", plot=False,
                                   show_progress=show_progress, protocols=protocols,
                                   grid={} if tag else grid,
                                   export_embeddings=export_embeddings, writer=writer,
                                   results_tag=tag, settings=settings)
  best = None
  if selection:
    step = protocols_lib.best_step(history, protocol=selection[0], metric=selection[1])
    best = {"step": step, "protocol": selection[0], "metric": selection[1],
            "value": history[step][selection[0]][selection[1]]}
  output = output or os.path.join(workdir, f"eval_all_steps{'.' + tag if tag else ''}.json")
  png = os.path.splitext(output)[0] + ".png"
  if workdir_lib.is_main_process():
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
      json.dump({"workdir": workdir, "steps": {str(s): r for s, r in history.items()},
                 "best": best, **({"settings": settings} if settings else {})}, f, indent=2,
                sort_keys=True)
    train = {"train/loss": report.train_curve(workdir_lib.read_metrics(workdir))}
    report.plot_curves(history, path=png, title=workdir, train=train)
  return {"steps": history, "best": best, "json": output, "png": png}


def evaluate_workdirs(workdirs, *, step: int | None = None, output: str | None = None,
                      show_progress: bool = False,
                      machine: Mapping[str, Any] | None = None,
                      overrides: Sequence[str] = ()) -> dict:
  """Evaluates the newest (or ``step``) checkpoint of each workdir, e.g. one per seed, and
  aggregates mean ± std (``eval.py --workdirs=a,b,c``).

  Writes ``output`` (JSON: ``{'workdirs', 'steps', 'runs', 'summary'}``, and ``settings``
  with ``overrides``, which each run is evaluated under as :func:`evaluate_checkpoint`) and
  the markdown table next to it (same name, ``.md``) when ``output`` is given.

  Returns:
    ``{'workdirs', 'steps', 'runs', 'summary', 'table'}`` (``summary`` as
    ``report.aggregate``).

  Raises:
    ValueError: no workdir, a repeated one, or runs evaluated differently (named).
  """
  workdirs = [w for w in workdirs if w]
  if not workdirs:
    raise ValueError("--workdirs names no workdir; give a comma-separated list.")
  if len(set(workdirs)) != len(workdirs):
    raise ValueError(f"--workdirs lists a workdir more than once: {workdirs}.")
  settings = {}
  for workdir in workdirs:  # Fail before any long evaluation.
    _, _, settings = with_settings(workdir_lib.load_config(workdir), overrides)
    checkpoint_steps(workdir)
  steps, runs = [], []
  for workdir in workdirs:
    restored_step, results = evaluate_checkpoint(workdir, step=step, plot=False,
                                                 show_progress=show_progress, machine=machine,
                                                 overrides=overrides)
    steps.append(restored_step)
    runs.append(results)
  try:
    summary = report.aggregate(runs)
  except ValueError as e:
    raise ValueError(f"{e} (runs in the order of --workdirs: {workdirs})") from None
  table = report.format_aggregate_table(summary)
  differences = config_differences(workdirs)
  if differences:
    logging.warning("The runs differ in more than the seed (%s): their mean ± std mixes "
                    "different runs; eval.py --side_by_side shows each run.",
                    "; ".join(differences))
  if output and workdir_lib.is_main_process():
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
      json.dump({"workdirs": workdirs, "steps": steps, "runs": runs, "summary": summary,
                 **({"settings": settings} if settings else {})}, f, indent=2, sort_keys=True)
    with open(os.path.splitext(output)[0] + ".md", "w") as f:
      f.write(f"mean ± std over {len(runs)} runs (fractions in percent)\n\n{table}\n")
  return {"workdirs": workdirs, "steps": steps, "runs": runs, "summary": summary,
          "table": table, "differences": differences,
          "runs_table": report.format_runs_table(dict(zip(workdirs, runs)))}


def config_differences(workdirs) -> list[str]:
  """The config keys (besides ``seed`` and the keys a rerun may change that leave the numbers
  as they are: ``summary.compared_key``) in which the runs of ``workdirs`` differ, as
  ``'key: v1 (run 0), v2 (run 1)'``."""
  trees = [workdir_lib.read_config_json(w) for w in workdirs]
  keys = sorted({k for t in trees[1:] for k, _, _ in workdir_lib.config_changes(trees[0], t)
                 if k != "seed" and summary_lib.compared_key(k)})
  flat = [workdir_lib.flatten(t) for t in trees]
  return [f"{k}: " + ", ".join(f"{f.get(k)!r} (run {i})" for i, f in enumerate(flat))
          for k in keys]
