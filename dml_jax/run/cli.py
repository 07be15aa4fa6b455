"""What the binaries share: one-line errors for bad flags, the resolved config, quiet logs.

``train.py`` and ``eval.py`` call ``app.run(main, flags_parser=cli.flags_parser(PROGRAM))``,
so a mistake on the command line is one line (``train.py: unknown config key loss.margn
(did you mean loss.margin?)``) and exit code 1, never a traceback.
"""

from __future__ import annotations

import logging as py_logging
import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence

from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

from dml_jax.run import host_memory
from dml_jax.run import overrides

FLAGS = flags.FLAGS

# Notes that are noise for a user: JAX looking for a TPU on a machine without one, Orbax
# saying what it does per save and that a read-only manager ignores its save options.
_NOISE = ("Unable to initialize backend", "read_only=True", "is read only")


# The errors a binary reports as one line (``program: message``, exit code 1): a bad config or
# flag value (``ValueError``, among them a workdir's checkpoint of another config), missing
# data, weights or workdir files (``FileNotFoundError``, with the command that gets them), an
# unsupported combination (``NotImplementedError``) and a loss that became NaN or inf
# (``FloatingPointError``: training stopped, the last good checkpoint kept).
USER_ERRORS = (ValueError, FileNotFoundError, NotImplementedError, FloatingPointError)


def import_flag_modules(program: str, argv: Sequence[str]) -> None:
  """Imports the ``--module`` modules of ``argv`` before absl parses the flags, since
  ``--config=FILE`` is read while they are parsed: a config may then name an objective the
  module registers (``configs/digits_objective.py:NAME``). A module that cannot be imported
  stops the program with one line."""
  specs = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--module=")]
  specs += [b for a, b in zip(argv[1:], argv[2:]) if a == "--module"]
  try:
    overrides.import_user_modules(specs)
  except USER_ERRORS as e:
    fail(program, str(e))


def fail(program: str, message: str, code: int = 1) -> None:
  """Prints ``program: message`` on stderr and exits with ``code``."""
  print(f"{program}: {message}", file=sys.stderr)
  sys.exit(code)


# The flags that ask for the help page (absl's own print it and exit with code 1).
HELP_ARGS = ("--help", "-help", "--helpshort", "-helpshort", "-?", "--?")
HELPFULL_ARGS = ("--helpfull", "-helpfull")


def flags_parser(program: str, *, groups: Sequence[tuple[str, Sequence[str]]] = (),
                 epilog: str = "", flag_values: flags.FlagValues = FLAGS,
                 ) -> Callable[[list[str]], list[str]]:
  """An absl ``flags_parser`` that turns any flag or config-file error into one line.

  ``--help`` prints :func:`help_text` (the flags named in ``groups`` after the others, then
  ``epilog``) and ``--help`` / ``--helpfull`` exit with code 0.
  """

  def parse(argv: list[str]) -> list[str]:
    if any(arg in HELP_ARGS for arg in argv[1:]):
      print(help_text(flag_values, doc=sys.modules["__main__"].__doc__ or "",
                      modules=(argv[0], __name__), groups=groups, epilog=epilog))
      sys.exit(0)
    for arg in argv[1:]:
      if arg.startswith("--config="):
        path = arg.split("=", 1)[1].partition(":")[0]
        if not os.path.isfile(path):
          fail(program, f"config file {path} does not exist")
    try:
      return flag_values(argv)
    except SystemExit:
      if any(arg in HELPFULL_ARGS for arg in argv[1:]):
        sys.exit(0)
      raise
    except flags.Error as e:
      fail(program, flag_error(str(e)))
    except (AttributeError, KeyError, OSError, ValueError, TypeError) as e:
      # ml_collections: an override of a section the config does not have.
      fail(program, override_error(argv, e))
    except (ImportError, NameError, SyntaxError) as e:   # raised reading the config file
      fail(program, config_file_error(argv, e))
    return []

  return parse


def config_file_error(argv: Sequence[str], error: Exception) -> str:
  """The line for a ``--config`` file of ``argv`` that could not be executed: it imports a
  module that is not there (or no longer: an older config file), or is not Python (a run's
  ``config.json``)."""
  specs = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")]
  path = specs[-1].partition(":")[0] if specs else "given with --config"
  text = " ".join(str(error).split())
  if path.endswith(".json"):
    return (f"config file {path} is JSON, not a Python config file ({text}); --config takes "
            "a .py file defining get_config() (configs/*.py): a run resumes with the config "
            "file it was trained with")
  return f"config file {path} cannot be executed: {type(error).__name__}: {text}"


_EXCEPTION_PREFIX = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")   # "ValueError: "


