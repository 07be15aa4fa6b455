r"""Experiment configs as table rows: build, variants, validation, and ``show``.

A config file (``configs/X.py``) is a row of the experiment table: ``ROW``, a dict of dotted
keys -> values that ``configs/default.py`` changes (recipe dicts of ``configs/recipes.py``
merged in explicitly), and ``VARIANTS``, a dict of variant name -> overrides (a dict like
``ROW``, or a function of the config that returns one). Its ``get_config(arg)`` is
``config.build(ROW, arg, VARIANTS, path=__file__)``; ``--config=configs/X.py:a,b`` applies the
variants ``a`` and ``b`` (in the order ``VARIANTS`` lists them). Files whose variants pick one
of several rows name those ``groups`` (at most one name of each; each named once) and the
``default`` variants used when the argument names none of them.

In a row, a dict value replaces the whole section (``'loss': {...}``, ``'data.options':
{...}``); any other value sets one key, which ``configs/default.py`` must have (``loss.*`` and
``data.options.*`` keys excepted: those sections are free-form).

:func:`validate` is the one check of a resolved config that ``train.py``, ``eval.py`` and the
sweep run before any work; it calls each component's own check (optimizers, data pipeline,
cache, augmentation, backbone options, memory, logging backends, evaluation protocols).

  python -m dml_jax.run.config show configs/cub_ephn_2nd.py [--diff-default] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import ml_collections

Overrides = Union[Mapping[str, Any], Callable[[ml_collections.ConfigDict], Mapping[str, Any]]]

# Sections whose keys are not fixed by configs/default.py.
FREE_SECTIONS = ("loss", "data.options")


# ---------------------------------------------------------------------------- rows


def apply_row(config: ml_collections.ConfigDict,
              row: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """Sets the dotted ``key -> value`` entries of ``row`` on ``config`` (in place; returned).

  Raises:
    ValueError: a key that ``config`` lacks outside ``FREE_SECTIONS`` (naming it).
  """
  for key, value in row.items():
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    parent = ".".join(parents)
    if leaf not in node and parent not in FREE_SECTIONS:
      raise ValueError(f"config row key {key} is not a key of configs/default.py")
    if isinstance(value, Mapping):
      value = ml_collections.ConfigDict(dict(value))
    node[leaf] = value
  return config


def select(arg: str, variants: Mapping[str, Any], *, groups: Sequence[Sequence[str]] = (),
           default: str = "", path: str = "") -> list[str]:
  """The variant names of ``arg`` (``'a,b'``) in the order ``variants`` lists them.

  Args:
    arg: the part of ``--config=PATH:arg`` after the colon ('' for none).
    variants: the file's ``VARIANTS``.
    groups: tuples of variants of which an argument names one each (rows of a table).
    default: the variants (``'a,b'``) added when ``arg`` names none of ``groups``.
    path: the config file, for the message.

  Raises:
    ValueError: one line naming an unknown variant and the allowed ones, two variants of one
      group, or a group left out.
  """
  where = f"--config={path}:{arg}" if path else f"config argument {arg!r}"
  names = [n for n in arg.split(",") if n]
  for name in names:
    if name not in variants:
      allowed = ", ".join(variants) or "none (the file has no variants)"
      raise ValueError(f"unknown variant {name!r} in {where}; allowed: {allowed}")
  grouped = {n for g in groups for n in g}
  if default and not grouped & set(names):
    names = [n for n in default.split(",") if n] + names
  for group in groups:
    chosen = [n for n in dict.fromkeys(names) if n in group]
    if len(chosen) != 1:
      what = "names more than one of" if chosen else "needs one of"
      raise ValueError(f"{where} {what} {', '.join(group)}")
  return [n for n in variants if n in names]


def build(row: Mapping[str, Any], arg: str = "", variants: Mapping[str, Overrides] | None = None,
          *, groups: Sequence[Sequence[str]] = (), default: str = "", path: str = "",
          base: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
  """``configs/default.py``'s config (or ``base``) with ``row`` and the variants of ``arg``.

  A variant is a row dict, a function ``config -> row dict`` (e.g. ``recipes.smoke``, whose
  values depend on the row), or a tuple of those applied in turn.
  """
  variants = variants or {}
  if base is None:
    from configs import default as default_lib  # pylint: disable=import-outside-toplevel
    base = default_lib.get_config()
  config = apply_row(base, row)
  for name in select(arg, variants, groups=groups, default=default,
                     path=os.path.relpath(path) if path else ""):
    parts = variants[name]
    for part in parts if isinstance(parts, tuple) else (parts,):
      apply_row(config, part(config) if callable(part) else part)
  return config


# --------------------------------------------------------------------------- validate


def validate(config: ml_collections.ConfigDict, splits: Mapping | None = None) -> None:
  """Checks a resolved config before any work: the values no component checks itself, then
  each component's own check; with ``splits`` (the loaded dataset) also the evaluation
  protocols against it.

  Raises:
    ValueError: one line naming the bad key, its value and what is allowed.
    FileNotFoundError: ``model.pretrained`` is missing (with the command that converts it).
  """
  # pylint: disable=import-outside-toplevel  (the library, only when a config is checked)
  from dml_jax import data as data_lib
  from dml_jax import memory as memory_lib
  from dml_jax import models
  from dml_jax import optimizers
  from dml_jax.run import writers
  from dml_jax.data import augment
  from dml_jax.data import cache as cache_lib
  from dml_jax.data import eval_cache
  from dml_jax.data import noise
  from dml_jax.data import pipeline
  from dml_jax.evaluation import protocols
  from dml_jax.models import conv, resnet
  for key in ("num_train_steps", "batch_size", "log_every_steps", "checkpoint_every_steps"):
    if not isinstance(value := config[key], int) or value <= 0:
      raise ValueError(f"config.{key} must be a positive integer, got {value!r}.")
  for key in ("eval_every_steps", "num_epochs", "scatter_every_steps",
              "max_checkpoints_to_keep"):
    if not isinstance(value := config[key], int) or value < 0:
      raise ValueError(f"config.{key} must be an integer >= 0, got {value!r}.")
  if not config.eval.splits:   # no evaluation: nothing to draw either
    for key, value in (("scatter_every_steps", config.scatter_every_steps),
                       ("eval.retrieval_grid", config.eval.get("retrieval_grid", 0))):
      if value:
        raise ValueError(f"config.{key}={value} draws the first protocol of eval.splits, which "
                         "is empty (no evaluation); set eval.splits or 0.")
  if not isinstance(value := config.data.prefetch, int) or value < 0:
    raise ValueError(f"config.data.prefetch must be an integer >= 0 (batches decoded ahead), "
                     f"got {value!r}.")
  optimizers.check(config.optimizer)
  pipeline.resolve_workers(config.data.num_workers, config.data.num_threads, platform="cpu",
                           cpus=1)   # only checks the value
  cache_lib.check_mode(config.data.cache, config.data.cache_max_gb)
  eval_cache.check_mode(config.eval.cache)
  if not 2 <= config.data.group_size <= config.batch_size:
    raise ValueError(f"data.group_size={config.data.group_size} must be between 2 and "
                     f"batch_size={config.batch_size} (examples per class in a batch; an anchor "
                     "needs a positive).")
  n = config.data.group_size
  if config.batch_size % n:
    raise ValueError(f"batch_size={config.batch_size} must be a multiple of data.group_size={n} "
                     f"(groups of n examples of a class fill a batch), e.g. "
                     f"{config.batch_size // n * n}.")
  for key, allowed in (("small_class", data_lib.SMALL_CLASS_MODES),
                       ("epoch", data_lib.EPOCH_MODES)):
    if (value := config.data[key]) not in allowed:
      raise ValueError(f"Unknown data.{key} {value!r}; allowed: {', '.join(allowed)}.")
  if config.data.epoch == "pad_to_largest" and config.data.small_class == "skip":
    raise ValueError("data.small_class='skip' drops the classes that data.epoch='pad_to_largest' "
                     "pads; use 'all' or 'replace'.")
  noise.check_options(label_noise=config.data.label_noise,
                      clean_fraction=config.data.clean_fraction,
                      noise_seed=config.data.get("noise_seed", 0), prefix="config.data.")
  if config.data.label_noise and config.data.clean_fraction != 1.0:
    raise ValueError(
        f"config.data.label_noise={config.data.label_noise} and config.data.clean_fraction="
        f"{config.data.clean_fraction}: the clean topline is a separate run; set one of them.")
  if config.data.name in data_lib.IMAGE_DATASETS:
    if config.data.image_size <= 0:
      raise ValueError(f"config.data.image_size must be > 0 for the image dataset "
                       f"{config.data.name!r} (e.g. 224), got {config.data.image_size}.")
    data = config.data
    augment.check_options(augmentation=data.augmentation, image_size=data.image_size,
                          resize_size=data.resize_size or round(data.image_size * 8 / 7),
                          channels=data.channels, mean=data.mean, std=data.std,
                          pad=data.pad, pad_fill=data.pad_fill)
  elif config.data.image_size:
    raise ValueError(
        f"config.data.image_size={config.data.image_size}: the in-memory dataset "
        f"{config.data.name!r} has a fixed size; use 0 (its native size).")
  model = config.model
  if model.name not in models.MODELS:
    raise ValueError(f"Unknown model.name {model.name!r}; allowed: {', '.join(models.names())}.")
  takes = inspect.signature(models.MODELS[model.name].__init__).parameters
  for key in model_options(model):   # the backbone options set away from the default
    if key not in takes:
      others = [n for n, cls in models.MODELS.items()
                if key in inspect.signature(cls.__init__).parameters]
      raise ValueError(f"config.model.{key}={model[key]!r}: model.name={model.name!r} has no "
                       f"{key} option; leave it at its default (the models with one: "
                       f"{', '.join(others)}).")
  if not isinstance(model.embedding_dim, int) or model.embedding_dim <= 0:
    raise ValueError(f"config.model.embedding_dim must be a positive integer, got "
                     f"{model.embedding_dim!r}.")
  conv.conv_function(model.get("conv_impl", "auto"))   # one line listing conv.CONV_IMPLS
  if not isinstance(model.get("rgb_input", True), bool):
    raise ValueError(f"config.model.rgb_input={model.rgb_input!r} must be True or False.")
  if model.name != "small_cnn":
    resnet.check_options(pooling=model.get("pooling", "") or "avg",
                         bn_mode=model.get("bn_mode", "train"),
                         dtype=model.get("dtype", "float32"))
  memory_lib.check(config.memory.size, config.memory.start_step, batch_size=config.batch_size)
  if config.model.pretrained and not os.path.exists(config.model.pretrained):
    raise FileNotFoundError(
        f"config.model.pretrained={config.model.pretrained!r} does not exist. Convert "
        "torchvision weights first: python -m dml_jax.models.pretrained convert --arch "
        f"{config.model.name} --torch_checkpoint <file.pth> --output {config.model.pretrained}")
  writers.config_backends(config)
  if splits is not None:
    protocols.validate_eval_config(config, splits)


def model_options(model: ml_collections.ConfigDict) -> dict:
  """The backbone options of ``config.model`` that differ from the defaults, as keyword
  arguments of ``models.make`` (``rgb_input`` only for a model that takes it; :func:`validate`
  refuses any other that the model lacks)."""
  from dml_jax import models  # pylint: disable=import-outside-toplevel
  defaults = {"dtype": "float32", "pooling": "", "bn_mode": "train", "embedding_hidden": (),
              "conv_impl": "auto", "rgb_input": True}
  cls = models.MODELS.get(model.name)
  takes = inspect.signature(cls.__init__).parameters if cls is not None else {}
  options = {}
  for key, default in defaults.items():
    value = model.get(key, default)
    value = tuple(value) if isinstance(value, (list, tuple)) else value
    if value != default and (key != "rgb_input" or key in takes):   # BN-Inception's only
      options[key] = value
  return options


def make_objective(config: ml_collections.ConfigDict):
  """``objectives.make(**config.loss)``; a bad hyper-parameter's error names its config key
  (``scale must be ...`` -> ``loss.scale must be ...``).

  Raises:
    ValueError: an unknown ``loss.name`` or a value its builder refuses, in one line.
  """
  # pylint: disable=import-outside-toplevel
  from dml_jax import objectives
  from dml_jax.run import overrides
  loss = config.loss.to_dict()
  overrides.check_objective_name(loss.get("name"))
  try:
    return objectives.make(**loss)
  except ValueError as e:
    message = str(e)
    name = message.split("=")[0].split(" ")[0]
    if name in loss and len(e.args) == 1:
      e.args = (f"loss.{message}",)
    raise


def validate_training(config: ml_collections.ConfigDict) -> None:
  """The checks of a run about to train that a recorded run's config need not pass to be
  evaluated (a run recorded before a check keeps evaluating); after :func:`validate`.

  Raises:
    ValueError: ``data.augmentation`` on an in-memory dataset, which is never augmented.
  """
  from dml_jax import data as data_lib  # pylint: disable=import-outside-toplevel
  if (config.data.name not in data_lib.IMAGE_DATASETS
      and config.data.get("augmentation", "none") != "none"):
    raise ValueError(
        f"config.data.augmentation={config.data.augmentation!r}: the in-memory dataset "
        f"{config.data.name!r} is not augmented (only the image datasets are); use 'none'.")


# ------------------------------------------------------------------------------ show


def flatten(config: ml_collections.ConfigDict | Mapping, prefix: str = "") -> dict[str, Any]:
  """``{'data.name': ..., ...}``: the dotted keys of ``config`` and their values."""
  out = {}
  for key, value in config.items():
    if isinstance(value, (ml_collections.ConfigDict, Mapping)):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def resolve(spec: str, sets: Mapping[str, str] = ()) -> ml_collections.ConfigDict:
  """The config of ``configs/X.py[:variants]`` with ``key=value`` string overrides applied by
  the rules of ``dml_jax.run.overrides`` (the objective's hyper-parameters filled in), after
  importing the config's ``user_modules``."""
  from dml_jax.run import overrides  # pylint: disable=import-outside-toplevel
  config = overrides.load_config_file(spec)
  overrides.import_user_modules(config.get("user_modules", ()), from_config=True)
  return overrides.apply(config, dict(sets), from_strings=True)


def diff_default(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The dotted keys of ``config`` whose values differ from ``configs/default.py``'s (or that
  it lacks)."""
  from configs import default as default_lib  # pylint: disable=import-outside-toplevel
  base = flatten(default_lib.get_config())
  marker = object()
  return {k: v for k, v in flatten(config).items() if base.get(k, marker) != v}


def format_row(values: Mapping[str, Any]) -> str:
  """``key = value`` lines, values as JSON (tuples as lists)."""
  return "\n".join(f"{k} = {json.dumps(v, default=list)}" for k, v in values.items())


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dml_jax.run.config",
                                   description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("show", help="print the resolved row of a config")
  p.add_argument("config", help="configs/X.py[:variant[,variant]]")
  p.add_argument("--diff-default", "--diff_default", action="store_true", dest="diff",
                 help="only the keys that differ from configs/default.py")
  p.add_argument("--set", action="append", default=[], dest="sets",
                 help="override key=value (repeatable), as the sweep's --set")
  p.add_argument("--module", action="append", default=[],
                 help="a module to import first (own objective; dotted name or .py path)")
  args = parser.parse_args(argv)
  from dml_jax.run import overrides  # pylint: disable=import-outside-toplevel
  try:
    sets = overrides.parse_assignments(args.sets)
  except ValueError as e:
    parser.error(str(e))
  try:
    overrides.import_user_modules(args.module)
    config = resolve(args.config, sets)
  except (ValueError, TypeError) as e:
    print(f"{parser.prog}: {e}", file=sys.stderr)
    return 1
  try:
    print(format_row(diff_default(config) if args.diff else flatten(config)), flush=True)
  except BrokenPipeError:   # `show ... | head`: the reader has what it wanted
    sys.stdout = open(os.devnull, "w")  # pylint: disable=consider-using-with
  return 0


if __name__ == "__main__":
  sys.exit(main())
