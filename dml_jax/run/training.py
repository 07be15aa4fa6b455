"""Training: train state, one jitted train step, and ``train_and_evaluate(config, workdir)``.

The train state is a plain dict pytree (what Orbax saves)::

  {'step': int32 [], 'params': nnx.State, 'batch_stats': nnx.State,
   'objective': dict (beta, proxies, ...), 'opt_state': optax state,
   'memory': dict (only with config.memory.size > 0; see dml_jax.memory)}

Determinism: the batch of step ``t`` and the PRNG key of step ``t`` are pure functions of
``(config.seed, t)``, so a run killed at any point and resumed from its last checkpoint
reproduces the uninterrupted run exactly.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Mapping

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from dml_jax import data as data_lib
from dml_jax import memory as memory_lib
from dml_jax import objectives
from dml_jax import optimizers
from dml_jax.run import overrides
from dml_jax import parallel
from dml_jax import similarity as similarity_lib
from dml_jax.data import cache as cache_lib
from dml_jax.data import pipeline
from dml_jax.evaluation import compute
from dml_jax.evaluation import protocols as protocols_lib
from dml_jax.evaluation import report
from dml_jax.evaluation import triplet_scatter
from dml_jax.run import checkpointing
from dml_jax.run import config as config_lib
from dml_jax.run import eval_input
from dml_jax.run import restore
from dml_jax.run import signals
from dml_jax.run import train_input
from dml_jax.run import workdir as workdir_lib
from dml_jax.run import workdir_lock
from dml_jax.run import writers


class NonFiniteLossError(FloatingPointError):
  """The loss or the gradient became NaN or inf; the state was not updated."""


class TrainingInterrupted(Exception):
  """SIGINT / SIGTERM stopped training after a checkpoint of the current step was saved."""

  def __init__(self, step: int, signum: int):
    super().__init__(f"interrupted at step {step}; rerun the same command to resume")
    self.step, self.signum = step, signum


# ------------------------------------------------------------------------ train state


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything static a run needs: built once from the config."""
  config: ml_collections.ConfigDict
  splits: dict
  sampler: Any
  objective: objectives.Objective
  train_graphdef: Any
  eval_graphdef: Any
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  init_state: dict
  mesh: jax.sharding.Mesh
  num_train_steps: int


def resolve_num_train_steps(config: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
  """``num_epochs * steps_per_epoch`` when ``config.num_epochs > 0``, else
  ``config.num_train_steps``."""
  if config.num_epochs:
    return int(config.num_epochs) * int(steps_per_epoch)
  return int(config.num_train_steps)


def build(config: ml_collections.ConfigDict) -> Setup:
  """Loads data, builds the model, objective and optimizer, and the initial train state.

  First imports ``config.user_modules`` (a user's registered objectives), so that every
  binary that builds a workdir's config finds them.
  """
  overrides.import_user_modules(config.get("user_modules", ()), from_config=True)
  config_lib.validate(config)
  config_lib.validate_training(config)
  objective = config_lib.make_objective(config)   # its values checked before the data
  mesh = parallel.make_mesh(config.num_devices)
  parallel.check_batch_size(config.batch_size, mesh)
  splits = restore.load_splits(config)
  train = splits["train"]
  sampler = data_lib.NPerClassSampler(
      train.labels, batch_size=config.batch_size, group_size=config.data.group_size,
      seed=config.seed, small_class=config.data.small_class,
      epoch=config.data.epoch)
  if config.memory.size and not objective.support.references:
    raise ValueError(f"memory.size={config.memory.size}: objective {objective.name!r} takes no "
                     "reference set (registered without references=True); set memory.size=0.")
  memory_lib.check(config.memory.size, config.memory.start_step, batch_size=config.batch_size,
                   num_examples=len(train.labels))

  key = jax.random.key(config.seed)
  model_key, objective_key = jax.random.split(key)
  model = restore.make_model(config, train.images.shape, model_key)
  model.train()
  train_graphdef, params, batch_stats = nnx.split(model, nnx.Param, ...)
  model.eval()
  eval_graphdef, _, _ = nnx.split(model, nnx.Param, ...)

  num_classes = int(np.max(train.labels)) + 1
  objective_params = objective.init(objective_key, num_classes=num_classes,
                                    dim=config.model.embedding_dim)
  # an objective that takes no reference set, or (one of the user's own) returns no scalar
  # loss, says so now, not mid-run
  emb = jnp.zeros((config.batch_size, config.model.embedding_dim), jnp.float32)
  labels = jnp.zeros((config.batch_size,), jnp.int32)
  mem = memory_lib.init(config.memory.size, config.model.embedding_dim)
  extra = (lambda e, y: {"references": memory_lib.references(mem, e, y)}
           if config.memory.size else {})
  out = jax.eval_shape(lambda p, e, y, k: objective.apply(p, e, y, rng=k, **extra(e, y)),
                       objective_params, emb, labels, objective_key)
  if not (isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[1], Mapping)):
    raise ValueError(f"objective {objective.name!r} returns {_structure(out)}; apply must "
                     "return a pair (loss, aux): a scalar loss and a dict of scalars ({} for "
                     "none).")
  if (shape := getattr(out[0], "shape", type(out[0]).__name__)) != ():
    raise ValueError(f"objective {objective.name!r} returns a loss of shape {shape}; apply must "
                     "return a scalar loss (e.g. the mean over the batch) and its aux dict.")
  num_train_steps = resolve_num_train_steps(config, sampler.steps_per_epoch)
  tx, schedule = optimizers.make_optimizer(config.optimizer, num_train_steps=num_train_steps,
                                model_params=params, steps_per_epoch=sampler.steps_per_epoch)
  trainable = {"model": params, "objective": objective_params}
  init_state = parallel.replicate(mesh, {
      "step": jnp.zeros((), jnp.int32),
      "params": params,
      "batch_stats": batch_stats,
      "objective": objective_params,
      "opt_state": tx.init(trainable),
      **({"memory": memory_lib.init(config.memory.size, config.model.embedding_dim)}
         if config.memory.size else {}),
  })
  return Setup(config=config, splits=splits, sampler=sampler, objective=objective,
               train_graphdef=train_graphdef if not config.model.freeze_bn else eval_graphdef,
               eval_graphdef=eval_graphdef, tx=tx, schedule=schedule, init_state=init_state,
               mesh=mesh, num_train_steps=num_train_steps)


