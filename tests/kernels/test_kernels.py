"""dml_jax.kernels: the C++ kernels are built once and cached, and every way of not having
them (switched off, no compiler, a failed build) falls back to the XLA path with one clear
message."""

import os
import re

import jax
import numpy as np
import pytest

from dml_jax import kernels
from dml_jax.evaluation import top_m
from dml_jax.evaluation import top_m_kernel
from dml_test_support import require_compiler
from dml_test_support import require_kernel


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
  monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path))
  return tmp_path


def test_build_compiles_once_then_reuses_the_cached_library(fresh_cache):
  require_compiler()
  path = kernels.build("soft_pool.cc")   # the quickest source to compile
  assert os.path.dirname(path) == str(fresh_cache) and path.endswith(".so")
  stamp = os.stat(path).st_mtime_ns
  assert kernels.build("soft_pool.cc") == path
  assert os.stat(path).st_mtime_ns == stamp, "a cached library must not be rebuilt"
  assert os.listdir(fresh_cache) == [os.path.basename(path)], "no temporary file is left"


def test_the_cached_library_has_the_mode_the_umask_gives(fresh_cache):
  # a cache shared by several users (DML_JAX_KERNEL_CACHE) must be loadable by all of them:
  # the library gets the linker's usual mode, not that of a private temporary file
  require_compiler()
  old = os.umask(0o022)
  try:
    path = kernels.build("soft_pool.cc")
  finally:
    os.umask(old)
  assert os.stat(path).st_mode & 0o777 == 0o755
  assert os.listdir(fresh_cache) == [os.path.basename(path)], "no temporary file is left"


def test_load_registers_the_handlers():
  require_kernel("top_m.cc")
  assert kernels.load("top_m.cc") == {"merge_rows": "dml_jax_top_m_merge_rows",
                                      "merge_both": "dml_jax_top_m_merge_both",
                                      "count_rows": "dml_jax_top_m_count_rows",
                                      "count_both": "dml_jax_top_m_count_both",
                                      "select_rows": "dml_jax_top_m_select_rows",
                                      "argmax_rows": "dml_jax_top_m_argmax_rows"}
  assert kernels.load("soft_pool.cc") == {"forward": "dml_jax_soft_pool_forward",
                                          "backward": "dml_jax_soft_pool_backward"}
  assert kernels.load("conv.cc") == {"forward": "dml_jax_conv_forward",
                                     "kernel_grad": "dml_jax_conv_kernel_grad"}


def test_unknown_source_is_named():
  known = r"\['conv.cc', 'soft_pool.cc', 'top_m.cc'\]"
  with pytest.raises(ValueError, match=rf"unknown kernel source 'fft.cc'; known: {known}"):
    kernels.load("fft.cc")


def test_switched_off_gives_the_xla_path(monkeypatch):
  monkeypatch.setenv(kernels.SWITCH_ENV, "0")
  assert kernels.load("top_m.cc") is None
  with pytest.raises(RuntimeError, match="DML_JAX_CPU_KERNELS"):
    top_m.top_m_neighbors(np.eye(4, dtype=np.float32), m=1, selection="kernel")
  # 'auto' still answers, through XLA
  np.testing.assert_array_equal(
      top_m.top_m_neighbors(np.eye(3, dtype=np.float32), m=2, selection="auto"),
      [[1, 2], [0, 2], [0, 1]])


def test_choose_is_the_dispatch_of_every_user(monkeypatch):
  # softtriple's soft pool, the top-m tile merge and the convolutions all dispatch by
  # kernels.choose (and call the chosen targets by kernels.require)
  from dml_test_support import ROOT  # pylint: disable=import-outside-toplevel
  for user in ("dml_jax/objectives/_softmax.py", "dml_jax/evaluation/top_m.py",
               "dml_jax/models/conv.py"):
    with open(os.path.join(ROOT, user), encoding="utf-8") as f:
      calls = set(re.findall(r"kernels\.(\w+)\(", f.read()))
    assert "choose" in calls and calls <= {"choose", "require"}, (user, calls)
  assert kernels.choose("soft_pool.cc", "xla") is None
  assert kernels.choose("soft_pool.cc") == kernels.load("soft_pool.cc")
  with pytest.raises(ValueError, match="kernel selection must be one of .*'fast'"):
    kernels.choose("soft_pool.cc", "fast")
  monkeypatch.setenv(kernels.SWITCH_ENV, "0")
  assert kernels.choose("conv.cc") is None
  with pytest.raises(RuntimeError, match="conv.cc is not available: DML_JAX_CPU_KERNELS=0"):
    kernels.choose("conv.cc", "kernel")


def test_no_compiler_warns_once_and_falls_back(fresh_cache, monkeypatch):
  monkeypatch.setenv("CXX", "no-such-compiler-dml-jax")
  with pytest.raises(OSError, match="no C.. compiler 'no-such-compiler-dml-jax' on PATH"):
    kernels.build("top_m.cc")
  with pytest.warns(UserWarning, match="pure-XLA path"):
    assert kernels._load.__wrapped__("top_m.cc") is None


def test_an_unwritable_cache_names_the_variable_that_moves_it(tmp_path, monkeypatch):
  # a read-only or missing home (a cache path under a file here: root may write anywhere)
  (tmp_path / "file").write_text("")
  monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path / "file" / "cache"))
  monkeypatch.setenv("CXX", "true")   # no compile is reached
  with pytest.raises(OSError, match=f"cannot write the kernel cache .*file/cache .*"
                                    f"{kernels.CACHE_ENV}=DIR moves it"):
    kernels.build("soft_pool.cc")
  with pytest.warns(UserWarning, match=f"{kernels.CACHE_ENV}=DIR moves it.*pure-XLA path"):
    assert kernels._load.__wrapped__("soft_pool.cc") is None


