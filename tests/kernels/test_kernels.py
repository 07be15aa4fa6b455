"""dml_jax.kernels: the C++ kernels are built once and cached, and every way of not having
them (switched off, no compiler, a failed build) falls back to the XLA path with one clear
message."""

import os

import numpy as np
import pytest

from dml_jax import kernels
from dml_jax.evaluation import top_m


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
  monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path))
  return tmp_path


def test_build_compiles_once_then_reuses_the_cached_library(fresh_cache):
  path = kernels.build("top_m.cc")
  assert os.path.dirname(path) == str(fresh_cache) and path.endswith(".so")
  stamp = os.stat(path).st_mtime_ns
  assert kernels.build("top_m.cc") == path
  assert os.stat(path).st_mtime_ns == stamp, "a cached library must not be rebuilt"
  assert os.listdir(fresh_cache) == [os.path.basename(path)], "no temporary file is left"


def test_load_registers_the_handlers():
  assert kernels.load("top_m.cc") == {"merge_rows": "dml_jax_top_m_merge_rows",
                                      "merge_both": "dml_jax_top_m_merge_both"}
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


def test_no_compiler_warns_once_and_falls_back(fresh_cache, monkeypatch):
  monkeypatch.setenv("CXX", "no-such-compiler-dml-jax")
  with pytest.raises(OSError, match="no C.. compiler 'no-such-compiler-dml-jax' on PATH"):
    kernels.build("top_m.cc")
  with pytest.warns(UserWarning, match="pure-XLA path"):
    assert kernels._load.__wrapped__("top_m.cc") is None


def test_a_failed_compile_reports_the_compiler_message(fresh_cache, tmp_path, monkeypatch):
  bad = tmp_path / "bad.cc"
  bad.write_text("this is not C++\n")
  monkeypatch.setattr(kernels, "source_path", lambda source: str(bad))
  with pytest.raises(OSError, match="failed on top_m.cc: .*error"):
    kernels.build("top_m.cc")
  assert [f for f in os.listdir(fresh_cache) if f.endswith(".so")] == []


def test_selection_is_checked():
  with pytest.raises(ValueError, match=r"selection must be one of .*'fast'"):
    top_m.top_m_neighbors(np.eye(4, dtype=np.float32), m=1, selection="fast")
