"""Training throughput (images / s) of a full training step, with the real input pipeline and
with synthetic input, on whatever devices JAX finds.

  python benchmarks/speed/train_throughput.py --out=runs/train_throughput.json   # ResNet-50, 224 px
  python benchmarks/speed/train_throughput.py --batch_size=256 --steps=50        # on a GPU
  python benchmarks/speed/train_throughput.py --smoke                            # seconds (CPU)

The step is the training loop's (``training.make_guarded_step``: forward, the objective,
backward, the optimizer update, the non-finite guard; the train state donated) for the config
``--config`` (default ``configs/cub_ephn_2nd.py``: ResNet-50, 512-D, EPHN-2nd, SGD, batches of
n = 8 per class), with ``model.pretrained=''`` (random weights: the same work) and the data
replaced by an ``image_folder`` of generated JPEG files (``--num_classes`` x ``--per_class``
colour images of ``--source_size``, CUB's typical size; or ``--images=ROOT``, any class-folder
dataset). The global batch is sharded over all devices (data parallel, ``parallel``).

For each ``--dtypes`` (``model.dtype``: float32, bfloat16) it measures, after ``--warmup``
steps (compilation):

* ``real``: ``pipeline.train_batches`` (n-per-class sampling, JPEG decoding, the config's
  augmentation, prefetching threads) -> ``parallel.global_batch`` -> the step, ``--steps``
  steps, ended by fetching the guard flag (as the loop does at a log step);
* ``cached``: the decoded-image cache (``data.cache``): the training images decoded once in
  memory (``cache_build_s``, ``cache_gb``), then ``pipeline.cached_batches`` (the same crop
  boxes and flips, cut from the cache on the host) -> the jitted device augmentation
  (``train_input.make_feed``) -> the step, ``--warmup`` + ``--steps`` steps;
* ``synthetic``: the same step on one batch already on the devices, ``--steps`` steps: the
  compute alone;
* ``input only``: ``--steps`` batches of a freshly started pipeline with no step, timed from
  its first batch (the time to that batch is ``input_first_batch_s``): what the input side
  can deliver.

``--set key=value`` (repeatable) overrides config keys as ``train.py``'s ``--config.key=value``
would (e.g. ``--set=model.bn_mode=frozen``), for comparing variants of the step; each row
records its ``set``. ``--trace=DIR`` profiles ``--trace_steps`` more synthetic steps under
``jax.profiler`` into ``DIR/<dtype>/`` (the trace, and ``step.hlo.txt``: the compiled step),
which ``benchmarks/profiling/op_profile.py --trace_dir`` reads.

``--gpu_target=h100`` (or ``h200``) measures nothing: it compiles the same step for that GPU on
a machine without one (``jax.experimental.topologies``; it needs JAX's CUDA plugin and its
CUDA libraries, no GPU and no driver, run with ``JAX_PLATFORMS=cpu``) and reports what XLA:GPU
makes of it (``benchmarks/hlo.py``'s ``program_summary``): its kernels, those that move under
1 MB, and the bytes its kernels read and write, by kind. XLA compiles there as on the device
but for autotuning (which needs the device), so the fusions, cuDNN's convolutions and the
buffers are the device's. ``--trace=DIR`` keeps the compiled program
(``DIR/<dtype>/step.hlo.txt``). A variant's ``--set`` that moves fewer bytes or launches fewer
kernels is worth a ``step`` run on a GPU (``benchmarks/device/gpu_check.sh``)::

  pip install --target=/opt/jax-cuda "jax-cuda12-plugin[with-cuda]==$JAX_VERSION"
  JAX_PLATFORMS=cpu PYTHONPATH=/opt/jax-cuda python benchmarks/speed/train_throughput.py \
    --gpu_target=h100 --dtypes=bfloat16 --batch_size=256 --num_classes=80 --set=...

Images/s = steps x global batch / seconds. If ``real`` is well below ``synthetic`` while
``input only`` is near ``real``, the input pipeline limits (raise ``data.num_threads`` /
``data.num_workers``, or use the cache: ``cached``); if ``real`` ≈ ``synthetic``, the devices
do. Prints a markdown table,
writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks import hlo  # noqa: E402
from dml_jax import parallel  # noqa: E402
from dml_jax.run import train_input  # noqa: E402
from dml_jax.run import training  # noqa: E402
from dml_jax.data import cache as cache_lib  # noqa: E402
from dml_jax.run import overrides  # noqa: E402

INPUTS = ("real", "cached", "synthetic", "input_only")
SCRIPT = "benchmarks/speed/train_throughput.py"


def write_jpegs(root: str, *, num_classes: int, per_class: int, size: tuple[int, int],
                seed: int = 0) -> int:
  """``root/<class>/<i>.jpg``: smooth random colour images (JPEG quality 90) of ``size``
  (width, height); returns the number of files."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  w, h = size
  for c in range(num_classes):
    os.makedirs(os.path.join(root, f"class_{c:04d}"), exist_ok=True)
    for i in range(per_class):
      coarse = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
      img = Image.fromarray(coarse).resize((w, h), Image.BILINEAR)
      img.save(os.path.join(root, f"class_{c:04d}", f"{i:04d}.jpg"), quality=90)
  return num_classes * per_class


