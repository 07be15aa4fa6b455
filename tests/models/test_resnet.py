"""Tests of the ResNet backbones, the embedding head, BatchNorm modes, bf16 and param_labels."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dml_jax import models
from dml_jax.models import heads, pretrained, resnet

X32 = jax.random.normal(jax.random.key(0), (4, 32, 32, 3))


@nnx.jit
def _embed(model, x):
  return model(x)


@nnx.jit
def _fmap(backbone, x):
  return backbone(x)


def _fmap_type(backbone, x):
  """Shape and dtype of ``backbone(x)``, traced, not compiled."""
  return nnx.eval_shape(lambda b, x: b(x), backbone, x)


def _filled(arch, *, dim=8, seed=0, **kwargs):
  """``arch`` built abstractly, backbone filled from a random torch-shaped state dict (fast:
  no per-shape random-init compilation), real head."""
  rng = np.random.default_rng(seed)
  sd = {}
  for key, shape in pretrained.torch_key_table(arch).items():
    if key.endswith(("running_var", "bn.weight")) or ".weight" in key and len(shape) == 1:
      sd[key] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    elif len(shape) == 4:
      fan_in = shape[1] * shape[2] * shape[3]
      sd[key] = (rng.standard_normal(shape) * np.sqrt(1.0 / fan_in)).astype(np.float32)
    else:
      sd[key] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
  model = pretrained.build_abstract(arch, **kwargs)
  pretrained.assign_backbone(model, pretrained.convert_state_dict(sd, arch))
  model.head = heads.EmbeddingHead(model.backbone.num_features, dim,
                                   pooling=kwargs.get("pooling", "avg"), rngs=nnx.Rngs(seed))
  return model


_MODELS = {}


def _resnet18(**kwargs):
  """Really initialised ResNet-18 (cached per options)."""
  key = tuple(sorted(kwargs.items()))
  if key not in _MODELS:
    _MODELS[key] = models.make("resnet18", embedding_dim=16, rngs=nnx.Rngs(0), **kwargs)
  return _MODELS[key]


def test_resnet18_real_init_shapes_and_unit_norm():
  model = _resnet18()
  assert isinstance(model, resnet.ResNet) and model.arch == "resnet18"
  e = _embed(model, X32)
  chex.assert_shape(e, (4, 16))
  chex.assert_type(e, jnp.float32)
  chex.assert_tree_all_finite(e)
  np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, rtol=1e-5)
  chex.assert_shape(_fmap_type(model.backbone, X32), (4, 1, 1, 512))
  n_params = sum(v.size for v in jax.tree.leaves(nnx.state(model.backbone, nnx.Param)))
  assert n_params == 11_176_512  # torchvision resnet18 without fc (11,689,512 - 513,000)


@pytest.mark.parametrize("arch,features", [
    ("resnet34", 512), pytest.param("resnet50", 2048, marks=pytest.mark.slow)])
def test_deeper_resnets_feature_shapes(arch, features):
  model = _filled(arch)
  model.eval()
  x = jnp.ones((2, 64, 64, 3))
  fmap = _fmap(model.backbone, x)
  chex.assert_shape(fmap, (2, 2, 2, features))
  e = model.head(fmap)
  chex.assert_shape(e, (2, 8))
  np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, rtol=1e-5)


def test_global_pool_and_head_options():
  fmap = jax.random.normal(jax.random.key(1), (2, 3, 4, 5))
  f = np.asarray(fmap)
  np.testing.assert_allclose(heads.global_pool(fmap), f.mean((1, 2)), rtol=1e-6)
  np.testing.assert_allclose(heads.global_pool(fmap, pooling="max"), f.max((1, 2)))
  np.testing.assert_allclose(heads.global_pool(fmap, pooling="avg+max"),
                             f.mean((1, 2)) + f.max((1, 2)), rtol=1e-6)
  with pytest.raises(ValueError, match="'sum'.*avg, max, avg\\+max"):
    heads.global_pool(fmap, pooling="sum")
  head = heads.EmbeddingHead(5, 3, hidden=(7,), normalize=False, rngs=nnx.Rngs(0))
  h = np.maximum(f.mean((1, 2)) @ np.asarray(head.hidden[0].kernel[...])
                 + np.asarray(head.hidden[0].bias[...]), 0)
  expected = h @ np.asarray(head.linear.kernel[...]) + np.asarray(head.linear.bias[...])
  np.testing.assert_allclose(head(fmap), expected, rtol=1e-5, atol=1e-6)


def test_registry_and_option_errors():
  for name in ("resnet18", "resnet34", "resnet50", "bn_inception"):
    assert name in models.names()
  with pytest.raises(ValueError, match=r"\['depth'\]"):
    models.make("resnet18", embedding_dim=4, rngs=nnx.Rngs(0), depth=50)
  for bad, match in ((dict(bn_mode="sync"), "bn_mode='sync'; allowed: train, frozen"),
                     (dict(pooling="sum"), "pooling='sum'"),
                     (dict(dtype="float16"), "dtype='float16'; allowed: float32, bfloat16"),
                     (dict(dtype="bf16"), "dtype='bf16'; allowed: float32, bfloat16")):
    with pytest.raises(ValueError, match=match):
      resnet.ResNet18(embedding_dim=4, rngs=nnx.Rngs(0), **bad)


def _grads_and_stats(graphdef, params, batch_stats, x):
  """Gradients of ``sum(e0 e1) - sum(e0 e2)`` w.r.t. ``params`` and the updated statistics."""
  def loss_fn(p):
    model = nnx.merge(graphdef, p, batch_stats, copy=True)
    e = model(x)
    return jnp.sum(e[0] * e[1]) - jnp.sum(e[0] * e[2]), nnx.state(model, nnx.BatchStat)
  return jax.grad(loss_fn, has_aux=True)(params)


def _train_step_fn():
  @jax.jit
  def step(graphdef, params, batch_stats, x):
    grads, new_stats = _grads_and_stats(graphdef, params, batch_stats, x)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), new_stats
  return step


_STEP = _train_step_fn()


def _run_steps(graphdef, params, stats, n=2):
  for i in range(n):
    params, stats = _STEP(graphdef, params, stats, X32 + i)
  return params, stats


def _bn_leaves(state):
  return [np.asarray(v) for v in jax.tree.leaves(state)]


def test_frozen_bn_keeps_running_stats_while_affine_params_train():
  model = _filled("resnet18", dim=16, bn_mode="frozen")
  model.train()  # cannot unfreeze
  graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)
  new_params, new_stats = _run_steps(graphdef, params, stats)
  for a, b in zip(_bn_leaves(stats), _bn_leaves(new_stats)):
    np.testing.assert_array_equal(a, b)
  bn_old, bn_new = params["backbone"]["bn1"], new_params["backbone"]["bn1"]
  assert not np.allclose(bn_old["scale"][...], bn_new["scale"][...])
  assert not np.allclose(bn_old["bias"][...], bn_new["bias"][...])
  # Frozen BN is per-example (running statistics), as in eval mode.
  e = _embed(model, X32)
  e0 = _embed(model, X32.at[1:].set(0.0))
  np.testing.assert_allclose(e[0], e0[0], rtol=1e-5, atol=1e-6)


def test_train_mode_updates_stats_and_trainer_freeze_bn_graphdef_freezes():
  model = _filled("resnet18", dim=16)
  model.train()
  graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)
  moved = nnx.merge(graphdef, params, stats, copy=True)
  _embed(moved, X32)  # a train-mode forward moves the stats
  assert not np.allclose(moved.backbone.bn1.mean[...], stats["backbone"]["bn1"]["mean"][...])
  # config.model.freeze_bn: the trainer trains with the eval-mode graphdef.
  model.eval()
  eval_graphdef, _, _ = nnx.split(model, nnx.Param, nnx.BatchStat)
  model.train()
  new_params, frozen_stats = _run_steps(eval_graphdef, params, stats)
  for a, b in zip(_bn_leaves(stats), _bn_leaves(frozen_stats)):
    np.testing.assert_array_equal(a, b)
  assert not np.allclose(params["backbone"]["bn1"]["scale"][...],
                         new_params["backbone"]["bn1"]["scale"][...])


def test_fused_batch_norm_trains_like_nnx_batch_norm(monkeypatch):
  # Train-mode BatchNorm (+ ReLU) by models.norm.batch_norm against nnx.BatchNorm + nnx.relu:
  # ResNet-18's gradients and updated running statistics at 64 px, batch 8 (32 values per
  # channel in the last stage; at 32 px and batch 4 there are 4, and rounding dominates).
  model = _filled("resnet18", dim=16)
  model.train()
  graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)
  x = jax.random.normal(jax.random.key(1), (8, 64, 64, 3))
  calls = []
  batch_norm = resnet.norm.batch_norm
  monkeypatch.setattr(resnet.norm, "batch_norm", lambda *a: calls.append(a[-1]) or batch_norm(*a))
  fused = jax.jit(lambda *a: _grads_and_stats(*a))(graphdef, params, stats, x)   # own cache
  assert calls.count(True) == 9 and calls.count(False) == 11   # traced once: 20 BN layers
  declined = []
  monkeypatch.setattr(resnet.BatchNorm, "_fusable", lambda self, x: declined.append(1) and False)
  plain = jax.jit(lambda *a: _grads_and_stats(*a))(graphdef, params, stats, x)
  assert len(calls) == 20 and len(declined) == 20   # retraced: every layer took nnx's path
  for a, b in zip(jax.tree.leaves(fused), jax.tree.leaves(plain)):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(1e-6, float(np.max(np.abs(b)))))


# bf16 vs float32, random weights, train-mode BN, 32 px: per coordinate of unit-norm 16-d
# embeddings (measured max 0.073) and per-example cosine.
BF16_ATOL, BF16_MIN_COSINE = 0.1, 0.98


def test_bf16_forward_matches_float32():
  f32 = _filled("resnet18", dim=16)
  f32.train()
  bf16 = _filled("resnet18", dim=16, dtype="bfloat16")  # same float32 parameters
  bf16.train()
  chex.assert_trees_all_equal(nnx.state(f32, nnx.Param), nnx.state(bf16, nnx.Param))
  assert bf16.backbone.conv1.kernel[...].dtype == jnp.float32
  assert _fmap_type(bf16.backbone, X32).dtype == jnp.bfloat16
  a, b = _embed(f32, X32), _embed(bf16, X32)
  chex.assert_type(b, jnp.float32)
  np.testing.assert_allclose(b, a, atol=BF16_ATOL)
  assert np.min(np.sum(np.asarray(a) * np.asarray(b), axis=1)) > BF16_MIN_COSINE


def test_param_labels_split_backbone_and_head_learning_rates():
  model = _filled("resnet18", dim=16)
  _, params, _ = nnx.split(model, nnx.Param, ...)
  labels = models.param_labels(params)
  flat = {"/".join(map(str, p)): v.get_value()
          for p, v in nnx.to_flat_state(labels)}
  assert {v for k, v in flat.items() if k.startswith("head/")} == {"head"}
  assert {v for k, v in flat.items() if not k.startswith("head/")} == {"backbone"}
  # As the trainer would use it, next to the objective's parameters.
  tx = optax.multi_transform({"backbone": optax.sgd(0.0), "head": optax.sgd(1.0),
                              "objective": optax.sgd(1.0)},
                             {"model": labels, "objective": "objective"})
  trainable = {"model": params, "objective": {"beta": jnp.ones(3)}}

  @jax.jit
  def update(trainable):
    grads = jax.tree.map(jnp.ones_like, trainable)
    updates, _ = tx.update(grads, tx.init(trainable), trainable)
    return optax.apply_updates(trainable, updates)

  new = update(trainable)
  np.testing.assert_array_equal(new["model"]["backbone"]["conv1"]["kernel"][...],
                                params["backbone"]["conv1"]["kernel"][...])
  np.testing.assert_allclose(new["model"]["head"]["linear"]["bias"][...],
                             params["head"]["linear"]["bias"][...] - 1.0)
  np.testing.assert_allclose(new["objective"]["beta"], 0.0)


@pytest.mark.parametrize("shape", [(2, 32, 32, 1), (2, 3, 32, 32)])
def test_images_with_the_wrong_channel_count_are_one_clear_error(shape):
  """Grey images, or NCHW ones, into a 3-channel ResNet name the shape and ``in_channels``."""
  with pytest.raises(ValueError, match=r"resnet18 expects images \[B, H, W, 3\].*in_channels"):
    _filled("resnet18")(jnp.ones(shape))


def test_non_positive_in_channels_and_head_widths_are_refused():
  for bad, match in ((dict(in_channels=0), "in_channels=0"),
                     (dict(embedding_hidden=(0,)), r"embedding_hidden=\(0,\)")):
    with pytest.raises(ValueError, match=match):
      resnet.ResNet18(embedding_dim=4, rngs=nnx.Rngs(0), **bad)


def test_train_mode_batch_norm_over_one_value_per_channel_is_refused():
  """Batch 1 at 32 px leaves ResNet-18's last stage 1 x 1: its batch statistics would be the
  value itself and the embedding the same for every image (torch raises too)."""
  model = _filled("resnet18", dim=16)
  model.train()
  one = jnp.ones((1, 32, 32, 3))
  match = r"one value per channel: input shape \(1, 1, 1, 512\) \(batch 1, feature map 1 x 1\)"
  with pytest.raises(ValueError, match=match):
    model(one)
  with pytest.raises(ValueError, match=match):
    _embed(model, one)
  assert _embed(model, jnp.ones((2, 32, 32, 3))).shape == (2, 16)
  assert _embed(model, jnp.ones((1, 64, 64, 3))).shape == (1, 16)   # 2 x 2 in the last stage
  model.eval()
  try:
    assert _embed(model, one).shape == (1, 16)   # running averages: per example
  finally:
    model.train()


def test_one_value_per_channel_counts_the_devices_the_statistics_span():
  """Under ``jit`` with a sharded batch BatchNorm sees the global batch; under ``shard_map``
  with ``axis_name`` the per-device values times the devices."""
  from jax.sharding import PartitionSpec as P   # pylint: disable=import-outside-toplevel
  check = lambda x: resnet.norm.check_batch_statistics(x, "d") or x
  eight = jax.make_mesh((8,), ("d",))
  x = jnp.ones((8, 1, 1, 4))
  jax.shard_map(check, mesh=eight, in_specs=P("d"), out_specs=P("d"))(
      jax.device_put(x, jax.NamedSharding(eight, P("d"))))
  one = jax.make_mesh((1,), ("d",), devices=jax.devices()[:1])
  with pytest.raises(ValueError, match="one value per channel"):
    jax.shard_map(check, mesh=one, in_specs=P("d"), out_specs=P("d"))(
        jax.device_put(x[:1], jax.NamedSharding(one, P("d"))))
  resnet.norm.check_batch_statistics(jnp.ones((8, 1, 1, 4)))
  with pytest.raises(ValueError, match=r"input shape \(1, 4\) \(batch 1\)"):
    resnet.norm.check_batch_statistics(jnp.ones((1, 4)))
