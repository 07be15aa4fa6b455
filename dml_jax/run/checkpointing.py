"""A thin layer over Orbax's ``CheckpointManager``.

A checkpoint of step ``N`` lives in ``<workdir>/checkpoints/N`` and holds two items:
``state`` (the train-state pytree, ``StandardSave``) and ``meta`` (a small JSON dict,
``JsonSave``). Restoring walks back from the newest step: a checkpoint that cannot be read
(damaged or half-written files) is reported with a warning naming it, and the previous
good one is used. A readable checkpoint whose array shapes differ from the target's (the
config changed, e.g. ``model.embedding_dim``) is not damage: it raises
:class:`CheckpointMismatchError` naming the arrays, before Orbax tries to read them.

Evaluation restores only some subtrees of the state (``partial=True``: the parameters and
batch statistics, ``restore.restore_model``), so it needs no optimizer to give the shapes of
the rest.
"""

from __future__ import annotations

import os
from typing import Any

from absl import logging
import jax
import orbax.checkpoint as ocp


class CheckpointMismatchError(ValueError):
  """The checkpoint's arrays do not have the shapes / structure that the config builds."""


def checkpoint_dir(workdir: str) -> str:
  """``<workdir>/checkpoints`` as an absolute path (Orbax needs one)."""
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def make_manager(workdir: str, *, max_to_keep: int | None = 3, read_only: bool = False,
                 partial: bool = False) -> ocp.CheckpointManager:
  """A ``CheckpointManager`` for ``<workdir>/checkpoints`` with items ``state`` and ``meta``.

  Args:
    workdir: the run directory.
    max_to_keep: newest checkpoints kept on disk (``None`` keeps all).
    read_only: open without creating or deleting anything (evaluation).
    partial: a read-only manager for ``restore(..., partial=True)`` (some subtrees of the
      state); it reads the files every manager writes.
  """
  read_only = read_only or partial
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
      enable_async_checkpointing=False)
  state_handler = ocp.PyTreeCheckpointHandler() if partial else ocp.StandardCheckpointHandler()
  return ocp.CheckpointManager(
      checkpoint_dir(workdir), options=options,
      item_handlers={"state": state_handler, "meta": ocp.JsonCheckpointHandler()})


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict) -> None:
  """Writes ``state`` (any pytree of arrays) and ``meta`` (JSON-able dict) as ``step``."""
  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
  manager.wait_until_finished()


def steps(manager: ocp.CheckpointManager) -> list[int]:
  """All checkpointed steps, ascending."""
  return sorted(manager.all_steps())


def _path(keys: tuple) -> str:
  return "/".join(str(k) for k in keys)


def check_shapes(manager: ocp.CheckpointManager, step: int, target: Any, *,
                 partial: bool = False) -> None:
  """Compares the saved array shapes of checkpoint ``step`` with ``target``'s (with
  ``partial``, those of the subtrees ``target`` has: a dict of some of the state's keys).

  Raises:
    CheckpointMismatchError: a different tree structure or shape (up to three named).
    Exception: whatever Orbax raises when the metadata itself cannot be read (damage).
  """
  saved = ocp.tree.to_flat_dict(manager.item_metadata(step)["state"])
  wanted = ocp.tree.to_flat_dict(target)
  if partial:
    saved = {k: v for k, v in saved.items() if k[0] in target}
  # Name parameters before the optimizer's copies of them.
  wanted = dict(sorted(wanted.items(), key=lambda kv: kv[0][0] == "opt_state"))
  problems = [f"{_path(k)} is missing from the checkpoint" for k in wanted if k not in saved]
  problems += [f"{_path(k)} is in the checkpoint but not in the config's model"
               for k in saved if k not in wanted]
  problems += [f"{_path(k)} has shape {tuple(saved[k].shape)} in the checkpoint, "
               f"{tuple(wanted[k].shape)} from the config"
               for k in wanted if k in saved and tuple(saved[k].shape) != tuple(wanted[k].shape)]
  if problems:
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    raise CheckpointMismatchError(
        f"the config differs from the checkpoint {os.path.join(str(manager.directory), str(step))}"
        f": {'; '.join(problems[:3])}{more}. Train with the config the checkpoint was made "
        "with, or use a new workdir.")


def restore(manager: ocp.CheckpointManager, target: Any, *, step: int | None = None,
            partial: bool = False) -> tuple[int, Any, dict] | None:
  """Restores a checkpoint into the structure of ``target``.

  Args:
    manager: from :func:`make_manager`.
    target: a pytree with the structure, shapes and dtypes of the saved state (arrays or
      ``jax.ShapeDtypeStruct``).
    step: the step to restore; ``None`` means the newest readable one.
    partial: restore only the subtrees ``target`` has (a dict of some of the state's keys,
      e.g. ``{'params': ..., 'batch_stats': ...}``); ``manager`` from
      ``make_manager(..., partial=True)``.

  Returns:
    ``(step, state, meta)``, or ``None`` when there is no checkpoint at all.

  Raises:
    ValueError: ``step`` was given and does not exist or cannot be read, or every
      checkpoint is unreadable.
    CheckpointMismatchError: a readable checkpoint does not fit ``target``.
  """
  available = steps(manager)
  if step is not None:
    if step not in available:
      raise ValueError(f"No checkpoint for step {step} in {manager.directory}; "
                       f"available steps: {available or 'none'}.")
    candidates = [step]
  else:
    candidates = available[::-1]
  if not candidates:
    return None
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
  errors = []
  for s in candidates:
    try:
      check_shapes(manager, s, abstract, partial=partial)
      state_args = (ocp.args.PyTreeRestore(
          item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
          partial_restore=True) if partial else ocp.args.StandardRestore(abstract))
      restored = manager.restore(s, args=ocp.args.Composite(
          state=state_args, meta=ocp.args.JsonRestore()))
      return s, restored["state"], dict(restored["meta"])
    except CheckpointMismatchError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      path = os.path.join(str(manager.directory), str(s))
      logging.warning("Checkpoint %s cannot be restored (%s: %s); trying the previous one.",
                      path, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
      errors.append(f"step {s}: {type(e).__name__}")
  raise ValueError(f"No readable checkpoint in {manager.directory} ({'; '.join(errors)}).")
