"""Every matrix product of embeddings carries full float32 precision in the lowered program.

The CPU computes float32 products exactly whatever the precision flag says, so these tests read
the program (StableHLO of ``jit(...).lower``), not the numbers: on a GPU or TPU a product
without ``precision = HIGHEST`` would run in TF32 / bfloat16 passes. Each ``dot_general`` of
an objective's loss and gradient, of the evaluation's kNN tiles and of the train step's
similarity work must say ``HIGHEST`` on float32 operands; the backbone's products keep the
platform's default.

Each program is lowered for every platform in ``PLATFORMS`` (JAX lowers for a platform it
does not have; nothing is compiled): the program a GPU or TPU runs is not the CPU's where the
code chooses by platform (the backbone's convolutions stay convolutions there, ``conv_auto``)
or by process (the CPU kernels, off for the accelerators' programs as in a process whose
default backend is one, ``kernels.unavailable``).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dml_jax import kernels
from dml_jax import objectives
from dml_jax import similarity as sim
from dml_jax.run import training
from dml_jax.evaluation import knn
from dml_jax.evaluation import top_m
from dml_test_support import small_config

B, D, C = 12, 6, 3      # sizes that no backbone dimension shares in the train step's check
DOT = re.compile(r"stablehlo\.dot_general .*")
CONV = re.compile(r"stablehlo\.convolution.*")
TYPES = re.compile(r"tensor<([0-9x]*)x?(f32|bf16|f16|f64)>")
PLATFORMS = ("cpu", "cuda", "tpu")


@pytest.fixture(params=PLATFORMS)
def platform(request, monkeypatch) -> str:
  """The platform a test's programs are lowered for; the CPU kernels only for ``'cpu'``."""
  if request.param != "cpu":
    monkeypatch.setenv(kernels.SWITCH_ENV, "0")
  return request.param


def lowered(fn, *args, platform: str = "cpu") -> str:
  """The StableHLO text of ``jit(fn)`` at ``args``, lowered for ``platform``."""
  return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def dots(fn, *args, platform: str = "cpu") -> list[str]:
  """The ``dot_general`` lines of ``jit(fn)`` at ``args``, lowered for ``platform``."""
  return DOT.findall(lowered(fn, *args, platform=platform))


def full_precision(line: str) -> bool:
  """A product at full precision on float32 operands (and result)."""
  return ("HIGHEST, HIGHEST" in line
          and all(t == "f32" for _, t in TYPES.findall(line)))


def assert_all_full(lines: list[str], what: str) -> None:
  assert lines, f"{what}: no matrix product in the program"
  bad = [l for l in lines if not full_precision(l)]
  assert not bad, f"{what}: products below full float32 precision:\n" + "\n".join(bad)


def test_the_check_reads_the_precision():
  # The check itself: a plain product and a HIGHEST one of bfloat16 operands fail it,
  # inner_products passes it.
  x = jnp.ones((B, D))
  assert not any(map(full_precision, dots(lambda x: x @ x.T, x)))
  xb = x.astype(jnp.bfloat16)
  assert not any(map(full_precision, dots(
      lambda x: jnp.matmul(x, x.T, precision=sim.PRECISION), xb)))
  assert all(map(full_precision, dots(lambda x: sim.inner_products(x, x), x)))


@pytest.mark.parametrize("kind", sim.KINDS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_pairwise_similarity_and_gradient(kind, dtype, platform):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(B, D)), dtype)
  y = x[:5]
  f = lambda x, y: jnp.sum(jnp.sin(sim.pairwise_similarity(x, y, kind=kind)))
  lines = dots(jax.grad(f, argnums=(0, 1)), x, y, platform=platform)
  assert len(lines) >= 3   # the forward product and one per operand's gradient
  assert_all_full(lines, kind)


