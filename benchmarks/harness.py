"""What every benchmark shares: timing, the machine stamp, JSON output, markdown tables and
ratio columns.

Timing:

* :func:`time_calls` times a call that blocks until its result is ready (``warmup`` untimed
  calls, then ``repeats`` timed ones, optionally capped at ``max_seconds``) and returns
  :func:`timing_stats` (median, quartiles, IQR, min in ms) with the page faults per call;
* :func:`time_jitted` times a JAX function the usual way (``jax.jit``, one compiling call,
  then each call ended by ``jax.block_until_ready``) and returns its median ms;
* :func:`time_in_turns` times several calls in turns, round by round (a change in the
  machine's load hits each alike);
* :func:`compile_and_time` lowers and compiles once (timed), then times the executable and
  adds XLA's ``memory_analysis()`` (:func:`memory_stats`);
* :func:`quartiles` summarises any list of rates or times.

The machine: :func:`available_cpus` (the CPUs this process may run on, which is the size of
XLA:CPU's thread pool), :func:`commit` and :func:`stamp` (date, command line, commit, Python,
platform, CPUs, load average and, when already imported, the JAX / torch versions and
devices). Output: :func:`write_json`, :func:`markdown_table` (with :func:`fmt` for empty
cells), :func:`add_ratios` (ratio of medians and paired per-round ratio to a baseline side).

JAX is imported inside the functions that need it, so a benchmark can set up its environment
(``XLA_FLAGS``, threads) after importing this module.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Hashable, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2.0 ** 20
# how both sides of a benchmark ran, by --host_memory (dml_jax/run/host_memory.py)
HOST_MEMORY = {"default": "with glibc's malloc defaults (as the main job runs)",
               "keep": "keeping freed host memory (as the image configs and `eval.py` run)"}


# ------------------------------------------------------------------------------------------
# The machine.


def available_cpus() -> int:
  """CPUs this process may run on (XLA:CPU sizes its intra-op thread pool by this)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:   # not Linux
    return os.cpu_count() or 1


def commit() -> str:
  """The repository's commit (``git rev-parse --short HEAD``), or ``'unknown'``."""
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def cpu_model() -> str:
  """The CPU's model name and widest vector extension, e.g. ``'Intel(R) Xeon(R) Processor,
  AVX-512'`` (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
  try:
    with open("/proc/cpuinfo") as f:
      info = f.read()
  except OSError:
    return platform.processor() or platform.machine()
  name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
               if line.startswith(("model name", "Model name", "CPU part"))), platform.machine())
  flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines()
                    if line.startswith(("flags", "Features"))), []))
  isa = ("AVX-512" if "avx512f" in flags else "AVX2 + FMA" if {"avx2", "fma"} <= flags
         else "AVX" if "avx" in flags else "")
  return f"{name}, {isa}" if isa else name


def load_average() -> list[float]:
  """The 1, 5 and 15 minute load averages (``[]`` where unavailable)."""
  try:
    return list(os.getloadavg())
  except OSError:
    return []


def stamp(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Where and how a result was measured.

  Args:
    argv: the command line (default ``sys.argv``).

  Returns:
    ``date`` (UTC), ``command``, ``commit``, ``python``, ``machine``, ``cpu`` (:func:`cpu_model`),
    ``cpu_count``, ``cpus``
    (:func:`available_cpus`), ``load_average``, and ``jax`` / ``backend`` / ``device`` and
    ``torch`` for those of the two this process has already imported.
  """
  argv = sys.argv if argv is None else argv
  out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         "command": " ".join(["python", os.path.relpath(argv[0], REPO)] + list(argv[1:]))
                    if argv else "",
         "commit": commit(), "python": platform.python_version(),
         "machine": platform.machine(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
         "cpus": available_cpus(), "load_average": load_average()}
  if "jax" in sys.modules:
    jax = sys.modules["jax"]
    out.update(jax=jax.__version__, backend=jax.default_backend(),
               device=jax.devices()[0].device_kind)
  if "torch" in sys.modules:
    out["torch"] = sys.modules["torch"].__version__
  return out


