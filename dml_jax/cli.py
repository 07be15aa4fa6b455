"""What the binaries share: one-line errors for bad flags, the resolved config, quiet logs.

``train.py`` and ``eval.py`` call ``app.run(main, flags_parser=cli.flags_parser(PROGRAM))``,
so a mistake on the command line is one line (``train.py: unknown config key loss.margn
(did you mean loss.margin?)``) and exit code 1, never a traceback.
"""

from __future__ import annotations

import logging as py_logging
import os
import sys
from collections.abc import Callable, Sequence

from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

from dml_jax import host_memory
from dml_jax import overrides

FLAGS = flags.FLAGS

# Notes that are noise for a user: JAX looking for a TPU on a machine without one, Orbax
# saying what it does per save and that a read-only manager ignores its save options.
_NOISE = ("Unable to initialize backend", "read_only=True", "is read only")


def fail(program: str, message: str, code: int = 1) -> None:
  """Prints ``program: message`` on stderr and exits with ``code``."""
  print(f"{program}: {message}", file=sys.stderr)
  sys.exit(code)


def flags_parser(program: str) -> Callable[[list[str]], list[str]]:
  """An absl ``flags_parser`` that turns any flag or config-file error into one line."""

  def parse(argv: list[str]) -> list[str]:
    for arg in argv[1:]:
      if arg.startswith("--config="):
        path = arg.split("=", 1)[1].partition(":")[0]
        if not os.path.isfile(path):
          fail(program, overrides.missing_config_message(path))
    try:
      return FLAGS(argv)
    except flags.Error as e:
      fail(program, str(e).splitlines()[0])
    except (AttributeError, KeyError, OSError, ValueError, TypeError) as e:
      # ml_collections: an override of a section the config does not have.
      message = str(e).strip("'\"").replace("\\n", " ").replace("\n", " ")
      fail(program, f"bad --config override: {message}")
    return []

  return parse


def resolved_config(config_flag, *, modules: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The config of ``--config=FILE[:arg]`` with its ``--config.K=V`` overrides applied by the
  rules of ``dml_jax.overrides`` (unknown keys refused, ``loss.name`` switches objective),
  ``modules`` (``--module``) imported and recorded in ``config.user_modules``; locked.

  Raises:
    ValueError: one line naming the bad file, key or value.
  """
  spec = config_flags.get_config_filename(config_flag)
  modules = tuple(overrides.module_spec(m) for m in modules)
  overrides.import_user_modules(modules)
  base = overrides.load_config_file(spec)
  overrides.import_user_modules(base.get("user_modules", ()))
  config = overrides.apply(base, config_flags.get_override_values(config_flag))
  config.user_modules = tuple(dict.fromkeys(tuple(config.get("user_modules", ())) + modules))
  config.lock()
  return config


# JAX's persistent compilation cache: a resumed run, another seed and eval.py on the same
# shapes skip compilation. The environment variable moves it; '' disables it.
CACHE_ENV = "DML_JAX_COMPILATION_CACHE"
DEFAULT_CACHE = os.path.join("~", ".cache", "dml_jax", "jax_compilation_cache")


def define_cache_flag() -> None:
  flags.DEFINE_string(
      "compilation_cache", os.environ.get(CACHE_ENV, DEFAULT_CACHE),
      f"Directory of JAX's persistent compilation cache ('' disables it; the environment "
      f"variable {CACHE_ENV} sets the default).")


def describe_cache(path: str | None) -> str:
  """The line the binaries print once: where compiled programs are cached, how to change it."""
  if path is None:
    return "JAX compilation cache: off (--compilation_cache=DIR turns it on)"
  return (f"JAX compilation cache: {path} (--compilation_cache=DIR moves it, "
          "--compilation_cache= turns it off)")


def enable_compilation_cache(path: str) -> str | None:
  """Points JAX's persistent compilation cache at ``path`` (every program, however quick to
  compile, is cached); ``''`` leaves it off. Returns the absolute path or ``None``."""
  if not path:
    return None
  import jax  # pylint: disable=import-outside-toplevel
  path = os.path.abspath(os.path.expanduser(path))
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  logging.info("JAX compilation cache: %s", path)
  return path


def define_host_memory_flag() -> None:
  flags.DEFINE_bool(
      "keep_host_memory", True,
      "Keep freed host memory in the process (glibc mallopt; see dml_jax/host_memory.py): "
      "large CPU buffers are not page-faulted in afresh on every call. false: glibc's "
      "defaults. (train.py takes it from the config: --config.keep_host_memory.)")


def keep_host_memory(keep: bool) -> None:
  """Keeps freed host memory if ``keep`` and JAX will run on the CPU (call it before JAX
  starts its threads) and logs the outcome."""
  if keep and not host_memory.cpu_only():
    logging.info(host_memory.describe(None, accelerator=True))
    return
  kept = host_memory.keep_freed_memory() if keep else None
  logging.info(host_memory.describe(kept))


def quiet_logs() -> None:
  """Hides log lines that are noise for a user (see ``_NOISE``) and Orbax's per-save INFO
  lines; warnings about real problems still show."""

  def keep(record: py_logging.LogRecord) -> bool:
    message = str(record.msg)
    if any(n in message for n in _NOISE):
      return False
    return record.levelno >= py_logging.WARNING or "orbax" not in record.pathname

  logging.get_absl_handler().addFilter(keep)
  for name in ("jax._src.xla_bridge", "absl"):
    py_logging.getLogger(name).addFilter(keep)