def flag_error(text: str) -> str:
  """One line for absl's flag error ``text``. A config file that raised while it was read
  (e.g. an unknown ``:variant``) comes as a traceback's text: its last line, the error's own
  message, replaces the traceback."""
  lines = [line for line in text.splitlines() if line.strip()]
  if len(lines) > 1 and any(line.startswith("Traceback (most recent call last)")
                            for line in lines):
    head = lines[0].removesuffix("Error whilst parsing config file:").rstrip()
    return f"{head} {_EXCEPTION_PREFIX.sub('', lines[-1])}"
  return lines[0] if lines else text


def override_error(argv: Sequence[str], error: Exception) -> str:
  """The line for an error ml_collections raised applying a ``--config.K=V`` of ``argv``: the
  section a key goes through that the config lacks (``overrides.unknown_section``), else
  the error's own text on one line."""
  specs = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")]
  keys = [a[len("--config."):].split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
  if specs:
    try:
      base = overrides.load_config_file(specs[-1])
    except ValueError as e:   # the file itself: missing, or not a config file
      return str(e)
    except Exception:  # pylint: disable=broad-except  (then the error's own text)
      base = None
    for key in keys if base is not None else ():
      message = overrides.unknown_section(base, key)
      if message:
        return message
  text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
  return "bad --config override: " + " ".join(str(text).strip("'\"").split())


def _flag_lines(flag) -> list[str]:
  """``--[no]name: help (default: ...)`` of one flag, wrapped as absl's help wraps it."""
  name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
  text = f"{name}: {' '.join(flag.help.replace('.;', ';').split())}"
  if flag.default_as_str not in (None, "''", "'[]'", "'None'"):
    text += f" (default: {flag.default_as_str})"
  return textwrap.wrap(text, 78, initial_indent="  ", subsequent_indent="    ")


def help_text(flag_values: flags.FlagValues, *, doc: str, modules: Sequence[str],
              groups: Sequence[tuple[str, Sequence[str]]] = (), epilog: str = "") -> str:
  """The ``--help`` page: ``doc``, the flags ``modules`` define (in the order they were
  defined) except those of ``groups``, then each group (``(title, flag names)``), then
  ``epilog``."""
  grouped = {name for _, names in groups for name in names}
  by_module = flag_values.flags_by_module_dict()
  everyday = [f for m in modules for f in by_module.get(m, []) if f.name not in grouped]
  lines = [doc.strip("\n"), "", "flags:"]
  for flag in everyday:
    lines += _flag_lines(flag)
  for title, names in groups:
    lines += ["", f"{title}:"]
    for name in names:
      lines += _flag_lines(flag_values[name])
  if epilog:
    lines += [""] + textwrap.wrap(" ".join(epilog.split()), 80)
  return "\n".join(lines)


def resolved_config(config_flag, *, modules: Sequence[str] = (),
                    machine: dict | None = None) -> ml_collections.ConfigDict:
  """The config of ``--config=FILE[:arg]`` with its ``--config.K=V`` overrides applied by the
  rules of ``dml_jax.run.overrides`` (unknown keys refused, ``loss.name`` switches objective),
  then ``machine`` (:func:`machine_overrides`), ``modules`` (``--module``) imported and
  recorded in ``config.user_modules``; locked.

  Raises:
    ValueError: one line naming the bad file, key or value.
  """
  spec = config_flags.get_config_filename(config_flag)
  modules = overrides.user_modules(modules)
  overrides.import_user_modules(modules)
  base = overrides.load_config_file(spec)
  overrides.import_user_modules(base.get("user_modules", ()), from_config=True)
  config = overrides.apply(base, {**config_flags.get_override_values(config_flag),
                                  **(machine or {})})
  config.user_modules = overrides.user_modules(config.get("user_modules", ()), modules)
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
  compile, is cached); ``''`` leaves it off. Returns the absolute path, or ``None`` when it is
  off: asked for, or ``path`` cannot be a writable folder (a warning says why; the run goes on
  without the cache, compiling as it would without one)."""
  if not path:
    return None
  import jax  # pylint: disable=import-outside-toplevel
  path = os.path.expanduser(path)
  if path.startswith("~"):   # no home: HOME unset, a user without a passwd entry
    problem = "no home folder: HOME is not set"
  else:
    path = os.path.abspath(path)
    try:
      os.makedirs(path, exist_ok=True)
      problem = "" if os.access(path, os.W_OK | os.X_OK) else "not writable"
    except OSError as e:
      problem = e.strerror or str(e)
  if problem:
    logging.warning("JAX compilation cache off: %s cannot be its folder (%s); "
                    "--compilation_cache=DIR chooses another.", path, problem)
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  logging.info("JAX compilation cache: %s", path)
  return path


# Machine tuning: flags of train.py / eval.py whose defaults these environment variables set
# (experiment configs leave them at machine-neutral values).
HOST_MEMORY_ENV = "DML_JAX_KEEP_HOST_MEMORY"
MACHINE_ENV = {"num_threads": "DML_JAX_NUM_THREADS", "num_workers": "DML_JAX_NUM_WORKERS"}
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


def env_bool(name: str, default: bool | None) -> bool | None:
  """The environment variable ``name`` as a bool (1/true/yes, 0/false/no), else ``default``."""
  value = os.environ.get(name, "").strip().lower()
  return True if value in _TRUE else False if value in _FALSE else default


def define_host_memory_flag(default: bool | None = True) -> None:
  """``--keep_host_memory``; ``default`` (``None``: decided by :func:`wants_host_memory`)
  unless the environment variable ``DML_JAX_KEEP_HOST_MEMORY`` sets it."""
  flags.DEFINE_bool(
      "keep_host_memory", env_bool(HOST_MEMORY_ENV, default),
      "Keep freed host memory in the process (glibc mallopt; see dml_jax/run/host_memory.py): "
      "large CPU buffers are not page-faulted in afresh on every call. false: glibc's "
      f"defaults. The environment variable {HOST_MEMORY_ENV}=1/0 sets the default" +
      ("; without either, train.py keeps it for image data (data.image_size > 0) or when "
       "the config's keep_host_memory is true." if default is None else "."))


def wants_host_memory(flag: bool | None, config: ml_collections.ConfigDict) -> bool:
  """Whether to keep freed host memory: the flag when given, else on when the config asks
  for it (``keep_host_memory``, as older workdirs record it) or reads images (large step
  buffers; the 8 px digits' many small host allocations would queue on the one arena)."""
  if flag is not None:
    return flag
  return bool(config.get("keep_host_memory", False)) or config.data.get("image_size", 0) > 0


def define_machine_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """``--num_threads`` / ``--num_workers``: the input pipeline's decoding threads and worker
  processes (``data.num_threads`` / ``data.num_workers`` of the run; default: the environment
  variables of ``MACHINE_ENV``, else the config's)."""
  for name, what in (("num_threads", "Decoding threads (per worker process)"),
                     ("num_workers", "Input worker processes (0: threads of the trainer; "
                                     "-1: auto)")):
    env = os.environ.get(MACHINE_ENV[name], "").strip()
    flags.DEFINE_integer(name, int(env) if env.lstrip("-").isdigit() else None,
                         f"{what}; sets data.{name} (default: the environment variable "
                         f"{MACHINE_ENV[name]}, else the config's value).",
                         flag_values=flag_values)


def machine_overrides(flag_values: flags.FlagValues = FLAGS) -> dict[str, int]:
  """``{'data.num_threads': N, ...}`` for the machine flags that are set."""
  return {f"data.{name}": flag_values[name].value for name in MACHINE_ENV
          if name in flag_values and flag_values[name].value is not None}


# eval.py's flags for where a run's data files are on this machine: flag -> data.options key.
DATA_LOCATION_FLAGS = {"data_root": "root", "data_list": "path", "data_dir": "data_dir"}


def define_data_location_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """``--data_root`` / ``--data_list`` / ``--data_dir``: where the run's image folder, list
  file or TFDS directory is on this machine (``data.options.root`` / ``path`` / ``data_dir``
  of the run; default: the recorded ones), for a workdir copied from another machine."""
  for name, key in DATA_LOCATION_FLAGS.items():
    flags.DEFINE_string(name, None, f"Where the run's data.options.{key} is on this machine "
                        "(default: the path config.json records).", flag_values=flag_values)


def data_location_overrides(flag_values: flags.FlagValues = FLAGS) -> dict[str, str]:
  """``{'data.options.root': '/abs/dir', ...}`` for the data location flags that are set
  (paths made absolute from the current directory; ``~`` expanded)."""
  return {f"data.options.{key}": os.path.abspath(os.path.expanduser(flag_values[name].value))
          for name, key in DATA_LOCATION_FLAGS.items()
          if name in flag_values and flag_values[name].value}


def initialize_distributed(coordinator_address: str | None, num_processes: int | None,
                           process_id: int | None) -> None:
  """``jax.distributed.initialize`` for train.py's multi-host flags; JAX's ``ValueError``
  (no coordinator outside SLURM / a TPU pod, a process index out of range) comes back naming
  the flags that give them."""
  import jax   # pylint: disable=import-outside-toplevel  (the binaries import it already)
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  except ValueError as e:
    raise ValueError(f"--distributed: {e} Where JAX detects no cluster (SLURM, a TPU pod), "
                     "give --coordinator_address=HOST:PORT (process 0's), --num_processes and "
                     "--process_id.") from None


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
