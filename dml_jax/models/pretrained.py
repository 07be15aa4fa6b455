"""ImageNet weights from PyTorch: torchvision ResNets / the BN-Inception port -> Flax backbones.

Command line (torch is needed only to read the ``.pth`` file; torchvision / pretrainedmodels
only for ``compare``)::

  python -m dml_jax.models.pretrained convert --arch resnet50 \\
      --torch_checkpoint resnet50-11ad3fa6.pth --output resnet50_imagenet.npz
  python -m dml_jax.models.pretrained compare --arch resnet50 --torch_checkpoint resnet50-11ad3fa6.pth
  python -m dml_jax.models.pretrained table --arch resnet50     # the expected torch keys / shapes

Weight file: an uncompressed NumPy ``.npz`` (no pickle) with one array per backbone variable,
named ``backbone/<flax path>`` (e.g. ``backbone/layer1/0/conv1/kernel``), plus ``__arch__``
(the architecture name) and ``__format__`` (``'dml_jax.pretrained.v1'``). Only the backbone is
stored; the embedding head is always freshly initialised.

Mapping (``conversion_plan``): conv ``weight [O, I, kh, kw]`` -> ``kernel [kh, kw, I, O]``;
conv ``bias`` -> ``bias``; BatchNorm ``weight`` / ``bias`` / ``running_mean`` /
``running_var`` -> ``scale`` / ``bias`` / ``mean`` / ``var``; ``num_batches_tracked`` and the
ImageNet classifier (torchvision ``fc.*``, the port's ``last_linear.*``) are consumed and
dropped. ``torch_key_table(arch)`` lists every key and shape of the PyTorch state dict,
generated from the architecture definition (no download), so the key coverage is testable
without torch. The port's published BN-Inception file predates ``num_batches_tracked``; those
keys are optional for every architecture.
"""

from __future__ import annotations

import argparse
import os
import sys
import zipfile
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dml_jax.models import bn_inception as bn_inception_lib
from dml_jax.models import heads
from dml_jax.models import resnet as resnet_lib

ARCHS = ("resnet18", "resnet34", "resnet50", "bn_inception")
FORMAT = "dml_jax.pretrained.v1"
OPTIONAL_SUFFIX = "num_batches_tracked"
_BN_MAP = (("weight", "scale"), ("bias", "bias"), ("running_mean", "mean"),
           ("running_var", "var"))


def _check_arch(arch: str) -> None:
  if arch not in ARCHS:
    raise ValueError(f"arch={arch!r}; allowed: {', '.join(ARCHS)}.")


def _conv_entries(torch_name, flax_path, cin, cout, k, *, bias):
  rows = [(f"{torch_name}.weight", (cout, cin, k, k), f"{flax_path}/kernel", "conv")]
  if bias:
    rows.append((f"{torch_name}.bias", (cout,), f"{flax_path}/bias", "copy"))
  return rows


def _bn_entries(torch_name, flax_path, c):
  rows = [(f"{torch_name}.{t}", (c,), f"{flax_path}/{f}", "copy") for t, f in _BN_MAP]
  rows.append((f"{torch_name}.{OPTIONAL_SUFFIX}", (), None, "skip"))
  return rows