def test_without_a_home_the_kernel_cache_is_not_a_folder_named_tilde(tmp_path, monkeypatch):
  monkeypatch.delenv(kernels.CACHE_ENV, raising=False)
  monkeypatch.delenv("HOME", raising=False)   # and no passwd entry: '~' stays '~'
  monkeypatch.setattr(kernels.os.path, "expanduser", lambda p: p)
  monkeypatch.setenv("CXX", "true")
  monkeypatch.chdir(tmp_path)
  with pytest.raises(OSError, match=f"no home folder .*HOME is not set.*{kernels.CACHE_ENV}=DIR"):
    kernels.build("soft_pool.cc")
  assert not os.listdir(tmp_path)


def test_cxx_may_be_a_command_with_words(fresh_cache, tmp_path, monkeypatch):
  require_compiler()
  tiny = tmp_path / "tiny.cc"   # a source that compiles in a moment: the command is the test
  tiny.write_text('extern "C" int dml_jax_tiny() { return 1; }\n')
  monkeypatch.setattr(kernels, "source_path", lambda source: str(tiny))
  cxx = kernels.compiler()
  monkeypatch.setenv("CXX", f"env DML_JAX_TEST=1 {' '.join(cxx)}")   # e.g. 'ccache g++'
  assert kernels.compiler()[1:] == ["DML_JAX_TEST=1", *cxx]
  first = kernels.build("soft_pool.cc")
  assert os.path.exists(first)
  monkeypatch.setenv("CXX", f"env DML_JAX_TEST=2 {' '.join(cxx)}")   # other words, other .so
  assert kernels.build("soft_pool.cc") != first


def test_a_failed_compile_reports_the_compiler_message(fresh_cache, tmp_path, monkeypatch):
  require_compiler()
  bad = tmp_path / "bad.cc"
  bad.write_text("this is not C++\n")
  monkeypatch.setattr(kernels, "source_path", lambda source: str(bad))
  with pytest.raises(OSError, match="failed on top_m.cc: .*error"):
    kernels.build("top_m.cc")
  assert [f for f in os.listdir(fresh_cache) if f.endswith(".so")] == []


def test_selection_is_checked():
  with pytest.raises(ValueError, match=r"selection must be one of .*'fast'"):
    top_m.top_m_neighbors(np.eye(4, dtype=np.float32), m=1, selection="fast")


@pytest.mark.parametrize("machine,flags,supported", [
    ("x86_64", {"sse4_2", "avx", "avx2", "fma"}, True),
    ("AMD64", {"avx2", "fma", "avx512f"}, True),
    ("x86_64", {"sse4_2", "avx"}, False),          # no AVX2 / FMA: XLA is the better path
    ("x86_64", {"avx2"}, False),
    ("aarch64", {"asimd", "avx2", "fma"}, False),  # Arm: never the kernels
])
def test_kernels_need_x86_64_with_avx2_and_fma(monkeypatch, machine, flags, supported):
  monkeypatch.setattr(kernels.platform, "machine", lambda: machine)
  monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset(flags))
  monkeypatch.delenv(kernels.SWITCH_ENV, raising=False)
  assert kernels.cpu_supported() is supported
  if jax.default_backend() == "cpu":
    assert kernels.enabled() is supported
    if not supported:   # the XLA path, silently; a direct call says why
      assert kernels.load("soft_pool.cc") is None
      assert "not x86-64 with AVX2 and FMA" in kernels.unavailable()
      with pytest.raises(RuntimeError, match=rf"soft_pool.cc is not available: the CPU "
                                             rf"\({machine}\) is not x86-64 with AVX2 and FMA"):
        kernels.require("soft_pool.cc")


def test_cpu_flags_of_this_machine():
  flags = kernels.cpu_flags()
  assert isinstance(flags, frozenset)
  if os.path.exists("/proc/cpuinfo") and kernels.platform.machine() == "x86_64":
    assert "sse2" in flags   # every x86-64 CPU has it


def test_direct_calls_without_the_kernel_say_why(monkeypatch):
  # Code calling a kernel directly gets one clear error, not an index into None.
  from dml_jax.models import conv  # pylint: disable=import-outside-toplevel
  from dml_jax.objectives import _softmax  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv(kernels.SWITCH_ENV, "0")
  cos = jax.numpy.zeros((2, 8), jax.numpy.float32)
  with pytest.raises(RuntimeError, match="soft_pool.cc is not available: DML_JAX_CPU_KERNELS=0"):
    _softmax.soft_pool_kernel(cos, 2, 0.1)
  with pytest.raises(RuntimeError, match="conv.cc is not available"):
    conv.direct_valid(jax.numpy.ones((1, 4, 4, 8)), jax.numpy.ones((3, 3, 8, 8)),
                      strides=(1, 1))
  with pytest.raises(RuntimeError, match="top_m.cc is not available"):
    top_m_kernel.merge_tile_kernel(cos, jax.numpy.zeros(3, jax.numpy.int32),
                            (jax.numpy.zeros((2, 1)), jax.numpy.zeros((2, 1), jax.numpy.int32)))
