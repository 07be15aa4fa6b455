"""Training: train state, one jitted train step, and ``train_and_evaluate(config, workdir)``.

The train state is a plain dict pytree (what Orbax saves)::

  {'step': int32 [], 'params': nnx.State, 'batch_stats': nnx.State,
   'objective': dict (beta, proxies, ...), 'opt_state': optax state}

Determinism: the batch of step ``t`` and the PRNG key of step ``t`` are pure functions of
``(config.seed, t)``, so a run killed at any point and resumed from its last checkpoint
reproduces the uninterrupted run exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import time
from typing import Any, Callable

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from dml_jax import checkpointing
from dml_jax import data as data_lib
from dml_jax import models
from dml_jax.data import noise as noise_lib
from dml_jax.data import pipeline
from dml_jax import objectives
from dml_jax import overrides
from dml_jax import parallel
from dml_jax import signals
from dml_jax import workdir as workdir_lib
from dml_jax.evaluation import evaluate as evaluate_lib


class NonFiniteLossError(FloatingPointError):
  """The loss or the gradient became NaN or inf; the state was not updated."""


class TrainingInterrupted(Exception):
  """SIGINT / SIGTERM stopped training after a checkpoint of the current step was saved."""

  def __init__(self, step: int, signum: int):
    super().__init__(f"interrupted at step {step}; rerun the same command to resume")
    self.step, self.signum = step, signum


# Re-exported: the workdir's files live in ``workdir``.
is_main_process = workdir_lib.is_main_process
load_workdir_config = workdir_lib.load_config
write_workdir_config = workdir_lib.write_config
final_step = workdir_lib.final_step
METRICS_FILE = workdir_lib.METRICS_FILE


# ----------------------------------------------------------------------------- config


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks the values the library cannot check itself; raises ``ValueError``."""
  for key in ("num_train_steps", "batch_size", "log_every_steps", "checkpoint_every_steps"):
    value = config[key]
    if not isinstance(value, int) or value <= 0:
      raise ValueError(f"config.{key} must be a positive integer, got {value!r}.")
  if config.eval_every_steps < 0:
    raise ValueError(f"config.eval_every_steps must be >= 0, got {config.eval_every_steps}.")
  if not 1 <= config.data.group_size <= config.batch_size:
    raise ValueError(f"data.group_size={config.data.group_size} must be between 1 and "
                     f"batch_size={config.batch_size} (examples per class in a batch).")
  if config.data.label_noise and config.data.clean_fraction != 1.0:
    raise ValueError(
        f"config.data.label_noise={config.data.label_noise} and config.data.clean_fraction="
        f"{config.data.clean_fraction}: the clean topline is a separate run; set one of them.")
  if config.data.name in data_lib.IMAGE_DATASETS:
    if config.data.image_size <= 0:
      raise ValueError(f"config.data.image_size must be > 0 for the image dataset "
                       f"{config.data.name!r} (e.g. 224), got {config.data.image_size}.")
  elif config.data.image_size:
    raise ValueError(
        f"config.data.image_size={config.data.image_size}: the in-memory dataset "
        f"{config.data.name!r} has a fixed size; use 0 (its native size).")
  if config.num_epochs < 0:
    raise ValueError(f"config.num_epochs must be >= 0, got {config.num_epochs}.")
  if config.model.pretrained and not os.path.exists(config.model.pretrained):
    raise FileNotFoundError(
        f"config.model.pretrained={config.model.pretrained!r} does not exist. Convert "
        "torchvision weights first: python -m dml_jax.models.pretrained convert --arch "
        f"{config.model.name} --torch_checkpoint <file.pth> --output {config.model.pretrained}")


TRAIN_LABELS_FILE = "train_labels.npz"
def write_train_labels(train, data: ml_collections.ConfigDict, workdir: str) -> dict:
  """Records the training labels of a label-noise or clean-topline run in ``workdir``:
  ``train_labels.npz`` (``labels`` used for training, and ``clean`` labels with noise) and a
  summary in ``train_labels.json`` (rate asked, fraction actually flipped, sizes). Noise is
  applied once per run (seed ``data.noise_seed``), so a resumed run recomputes the same
  labels; the file lets a user check that. Returns the summary (``{}`` for clean runs)."""
  if not (data.label_noise or data.clean_fraction != 1.0) or not is_main_process():
    return {}
  arrays = {"labels": np.asarray(train.labels)}
  summary = {"label_noise": float(data.label_noise), "clean_fraction": float(data.clean_fraction),
             "noise_seed": int(data.noise_seed), "num_examples": int(len(train.labels)),
             "num_classes": int(train.num_classes)}
  if "clean" in train.label_sets:
    arrays["clean"] = np.asarray(train.label_sets["clean"])
    summary["flipped_fraction"] = float(np.mean(arrays["clean"] != arrays["labels"]))
  os.makedirs(workdir, exist_ok=True)
  np.savez(os.path.join(workdir, TRAIN_LABELS_FILE), **arrays)
  with open(os.path.join(workdir, TRAIN_LABELS_FILE.replace(".npz", ".json")), "w") as f:
    json.dump(summary, f, indent=2)
  return summary


