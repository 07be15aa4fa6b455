"""A run's workdir on disk: the config it was trained with, what a rerun may change, its logs.

``train.py --workdir=W`` writes into ``W``:

* ``config.json``: the resolved config (written after a successful restore or a fresh start,
  never before: a rerun that stops leaves the workdir byte-identical);
* ``run.json``: facts resolved at start (``num_train_steps`` from ``num_epochs``);
* ``metrics.jsonl``: a JSON row per log step and per evaluation; a log step's row is the mean
  of the steps ``first_step``..``step`` (since the previous row, or since the checkpoint a
  resumed run started from: the steps between the last row and that checkpoint are in none);
* ``checkpoints/<step>``, ``eval_step_<N>.json``, PNGs, ``train_labels.*`` (label noise);
* ``.dml_jax.lock`` while it trains: the lock that keeps a second run out (``workdir_lock``);
* ``data_cache/``: the memory-mapped decoded-image cache (``data.cache='mmap'``) and evaluation
  cache (``eval.cache``), reused by a rerun and by ``eval.py`` and kept by ``--overwrite``
  (they are checked against their records' fingerprint).

A rerun on an existing workdir resumes it. It may change only the keys of
:data:`RESUMABLE_KEYS` (extending a run, logging, evaluation, where the data is read from);
any other difference stops it before anything is written (:func:`check_rerun`), since the
checkpoints would otherwise be continued, evaluated or described by a config they were not
trained with.
"""

from __future__ import annotations

import difflib
import glob
import json
import os
import shutil
from typing import Any

import jax
import ml_collections
import numpy as np

from dml_jax import objectives
from dml_jax.evaluation import report

CONFIG_FILE = "config.json"
RUN_INFO_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"

# Keys added to the config schema after workdirs were first written, with the value that
# reproduces the older behaviour (or a function of the older config.json's tree giving it);
# load_config fills them into older config.json files.
ADDED_CONFIG_KEYS = {
    # the first runs: the small CNN alone, its BatchNorm trained, in float32, no hidden layer
    "model.bn_mode": "train",
    "model.dtype": "float32",
    "model.embedding_hidden": (),
    "model.pooling": "",
    "eval.metrics": ("retrieval", "clustering"),
    "eval.rho_skip": 0,
    "eval.kmeans_n_init": 10,
    "num_devices": 0,
    "model.conv_impl": "auto",
    "data.noise_seed": 0,
    "data.train_label_set": "",
    "optimizer.backbone_learning_rate": 0.0,
    "optimizer.head_learning_rate": 0.0,
    "scatter_every_steps": 0,
    "num_epochs": 0,
    "data.resize_size": 0,
    "data.channels": 3,
    "data.mean": (0.485, 0.456, 0.406),
    "data.std": (0.229, 0.224, 0.225),
    "data.augmentation": "none",
    "data.flip": True,
    "data.pad": 10,
    "data.pad_fill": 0,
    "data.num_threads": 8,
    "data.num_workers": 0,
    "data.prefetch": 2,
    "optimizer.decay_epochs": (),
    "user_modules": (),
    # before the key: AdamW for adam, L2 in the gradient for sgd / rmsprop
    "optimizer.weight_decay_mode": lambda tree: (
        "decoupled" if tree.get("optimizer", {}).get("name") == "adam" else "coupled"),
    "optimizer.decay_objective": True,
    "memory.size": 0,
    "memory.start_step": 0,
    "memory.reference_gradient": True,
    "eval.retrieval_grid": 0,
    "eval.retrieval_grid_k": 8,
    "eval.retrieval_grid_queries": "random",
    "log.tensorboard": False,
    "log.wandb": False,
    "log.wandb_project": "dml_jax",
    "keep_host_memory": False,
    "data.cache": "none",
    "data.cache_max_gb": 8.0,
    "eval.cache": "none",
    "eval.kmeans": "sklearn",   # NMI's k-means before the JAX one
    "data.epoch": "every_example",
    # BN-Inception runs were fed RGB as it came; the key changes nothing for other models
    "model.rgb_input": lambda tree: tree.get("model", {}).get("name") != "bn_inception",
}

