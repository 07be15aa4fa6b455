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

Images/s = steps x global batch / seconds. If ``real`` is well below ``synthetic`` while
``input only`` is near ``real``, the input pipeline limits (raise ``data.num_threads`` /
``data.num_workers``, or use the cache: ``cached``); if ``real`` ≈ ``synthetic``, the devices
do. Prints a markdown table,
writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
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


def make_config(args, *, root: str, dtype: str):
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
  if args.set:
    c = overrides.apply(c, overrides.parse_assignments(args.set), from_strings=True)
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
  """images/s of the step with each input, of the input alone, and the warm-up's seconds."""
  return (f"{report['device_count']} × {report['device']} ({report['backend']}):\n\n"
          + harness.markdown_table(
              ["model", "px", "dtype", "global batch", "real input (img/s)",
               "cached input (img/s)", "synthetic (img/s)", "input only (img/s)",
               "warm-up incl. compile (s)"],
              [[r["model"], r["image_size"], r["dtype"], r["batch_size"],
                *(f"{r[k]:,.1f}" if k in r else "—" for k in INPUTS), f"{r['warmup_s']:.1f}"]
               for r in report["results"]]))


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
  parser.add_argument("--trace", default="", help="profile synthetic steps into DIR/<dtype>/")
  parser.add_argument("--trace_steps", type=int, default=3)
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
  if dtypes:
    make_config(args, root="", dtype=dtypes[0])   # a bad --set fails before any JPEG is written
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
      c = make_config(args, root=root, dtype=dtype)
      r = {"model": c.model.name, "image_size": c.data.image_size, "dtype": dtype,
           **({"set": list(args.set)} if args.set else {}),
           **measure(c, inputs=inputs, steps=args.steps, warmup=args.warmup,
                     trace_dir=os.path.join(args.trace, dtype) if args.trace else "",
                     num_trace_steps=args.trace_steps)}
      rows.append(r)
      print(json.dumps(r), flush=True)
  device = str(jax.devices()[0].device_kind)
  print(f"\n{jax.device_count()} × {device} ({jax.default_backend()})")
  report = {"script": SCRIPT, "device": device, "backend": jax.default_backend(),
            "device_count": jax.device_count(), "results": rows, "stamp": harness.stamp()}
  print(table(report))
  harness.write_json(report, args.out, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