def _structure(out) -> str:
  """What an objective's ``apply`` returned: ``'an array of shape ()'``, ``'a tuple of 3'``."""
  if hasattr(out, "shape"):
    return f"an array of shape {tuple(out.shape)}"
  if not isinstance(out, (tuple, list)):
    return f"a {type(out).__name__}"
  aux = f" whose aux is a {type(out[1]).__name__}" if len(out) == 2 else ""
  return f"a {type(out).__name__} of {len(out)}{aux}"


def _train_step_fn(setup: Setup) -> Callable:
  """The un-jitted train step, unguarded: ``(state, images, labels, key) -> (new state,
  metrics)`` with ``metrics['finite']`` 0 when the loss or the gradient is not finite; the
  callers keep the old state then (:func:`make_train_step`, :func:`make_guarded_step`)."""
  graphdef, objective, tx = setup.train_graphdef, setup.objective, setup.tx
  mem_config = setup.config.memory

  def loss_fn(trainable, batch_stats, memory, active, images, labels, key):
    model = nnx.merge(graphdef, trainable["model"], batch_stats, copy=True)
    embeddings = model(images)
    extra = {}
    if memory is not None:
      extra["references"] = memory_lib.references(
          memory, embeddings, labels, active=active,
          reference_gradient=mem_config.reference_gradient)
      memory = memory_lib.enqueue(memory, embeddings, labels, active=active)
    loss, aux = objective.apply(trainable["objective"], embeddings, labels, rng=key, **extra)
    _, _, new_batch_stats = nnx.split(model, nnx.Param, ...)
    return loss, (aux, new_batch_stats, memory)

  def train_step(state, images, labels, key):
    trainable = {"model": state["params"], "objective": state["objective"]}
    memory = state.get("memory")
    active = state["step"] >= mem_config.start_step
    (loss, (aux, new_batch_stats, new_memory)), grads = jax.value_and_grad(
        loss_fn, has_aux=True)(trainable, state["batch_stats"], memory, active, images, labels,
                               key)
    grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt_state = tx.update(grads, state["opt_state"], trainable)
    new_trainable = optax.apply_updates(trainable, updates)
    new_state = {
        "step": state["step"] + 1,
        "params": new_trainable["model"],
        "batch_stats": new_batch_stats,
        "objective": new_trainable["objective"],
        "opt_state": new_opt_state,
        **({"memory": new_memory} if memory is not None else {}),
    }
    metrics = {"loss": loss, "grad_norm": grad_norm, "finite": finite.astype(jnp.float32),
               **aux}
    if memory is not None:   # the fraction of the memory's slots the next step will see
      metrics["memory_filled"] = jnp.mean(new_memory["valid"].astype(jnp.float32))
    return new_state, metrics

  return train_step


