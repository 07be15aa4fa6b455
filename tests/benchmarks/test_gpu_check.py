"""benchmarks/device/gpu_check.sh (the checks of one call on a GPU machine): it parses,
refuses an unknown part, and its 'versions' part runs anywhere (here it must find that the
models lower to a dot, not a convolution, on the CPU)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "device", "gpu_check.sh")


def run(tmp_path, *parts):
  # from an empty folder: no .whl/ to install; python3 = this interpreter
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  wrapper = bin_dir / "python3"
  wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
  wrapper.chmod(0o755)
  env = {**os.environ, "OUT": str(tmp_path / "out"), "PATH": f"{bin_dir}:{os.environ['PATH']}",
         "PYTHONPATH": ROOT}
  return subprocess.run(["bash", SCRIPT, *parts], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=300, check=False)


def test_unknown_part_is_refused(tmp_path):
  r = run(tmp_path, "bogus")
  assert r.returncode == 2
  assert ("unknown part bogus; allowed: versions tests cross main throughput omniglot "
          "retrieval clustering workers") in r.stderr


def test_versions_part_reports_the_cpu_lowering(tmp_path):
  r = run(tmp_path, "versions")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "conv_auto on cpu -> convolution ops: 0" in r.stdout
  assert (tmp_path / "out" / "versions.txt").read_text().startswith("jax ")
