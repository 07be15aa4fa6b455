"""Tests of the torchvision / BN-Inception port -> Flax weight conversion."""

import os
import pickle

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dml_jax.models import pretrained


def _fake_state_dict(arch, seed=0):
  rng = np.random.default_rng(seed)
  return {k: rng.standard_normal(s).astype(np.float32)
          for k, s in pretrained.torch_key_table(arch).items()}


def _backbone_shapes(model):
  return {"/".join(map(str, p)): tuple(v.shape)
          for p, v in nnx.to_flat_state(nnx.state(model.backbone))}


@pytest.mark.parametrize("arch", pretrained.ARCHS)
def test_converter_consumes_every_key_once_with_matching_shapes(arch):
  plan = pretrained.conversion_plan(arch)
  keys = [row[0] for row in plan]
  assert len(keys) == len(set(keys))
  paths = [row[2] for row in plan if row[2] is not None]
  assert len(paths) == len(set(paths))  # no flax variable written twice
  skipped = {row[0] for row in plan if row[3] == "skip"}
  assert all(k.endswith("num_batches_tracked") or k.split(".")[0] in ("fc", "last_linear")
             for k in skipped)
  sd = _fake_state_dict(arch)
  weights = pretrained.convert_state_dict(sd, arch)
  model = pretrained.build_abstract(arch)
  assert {k: v.shape for k, v in weights.items()} == _backbone_shapes(model)
  pretrained.assign_backbone(model, weights)  # every backbone variable, exactly


def test_conv_transpose_and_bn_mapping():
  sd = _fake_state_dict("resnet18")
  w = pretrained.convert_state_dict(sd, "resnet18")
  np.testing.assert_array_equal(w["layer2/0/downsample_conv/kernel"],
                                sd["layer2.0.downsample.0.weight"].transpose(2, 3, 1, 0))
  assert w["conv1/kernel"].shape == (7, 7, 3, 64)
  np.testing.assert_array_equal(w["layer4/1/bn2/var"], sd["layer4.1.bn2.running_var"])
  np.testing.assert_array_equal(w["bn1/scale"], sd["bn1.weight"])
  # num_batches_tracked is optional (the BN-Inception port's file has none).
  sd = {k: v for k, v in _fake_state_dict("bn_inception").items()
        if not k.endswith("num_batches_tracked")}
  w = pretrained.convert_state_dict(sd, "bn_inception")
  np.testing.assert_array_equal(w["inception_4e_3x3/bn/mean"],
                                sd["inception_4e_3x3_bn.running_mean"])
  np.testing.assert_array_equal(w["conv2_3x3/conv/bias"], sd["conv2_3x3.bias"])


def test_vectors_stored_as_one_row_are_read_as_vectors():
  """The BN-Inception port's first file stores its BatchNorm vectors as [1, C]."""
  sd = _fake_state_dict("bn_inception")
  rows = {k: v[None] if v.ndim == 1 else v for k, v in sd.items()}
  want, got = (pretrained.convert_state_dict(d, "bn_inception") for d in (sd, rows))
  assert want.keys() == got.keys()
  for k, v in want.items():
    np.testing.assert_array_equal(got[k], v)
  sd = _fake_state_dict("resnet18")
  sd["bn1.running_var"] = np.zeros((2, 64))
  with pytest.raises(ValueError, match=r"bn1\.running_var: checkpoint \(2, 64\)"):
    pretrained.convert_state_dict(sd, "resnet18")


def test_mismatches_raise_listing_the_keys():
  sd = _fake_state_dict("resnet18")
  del sd["layer1.0.conv1.weight"]
  sd["layer5.0.conv1.weight"] = np.zeros((1,))
  sd["bn1.running_var"] = np.zeros((65,))
  with pytest.raises(ValueError, match=r"1 missing: layer1\.0\.conv1\.weight; 1 unexpected: "
                     r"layer5\.0\.conv1\.weight; 1 shape mismatches: bn1\.running_var: "
                     r"checkpoint \(65,\) vs expected \(64,\)"):
    pretrained.convert_state_dict(sd, "resnet18")
  with pytest.raises(ValueError, match="arch='vgg16'"):
    pretrained.conversion_plan("vgg16")