def assignments(args, variant: str = "") -> list[str]:
  """The ``KEY=VALUE`` overrides of a row: ``--set``'s, then its ``--variant``'s."""
  return [*args.set, *variant.split()]


def make_config(args, *, root: str, dtype: str, variant: str = ""):
  module, _, arg = args.config.partition(":")
  name = os.path.splitext(os.path.relpath(module, REPO))[0].replace(os.sep, ".")
  c = importlib.import_module(name).get_config(arg)
  c.data.name = "image_folder"
  c.data.options = {"root": root, "layout": "classes", "train_classes": 0.5}
  c.data.label_noise = 0.0
  c.model.pretrained = ""
  c.eval.splits = ("test",)
  c.eval.ks = (1,)
  c.model.dtype = dtype
  if args.arch:
    c.model.name = args.arch
  if args.image_size:
    c.data.image_size = args.image_size
    c.data.resize_size = round(args.image_size * 8 / 7)
  if args.batch_size:
    c.batch_size = args.batch_size
  if args.group_size:
    c.data.group_size = args.group_size
  if args.num_threads:
    c.data.num_threads = args.num_threads
  if args.num_workers is not None:
    c.data.num_workers = args.num_workers
  c.num_train_steps = 10 ** 9
  if assignments(args, variant):
    c = overrides.apply(c, overrides.parse_assignments(assignments(args, variant)),
                        from_strings=True)
  return c


def trace_steps(step_fn, state, halted, images, labels, keys, trace_dir: str):
  """Runs the step once per key under ``jax.profiler`` into ``trace_dir`` and writes the
  compiled step's HLO text there (``step.hlo.txt``); returns the new ``(state, halted)``."""
  os.makedirs(trace_dir, exist_ok=True)
  hlo = step_fn.lower(state, halted, images, labels, keys[0]).compile().as_text()
  with open(os.path.join(trace_dir, "step.hlo.txt"), "w") as f:
    f.write(hlo)
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for key in keys:
      state, halted, metrics = step_fn(state, halted, images, labels, key)
    jax.block_until_ready((state, halted, metrics))
  return state, halted


# GPUs the step can be compiled for without one: XLA's GpuTargetConfig of each (the SXM
# parts' datasheet figures; compute capability 9.0, 132 multiprocessors for both).
GPU_TARGETS = {
    "h100": {"device_description_str": "NVIDIA H100 80GB HBM3", "memory_bandwidth": 3.35e12,
             "device_memory_size": 80 * 2 ** 30},
    "h200": {"device_description_str": "NVIDIA H200", "memory_bandwidth": 4.8e12,
             "device_memory_size": 141 * 10 ** 9},
}
_HOPPER = """gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: {memory_bandwidth:.0f} l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: {device_memory_size}
  shared_memory_per_block_optin: 232448 cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
runtime_version {{ major: 12 minor: 8 }}
device_description_str: "{device_description_str}"
"""