# Dotted keys (a trailing '.' means the whole block) that a rerun may change on a workdir
# with checkpoints: they extend the run, or change logging (``log.``), evaluation, the number
# of devices (1 and N devices compute the same steps), where the same data files are read from
# or how host memory is kept (``keep_host_memory``), or whether images come from the
# decoded-image cache (``data.cache``, ``data.cache_max_gb``: the same crops and flips; equal
# pixels for the crop augmentations, within a few levels for random_resized_crop).
RESUMABLE_KEYS = (
    "num_train_steps", "num_epochs", "log_every_steps", "checkpoint_every_steps",
    "eval_every_steps", "scatter_every_steps", "max_checkpoints_to_keep", "num_devices",
    "eval.", "data.num_threads", "data.num_workers", "data.prefetch",
    "data.options.data_dir", "data.options.root", "data.options.path", "log.",
    "keep_host_memory",
    "data.cache", "data.cache_max_gb", "user_modules",
)

# What train.py writes into a workdir (removed by ``--overwrite``, nothing else is).
# (checkpoints_unreadable: checkpointing.UNREADABLE_DIR, the damaged ones training set aside)
OUTPUTS = ("checkpoints", "checkpoints_unreadable", CONFIG_FILE, RUN_INFO_FILE, METRICS_FILE,
           "eval_step_*.json", "eval_all_steps.json", "eval_all_steps.png", "train_labels.npz",
           "train_labels.json", "tensorboard", "wandb_run_id.txt", "embeddings_step_*.npz",
           # the drawings of train.py / eval.py and of the analysis tools (dml_jax.analysis)
           "scatter_*_step_*.png", "embedding_*_step_*.png", "retrieval_grid_*_step_*.png",
           "similarity_distributions_step_*.png", "tsne_step_*.png",
           "triplet_scatter_*_step_*.png", "sampling_skew_*_step_*.png")


DATA_CACHE_DIR = "data_cache"


def data_cache_dir(workdir: str) -> str:
  """The folder of ``workdir``'s memory-mapped data caches."""
  return os.path.join(workdir, DATA_CACHE_DIR)


# The data options that name a file or folder: recorded absolute in ``config.json``
# (:func:`absolute_data_paths`), so that eval.py and the analysis tools, run from any
# directory, read the files the run read.
DATA_PATH_OPTIONS = ("root", "path", "data_dir")


def _absolute_options(options) -> dict:
  """The relative paths of ``options`` (a data.options mapping) made absolute from the current
  directory; ``''``, URLs (``gs://...``) and ``~/...`` as they are."""
  return {k: os.path.abspath(v) for k, v in options.items()
          if k in DATA_PATH_OPTIONS and isinstance(v, str) and v and "://" not in v
          and not os.path.isabs(v) and not v.startswith("~")}