def test_save_load_round_trip_fills_backbone_not_head(tmp_path):
  weights = pretrained.convert_state_dict(_fake_state_dict("resnet18", seed=3), "resnet18")
  path = str(tmp_path / "r18.npz")
  pretrained.save_weights(weights, path, arch="resnet18")
  model = pretrained.build_abstract("resnet18")
  model.head = type(model.head)(512, 8, rngs=nnx.Rngs(0))
  head_before = np.asarray(model.head.linear.kernel[...])
  pretrained.load_pretrained(model, path)
  np.testing.assert_array_equal(model.backbone.layer3[1].conv2.kernel[...],
                                weights["layer3/1/conv2/kernel"])
  np.testing.assert_array_equal(model.backbone.bn1.mean[...], weights["bn1/mean"])
  np.testing.assert_array_equal(model.head.linear.kernel[...], head_before)
  with pytest.raises(ValueError, match="holds resnet18 weights but the model is resnet34"):
    pretrained.load_pretrained(pretrained.build_abstract("resnet34"), path)
  bad = dict(weights)
  bad.pop("layer1/0/bn1/mean")
  bad["fc/kernel"] = np.zeros((512, 1000))
  pretrained.save_weights(bad, path, arch="resnet18")
  with pytest.raises(ValueError, match=r"1 missing: layer1/0/bn1/mean; 1 unexpected: fc/kernel"):
    pretrained.load_pretrained(model, path)
  np.save(str(tmp_path / "x.npy"), np.zeros(2))
  with open(tmp_path / "plain.npz", "wb") as f:
    np.savez(f, a=np.zeros(2))
  with pytest.raises(ValueError, match="not a dml_jax weight file"):
    pretrained.load_pretrained(model, str(tmp_path / "plain.npz"))


