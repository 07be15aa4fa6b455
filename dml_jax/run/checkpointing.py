"""A thin layer over Orbax's ``CheckpointManager``.

A checkpoint of step ``N`` lives in ``<workdir>/checkpoints/N`` and holds two items:
``state`` (the train-state pytree, ``StandardSave``) and ``meta`` (a small JSON dict,
``JsonSave``). Restoring walks back from the newest step: a checkpoint that cannot be read
(damaged or half-written files) is reported with a warning naming it, and the previous
good one is used; training then moves the unreadable ones to
``<workdir>/checkpoints_unreadable/`` (nothing is deleted) and saves their steps anew. A
readable checkpoint whose array shapes differ from the target's (the config changed, e.g.
``model.embedding_dim``) is not damage: it raises :class:`CheckpointMismatchError` naming the
arrays, before Orbax tries to read them.

Evaluation restores only some subtrees of the state (``partial=True``: the parameters and
batch statistics, ``restore.restore_model``), so it needs no optimizer to give the shapes of
the rest.
"""

from __future__ import annotations

import contextlib
import gc
import logging as py_logging
import os
import sys
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


# Where training moves the checkpoints it cannot read (``restore(..., set_aside=True)``).
UNREADABLE_DIR = "checkpoints_unreadable"


def _set_aside(manager: ocp.CheckpointManager, unreadable: list[int]) -> None:
  """Moves the checkpoints of the steps ``unreadable`` (newer than the one restored) to
  ``<workdir>/checkpoints_unreadable/<step>``: training past them saves those steps anew,
  and nothing is deleted."""
  directory = str(manager.directory)
  aside = os.path.join(os.path.dirname(directory), UNREADABLE_DIR)
  if jax.process_index() == 0:
    os.makedirs(aside, exist_ok=True)
    for s in unreadable:
      target, n = os.path.join(aside, str(s)), 1
      while os.path.lexists(target):
        target, n = os.path.join(aside, f"{s}.{n}"), n + 1
      os.replace(os.path.join(directory, str(s)), target)
      logging.warning("Moved the unreadable checkpoint of step %d to %s.", s, target)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    multihost_utils.sync_global_devices("dml_jax: unreadable checkpoints set aside")
  manager.reload()


@contextlib.contextmanager
def _quiet_orbax_leftovers():
  """Drops what Orbax's unfinished reads of a damaged checkpoint leave behind (:func:`restore`
  names the checkpoint in one warning): the "Exception ignored in <coroutine ...>" reports at
  garbage collection, and TensorStore's callbacks into Orbax's closed event loop ("Event
  loop is closed"), and asyncio's "Task exception was never retrieved" for Orbax's reads.
  Every other unraisable exception and log record goes where it went."""
  previous = sys.unraisablehook

  def keep(record: py_logging.LogRecord) -> bool:
    message = record.getMessage()
    return not ("never retrieved" in message and f"{os.sep}orbax{os.sep}" in message)

  def hook(unraisable):
    code = getattr(unraisable.object, "cr_code", None)
    value = unraisable.exc_value
    if not ((code and f"{os.sep}orbax{os.sep}" in code.co_filename)
            or (isinstance(value, RuntimeError) and str(value) == "Event loop is closed")):
      previous(unraisable)

  asyncio_log = py_logging.getLogger("asyncio")
  sys.unraisablehook = hook
  asyncio_log.addFilter(keep)
  try:
    yield
  finally:
    gc.collect()
    sys.unraisablehook = previous
    asyncio_log.removeFilter(keep)


def restore(manager: ocp.CheckpointManager, target: Any, *, step: int | None = None,
            partial: bool = False, set_aside: bool = False) -> tuple[int, Any, dict] | None:
  """Restores a checkpoint into the structure of ``target``.

  Args:
    manager: from :func:`make_manager`.
    target: a pytree with the structure, shapes and dtypes of the saved state (arrays or
      ``jax.ShapeDtypeStruct``).
    step: the step to restore; ``None`` means the newest readable one.
    partial: restore only the subtrees ``target`` has (a dict of some of the state's keys,
      e.g. ``{'params': ..., 'batch_stats': ...}``); ``manager`` from
      ``make_manager(..., partial=True)``.
    set_aside: move the unreadable checkpoints newer than the one restored out of the
      manager's folder (:data:`UNREADABLE_DIR`), so that training can save their steps again.

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
  errors, failed = [], []
  with _quiet_orbax_leftovers():
    for s in candidates:
      try:
        restored = _restore_step(manager, s, abstract, partial=partial)
      except CheckpointMismatchError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        path = os.path.join(str(manager.directory), str(s))
        first = str(e).splitlines()[0] if str(e) else ""
        logging.warning("Checkpoint %s cannot be restored (%s: %s); trying the previous one.",
                        path, type(e).__name__, first.split(" See full TensorStore details")[0])
        errors.append(f"step {s}: {type(e).__name__}")
        failed.append(s)
        continue
      if set_aside and failed:
        _set_aside(manager, failed)
      return s, restored["state"], dict(restored["meta"])
  raise ValueError(f"No readable checkpoint in {manager.directory} ({'; '.join(errors)}).")


def _restore_step(manager: ocp.CheckpointManager, s: int, abstract: Any, *,
                  partial: bool) -> Any:
  """Orbax's restore of step ``s`` into ``abstract`` (its shapes checked first)."""
  check_shapes(manager, s, abstract, partial=partial)
  state_args = (ocp.args.PyTreeRestore(
      item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
      partial_restore=True) if partial else ocp.args.StandardRestore(abstract))
  return manager.restore(s, args=ocp.args.Composite(state=state_args,
                                                    meta=ocp.args.JsonRestore()))