def absolute_data_paths(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` with its relative ``data.options`` paths (``root``, ``path``, ``data_dir``)
  made absolute from the current directory (a copy; ``config`` itself when there is none)."""
  changed = _absolute_options(config.data.get("options", {}))
  if not changed:
    return config
  config = ml_collections.ConfigDict(config.to_dict())
  config.data.options.update(changed)
  return config


class WorkdirConflictError(ValueError):
  """A rerun asks for a config that differs from the one the workdir was trained with."""


def is_main_process() -> bool:
  """Only process 0 writes logs, metrics, configs and results (checkpoints are collective)."""
  return jax.process_index() == 0


# ----------------------------------------------------------------------------- config


def _fill_added_keys(tree: dict) -> dict:
  """``tree`` (a config as nested dicts) with :data:`ADDED_CONFIG_KEYS` filled in, and the
  objective's hyper-parameters an older ``config.json`` left at their defaults (today's
  configs record them all)."""
  for dotted, value in ADDED_CONFIG_KEYS.items():
    *parents, leaf = dotted.split(".")
    node = tree
    for p in parents:
      node = node.setdefault(p, {})
    if leaf not in node:
      value = value(tree) if callable(value) else value
      node[leaf] = list(value) if isinstance(value, tuple) else value
  loss = tree.get("loss", {})
  if loss.get("name") in objectives.names():
    for key, value in objectives.hparam_defaults(loss["name"]).items():
      loss.setdefault(key, list(value) if isinstance(value, tuple) else value)
  return tree


# What every config.json that train.py ever wrote holds (the keys older ones lack are in
# ADDED_CONFIG_KEYS).
REQUIRED_CONFIG_KEYS = ("seed", "num_train_steps", "batch_size", "data.name", "model.name",
                        "loss.name", "optimizer.name", "eval.splits")


def check_config_tree(tree: Any, path: str) -> None:
  """Raises ``ValueError`` (one line) unless ``tree``, read from ``path``, is a dml_jax config:
  a JSON object with :data:`REQUIRED_CONFIG_KEYS`."""
  if not isinstance(tree, dict):
    raise ValueError(f"{path} is not a dml_jax config: it holds a JSON "
                     f"{type(tree).__name__}, not an object (train.py writes the resolved "
                     "config there).")
  flat = flatten(tree)
  missing = [k for k in REQUIRED_CONFIG_KEYS if k not in flat]
  if missing:
    raise ValueError(f"{path} is not a dml_jax config: it lacks {', '.join(map(repr, missing))} "
                     "(train.py writes the resolved config there).")


def read_config_json(workdir: str) -> dict | None:
  """The ``config.json`` of ``workdir`` as nested dicts (older files completed with
  :data:`ADDED_CONFIG_KEYS`), or ``None`` when there is none.

  Raises:
    ValueError: the file is not JSON or not a dml_jax config (:func:`check_config_tree`).
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    try:
      tree = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not a dml_jax config: not JSON ({e}).") from None
  check_config_tree(tree, path)
  return _fill_added_keys(tree)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config that ``train.py`` wrote into ``workdir``.

  Raises:
    FileNotFoundError: ``workdir`` has no ``config.json``.
  """
  tree = read_config_json(workdir)
  if tree is None:
    raise FileNotFoundError(
        f"{os.path.join(workdir, CONFIG_FILE)} does not exist: {workdir!r} is not a dml_jax "
        "workdir (train.py writes it).")
  return ml_collections.ConfigDict(tree)


def config_json(config: ml_collections.ConfigDict) -> str:
  """The text of ``config.json`` for ``config`` (sorted keys, tuples as lists)."""
  return config.to_json_best_effort(indent=2, sort_keys=True)


def write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes the resolved config as ``config.json`` into ``workdir`` (process 0 only)."""
  if not is_main_process():
    return
  os.makedirs(workdir, exist_ok=True)
  report.write_text_atomic(os.path.join(workdir, CONFIG_FILE), config_json(config))


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
  """``{'a': {'b': 1}}`` -> ``{'a.b': 1}``; lists become tuples."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
  return flat


def config_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
  """The dotted keys whose values differ between two configs (nested dicts), sorted, as
  ``(key, old_value, new_value)``; a key missing on one side has the value ``None``."""
  a, b = flatten(old), flatten(new)
  return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def is_resumable(key: str) -> bool:
  """Whether a rerun may change the dotted config ``key`` (see :data:`RESUMABLE_KEYS`)."""
  return any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE_KEYS)


def format_change(key: str, old: Any, new: Any) -> str:
  return f"{key} {old!r} -> {new!r}"


def check_path(workdir: str) -> None:
  """``ValueError`` when ``workdir`` is a URL (``gs://...``: the run's files are written with
  the local file system), exists but is not a directory, or cannot be created because a folder
  on its path is a file (before any work)."""
  if not workdir:
    raise ValueError("the workdir is empty (''); give a directory: a new one or an earlier "
                     "run's.")
  if "://" in workdir:
    raise ValueError(f"the workdir {workdir!r} is a URL; give a directory of a mounted file "
                     "system (on several hosts one that every host mounts, e.g. NFS or "
                     "gcsfuse).")
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"the workdir {workdir!r} is a file, not a directory; give a new directory "
                     "or an earlier run's.")
  parent = os.path.dirname(os.path.abspath(workdir))
  while not os.path.exists(parent):   # the folder it would be created in
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ValueError(f"the workdir {workdir!r} is inside {parent!r}, a file, so it cannot be "
                     "created; give a new directory or an earlier run's.")


def foreign_outputs(workdir: str) -> list[str]:
  """The names in ``workdir`` that train.py writes (:data:`OUTPUTS`, besides the checkpoints)
  when it has neither a ``config.json`` nor a checkpoint: files of another program, since
  train.py writes ``config.json`` before any of them. ``[]`` for a dml_jax workdir."""
  if (os.path.exists(os.path.join(workdir, CONFIG_FILE))
      or newest_checkpoint_step(workdir) is not None):
    return []
  return sorted(os.path.basename(path) for pattern in OUTPUTS if pattern != "checkpoints"
                for path in glob.glob(os.path.join(glob.escape(workdir), pattern)))


def check_rerun(config: ml_collections.ConfigDict, workdir: str, *,
                override_flag: str = "--config.") -> list[tuple[str, Any, Any]]:
  """Compares ``config`` with the ``config.json`` already in ``workdir``, writing nothing;
  ``override_flag`` (``'--config.'``, the sweep's ``'--set='``) starts the flags the refusal
  names to resume it as trained (the sweep's refusal names deleting the run folder where
  train.py's names ``--overwrite``, which the sweep does not have).

  Returns:
    The changes of resumable keys (``[]`` for a new workdir or an identical config).

  Raises:
    WorkdirConflictError: any other key differs; one line naming the keys (old -> new) and
      the two ways out; or ``workdir`` has no ``config.json`` but files train.py would
      overwrite (:func:`foreign_outputs`).
  """
  old = read_config_json(workdir)
  if old is None:
    foreign = foreign_outputs(workdir)
    if foreign:
      raise WorkdirConflictError(
          f"{workdir} is not a dml_jax workdir: it holds {', '.join(foreign[:3])} but no "
          f"{CONFIG_FILE} (nor a checkpoint), and train.py would overwrite them; nothing was "
          "written. Give a new --workdir.")
    return []
  # a relative data path recorded by an earlier version means the same files from here
  old.get("data", {}).get("options", {}).update(
      _absolute_options(old.get("data", {}).get("options", {})))
  new = _fill_added_keys(json.loads(config_json(absolute_data_paths(config))))
  changes = config_changes(old, new)
  conflicts = [c for c in changes if not is_resumable(c[0])]
  if conflicts:
    listed = "; ".join(format_change(*c) for c in conflicts)
    raise WorkdirConflictError(
        f"{workdir} was trained with a different config ({listed}). Use a new --workdir, "
        f"{resume_flags(conflicts, override_flag)}or "
        + ("add --overwrite to delete this workdir's checkpoints and results and start afresh"
           if override_flag == "--config." else "delete this run folder to train it afresh")
        + f" (keys a rerun may change: "
        f"{', '.join(RESUMABLE_KEYS)}).")
  return changes


def resume_flags(conflicts: list[tuple[str, Any, Any]],
                 override_flag: str = "--config.") -> str:
  """``'resume it as trained with --config.K=V ..., '`` (``override_flag`` then ``K=V``) for
  the ``(key, old, new)`` of :func:`config_changes` when every old value is one such a flag
  gives (a string without spaces, a number or a bool; e.g. a default the config file changed
  since), else ``''``."""
  def flag(value):
    if isinstance(value, str):
      return value if value and not any(c.isspace() or c in "'\"()[]," for c in value) else None
    return str(value) if isinstance(value, (bool, int, float)) else None
  values = [flag(old) for _, old, _ in conflicts]
  if None in values:
    return ""
  return "resume it as trained with " + " ".join(
      f"{override_flag}{key}={v}" for (key, _, _), v in zip(conflicts, values)) + ", "


def check_overwrite(workdir: str) -> None:
  """``ValueError`` (before anything is deleted) when ``--overwrite`` would delete files of
  another program: ``workdir`` holds a ``config.json`` that is not a dml_jax config, files
  train.py writes but neither a ``config.json`` nor a checkpoint (:func:`foreign_outputs`), or
  a ``checkpoints`` folder with entries that are not Orbax step folders (``<step>``)."""
  try:
    read_config_json(workdir)
  except ValueError as e:
    raise ValueError(f"--overwrite: {workdir!r} is not a dml_jax workdir ({e}); nothing was "
                     "deleted. Give a new --workdir.") from None
  outputs = foreign_outputs(workdir)
  if outputs:
    raise ValueError(f"--overwrite: {workdir!r} is not a dml_jax workdir (it holds "
                     f"{', '.join(outputs[:3])} but no {CONFIG_FILE} nor a checkpoint); nothing "
                     "was deleted. Give a new --workdir.")
  folder = os.path.join(workdir, "checkpoints")
  foreign = sorted(name for name in (os.listdir(folder) if os.path.isdir(folder) else ())
                   if not (name[:1].isdigit() and os.path.isdir(os.path.join(folder, name))))
  if foreign:
    raise ValueError(f"--overwrite: {workdir!r} is not a dml_jax workdir ({folder} holds "
                     f"{', '.join(foreign[:3])}, not checkpoint steps); nothing was deleted. "
                     "Give a new --workdir.")


def clear(workdir: str) -> list[str]:
  """Deletes what ``train.py`` wrote into ``workdir`` (``--overwrite``; other files stay).

  Returns:
    The deleted paths.
  """
  removed = []
  # config.json last: a folder whose deletion is cut off (a kill, a second Ctrl-C) still reads
  # as a dml_jax workdir, not as another program's (:func:`foreign_outputs`)
  for pattern in [p for p in OUTPUTS if p != CONFIG_FILE] + [CONFIG_FILE]:
    for path in sorted(glob.glob(os.path.join(glob.escape(workdir), pattern))):
      if os.path.isdir(path):
        shutil.rmtree(path)
      else:
        os.remove(path)
      removed.append(path)
  return removed


def unknown_key_hint(key: str, known) -> str:
  """`` (did you mean X?)`` for the closest of ``known`` to ``key``, or ``''``."""
  close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
  return f" (did you mean {close[0]}?)" if close else ""


# --------------------------------------------------------------------------- run info


def write_run_info(workdir: str, **info) -> None:
  """``run.json``: facts resolved at start (e.g. ``num_train_steps`` from ``num_epochs``);
  written whole (a sweep in another process reads it)."""
  if is_main_process():
    os.makedirs(workdir, exist_ok=True)
    report.write_text_atomic(os.path.join(workdir, RUN_INFO_FILE),
                             json.dumps({k: int(v) for k, v in info.items()}, indent=2))


def final_step(workdir: str, config: ml_collections.ConfigDict) -> int:
  """The last train step of the run in ``workdir``: from ``run.json`` when train.py wrote it
  (needed with ``num_epochs``), else ``config.num_train_steps``."""
  path = os.path.join(workdir, RUN_INFO_FILE)
  if os.path.exists(path):
    with open(path) as f:
      return int(json.load(f)["num_train_steps"])
  if config.get("num_epochs", 0):
    raise ValueError(f"{workdir!r} has no {RUN_INFO_FILE}; with num_epochs the final step is "
                     "only known once train.py has started.")
  return int(config.num_train_steps)


def newest_checkpoint_step(workdir: str) -> int | None:
  """The step of the newest checkpoint folder (``checkpoints/<step>``) in ``workdir``, or
  ``None`` when there is none (read from the folder names, without opening them)."""
  folder = os.path.join(workdir, "checkpoints")
  steps = [int(n) for n in (os.listdir(folder) if os.path.isdir(folder) else ())
           if n.isdigit() and os.path.isdir(os.path.join(folder, n))]
  return max(steps) if steps else None


def check_not_past_the_end(workdir: str, config: ml_collections.ConfigDict) -> None:
  """``ValueError`` when ``workdir``'s newest checkpoint is past the final step ``config``
  would train to there (a shortened rerun: that checkpoint would be reported as the shorter
  run); with ``num_epochs``, the epoch length is the one ``run.json`` recorded."""
  newest = newest_checkpoint_step(workdir)
  if newest is None:
    return
  epochs = config.get("num_epochs", 0)
  path = os.path.join(workdir, RUN_INFO_FILE)
  if epochs > 0 and not os.path.exists(path):
    return   # the epoch length is known once train.py has built the sampler
  if epochs > 0:
    with open(path) as f:
      per_epoch = int(json.load(f)["steps_per_epoch"])
    final, key, needed = epochs * per_epoch, "num_epochs", -(-newest // per_epoch)
  else:
    final, key, needed = int(config.num_train_steps), "num_train_steps", newest
  if newest > final:
    raise ValueError(
        f"{workdir}'s newest checkpoint is step {newest}, past the final step {final} of "
        f"{key}={config[key]}: training would not run and that checkpoint would be reported "
        f"as this run. Give {key} >= {needed}, evaluate an earlier checkpoint with eval.py "
        f"--workdir={workdir} --step=N, or use a new workdir.")


# ---------------------------------------------------------------------------- metrics


def read_metrics(workdir: str) -> list[dict]:
  """The rows of ``metrics.jsonl`` (a last line cut by a kill is dropped)."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if line:
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError:
          break  # a line cut by a kill: drop it and what follows
  return rows


def truncate_metrics(workdir: str, step: int) -> None:
  """Drops rows logged after ``step`` (by a run killed after its last checkpoint)."""
  if not is_main_process():
    return
  rows = [r for r in read_metrics(workdir) if r["step"] <= step]
  report.write_text_atomic(os.path.join(workdir, METRICS_FILE),
                           "".join(json.dumps(r) + "\n" for r in rows))


def append_metrics(workdir: str, row: dict) -> None:
  """Appends one JSON row to ``metrics.jsonl`` (process 0 only)."""
  if not is_main_process():
    return
  with open(os.path.join(workdir, METRICS_FILE), "a") as f:
    f.write(json.dumps(row) + "\n")


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