def test_files_that_are_not_weight_files_are_one_clear_error(tmp_path):
  """A ``.npy``, a pickled (legacy) PyTorch checkpoint or a text file given as the weights."""
  np.save(str(tmp_path / "a.npy"), np.zeros(2))
  with open(tmp_path / "legacy.pth", "wb") as f:
    pickle.dump({"conv1.weight": [0.0]}, f)
  (tmp_path / "notes.npz").write_text("hello")
  (tmp_path / "empty.npz").write_bytes(b"")
  (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not a whole zip")
  for name in ("a.npy", "legacy.pth", "notes.npz", "empty.npz", "broken.npz"):
    with pytest.raises(ValueError, match=rf"{name} is not a dml_jax weight file.*convert"):
      pretrained.read_weights(str(tmp_path / name))


def test_save_weights_creates_the_folder_of_the_documented_path(tmp_path):
  """docs/models.md converts to weights/resnet50.npz, a folder a fresh checkout lacks."""
  weights = pretrained.convert_state_dict(_fake_state_dict("resnet18"), "resnet18")
  path = str(tmp_path / "weights" / "resnet18.npz")
  pretrained.save_weights(weights, path, arch="resnet18")
  assert pretrained.read_weights(path)[0] == "resnet18"


def test_a_conversion_replaces_only_a_weight_file(tmp_path, capsys):
  weights = pretrained.convert_state_dict(_fake_state_dict("resnet18"), "resnet18")
  path = str(tmp_path / "w.npz")
  pretrained.save_weights(weights, path, arch="resnet18")
  pretrained.save_weights(weights, path, arch="resnet18")   # a weight file: replaced
  assert os.listdir(tmp_path) == ["w.npz"]   # no .partial left
  notes = tmp_path / "notes.txt"
  notes.write_text("mine")
  (tmp_path / "empty.npz").write_bytes(b"")
  for other in (notes, tmp_path / "empty.npz", tmp_path):
    with pytest.raises(ValueError, match=rf"^{other} exists and is not a dml_jax weight file; "
                       r"it is left as it is: write the weights to another path.$"):
      pretrained.save_weights(weights, str(other), arch="resnet18")
  assert notes.read_text() == "mine"
  # --output naming the checkpoint itself: refused before the checkpoint is read (no torch)
  ckpt = tmp_path / "r18.pth"
  ckpt.write_bytes(b"PK\x03\x04 a torch checkpoint")
  with pytest.raises(SystemExit) as exit_:
    pretrained.main(["convert", "--arch", "resnet18", "--torch_checkpoint", str(ckpt),
                     "--output", str(ckpt)])
  assert exit_.value.code == 1
  assert capsys.readouterr().err.startswith(f"python -m dml_jax.models.pretrained: {ckpt} "
                                            "exists and is not a dml_jax weight file")
  assert ckpt.read_bytes() == b"PK\x03\x04 a torch checkpoint"


def test_cli_table_and_convert(tmp_path, capsys):
  assert pretrained.main(["table", "--arch", "resnet18"]) == 0
  out = capsys.readouterr().out
  assert "layer4.1.bn2.running_var" in out and "fc.weight" in out
  missing = str(tmp_path / "missing.pth")
  with pytest.raises(SystemExit) as exit_:   # checked before torch is needed
    pretrained.main(["convert", "--arch", "resnet18", "--torch_checkpoint", missing,
                     "--output", str(tmp_path / "w.npz")])
  assert exit_.value.code == 1
  assert capsys.readouterr().err == (f"python -m dml_jax.models.pretrained: the PyTorch "
                                     f"checkpoint {missing!r} does not exist.\n")
  torch = pytest.importorskip("torch", reason="convert reads .pth files with torch.load")
  sd = {k: torch.from_numpy(v) for k, v in _fake_state_dict("resnet18").items()}
  ckpt, out_path = str(tmp_path / "r18.pth"), str(tmp_path / "r18.npz")
  torch.save({"state_dict": {"module." + k: v for k, v in sd.items()}}, ckpt)
  assert pretrained.main(["convert", "--arch", "resnet18", "--torch_checkpoint", ckpt,
                          "--output", out_path]) == 0
  arch, weights = pretrained.read_weights(out_path)
  assert arch == "resnet18" and os.path.getsize(out_path) > 4 * 11_000_000
  np.testing.assert_array_equal(weights["layer1/0/conv1/kernel"],
                                sd["layer1.0.conv1.weight"].numpy().transpose(2, 3, 1, 0))


# torchvision and the test venv's torch do not import together; run this file in a venv
# with torch + torchvision (docs/models.md recipe) to check the conversion numerically.
@pytest.mark.parametrize("arch", ["resnet18", pytest.param("resnet50", marks=pytest.mark.slow)])
def test_torchvision_random_model_same_pooled_features(arch):
  torchvision = pytest.importorskip(
      "torchvision", reason="torchvision not importable: the numerical torch-vs-flax check "
      "needs torch + torchvision (optional dependencies)")
  import torch
  model = getattr(torchvision.models, arch)(weights=None)
  assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == \
      pretrained.torch_key_table(arch)
  torch.manual_seed(0)
  tmodel = pretrained.torch_model(arch)
  pretrained.randomize_batch_norm_(tmodel, seed=0)
  diff, scale = pretrained.compare(arch, tmodel.state_dict(), image_size=64, batch_size=2)
  # float32 through 18 / 50 layers: relative to the largest feature (O(1) here).
  assert diff <= 1e-4 * max(1.0, scale), (diff, scale)


@pytest.mark.slow
def test_bn_inception_port_random_model_same_pooled_features():
  """Against the widely used PyTorch port (Cadene's ``pretrainedmodels``), when importable."""
  pytest.importorskip("pretrainedmodels", reason="pretrainedmodels not importable: the "
                      "numerical BN-Inception check needs torch + torchvision + pretrainedmodels "
                      "(optional dependencies)")
  import torch
  torch.manual_seed(0)
  tmodel = pretrained.torch_model("bn_inception")
  assert {k: tuple(v.shape) for k, v in tmodel.state_dict().items()} == \
      pretrained.torch_key_table("bn_inception")
  pretrained.randomize_batch_norm_(tmodel, seed=0, image_size=96)
  diff, scale = pretrained.compare("bn_inception", tmodel.state_dict(), image_size=96,
                                   batch_size=2, pooling="max")
  assert diff <= 1e-4 * max(1.0, scale), (diff, scale)
