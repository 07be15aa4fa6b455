"""Where a CPU convolution's time goes: one layer's forward, input gradient and weight gradient
with XLA's convolution (``lax``), the matmul form (``models.conv.conv_matmul``) and the C++
direct convolution (``models.conv.conv_direct``, what ``conv_impl='auto'`` runs on the CPU),
and XLA's GEMM rate on the shapes involved. One process; ms are medians of ``--reps`` calls.

  taskset -c 1 python benchmarks/speed/conv_parts.py              # docs/performance.md (one core)
  python benchmarks/speed/conv_parts.py --batch=4 --size=8 --reps=2   # seconds
  python benchmarks/speed/conv_parts.py --weight_grads --batch=8 --size=224
  python benchmarks/speed/conv_parts.py --batch_norm --batch=8 --size=224

The gradient parts are the time of ``grad`` w.r.t. that input alone minus the forward's.

``--weight_grads``: instead, every distinct weight-gradient shape of ResNet-50 (v1.5) at
``--size`` px and ``--batch`` images, by the C++ kernel unpacked and packed
(``models.conv.direct_kernel_grad(pack=False / True)``) and, for the 1 x 1 layers, by XLA's
matmul over the pixels; the forms take turns call by call (``--reps`` rounds, medians), and
the totals weigh each shape by its number of layers. ``auto`` is the form the network runs.

``--batch_norm``: instead, train-mode BatchNorm + ReLU forward + backward (the gradient of
``sum(G relu(bn(x)))`` w.r.t. ``x``, scale and bias) at the activation shapes of ResNet-50 at
``--size`` px and ``--batch`` images: ``nnx.BatchNorm`` then ``nnx.relu``, differentiated by
JAX, against ``models.resnet.BatchNorm(relu=True)`` (``models.norm.batch_norm``, its own VJP);
the two take turns call by call (medians of ``--reps`` rounds), with XLA's temp bytes.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# pylint: disable=wrong-import-position
import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks import harness
from dml_jax import kernels
from dml_jax.models import conv, resnet
# pylint: enable=wrong-import-position

NHWC = ("NHWC", "HWIO", "NHWC")
SCRIPT = "benchmarks/speed/conv_parts.py"


def median_ms(fn, *args, reps: int) -> float:
  return harness.time_jitted(fn, *args, repeats=reps)


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


def resnet50_weight_grads(size: int) -> list[dict]:
  """ResNet-50 (v1.5)'s distinct convolution weight gradients at ``size`` px, after the stem:
  ``{'size' (input px), 'cin', 'cout', 'window', 'stride', 'count' (layers)}``."""
  counts = collections.Counter()
  size, cin = (size - 1) // 4 + 1, 64   # the stem's stride 2 and the max-pool's
  for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
    for b in range(blocks):
      s = stride if b == 0 else 1
      out = (size - 1) // s + 1
      counts[(size, cin, width, 1, 1)] += 1
      counts[(size, width, width, 3, s)] += 1
      counts[(out, width, 4 * width, 1, 1)] += 1
      if b == 0:
        counts[(size, cin, 4 * width, 1, s)] += 1
      size, cin = out, 4 * width
  return [dict(size=k[0], cin=k[1], cout=k[2], window=k[3], stride=k[4], count=n)
          for k, n in counts.items()]


def weight_grad_rows(shapes: list[dict], *, batch: int, reps: int) -> list[dict]:
  """ms and GFLOP/s of each shape's weight gradient per form (see the module docstring)."""
  rows = []
  for shape in shapes:
    k, s, pad = shape["window"], shape["stride"], shape["window"] // 2
    out = (shape["size"] - 1) // s + 1
    key = jax.random.key(0)
    x = jax.random.normal(key, (batch, shape["size"] + 2 * pad, shape["size"] + 2 * pad,
                                shape["cin"]))
    g = jax.random.normal(jax.random.key(1), (batch, out, out, shape["cout"]))
    forms = {f"kernel_{name}": jax.jit(lambda x, g, p=p: conv.direct_kernel_grad(
        x, g, (k, k), strides=(s, s), pack=p)) for name, p in (("unpacked", False),
                                                                 ("packed", True))}
    if k == 1:
      forms["xla_matmul"] = jax.jit(lambda x, g: jax.lax.dot_general(
          x[:, ::s, ::s], g, (((0, 1, 2), (0, 1, 2)), ((), ()))))
    ms = harness.time_in_turns(
        {name: lambda fn=fn: jax.block_until_ready(fn(x, g)) for name, fn in forms.items()},
        repeats=reps)
    gflop = 2 * batch * out * out * shape["cin"] * shape["cout"] * k * k / 1e9
    packs = min(shape["cin"], shape["cout"]) >= conv.PACK_MIN_CHANNELS
    rows.append({**shape, "gflop": gflop, "auto": "kernel_packed" if packs else
                 "kernel_unpacked", "ms": ms})
  return rows


