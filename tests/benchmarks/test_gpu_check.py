"""benchmarks/device/gpu_check.sh (the checks of one call on a GPU machine): it parses,
refuses an unknown part, its 'versions' part runs anywhere (here it must find that the models
lower to a dot, not a convolution, on the CPU), and its 'step' part's variants are run and
merged (with a stand-in for the step's command; the real step is the long test's)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "device", "gpu_check.sh")


def base_env(tmp_path):
  """The environment of a call: $OUT under tmp_path, and python3 = this interpreter."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  wrapper = bin_dir / "python3"
  wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
  wrapper.chmod(0o755)
  return {**os.environ, "OUT": str(tmp_path / "out"),
          "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run(tmp_path, *parts):
  # from an empty folder: no .whl/ to install
  env = {**base_env(tmp_path), "PYTHONPATH": ROOT}
  return subprocess.run(["bash", SCRIPT, *parts], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=300, check=False)


def test_unknown_part_is_refused(tmp_path):
  r = run(tmp_path, "bogus")
  assert r.returncode == 2
  assert ("unknown part bogus; allowed: versions tests cross main throughput omniglot "
          "retrieval clustering workers profile step") in r.stderr


def test_versions_part_reports_the_cpu_lowering(tmp_path):
  r = run(tmp_path, "versions")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "conv_auto on cpu -> convolution ops: 0" in r.stdout
  assert (tmp_path / "out" / "versions.txt").read_text().startswith("jax ")


# the step's command for the step part's own logic: it writes the row train_throughput.py
# writes (its arguments after --set=, the XLA_FLAGS it saw) and fails as the real one does on
# an unknown config key or an XLA flag XLA does not know
FAKE_STEP = """import json, os, sys
flags = os.environ.get("XLA_FLAGS", "").strip()
sets = [a[len("--set="):] for a in sys.argv[1:] if a.startswith("--set=")]
if any("bogus" in s for s in sets) or "no_such_flag" in flags:
  sys.exit("failed")
out = [a[len("--out="):] for a in sys.argv[1:] if a.startswith("--out=")][-1]
row = {"dtype": "bfloat16", "synthetic": 12.5, "xla_flags": flags, "argv": sys.argv[1:]}
json.dump({"results": [{**row, **({"set": sets} if sets else {})}]}, open(out, "w"))
"""


def step_env(tmp_path, tp):
  return {**base_env(tmp_path), "PROFILE_DIR": str(tmp_path / "trace"), "TP": tp,
          # the second variant's flags are two that JAX leaves out of its compilation cache's
          # key (the real step's variants then share one compiled program)
          "STEP_VARIANTS": ("\n--set=model.embedding_dim=512 XLA_FLAGS=--xla_dump_hlo_as_text=false"
                            " XLA_FLAGS=--xla_dump_include_timestamp=false\n--set=model.bogus=1"
                            "\nXLA_FLAGS=--xla_no_such_flag"),   # reaches XLA: fails
          # the test session's optimisation level (and one CPU device, as every binary here)
          "XLA_FLAGS": "--xla_backend_optimization_level=0",
          "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache"),
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def check_step_json(out, stdout):
  step = json.loads((out / "step.json").read_text())
  assert [row.get("set", []) for row in step["rows"]] == [[], ["model.embedding_dim=512"]]
  assert [row["xla_flags"] for row in step["rows"]] == [   # the environment's, and the line's
      "--xla_backend_optimization_level=0", "--xla_backend_optimization_level=0 "
      "--xla_dump_hlo_as_text=false --xla_dump_include_timestamp=false"]
  assert all(row["dtype"] == "bfloat16" and row["synthetic"] > 0 for row in step["rows"])
  assert step["stamp"]["part"] == "step"
  assert "variant 3 (--set=model.bogus=1) failed: no result" in stdout
  assert "variant 4 (XLA_FLAGS=--xla_no_such_flag) failed: no result" in stdout
  assert not list(out.glob("step_[0-9]*.json"))   # the variants' own files are merged


def test_step_part_runs_each_variant_and_names_the_failed_ones(tmp_path):
  (tmp_path / "fake_step.py").write_text(FAKE_STEP)
  env = step_env(tmp_path, f"python3 {tmp_path / 'fake_step.py'} --arch=resnet18")
  r = subprocess.run(["bash", SCRIPT, "step"], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=300, check=False)
  assert r.returncode == 0, r.stderr[-2000:]
  check_step_json(tmp_path / "out", r.stdout)
  rows = json.loads((tmp_path / "out" / "step.json").read_text())["rows"]
  # the part's own flags follow the step's command; a variant's arguments come last
  assert rows[1]["argv"] == ["--arch=resnet18", "--dtypes=bfloat16", "--inputs=synthetic",
                             "--steps=30", "--warmup=3", "--set=model.embedding_dim=512",
                             f"--out={tmp_path / 'out' / 'step_2.json'}"]
  assert "    12.5 images/s  --xla_backend_optimization_level=0\n" in r.stdout


@pytest.mark.long
def test_profile_and_step_parts_with_a_small_step(tmp_path):
  # the parts with the real step on a small ResNet, from the repository root (70 s here)
  env = step_env(tmp_path, "python3 benchmarks/speed/train_throughput.py --arch=resnet18 "
                 "--image_size=32 --batch_size=8 --group_size=4 --num_classes=4 --per_class=8 "
                 "--source_size=48x40")
  r = subprocess.run(["bash", SCRIPT, "profile", "step"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=600, check=False)
  assert r.returncode == 0, r.stderr[-2000:]
  out = tmp_path / "out"
  profile = json.loads((out / "step_profile.json").read_text())
  assert profile["ops"] and profile["kinds"] and profile["busy_ms_per_call"] > 0
  assert profile["ceilings"]["copy_gb_per_s"] > 0
  assert profile["ceilings"]["bf16_matmul_tflop_per_s"] > 0
  import tarfile  # pylint: disable=import-outside-toplevel
  with tarfile.open(out / "profile.tar.gz") as tar:
    names = tar.getnames()
  assert "./bfloat16/step.hlo.txt" in names
  assert any(n.endswith("perfetto_trace.json.gz") for n in names)
  # what a call brings back: a few files, at most two folders down
  files = [p for p in out.rglob("*") if p.is_file()]
  assert len(files) <= 5 and all(len(p.relative_to(out).parts) <= 3 for p in files)
  check_step_json(out, r.stdout)


PREPARE = os.path.join(ROOT, "benchmarks", "device", "prepare.sh")


def test_prepare_copies_the_omniglot_zips_and_names_a_missing_one(tmp_path):
  src = tmp_path / "omniglot"
  src.mkdir()
  (src / "images_background.zip").write_bytes(b"background")
  env = {**os.environ, "PREPARE_DIR": str(tmp_path / "repo"), "WHEELS": "0"}
  (tmp_path / "repo").mkdir()
  r = subprocess.run(["bash", PREPARE, str(src)], env=env, capture_output=True, text=True,
                     timeout=60, check=False)
  assert r.returncode == 2
  assert f"{src}/images_evaluation.zip does not exist" in r.stderr
  assert not (tmp_path / "repo" / ".gpu_data").exists()     # nothing half-done
  (src / "images_evaluation.zip").write_bytes(b"evaluation")
  r = subprocess.run(["bash", PREPARE, str(src)], env=env, capture_output=True, text=True,
                     timeout=60, check=False)
  assert r.returncode == 0, r.stderr
  copied = tmp_path / "repo" / ".gpu_data" / "omniglot"
  assert sorted(p.name for p in copied.iterdir()) == ["images_background.zip",
                                                      "images_evaluation.zip"]
  assert (copied / "images_evaluation.zip").read_bytes() == b"evaluation"
