"""Config overrides from the command line (``--config.K=V``, the sweep's ``--set`` / ``--grid``).

One set of rules for every binary:

* a key the config file does not have is refused in one line, with the closest key
  (``unknown config key loss.margn (did you mean loss.margin?)``);
* ``loss.*`` keys are the objective's hyper-parameters, so they are checked against the
  objective, not against the config file: ``--config.loss.margin=0.2`` is accepted for
  ``triplet`` even when the file's loss block has no ``margin``;
* ``loss.name=X`` that changes the objective starts the loss block afresh: X's defaults plus
  the ``loss.*`` keys given with it (the file's keys belonged to the other objective);
* ``num_train_steps`` given while the config trains ``num_epochs`` is refused (epochs would win).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import ml_collections

from dml_jax import objectives

LOSS = "loss."


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """``'configs/X.py'`` or ``'configs/X.py:arg'`` -> ``get_config(arg)`` of that file (``arg``:
  its variants, ``dml_jax/run/config.py``).

  Raises:
    ValueError: the file does not exist or defines no ``get_config``.
  """
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"config file {path} does not exist")
  root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
  if root not in sys.path:
    sys.path.insert(0, root)
  # the repository's configs/ (default.py, recipes.py), which a config builds on, also when
  # the command runs outside the repository (python -m dml_jax.run.experiments from elsewhere)
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
  if (os.path.isfile(os.path.join(repo, "configs", "default.py"))
      and os.path.abspath(repo) not in map(os.path.abspath, sys.path)):
    sys.path.append(repo)
  module_spec = importlib.util.spec_from_file_location("_dml_jax_config", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
      raise ValueError(f"config file {path} has no get_config() function (a config file "
                       "defines get_config(arg='') returning the config; see configs/*.py)")
    return module.get_config(arg) if arg else module.get_config()
  except ImportError as e:
    if e.name != "configs" and not str(e.name).startswith("configs."):
      raise
    # a package install run outside the checkout, or another package named configs first
    raise ValueError(f"config file {path}: {e}; a config builds on configs/default.py and "
                     "recipes.py of a dml_jax checkout: keep the file in the checkout's configs/ "
                     "folder (another package named configs hides them)") from e


def _flat_keys(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
  keys = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      keys.update(_flat_keys(value, f"{prefix}{key}."))
    else:
      keys[f"{prefix}{key}"] = value
  return keys


def _did_you_mean(key: str, known) -> str:
  close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
  return f" (did you mean {close[0]}?)" if close else ""


def unknown_section(config: ml_collections.ConfigDict, key: str) -> str | None:
  """The one-line error for an override ``key`` that goes through a section ``config`` does
  not have (``optimzer.learning_rate``: ``unknown config section optimzer in
  --config.optimzer.learning_rate (did you mean optimizer?); sections: data, ...``), or
  ``None`` when every section on its way exists (its last part is checked by :func:`apply`)."""
  *parents, _ = key.split(".")
  node, prefix = config, ""
  for part in parents:
    sections = [f"{prefix}{k}" for k, v in node.items()
                if isinstance(v, ml_collections.ConfigDict)]
    bad = f"{prefix}{part}"
    if part in node and bad not in sections:
      return f"config key {bad} is a value, not a section: --config.{key}"
    if bad not in sections:
      listed = (f"sections{' of ' + prefix[:-1] if prefix else ''}: {', '.join(sections)}"
                if sections else f"{prefix[:-1]} has no sections")
      return (f"unknown config section {bad} in --config.{key}"
              f"{_did_you_mean(bad, sections)}; {listed}")
    node, prefix = node[part], f"{prefix}{part}."
  return None


def parse_assignments(items) -> dict[str, str]:
  """``['a.b=1', 'c = x']`` (``--set`` values) -> ``{'a.b': '1', 'c': 'x'}``.

  Raises:
    ValueError: an item without ``=`` (naming it).
  """
  out = {}
  for item in items:
    if "=" not in item:
      raise ValueError(f"--set {item!r} needs key=value")
    key, value = item.split("=", 1)
    out[key.strip()] = value.strip()
  return out


def convert(key: str, raw: str, current: Any) -> Any:
  """The string ``raw`` converted to the type of ``current`` (the value it replaces); a new
  key (``current is None``) takes a Python literal or stays a string.

  Raises:
    ValueError: ``raw`` does not convert (naming the key and the expected type).
  """
  try:
    if isinstance(current, bool):
      if raw.lower() in ("true", "1", "yes"):
        return True
      if raw.lower() in ("false", "0", "no"):
        return False
      raise ValueError
    if isinstance(current, int):
      return int(raw)
    if isinstance(current, float):
      return float(raw)
    if isinstance(current, (tuple, list)):
      try:
        value = ast.literal_eval(raw)
      except (ValueError, SyntaxError):   # test,test:alphabet: a list of words
        if re.search(r"[\[\](){}'\"]", raw):
          raise
        return tuple(word.strip() for word in raw.split(",") if word.strip())
      return tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if isinstance(current, str):
      return raw
    if current is None:
      try:
        return ast.literal_eval(raw)
      except (ValueError, SyntaxError):
        return raw
  except (ValueError, SyntaxError):
    raise ValueError(f"cannot convert {raw!r} for config key {key} to the type of its "
                     f"current value {current!r} ({type(current).__name__})") from None
  raise ValueError(f"config key {key} holds a {type(current).__name__}; it can only be set "
                   "in the config file")


EVAL = "eval."


def evaluation_overrides(config: ml_collections.ConfigDict, items) -> dict[str, Any]:
  """eval.py's ``--set`` values (``['eval.ks=1,2,4,8', 'eval.metrics=retrieval']``) as typed
  ``{key: value}`` for a run's ``config``: only ``eval.*`` keys, each converted to the type of
  the run's value (a list of words may be written ``test,test:alphabet``).

  Raises:
    ValueError: one line naming a key outside ``eval.``, an unknown ``eval`` key (with the
      closest one) or a value that does not convert.
  """
  known = {k: v for k, v in _flat_keys(config).items() if k.startswith(EVAL)}
  out = {}
  for key, raw in parse_assignments(items).items():
    if not key.startswith(EVAL):
      raise ValueError(f"--set={key}={raw}: eval.py changes only the evaluation (eval.* keys, "
                       "e.g. --set=eval.ks=1,2,4,8); the run's data, model and objective are "
                       "its checkpoint's")
    if key not in known:
      raise ValueError(f"--set={key}={raw}: unknown config key{_did_you_mean(key, known)}; "
                       f"the eval keys: {', '.join(sorted(k[len(EVAL):] for k in known))}")
    out[key] = convert(key, raw, known[key])
    if key == "eval.splits" and not out[key]:
      raise ValueError(f"--set={key}={raw}: no protocol left to evaluate; give one or more, "
                       "e.g. --set=eval.splits=test")
  return out


def evaluation_tag(values: Mapping[str, Any]) -> str:
  """The file-name part that tells an evaluation under ``values`` (typed ``eval.*``
  overrides) from the run's own: ``{'eval.ks': (1, 2, 4)}`` -> ``'ks=1,2,4'``; several
  joined by ``+`` in key order; characters outside ``[A-Za-z0-9._,=+:@-]`` become ``_``,
  and a tag over 100 characters becomes ``set-`` and 10 hex digits of its hash."""
  def text(value):
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
  tag = "+".join(f"{key[len(EVAL):]}={text(values[key])}" for key in sorted(values))
  tag = re.sub(r"[^A-Za-z0-9._,=+:@-]", "_", tag)
  return tag if len(tag) <= 100 else "set-" + hashlib.sha1(tag.encode()).hexdigest()[:10]


def check_objective_name(name: str) -> None:
  """Raises ValueError (one line with the registered names) unless ``loss.name`` is one."""
  if name not in objectives.names():
    raise ValueError(f"unknown objective loss.name={name!r}; registered: "
                     f"{', '.join(objectives.names())}")


def apply(base: ml_collections.ConfigDict, overrides: Mapping[str, Any], *,
          from_strings: bool = False) -> ml_collections.ConfigDict:
  """A copy of ``base`` with dotted ``key -> value`` overrides applied by the module's rules.

  Args:
    base: the config as its file builds it.
    overrides: dotted keys -> values (typed, or strings with ``from_strings``).
    from_strings: convert string values to the type of the value they replace.

  Raises:
    ValueError: one line naming an unknown key (with the closest known key), a bad value, a
      hyper-parameter the objective does not take, or ``num_train_steps`` with ``num_epochs``.
  """
  config = ml_collections.ConfigDict(base.to_dict())
  known = _flat_keys(config)
  loss = config.loss.to_dict()
  name = overrides.get("loss.name", loss["name"])
  check_objective_name(name)
  if name != loss["name"]:
    loss = {"name": name, **objectives.hparam_defaults(name)}
  defaults = objectives.hparam_defaults(name)
  for key, value in overrides.items():
    if key.startswith(LOSS):
      leaf = key[len(LOSS):]
      if leaf != "name" and leaf not in defaults:
        hint = _did_you_mean(key, [LOSS + d for d in defaults])
        raise ValueError(f"unknown config key {key}{hint} for objective {name!r}; its keys: "
                         f"{', '.join(defaults)}")
      if from_strings:
        value = convert(key, value, loss.get(leaf, defaults.get(leaf)))
      loss[leaf] = value
      continue
    if key not in known:
      raise ValueError(f"unknown config key {key}{_did_you_mean(key, known)}")
    if from_strings:
      value = convert(key, value, known[key])
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value
  # Every hyper-parameter of the objective is recorded (config.json), defaults included.
  config.loss = ml_collections.ConfigDict({"name": name, **defaults, **loss})
  if "num_train_steps" in overrides and config.get("num_epochs", 0) > 0:
    raise ValueError(
        f"num_train_steps={overrides['num_train_steps']} has no effect: this config trains "
        f"num_epochs={config.num_epochs} epochs; add --config.num_epochs=0 to train by steps "
        "(or set num_epochs instead)")
  return config


# Set on a user module file imported from a config's ``user_modules`` (a workdir's record, a
# config file's list) rather than given on the command line: only the latter stand in for a
# recorded module that moved (:func:`import_user_modules`).
_FROM_CONFIG = "__dml_jax_from_config__"


def import_user_modules(specs, *, from_config: bool = False) -> list:
  """Imports the user's modules (e.g. ones that call ``objectives.register``).

  Args:
    specs: module names importable from the current directory / ``sys.path``
      (``my_pkg.losses``) or paths of ``.py`` files.
    from_config: ``specs`` is a config's ``user_modules`` (a workdir's record, a config
      file's list), not modules given on the command line (``--module``).

  Returns:
    The imported modules, in the order of ``specs``. A ``.py`` file that does not exist, or
    a module name that cannot be imported from here (a workdir's ``config.user_modules``
    after the file moved, or read from another directory), is the module of a file of the
    same name (``losses.py`` for ``my_pkg.losses``) among ``specs`` or given on the command
    line before (``eval.py --module=NEW_PATH``); a file another workdir's record imported
    (``eval.py --workdirs``) never stands for it.

  Raises:
    ValueError: a module cannot be found (naming it).
  """
  specs = list(specs)
  missing = lambda i: specs[i].endswith(".py") and not os.path.isfile(specs[i])
  modules, files = [None] * len(specs), {}
  for i in sorted(range(len(specs)), key=missing):   # the files that exist first
    modules[i] = _import_user_module(specs[i], files, from_config=from_config)
    if specs[i].endswith(".py"):
      files[os.path.basename(specs[i])] = modules[i]
  return modules


def _import_user_module(spec: str, files: dict, *, from_config: bool):
  """One module of :func:`import_user_modules`; ``files``: file name -> module of the files
  of its ``specs`` that exist."""
  is_file = spec.endswith(".py")
  stem = os.path.splitext(os.path.basename(spec))[0] if is_file else spec.rsplit(".", 1)[-1]
  # a recorded module that moved: a file of its name given with it (or before, with --module)
  # stands for it
  moved = [m for n, m in sys.modules.items()
           if re.fullmatch(rf"dml_jax_user_{re.escape(stem)}_[0-9a-f]{{8}}", n)
           and not getattr(m, _FROM_CONFIG, False)]
  stand_in = files.get(f"{stem}.py") or (moved[-1] if moved else None)
  if is_file:
    if not os.path.isfile(spec):
      if stand_in is not None:
        return stand_in
      where = "" if os.path.isabs(spec) else f" (from the current directory {os.getcwd()})"
      raise ValueError(f"user module file {spec} does not exist{where}; if it moved, give "
                       "its path now with --module=PATH")
    # one module per file: two files of one name in other folders are two modules
    path = os.path.abspath(spec)
    name = f"dml_jax_user_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    if name not in sys.modules:
      module_spec = importlib.util.spec_from_file_location(name, path)
      module = importlib.util.module_from_spec(module_spec)
      if from_config:
        setattr(module, _FROM_CONFIG, True)
      sys.modules[name] = module
      try:
        module_spec.loader.exec_module(module)
      except ImportError as e:   # what it imports is not there (or no longer, in dml_jax)
        del sys.modules[name]
        raise ValueError(f"user module {spec} cannot be imported: {e}") from None
    return sys.modules[name]
  if os.getcwd() not in sys.path and "" not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    return importlib.import_module(spec)
  except ModuleNotFoundError as e:
    parts = spec.split(".")
    if e.name not in {".".join(parts[:k]) for k in range(1, len(parts) + 1)}:
      raise ValueError(f"user module {spec!r} cannot be imported: {e}") from None   # its import
    if stand_in is not None:   # e.g. recorded from another directory: --module=PATH given
      return stand_in
    raise ValueError(f"user module {spec!r} cannot be imported ({e}) from the current "
                     f"directory {os.getcwd()}; give a module importable from here or its "
                     f"file with --module=PATH") from None
  except ImportError as e:   # a name it imports is not there (or no longer, in dml_jax)
    raise ValueError(f"user module {spec!r} cannot be imported: {e}") from None


def module_spec(spec: str) -> str:
  """How a user module is recorded in ``config.user_modules``: ``.py`` paths absolute (so
  ``eval.py`` finds them from any directory), module names as given."""
  return os.path.abspath(spec) if spec.endswith(".py") else spec


def user_modules(*groups) -> tuple[str, ...]:
  """The modules of ``groups`` (a config file's ``user_modules``, then ``--module`` flags) as
  ``config.user_modules`` records them (:func:`module_spec`), each once, in order."""
  return tuple(dict.fromkeys(module_spec(m) for group in groups for m in group))
