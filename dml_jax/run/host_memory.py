"""Keep freed host memory in the process (glibc ``malloc`` settings) so that a CPU training
step does not page-fault its buffers in afresh on every call.

XLA:CPU allocates a jitted step's temporary buffer (150 MB for the small CNN at 28 px, batch
128) with ``posix_memalign`` on one of its threads on every call. glibc serves such a block
from a thread's arena only up to 64 MB, and above that maps it with ``mmap`` and unmaps it on
``free``; so each step touches 150 MB of new pages, 4 KiB at a time. On a virtual machine
a page fault is expensive (on the development machine, a Firecracker VM: 42,000 faults and
about 95 ms of system time per 160 ms step). :func:`keep_freed_memory` sets three
``mallopt`` parameters so that every block comes from the one main heap and stays there
after ``free``:

- ``M_ARENA_MAX = 1``: one arena, the main (``brk``) heap, which can grow past 64 MB;
- ``M_MMAP_MAX = 0``: no block is mapped on its own;
- ``M_TRIM_THRESHOLD`` = 2 GiB - 1 (the largest ``mallopt`` takes): the heap's free top is
  not given back below that.

The process keeps its peak heap (as a GPU framework's caching allocator keeps its peak);
nothing else changes, results included. The settings are process-wide and apply to threads
that first allocate after the call, so the binaries call it before JAX starts its threads:
``train.py`` unless ``--keep_host_memory=false`` for image data (``data.image_size > 0``) or
a config whose ``keep_host_memory`` is on (off for the 8 px digits of the main job, whose many
small host allocations then queue on the one arena: 10-20 % slower steps), ``eval.py`` unless
``--keep_host_memory=false``; neither when JAX will run on an accelerator (:func:`cpu_only`:
the buffers are then in device memory). Elsewhere than glibc (macOS, musl) it does nothing.
The same can be had from the environment at start (:data:`ENVIRONMENT`):
``MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import platform

# (mallopt parameter of glibc's malloc.h, its environment variable, value); the trim
# threshold is the largest mallopt takes (a C int).
SETTINGS = ((-8, "MALLOC_ARENA_MAX", 1),                    # M_ARENA_MAX
            (-4, "MALLOC_MMAP_MAX_", 0),                    # M_MMAP_MAX
            (-1, "MALLOC_TRIM_THRESHOLD_", 2**31 - 1))      # M_TRIM_THRESHOLD
# The same settings for a process about to start (glibc reads them at start-up): what the
# benchmarks give every side's worker process, PyTorch's included.
ENVIRONMENT = {name: str(value) for _, name, value in SETTINGS}


def _glibc():
  """glibc's ``ctypes`` handle, or ``None`` on another C library."""
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return None
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return libc if hasattr(libc, "mallopt") else None
  except OSError:
    return None


# JAX plugins for accelerators: with one installed the step's buffers live in device memory
# (nothing to keep on the host) and one arena would only slow the input pipeline's threads.
ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                       "jax_rocm7_plugin", "libtpu")


def cpu_only() -> bool:
  """Whether JAX will run on the CPU: ``JAX_PLATFORMS`` names ``cpu`` first, or (unset) no
  accelerator plugin is installed. Decided without starting JAX's backends (and threads)."""
  platforms = os.environ.get("JAX_PLATFORMS", "").strip()
  if platforms:
    return platforms.split(",")[0].strip() == "cpu"
  return not any(importlib.util.find_spec(name) for name in ACCELERATOR_PLUGINS)


def keep_freed_memory() -> bool:
  """Apply the ``mallopt`` settings of the module docstring to this process.

  Returns:
    ``True`` if glibc accepted all three, ``False`` where they do not apply (not glibc) or
    one was refused.
  """
  libc = _glibc()
  if libc is None:
    return False
  libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  libc.mallopt.restype = ctypes.c_int
  ok = True
  for param, _, value in SETTINGS:
    ok = bool(libc.mallopt(param, value)) and ok
  return ok


def describe(kept: bool | None, *, accelerator: bool = False) -> str:
  """One log line on the setting (``None``: not asked for, or ``accelerator``: not applied
  because JAX runs on an accelerator)."""
  if accelerator:
    return "Host memory: glibc's defaults (JAX runs on an accelerator: nothing to keep)"
  if kept is None:
    return "Host memory: glibc's defaults (keep_host_memory off)"
  if kept:
    return ("Host memory: freed blocks kept in the process (glibc mallopt; "
            "keep_host_memory=false leaves glibc's defaults)")
  return "Host memory: glibc's defaults (keeping freed memory does not apply to this C library)"
