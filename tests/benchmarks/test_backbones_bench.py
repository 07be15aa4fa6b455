"""benchmarks/speed/backbones.py: the workers run a tiny case, the table/JSON and ratio code works;
no timings are checked."""

import json

import pytest

from dml_test_support import load_benchmark, require_kernel


bench = load_benchmark("speed.backbones")


def test_tiny_run_writes_json_for_both_conv_formulations(tmp_path):
  out = tmp_path / "backbones.json"
  assert bench.main(["--cases=small_cnn:8:4", "--sides=dml_jax,dml_jax_lax", "--rounds=2",
                     "--steps=1", f"--out={out}"]) == 0
  report = json.loads(out.read_text())
  rows = {r["side"]: r for r in report["results"]}
  assert set(rows) == {"dml_jax", "dml_jax_lax"}
  for r in rows.values():
    assert (r["arch"], r["image_size"], r["batch_size"], r["dtype"]) == ("small_cnn", 8, 4,
                                                                          "float32")
    assert r["images_per_s"] > 0 and len(r["round_images_per_s"]) == 2
  assert report["conditions"]["threads"] >= 1


def test_ratios_and_case_errors():
  runs = [{"seconds": 1.0, "first_call_s": 2.0, "steps": 2}, {"seconds": 2.0, "first_call_s": None,
                                                               "steps": 2}]
  case = {"arch": "resnet18", "image_size": 64, "batch_size": 4}
  torch_runs = [{**r, "seconds": 2 * r["seconds"]} for r in runs]
  rows = [bench.summarize(case, "dml_jax", "float32", runs),
          bench.summarize(case, "torch", "float32", torch_runs)]
  bench.add_ratios(rows)
  assert rows[0]["images_per_s"] == pytest.approx(6.0)   # median of 8 and 4 images/s
  assert rows[0]["ratio_to_torch"] == pytest.approx(2.0)
  assert rows[0]["paired_ratio"] == pytest.approx(2.0)
  assert "ratio_to_torch" not in rows[1]
  assert bench.in_channels({"arch": "small_cnn", "image_size": 28}) == 1
  assert bench.in_channels({"arch": "small_cnn", "image_size": 32}) == 3
  with pytest.raises(ValueError, match="arch:image_size:batch"):
    bench.parse_case("vgg16:224:8")
  with pytest.raises(ValueError, match="unknown sides"):
    bench.main(["--sides=jax"])


@pytest.mark.parametrize("case", ["small_cnn:28:2", "resnet18:32:2"])
def test_torch_side_has_the_same_parameters_as_ours(case):
  """The torch network is the same architecture: equal parameter counts (conv biases and
  BatchNorm scales included)."""
  pytest.importorskip("torch")
  import jax  # pylint: disable=import-outside-toplevel
  case = bench.parse_case(case)
  theirs = bench.TorchModel(case)
  assert theirs.run(1) > 0
  ours = bench.JaxModel(case, dtype="float32", conv_impl="auto")
  assert sum(p.numel() for p in theirs.model.parameters()) == sum(
      x.size for x in jax.tree.leaves(ours.params))


def test_conv_parts_tiny_run_writes_json(tmp_path):
  parts = load_benchmark("speed.conv_parts")
  out = tmp_path / "conv_parts.json"
  assert parts.main(["--batch=2", "--size=6", "--cin=3", "--cout=8", "--reps=1",
                     f"--out={out}"]) == 0
  report = json.loads(out.read_text())
  assert set(report["layer"]) == {"lax", "matmul", "direct"}
  assert report["gemm"][0]["shape"] == [2 * 6 * 6, 27, 8] and report["gemm"][0]["gflops"] > 0


def test_conv_parts_weight_grads_cover_resnet50_and_write_json(tmp_path):
  parts = load_benchmark("speed.conv_parts")
  shapes = parts.resnet50_weight_grads(224)
  # 52 convolutions after the stem; a 3 x 3 per block, strided in the first block of stages 2-4
  assert sum(s["count"] for s in shapes) == 52
  assert sum(s["count"] for s in shapes if s["window"] == 3) == 16
  assert {(s["size"], s["cin"], s["cout"], s["stride"]) for s in shapes if s["window"] == 3
          and s["stride"] == 2} == {(56, 128, 128, 2), (28, 256, 256, 2), (14, 512, 512, 2)}
  require_kernel("conv.cc")
  out = tmp_path / "weight_grads.json"
  assert parts.main(["--weight_grads", "--batch=1", "--size=32", "--shapes=2", "--reps=1",
                     f"--out={out}"]) == 0
  rows = json.loads(out.read_text())["weight_grads"]
  assert len(rows) == 2 and rows[0]["window"] == 1
  assert set(rows[0]["ms"]) == {"kernel_unpacked", "kernel_packed", "xla_matmul"}
  assert all(v > 0 for r in rows for v in r["ms"].values())


def test_conv_parts_weight_grads_say_in_one_line_when_the_kernel_is_missing(
    tmp_path, monkeypatch, capsys):
  parts = load_benchmark("speed.conv_parts")
  monkeypatch.setenv("DML_JAX_CPU_KERNELS", "0")
  out = tmp_path / "weight_grads.json"
  assert parts.main(["--weight_grads", "--batch=1", "--size=32", "--shapes=1", "--reps=1",
                     f"--out={out}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("conv_parts.py: --weight_grads times the C++ kernel; the C++ kernel "
                        "conv.cc is not available: DML_JAX_CPU_KERNELS=0."), err
  assert "\n" not in err, err
  assert not out.exists()


def test_conv_parts_batch_norm_covers_resnet50_and_writes_json(tmp_path):
  parts = load_benchmark("speed.conv_parts")
  # stem 112 px x 64, then (64, 256), (128, 512), (256, 1024), (512, 2048) at 56 / 28 / 14 / 7
  assert parts.resnet50_activations(224) == [(112, 64), (56, 64), (56, 256), (28, 128),
                                              (28, 512), (14, 256), (14, 1024), (7, 512),
                                              (7, 2048)]
  out = tmp_path / "batch_norm.json"
  assert parts.main(["--batch_norm", "--batch=2", "--size=32", "--reps=1", f"--out={out}"]) == 0
  rows = json.loads(out.read_text())["batch_norm"]
  assert [r["shape"] for r in rows][:2] == [[2, 16, 16, 64], [2, 8, 8, 64]]
  assert all(set(r["ms"]) == {"nnx", "fused"} and min(r["ms"].values()) > 0 for r in rows)