def conversion_plan(arch: str) -> list[tuple[str, tuple[int, ...], str | None, str]]:
  """Every PyTorch state-dict entry of ``arch``: ``(torch key, shape, flax path, kind)``.

  ``kind`` is ``'conv'`` (transpose ``[O,I,kh,kw] -> [kh,kw,I,O]``), ``'copy'`` or ``'skip'``
  (``flax path`` None: ``num_batches_tracked`` and the ImageNet classifier). Flax paths are
  relative to ``model.backbone``, joined with ``/``.
  """
  _check_arch(arch)
  rows = []
  if arch == "bn_inception":
    for (name, cin, cout, k, _, _) in bn_inception_lib.conv_specs():
      rows += _conv_entries(name, f"{name}/conv", cin, cout, k, bias=True)
      rows += _bn_entries(f"{name}_bn", f"{name}/bn", cout)
    rows += [("last_linear.weight", (1000, 1024), None, "skip"),
             ("last_linear.bias", (1000,), None, "skip")]
    return rows
  depth = int(arch[len("resnet"):])
  kind, stages = resnet_lib.RESNET_SPECS[depth]
  expansion = 1 if kind == "basic" else 4
  rows += _conv_entries("conv1", "conv1", 3, 64, 7, bias=False)
  rows += _bn_entries("bn1", "bn1", 64)
  in_f = 64
  for i, (planes, n) in enumerate(zip(resnet_lib.STAGE_WIDTHS, stages)):
    for j in range(n):
      t, f = f"layer{i + 1}.{j}", f"layer{i + 1}/{j}"
      stride = 2 if (i > 0 and j == 0) else 1
      out = planes * expansion
      if kind == "basic":
        convs = [(1, in_f, planes, 3), (2, planes, planes, 3)]
      else:
        convs = [(1, in_f, planes, 1), (2, planes, planes, 3), (3, planes, out, 1)]
      for c, cin, cout, k in convs:
        rows += _conv_entries(f"{t}.conv{c}", f"{f}/conv{c}", cin, cout, k, bias=False)
        rows += _bn_entries(f"{t}.bn{c}", f"{f}/bn{c}", cout)
      if stride != 1 or in_f != out:
        rows += _conv_entries(f"{t}.downsample.0", f"{f}/downsample_conv", in_f, out, 1,
                              bias=False)
        rows += _bn_entries(f"{t}.downsample.1", f"{f}/downsample_bn", out)
      in_f = out
  rows += [("fc.weight", (1000, in_f), None, "skip"), ("fc.bias", (1000,), None, "skip")]
  return rows


def torch_key_table(arch: str) -> dict[str, tuple[int, ...]]:
  """``{torch key: shape}`` of the PyTorch state dict of ``arch`` (torchvision's
  ``resnetNN().state_dict()`` / the port's ``BNInception().state_dict()``), in order."""
  return {key: shape for key, shape, _, _ in conversion_plan(arch)}


def convert_state_dict(state_dict: Mapping[str, Any], arch: str) -> dict[str, np.ndarray]:
  """PyTorch state dict -> ``{flax path under backbone: float32 array}``.

  Every key must be consumed exactly once with the table's shape (``num_batches_tracked``
  optional; a vector stored as ``[1, C]``, as the BatchNorm tensors of the BN-Inception
  port's first weight file, is read as ``[C]``); otherwise a ``ValueError`` lists the missing
  keys, the unexpected keys and the shape mismatches. ``state_dict`` values: torch tensors or
  arrays.
  """
  plan = conversion_plan(arch)
  given = {k: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)
           for k, v in state_dict.items()}
  missing, mismatched, out = [], [], {}
  for key, shape, path, kind in plan:
    if key not in given:
      if not key.endswith(OPTIONAL_SUFFIX):
        missing.append(key)
      continue
    value = given[key]
    if len(shape) == 1 and tuple(value.shape) == (1, shape[0]):
      value = value[0]
    if tuple(value.shape) != shape:
      mismatched.append(f"{key}: checkpoint {tuple(value.shape)} vs expected {shape}")
      continue
    if kind == "conv":
      out[path] = np.transpose(value, (2, 3, 1, 0)).astype(np.float32)
    elif kind == "copy":
      out[path] = value.astype(np.float32)
  unexpected = sorted(set(given) - {row[0] for row in plan})
  _raise_if_any(f"state dict for {arch}", missing, unexpected, mismatched)
  return out


def _raise_if_any(what, missing, unexpected, mismatched):
  if missing or unexpected or mismatched:
    parts = []
    for title, items in (("missing", missing), ("unexpected", unexpected),
                         ("shape mismatches", mismatched)):
      if items:
        parts.append(f"{len(items)} {title}: " + ", ".join(items))
    raise ValueError(f"{what} does not match: " + "; ".join(parts) + ".")


def check_output(path: str) -> None:
  """``path`` may receive a weight file: it does not exist, or it is a dml_jax weight file
  (which a new conversion replaces). Anything else there (the PyTorch checkpoint itself, a
  folder, another file) is left alone with a ``ValueError``."""
  if not os.path.lexists(path):
    return
  try:
    read_weights(path)
  except (ValueError, OSError):   # not ours: a checkpoint, another file, a folder
    raise ValueError(f"{path} exists and is not a dml_jax weight file; it is left as it is: "
                     "write the weights to another path.") from None