def prepare_train_split(train, *, label_noise: float, clean_fraction: float, seed: int):
  """Applies the label-noise paper's training-set options to the train ``Split``.

  ``label_noise = p > 0``: labels are corrupted once with uniform noise (eq. 6, seed
  ``seed``); the clean labels stay available as ``label_sets['clean']``.
  ``clean_fraction < 1``: the clean "topline", a random subset of that fraction of the
  training examples with their true labels (the paper's topline: as many clean examples as
  noise rate ``p = 1 - clean_fraction`` leaves). Classes that lose all their examples (SOP
  has many 2-image classes) are left out, with a warning giving their number.
  """
  if label_noise:
    noisy = noise_lib.uniform_label_noise(train.labels, rate=label_noise,
                                          num_classes=train.num_classes, seed=seed)
    return data_lib.Split(images=train.images, labels=noisy,
                          label_sets={**train.label_sets, "clean": train.labels},
                          name=f"{train.name} (label noise p={label_noise})")
  if clean_fraction != 1.0:
    idx = noise_lib.clean_subsample(len(train.labels), fraction=clean_fraction, seed=seed)
    kept, labels = np.unique(train.labels[idx], return_inverse=True)
    if len(kept) < train.num_classes:  # SOP: many 2-image classes lose both images
      logging.warning("data.clean_fraction=%s: %d of %d training classes have no example left "
                      "in the clean subset and are left out (the others renumbered 0..%d).",
                      clean_fraction, train.num_classes - len(kept), train.num_classes,
                      len(kept) - 1)
    return data_lib.Split(images=data_lib.take(train.images, idx), labels=labels,
                          label_sets={k: v[idx] for k, v in train.label_sets.items()},
                          name=f"{train.name} (clean {clean_fraction:.2f})")
  return train


# -------------------------------------------------------------------------- optimizer


def learning_rate_schedule(*, learning_rate: float, schedule: str, num_train_steps: int,
                           decay_steps=(), decay_factor: float = 0.1,
                           warmup_steps: int = 0) -> optax.Schedule:
  """``'constant'``, ``'step'`` (times ``decay_factor`` at each of ``decay_steps``) or
  ``'cosine'`` (to 0 at ``num_train_steps``), after an optional linear warm-up."""
  if schedule == "constant":
    sched = optax.constant_schedule(learning_rate)
  elif schedule == "step":
    boundaries = {int(s): decay_factor for s in decay_steps if int(s) > 0}
    sched = optax.piecewise_constant_schedule(learning_rate, boundaries)
  elif schedule == "cosine":
    sched = optax.cosine_decay_schedule(learning_rate, max(num_train_steps - warmup_steps, 1))
  else:
    raise ValueError(f"Unknown optimizer.schedule {schedule!r}; allowed: constant, step, cosine.")
  if warmup_steps > 0:
    warm = optax.linear_schedule(0.0, learning_rate, warmup_steps)
    sched = optax.join_schedules([warm, sched], [warmup_steps])
  return sched


OPTIMIZERS = ("adam", "sgd", "rmsprop")
# 'coupled': weight_decay * w added to the gradient before the optimizer (torch.optim's
# weight_decay, the papers' code); 'decoupled': AdamW's decay, multiplied by the learning rate.
WEIGHT_DECAY_MODES = ("coupled", "decoupled")


