"""benchmarks/speed/train_throughput.py: the full training step on generated JPEG files through the
real input pipeline, on the test session's 8 fake CPU devices (data parallel); no timings are
checked."""

import json

import jax
import pytest

from dml_test_support import load_benchmark


bench = load_benchmark("speed.train_throughput")


def test_smoke_run_on_all_devices_writes_json(tmp_path):
  out = tmp_path / "throughput.json"
  assert bench.main(["--smoke", "--arch=small_cnn", f"--out={out}"]) == 0
  report = json.loads(out.read_text())
  (row,) = report["results"]
  assert row["devices"] == jax.device_count() and row["batch_size"] == 8
  assert (row["model"], row["image_size"], row["dtype"]) == ("small_cnn", 32, "float32")
  for k in bench.INPUTS:
    assert row[k] > 0
  assert row["loss"] == row["loss"]   # finite: the step trained on the decoded JPEGs


def test_generated_jpegs_are_a_class_folder_dataset(tmp_path):
  from dml_jax.data import image_lists  # pylint: disable=import-outside-toplevel
  assert bench.write_jpegs(str(tmp_path), num_classes=4, per_class=3, size=(40, 30)) == 12
  splits = image_lists.LOADERS["image_folder"](root=str(tmp_path), image_size=16,
                                               resize_size=18)
  assert len(splits["train"].labels) == 6 and len(splits["test"].labels) == 6


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match="unknown inputs/dtypes"):
    bench.main(["--inputs=real,gpu"])


def test_set_and_trace_profile_the_step(tmp_path):
  out, trace = tmp_path / "throughput.json", tmp_path / "trace"
  assert bench.main(["--smoke", "--arch=small_cnn", "--inputs=synthetic", f"--out={out}",
                     "--set=model.embedding_dim=64", "--set", "loss.temperature=0.2",
                     f"--trace={trace}", "--trace_steps=2"]) == 0
  (row,) = json.loads(out.read_text())["results"]
  assert row["set"] == ["model.embedding_dim=64", "loss.temperature=0.2"] and row["trace_steps"] == 2
  hlo = (trace / "float32" / "step.hlo.txt").read_text()
  assert "f32[8,64]" in hlo and "f32[8,128]" not in hlo   # the override's embedding width
  profiler = load_benchmark("profiling.op_profile")
  report = profiler.profile_trace(str(trace / "float32"), calls=2)
  assert 0 < report["busy_ms_per_call"] <= report["wall_ms_per_call"] + 1e-9
  assert report["ops"] and all(r["kind"] in profiler.KINDS for r in report["ops"])
  assert sum(bool(r["shape"]) for r in report["ops"]) == len(report["ops"])


def test_an_unknown_config_key_is_named():
  with pytest.raises(ValueError, match="unknown config key model.bogus"):
    bench.main(["--smoke", "--inputs=synthetic", "--set=model.bogus=1"])