def save_weights(weights: Mapping[str, np.ndarray], path: str, *, arch: str) -> None:
  """Writes ``{flax path: array}`` (backbone-relative) as the ``.npz`` weight file, creating
  its folder (``weights/`` of a fresh checkout); through ``path + '.partial'``, renamed when
  complete, so an interrupted write leaves no truncated weight file.

  Raises:
    ValueError: ``path`` holds something other than a weight file (:func:`check_output`).
  """
  _check_arch(arch)
  check_output(path)
  arrays = {f"backbone/{k}": np.asarray(v) for k, v in weights.items()}
  arrays["__arch__"] = np.array(arch)
  arrays["__format__"] = np.array(FORMAT)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  partial = path + ".partial"
  with open(partial, "wb") as f:
    np.savez(f, **arrays)
  os.replace(partial, path)


def read_weights(path: str) -> tuple[str, dict[str, np.ndarray]]:
  """Reads a weight file: ``(arch, {flax path under backbone: array})``."""
  not_weights = (f"{path} is not a dml_jax weight file (format {FORMAT}); convert a "
                 "PyTorch checkpoint with `python -m dml_jax.models.pretrained convert`.")
  try:
    data = np.load(path, allow_pickle=False)
  except (ValueError, EOFError, zipfile.BadZipFile):   # pickled data (a legacy PyTorch
    raise ValueError(not_weights) from None           # checkpoint), an empty or broken file
  if not isinstance(data, np.lib.npyio.NpzFile):   # a .npy array
    raise ValueError(not_weights)
  with data:
    if "__format__" not in data or str(data["__format__"]) != FORMAT:
      raise ValueError(not_weights)
    arch = str(data["__arch__"])
    weights = {k[len("backbone/"):]: data[k] for k in data.files if k.startswith("backbone/")}
  return arch, weights


def _flat_backbone(model) -> list[tuple[str, Any]]:
  state = nnx.state(model.backbone)
  return [("/".join(str(p) for p in path), var) for path, var in nnx.to_flat_state(state)]


def assign_backbone(model: nnx.Module, weights: Mapping[str, np.ndarray]) -> nnx.Module:
  """Fills ``model.backbone`` (parameters and BN statistics) from ``{flax path: array}``.

  Every backbone variable must be given exactly, with its shape; else a ``ValueError`` lists
  the missing / unexpected paths and shape mismatches. The head is untouched. Values are cast
  to each variable's dtype (float32). Returns ``model`` (updated in place).
  """
  flat = _flat_backbone(model)
  names = {k for k, _ in flat}
  missing = sorted(names - set(weights))
  unexpected = sorted(set(weights) - names)
  mismatched = [f"{k}: file {tuple(np.shape(weights[k]))} vs model {tuple(v.shape)}"
                for k, v in flat if k in weights and tuple(np.shape(weights[k])) != tuple(v.shape)]
  _raise_if_any(f"weights for {getattr(model, 'arch', type(model).__name__)}", missing,
                unexpected, mismatched)
  state = nnx.state(model.backbone)
  for (k, _), (_, var) in zip(flat, nnx.to_flat_state(state)):
    var.set_value(jnp.asarray(weights[k], dtype=var.dtype))
  nnx.update(model.backbone, state)
  return model


def load_pretrained(model: nnx.Module, path: str) -> nnx.Module:
  """Loads a weight file written by ``convert`` into ``model.backbone`` (not the head).

  Raises ``ValueError`` when the file's architecture is not ``model.arch`` or when keys /
  shapes do not match (listing them). Returns ``model`` (updated in place).
  """
  if not hasattr(model, "backbone") or not hasattr(model, "arch"):
    raise ValueError(f"{type(model).__name__} has no pretrained backbone; pretrained weights "
                     f"exist for: {', '.join(ARCHS)}.")
  arch, weights = read_weights(path)
  if arch != model.arch:
    raise ValueError(f"{path} holds {arch} weights but the model is {model.arch}.")
  return assign_backbone(model, weights)


