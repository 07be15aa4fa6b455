"""Shared test setup: 8 fake CPU devices, the repository root and tests/ on sys.path."""

import os
import sys

# Eight fake CPU devices for the whole session (multi-device tests); must precede JAX's
# backend initialisation, which happens lazily after this file is imported.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()

# train.py / eval.py subprocesses share one fresh JAX compilation cache (the same smoke
# programs compile once), never the user's ~/.cache.
if "DML_JAX_COMPILATION_CACHE" not in os.environ:
  import tempfile  # pylint: disable=g-import-not-at-top
  os.environ["DML_JAX_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="dml_jax_test_jax_cache_")

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
