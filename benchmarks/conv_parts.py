"""Where a CPU convolution's time goes: one layer's forward, input gradient and weight gradient
with XLA's convolution (``lax``), the matmul form (``models.conv.conv_matmul``) and the C++
direct convolution (``models.conv.conv_direct``, what ``conv_impl='auto'`` runs on the CPU),
and XLA's GEMM rate on the shapes involved. One process; ms are medians of ``--reps`` calls.

  taskset -c 1 python benchmarks/conv_parts.py                 # the README's numbers (one core)
  python benchmarks/conv_parts.py --batch=4 --size=8 --reps=2   # seconds

The gradient parts are the time of ``grad`` w.r.t. that input alone minus the forward's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from dml_jax.models import conv

NHWC = ("NHWC", "HWIO", "NHWC")


def median_ms(fn, *args, reps: int) -> float:
  fn = jax.jit(fn)
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(1e3 * (time.perf_counter() - t0))
  return statistics.median(times)


def layer_parts(batch: int, size: int, cin: int, cout: int, *, reps: int) -> dict:
  """ms of forward, input gradient and weight gradient of a 3x3 SAME conv, per formulation."""
  k = jax.random.key(0)
  x = jax.random.normal(k, (batch, size, size, cin))
  w = jax.random.normal(k, (3, 3, cin, cout))
  out = {}
  for name, fn in (("lax", jax.lax.conv_general_dilated), ("matmul", conv.conv_matmul),
                   ("direct", conv.conv_direct)):
    f = lambda x, w, fn=fn: fn(x, w, (1, 1), "SAME", dimension_numbers=NHWC)  # noqa: E731
    loss = lambda x, w, f=f: jnp.sum(f(x, w) ** 2)  # noqa: E731
    fwd = median_ms(f, x, w, reps=reps)
    dx = median_ms(jax.grad(loss, argnums=0), x, w, reps=reps) - fwd
    dw = median_ms(jax.grad(loss, argnums=1), x, w, reps=reps) - fwd
    out[name] = {"forward_ms": fwd, "input_grad_ms": dx, "weight_grad_ms": dw}
  return out


def gemm_rates(shapes, *, reps: int) -> list[dict]:
  rows = []
  for m, kk, n in shapes:
    a = jax.random.normal(jax.random.key(0), (m, kk))
    b = jax.random.normal(jax.random.key(1), (kk, n))
    ms = median_ms(lambda a, b: a @ b, a, b, reps=reps)
    rows.append({"shape": [m, kk, n], "ms": ms, "gflops": 2 * m * kk * n / ms / 1e6})
  return rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--size", type=int, default=28)
  parser.add_argument("--cin", type=int, default=32)
  parser.add_argument("--cout", type=int, default=64)
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  parts = layer_parts(args.batch, args.size, args.cin, args.cout, reps=args.reps)
  m = args.batch * args.size * args.size
  gemms = gemm_rates([(m, 9 * args.cin, args.cout), (2048, 512, 2048)], reps=args.reps)
  print(f"3x3 conv {args.cin}->{args.cout}, batch {args.batch}, {args.size} px, ms:")
  print("| formulation | forward | input gradient | weight gradient |\n|---|---|---|---|")
  for name, p in parts.items():
    print(f"| {name} | {p['forward_ms']:.1f} | {p['input_grad_ms']:.1f} | "
          f"{p['weight_grad_ms']:.1f} |")
  for g in gemms:
    print(f"GEMM {g['shape']}: {g['ms']:.1f} ms, {g['gflops']:.0f} GFLOP/s")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"config": vars(args), "layer": parts, "gemm": gemms}, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