input_workers = train_input.input_workers


def train_batches(setup: Setup, *, start_step: int = 0, cache=None):
  """``train_input.train_batches`` of ``setup`` from ``start_step`` on: host float batches, or
  with a ``cache`` (``train_input.input_cache``) inputs for ``train_input.make_feed``."""
  return train_input.train_batches(setup.config, setup.splits["train"], setup.sampler,
                                   start_step=start_step, num_steps=setup.num_train_steps,
                                   cache=cache)


def make_train_step(setup: Setup) -> Callable:
  """``train_step(state, images [B,H,W,C], labels [B], key) -> (state, metrics)``, jitted.

  The batch is sharded over the mesh and the state replicated; the program means the same as
  on one device with the global batch (see ``parallel``), so mining sees the whole batch.

  When the loss or the gradient is not finite, the state is returned unchanged and
  ``metrics['finite']`` is 0, so no NaN ever reaches the parameters or a checkpoint.
  """
  step_fn = _train_step_fn(setup)
  rep, batch = parallel.replicated(setup.mesh), parallel.batch_sharded(setup.mesh)

  def train_step(state, images, labels, key):
    new_state, metrics = step_fn(state, images, labels, key)
    return _keep_unless(metrics["finite"] == 1, new_state, state), metrics

  return jax.jit(train_step, in_shardings=(rep, batch, batch, rep), out_shardings=(rep, rep))


def _keep_unless(ok: jax.Array, new_state: dict, state: dict) -> dict:
  """``new_state`` where the boolean scalar ``ok``, else ``state`` (the one NaN guard)."""
  return jax.tree.map(lambda new, old: jnp.where(ok, new, old), new_state, state)


def make_guarded_step(setup: Setup) -> Callable:
  """The training loop's step: ``(state, halted, images, labels, key) -> (state, halted,
  metrics)``, jitted, with no host round-trip.

  ``halted`` (int32 scalar, on the device) is 0 until a step's loss or gradient is not finite,
  then that step's number; from then on every step leaves the state as it was. The loop
  fetches ``halted`` only at log and checkpoint steps, so the device runs ahead of the host
  while no checkpoint ever holds a state past the first non-finite step.

  ``state`` and ``halted`` are donated: XLA writes the new state into the old one's buffers,
  so the caller must not use the arrays it passed in again (pass a copy of a state it keeps,
  e.g. ``setup.init_state``).
  """
  step_fn = _train_step_fn(setup)
  rep, batch = parallel.replicated(setup.mesh), parallel.batch_sharded(setup.mesh)

  def guarded(state, halted, images, labels, key):
    new_state, metrics = step_fn(state, images, labels, key)
    finite = metrics["finite"] == 1
    new_state = _keep_unless((halted == 0) & finite, new_state, state)
    halted = jnp.where((halted == 0) & ~finite, state["step"] + 1, halted)
    return new_state, halted, metrics

  return jax.jit(guarded, in_shardings=(rep, rep, batch, batch, rep),
                 out_shardings=(rep, rep, rep), donate_argnums=(0, 1))


def make_embed_fn(setup: Setup) -> Callable:
  """``embed(state, images [B,H,W,C]) -> embeddings [B, D]`` in eval mode, jitted."""
  return restore.make_embed_fn(setup.eval_graphdef)


def make_batch_similarity_fn(setup: Setup) -> Callable:
  """``batch_similarity(state, images [B,H,W,C], labels [B]) -> (S [B, B], labels [B])`` of
  the train-mode embeddings (what the loss saw; batch statistics not kept), replicated,
  jitted: the similarity histograms of the training batch."""
  graphdef, kind = setup.train_graphdef, setup.config.eval.similarity
  rep = parallel.replicated(setup.mesh)

  def batch_similarity(state, images, labels):
    model = nnx.merge(graphdef, state["params"], state["batch_stats"], copy=True)
    return similarity_lib.pairwise_similarity(model(images), kind=kind), labels

  return jax.jit(batch_similarity, out_shardings=(rep, rep))