def limit_address_space(fraction: float) -> int | None:
  """Caps this process's address space at ``fraction`` of the physical memory (Linux).

  A PyTorch loss that builds ``[positive pairs, negative pairs]`` matrices (O(B^3)) can ask for
  more memory than the machine has, and the kernel would kill the whole benchmark. Under the
  cap such an allocation fails with an error instead, which the benchmark records for that
  case. Returns the cap in bytes (None: not set).
  """
  import resource  # pylint: disable=import-outside-toplevel
  if fraction <= 0:
    return None
  try:
    limit = int(fraction * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
  except (ValueError, OSError, AttributeError):   # not Linux, or a lower hard limit
    return None
  return limit


# ------------------------------------------------------------------------------------------
# Timing.


def quartiles(values: Sequence[float]) -> dict[str, float]:
  """Median, quartiles and IQR of ``values`` (linear interpolation, numpy's default); ``n``."""
  q25, med, q75 = np.percentile(np.asarray(values, np.float64), [25, 50, 75])
  return {"median": float(med), "q25": float(q25), "q75": float(q75),
          "iqr": float(q75 - q25), "n": len(values)}


def timing_stats(seconds: Sequence[float]) -> dict[str, float]:
  """Median, quartiles, IQR and min of run times, in milliseconds; ``repeats`` = count."""
  ms = 1e3 * np.asarray(seconds, np.float64)
  q = quartiles(ms)
  return {"median_ms": q["median"], "q25_ms": q["q25"], "q75_ms": q["q75"],
          "iqr_ms": q["iqr"], "min_ms": float(ms.min()), "repeats": int(ms.size)}


def minor_faults() -> int | None:
  """This process's minor page faults so far (None where ``resource`` is unavailable)."""
  try:
    import resource  # pylint: disable=import-outside-toplevel
  except ImportError:   # not Unix
    return None
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_calls(fn: Callable[[], Any], *, repeats: int, warmup: int,
               max_seconds: float = 0.0, min_repeats: int = 1) -> tuple[dict, bool, Any]:
  """Times ``fn()`` (which must block until its result is ready).

  Args:
    fn: the call to time.
    repeats: the number of timed calls.
    warmup: untimed calls first.
    max_seconds: > 0: stop once the timed calls took this long and ``min_repeats`` are done.
    min_repeats: see ``max_seconds``.

  Returns:
    ``(timing_stats(...) + faults_per_call, capped, result)``: ``faults_per_call`` is the
    process's minor page faults per timed call (memory the allocator maps afresh and the call
    touches; None without ``resource``), ``capped`` is True when ``max_seconds`` cut the
    repeats; ``result`` is what the last call returned.
  """
  result = None
  for _ in range(warmup):
    result = fn()
  times = []
  faults = minor_faults()
  while len(times) < repeats:
    start = time.perf_counter()
    result = fn()
    times.append(time.perf_counter() - start)
    if max_seconds > 0 and len(times) >= min_repeats and sum(times) >= max_seconds:
      break
  stats = timing_stats(times)
  stats["faults_per_call"] = None if faults is None else (minor_faults() - faults) / len(times)
  return stats, len(times) < repeats, result


def time_jitted(fn: Callable, *args, repeats: int, warmup: int = 1) -> float:
  """Median ms of ``jax.jit(fn)(*args)`` over ``repeats`` calls, each ended by
  ``jax.block_until_ready``, after ``warmup`` untimed calls (the first one compiles)."""
  import jax  # pylint: disable=import-outside-toplevel
  jitted = jax.jit(fn)
  stats, _, _ = time_calls(lambda: jax.block_until_ready(jitted(*args)), repeats=repeats,
                           warmup=max(warmup, 1))
  return stats["median_ms"]


def time_in_turns(calls: dict[str, Callable[[], Any]], *, repeats: int) -> dict[str, float]:
  """Median ms of each of ``calls`` (which must block until their results are ready), timed
  in turns: one untimed call each, then ``repeats`` rounds of one timed call each, so that a
  change in the machine's load hits every call alike. ``{name: median ms}``."""
  for fn in calls.values():
    fn()
  times = {name: [] for name in calls}
  for _ in range(repeats):
    for name, fn in calls.items():
      start = time.perf_counter()
      fn()
      times[name].append(1e3 * (time.perf_counter() - start))
  return {name: statistics.median(t) for name, t in times.items()}


def memory_stats(compiled) -> dict[str, int] | None:
  """Bytes of a compiled executable's ``memory_analysis()`` (None where unavailable):
  ``temp``, ``argument``, ``output``, ``alias`` and ``peak = temp + argument + output -
  alias``."""
  try:
    ma = compiled.memory_analysis()
  except Exception:   # pylint: disable=broad-except  (backends without the analysis)
    return None
  if ma is None:
    return None
  mem = {"temp_bytes": int(ma.temp_size_in_bytes),
         "argument_bytes": int(ma.argument_size_in_bytes),
         "output_bytes": int(ma.output_size_in_bytes),
         "alias_bytes": int(ma.alias_size_in_bytes)}
  mem["peak_bytes"] = (mem["temp_bytes"] + mem["argument_bytes"] + mem["output_bytes"]
                       - mem["alias_bytes"])
  return mem


def compile_and_time(fn: Callable, args: Sequence, *, repeats: int, warmup: int,
                     max_seconds: float = 0.0, min_repeats: int = 5) -> dict:
  """``jax.jit(fn)`` lowered and compiled on ``args`` (timed once), then timed with
  :func:`time_calls` (at least ``min(repeats, min_repeats)`` calls under ``max_seconds``);
  ``fn``'s first output is the loss. Returns the timing stats, ``capped``, ``max_seconds``,
  ``compile_s``, ``memory`` (:func:`memory_stats`) and ``loss``."""
  import jax  # pylint: disable=import-outside-toplevel
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - start
  timing, capped, out = time_calls(
      lambda: jax.block_until_ready(compiled(*args)), repeats=repeats, warmup=warmup,
      max_seconds=max_seconds, min_repeats=min(repeats, min_repeats))
  return {**timing, "capped": capped, "max_seconds": max_seconds, "compile_s": compile_s,
          "memory": memory_stats(compiled), "loss": float(out[0])}


# ------------------------------------------------------------------------------------------
# Output.


def write_json(report: Any, out: str, *, indent: int = 2) -> None:
  """Writes ``report`` to ``out`` (creating its folder) and says so; nothing when ``out`` is
  ''."""
  if out:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
      json.dump(report, f, indent=indent)
    print(f"wrote {out}")


def fmt(value, spec: str, empty: str = "—") -> str:
  """``format(value, spec)``, or ``empty`` for None."""
  return empty if value is None else format(value, spec)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A markdown table: ``header`` and one line per row (cells as ``str``)."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines.extend("| " + " | ".join(str(c) for c in row) + " |" for row in rows)
  return "\n".join(lines)


def add_ratios(rows: list[dict], *, case: Callable[[dict], Hashable],
               value: Callable[[dict], float], rounds: str, baseline: str = "torch") -> None:
  """Adds ``ratio_to_<baseline>`` (of the medians) and ``paired_ratio`` (median over rounds
  of the round's ratio: the sides of one round ran back to back) to every row of another
  side whose ``case(row)`` has a ``baseline`` row; rows with an ``error`` are left alone.

  Args:
    rows: dicts with ``side``, the summary ``value(row)`` (higher = faster) and the per-round
      values under ``rounds``.
    case: the key that pairs a row with its baseline row.
    value: the row's summary value (e.g. its median rate).
    rounds: the key of the per-round values.
    baseline: the side compared with.
  """
  base = {case(r): r for r in rows if r["side"] == baseline and "error" not in r}
  for r in rows:
    b = base.get(case(r))
    if r["side"] == baseline or b is None or "error" in r:
      continue
    r[f"ratio_to_{baseline}"] = value(r) / value(b)
    r["paired_ratio"] = statistics.median(x / y for x, y in zip(r[rounds], b[rounds]))
