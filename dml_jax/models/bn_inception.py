"""BN-Inception (Flax NNX) as in the widely used PyTorch port (Cadene's ``pretrainedmodels``
``bninception``), with an embedding head; the backbone of the multi-similarity and DRO papers.

``x [B, H, W, 3]`` -> conv 7x7/2 -> max-pool 3x3/2 -> conv 1x1 -> conv 3x3 -> max-pool 3x3/2
-> inception 3a, 3b, 3c (stride 2) -> 4a .. 4e (4e stride 2) -> 5a, 5b -> ``[B, H/32, W/32,
1024]`` -> ``heads.EmbeddingHead`` (global **max** pool by default, as the MS / DRO code) ->
linear -> L2 normalisation -> float32 ``[B, D]``.

Every convolution has a bias and is followed by BatchNorm (eps 1e-5) and ReLU (the port's
in-place ReLUs make every concatenated branch output post-ReLU). Max-pools use torch's
``ceil_mode=True`` (the window may run past the bottom/right edge, padded with -inf); the
average pools of the pool branches are 3x3/1, pad 1, ``count_include_pad=True`` (always /9);
5b's pool branch is a 3x3/1 max-pool with pad 1.

Module names follow the port's ``state_dict``: ``backbone.<name>.conv`` <- ``<name>.weight`` /
``<name>.bias`` and ``backbone.<name>.bn`` <- ``<name>_bn.*`` for every ``<name>`` in
``conv_names()`` (e.g. ``inception_3a_double_3x3_1``); ``last_linear`` is not part of the model.

The port's ImageNet weights expect **BGR** in [0, 255] minus the mean (104, 117, 128), std 1.
``BNInception`` takes **RGB**, the channel order of every dml_jax input, and reverses the
channels before ``BNInceptionBackbone`` (the port's ``features``, BGR): the data pipeline
normalises with ``data.mean = (128, 117, 104) / 255`` (R, G, B) and ``data.std = 1 / 255``
(``PORT_MEAN`` / ``PORT_STD``; ``configs/recipes.py`` DRO). ``bn_momentum`` default 0.9
(flax; torch 0.1), the port's (pretrainedmodels 0.7.4, which the MS-loss code uses, keeps
torch's default; only an early version of the port declared torch momentum 0.9); it matters
only when training with batch statistics. BatchNorm modes, ``dtype`` and the other options are those of
``resnet.ResNet``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dml_jax.models import heads, pooling
from dml_jax.models.resnet import ConvBN, check_options

# name, in, 1x1, 3x3 reduce, 3x3, double-3x3 reduce, double-3x3, pool ('avg' | 'max' |
# 'max_s2'), pool projection (0 = none), stride of the 3x3 branches.
INCEPTION_SPECS = (
    ("3a", 192, 64, 64, 64, 64, 96, "avg", 32, 1),
    ("3b", 256, 64, 64, 96, 64, 96, "avg", 64, 1),
    ("3c", 320, 0, 128, 160, 64, 96, "max_s2", 0, 2),
    ("4a", 576, 224, 64, 96, 96, 128, "avg", 128, 1),
    ("4b", 576, 192, 96, 128, 96, 128, "avg", 128, 1),
    ("4c", 576, 160, 128, 160, 128, 160, "avg", 128, 1),
    ("4d", 608, 96, 128, 192, 160, 192, "avg", 128, 1),
    ("4e", 608, 0, 128, 192, 192, 256, "max_s2", 0, 2),
    ("5a", 1056, 352, 192, 320, 160, 224, "avg", 128, 1),
    ("5b", 1024, 352, 192, 320, 192, 224, "max", 128, 1),
)
# The data normalisation of the port's weights in dml_jax's RGB order, ``(x / 255 - mean) /
# std`` = ``x - (128, 117, 104)`` for pixels ``x`` in [0, 255]: after ``to_port_channels``
# the port's BGR minus (104, 117, 128).
PORT_MEAN = (128 / 255, 117 / 255, 104 / 255)
PORT_STD = (1 / 255, 1 / 255, 1 / 255)


def to_port_channels(x: jax.Array) -> jax.Array:
  """RGB ``[..., 3]`` -> the port's BGR order ``[..., 3]`` (channels reversed)."""
  return x[..., ::-1]


# stem: name, in, out, kernel, stride, padding.
STEM_SPECS = (
    ("conv1_7x7_s2", 3, 64, 7, 2, 3),
    ("conv2_3x3_reduce", 64, 64, 1, 1, 0),
    ("conv2_3x3", 64, 192, 3, 1, 1),
)


