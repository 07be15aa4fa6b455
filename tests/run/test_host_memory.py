"""dml_jax.run.host_memory: with the settings, a large block freed and allocated again is not
page-faulted in afresh (each check in a fresh process: the settings are process-wide)."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from configs import default, mnist_evenodd_eps
from dml_jax.run import cli
from dml_jax.run import host_memory
from dml_jax.run import workdir

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Allocates (malloc, as XLA's buffers), fills and frees a 96 MB block three times (above glibc's largest mmap threshold,
# 32 MB, so by default each one is mapped and unmapped) and prints the minor page faults of
# the last fill.
_FAULTS = textwrap.dedent("""
    import ctypes, resource, sys
    from dml_jax.run import host_memory
    kept = host_memory.keep_freed_memory() if sys.argv[1] == "keep" else None
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    size = 96 << 20
    for _ in range(3):
      block = libc.malloc(size)
      before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
      ctypes.memset(block, 1, size)
      faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
      libc.free(block)
    print(kept, faults)
""")

def _last_fill_faults(mode: str, env: dict | None = None) -> tuple[str, int]:
  out = subprocess.run([sys.executable, "-c", _FAULTS, mode], check=True, capture_output=True,
                       text=True, env=env).stdout.split()
  return out[0], int(out[1])


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")
def test_kept_memory_is_not_faulted_in_again():
  kept, faults = _last_fill_faults("keep")
  assert kept == "True"
  assert faults < 1000          # reused pages: at most a few stray faults
  _, default_faults = _last_fill_faults("default")
  assert default_faults > 20000   # 96 MB of fresh 4 KiB pages (24,576)


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")
def test_environment_form_keeps_memory_too():
  """What the benchmarks give each side's worker (torch's too): the same effect at start-up."""
  env = {**os.environ, **host_memory.ENVIRONMENT}
  _, faults = _last_fill_faults("default", env=env)
  assert faults < 1000


def test_keep_freed_memory_elsewhere_than_glibc_does_nothing(monkeypatch):
  monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
  assert host_memory.keep_freed_memory() is False
  assert "does not apply" in host_memory.describe(False)


def test_train_keeps_host_memory_for_images_only():
  digits, mnist = default.get_config(), mnist_evenodd_eps.get_config()
  assert digits.keep_host_memory is False and mnist.keep_host_memory is False   # no machine
  assert not cli.wants_host_memory(None, digits)               # the 8 px digits
  assert cli.wants_host_memory(None, mnist)                    # images
  assert not cli.wants_host_memory(False, mnist)               # the flag decides
  digits.keep_host_memory = True                               # older workdirs' key
  assert cli.wants_host_memory(None, digits)
  assert "keep_host_memory" in workdir.RESUMABLE_KEYS         # a rerun may change it


def test_cpu_only_follows_jax_platforms_and_plugins(monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert host_memory.cpu_only()
  monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
  assert not host_memory.cpu_only()
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setattr(host_memory.importlib.util, "find_spec",
                      lambda name: object() if name == "jax_cuda12_plugin" else None)
  assert not host_memory.cpu_only()
  assert "accelerator" in host_memory.describe(None, accelerator=True)
