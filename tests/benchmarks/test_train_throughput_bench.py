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
  assert report["ops"] and all(r["kind"] in load_benchmark("hlo").KINDS for r in report["ops"])
  assert sum(bool(r["shape"]) for r in report["ops"]) == len(report["ops"])


def test_an_unknown_config_key_is_named():
  with pytest.raises(ValueError, match="unknown config key model.bogus"):
    bench.main(["--smoke", "--inputs=synthetic", "--set=model.bogus=1"])


def test_gpu_target_without_the_cuda_plugin_is_one_line(monkeypatch, capsys):
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

  def no_plugin(*args, **kwargs):
    raise NotImplementedError("topology not implemented for cuda\nmore detail")
  monkeypatch.setattr(topologies, "get_topology_desc", no_plugin)
  assert bench.main(["--smoke", "--gpu_target=h100"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "jax-cuda12-plugin" in err
  assert "topology not implemented for cuda" in err and "more detail" not in err
  assert bench.main(["--smoke", "--gpu_target=a100"]) == 2
  assert "--gpu_target='a100'; allowed: h100, h200" in capsys.readouterr().err


def test_gpu_target_summarises_the_compiled_step(monkeypatch, tmp_path):
  # the GPU's mesh replaced by the test session's CPU devices: the same path, another compiler
  mesh = jax.sharding.Mesh(jax.devices()[:1], ("data",))
  monkeypatch.setattr(bench, "gpu_mesh", lambda target: mesh)
  out, trace = tmp_path / "program.json", tmp_path / "programs"
  assert bench.main(["--smoke", "--arch=small_cnn", "--gpu_target=h200", f"--out={out}",
                     "--set=model.embedding_dim=64", f"--trace={trace}", "--variant=",
                     "--variant=model.conv_impl=lax loss.temperature=0.2"]) == 0
  report = json.loads(out.read_text())
  assert report["device"] == "NVIDIA H200" and report["gpu_target"] == "h200"
  rows = report["results"]
  assert [r["set"] for r in rows] == [
      ["model.embedding_dim=64"],
      ["model.embedding_dim=64", "model.conv_impl=lax", "loss.temperature=0.2"]]
  for row in rows:
    assert row["batch_size"] == 8 and row["kernels"] > 0 and row["gb"] > 0
    assert row["kernels"] >= row["small_kernels"]
    assert row["kernels"] == sum(k["kernels"] for k in row["kinds"])
  as_is = (trace / "float32" / "step.hlo.txt").read_text()
  lax = (trace / "float32" / "model.conv_impl-lax_loss.temperature-0.2" / "step.hlo.txt")
  assert "f32[8,32,32,3]" in as_is and "f32[8,64]" in as_is   # the batch, the override
  assert "f32[8,64]" in lax.read_text() and lax.read_text() != as_is   # its own program
  assert bench.table(report).count("\n") == 5   # title, blank, header, rule, two rows
