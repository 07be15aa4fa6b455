"""Forward + backward speed of the embedding models (images / s), dml_jax beside PyTorch.

  python benchmarks/speed/backbones.py --out=runs/backbones.json  # docs/performance.md (~15 min)
  python benchmarks/speed/backbones.py --cases=resnet50:224:8 --dtypes=float32,bfloat16 \\
      --sides=dml_jax
  python benchmarks/speed/backbones.py --smoke                          # seconds, no torch

A case is ``arch:image_size:batch``. ``small_cnn`` is the EPS paper's small CNN (conv-ReLU-
BatchNorm x2, 2x2 max-pool, dense 128, dense ``--embedding_dim``; 1 input channel up to 28 px,
3 from 32 px on), ``resnet18`` / ``resnet50`` the torchvision-layout ResNets (v1.5) with a
linear embedding head on the pooled features.

One step = the gradient of a simple embedding loss (``mean(E Eᵀ)``) w.r.t. all parameters,
BatchNorm in train mode (batch statistics, running averages updated), no optimizer: the
backbone's forward + backward. Sides, each in its own worker process (its own thread pool,
compiled once), taking turns case by case for ``--rounds`` rounds so that a change in the
machine's load hits every side:

* ``dml_jax``: ``models.make(arch, conv_impl='auto')``: on the CPU convolutions are one matmul
  over shifted slices and pooling maxima of shifted slices (``models.conv``), elsewhere
  ``lax.conv``; the step is jitted.
* ``dml_jax_lax``: the same with ``conv_impl='lax'`` (XLA's own convolution): what 'auto'
  saves on the machine it runs on.
* ``torch``: the same network in PyTorch, eager, NCHW: ``torchvision.models.resnet18/50``
  with ``fc`` replaced by the embedding layer, or the small CNN as ``nn.Sequential``; run by
  ``--torch_python`` (default: this Python if it imports torch + torchvision, else
  ``.venv-bench/bin/python``); skipped with a message when there is none. Float32 only.

Threads: ``--threads`` (default: all CPUs) restricts every worker to that many CPUs
(``os.sched_setaffinity``; XLA:CPU sizes its pool by them) and sets ``torch.set_num_threads``.
Host memory: by default every side's worker keeps freed host memory (``--host_memory=keep``,
``dml_jax/run/host_memory.py``), as ``train.py`` runs every image config and ``eval.py`` runs;
``--host_memory=default`` leaves glibc's malloc defaults on every side.
A measurement is ``--steps`` steps ended by a sync, as images/s; one untimed warm-up
measurement per case (compilation, torch's first calls). The table gives the median over
rounds, the ratio of the medians to torch and the median of the per-round ratios. Prints a
markdown table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
# pylint: disable=wrong-import-position
from benchmarks import harness
from benchmarks import workers
from benchmarks.backbone_step import ARCHS, EMBEDDING_DIM, JaxModel, case_name, in_channels
from benchmarks.backbone_step import parse_case
# pylint: enable=wrong-import-position

SIDES = ("dml_jax", "dml_jax_lax", "torch")
DEFAULT_CASES = ("small_cnn:8:128,small_cnn:28:128,small_cnn:32:128,resnet18:64:32,"
                 "resnet50:64:32,resnet18:224:8,resnet50:224:8")
SMOKE_CASES = "small_cnn:8:8,resnet18:32:2"


# ---- the PyTorch side (imports torch only in its worker) ----

def import_torchvision():
  """``torchvision``, also where its compiled ops (``nms`` etc.) do not load (a wheel built for
  another torch): the ResNets need none of them, only the fake-kernel registrations of those
  ops fail at import, so they are skipped then."""
  import torch  # pylint: disable=import-outside-toplevel
  try:
    import torchvision  # pylint: disable=import-outside-toplevel
    return torchvision
  except RuntimeError as e:
    if "torchvision::" not in str(e):
      raise
  for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
    del sys.modules[name]
  register_fake = torch.library.register_fake
  torch.library.register_fake = lambda *a, **k: (lambda f: f)
  try:
    import torchvision  # pylint: disable=import-outside-toplevel
  finally:
    torch.library.register_fake = register_fake
  return torchvision


class TorchModel:
  """The same network and step in PyTorch (eager, NCHW, float32)."""

  def __init__(self, case: dict):
    import torch  # pylint: disable=import-outside-toplevel
    nn = torch.nn
    torch.manual_seed(0)
    size, b, c = case["image_size"], case["batch_size"], in_channels(case)
    if case["arch"] == "small_cnn":
      model = nn.Sequential(
          nn.Conv2d(c, 32, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(32),
          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(64),
          nn.MaxPool2d(2), nn.Flatten(), nn.Linear((size // 2) ** 2 * 64, 128), nn.ReLU(),
          nn.Linear(128, EMBEDDING_DIM))
    else:
      model = getattr(import_torchvision().models, case["arch"])()
      model.fc = nn.Linear(model.fc.in_features, EMBEDDING_DIM)
    self.model = model.train()
    self.images = torch.randn(b, c, size, size)
    self.torch = torch

  def run(self, steps: int) -> float:
    loss = None
    for _ in range(steps):
      self.model.zero_grad(set_to_none=True)
      e = self.model(self.images)
      loss = (e @ e.T).mean()
      loss.backward()
    return loss.item()


def torch_conditions() -> dict:
  import torch  # pylint: disable=import-outside-toplevel
  return {"torch": torch.__version__, "torchvision": import_torchvision().__version__,
          "torch_threads": torch.get_num_threads()}


# ---- workers and the orchestration ----

def worker(side: str, threads: int) -> None:
  """Answers one JSON request per stdin line with one JSON result line on stdout."""
  built = {}

  def handle(request: dict) -> dict:
    case, dtype = request["case"], request["dtype"]
    key = json.dumps([case, dtype], sort_keys=True)
    first = None
    if key not in built:
      t0 = time.perf_counter()
      if side == "torch":
        built[key] = TorchModel(case)
      else:
        built[key] = JaxModel(case, dtype=dtype,
                              conv_impl="lax" if side == "dml_jax_lax" else "auto")
      built[key].run(1)
      first = time.perf_counter() - t0
      built[key].run(request["steps"])  # warm-up
    t0 = time.perf_counter()
    loss = built[key].run(request["steps"])
    return {"seconds": time.perf_counter() - t0, "first_call_s": first, "loss": loss}

  workers.serve(side, threads, handle, torch_conditions=torch_conditions)


def summarize(case: dict, side: str, dtype: str, runs: list[dict]) -> dict:
  """One row: images/s of every round of a (case, side, dtype)."""
  errors = [r["error"] for r in runs if "error" in r]
  if errors:
    return {**case, "side": side, "dtype": dtype, "error": errors[0]}
  rates = [r["steps"] * case["batch_size"] / r["seconds"] for r in runs]
  return {**case, "side": side, "dtype": dtype, "steps": runs[0]["steps"],
          "images_per_s": statistics.median(rates), "round_images_per_s": rates,
          "ms_per_step": 1e3 * case["batch_size"] / statistics.median(rates),
          "first_call_s": runs[0]["first_call_s"]}


def add_ratios(rows: list[dict]) -> None:
  """``ratio_to_torch`` (of the medians) and ``paired_ratio`` (median over rounds of the
  round's ratio) on every dml_jax row whose case has a float32 torch row."""
  harness.add_ratios(rows, case=case_name, value=lambda r: r["images_per_s"],
                     rounds="round_images_per_s")


def table(report: dict) -> str:
  """The docs table of a written report: :func:`rows_table` under a line on the setting."""
  c = report["conditions"]
  return (f"Both sides {harness.HOST_MEMORY[c['host_memory']]}, {c['threads']} threads each, "
          f"{c['rounds']} rounds.\n\n"
          + rows_table(report["results"]))


def rows_table(rows: list[dict]) -> str:
  """The markdown table: images/s, ms per step, the ratios to torch, the first call."""
  out = []
  for r in rows:
    head = [r["arch"], r["image_size"], r["batch_size"], r["side"], r["dtype"]]
    if "error" in r:
      out.append(head + [f"error: {r['error'][:80]}", "", "", "", ""])
      continue
    out.append(head + [f"{r['images_per_s']:,.1f}", f"{r['ms_per_step']:.1f}",
                       f"{r['ratio_to_torch']:.2f}×" if "ratio_to_torch" in r else "—",
                       f"{r['paired_ratio']:.2f}×" if "paired_ratio" in r else "—",
                       f"{r['first_call_s']:.1f}"])
  return harness.markdown_table(["model", "px", "batch", "side", "dtype", "images/s", "ms/step",
                                 "/ torch (medians)", "/ torch (paired rounds)",
                                 "first call (s)"], out)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--cases", default=DEFAULT_CASES,
                      help="comma-separated arch:image_size:batch")
  parser.add_argument("--sides", default="dml_jax,dml_jax_lax,torch",
                      help=f"comma-separated, from {', '.join(SIDES)}")
  parser.add_argument("--dtypes", default="float32",
                      help="float32 and/or bfloat16 (dml_jax ResNets; torch: float32 only)")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", default="small_cnn:10,resnet18:2,resnet50:1",
                      help="steps per measurement: one number or arch:steps pairs")
  parser.add_argument("--threads", type=int, default=0, help="CPUs per side (0: all)")
  parser.add_argument("--host_memory", default="keep", choices=("keep", "default"),
                      help="keep (the default: how train.py runs every image config and "
                      "eval.py runs): every side's worker keeps freed host memory "
                      "(dml_jax/run/host_memory.py); default: glibc's malloc defaults on every "
                      "side")
  parser.add_argument("--torch_python", default="",
                      help="Python with torch + torchvision (default: see above)")
  parser.add_argument("--smoke", action="store_true",
                      help=f"--cases={SMOKE_CASES}, dml_jax only, 1 round of 1 step")
  parser.add_argument("--out", default="")
  parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    worker(args.worker, args.threads)
    return 0
  if args.smoke:
    args.cases, args.sides, args.rounds, args.steps = SMOKE_CASES, "dml_jax", 1, "1"
  cases = [parse_case(c) for c in args.cases.split(",") if c]
  sides = [s for s in args.sides.split(",") if s]
  dtypes = [d for d in args.dtypes.split(",") if d]
  unknown = sorted(set(sides) - set(SIDES)) + sorted(set(dtypes) - {"float32", "bfloat16"})
  if unknown:
    raise ValueError(f"unknown sides/dtypes {unknown}; allowed sides: {', '.join(SIDES)}; "
                     "dtypes: float32, bfloat16.")
  if ":" in args.steps:
    per_arch = {a: int(n) for a, n in (p.split(":") for p in args.steps.split(","))}
    steps = {a: per_arch.get(a, 1) for a in ARCHS}
  else:
    steps = {a: int(args.steps) for a in ARCHS}
  cpus = harness.available_cpus()
  threads = cpus if args.threads <= 0 else min(args.threads, cpus)
  env = workers.worker_env(threads, keep_host_memory=args.host_memory == "keep")
  running = workers.start_sides(
      sides, threads=threads, env=env, script=__file__, torch_python=args.torch_python,
      torch_modules="torch", missing_torch="install torch + torchvision into .venv-bench; "
      "see requirements-bench.txt")
  conditions = {"cpu_count": os.cpu_count(), "threads": threads, "machine": platform.machine(),
                "host_memory": args.host_memory,
                "python": platform.python_version(), "loadavg_start": os.getloadavg(),
                "rounds": args.rounds, "steps": steps,
                "sides": {s: w.hello for s, w in running.items()}}
  print(json.dumps(conditions), flush=True)
  runs = {}
  try:
    for r in range(args.rounds):
      for case in cases:
        for side, w in running.items():
          for dtype in dtypes:
            if (side == "torch" or case["arch"] == "small_cnn") and dtype != "float32":
              continue
            n = steps[case["arch"]]
            res = w.request(case=case, dtype=dtype, steps=n)
            res["steps"] = n
            runs.setdefault((case_name(case), side, dtype), []).append(res)
      print(f"round {r + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}",
            flush=True)
  finally:
    for w in running.values():
      w.close()
  conditions["loadavg_end"] = os.getloadavg()
  rows = [summarize(parse_case(c), side, dtype, rs) for (c, side, dtype), rs in runs.items()]
  add_ratios(rows)
  print(rows_table(rows), flush=True)
  print(f"load average {conditions['loadavg_start']} -> {conditions['loadavg_end']} on "
        f"{conditions['cpu_count']} CPUs; {threads} threads per side")
  if args.out:
    harness.write_json({"script": "benchmarks/speed/backbones.py", "conditions": conditions,
                        "results": rows, "stamp": harness.stamp()},
                       args.out, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