def _batch():
  rng = np.random.default_rng(1)
  labels = jnp.asarray(np.repeat(np.arange(C), B // C), jnp.int32)
  return jnp.asarray(rng.normal(size=(B, D)), jnp.float32), labels


@pytest.mark.parametrize("with_references", [False, True])
def test_every_objective_loss_and_gradient(with_references, platform):
  x, labels = _batch()
  references = objectives.References(x, labels, ~jnp.eye(B, dtype=bool))
  checked = []
  for name in objectives.names():
    if with_references and not objectives.support(name).references:
      continue   # proxy / classification objectives take no reference set
    obj = objectives.make(name)
    params = obj.init(jax.random.key(0), num_classes=C, dim=D)
    extra = {"references": references} if with_references else {}

    def loss(p, e, y, obj=obj, extra=extra):
      return obj.apply(p, e, y, rng=jax.random.key(1), **extra)[0]

    lines = dots(jax.grad(loss, argnums=(0, 1)), params, x, labels, platform=platform)
    assert_all_full(lines, name)
    checked.append(name)
  assert len(checked) >= (len(objectives.names()) if not with_references else 20)


def test_knn_tiles(platform):
  rng = np.random.default_rng(2)
  q = jnp.asarray(rng.normal(size=(8, D)), jnp.float32)
  g = jnp.asarray(rng.normal(size=(3, 8, D)), jnp.float32)
  idx = jnp.arange(8, dtype=jnp.int32)
  for kind in sim.KINDS:
    assert_all_full(dots(lambda q, g: knn._block_top_k(q, idx, g, jnp.int32(20), k=4,
                                                       kind=kind), q, g, platform=platform),
                    f"knn {kind}")
    assert_all_full(dots(lambda q, g: knn._block_first_rank(q, idx, idx, g[0], idx, k=4,
                                                            kind=kind), q, g, platform=platform),
                    f"rank {kind}")
    best = (jnp.full((8, 4), -jnp.inf), jnp.zeros((8, 4), jnp.int32))
    assert_all_full(dots(lambda a, b: top_m._tile_update(
        a, b, 0, 8, 16, best, m=4, chunk=8, kind=kind, exclude_self=True), q, g[0],
        platform=platform),
                    f"top_m {kind}")
    assert_all_full(dots(lambda a, b: top_m._tile_update_both(
        a, b, 0, 8, 16, best, best, m=4, chunk=8, kind=kind, mask_padding=True), q, g[0],
        platform=platform),
                    f"top_m both {kind}")


@pytest.mark.parametrize("arch,dtype", [("small_cnn", "float32"), ("resnet18", "bfloat16")])
def test_train_step_similarity_at_full_precision_backbone_at_default(arch, dtype, platform):
  # The digits config (a triplet objective) with cross-batch memory and the small CNN in
  # float32 or ResNet-18 in bfloat16:
  # every product with a [B, B] or [B, memory] operand or result (similarity, its gradient)
  # is at full precision on float32, while the backbone's products keep the default.
  config = small_config(2, batch_size=B, num_devices=1,
                        **{"data.group_size": B // 2, "model.name": arch, "memory.size": 2 * B,
                           **({"model.dtype": dtype} if arch != "small_cnn" else {})})
  setup = training.build(config)
  images = jnp.zeros((B, *setup.splits["train"].images.shape[1:]), jnp.float32)
  labels = jnp.asarray(np.repeat(np.arange(2), B // 2), jnp.int32)
  text = lowered(training._train_step_fn(setup), setup.init_state, images, labels,
                 jax.random.key(0), platform=platform)
  lines = DOT.findall(text)
  batch_pairs = [l for l in lines
                 if re.search(rf"tensor<({B}x{B}|{B}x{3 * B}|{3 * B}x{B})x", l)]
  assert len(batch_pairs) >= 3, lines
  assert_all_full(batch_pairs, "train step similarity")
  # the backbone: its products, and its convolutions where they stay convolutions (a GPU or a
  # TPU; the CPU's formulation makes them products and kernel calls)
  convolutions = CONV.findall(text)
  assert bool(convolutions) == (platform != "cpu"), (platform, len(convolutions))
  backbone = [l for l in lines if l not in batch_pairs] + convolutions
  assert backbone and not any("HIGHEST" in l for l in backbone), backbone
  if dtype == "bfloat16":
    assert any("bf16" in l for l in backbone)
