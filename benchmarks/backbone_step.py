"""One forward + backward step of an embedding model on fixed random images: the case format
``arch:image_size:batch`` and the jitted step, shared by ``speed/backbones.py`` (which times it
beside PyTorch) and ``profiling/op_profile.py`` (which profiles its ops).

One step = the gradient of a simple embedding loss (``mean(E Eᵀ)``) w.r.t. all parameters,
BatchNorm in train mode (batch statistics, running averages updated), no optimizer.
"""

from __future__ import annotations

ARCHS = ("small_cnn", "resnet18", "resnet50")
EMBEDDING_DIM = 128


def parse_case(text: str) -> dict:
  """``'arch:image_size:batch'`` -> ``{'arch', 'image_size', 'batch_size'}``."""
  parts = text.split(":")
  if len(parts) != 3 or parts[0] not in ARCHS or not all(p.isdigit() for p in parts[1:]):
    raise ValueError(f"case {text!r} must be arch:image_size:batch with arch in "
                     f"{', '.join(ARCHS)}.")
  return {"arch": parts[0], "image_size": int(parts[1]), "batch_size": int(parts[2])}


def in_channels(case: dict) -> int:
  """Grey images up to 28 px (digits, MNIST, Omniglot), colour from 32 px on."""
  return 1 if case["arch"] == "small_cnn" and case["image_size"] <= 28 else 3


def case_name(case: dict) -> str:
  return f"{case['arch']}:{case['image_size']}:{case['batch_size']}"


class JaxModel:
  """The jitted forward + backward of ``models.make(arch)`` on fixed random images."""

  def __init__(self, case: dict, *, dtype: str, conv_impl: str):
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    from flax import nnx  # pylint: disable=import-outside-toplevel
    from dml_jax import models  # pylint: disable=import-outside-toplevel
    size, b, c = case["image_size"], case["batch_size"], in_channels(case)
    kwargs = {"conv_impl": conv_impl}
    if case["arch"] == "small_cnn":
      kwargs.update(image_size=size, in_channels=c)
    else:
      kwargs["dtype"] = dtype
    model = models.make(case["arch"], embedding_dim=EMBEDDING_DIM, rngs=nnx.Rngs(0), **kwargs)
    model.train()
    graphdef, self.params, self.stats = nnx.split(model, nnx.Param, nnx.BatchStat)
    self.images = jax.random.normal(jax.random.key(0), (b, size, size, c))

    @jax.jit
    def step(params, batch_stats, images):
      def loss_fn(p):
        m = nnx.merge(graphdef, p, batch_stats, copy=True)
        e = m(images).astype(jnp.float32)
        return jnp.mean(e @ e.T), nnx.state(m, nnx.BatchStat)
      (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      return loss, stats, grads

    self.step, self.jax = step, jax

  def run(self, steps: int) -> float:
    out = None
    for _ in range(steps):
      loss, self.stats, out = self.step(self.params, self.stats, self.images)
    self.jax.block_until_ready((loss, out))
    return float(loss)
