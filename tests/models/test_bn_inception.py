"""Tests of the BN-Inception backbone (Cadene's pretrainedmodels port layout)."""

import chex
import ml_collections
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dml_jax import models
from dml_jax.models import bn_inception, heads, pretrained
from dml_jax.run import config as config_lib


def _torch_ceil_max_pool_oracle(x, window, stride):
  """Loop oracle of torch.nn.MaxPool2d(window, stride, ceil_mode=True), x [H, W]."""
  h, w = x.shape
  def out(n):
    o = -(-(n - window) // stride) + 1
    return o - 1 if (o - 1) * stride >= n else o
  return np.array([[x[i * stride:i * stride + window, j * stride:j * stride + window].max()
                    for j in range(out(w))] for i in range(out(h))])


@pytest.mark.parametrize("size", [7, 8, 15, 28, 112])
def test_max_pool_ceil_matches_torch_ceil_mode(size):
  x = np.random.default_rng(size).standard_normal((size, size + 1)).astype(np.float32)
  got = bn_inception.max_pool_ceil(jnp.asarray(x)[None, :, :, None], window=3, stride=2)
  np.testing.assert_array_equal(got[0, :, :, 0], _torch_ceil_max_pool_oracle(x, 3, 2))


def test_spec_channels_chain():
  # Each block's input width is the previous block's concatenated output width.
  width = 192
  for (tag, cin, c1, _, c3, _, cd, pool, proj, _) in bn_inception.INCEPTION_SPECS:
    assert cin == width, tag
    width = c1 + c3 + cd + (proj if proj else cin)
  assert width == 1024
  names = bn_inception.conv_names()
  assert len(names) == len(set(names)) == 3 + 8 * 7 + 2 * 5  # 3 stem + 66 in 10 blocks
  assert len(pretrained.torch_key_table("bn_inception")) == 69 * 7 + 2


_FILLED = {}


def _filled(**kwargs):
  key = tuple(sorted(kwargs.items()))
  if key not in _FILLED:
    rng = np.random.default_rng(0)
    sd = {}
    for k, shape in pretrained.torch_key_table("bn_inception").items():
      if len(shape) == 4:
        sd[k] = (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
      elif k.endswith(("running_var", "_bn.weight")):
        sd[k] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
      else:
        sd[k] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    model = pretrained.build_abstract("bn_inception", **kwargs)
    pretrained.assign_backbone(model, pretrained.convert_state_dict(sd, "bn_inception"))
    model.head = heads.EmbeddingHead(1024, 8, pooling=kwargs.get("pooling", "max"),
                                     rngs=nnx.Rngs(0))
    model.eval()
    _FILLED[key] = model
  return _FILLED[key]


@nnx.jit
def _fmap_and_embed(model, x):
  return model.feature_map(x), model(x)


@nnx.jit
def _fmap_and_backbone(model, x):
  """The feature map of ``x`` and the backbone's output for ``x`` and for ``x`` with its
  channels reversed, in one compiled program (the network run eagerly compiles op by op)."""
  return model.feature_map(x), model.backbone(x), model.backbone(x[..., ::-1])


def test_feature_map_embedding_shapes_and_default_max_pooling():
  model = _filled()
  assert model.head.pooling == "max" and model.arch == "bn_inception"
  fmap, e = _fmap_and_embed(model, jnp.ones((2, 64, 64, 3)))
  chex.assert_shape(fmap, (2, 2, 2, 1024))
  chex.assert_shape(e, (2, 8))
  chex.assert_type(e, jnp.float32)
  np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(model.head.pool(fmap), np.asarray(fmap).max((1, 2)), rtol=1e-6)
  assert np.all(np.asarray(fmap) >= 0)  # every concatenated branch is post-ReLU


def test_port_module_names_and_conv_biases():
  model = _filled()
  unit = model.backbone.inception_5b_pool_proj
  assert unit.conv.kernel[...].shape == (1, 1, 1024, 128) and unit.conv.bias is not None
  assert model.backbone.inception_3c_3x3.conv.strides == (2, 2)
  with pytest.raises(ValueError, match=r"\[B, H, W, 3\], got shape \(2, 8, 8\)"):
    model.feature_map(jnp.ones((2, 8, 8)))


def test_model_takes_rgb_and_feeds_the_port_backbone_bgr():
  """dml_jax's inputs are RGB; the port's weights read BGR: the model reverses the channels."""
  model = _filled()
  rgb = jnp.asarray(np.random.default_rng(0).standard_normal((1, 64, 64, 3)), jnp.float32)
  fmap, of_rgb, of_bgr = _fmap_and_backbone(model, rgb)
  np.testing.assert_allclose(fmap, of_bgr, rtol=1e-6, atol=1e-6)
  assert not np.allclose(fmap, of_rgb, atol=1e-3)
  np.testing.assert_array_equal(bn_inception.to_port_channels(jnp.arange(3.0)), [2.0, 1.0, 0.0])


def test_rgb_input_false_feeds_the_images_as_they_are():
  """``rgb_input=False`` (runs recorded before the option) gives the backbone its input
  unchanged; ``make_model`` passes the key to BN-Inception only."""
  model = _filled(rgb_input=False)  # built by models.make(..., rgb_input=False)
  assert model.rgb_input is False
  x = jnp.asarray(np.random.default_rng(1).standard_normal((1, 64, 64, 3)), jnp.float32)
  fmap, of_x, of_reversed = _fmap_and_backbone(model, x)
  np.testing.assert_allclose(fmap, of_x, rtol=1e-6, atol=1e-6)
  assert not np.allclose(fmap, of_reversed, atol=1e-3)
  with pytest.raises(ValueError, match="rgb_input='no' must be True or False"):
    models.make("bn_inception", embedding_dim=8, rgb_input="no", rngs=nnx.Rngs(params=0))
  old = ml_collections.ConfigDict({"name": "resnet18", "rgb_input": False})
  assert "rgb_input" not in config_lib.model_options(old)
  old.name = "bn_inception"
  assert config_lib.model_options(old) == {"rgb_input": False}


def _port_accepts(size):
  """Whether the port's layer arithmetic (torch: conv floor, ceil-mode pools) lets the
  stride-2 blocks 3c and 4e concatenate their branches for a side of ``size`` pixels."""
  conv = lambda s, k, st, p: (s + 2 * p - k) // st + 1
  def pool(s):
    o = -(-(s - 3) // 2) + 1
    return o - 1 if (o - 1) * 2 >= s else o
  s = pool(pool(conv(size, 7, 2, 3)))
  for _ in range(2):
    if s < 1 or conv(s, 3, 2, 1) != pool(s):
      return False
    s = conv(s, 3, 2, 1)
  return s >= 1


def test_image_sizes_the_port_cannot_take_are_one_clear_error():
  assert [s for s in range(1, 300) if bn_inception.valid_image_size(s)] == \
      [s for s in range(1, 300) if _port_accepts(s)]
  assert all(bn_inception.valid_image_size(s) for s in (224, 227, 256, 288))
  model = _filled()
  for shape in ((1, 200, 224, 3), (1, 224, 299, 3), (1, 16, 16, 3)):
    with pytest.raises(ValueError, match=r"bn_inception cannot take images of "
                       rf"{shape[1]} x {shape[2]} pixels.*mod 32"):
      model(jnp.ones(shape))