def conv_specs() -> list[tuple[str, int, int, int, int, int]]:
  """Every conv + BN unit of the port: ``(name, in, out, kernel, stride, padding)``, in order."""
  specs = list(STEM_SPECS)
  for (tag, cin, c1, c3r, c3, cdr, cd, pool, proj, stride) in INCEPTION_SPECS:
    p = f"inception_{tag}_"
    if c1:
      specs.append((p + "1x1", cin, c1, 1, 1, 0))
    specs += [(p + "3x3_reduce", cin, c3r, 1, 1, 0), (p + "3x3", c3r, c3, 3, stride, 1),
              (p + "double_3x3_reduce", cin, cdr, 1, 1, 0),
              (p + "double_3x3_1", cdr, cd, 3, 1, 1), (p + "double_3x3_2", cd, cd, 3, stride, 1)]
    if proj:
      specs.append((p + "pool_proj", cin, proj, 1, 1, 0))
  return specs


def conv_names() -> list[str]:
  """The port's conv names (each has ``<name>.weight/.bias`` and ``<name>_bn.*``)."""
  return [s[0] for s in conv_specs()]


def max_pool_ceil(x: jax.Array, *, window: int = 3, stride: int = 2,
                  impl: str = "auto") -> jax.Array:
  """``torch.nn.MaxPool2d(window, stride, ceil_mode=True)`` without padding, ``[B,H,W,C]``.

  Output ``ceil((H - window) / stride) + 1``; the last window is padded with -inf on the
  bottom / right. ``impl``: ``pooling.max_pool``'s.
  """
  pads = []
  for size in x.shape[1:3]:
    out = _ceil_pool_size(size, window, stride)
    pads.append((0, max((out - 1) * stride + window - size, 0)))
  return pooling.max_pool(x, (window, window), (stride, stride), tuple(pads), impl=impl)


