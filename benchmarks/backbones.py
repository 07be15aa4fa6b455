"""Forward + backward speed of the ResNet backbones (images / s), float32 and bfloat16.

  python benchmarks/backbones.py                 # ResNet-18 / -50, 224 px, batch 8, 5 steps
  python benchmarks/backbones.py --smoke         # ResNet-18, 64 px, batch 2, 2 steps
  python benchmarks/backbones.py --archs=resnet50 --batch_size=64 --out=runs/backbones.json

One step = value_and_grad of a simple embedding loss w.r.t. all parameters, BatchNorm in train
mode (batch statistics, running averages updated), jitted; the first (compiling) call is timed
separately. Runs unchanged on whatever device JAX finds (CPU, GPU). Prints a markdown table
and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

from dml_jax import models


def make_step():
  @jax.jit
  def step(graphdef, params, batch_stats, images):
    def loss_fn(p):
      model = nnx.merge(graphdef, p, batch_stats, copy=True)
      e = model(images)
      return jnp.mean(e @ e.T), nnx.state(model, nnx.BatchStat)
    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return loss, stats, grads
  return step


def bench(arch: str, *, dtype: str, image_size: int, batch_size: int, steps: int) -> dict:
  model = models.make(arch, embedding_dim=128, dtype=dtype, rngs=nnx.Rngs(0))
  model.train()
  graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)
  images = jax.random.normal(jax.random.key(0), (batch_size, image_size, image_size, 3))
  step = make_step()
  t0 = time.perf_counter()
  jax.block_until_ready(step(graphdef, params, stats, images))
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(steps):
    out = step(graphdef, params, stats, images)
  jax.block_until_ready(out)
  per_step = (time.perf_counter() - t0) / steps
  return {"arch": arch, "dtype": dtype, "image_size": image_size, "batch_size": batch_size,
          "steps": steps, "first_call_s": compile_s, "step_s": per_step,
          "images_per_s": batch_size / per_step, "device": str(jax.devices()[0].device_kind)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--archs", default="resnet18,resnet50")
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--smoke", action="store_true", help="resnet18, 64 px, batch 2, 2 steps")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  if args.smoke:
    args.archs, args.image_size, args.batch_size, args.steps = "resnet18", 64, 2, 2
  rows = []
  print(f"devices: {jax.devices()}")
  print("| arch | dtype | px | batch | first call (s) | step (s) | images/s |")
  print("|---|---|---|---|---|---|---|")
  for arch in args.archs.split(","):
    for dtype in args.dtypes.split(","):
      r = bench(arch, dtype=dtype, image_size=args.image_size, batch_size=args.batch_size,
                steps=args.steps)
      rows.append(r)
      print(f"| {arch} | {dtype} | {r['image_size']} | {r['batch_size']} | "
            f"{r['first_call_s']:.1f} | {r['step_s']:.3f} | {r['images_per_s']:.1f} |",
            flush=True)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump({"results": rows, "backend": jax.default_backend()}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
