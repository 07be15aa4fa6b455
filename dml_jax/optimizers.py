"""Optimizers from ``config.optimizer``: learning-rate schedules (constant, step, cosine, with
warm-up), Adam / SGD / RMSProp with coupled or decoupled weight decay, and separate rates for
the objective's parameters, the backbone and the embedding head (``optax.multi_transform``)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_collections
import optax

from dml_jax import models


def learning_rate_schedule(*, learning_rate: float, schedule: str, num_train_steps: int,
                           decay_steps=(), decay_factor: float = 0.1,
                           warmup_steps: int = 0) -> optax.Schedule:
  """The learning rate of update ``t = 0, 1, ...``: ``'constant'``, ``'step'`` (times
  ``decay_factor`` from each of ``decay_steps`` on, as torch's MultiStepLR; a step named twice
  decays twice) or ``'cosine'`` (to 0 at ``num_train_steps``).

  With ``warmup_steps = W > 0`` the first ``W`` updates ramp linearly, ``lr (t + 1) / W`` (so
  the first update moves), then the schedule goes on: the step decays stay at their steps,
  the cosine spans ``[W, num_train_steps]``."""
  if schedule == "constant":
    sched = optax.constant_schedule(learning_rate)
  elif schedule == "step":
    boundaries = {}
    for s in decay_steps:   # after the warm-up, the schedule counts from W
      if int(s) > 0:
        b = max(int(s) - warmup_steps, 0)
        boundaries[b] = boundaries.get(b, 1.0) * decay_factor
    sched = optax.piecewise_constant_schedule(learning_rate, boundaries)
  elif schedule == "cosine":
    sched = optax.cosine_decay_schedule(learning_rate, max(num_train_steps - warmup_steps, 1))
  else:
    raise ValueError(f"Unknown optimizer.schedule {schedule!r}; allowed: constant, step, cosine.")
  if warmup_steps > 0:
    warm = lambda t: learning_rate * (jnp.minimum(t, warmup_steps - 1) + 1.0) / warmup_steps
    sched = optax.join_schedules([warm, sched], [warmup_steps])
  return sched


OPTIMIZERS = ("adam", "sgd", "rmsprop")
# 'coupled': weight_decay * w added to the gradient before the optimizer (torch.optim's
# weight_decay, the papers' code); 'decoupled': AdamW's decay, multiplied by the learning rate.
WEIGHT_DECAY_MODES = ("coupled", "decoupled")
SCHEDULES = ("constant", "step", "cosine")
# The numeric keys of ``config.optimizer``: (test, what is allowed). A per-part rate of 0
# means ``learning_rate``.
_RATE = (lambda v: 0 <= v < math.inf, "finite and >= 0")
NUMERIC_KEYS = {
    "learning_rate": _RATE,
    "objective_learning_rate": _RATE,
    "backbone_learning_rate": _RATE,
    "head_learning_rate": _RATE,
    "momentum": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "weight_decay": _RATE,
    "decay_factor": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "warmup_steps": (lambda v: v >= 0, ">= 0"),
}


def check(opt: ml_collections.ConfigDict) -> None:
  """Checks the values of ``config.optimizer`` before any work (``dml_jax.run.config.validate``).

  Raises:
    ValueError: one line naming the key, its value and what is allowed.
  """
  if opt.name not in OPTIMIZERS:
    raise ValueError(f"Unknown optimizer.name {opt.name!r}; allowed: {', '.join(OPTIMIZERS)}.")
  if opt.schedule not in SCHEDULES:
    raise ValueError(f"Unknown optimizer.schedule {opt.schedule!r}; allowed: "
                     f"{', '.join(SCHEDULES)}.")
  mode = opt.get("weight_decay_mode", "decoupled")
  if mode not in WEIGHT_DECAY_MODES:
    raise ValueError(f"Unknown optimizer.weight_decay_mode {mode!r}; allowed: "
                     f"{', '.join(WEIGHT_DECAY_MODES)}.")
  if opt.weight_decay and mode == "decoupled" and opt.name != "adam":
    raise ValueError(f"optimizer.weight_decay_mode='decoupled' is AdamW (optimizer.name="
                     f"'adam'); {opt.name} takes 'coupled' (L2 in the gradient, as torch's "
                     f"{opt.name}).")
  for key, (ok, allowed) in NUMERIC_KEYS.items():
    value = opt.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
      raise ValueError(f"optimizer.{key}={value!r} is not allowed: it must be {allowed}.")
  if not isinstance(opt.get("decay_objective", True), bool):
    raise ValueError(f"optimizer.decay_objective={opt.decay_objective!r} is not allowed: it "
                     "must be True or False.")
  for key in ("decay_steps", "decay_epochs"):
    value = opt.get(key, ())
    if not isinstance(value, (tuple, list)) or any(
        isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 for v in value):
      shown = tuple(value) if isinstance(value, (tuple, list)) else value
      raise ValueError(f"optimizer.{key}={shown!r} is not allowed: it must be a tuple of "
                       "numbers >= 0.")


def make_optimizer(opt: ml_collections.ConfigDict, *, num_train_steps: int,
                   model_params=None, steps_per_epoch: int = 0,
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optax transformation for ``{'model': ..., 'objective': ...}`` parameter trees.

  ``weight_decay`` is applied as ``weight_decay_mode`` says (:data:`WEIGHT_DECAY_MODES`).
  Objective parameters (margin beta, proxies) get ``objective_learning_rate`` through
  ``optax.multi_transform``. When ``backbone_learning_rate`` or ``head_learning_rate`` is set,
  the model's parameters are split by ``models.param_labels(model_params)`` into backbone and
  embedding head, each with its own rate. A rate of 0 means ``learning_rate``. The weight decay
  applies to the objective's parameters too unless ``decay_objective`` is False (Roth et al.'s
  code gives the margin loss's beta its own group without decay). The 'step'
  schedule decays at ``decay_steps`` and at ``decay_epochs * steps_per_epoch`` (the papers'
  "divide by 10 after epochs 20 and 30").
  """
  check(opt)
  mode = opt.get("weight_decay_mode", "decoupled")
  decay_epochs = tuple(opt.get("decay_epochs", ()))
  if decay_epochs and steps_per_epoch <= 0:
    raise ValueError(f"optimizer.decay_epochs={decay_epochs} needs steps_per_epoch > 0.")
  decay_steps = tuple(d for d in opt.decay_steps if d) + tuple(
      int(round(e * steps_per_epoch)) for e in decay_epochs)

  def one(learning_rate, decay=True):
    sched = learning_rate_schedule(
        learning_rate=learning_rate, schedule=opt.schedule, num_train_steps=num_train_steps,
        decay_steps=tuple(sorted(decay_steps)), decay_factor=opt.decay_factor,
        warmup_steps=opt.warmup_steps)
    weight_decay = opt.weight_decay if decay else 0.0
    if opt.name == "adam" and weight_decay and mode == "decoupled":
      return optax.adamw(sched, weight_decay=weight_decay), sched
    tx = {"adam": lambda: optax.adam(sched),
          "sgd": lambda: optax.sgd(sched, momentum=opt.momentum or None),
          "rmsprop": lambda: optax.rmsprop(sched, momentum=opt.momentum or None)}[opt.name]()
    if weight_decay:  # coupled: L2 added to the gradient before the optimizer
      tx = optax.chain(optax.add_decayed_weights(weight_decay), tx)
    return tx, sched

  model_tx, sched = one(opt.learning_rate)
  transforms = {"model": model_tx,
                "objective": one(opt.objective_learning_rate or opt.learning_rate,
                                 decay=opt.get("decay_objective", True))[0]}
  model_labels = "model"
  if opt.backbone_learning_rate or opt.head_learning_rate:
    if model_params is None:
      raise ValueError("per-part learning rates need the model parameters (model_params).")
    transforms["backbone"] = one(opt.backbone_learning_rate or opt.learning_rate)[0]
    transforms["head"] = one(opt.head_learning_rate or opt.learning_rate)[0]
    model_labels = models.param_labels(model_params)
  tx = optax.multi_transform(transforms, {"model": model_labels, "objective": "objective"})
  return tx, sched