def gpu_mesh(target: str):
  """A one-GPU ``('data',)`` mesh of ``target`` (a key of ``GPU_TARGETS``) to compile for, on a
  machine without that GPU; ``RuntimeError`` naming what is missing when JAX cannot."""
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  if target not in GPU_TARGETS:
    raise ValueError(f"--gpu_target={target!r}; allowed: {', '.join(GPU_TARGETS)}.")
  try:
    topology = topologies.get_topology_desc(
        platform="cuda", topology="1x1x1",
        target_config=_HOPPER.format(**GPU_TARGETS[target]))
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(
        f"--gpu_target={target} needs JAX's CUDA plugin (pip install "
        f"'jax-cuda12-plugin[with-cuda]=={jax.__version__}', then JAX_PLATFORMS=cpu): "
        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
  return topologies.make_mesh(topology, (1,), (parallel.AXIS,))


def step_program(setup: training.Setup, mesh) -> str:
  """The compiled HLO text of the training loop's step (``training.make_guarded_step``) of
  ``setup`` with its state and batch on ``mesh``, from shapes alone (no array is made there)."""
  setup = dataclasses.replace(setup, mesh=mesh)
  rep, batch = parallel.replicated(mesh), parallel.batch_sharded(mesh)
  on = lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  b, s = setup.config.batch_size, setup.config.data.image_size
  args = (jax.tree.map(lambda x: on(x, rep), setup.init_state),
          jax.ShapeDtypeStruct((), jnp.int32, sharding=rep),
          jax.ShapeDtypeStruct((b, s, s, setup.config.data.channels), jnp.float32,
                               sharding=batch),
          jax.ShapeDtypeStruct((b,), jnp.int32, sharding=batch),
          on(training.step_key(setup.config.seed, 1), rep))
  return training.make_guarded_step(setup).lower(*args).compile().as_text()


def gpu_program(config, mesh, trace_dir: str = "") -> dict:
  """``hlo.program_summary`` of ``config``'s step compiled for ``mesh`` (:func:`gpu_mesh`);
  with ``trace_dir``, the program written to ``trace_dir/step.hlo.txt``."""
  text = step_program(training.build(config), mesh)
  if trace_dir:
    os.makedirs(trace_dir, exist_ok=True)
    with open(os.path.join(trace_dir, "step.hlo.txt"), "w") as f:
      f.write(text)
  return {"batch_size": config.batch_size, **hlo.program_summary(text)}


def measure(config, *, inputs: list[str], steps: int, warmup: int, trace_dir: str = "",
            num_trace_steps: int = 3) -> dict:
  """Images/s of each of ``inputs`` for ``config`` (module docstring); with ``trace_dir``,
  ``num_trace_steps`` synthetic steps profiled there after the measurements."""
  setup = training.build(config)
  b = config.batch_size
  step_fn = training.make_guarded_step(setup)
  key_fn = training.make_step_key_fn(config.seed)
  state = jax.tree.map(jnp.copy, setup.init_state)
  halted = parallel.replicate(setup.mesh, jnp.zeros((), jnp.int32))

  workers, threads = training.input_workers(config)
  batches = lambda start=0: training.train_batches(setup, start_step=start)

  out = {"batch_size": b, "devices": jax.device_count(), "steps": steps,
         "num_workers": workers, "num_threads": threads}
  it = batches()
  t0 = time.perf_counter()
  for _ in range(warmup):
    s, x, y = next(it)
    images, labels = parallel.global_batch(setup.mesh, x, y, batch_size=b)
    state, halted, metrics = step_fn(state, halted, images, labels, key_fn(s + 1))
  jax.block_until_ready((state, metrics))
  out["warmup_s"] = time.perf_counter() - t0
  if "real" in inputs:
    t0 = time.perf_counter()
    for _ in range(steps):
      s, x, y = next(it)
      images, labels = parallel.global_batch(setup.mesh, x, y, batch_size=b)
      state, halted, metrics = step_fn(state, halted, images, labels, key_fn(s + 1))
    if int(jax.device_get(halted)):
      raise FloatingPointError("the loss became non-finite")
    out["real"] = steps * b / (time.perf_counter() - t0)
    out["loss"] = float(jax.device_get(metrics["loss"]))
  if "cached" in inputs:
    t0 = time.perf_counter()
    cache = cache_lib.build(setup.splits["train"].images, train_input.cache_spec(config.data),
                            num_threads=threads)
    out["cache_build_s"], out["cache_gb"] = time.perf_counter() - t0, cache.nbytes / 1e9
    feed = train_input.make_feed(config, setup.mesh, cache)
    cached = training.train_batches(setup, start_step=warmup + steps, cache=cache)

    def cached_steps(n, state, halted):
      for _ in range(n):
        s, x, y = next(cached)
        images, labels = feed(x, y)
        state, halted, metrics = step_fn(state, halted, images, labels, key_fn(s + 1))
      return state, halted, metrics

    state, halted, metrics = cached_steps(warmup, state, halted)   # compiles the augmentation
    jax.block_until_ready((state, metrics))
    t0 = time.perf_counter()
    state, halted, metrics = cached_steps(steps, state, halted)
    if int(jax.device_get(halted)):
      raise FloatingPointError("the loss became non-finite")
    out["cached"] = steps * b / (time.perf_counter() - t0)
  if "synthetic" in inputs:
    keys = [key_fn(i + 1) for i in range(steps)]
    jax.block_until_ready((images, labels, keys))
    t0 = time.perf_counter()
    for key in keys:
      state, halted, metrics = step_fn(state, halted, images, labels, key)
    int(jax.device_get(halted))
    out["synthetic"] = steps * b / (time.perf_counter() - t0)
  if "input_only" in inputs:   # a fresh pipeline, timed from its first batch on
    t0 = time.perf_counter()
    fresh = batches(start=warmup + 2 * steps)
    next(fresh)
    t1 = time.perf_counter()
    for _ in range(steps):
      next(fresh)
    out["input_only"] = steps * b / (time.perf_counter() - t1)
    out["input_first_batch_s"] = t1 - t0
  if trace_dir:
    keys = [key_fn(10 ** 6 + i) for i in range(num_trace_steps)]
    state, halted = trace_steps(step_fn, state, halted, images, labels, keys, trace_dir)
    out["trace_dir"], out["trace_steps"] = trace_dir, num_trace_steps
  return out


def table(report: dict) -> str:
  """images/s of the step with each input, of the input alone, and the warm-up's seconds (a
  ``--gpu_target`` report: :func:`program_table`)."""
  if "gpu_target" in report:
    return program_table(report)
  rows = report["results"]
  sets = any("set" in r for r in rows)
  return (f"{report['device_count']} × {report['device']} ({report['backend']}):\n\n"
          + harness.markdown_table(
              ["model", "px", "dtype", *(["set"] if sets else []), "global batch",
               "real input (img/s)", "cached input (img/s)", "synthetic (img/s)",
               "input only (img/s)", "warm-up incl. compile (s)"],
              [[r["model"], r["image_size"], r["dtype"],
                *([" ".join(r.get("set", [])) or "(as is)"] if sets else []), r["batch_size"],
                *(f"{r[k]:,.1f}" if k in r else "—" for k in INPUTS), f"{r['warmup_s']:.1f}"]
               for r in rows]))


def _slug(variant: str) -> str:
  """A folder name for a ``--variant``'s trace: ``model.conv_impl=lax`` -> ``model.conv_impl-lax``."""
  return "_".join(variant.split()).replace("=", "-").replace("/", "-")


def program_table(report: dict) -> str:
  """Kernels and bytes of each row's compiled step (``--gpu_target``), and the bytes by kind."""
  rows = report["results"]
  kinds = [k for k in hlo.KINDS if any(k == x["kind"] for r in rows for x in r["kinds"])]
  gb = lambda r, kind: next((x["gb"] for x in r["kinds"] if x["kind"] == kind), 0.0)
  return (f"the step compiled for {report['device']} ({report['compiled_with']}):\n\n"
          + harness.markdown_table(
              ["dtype", "set", "kernels", "under 1 MB", "GB moved", *(f"GB: {k}" for k in kinds)],
              [[r["dtype"], " ".join(r.get("set", [])) or "(as is)", r["kernels"],
                r["small_kernels"], f"{r['gb']:.2f}", *(f"{gb(r, k):.2f}" for k in kinds)]
               for r in rows]))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="configs/cub_ephn_2nd.py", help="path[:arg]")
  parser.add_argument("--arch", default="", help="model.name (default: the config's)")
  parser.add_argument("--image_size", type=int, default=0, help="default: the config's")
  parser.add_argument("--batch_size", type=int, default=0, help="global; default: the config's")
  parser.add_argument("--group_size", type=int, default=0, help="default: the config's")
  parser.add_argument("--num_threads", type=int, default=0, help="data.num_threads")
  parser.add_argument("--num_workers", type=int, default=None,
                      help="data.num_workers (grain processes; -1 auto; default: the config's)")
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--inputs", default=",".join(INPUTS))
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="config override, as train.py's --config.KEY=VALUE (repeatable)")
  parser.add_argument("--variant", action="append", default=[], metavar="'KEY=VALUE ...'",
                      help="a row per dtype with these overrides beside --set's (repeatable; "
                      "'' = none)")
  parser.add_argument("--trace", default="", help="profile synthetic steps into DIR/<dtype>/")
  parser.add_argument("--trace_steps", type=int, default=3)
  parser.add_argument("--gpu_target", default="",
                      help=f"compile for a GPU instead of measuring: {', '.join(GPU_TARGETS)}")
  parser.add_argument("--images", default="", help="a class-folder dataset (default: generated)")
  parser.add_argument("--num_classes", type=int, default=40)
  parser.add_argument("--per_class", type=int, default=16)
  parser.add_argument("--source_size", default="500x375", help="generated JPEGs, WxH")
  parser.add_argument("--smoke", action="store_true",
                      help="resnet18 (or --arch), 32 px, batch 8, 4 classes x 8, 2 steps, float32")
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  if args.smoke:
    args.arch = args.arch or "resnet18"
    args.image_size, args.batch_size, args.group_size = 32, 8, 4
    args.num_classes, args.per_class, args.source_size = 4, 8, "48x40"
    args.steps, args.warmup, args.dtypes = 2, 1, "float32"
  inputs = [i for i in args.inputs.split(",") if i]
  dtypes = [d for d in args.dtypes.split(",") if d]
  bad = sorted(set(inputs) - set(INPUTS)) + sorted(set(dtypes) - {"float32", "bfloat16"})
  if bad:
    raise ValueError(f"unknown inputs/dtypes {bad}; allowed inputs: {', '.join(INPUTS)}; "
                     "dtypes: float32, bfloat16.")
  for variant in args.variant or [""]:   # a bad --set fails before any JPEG is written
    make_config(args, root="", dtype=dtypes[0] if dtypes else "float32", variant=variant)
  mesh = None
  if args.gpu_target:
    try:
      mesh = gpu_mesh(args.gpu_target)
    except (ValueError, RuntimeError) as e:
      print(e, file=sys.stderr)
      return 2
  w, _, h = args.source_size.partition("x")
  rows = []
  with tempfile.TemporaryDirectory(prefix="train_throughput_") as tmp:
    root = args.images
    if not root:
      root = os.path.join(tmp, "images")
      n = write_jpegs(root, num_classes=args.num_classes, per_class=args.per_class,
                      size=(int(w), int(h)))
      print(f"wrote {n} JPEG files of {args.source_size} to {root}", flush=True)
    for dtype in dtypes:
      for variant in args.variant or [""]:
        c = make_config(args, root=root, dtype=dtype, variant=variant)
        sets = assignments(args, variant)
        trace_dir = (os.path.join(args.trace, dtype, *([_slug(variant)] if variant else []))
                     if args.trace else "")
        r = {"model": c.model.name, "image_size": c.data.image_size, "dtype": dtype,
             **({"set": sets} if sets else {}),
             "xla_flags": os.environ.get("XLA_FLAGS", "").strip(),
             **(gpu_program(c, mesh, trace_dir) if mesh is not None else
                measure(c, inputs=inputs, steps=args.steps, warmup=args.warmup,
                        trace_dir=trace_dir, num_trace_steps=args.trace_steps))}
        rows.append(r)
        print(json.dumps(r), flush=True)
  if args.gpu_target:
    where = {"gpu_target": args.gpu_target,
             "device": GPU_TARGETS[args.gpu_target]["device_description_str"],
             "compiled_with": f"jax {jax.__version__}, no device"}
  else:
    where = {"device": str(jax.devices()[0].device_kind), "backend": jax.default_backend(),
             "device_count": jax.device_count()}
  report = {"script": SCRIPT, **where, "results": rows, "stamp": harness.stamp()}
  print("\n" + table(report))
  harness.write_json(report, args.out, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
