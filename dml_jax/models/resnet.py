"""ResNet-18 / -34 / -50 (Flax NNX) in the torchvision layout, with an embedding head.

``x [B, H, W, 3]`` -> conv 7x7/2 (pad 3) -> BN -> ReLU -> max-pool 3x3/2 (pad 1) -> ``layer1``
.. ``layer4`` (BasicBlock for 18/34, Bottleneck for 50, strides 1, 2, 2, 2) -> feature map
``[B, H/32, W/32, F]`` (F = 512 or 2048) -> ``heads.EmbeddingHead`` (global pool -> optional
hidden layers -> linear -> L2 normalisation) -> float32 ``[B, D]``.

The module tree mirrors torchvision's ``state_dict`` names (``backbone.conv1``,
``backbone.bn1``, ``backbone.layer1[0].conv1``, ``...downsample_conv`` /
``downsample_bn`` for ``downsample.0`` / ``downsample.1``), so ``pretrained.py`` maps ImageNet
weights one-to-one; the ImageNet classifier ``fc`` is not part of the model (the head replaces
it). Bottleneck puts the stride on the 3x3 convolution (torchvision "ResNet v1.5").

Inputs are expected normalised the torchvision way (RGB in [0, 1], minus the ImageNet mean
(0.485, 0.456, 0.406), divided by the std (0.229, 0.224, 0.225)); that is the data pipeline's
job, not the model's.

BatchNorm (``bn_mode``):
  * ``'train'`` (default): batch statistics and running-average updates in ``model.train()``,
    running averages in ``model.eval()`` (like torch).
  * ``'frozen'``: always the running averages (never updated), whatever ``train()`` /
    ``eval()`` say; scale and bias stay trainable ``nnx.Param``s. The common DML practice with
    ImageNet weights (Roth et al., MS, DRO). Splitting the model after ``model.eval()`` and
    training with that graphdef (the trainer's ``config.model.freeze_bn``) does the same for a
    ``'train'`` model.
  Batch statistics over one value per channel (batch 1 with a 1 x 1 feature map) raise
  ``ValueError`` (``norm.check_batch_statistics``), as torch does.
  Under ``jax.jit`` with the batch sharded over a ``('data',)`` mesh the batch statistics are
  already those of the global batch (XLA inserts the reductions): synchronised BatchNorm needs
  nothing more. ``bn_axis_name`` is only for ``shard_map`` / ``pmap`` code, where it names the
  mapped axis to average the statistics over.

Differences from torch: the running variance is updated with the biased batch variance (flax)
where torch uses the unbiased one (only the running averages in train mode differ, by a factor
``n / (n - 1)`` of the update); ``bn_momentum`` is flax's (``m <- momentum m + (1 - momentum)
batch``), 0.9 = torch's 0.1.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
from flax import nnx

from dml_jax.models import conv, heads, norm, pooling

# depth -> (block kind, blocks per stage), as torchvision's resnet18 / resnet34 / resnet50.
RESNET_SPECS: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
}
STAGE_WIDTHS = (64, 128, 256, 512)
BN_MODES = ("train", "frozen")
DTYPES = ("float32", "bfloat16")

# torchvision's conv init: kaiming_normal_(mode='fan_out', nonlinearity='relu').
_conv_init = nnx.initializers.variance_scaling(2.0, "fan_out", "normal")


class BatchNorm(nnx.BatchNorm):
  """``nnx.BatchNorm`` that can be frozen and can apply the ReLU that follows it.

  ``y = scale (x - mean) / sqrt(var + eps) + bias``; with ``frozen`` the ``mean`` / ``var`` are
  the stored running averages in train mode too (``model.train()`` cannot unfreeze it), and
  they are never updated. ``relu=True`` returns ``max(y, 0)``. Same state names as
  ``nnx.BatchNorm`` (scale, bias, mean, var). With the batch statistics, float32, the last axis
  as features and no ``axis_name`` / ``mask``, it runs :func:`norm.batch_norm` (the same
  values, a closed-form VJP); otherwise ``nnx.BatchNorm`` (then ``nnx.relu``).
  """

  def __init__(self, num_features: int, *, frozen: bool = False, **kwargs):
    super().__init__(num_features, **kwargs)
    self.frozen = frozen

  def __call__(self, x, use_running_average: bool | None = None, *, mask=None,
               relu: bool = False):
    if self.frozen:
      use_running_average = True
    if use_running_average is None:
      use_running_average = self.use_running_average
    if not use_running_average and mask is None:
      norm.check_batch_statistics(x, self.axis_name, self.axis_index_groups)
    if use_running_average is False and mask is None and self._fusable(x):
      y, mean, var = norm.batch_norm(x, self.scale[...], self.bias[...], self.epsilon, relu)
      m = self.momentum
      self.mean[...] = jax.lax.stop_gradient(m * self.mean[...] + (1 - m) * mean)
      self.var[...] = jax.lax.stop_gradient(m * self.var[...] + (1 - m) * var)
      return y
    y = super().__call__(x, use_running_average=use_running_average, mask=mask)
    return nnx.relu(y) if relu else y

  def _fusable(self, x) -> bool:
    """Whether :func:`norm.batch_norm` computes this call (see the class docstring)."""
    f32 = jnp.dtype(jnp.float32)
    return (x.dtype == f32 and self.dtype in (None, f32) and self.axis in (-1, x.ndim - 1)
            and self.axis_name is None and self.scale is not None and self.bias is not None
            and self.scale[...].dtype == f32 and self.bias[...].dtype == f32
            and self.use_fast_variance)


def check_options(*, pooling: str, bn_mode: str, dtype: str,
                  conv_impl: str = "auto") -> jnp.dtype:
  """Validates the options shared by the backbones; returns the compute dtype."""
  if pooling not in heads.POOLINGS:
    raise ValueError(f"pooling={pooling!r}; allowed: {', '.join(heads.POOLINGS)}.")
  conv.conv_function(conv_impl)  # ValueError listing conv.CONV_IMPLS
  if bn_mode not in BN_MODES:
    raise ValueError(f"bn_mode={bn_mode!r}; allowed: {', '.join(BN_MODES)}.")
  try:
    name = str(jnp.dtype(dtype))
  except TypeError:   # not a dtype at all ('bf16', 'half16', '')
    name = ""
  if name not in DTYPES:
    raise ValueError(f"dtype={dtype!r}; allowed: {', '.join(DTYPES)}.")
  return jnp.dtype(dtype)


class ConvBN(nnx.Module):
  """Convolution (torch-style explicit padding) followed by BatchNorm, ``[B,H,W,I] -> [B,H',W',O]``.

  ``H' = floor((H + 2 pad - k) / stride) + 1`` as ``torch.nn.Conv2d``. ``relu=True`` applies
  ReLU after the BatchNorm (in it: :class:`BatchNorm`), else no activation.
  ``impl``: ``conv.CONV_IMPLS`` (how the convolution is computed; same parameters).
  """

  def __init__(self, in_features: int, out_features: int, kernel: int, *, stride: int = 1,
               padding: int = 0, use_bias: bool = False, bn: dict, dtype, impl: str = "auto",
               rngs: nnx.Rngs):
    self.conv = _conv(in_features, out_features, kernel, stride=stride, padding=padding,
                      use_bias=use_bias, dtype=dtype, impl=impl, rngs=rngs)
    self.bn = BatchNorm(out_features, dtype=dtype, rngs=rngs, **bn)

  def __call__(self, x: jax.Array, *, relu: bool = False) -> jax.Array:
    return self.bn(self.conv(x), relu=relu)


def _conv(in_f, out_f, kernel, *, stride, padding, dtype, impl, rngs, use_bias=False):
  """``nnx.Conv`` (kernel ``[k, k, in_f, out_f]``) computed by ``conv.conv_function(impl)``."""
  return nnx.Conv(in_f, out_f, kernel_size=(kernel, kernel), strides=(stride, stride),
                  padding=((padding, padding),) * 2, use_bias=use_bias,
                  kernel_init=_conv_init, dtype=dtype,
                  conv_general_dilated=conv.conv_function(impl), rngs=rngs)


class BasicBlock(nnx.Module):
  """torchvision BasicBlock: ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``.

  conv1 3x3/stride, conv2 3x3/1; shortcut = ``downsample_bn(downsample_conv(x))`` (1x1/stride)
  when the shape changes, else ``x``. ``[B,H,W,I] -> [B,H/s,W/s,P]``.
  """
  expansion = 1

  def __init__(self, in_features: int, planes: int, *, stride: int, bn: dict, dtype,
               impl: str = "auto", rngs: nnx.Rngs):
    out = planes * self.expansion
    self.conv1 = _conv(in_features, planes, 3, stride=stride, padding=1, dtype=dtype,
                       impl=impl, rngs=rngs)
    self.bn1 = BatchNorm(planes, dtype=dtype, rngs=rngs, **bn)
    self.conv2 = _conv(planes, planes, 3, stride=1, padding=1, dtype=dtype, impl=impl,
                       rngs=rngs)
    self.bn2 = BatchNorm(planes, dtype=dtype, rngs=rngs, **bn)
    self.has_downsample = stride != 1 or in_features != out
    if self.has_downsample:
      self.downsample_conv = _conv(in_features, out, 1, stride=stride, padding=0, dtype=dtype,
                                   impl=impl, rngs=rngs)
      self.downsample_bn = BatchNorm(out, dtype=dtype, rngs=rngs, **bn)

  def shortcut(self, x):
    return self.downsample_bn(self.downsample_conv(x)) if self.has_downsample else x

  def __call__(self, x: jax.Array) -> jax.Array:
    y = self.bn1(self.conv1(x), relu=True)
    y = self.bn2(self.conv2(y))
    return nnx.relu(y + self.shortcut(x))


class Bottleneck(BasicBlock):
  """torchvision Bottleneck (v1.5): 1x1 -> 3x3/stride -> 1x1 (x4 channels), residual, ReLU.

  ``relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x))``,
  ``[B,H,W,I] -> [B,H/s,W/s,4P]``.
  """
  expansion = 4

  def __init__(self, in_features: int, planes: int, *, stride: int, bn: dict, dtype,
               impl: str = "auto", rngs: nnx.Rngs):
    out = planes * self.expansion
    self.conv1 = _conv(in_features, planes, 1, stride=1, padding=0, dtype=dtype, impl=impl,
                       rngs=rngs)
    self.bn1 = BatchNorm(planes, dtype=dtype, rngs=rngs, **bn)
    self.conv2 = _conv(planes, planes, 3, stride=stride, padding=1, dtype=dtype, impl=impl,
                       rngs=rngs)
    self.bn2 = BatchNorm(planes, dtype=dtype, rngs=rngs, **bn)
    self.conv3 = _conv(planes, out, 1, stride=1, padding=0, dtype=dtype, impl=impl, rngs=rngs)
    self.bn3 = BatchNorm(out, dtype=dtype, rngs=rngs, **bn)
    self.has_downsample = stride != 1 or in_features != out
    if self.has_downsample:
      self.downsample_conv = _conv(in_features, out, 1, stride=stride, padding=0, dtype=dtype,
                                   impl=impl, rngs=rngs)
      self.downsample_bn = BatchNorm(out, dtype=dtype, rngs=rngs, **bn)

  def __call__(self, x: jax.Array) -> jax.Array:
    y = self.bn1(self.conv1(x), relu=True)
    y = self.bn2(self.conv2(y), relu=True)
    y = self.bn3(self.conv3(y))
    return nnx.relu(y + self.shortcut(x))


class ResNetBackbone(nnx.Module):
  """The torchvision ResNet trunk without ``avgpool`` / ``fc``: ``[B,H,W,C] -> [B,H/32,W/32,F]``.

  Computes in ``dtype``; parameters are float32.
  """

  def __init__(self, depth: int, *, in_channels: int = 3, bn: dict, dtype, impl: str = "auto",
               rngs: nnx.Rngs):
    if depth not in RESNET_SPECS:
      raise ValueError(f"depth={depth}; allowed: {', '.join(map(str, RESNET_SPECS))}.")
    kind, stages = RESNET_SPECS[depth]
    block = BasicBlock if kind == "basic" else Bottleneck
    self.depth = depth
    self.in_channels = in_channels
    self.dtype = dtype
    self.impl = impl
    self.conv1 = _conv(in_channels, 64, 7, stride=2, padding=3, dtype=dtype, impl=impl, rngs=rngs)
    self.bn1 = BatchNorm(64, dtype=dtype, rngs=rngs, **bn)
    in_f = 64
    for i, (planes, n) in enumerate(zip(STAGE_WIDTHS, stages)):
      blocks = []
      for j in range(n):
        stride = 2 if (i > 0 and j == 0) else 1
        blocks.append(block(in_f, planes, stride=stride, bn=bn, dtype=dtype, impl=impl, rngs=rngs))
        in_f = planes * block.expansion
      setattr(self, f"layer{i + 1}", nnx.List(blocks))
    self.num_features = in_f

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(self.dtype)
    x = self.bn1(self.conv1(x), relu=True)
    x = pooling.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)), impl=self.impl)
    for name in ("layer1", "layer2", "layer3", "layer4"):
      for blk in getattr(self, name):
        x = blk(x)
    return x


class ResNet(nnx.Module):
  """ResNet backbone + embedding head: float images ``[B, H, W, C]`` -> float32 ``[B, D]``.

  ``e = head(pool(backbone(x)))``; see the module docstring for the layout and BN modes.

  Args:
    embedding_dim: ``D``.
    normalize: L2-normalise the embeddings (default True).
    depth: 18, 34 or 50 (default 50).
    pooling: ``'avg'`` (default, torchvision), ``'max'`` or ``'avg+max'`` (their sum).
    embedding_hidden: widths of optional hidden layers (Linear + ReLU) between the pooled
      features and the final linear layer; default ``()`` (none).
    bn_mode: ``'train'`` (default) or ``'frozen'`` (running statistics fixed, affine trainable).
    bn_momentum: flax momentum of the running averages (default 0.9 = torch's 0.1).
    bn_epsilon: BatchNorm epsilon (default 1e-5, torch's).
    bn_axis_name: mapped axis for the statistics under ``shard_map`` / ``pmap`` (default None;
      not needed under ``jax.jit`` with sharded inputs).
    dtype: compute dtype of the backbone, ``'float32'`` (default) or ``'bfloat16'``;
      parameters, BN statistics, pooling, head and output stay float32.
    in_channels: ``C`` (default 3).
    conv_impl: how convolutions and max-pooling are computed (same parameters, same
      results to float32 rounding): ``'auto'`` (default: im2col matmuls where lowered for the
      CPU, XLA's convolution elsewhere; max-pooling by shifted slices), ``'lax'`` (XLA's
      convolution and ``reduce_window``), ``'matmul'`` or ``'lax_aligned'`` (XLA's
      convolution, the stem's 3 input channels zero-padded to 8 for cuDNN's tensor cores);
      see ``conv`` and ``pooling``.
    rngs: ``nnx.Rngs`` for the initialisation.
  """

  def __init__(self, *, embedding_dim: int, normalize: bool = True, depth: int = 50,
               pooling: str = "avg", embedding_hidden: tuple[int, ...] = (),
               bn_mode: str = "train", bn_momentum: float = 0.9, bn_epsilon: float = 1e-5,
               bn_axis_name: str | None = None, dtype: str = "float32", in_channels: int = 3,
               conv_impl: str = "auto", rngs: nnx.Rngs):
    compute_dtype = check_options(pooling=pooling, bn_mode=bn_mode, dtype=dtype,
                                  conv_impl=conv_impl)
    if not 0.0 <= bn_momentum < 1.0:
      raise ValueError(f"bn_momentum={bn_momentum} must be in [0, 1).")
    if in_channels < 1:
      raise ValueError(f"in_channels={in_channels} must be >= 1.")
    bn = dict(frozen=bn_mode == "frozen", momentum=bn_momentum, epsilon=bn_epsilon,
              axis_name=bn_axis_name)
    self.arch = f"resnet{depth}"
    self.backbone = ResNetBackbone(depth, in_channels=in_channels, bn=bn, dtype=compute_dtype,
                                   impl=conv_impl, rngs=rngs)
    self.head = heads.EmbeddingHead(self.backbone.num_features, embedding_dim,
                                    pooling=pooling, hidden=tuple(embedding_hidden),
                                    normalize=normalize, rngs=rngs)

  def feature_map(self, x: jax.Array) -> jax.Array:
    """Backbone output ``[B, H/32, W/32, F]`` in the compute dtype."""
    c = self.backbone.in_channels
    if x.ndim != 4 or x.shape[-1] != c:
      raise ValueError(f"{self.arch} expects images [B, H, W, {c}] (channels last; "
                       f"in_channels={c}), got shape {x.shape}.")
    return self.backbone(x)

  def pooled_features(self, x: jax.Array) -> jax.Array:
    """Globally pooled backbone features, float32 ``[B, F]`` (torchvision: before ``fc``)."""
    return self.head.pool(self.feature_map(x))

  def __call__(self, x: jax.Array) -> jax.Array:
    """Embeds images: float ``[B, H, W, C]`` -> float32 ``[B, D]`` (unit rows if normalize)."""
    return self.head(self.feature_map(x))


def _fixed_depth(depth: int, name: str) -> type[ResNet]:
  """A ``ResNet`` subclass with ``depth`` fixed (its ``__init__`` signature lacks ``depth``, so
  ``models.make`` validates its keyword arguments)."""

  def __init__(self, **kwargs):
    if "depth" in kwargs:
      raise ValueError(f"{name} has depth={depth} fixed; got depth={kwargs['depth']}.")
    ResNet.__init__(self, depth=depth, **kwargs)

  sig = inspect.signature(ResNet.__init__)
  __init__.__signature__ = sig.replace(
      parameters=[p for n, p in sig.parameters.items() if n != "depth"])
  doc = f"ResNet-{depth} (torchvision layout) with an embedding head; arguments as ``ResNet``."
  return type(name, (ResNet,), {"__init__": __init__, "__doc__": doc,
                                "__module__": __name__})


ResNet18 = _fixed_depth(18, "ResNet18")
ResNet34 = _fixed_depth(34, "ResNet34")
ResNet50 = _fixed_depth(50, "ResNet50")