def make_optimizer(opt: ml_collections.ConfigDict, *, num_train_steps: int,
                   model_params=None, steps_per_epoch: int = 0,
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optax transformation for ``{'model': ..., 'objective': ...}`` parameter trees.

  ``weight_decay`` is applied as ``weight_decay_mode`` says (:data:`WEIGHT_DECAY_MODES`).
  Objective parameters (margin beta, proxies) get ``objective_learning_rate`` through
  ``optax.multi_transform``. When ``backbone_learning_rate`` or ``head_learning_rate`` is set,
  the model's parameters are split by ``models.param_labels(model_params)`` into backbone and
  embedding head, each with its own rate. A rate of 0 means ``learning_rate``. The 'step'
  schedule decays at ``decay_steps`` and at ``decay_epochs * steps_per_epoch`` (the papers'
  "divide by 10 after epochs 20 and 30").
  """
  if opt.name not in OPTIMIZERS:
    raise ValueError(f"Unknown optimizer.name {opt.name!r}; allowed: {', '.join(OPTIMIZERS)}.")
  mode = opt.get("weight_decay_mode", "decoupled")
  if mode not in WEIGHT_DECAY_MODES:
    raise ValueError(f"Unknown optimizer.weight_decay_mode {mode!r}; allowed: "
                     f"{', '.join(WEIGHT_DECAY_MODES)}.")
  if opt.weight_decay and mode == "decoupled" and opt.name != "adam":
    raise ValueError(f"optimizer.weight_decay_mode='decoupled' is AdamW (optimizer.name="
                     f"'adam'); {opt.name} takes 'coupled' (L2 in the gradient, as torch's "
                     f"{opt.name}).")
  decay_epochs = tuple(opt.get("decay_epochs", ()))
  if decay_epochs and steps_per_epoch <= 0:
    raise ValueError(f"optimizer.decay_epochs={decay_epochs} needs steps_per_epoch > 0.")
  decay_steps = tuple(d for d in opt.decay_steps if d) + tuple(
      int(round(e * steps_per_epoch)) for e in decay_epochs)

  def one(learning_rate):
    sched = learning_rate_schedule(
        learning_rate=learning_rate, schedule=opt.schedule, num_train_steps=num_train_steps,
        decay_steps=tuple(sorted(decay_steps)), decay_factor=opt.decay_factor,
        warmup_steps=opt.warmup_steps)
    if opt.name == "adam" and opt.weight_decay and mode == "decoupled":
      return optax.adamw(sched, weight_decay=opt.weight_decay), sched
    tx = {"adam": lambda: optax.adam(sched),
          "sgd": lambda: optax.sgd(sched, momentum=opt.momentum or None),
          "rmsprop": lambda: optax.rmsprop(sched, momentum=opt.momentum or None)}[opt.name]()
    if opt.weight_decay:  # coupled: L2 added to the gradient before the optimizer
      tx = optax.chain(optax.add_decayed_weights(opt.weight_decay), tx)
    return tx, sched

  model_tx, sched = one(opt.learning_rate)
  transforms = {"model": model_tx,
                "objective": one(opt.objective_learning_rate or opt.learning_rate)[0]}
  model_labels = "model"
  if opt.backbone_learning_rate or opt.head_learning_rate:
    if model_params is None:
      raise ValueError("per-part learning rates need the model parameters (model_params).")
    transforms["backbone"] = one(opt.backbone_learning_rate or opt.learning_rate)[0]
    transforms["head"] = one(opt.head_learning_rate or opt.learning_rate)[0]
    model_labels = models.param_labels(model_params)
  tx = optax.multi_transform(transforms, {"model": model_labels, "objective": "objective"})
  return tx, sched


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


def model_options(model: ml_collections.ConfigDict) -> dict:
  """The backbone options of ``config.model`` that differ from the defaults, as keyword
  arguments of ``models.make`` (so the small CNN, which has none, gets none)."""
  defaults = {"dtype": "float32", "pooling": "", "bn_mode": "train", "embedding_hidden": ()}
  options = {}
  for key, default in defaults.items():
    value = model.get(key, default)
    value = tuple(value) if isinstance(value, (list, tuple)) else value
    if value != default:
      options[key] = value
  return options


def input_options(model_name: str, image_shape) -> dict:
  """``image_size`` / ``in_channels`` for models whose layers depend on the input shape (the
  small CNN's dense layer), from the train images ``[N, H, W, C]``."""
  if model_name not in models.MODELS:
    return {}
  params = inspect.signature(models.MODELS[model_name].__init__).parameters
  options = {}
  if "image_size" in params:
    options["image_size"] = tuple(int(d) for d in image_shape[1:3])
  if "in_channels" in params:
    options["in_channels"] = int(image_shape[3])
  return options


def dataset_options(data: ml_collections.ConfigDict) -> dict:
  """Keyword arguments of the dataset loader: ``data.options`` plus, for image datasets, the
  ``ImageOptions`` keys (``resize_size`` 0 means ``round(image_size * 8 / 7)``, 256 for 224)."""
  options = data.options.to_dict()
  if data.name in data_lib.IMAGE_DATASETS:
    options.update(image_size=data.image_size,
                   resize_size=data.resize_size or round(data.image_size * 8 / 7),
                   channels=data.channels, mean=tuple(data.mean), std=tuple(data.std))
  return options


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
  overrides.import_user_modules(config.get("user_modules", ()))
  validate_config(config)
  mesh = parallel.make_mesh(config.num_devices)
  parallel.check_batch_size(config.batch_size, mesh)
  splits = dict(data_lib.load(config.data.name, **dataset_options(config.data)))
  splits["train"] = prepare_train_split(
      splits["train"], label_noise=config.data.label_noise,
      clean_fraction=config.data.clean_fraction, seed=config.data.noise_seed)
  validate_eval_config(config, splits)
  train = splits["train"]
  sampler = data_lib.NPerClassSampler(
      train.labels, batch_size=config.batch_size, group_size=config.data.group_size,
      seed=config.seed, small_class=config.data.small_class)
  objective = objectives.make(**config.loss.to_dict())

  key = jax.random.key(config.seed)
  model_key, objective_key = jax.random.split(key)
  model = models.make(config.model.name, embedding_dim=config.model.embedding_dim,
                      normalize=config.model.normalize, rngs=nnx.Rngs(params=model_key),
                      **model_options(config.model), **input_options(config.model.name,
                                                                     train.images.shape))
  if config.model.pretrained:
    models.load_pretrained(model, config.model.pretrained)
  model.train()
  train_graphdef, params, batch_stats = nnx.split(model, nnx.Param, ...)
  model.eval()
  eval_graphdef, _, _ = nnx.split(model, nnx.Param, ...)

  num_classes = int(np.max(train.labels)) + 1
  objective_params = objective.init(objective_key, num_classes=num_classes,
                                    dim=config.model.embedding_dim)
  num_train_steps = resolve_num_train_steps(config, sampler.steps_per_epoch)
  tx, schedule = make_optimizer(config.optimizer, num_train_steps=num_train_steps,
                                model_params=params, steps_per_epoch=sampler.steps_per_epoch)
  trainable = {"model": params, "objective": objective_params}
  init_state = parallel.replicate(mesh, {
      "step": jnp.zeros((), jnp.int32),
      "params": params,
      "batch_stats": batch_stats,
      "objective": objective_params,
      "opt_state": tx.init(trainable),
  })
  return Setup(config=config, splits=splits, sampler=sampler, objective=objective,
               train_graphdef=train_graphdef if not config.model.freeze_bn else eval_graphdef,
               eval_graphdef=eval_graphdef, tx=tx, schedule=schedule, init_state=init_state,
               mesh=mesh, num_train_steps=num_train_steps)


def _train_step_fn(setup: Setup) -> Callable:
  """The un-jitted train step (see :func:`make_train_step`)."""
  graphdef, objective, tx = setup.train_graphdef, setup.objective, setup.tx

  def loss_fn(trainable, batch_stats, images, labels, key):
    model = nnx.merge(graphdef, trainable["model"], batch_stats, copy=True)
    embeddings = model(images)
    loss, aux = objective.apply(trainable["objective"], embeddings, labels, rng=key)
    _, _, new_batch_stats = nnx.split(model, nnx.Param, ...)
    return loss, (aux, new_batch_stats)

  def train_step(state, images, labels, key):
    trainable = {"model": state["params"], "objective": state["objective"]}
    (loss, (aux, new_batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        trainable, state["batch_stats"], images, labels, key)
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
    }
    # Keep the old state (but report) when anything is NaN / inf.
    new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
    metrics = {"loss": loss, "grad_norm": grad_norm, "finite": finite.astype(jnp.float32),
               **aux}
    return new_state, metrics

  return train_step


def make_train_step(setup: Setup) -> Callable:
  """``train_step(state, images [B,H,W,C], labels [B], key) -> (state, metrics)``, jitted.

  The batch is sharded over the mesh and the state replicated; the program means the same as
  on one device with the global batch (see ``parallel``), so mining sees the whole batch.

  When the loss or the gradient is not finite, the state is returned unchanged and
  ``metrics['finite']`` is 0, so no NaN ever reaches the parameters or a checkpoint.
  """
  rep, batch = parallel.replicated(setup.mesh), parallel.batch_sharded(setup.mesh)
  return jax.jit(_train_step_fn(setup), in_shardings=(rep, batch, batch, rep),
                 out_shardings=(rep, rep))


def make_guarded_step(setup: Setup) -> Callable:
  """The training loop's step: ``(state, halted, images, labels, key) -> (state, halted,
  metrics)``, jitted, with no host round-trip.

  ``halted`` (int32 scalar, on the device) is 0 until a step's loss or gradient is not finite,
  then that step's number; from then on every step leaves the state as it was. The loop
  fetches ``halted`` only at log and checkpoint steps, so the device runs ahead of the host
  while no checkpoint ever holds a state past the first non-finite step.
  """
  step_fn = _train_step_fn(setup)
  rep, batch = parallel.replicated(setup.mesh), parallel.batch_sharded(setup.mesh)

  def guarded(state, halted, images, labels, key):
    new_state, metrics = step_fn(state, images, labels, key)
    ok = halted == 0
    new_state = jax.tree.map(lambda new, old: jnp.where(ok, new, old), new_state, state)
    halted = jnp.where(ok & (metrics["finite"] == 0), state["step"] + 1, halted)
    return new_state, halted, metrics

  return jax.jit(guarded, in_shardings=(rep, rep, batch, batch, rep),
                 out_shardings=(rep, rep, rep))


def make_embed_fn(setup: Setup) -> Callable:
  """``embed(state, images [B,H,W,C]) -> embeddings [B, D]`` in eval mode, jitted."""
  graphdef = setup.eval_graphdef

  @jax.jit
  def embed(state, images):
    model = nnx.merge(graphdef, state["params"], state["batch_stats"])
    return model(images)

  return embed


def step_key(seed: int, step: int) -> jax.Array:
  """The PRNG key of train step ``step`` (independent of resumption)."""
  return jax.random.fold_in(jax.random.key(seed + 1), step)


# --------------------------------------------------------------------------- evaluate


def log_scatter(setup: Setup, state: dict, embed_fn: Callable, *, workdir: str,
                step: int) -> dict:
  """Triplet scatter diagram (2nd-order paper Fig. 1) of the first evaluation protocol's split
  at this step: ``scatter_<split>_step_<N>.png`` and summary numbers for metrics.jsonl."""
  from dml_jax.analysis import scatter  # pylint: disable=import-outside-toplevel
  protocol = evaluate_lib.parse_protocol(setup.config.eval.splits[0], setup.splits)
  split = setup.splits[protocol.split]
  labels = split.label_sets[protocol.label_set] if protocol.label_set else split.labels
  emb = evaluate_lib.embed(lambda images: embed_fn(state, images), split.images,
                           batch_size=setup.config.eval.batch_size)
  s_ap, s_an, correct = scatter.scatter_points(emb, labels,
                                               similarity=setup.config.eval.similarity)
  if is_main_process():
    scatter.plot_scatter(s_ap, s_an, correct, similarity=setup.config.eval.similarity,
                         path=os.path.join(workdir, f"scatter_{protocol.split}_step_{step}.png"),
                         title=f"{protocol.split}, step {step}")
  return {"scatter/correct_fraction": float(np.mean(correct)),
          "scatter/mean_s_ap": float(np.nanmean(s_ap)),
          "scatter/mean_s_an": float(np.nanmean(s_an))}


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
  """
  changes = [] if overwrite else workdir_lib.check_rerun(config, workdir)
  setup = build(config)
  if overwrite and is_main_process():
    removed = workdir_lib.clear(workdir)
    if removed:
      logging.info("--overwrite: deleted %d earlier outputs of %s.", len(removed), workdir)
  manager = checkpointing.make_manager(workdir, max_to_keep=config.max_checkpoints_to_keep)
  try:
    restored = checkpointing.restore(manager, setup.init_state)
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
  write_train_labels(setup.splits["train"], config.data, workdir)
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
  """
  setup, manager, start, state = start_run(config, workdir, overwrite=overwrite)
  train_step = make_guarded_step(setup)
  embed_fn = make_embed_fn(setup)
  train = setup.splits["train"]
  total = setup.num_train_steps
  local_rows = parallel.process_slice(config.batch_size)
  batches = pipeline.train_batches(
      train.images, train.labels, setup.sampler, seed=config.seed, start_step=start,
      num_steps=total, rows=local_rows, augmentation=config.data.augmentation,
      flip=config.data.flip, pad=config.data.pad, num_threads=config.data.num_threads,
      num_workers=config.data.num_workers, prefetch=config.data.prefetch)
  bar = tqdm.tqdm(total=total, initial=start, unit="step", dynamic_ncols=True,
                  mininterval=0.5, disable=not (show_progress and is_main_process()))
  window_t, window_n = time.perf_counter(), 0
  halted = parallel.replicate(setup.mesh, jnp.zeros((), jnp.int32))
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

  try:
    for batch_step, local_images, local_labels in batches:
      step = batch_step + 1
      images, labels = parallel.global_batch(setup.mesh, local_images, local_labels,
                                             batch_size=config.batch_size)
      state, halted, history[step] = train_step(state, halted, images, labels,
                                                step_key(config.seed, step))
      window_n += config.batch_size
      bar.update(1)
      interrupted = stop is not None and stop.is_set() and step != total
      if step % config.log_every_steps == 0 or step == total:
        check_finite()
        rows = list(jax.device_get(history).values())
        elapsed = time.perf_counter() - window_t
        mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
        row = {"step": step, **{f"train/{k}": v for k, v in mean.items() if k != "finite"},
               "learning_rate": float(setup.schedule(step - 1)),
               "examples_per_sec": window_n / max(elapsed, 1e-9)}
        workdir_lib.append_metrics(workdir, row)
        bar.set_postfix(loss=f"{mean['loss']:.4f}", ex_s=f"{row['examples_per_sec']:.0f}")
        if not show_progress:
          logging.info("step %d/%d: loss %.4f, %.0f examples/s", step, total, mean["loss"],
                       row["examples_per_sec"])
        window_t, window_n, history = time.perf_counter(), 0, {}
      if step % config.checkpoint_every_steps == 0 or step == total or interrupted:
        check_finite()
        checkpointing.save(manager, step, state, {"step": step})
      if interrupted:
        raise TrainingInterrupted(step, stop.signum)
      if config.scatter_every_steps and step % config.scatter_every_steps == 0:
        workdir_lib.append_metrics(workdir, {"step": step, **log_scatter(
            setup, state, embed_fn, workdir=workdir, step=step)})
      if config.eval_every_steps and step % config.eval_every_steps == 0 and step != total:
        results = evaluate_with_config(setup, state, embed_fn, workdir=workdir, step=step,
                                       plot=False)
        workdir_lib.append_metrics(workdir, {"step": step, **evaluate_lib.flatten(results)})
  finally:
    bar.close()
    manager.close()

  last = int(state["step"])
  results = evaluate_with_config(setup, state, embed_fn, workdir=workdir, step=last,
                                 plot=config.eval.plot)
  if last > start:
    workdir_lib.append_metrics(workdir, {"step": last, **evaluate_lib.flatten(results)})
  return results


def evaluate_checkpoint(workdir: str, *, step: int | None = None,
                        plot: bool | None = None, show_progress: bool = False,
                        protocols: tuple[str, ...] | None = None) -> tuple[int, dict]:
  """Restores a checkpoint of ``workdir`` (newest readable when ``step`` is None) and
  evaluates it as ``train_and_evaluate`` does at the end (:func:`evaluate_with_config`);
  writes ``eval_step_<N>.json``.

  Args:
    workdir: a directory written by ``train.py``.
    step: the checkpoint step; ``None`` means the newest readable one.
    plot: write the embedding PNGs; ``None`` means ``config.eval.plot``.
    show_progress: progress bars for the embedding and the neighbour search.
    protocols: evaluate these instead of ``config.eval.splits``.

  Returns:
    ``(step, {protocol: {metric: value}})``.

  Raises:
    FileNotFoundError: ``workdir`` has no config or no checkpoint.
    ValueError: ``step`` does not exist, or a bad evaluation setting (named).
  """
  setup = build(load_workdir_config(workdir))
  (restored_step, results), = evaluate_checkpoints(
      setup, workdir, steps=None if step is None else (step,), plot=plot,
      show_progress=show_progress, protocols=protocols).items()
  return restored_step, results


# ------------------------------------------------------------- evaluation binary (eval.py)

# Defaults of the config.eval keys that older workdir configs may lack.
EVAL_DEFAULTS = {
    "metrics": evaluate_lib.DEFAULT_METRICS,
    "rho_skip": 0,
    "kmeans_n_init": 10,
}


def eval_options(config: ml_collections.ConfigDict) -> dict:
  """The keyword arguments of ``evaluate_lib.evaluate_splits`` that ``config.eval`` sets.

  Keys missing from an older ``config.json`` take ``EVAL_DEFAULTS``.
  """
  cfg = config.eval

  def get(key):
    return cfg[key] if key in cfg else EVAL_DEFAULTS[key]

  return dict(
      protocols=tuple(cfg.splits), ks=tuple(cfg.ks), similarity=cfg.similarity,
      batch_size=cfg.batch_size, overcluster=cfg.overcluster or None, seed=config.seed,
      metrics_groups=tuple(get("metrics")), rho_skip=int(get("rho_skip")),
      kmeans_n_init=int(get("kmeans_n_init")), dataset=config.data.name)


def evaluate_with_config(setup: Setup, state: dict, embed_fn: Callable, *, workdir: str,
                         step: int, plot: bool, show_progress: bool = False,
                         protocols: tuple[str, ...] | None = None) -> dict:
  """Runs the config's evaluation (``config.eval``: protocols, ks, metrics, similarity, ...)
  on ``state`` and writes ``eval_step_N.json`` (process 0). ``eval.ks = ()`` means the
  dataset's ``DEFAULT_KS``.
  """
  options = eval_options(setup.config)
  if protocols is not None:
    options["protocols"] = tuple(protocols)
  results = evaluate_lib.evaluate_splits(
      lambda images: embed_fn(state, images), setup.splits, **options,
      plot_dir=workdir if plot and is_main_process() else None, step=step,
      show_progress=show_progress)
  if is_main_process():
    evaluate_lib.write_results(results, workdir=workdir, step=step)
  return results


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


def evaluate_checkpoints(setup: Setup, workdir: str, *, steps=None, plot: bool | None = False,
                         show_progress: bool = False,
                         protocols: tuple[str, ...] | None = None) -> dict[int, dict]:
  """Evaluates several checkpoints of ``workdir`` with one ``setup`` (data and model built
  once); writes ``eval_step_<N>.json`` for each.

  Args:
    setup: ``build(load_workdir_config(workdir))``.
    workdir: a directory written by ``train.py``.
    steps: ``None`` (the newest readable checkpoint), ``'all'`` (every checkpoint) or a
      sequence of steps.
    plot: write the embedding PNGs; ``None`` means ``config.eval.plot``.
    show_progress: progress bars.
    protocols: evaluate these instead of ``config.eval.splits``.

  Returns:
    ``{step: {protocol: {metric: value}}}`` in increasing step order.

  Raises:
    FileNotFoundError: no checkpoint. ValueError: a missing or unreadable step, or a bad
      evaluation setting (checked before anything is restored).
  """
  validate_eval_config(setup.config, setup.splits)
  for protocol in protocols or ():
    evaluate_lib.parse_protocol(protocol, setup.splits)
  plot = setup.config.eval.plot if plot is None else plot
  embed_fn = make_embed_fn(setup)
  manager = checkpointing.make_manager(workdir, read_only=True)
  history = {}
  try:
    available = checkpointing.steps(manager)
    if not available:
      raise FileNotFoundError(
          f"No checkpoint in {checkpointing.checkpoint_dir(workdir)}: train first with "
          f"python train.py --config=<config> --workdir={workdir}")
    wanted = [None] if steps is None else available if steps == "all" else sorted(steps)
    for step in wanted:
      restored_step, state, _ = checkpointing.restore(manager, setup.init_state, step=step)
      history[restored_step] = evaluate_with_config(
          setup, state, embed_fn, workdir=workdir, step=restored_step, plot=plot,
          show_progress=show_progress, protocols=protocols)
  finally:
    manager.close()
  return history


def validate_eval_config(config: ml_collections.ConfigDict, splits: dict) -> None:
  """Checks ``config.eval`` against the dataset before any work (protocol names, label sets,
  metric groups, the K list); raises ``ValueError`` naming the bad value."""
  options = eval_options(config)
  for protocol in options["protocols"]:
    evaluate_lib.parse_protocol(protocol, splits)
  groups = evaluate_lib.check_metrics(options["metrics_groups"])
  if not options["ks"] and "retrieval" in groups:
    evaluate_lib.default_ks(options["dataset"])


def evaluate_all_steps(workdir: str, *, best_by: str | None = None,
                       output: str | None = None, show_progress: bool = False) -> dict:
  """Evaluates every checkpoint of ``workdir`` (``eval.py --all_steps``).

  Writes ``eval_step_<N>.json`` per step, ``output`` (default
  ``<workdir>/eval_all_steps.json``: ``{'steps': {N: results}, 'best': ...}``) and a PNG of
  every metric against the step next to it (same name, ``.png``).

  Args:
    workdir: a directory written by ``train.py``.
    best_by: ``'PROTOCOL/METRIC'`` selects the best checkpoint on that protocol, which must
      not use a test split (``evaluate_lib.parse_selection``); it is evaluated even when
      ``config.eval.splits`` lacks it.
    output: the JSON path.
    show_progress: progress bars.

  Returns:
    ``{'steps': {step: results}, 'best': None or {'step', 'protocol', 'metric', 'value'},
    'json': path, 'png': path}``.
  """
  selection = evaluate_lib.parse_selection(best_by) if best_by else None
  setup = build(load_workdir_config(workdir))
  protocols = tuple(setup.config.eval.splits)
  if selection and selection[0] not in protocols:
    protocols += (selection[0],)
  history = evaluate_checkpoints(setup, workdir, steps="all", plot=False,
                                 show_progress=show_progress, protocols=protocols)
  best = None
  if selection:
    step = evaluate_lib.best_step(history, protocol=selection[0], metric=selection[1])
    best = {"step": step, "protocol": selection[0], "metric": selection[1],
            "value": history[step][selection[0]][selection[1]]}
  output = output or os.path.join(workdir, "eval_all_steps.json")
  png = os.path.splitext(output)[0] + ".png"
  if is_main_process():
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
      json.dump({"workdir": workdir, "steps": {str(s): r for s, r in history.items()},
                 "best": best}, f, indent=2, sort_keys=True)
    evaluate_lib.plot_curves(history, path=png, title=workdir)
  return {"steps": history, "best": best, "json": output, "png": png}


def evaluate_workdirs(workdirs, *, step: int | None = None, output: str | None = None,
                      show_progress: bool = False) -> dict:
  """Evaluates the newest (or ``step``) checkpoint of each workdir, e.g. one per seed, and
  aggregates mean ± std (``eval.py --workdirs=a,b,c``).

  Writes ``output`` (JSON: ``{'workdirs', 'steps', 'runs', 'summary'}``) and the markdown
  table next to it (same name, ``.md``) when ``output`` is given.

  Returns:
    ``{'workdirs', 'steps', 'runs', 'summary', 'table'}`` (``summary`` as
    ``evaluate_lib.aggregate``).

  Raises:
    ValueError: no workdir, a repeated one, or runs evaluated differently (named).
  """
  workdirs = [w for w in workdirs if w]
  if not workdirs:
    raise ValueError("--workdirs names no workdir; give a comma-separated list.")
  if len(set(workdirs)) != len(workdirs):
    raise ValueError(f"--workdirs lists a workdir more than once: {workdirs}.")
  for workdir in workdirs:  # Fail before any long evaluation.
    load_workdir_config(workdir)
    checkpoint_steps(workdir)
  steps, runs = [], []
  for workdir in workdirs:
    restored_step, results = evaluate_checkpoint(workdir, step=step, plot=False,
                                                 show_progress=show_progress)
    steps.append(restored_step)
    runs.append(results)
  try:
    summary = evaluate_lib.aggregate(runs)
  except ValueError as e:
    raise ValueError(f"{e} (runs in the order of --workdirs: {workdirs})") from None
  table = evaluate_lib.format_aggregate_table(summary)
  differences = config_differences(workdirs)
  if differences:
    logging.warning("The runs differ in more than the seed (%s): their mean ± std mixes "
                    "different runs; eval.py --side_by_side shows each run.",
                    "; ".join(differences))
  if output and is_main_process():
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
      json.dump({"workdirs": workdirs, "steps": steps, "runs": runs, "summary": summary}, f,
                indent=2, sort_keys=True)
    with open(os.path.splitext(output)[0] + ".md", "w") as f:
      f.write(f"mean ± std over {len(runs)} runs (fractions in percent)\n\n{table}\n")
  return {"workdirs": workdirs, "steps": steps, "runs": runs, "summary": summary,
          "table": table, "differences": differences,
          "runs_table": evaluate_lib.format_runs_table(dict(zip(workdirs, runs)))}


def config_differences(workdirs) -> list[str]:
  """The config keys (besides ``seed`` and the keys a rerun may change) in which the runs of
  ``workdirs`` differ, as ``'key: v1 (run 0), v2 (run 1)'``."""
  trees = [workdir_lib.read_config_json(w) for w in workdirs]
  keys = sorted({k for t in trees[1:] for k, _, _ in workdir_lib.config_changes(trees[0], t)
                 if k != "seed" and not workdir_lib.is_resumable(k)})
  flat = [workdir_lib.flatten(t) for t in trees]
  return [f"{k}: " + ", ".join(f"{f.get(k)!r} (run {i})" for i, f in enumerate(flat))
          for k in keys]
