"""Shared test setup: 8 fake CPU devices, XLA at optimisation level 0, the repository root and
tests/ on sys.path."""

import os
import sys

# The suite compiles thousands of small programs and runs each a few times: compilation is
# most of its time. XLA's CPU backend at LLVM optimisation level 0 compiles them 24-31 %
# faster (the same XLA program, machine code less optimised; results agree to round-off, which
# every test's tolerance allows). XLA_FLAGS=--xla_backend_optimization_level=3 runs the suite
# at XLA's default instead. The flag reaches the train.py / eval.py processes tests start.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
      f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0").strip()

# train.py / eval.py subprocesses share one fresh JAX compilation cache (the same smoke
# programs compile once), never the user's ~/.cache. The process that made it (pytest, or
# pytest-xdist's controller, whose workers inherit the variable) removes it when it exits.
if "DML_JAX_COMPILATION_CACHE" not in os.environ:
  import atexit  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  os.environ["DML_JAX_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="dml_jax_test_jax_cache_")
  atexit.register(shutil.rmtree, os.environ["DML_JAX_COMPILATION_CACHE"], ignore_errors=True)

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

# Eight fake CPU devices in the test processes (multi-device tests); set before JAX's backend
# initialises, which happens lazily after this file is imported. The train.py / eval.py
# processes tests start see one CPU device, as a user's CPU run does (8 fake devices on a
# 2-core machine make a 300-step run of the digits recipe 2.5x slower): a test of a binary
# on several devices sets --xla_force_host_platform_device_count in the environment it passes.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  jax.config.update("jax_num_cpu_devices", 8)

# The test processes use it too, for the programs that take a while to compile: many tests
# build the same run or model afresh (a new jitted function each time, so JAX's in-memory
# cache cannot reuse the program), and the programs compiled once serve them all.
if os.environ["DML_JAX_COMPILATION_CACHE"]:
  jax.config.update("jax_compilation_cache_dir", os.environ["DML_JAX_COMPILATION_CACHE"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
for path in (ROOT, TESTS):
  if path not in sys.path:
    sys.path.insert(0, path)


import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope="session")
def run20(tmp_path_factory):
  """One finished 20-step digits run (checkpoints 10 and 20), shared by several test files;
  ``(workdir, results)``. Tests must not write into it (copy it first)."""
  from dml_jax.run import training  # pylint: disable=import-outside-toplevel
  from dml_test_support import small_config  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path_factory.mktemp("run20"))
  results = training.train_and_evaluate(small_config(20), workdir, show_progress=False)
  return workdir, results


@pytest.fixture
def run20_copy(run20, tmp_path):
  """A copy of the shared finished 20-step run (:func:`run20`), for a test to write into."""
  import shutil  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / "copy")
  shutil.copytree(run20[0], workdir)
  return workdir