def param_labels(params) -> Any:
  """``'head'`` for every leaf under the top-level key ``head``, ``'backbone'`` otherwise.

  ``params``: the model's parameter pytree (``nnx.State`` from ``nnx.split(model, nnx.Param,
  ...)`` or a nested dict). The result has the same structure, for
  ``optax.multi_transform({'backbone': tx_b, 'head': tx_h}, param_labels(params))``.
  Models without a ``head`` (``small_cnn``) are all ``'backbone'``.
  """
  def label(path, _):
    first = path[0]
    name = getattr(first, "key", getattr(first, "name", first))
    return "head" if name == "head" else "backbone"
  return jax.tree_util.tree_map_with_path(label, params)


# ------------------------------------------------------------------- torch side (optional)


def load_torch_state_dict(path: str) -> dict[str, Any]:
  """``torch.load(path, map_location='cpu', weights_only=True)``; unwraps ``{'state_dict':
  ...}`` / ``{'model': ...}`` and a ``module.`` prefix (DataParallel). Needs torch."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"the PyTorch checkpoint {path!r} does not exist.")
  try:
    import torch
  except ImportError as e:
    raise ImportError("reading a .pth checkpoint needs torch (pip install torch; CPU build "
                      "is enough)") from e
  sd = torch.load(path, map_location="cpu", weights_only=True)
  for key in ("state_dict", "model"):
    if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
      sd = sd[key]
  return {k[len("module."):] if k.startswith("module.") else k: v for k, v in sd.items()}


def build_abstract(arch: str, **kwargs) -> nnx.Module:
  """``arch`` with embedding_dim 8 built under ``nnx.eval_shape`` (no initialisation cost):
  the backbone is meant to be filled by ``assign_backbone``; the head stays abstract."""
  from dml_jax import models
  return nnx.eval_shape(lambda: models.make(arch, embedding_dim=8, rngs=nnx.Rngs(0), **kwargs))


def torch_model(arch: str, state_dict: Mapping[str, Any] | None = None):
  """The PyTorch reference: torchvision ``resnetNN`` or the port's ``BNInception`` (needs
  ``pretrainedmodels``), in eval mode, with ``state_dict`` loaded if given."""
  _check_arch(arch)
  if arch == "bn_inception":
    from pretrainedmodels.models.bninception import BNInception
    model = BNInception(num_classes=1000)
  else:
    import torchvision
    model = getattr(torchvision.models, arch)(weights=None)
  if state_dict is not None:
    model.load_state_dict(state_dict)
  return model.eval()


def randomize_batch_norm_(model, *, seed: int = 0, image_size: int = 64) -> None:
  """Random BN affine parameters, then running statistics measured on 8 random images (one
  train-mode pass, cumulative average), in a torch model, in place. A comparison then also
  checks the mapping of all four BN tensors (a fresh torch BN is the identity) while the
  features stay O(1), so an absolute tolerance is meaningful."""
  import torch
  g = torch.Generator().manual_seed(seed)
  bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
  with torch.no_grad():
    for m in bns:
      m.weight.copy_(0.5 + torch.rand(m.num_features, generator=g))
      m.bias.copy_(0.2 * torch.randn(m.num_features, generator=g))
      m.reset_running_stats()
      m.momentum = None
    model.train()
    forward = getattr(model, "features", model)   # BN-Inception: skip its fixed 7x7 avg-pool head
    forward(torch.randn(8, 3, image_size, image_size, generator=g))
    model.eval()


def torch_pooled_features(model, images_nchw, *, arch: str, pooling: str):
  """Globally pooled last feature map of the torch model, numpy ``[N, F]``."""
  import torch
  with torch.no_grad():
    x = torch.from_numpy(images_nchw)
    if arch == "bn_inception":
      fmap = model.features(x)
    else:
      m = model
      x = m.maxpool(m.relu(m.bn1(m.conv1(x))))
      fmap = m.layer4(m.layer3(m.layer2(m.layer1(x))))
    avg, mx = fmap.mean(dim=(2, 3)), fmap.amax(dim=(2, 3))
    out = {"avg": avg, "max": mx, "avg+max": avg + mx}[pooling]
  return out.numpy()


def compare(arch: str, state_dict: Mapping[str, Any], *, image_size: int = 224,
            batch_size: int = 4, seed: int = 0, pooling: str = "avg") -> tuple[float, float]:
  """``(largest |f_torch - f_flax|, largest |f_torch|)`` of the pooled features on the same
  random images (the second gives the first its scale).

  Both models in eval mode (running statistics), float32; images ``N(0, 1)``
  ``[batch_size, 3, image_size, image_size]`` (NHWC for Flax).
  """
  tmodel = torch_model(arch, state_dict)
  images = np.random.default_rng(seed).standard_normal(
      (batch_size, 3, image_size, image_size)).astype(np.float32)
  expected = torch_pooled_features(tmodel, images, arch=arch, pooling=pooling)
  sd = {k: v for k, v in tmodel.state_dict().items()}
  model = build_abstract(arch, pooling=pooling)
  assign_backbone(model, convert_state_dict(sd, arch))
  model.eval()
  pooled = nnx.jit(lambda backbone, x: heads.global_pool(backbone(x), pooling=pooling))
  got = pooled(model.backbone, jnp.asarray(images.transpose(0, 2, 3, 1)))
  return (float(np.max(np.abs(np.asarray(got) - expected))),
          float(np.max(np.abs(expected))))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dml_jax.models.pretrained",
                                   description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  conv = sub.add_parser("convert", help="PyTorch .pth -> dml_jax .npz weight file")
  conv.add_argument("--arch", required=True, choices=ARCHS)
  conv.add_argument("--torch_checkpoint", required=True)
  conv.add_argument("--output", required=True)
  cmp_ = sub.add_parser("compare", help="max |pooled features torch - flax| on random images")
  cmp_.add_argument("--arch", required=True, choices=ARCHS)
  cmp_.add_argument("--torch_checkpoint", default=None,
                    help="omit to compare a randomly initialised model (random BN statistics)")
  cmp_.add_argument("--image_size", type=int, default=224)
  cmp_.add_argument("--batch_size", type=int, default=4)
  cmp_.add_argument("--pooling", default="avg", choices=("avg", "max", "avg+max"))
  cmp_.add_argument("--seed", type=int, default=0)
  tab = sub.add_parser("table", help="print the expected PyTorch keys and shapes")
  tab.add_argument("--arch", required=True, choices=ARCHS)
  args = parser.parse_args(argv)
  try:
    return _run(args)
  except ImportError as e:   # torch / torchvision / pretrainedmodels: the PyTorch side
    need = f" ({args.command} needs it: pip install {e.name})" if e.name else ""
    parser.exit(1, f"{parser.prog}: {e}{need}\n")
  except (FileNotFoundError, ValueError) as e:   # one line, no traceback
    parser.exit(1, f"{parser.prog}: {e}\n")


def _run(args) -> int:
  """The subcommand ``args.command`` of :func:`main`."""
  if args.command == "table":
    for key, shape, path, kind in conversion_plan(args.arch):
      print(f"{key:50s} {str(shape):22s} {kind:5s} {path or '-'}")
    return 0
  if args.command == "convert":
    check_output(args.output)   # before the checkpoint is read (torch, seconds)
    weights = convert_state_dict(load_torch_state_dict(args.torch_checkpoint), args.arch)
    save_weights(weights, args.output, arch=args.arch)
    n = sum(int(np.prod(v.shape)) for v in weights.values())
    print(f"wrote {args.output}: {args.arch}, {len(weights)} arrays, {n:,} values")
    return 0
  if args.torch_checkpoint:
    sd = load_torch_state_dict(args.torch_checkpoint)
  else:
    import torch
    torch.manual_seed(args.seed)
    tm = torch_model(args.arch)
    randomize_batch_norm_(tm, seed=args.seed)
    sd = tm.state_dict()
  diff, scale = compare(args.arch, sd, image_size=args.image_size, batch_size=args.batch_size,
                        seed=args.seed, pooling=args.pooling)
  print(f"{args.arch}: max |pooled features torch - flax| = {diff:.3g}, largest feature "
        f"{scale:.3g} ({args.batch_size} random images {args.image_size}px, pooling "
        f"{args.pooling})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
