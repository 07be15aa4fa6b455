"""A thin layer over Orbax's ``CheckpointManager``.

A checkpoint of step ``N`` lives in ``<workdir>/checkpoints/N`` and holds two items:
``state`` (the train-state pytree, ``StandardSave``) and ``meta`` (a small JSON dict,
``JsonSave``). Restoring walks back from the newest step: a checkpoint that cannot be read
(damaged or half-written files) is reported with a warning naming it, and the previous
good one is used.
"""

from __future__ import annotations

import os
from typing import Any

from absl import logging
import jax
import orbax.checkpoint as ocp


def checkpoint_dir(workdir: str) -> str:
  """``<workdir>/checkpoints`` as an absolute path (Orbax needs one)."""
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def make_manager(workdir: str, *, max_to_keep: int | None = 3,
                 read_only: bool = False) -> ocp.CheckpointManager:
  """A ``CheckpointManager`` for ``<workdir>/checkpoints`` with items ``state`` and ``meta``.

  Args:
    workdir: the run directory.
    max_to_keep: newest checkpoints kept on disk (``None`` keeps all).
    read_only: open without creating or deleting anything (evaluation).
  """
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
      enable_async_checkpointing=False)
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                               item_names=("state", "meta"))


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict) -> None:
  """Writes ``state`` (any pytree of arrays) and ``meta`` (JSON-able dict) as ``step``."""
  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
  manager.wait_until_finished()


def steps(manager: ocp.CheckpointManager) -> list[int]:
  """All checkpointed steps, ascending."""
  return sorted(manager.all_steps())


def restore(manager: ocp.CheckpointManager, target: Any, *,
            step: int | None = None) -> tuple[int, Any, dict] | None:
  """Restores a checkpoint into the structure of ``target``.

  Args:
    manager: from :func:`make_manager`.
    target: a pytree with the structure, shapes and dtypes of the saved state (arrays or
      ``jax.ShapeDtypeStruct``).
    step: the step to restore; ``None`` means the newest readable one.

  Returns:
    ``(step, state, meta)``, or ``None`` when there is no checkpoint at all.

  Raises:
    ValueError: ``step`` was given and does not exist or cannot be read, or every
      checkpoint is unreadable.
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
      restored = manager.restore(s, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
      return s, restored["state"], dict(restored["meta"])
    except Exception as e:  # pylint: disable=broad-except
      path = os.path.join(str(manager.directory), str(s))
      logging.warning("Checkpoint %s cannot be restored (%s: %s); trying the previous one.",
                      path, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
      errors.append(f"step {s}: {type(e).__name__}")
  raise ValueError(f"No readable checkpoint in {manager.directory} ({'; '.join(errors)}).")