def weight_grads_table(rows: list[dict], batch: int, size: int) -> str:
  """ms (GFLOP/s) of each weight-gradient shape per form, and the layer-weighted totals."""
  names = ("kernel_unpacked", "kernel_packed", "xla_matmul")
  cell = lambda r, n: (f"{r['ms'][n]:.1f} ({r['gflop'] / r['ms'][n] * 1e3:.0f})"  # noqa: E731
                       if n in r["ms"] else "—")
  total = lambda n: sum(r["count"] * r["ms"][n] for r in rows)  # noqa: E731
  return (f"ResNet-50's weight gradients, batch {batch}, {size} px: ms (GFLOP/s)\n\n"
          + harness.markdown_table(
              ["input px", "C → O", "window / stride", "layers", "unpacked", "packed",
               "XLA matmul", "`auto` runs"],
              [[r["size"], f"{r['cin']} → {r['cout']}",
                f"{r['window']} × {r['window']} / {r['stride']}", r["count"],
                *(cell(r, n) for n in names), r["auto"].split("_")[1]] for r in rows])
          + f"\n\nWeighted by the layers of each shape, ms a step: unpacked "
          f"{total('kernel_unpacked'):,.1f}, packed {total('kernel_packed'):,.1f}, as the "
          f"network runs them (`auto`) {sum(r['count'] * r['ms'][r['auto']] for r in rows):,.1f}.")


