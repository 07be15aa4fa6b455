"""The tests of the code that uses the C++ kernels pass without them: switched off
(``DML_JAX_CPU_KERNELS=0``) and with no C++ compiler (a fresh kernel cache), each in a pytest
subprocess over the kernel-dependent tests (those that skip without a kernel, and the paths
that fall back to XLA: softtriple, the tile merge's selection, the convolution's dispatch)."""

import os
import subprocess
import sys

import pytest

from dml_test_support import ROOT

FILES = ("tests/kernels/test_kernels.py", "tests/objectives/test_softmax.py",
         "tests/models/test_conv.py", "tests/evaluation/test_top_m.py")
SELECT = "kernel or applies or pointwise or auto_on_cpu or selection or softtriple"
# the build's own tests compile into a fresh cache of their own with the compiler they name,
# the same in every setting: the suite runs them once
BUILD_TESTS = ("compiles_once", "mode_the_umask_gives", "cxx_may_be_a_command",
               "failed_compile_reports")


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["switched_off", "no_compiler"])
def test_kernel_dependent_tests_pass_without_the_kernels(setting, tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
  if setting == "switched_off":
    env["DML_JAX_CPU_KERNELS"] = "0"
  else:   # the kernels on (whatever the calling environment says), no compiler to build them
    env.pop("DML_JAX_CPU_KERNELS", None)
    env["CXX"] = "no-such-compiler-dml-jax"
    env["DML_JAX_KERNEL_CACHE"] = str(tmp_path)   # nothing built before
  done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "-k", f"({SELECT}) and not ({' or '.join(BUILD_TESTS)})", *FILES], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=900)
  tail = done.stdout[-4000:] + done.stderr[-2000:]
  assert done.returncode == 0, tail
  assert " passed" in done.stdout and " skipped" in done.stdout, tail
  reason = "DML_JAX_CPU_KERNELS=0" if setting == "switched_off" else "its build failed"
  assert reason in done.stdout, tail
