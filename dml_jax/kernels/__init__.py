"""CPU kernels in C++, called from jitted code as XLA FFI custom calls.

XLA:CPU lacks a few fast primitives (its ``top_k`` costs 10-20 ns an element on one thread,
its convolution gradients are slow); where one of them bounds a benchmark, a small C++
handler does that step. The sources are beside this file (``*.cc``, sharing ``common.h``).
:func:`load` compiles a source once per machine with the system C++ compiler (``$CXX``, else
``c++``) against JAX's FFI headers, caches the shared library (``~/.cache/dml_jax/kernels``,
or ``$DML_JAX_KERNEL_CACHE``; keyed by the source and headers, the flags, the compiler and
jaxlib versions), and registers its handlers with XLA for the CPU.

Every user dispatches the same way, by :func:`choose` (``selection='auto'``: the kernel where
it is available, else ``None``, meaning the user's own pure-XLA path; ``'kernel'`` /
``'xla'`` force one), and calls the chosen kernel's targets (:func:`require`). The kernel is
available when :func:`load` returns its handler names: ``None`` when the default backend is not the CPU, the CPU is not x86-64
with AVX2 and FMA (the kernels' fast loops need them; elsewhere XLA's own code is the better
path), ``DML_JAX_CPU_KERNELS=0``, there is no C++ compiler, or the build fails (one warning
says why). :func:`unavailable` says which. Both paths give the same results (tested); no
result depends on a kernel being there. Code that calls a kernel directly gets one clear
``RuntimeError`` from :func:`require` where it is not available.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings

import jax

CACHE_ENV = "DML_JAX_KERNEL_CACHE"
SWITCH_ENV = "DML_JAX_CPU_KERNELS"
DEFAULT_CACHE = os.path.join("~", ".cache", "dml_jax", "kernels")
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")
SOURCES = {
    # source -> {python name: exported handler symbol}
    "top_m.cc": {"merge_rows": "DmlJaxTopMMergeRows", "merge_both": "DmlJaxTopMMergeBoth",
                 "count_rows": "DmlJaxTopMCountRows", "count_both": "DmlJaxTopMCountBoth",
                 "select_rows": "DmlJaxTopMSelectRows", "argmax_rows": "DmlJaxTopMArgmaxRows"},
    "soft_pool.cc": {"forward": "DmlJaxSoftPoolForward", "backward": "DmlJaxSoftPoolBackward"},
    "conv.cc": {"forward": "DmlJaxConvForward", "kernel_grad": "DmlJaxConvKernelGrad"},
}
BUILD_TIMEOUT_S = 300


REQUIRED_CPU_FLAGS = ("avx2", "fma")


@functools.cache
def cpu_flags() -> frozenset[str]:
  """The instruction-set flags of this machine's CPU (Linux ``/proc/cpuinfo``; empty where
  it cannot be read)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      for line in f:
        if line.startswith("flags"):
          return frozenset(line.partition(":")[2].split())
  except OSError:
    pass
  return frozenset()


def cpu_supported() -> bool:
  """Whether this CPU runs the kernels' fast loops: x86-64 with AVX2 and FMA."""
  if platform.machine().lower() not in ("x86_64", "amd64"):
    return False
  return set(REQUIRED_CPU_FLAGS) <= cpu_flags()


def unavailable() -> str | None:
  """Why the kernels are not used here (the switch, the backend or the CPU), or ``None``
  when they may be (a build can still fail: :func:`load`)."""
  if os.environ.get(SWITCH_ENV, "1") == "0":
    return f"{SWITCH_ENV}=0"
  backend = jax.default_backend()
  if backend != "cpu":
    return f"the default backend is {backend!r}, not the CPU"
  if not cpu_supported():
    return (f"the CPU ({platform.machine()}) is not x86-64 with "
            f"{' and '.join(f.upper() for f in REQUIRED_CPU_FLAGS)}")
  return None


def enabled() -> bool:
  """Whether the kernels may be used (:func:`unavailable` gives no reason)."""
  return unavailable() is None


def load(source: str) -> dict[str, str] | None:
  """The XLA custom-call targets of ``source`` (``{name: target}``, e.g. ``{'merge_rows':
  'dml_jax_top_m_merge_rows'}``), built and registered on first use; ``None`` when the
  kernels are not available (see the module docstring)."""
  if source not in SOURCES:
    raise ValueError(f"unknown kernel source {source!r}; known: {sorted(SOURCES)}.")
  if not enabled():
    return None
  return _load(source)


SELECTIONS = ("auto", "kernel", "xla")