def resnet50_activations(size: int) -> list[tuple[int, int]]:
  """``(side, channels)`` of the BatchNorm layers of ResNet-50 at ``size`` px (distinct ones)."""
  out = [(size // 2, 64)]
  for stage, width in enumerate((64, 128, 256, 512)):
    side = size // 2 ** (stage + 2)
    out += [(side, width), (side, 4 * width)]
  return out


def batch_norm_rows(shapes, *, batch: int, reps: int) -> list[dict]:
  """ms and temp bytes of BatchNorm + ReLU forward + backward at ``[batch, side, side, C]``,
  ``nnx`` (nnx.BatchNorm + nnx.relu) against ``fused`` (resnet.BatchNorm(relu=True))."""
  rows = []
  for side, c in shapes:
    x = jax.random.normal(jax.random.key(0), (batch, side, side, c))
    g = jax.random.normal(jax.random.key(1), x.shape)
    fns = {}
    for name, module, call in (
        ("nnx", nnx.BatchNorm, lambda m, x: nnx.relu(m(x))),
        ("fused", resnet.BatchNorm, lambda m, x: m(x, relu=True))):
      graphdef, params, stats = nnx.split(module(c, use_running_average=False,
                                                 rngs=nnx.Rngs(0)), nnx.Param, nnx.BatchStat)
      loss = lambda x, p, graphdef=graphdef, stats=stats, call=call: jnp.sum(  # noqa: E731
          g * call(nnx.merge(graphdef, p, stats, copy=True), x))
      fns[name] = (jax.jit(jax.grad(loss, argnums=(0, 1))), params)
    temp = {name: fn.lower(x, p).compile().memory_analysis().temp_size_in_bytes
            for name, (fn, p) in fns.items()}
    ms = harness.time_in_turns(
        {name: lambda fn=fn, p=p: jax.block_until_ready(fn(x, p))
         for name, (fn, p) in fns.items()}, repeats=reps)
    rows.append({"shape": list(x.shape), "ms": ms, "temp_bytes": temp})
  return rows


def batch_norm_table(rows: list[dict]) -> str:
  """ms (XLA temp MB) of BatchNorm + ReLU forward + backward per activation shape and form."""
  out = []
  for r in rows:
    ms, mb = r["ms"], {n: b / harness.MIB for n, b in r["temp_bytes"].items()}
    out.append([r["shape"], f"{ms['nnx']:.1f} ({mb['nnx']:.0f})",
                f"{ms['fused']:.1f} ({mb['fused']:.0f})", f"{ms['nnx'] / ms['fused']:.2f}×"])
  total = {n: sum(r["ms"][n] for r in rows) for n in ("nnx", "fused")}
  return (harness.markdown_table(
      ["activation", "`nnx.BatchNorm` + `nnx.relu`: ms (temp MB)", "fused: ms (temp MB)",
       "nnx / fused"], out)
          + f"\n\nSummed over the shapes, ms: nnx {total['nnx']:.1f}, fused "
          f"{total['fused']:.1f}.")


def layer_table(config: dict, parts: dict, gemms: list[dict]) -> str:
  """ms of the 3 x 3 layer's forward and gradients per formulation, and the GEMM rates."""
  return (f"3 × 3 convolution {config['cin']} → {config['cout']}, batch {config['batch']}, "
          f"{config['size']} px, ms:\n\n" + harness.markdown_table(
              ["formulation", "forward", "input gradient", "weight gradient"],
              [[name, f"{p['forward_ms']:.1f}", f"{p['input_grad_ms']:.1f}",
                f"{p['weight_grad_ms']:.1f}"] for name, p in parts.items()])
          + "\n\n" + "; ".join(f"XLA's GEMM {g['shape']}: {g['ms']:.1f} ms, "
                                f"{g['gflops']:.0f} GFLOP/s" for g in gemms) + ".")


def table(report: dict) -> str:
  """The docs table of a written report, whichever of the three measurements it holds."""
  c = report["config"]
  if "batch_norm" in report:
    return batch_norm_table(report["batch_norm"])
  if "weight_grads" in report:
    return weight_grads_table(report["weight_grads"], c["batch"], c["size"])
  return layer_table(c, report["layer"], report["gemm"])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--size", type=int, default=28)
  parser.add_argument("--cin", type=int, default=32)
  parser.add_argument("--cout", type=int, default=64)
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--weight_grads", action="store_true",
                      help="ResNet-50's weight-gradient shapes instead (see the docstring)")
  parser.add_argument("--batch_norm", action="store_true",
                      help="BatchNorm + ReLU at ResNet-50's activation shapes instead")
  parser.add_argument("--shapes", type=int, default=0,
                      help="--weight_grads: only the first N shapes (0: all)")
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  if args.batch_norm:
    rows = batch_norm_rows(resnet50_activations(args.size), batch=args.batch, reps=args.reps)
    report = {"script": SCRIPT, "config": vars(args), "batch_norm": rows,
              "stamp": harness.stamp()}
    print(table(report))
    harness.write_json(report, args.out, indent=1)
    return 0
  if args.weight_grads:
    try:
      kernels.require("conv.cc")
    except RuntimeError as e:   # the kernel's own one-line reason
      print(f"conv_parts.py: --weight_grads times the C++ kernel; {e}", file=sys.stderr)
      return 2
    shapes = resnet50_weight_grads(args.size)
    rows = weight_grad_rows(shapes[:args.shapes or None], batch=args.batch, reps=args.reps)
    report = {"script": SCRIPT, "config": vars(args), "weight_grads": rows,
              "stamp": harness.stamp()}
    print(table(report))
    harness.write_json(report, args.out, indent=1)
    return 0
  parts = layer_parts(args.batch, args.size, args.cin, args.cout, reps=args.reps)
  m = args.batch * args.size * args.size
  gemms = gemm_rates([(m, 9 * args.cin, args.cout), (2048, 512, 2048)], reps=args.reps)
  report = {"script": SCRIPT, "config": vars(args), "layer": parts, "gemm": gemms,
            "stamp": harness.stamp()}
  print(table(report))
  harness.write_json(report, args.out, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