def step_key(seed: int, step: int) -> jax.Array:
  """The PRNG key of train step ``step`` (independent of resumption)."""
  return jax.random.fold_in(jax.random.key(seed + 1), step)


def make_step_key_fn(seed: int) -> Callable:
  """``step -> step_key(seed, step)`` as one jitted call (the same key; one dispatch per
  training step instead of the two eager ops of :func:`step_key`)."""
  return jax.jit(lambda step: step_key(seed, step))


# --------------------------------------------------------------------------- evaluate


def log_scatter(setup: Setup, state: dict, embed_fn: Callable, *, workdir: str,
                step: int, writer: writers.MetricWriter | None = None,
                splits: dict | None = None) -> dict:
  """Triplet scatter diagram (2nd-order paper Fig. 1) of the first evaluation protocol's split
  at this step: ``scatter_<split>_step_<N>.png`` and summary numbers for metrics.jsonl.
  ``splits``: the evaluation's splits (default ``setup.splits``;
  ``eval_input.evaluation_splits``)."""
  splits = setup.splits if splits is None else splits
  protocol = protocols_lib.parse_protocol(setup.config.eval.splits[0], splits)
  split = splits[protocol.split]
  labels = split.label_sets[protocol.label_set] if protocol.label_set else split.labels
  emb = compute.embed(lambda images: embed_fn(state, images), split.images,
                           batch_size=setup.config.eval.batch_size)
  s_ap, s_an, correct = triplet_scatter.scatter_points(emb, labels,
                                               similarity=setup.config.eval.similarity)
  if workdir_lib.is_main_process():
    path = triplet_scatter.plot_scatter(
        s_ap, s_an, correct, similarity=setup.config.eval.similarity,
        path=os.path.join(workdir, f"scatter_{protocol.split}_step_{step}.png"),
        title=f"{protocol.split}, step {step}")
    if writer is not None:
      writer.images(step, {f"scatter/{protocol.split}": path})
  return {"scatter/correct_fraction": float(np.mean(correct)),
          "scatter/mean_s_ap": float(np.nanmean(s_ap)),
          "scatter/mean_s_an": float(np.nanmean(s_an))}


def logged(workdir: str, step: int, prefix: str) -> bool:
  """Whether ``metrics.jsonl`` holds a row of ``step`` with a key starting with ``prefix``
  (``'eval/'``: the evaluation of that step, ``'scatter/'``: its scatter diagram), as every
  process reads it from process 0 (a run killed during an evaluation has none)."""
  found = workdir_lib.is_main_process() and any(
      row["step"] == step and any(k.startswith(prefix) for k in row)
      for row in workdir_lib.read_metrics(workdir))
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    found = bool(multihost_utils.broadcast_one_to_all(np.asarray(found)))
  return bool(found)


# ------------------------------------------------------------------------------ train