def _ceil_pool_size(size: int, window: int = 3, stride: int = 2) -> int:
  """Output side of ``max_pool_ceil``: ``ceil((size - window) / stride) + 1``, less one when
  that last window would start past the input (torch drops it)."""
  out = -(-(size - window) // stride) + 1
  return out - 1 if (out - 1) * stride >= size else out


def valid_image_size(size: int) -> bool:
  """Whether the port's layers take an image side of ``size`` pixels.

  The stride-2 blocks 3c and 4e concatenate a 3x3 stride-2 convolution (pad 1) with a
  ceil-mode max-pool; the two agree only on an even side, so (as in the PyTorch port) the
  side must be ``s mod 32`` in 31, 0, 1, .., 6 and at least 31 (224, 227, 256, 288, ..).
  """
  s = _ceil_pool_size(_ceil_pool_size((size - 1) // 2 + 1))   # conv 7x7/2 pad 3, two pools
  for _ in range(2):   # 3c, 4e
    if s < 1 or (s - 1) // 2 + 1 != _ceil_pool_size(s):
      return False
    s = (s - 1) // 2 + 1
  return True


def check_image_size(height: int, width: int) -> None:
  """Raises ``ValueError`` naming the nearest sides the port takes (``valid_image_size``)."""
  bad = [s for s in (height, width) if not valid_image_size(s)]
  if not bad:
    return
  below = [t for t in range(31, bad[0]) if valid_image_size(t)][-1:]
  above = next(t for t in range(max(bad[0], 31), bad[0] + 40) if valid_image_size(t))
  raise ValueError(f"bn_inception cannot take images of {height} x {width} pixels: each side "
                   "s needs s mod 32 in 31, 0..6 and s >= 31 (e.g. 224, 227, 256), as in the "
                   f"PyTorch port; the sides it takes nearest to {bad[0]}: "
                   f"{', '.join(map(str, below + [above]))}.")


class BNInceptionBackbone(nnx.Module):
  """The port's ``features``: BGR ``[B, H, W, 3] -> [B, H/32, W/32, 1024]`` in ``dtype``."""

  num_features = 1024

  def __init__(self, *, bn: dict, dtype, impl: str = "auto", rngs: nnx.Rngs):
    self.dtype = dtype
    self.impl = impl
    for (name, cin, cout, k, s, p) in conv_specs():
      setattr(self, name, ConvBN(cin, cout, k, stride=s, padding=p, use_bias=True, bn=bn,
                                 dtype=dtype, impl=impl, rngs=rngs))

  def _unit(self, name: str, x: jax.Array) -> jax.Array:
    return getattr(self, name)(x, relu=True)

  def _inception(self, spec, x: jax.Array) -> jax.Array:
    tag, _, c1, _, _, _, _, pool, proj, _ = spec
    p = f"inception_{tag}_"
    outs = []
    if c1:
      outs.append(self._unit(p + "1x1", x))
    outs.append(self._unit(p + "3x3", self._unit(p + "3x3_reduce", x)))
    d = self._unit(p + "double_3x3_reduce", x)
    outs.append(self._unit(p + "double_3x3_2", self._unit(p + "double_3x3_1", d)))
    if pool == "avg":
      y = pooling.avg_pool(x, (3, 3), (1, 1), ((1, 1), (1, 1)), count_include_pad=True,
                           impl=self.impl)
    elif pool == "max":
      y = pooling.max_pool(x, (3, 3), (1, 1), ((1, 1), (1, 1)), impl=self.impl)
    else:
      y = max_pool_ceil(x, window=3, stride=2, impl=self.impl)
    outs.append(self._unit(p + "pool_proj", y) if proj else y)
    return jnp.concatenate(outs, axis=-1)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(self.dtype)
    x = max_pool_ceil(self._unit("conv1_7x7_s2", x), impl=self.impl)
    x = self._unit("conv2_3x3", self._unit("conv2_3x3_reduce", x))
    x = max_pool_ceil(x, impl=self.impl)
    for spec in INCEPTION_SPECS:
      x = self._inception(spec, x)
    return x


class BNInception(nnx.Module):
  """BN-Inception backbone + embedding head: float RGB ``[B, H, W, 3]`` -> float32 ``[B, D]``
  (the channels reversed to the port's BGR before the backbone; see the module docstring).

  Args:
    embedding_dim: ``D`` (512 in the MS / DRO papers).
    normalize: L2-normalise the embeddings (default True).
    pooling: ``'max'`` (default: global max-pool, as the MS / DRO code), ``'avg'`` (the port's
      ImageNet classifier) or ``'avg+max'``.
    embedding_hidden: widths of optional hidden layers of the head; default ``()``.
    bn_mode: ``'train'`` (default) or ``'frozen'``.
    bn_momentum: flax momentum (default 0.9; see the module docstring).
    bn_epsilon: default 1e-5.
    bn_axis_name: only for ``shard_map`` / ``pmap`` (default None).
    dtype: ``'float32'`` (default) or ``'bfloat16'`` compute; float32 params and output.
    conv_impl: ``'auto'`` (default), ``'lax'``, ``'matmul'`` or ``'lax_aligned'``: how
      convolutions and pooling are computed (as ``resnet.ResNet``'s).
    rgb_input: ``True`` (default): the images are RGB, reversed to the port's BGR before the
      backbone; ``False``: fed to the backbone as they are (runs trained before this option,
      ``config.model.rgb_input``).
    rngs: ``nnx.Rngs``.
  """

  def __init__(self, *, embedding_dim: int, normalize: bool = True, pooling: str = "max",
               embedding_hidden: tuple[int, ...] = (), bn_mode: str = "train",
               bn_momentum: float = 0.9, bn_epsilon: float = 1e-5,
               bn_axis_name: str | None = None, dtype: str = "float32",
               conv_impl: str = "auto", rgb_input: bool = True, rngs: nnx.Rngs):
    compute_dtype = check_options(pooling=pooling, bn_mode=bn_mode, dtype=dtype,
                                  conv_impl=conv_impl)
    if not 0.0 <= bn_momentum < 1.0:
      raise ValueError(f"bn_momentum={bn_momentum} must be in [0, 1).")
    bn = dict(frozen=bn_mode == "frozen", momentum=bn_momentum, epsilon=bn_epsilon,
              axis_name=bn_axis_name)
    if not isinstance(rgb_input, bool):
      raise ValueError(f"rgb_input={rgb_input!r} must be True or False.")
    self.arch = "bn_inception"
    self.rgb_input = rgb_input
    self.backbone = BNInceptionBackbone(bn=bn, dtype=compute_dtype, impl=conv_impl, rngs=rngs)
    self.head = heads.EmbeddingHead(self.backbone.num_features, embedding_dim,
                                    pooling=pooling, hidden=tuple(embedding_hidden),
                                    normalize=normalize, rngs=rngs)

  def feature_map(self, x: jax.Array) -> jax.Array:
    """Backbone output ``[B, H/32, W/32, 1024]`` in the compute dtype, of RGB images."""
    if x.ndim != 4 or x.shape[-1] != 3:
      raise ValueError(f"bn_inception expects images [B, H, W, 3], got shape {x.shape}.")
    check_image_size(x.shape[1], x.shape[2])
    return self.backbone(to_port_channels(x) if self.rgb_input else x)

  def pooled_features(self, x: jax.Array) -> jax.Array:
    """Globally pooled features, float32 ``[B, 1024]``."""
    return self.head.pool(self.feature_map(x))

  def __call__(self, x: jax.Array) -> jax.Array:
    """Embeds images: float ``[B, H, W, 3]`` -> float32 ``[B, D]``."""
    return self.head(self.feature_map(x))