def choose(source: str, selection: str = "auto") -> dict[str, str] | None:
  """The kernel dispatch of every user (``soft_pool.cc``: ``softtriple``; ``top_m.cc``: the
  evaluation's top-m; ``conv.cc``: the CPU convolutions): the custom-call targets of ``source``
  when its kernel is to run, ``None`` when the caller's XLA path is.

  Args:
    source: one of ``SOURCES``.
    selection: ``'auto'`` (default; the kernel where :func:`load` gives it, else XLA),
      ``'kernel'`` (the kernel, or :func:`require`'s ``RuntimeError``) or ``'xla'``.

  Returns:
    ``{name: target}`` or ``None``.
  """
  if selection not in SELECTIONS:
    raise ValueError(f"kernel selection must be one of {SELECTIONS}, got {selection!r}.")
  if selection == "xla":
    return None
  return require(source) if selection == "kernel" else load(source)


def require(source: str) -> dict[str, str]:
  """:func:`load`, or a ``RuntimeError`` saying why the kernel is not available (for code that
  calls a kernel directly; the library's own users fall back to XLA instead)."""
  targets = load(source)
  if targets is None:
    why = unavailable() or "it could not be built (see the warning above)"
    raise RuntimeError(f"the C++ kernel {source} is not available: {why}. The XLA path "
                       "computes the same; see dml_jax.kernels.")
  return targets


@functools.cache
def _load(source: str) -> dict[str, str] | None:
  try:
    library = ctypes.cdll.LoadLibrary(build(source))
  except (OSError, subprocess.SubprocessError) as e:
    warnings.warn(f"dml_jax: the C++ kernel {source} is not available ({e}); using the "
                  f"slower pure-XLA path. Set {SWITCH_ENV}=0 to silence this.", stacklevel=3)
    return None
  targets = {}
  for name, symbol in SOURCES[source].items():
    target = f"dml_jax_{source.removesuffix('.cc')}_{name}"
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                platform="cpu")
    targets[name] = target
  return targets


def source_path(source: str) -> str:
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), source)


def compiler() -> list[str]:
  """The C++ compiler command, ``$CXX`` (words as a shell splits them, e.g. ``ccache g++``) or
  ``c++``, its program resolved on PATH; ``OSError`` when there is none."""
  name = os.environ.get("CXX", "c++")
  words = shlex.split(name)
  path = shutil.which(words[0]) if words else None
  if path is None:
    raise OSError(f"no C++ compiler {name!r} on PATH (install g++ or set CXX)")
  return [path, *words[1:]]


def build(source: str) -> str:
  """The path of the shared library of ``source``, compiled now unless already cached.

  Raises ``OSError`` (no compiler, a cache folder it cannot write, a failed compile with its
  message) or ``subprocess.TimeoutExpired``.
  """
  cxx = compiler()
  version = subprocess.run([*cxx, "--version"], capture_output=True, text=True,
                           timeout=60).stdout.splitlines()[:1]
  src = source_path(source)
  folder = os.path.dirname(src)
  code = b""
  for name in [src] + sorted(os.path.join(folder, f) for f in os.listdir(folder)
                              if f.endswith(".h")):
    with open(name, "rb") as f:
      code += f.read()   # the source and the headers it may include
  include = jax.ffi.include_dir()
  key = hashlib.sha256(repr((code, FLAGS, cxx[1:], version, jax.__version__,
                             jax.lib.__version__, sys.platform)).encode()).hexdigest()[:16]
  cache = os.path.expanduser(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
  if cache.startswith("~"):   # no home: HOME unset, a user without a passwd entry
    raise OSError(f"no home folder for the kernel cache {cache} (HOME is not set); "
                  f"{CACHE_ENV}=DIR chooses one")
  path = os.path.join(cache, f"{source.removesuffix('.cc')}-{key}.so")
  if os.path.exists(path):
    return path
  # Compile beside the target and rename: concurrent builds (test workers) never see a
  # partial file. The compiler creates the file in a folder of its own, so that it gets the
  # usual mode (readable by all where the umask allows: a shared cache), not a private
  # temporary file's.
  try:
    os.makedirs(cache, exist_ok=True)
    scratch = tempfile.mkdtemp(dir=cache)
  except OSError as e:   # a read-only or missing home, a cache path under a file
    raise OSError(f"cannot write the kernel cache {cache} ({e.strerror or e}); "
                  f"{CACHE_ENV}=DIR moves it") from e
  tmp = os.path.join(scratch, os.path.basename(path))
  try:
    done = subprocess.run([*cxx, *FLAGS, "-I", include, "-I", folder, src, "-o", tmp],
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
      raise OSError(f"{' '.join([os.path.basename(cxx[0]), *cxx[1:]])} failed on {source}: "
                    f"{done.stderr.strip()[-2000:]}")
    os.replace(tmp, path)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  return path