def start_run(config: ml_collections.ConfigDict, workdir: str, *,
              overwrite: bool = False) -> tuple[Setup, Any, int, dict]:
  """Opens ``workdir`` for training ``config``: a fresh start, or a resume of its newest
  checkpoint. Writes nothing until the config is known to match the workdir and the
  checkpoint is restored, so a refused rerun leaves the workdir byte-identical.

  Args:
    config: the resolved config.
    workdir: the run directory (created when missing).
    overwrite: delete what an earlier run wrote into ``workdir`` first (``--overwrite``).

  Returns:
    ``(setup, checkpoint manager, start step, state)``.

  Raises:
    workdir.WorkdirConflictError: ``workdir`` was trained with a different config (named keys).
    checkpointing.CheckpointMismatchError: the checkpoint's shapes differ from the config's.
    ValueError: the newest checkpoint is past the run's final step.
  """
  workdir_lib.check_path(workdir)
  overrides.import_user_modules(config.get("user_modules", ()), from_config=True)
  # a bad value is named as such, not as a change of the config
  config_lib.validate(config)
  config_lib.validate_training(config)
  config_lib.make_objective(config)
  if overwrite:
    workdir_lib.check_overwrite(workdir)
    changes = []
  else:
    changes = workdir_lib.check_rerun(config, workdir)
    workdir_lib.check_not_past_the_end(workdir, config)
  setup = build(config)
  if overwrite and workdir_lib.is_main_process():
    removed = workdir_lib.clear(workdir)
    if removed:
      logging.info("--overwrite: deleted %d earlier outputs of %s.", len(removed), workdir)
  manager = checkpointing.make_manager(
      workdir, max_to_keep=config.max_checkpoints_to_keep or None)   # 0: all
  try:
    restored = checkpointing.restore(manager, setup.init_state, set_aside=True)
  except Exception:
    manager.close()
    raise
  if restored is None:
    start, state = 0, setup.init_state
    logging.info("No checkpoint in %s: training from step 0.", workdir)
  else:
    start, state, _ = restored
    logging.info("Resumed from checkpoint step %d in %s.", start, workdir)
    for change in changes:
      logging.info("Changed on resume: %s.", workdir_lib.format_change(*change))
  workdir_lib.write_config(config, workdir)
  workdir_lib.write_train_labels(setup.splits["train"], config.data, workdir)
  workdir_lib.write_run_info(workdir, num_train_steps=setup.num_train_steps,
                             steps_per_epoch=setup.sampler.steps_per_epoch)
  workdir_lib.truncate_metrics(workdir, start)
  return setup, manager, start, state


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       show_progress: bool = True, overwrite: bool = False,
                       stop: signals.StopFlag | None = None) -> dict:
  """Trains (resuming from the newest checkpoint in ``workdir``) and evaluates.

  Writes into ``workdir``: ``config.json`` (the resolved config), ``metrics.jsonl`` (a row
  per log step and per evaluation), ``checkpoints/<step>``, ``eval_step_<N>.json`` and the
  embedding PNG (see ``workdir``). Returns the final evaluation results.

  Args:
    config: the resolved config.
    workdir: the run directory; an existing one is resumed (:func:`start_run`).
    show_progress: a progress bar; otherwise one log line per ``log_every_steps``.
    overwrite: start ``workdir`` afresh, deleting its earlier outputs.
    stop: when it is set (``signals.stop_on_signals``, on SIGINT / SIGTERM), a checkpoint of
      the current step is saved and :class:`TrainingInterrupted` raised.

  Raises:
    workdir_lock.WorkdirInUseError: another run trains in ``workdir`` (holds its lock).
  """
  with workdir_lock.hold(workdir):   # one run writes a workdir at a time
    # config.json: readable from anywhere
    return _train(workdir_lib.absolute_data_paths(config), workdir,
                  show_progress=show_progress, overwrite=overwrite, stop=stop)


def _train(config, workdir, *, show_progress, overwrite, stop) -> dict:
  """:func:`train_and_evaluate` with the workdir's lock held."""
  setup, manager, start, state = start_run(config, workdir, overwrite=overwrite)
  writer = writers.make_writer(config, workdir, start_step=start)
  if workdir_lib.is_main_process():
    print(f"dml_jax: {parallel.describe(setup.mesh, config.batch_size)}; outputs: "
          f"{writers.describe(workdir, writer.backends)}", flush=True)
  log = ((lambda line: print(f"dml_jax: {line}", flush=True))
         if workdir_lib.is_main_process() else None)
  # 'auto' decides by the whole run's examples, so a resumed run feeds as the uninterrupted one
  examples = setup.num_train_steps * config.batch_size
  cache = (train_input.input_cache(config, setup.splits["train"].images, workdir=workdir,
                                   examples=examples, log=log)
           if setup.num_train_steps > start else None)
  if log and cache is not None:
    log(f"training images: {cache}, augmented on the device (data.cache)")
  elif log and config.data.name in data_lib.IMAGE_DATASETS:
    log(pipeline.describe_workers(*input_workers(config)))
  # Every process computes the histograms (a collective program); process 0 writes them.
  batch_similarity = (make_batch_similarity_fn(setup) if writers.config_backends(config)
                      else None)
  train_step, key_fn = make_guarded_step(setup), make_step_key_fn(config.seed)
  stop_check = signals.stop_check(stop, setup.mesh)   # the same step on every process
  embed_fn = make_embed_fn(setup)
  eval_splits = eval_input.evaluation_splits(setup.config, setup.splits, workdir=workdir,
                                             log=log)
  total = setup.num_train_steps
  batches = train_batches(setup, start_step=start, cache=cache)
  feed = train_input.make_feed(config, setup.mesh, cache)
  bar = tqdm.tqdm(total=total, initial=start, unit="step", dynamic_ncols=True,
                  mininterval=0.5, disable=not (show_progress and workdir_lib.is_main_process()))
  eval_progress = show_progress and workdir_lib.is_main_process()   # bars of their own
  window_t, window_n = time.perf_counter(), 0
  halted = parallel.replicate(setup.mesh, jnp.zeros((), jnp.int32))
  # the step donates its input state; start_run may have returned setup.init_state itself
  state = jax.tree.map(jnp.copy, state)
  history = {}   # step -> metrics still on the device, fetched once per log step

  def check_finite():
    bad = int(jax.device_get(halted))
    if bad:
      m = jax.device_get(history[bad])
      raise NonFiniteLossError(
          f"Loss or gradient became non-finite at step {bad} (loss={float(m['loss'])}, "
          f"grad_norm={float(m['grad_norm'])}); training stopped, parameters and checkpoints "
          f"were left at step {bad - 1}. Lower optimizer.learning_rate or check the loss "
          "hyper-parameters.")

  def scatter_and_evaluate(step, missed_only=False):
    """The scatter diagram and the evaluation of ``step`` when it is one of theirs (with
    ``missed_only``, those ``metrics.jsonl`` lacks: a resumed run's checkpoint step)."""
    if (config.scatter_every_steps and step % config.scatter_every_steps == 0
        and not (missed_only and logged(workdir, step, "scatter/"))):
      writer.write_row({"step": step, **log_scatter(setup, state, embed_fn, workdir=workdir,
                                                    step=step, writer=writer,
                                                    splits=eval_splits())})
    if (config.eval_every_steps and step % config.eval_every_steps == 0 and step != total
        and not (missed_only and (not config.eval.splits or logged(workdir, step, "eval/")))):
      results = compute.evaluate_with_config(setup.config, eval_splits(), state, embed_fn,
                                             workdir=workdir, step=step, plot=False,
                                             writer=writer, show_progress=eval_progress)
      writer.write_row({"step": step, **report.flatten(results)})

  try:
    if 0 < start <= total:   # stopped at its checkpoint before the step's evaluation was logged
      scatter_and_evaluate(start, missed_only=True)   # (the last step's: only its scatter)
    for batch_step, local_inputs, local_labels in batches:
      step = batch_step + 1
      images, labels = feed(local_inputs, local_labels)
      state, halted, history[step] = train_step(state, halted, images, labels, key_fn(step))
      window_n += config.batch_size
      bar.update(1)
      interrupted = (signum := stop_check()) is not None and step != total
      if step % config.log_every_steps == 0 or step == total:
        check_finite()
        rows = list(jax.device_get(history).values())
        mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
        row = {"step": step, "first_step": min(history),   # the mean of first_step..step
               **{f"train/{k}": v for k, v in mean.items() if k != "finite"},
               "learning_rate": float(setup.schedule(step - 1)),
               "examples_per_sec": window_n / max(time.perf_counter() - window_t, 1e-9)}
        writer.write_row(row)
        if batch_similarity is not None:
          pos, neg = triplet_scatter.split_pairs(*jax.device_get(batch_similarity(state, images,
                                                                          labels)))
          writer.histograms(step, {"train/similarity_positive": pos,
                                   "train/similarity_negative": neg})
        bar.set_postfix(loss=f"{mean['loss']:.4f}", ex_s=f"{row['examples_per_sec']:.0f}")
        if not show_progress:
          logging.info("step %d/%d: loss %.4f, %.0f examples/s", step, total, mean["loss"],
                       row["examples_per_sec"])
        window_t, window_n, history = time.perf_counter(), 0, {}
      if step % config.checkpoint_every_steps == 0 or step == total or interrupted:
        check_finite()
        checkpointing.save(manager, step, state, {"step": step})
      if interrupted:
        raise TrainingInterrupted(step, signum)
      scatter_and_evaluate(step)
    last = int(state["step"])
  except BaseException:
    writer.close()
    raise
  finally:
    bar.close()
    manager.close()

  with writer:
    # A rerun of a finished run evaluates again but logs nothing (its step is logged), unless
    # the evaluation of the last step was cut off (a kill, a second Ctrl-C) before its row.
    log_final = last > start or (bool(config.eval.splits) and not logged(workdir, last, "eval/"))
    results = compute.evaluate_with_config(setup.config, eval_splits(), state, embed_fn,
                                           workdir=workdir, step=last,
                                           plot=config.eval.plot, show_progress=eval_progress,
                                           writer=writer if log_final else None)
    if log_final:
      writer.write_row({"step": last, **report.flatten(results)})
  return results
