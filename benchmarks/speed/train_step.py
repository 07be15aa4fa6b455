r"""The main job's training step, dml_jax beside PyTorch + pytorch-metric-learning (PML).

  python benchmarks/speed/train_step.py --out=runs/train_step.json    # docs/performance.md (~5 min)
  python benchmarks/speed/train_step.py --cases=8:128 --sides=dml_jax,torch --rounds=8
  python benchmarks/speed/train_step.py --profile --cases=8:128 --sides=dml_jax  # a step's parts
  python benchmarks/speed/train_step.py --smoke                            # seconds, no torch

The job is ``configs/digits_evenodd_eps.py``: the small CNN (conv-ReLU-BatchNorm x2, 2x2
max-pool, dense 128, dense 2, no normalisation), batch 128 = 2 classes x 64, triplet loss with
the easy positive and the semi-hard negative on squared Euclidean distances (margin 0.2), Adam
1e-3. A case is ``image_size:batch``: ``8`` trains on scikit-learn's 8x8 digits exactly as the
config does; any other size (``28``: MNIST-shaped) on random ``[6000, S, S, 1]`` images with
two balanced classes, registered as an in-memory dataset so that the same ``training.build``
makes the model, sampler and optimizer.

Sides, each in its own worker process (own thread pool, compiled once), taking turns case by
case for ``--rounds`` rounds so that a change in the machine's load hits every side:

* ``dml_jax``: the training loop's pieces as ``training.train_and_evaluate`` feeds them, on
  the state built by ``training.build``: ``training.train_batches`` (the n-per-class sampler's
  batches), ``parallel.global_batch``, ``training.make_step_key_fn``,
  ``training.make_guarded_step`` (the train state donated);
  every ``--chunk_steps`` steps the log step's host sync (``halted`` and the metrics fetched,
  averaged). Left out: the progress bar, the metrics.jsonl line, checkpoint writes (every 500
  steps in the config) and evaluation.
* ``torch``: the same job written as a PyTorch + PML user would: the same CNN (NCHW, eager),
  PML's ``MPerClassSampler(m=64)`` drawing the batch indices from the same training arrays (a
  tensor in memory, indexed), ``BatchEasyHardMiner(pos_strategy='easy',
  neg_strategy='semihard')`` + ``TripletMarginLoss(margin=0.2)``, both with
  ``LpDistance(power=2, normalize_embeddings=False)``, ``torch.optim.Adam(lr=1e-3)``. Run by
  ``--torch_python`` (default: this Python if it imports torch + PML, else
  ``.venv-bench/bin/python``); skipped with a message when there is none. (PML reduces the
  triplet losses by the mean over non-zero ones, we by the mean over valid anchors: the same
  work, a different scalar.)

Threads: XLA:CPU's pool is as large as the CPUs the process may use; ``--threads`` (default
2) restricts every worker to that many CPUs (``os.sched_setaffinity``) and sets
``torch.set_num_threads`` to it, so both sides use the same cores.

A measurement is one chunk of ``--chunk_steps`` steps ended by a host sync (for dml_jax the
log step's, which is where the real loop waits), as examples/s = steps x batch / seconds;
``--warmup`` chunks first, untimed (compilation, torch's first calls). The table gives the
median and inter-quartile range over all chunks of all rounds, the ratio of the medians, and
the median of the per-round ratios (the sides of one round ran back to back: the ratio least
hurt by other processes). The load average before and after is recorded.

``--profile`` adds, per dml_jax case, where one step's time goes: the device compute of the
jitted step alone (inputs ready, synced every step), split into the model's forward + backward
and the objective's forward + backward; the host work the loop does per step (batch assembly
from the sampler, ``global_batch``, ``step_key``, the asynchronous dispatch of the step); the
log step's sync.

``--startup`` instead measures start-up, cold against warm compilation cache: each of
:data:`STARTUP_RUNS` (the main job, its smoke config; ResNet-50 at 224 px, batch 16, on the digits
written as PNG files) runs ``train.py`` twice with a fresh ``--compilation_cache`` directory
(cold, then warm; a new workdir each time) and records the seconds from launching the process
to the log line of step 1 (``--config.log_every_steps=1 --noprogress``) and to its exit
(``--startup_first_step_only`` stops it after step 1).

Prints a markdown table, writes JSON (``--out``). One file of about 600 lines: both sides'
loops, the worker protocol's requests and the start-up runs are what this benchmark measures,
and the worker process runs this same file (``--worker``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from benchmarks import harness  # pylint: disable=wrong-import-position
from benchmarks import workers  # pylint: disable=wrong-import-position
DEFAULT_CASES = "8:128,28:128"
SCRIPT = "benchmarks/speed/train_step.py"
SMOKE_CASES = "8:16"
JAX_SIDES = ("dml_jax",)
SIDES = JAX_SIDES + ("torch",)
CONFIG = "configs/digits_evenodd_eps.py"
SYNTHETIC_EXAMPLES = 6000
MARGIN, LEARNING_RATE = 0.2, 1e-3


def parse_case(text: str) -> dict:
  """``'image_size:batch'`` -> ``{'image_size', 'batch_size'}``."""
  parts = text.split(":")
  if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[1]) % 2:
    raise ValueError(f"case {text!r} must be image_size:batch with an even batch (2 classes).")
  return {"image_size": int(parts[0]), "batch_size": int(parts[1])}


# ---- the dml_jax side (imports jax only in its worker) ----

def jax_config(case: dict):
  """The main job's config for ``case`` (8 px: the digits; else the random dataset)."""
  from configs import digits_evenodd_eps  # pylint: disable=import-outside-toplevel
  c = digits_evenodd_eps.get_config()
  c.batch_size = case["batch_size"]
  c.data.group_size = case["batch_size"] // 2
  c.log_every_steps = 10 ** 9
  c.num_train_steps = 10 ** 9
  if case["image_size"] != 8:
    register_random_dataset(case["image_size"])
    c.data.name = f"bench_random_{case['image_size']}"
    c.eval.splits = ("test",)
  return c


def register_random_dataset(size: int) -> None:
  """``bench_random_<size>``: random normal images ``[6000, size, size, 1]``, two balanced
  classes (MNIST-shaped for 28), in ``data.DATASETS`` (a plain dict) for ``training.build``."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from dml_jax import data  # pylint: disable=import-outside-toplevel

  def load():
    rng = np.random.default_rng(size)
    n = SYNTHETIC_EXAMPLES
    images = rng.standard_normal((n, size, size, 1), dtype=np.float32)
    labels = np.arange(n) % 2
    return {"train": data.Split(images, labels, name=f"random{size}:train"),
            "test": data.Split(images[:256], labels[:256], name=f"random{size}:test")}

  data.DATASETS[f"bench_random_{size}"] = load


class JaxLoop:
  """The loop of ``training.train_and_evaluate`` (see the module docstring), resumable chunk
  by chunk."""

  def __init__(self, case: dict):
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    from dml_jax import parallel  # pylint: disable=import-outside-toplevel
    from dml_jax.run import training  # pylint: disable=import-outside-toplevel
    self.jax, self.np, self.parallel, self.training = jax, np, parallel, training
    self.config = c = jax_config(case)
    self.setup = setup = training.build(c)
    self.train_step = training.make_guarded_step(setup)
    self.step_key = training.make_step_key_fn(c.seed)
    # a copy: the step donates its input state, and setup.init_state must stay valid
    self.state = jax.tree.map(jnp.copy, setup.init_state)
    self.halted = parallel.replicate(setup.mesh, jnp.zeros((), jnp.int32))
    self.batches = training.train_batches(setup)
    self.examples = c.batch_size

  def chunk(self, steps: int) -> dict:
    """``steps`` loop steps and the log step's sync; returns the mean metrics."""
    c, jax, np = self.config, self.jax, self.np
    history = {}
    for _ in range(steps):
      batch_step, local_images, local_labels = next(self.batches)
      step = batch_step + 1
      images, labels = self.parallel.global_batch(self.setup.mesh, local_images, local_labels,
                                                  batch_size=c.batch_size)
      self.state, self.halted, history[step] = self.train_step(
          self.state, self.halted, images, labels, self.step_key(step))
    if int(jax.device_get(self.halted)):
      raise FloatingPointError(f"non-finite loss at step {int(self.halted)}")
    rows = list(jax.device_get(history).values())
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def jax_profile(case: dict, *, steps: int) -> dict:
  """Where one step of the ``dml_jax`` loop goes, in ms per step (see the module docstring)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  loop = JaxLoop(case)
  setup, parallel, training = loop.setup, loop.parallel, loop.training
  b = loop.config.batch_size
  loop.chunk(3)  # compile

  def per_step(fn, n=steps):
    out = fn(0)
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for i in range(n):
      out = fn(i)
    jax.block_until_ready(out)
    return 1e3 * (time.perf_counter() - t0) / n

  prepared = [next(loop.batches) for _ in range(steps + 1)]
  ready = [parallel.global_batch(setup.mesh, x, y, batch_size=b) for _, x, y in prepared]
  keys = [training.step_key(loop.config.seed, s + 1) for s, _, _ in prepared]
  jax.block_until_ready((ready, keys))
  out = {}
  out["host_batch_ms"] = per_step(lambda i: next(loop.batches))
  out["global_batch_ms"] = per_step(
      lambda i: parallel.global_batch(setup.mesh, *prepared[i][1:], batch_size=b))
  out["eager_step_key_ms"] = per_step(lambda i: training.step_key(loop.config.seed, i + 1))
  out["step_key_ms"] = per_step(lambda i: loop.step_key(i + 1))

  def device_step(i):
    loop.state, loop.halted, m = loop.train_step(loop.state, loop.halted, *ready[i], keys[i])
    jax.block_until_ready(loop.state)
    return m

  out["device_step_ms"] = per_step(device_step)

  dispatch = []

  def async_step(i):
    t0 = time.perf_counter()
    loop.state, loop.halted, m = loop.train_step(loop.state, loop.halted, *ready[i], keys[i])
    dispatch.append(time.perf_counter() - t0)
    return m

  out["async_steps_ms"] = per_step(async_step)
  out["dispatch_ms"] = 1e3 * statistics.median(dispatch)

  # the device compute split: the model's forward + backward (loss = sum of the embeddings),
  # and the objective's forward + backward on fixed embeddings
  state = loop.state
  images, labels = ready[0]

  @jax.jit
  def model_fwd_bwd(params, batch_stats, images):
    def f(p):
      model = nnx.merge(setup.train_graphdef, p, batch_stats, copy=True)
      return jnp.sum(model(images))
    return jax.grad(f)(params)

  @jax.jit
  def objective_fwd_bwd(obj_params, embeddings, labels, key):
    def f(e):
      return setup.objective.apply(obj_params, e, labels, rng=key)[0]
    return jax.grad(f)(embeddings)

  embeddings = jax.random.normal(jax.random.key(0), (b, loop.config.model.embedding_dim))
  out["model_fwd_bwd_ms"] = per_step(
      lambda i: model_fwd_bwd(state["params"], state["batch_stats"], images))
  out["objective_fwd_bwd_ms"] = per_step(
      lambda i: objective_fwd_bwd(state["objective"], embeddings, labels, keys[0]))
  chunk = min(20, steps)
  loop.chunk(chunk)
  t0 = time.perf_counter()
  loop.chunk(chunk)
  out["loop_ms"] = 1e3 * (time.perf_counter() - t0) / chunk
  history = {}
  for i in range(chunk):
    loop.state, loop.halted, history[i] = loop.train_step(loop.state, loop.halted, *ready[i],
                                                          keys[i])
  jax.block_until_ready((loop.state, history))
  t0 = time.perf_counter()
  int(jax.device_get(loop.halted))
  rows = list(jax.device_get(history).values())
  {k: float(sum(float(r[k]) for r in rows) / len(rows)) for k in rows[0]}  # noqa: B018
  out["log_sync_ms_per_log_step"] = 1e3 * (time.perf_counter() - t0)
  out["steps"] = steps
  return out


# ---- the PyTorch + PML side (imports torch only in its worker) ----

class TorchLoop:
  """The same job in PyTorch + PML (see the module docstring)."""

  def __init__(self, case: dict, *, data_file: str):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel
    from pytorch_metric_learning import distances, losses, miners, samplers  # pylint: disable=import-outside-toplevel
    nn = torch.nn
    torch.manual_seed(0)
    arrays = np.load(data_file)
    size, b = case["image_size"], case["batch_size"]
    self.images = torch.from_numpy(np.ascontiguousarray(arrays["images"].transpose(0, 3, 1, 2)))
    self.labels = torch.from_numpy(arrays["labels"].astype(np.int64))
    self.model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(32, eps=1e-5, momentum=0.1),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(64, eps=1e-5, momentum=0.1),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear((size // 2) ** 2 * 64, 128), nn.ReLU(),
        nn.Linear(128, 2)).train()
    distance = distances.LpDistance(power=2, normalize_embeddings=False)
    self.miner = miners.BatchEasyHardMiner(pos_strategy="easy", neg_strategy="semihard",
                                           distance=distance)
    self.loss_fn = losses.TripletMarginLoss(margin=MARGIN, distance=distance)
    self.opt = torch.optim.Adam(self.model.parameters(), lr=LEARNING_RATE)
    self.sampler = samplers.MPerClassSampler(self.labels, m=b // 2, batch_size=b)
    self.order = iter(())
    self.batch_size = b
    self.torch = torch

  def next_indices(self):
    idx = [next(self.order, None) for _ in range(self.batch_size)]
    if idx[-1] is None:
      self.order = iter(list(self.sampler))
      idx = [next(self.order) for _ in range(self.batch_size)]
    return self.torch.tensor(idx)

  def chunk(self, steps: int) -> dict:
    total = 0.0
    for _ in range(steps):
      idx = self.next_indices()
      images, labels = self.images[idx], self.labels[idx]
      self.opt.zero_grad(set_to_none=True)
      embeddings = self.model(images)
      loss = self.loss_fn(embeddings, labels, self.miner(embeddings, labels))
      loss.backward()
      self.opt.step()
      total += float(loss)  # as a user logging the loss; torch is synchronous anyway
    return {"loss": total / steps}


def torch_conditions() -> dict:
  import pytorch_metric_learning  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  return {"torch": torch.__version__, "pytorch_metric_learning": pytorch_metric_learning.__version__,
          "torch_threads": torch.get_num_threads()}


# ---- workers and the orchestration ----

def worker(side: str, threads: int) -> None:
  """Answers one JSON request per stdin line with one JSON result line on stdout."""
  loops = {}

  def handle(request: dict) -> dict:
    case = request["case"]
    key = json.dumps(case, sort_keys=True)
    if request.get("profile"):
      return jax_profile(case, steps=request["steps"])
    if request.get("export_data"):
      return export_data(case, request["export_data"])
    first = None
    if key not in loops:
      t0 = time.perf_counter()
      loops[key] = (TorchLoop(case, data_file=request["data_file"]) if side == "torch"
                    else JaxLoop(case))
      loops[key].chunk(1)
      first = time.perf_counter() - t0
      for _ in range(request["warmup"]):
        loops[key].chunk(request["chunk_steps"])
    seconds, metrics = [], {}
    for _ in range(request["chunks"]):
      t0 = time.perf_counter()
      metrics = loops[key].chunk(request["chunk_steps"])
      seconds.append(time.perf_counter() - t0)
    return {"chunk_s": seconds, "build_and_first_step_s": first, "last_metrics": metrics}

  workers.serve(side, threads, handle, torch_conditions=torch_conditions)


def export_data(case: dict, path: str) -> dict:
  """Writes the case's training arrays (what ``training.build`` loads) for the torch side."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from dml_jax import data  # pylint: disable=import-outside-toplevel
  c = jax_config(case)
  train = data.load(c.data.name)["train"]
  np.savez(path, images=np.asarray(train.images), labels=np.asarray(train.labels))
  return {"path": path, "shape": list(np.shape(train.images))}


def summarize(case: dict, side: str, runs: list[dict]) -> dict:
  """One row: examples/s of every timed chunk of every round of a (case, side)."""
  errors = [r["error"] for r in runs if "error" in r]
  if errors:
    return {**case, "side": side, "error": errors[0]}
  steps = runs[0]["chunk_steps"]
  rates = [[steps * case["batch_size"] / s for s in r["chunk_s"]] for r in runs]
  flat = [x for rs in rates for x in rs]
  return {**case, "side": side, "chunk_steps": steps,
          "examples_per_s": harness.quartiles(flat),
          "round_medians": [statistics.median(r) for r in rates],
          "ms_per_step": 1e3 * case["batch_size"] / harness.quartiles(flat)["median"],
          "build_and_first_step_s": runs[0]["build_and_first_step_s"],
          "last_metrics": runs[-1]["last_metrics"]}


def add_ratios(rows: list[dict]) -> None:
  """``ratio_to_torch`` (of the medians) and ``paired_ratio`` (median over rounds of the
  round's ratio) on every dml_jax row whose case has a torch row."""
  harness.add_ratios(rows, case=lambda r: (r["image_size"], r["batch_size"]),
                     value=lambda r: r["examples_per_s"]["median"], rounds="round_medians")


PROFILE_PARTS = (
    ("device_step_ms", "the jitted step (forward, backward, update), synchronised"),
    ("model_fwd_bwd_ms", "of which the model's forward + backward"),
    ("objective_fwd_bwd_ms", "of which the objective's forward + backward"),
    ("host_batch_ms", "host: the sampler's batch"),
    ("global_batch_ms", "host: `global_batch` (onto the mesh)"),
    ("step_key_ms", "host: the step's PRNG key"),
    ("dispatch_ms", "dispatching the step (asynchronous)"),
    ("loop_ms", "the training loop's chunk, per step"),
    ("log_sync_ms_per_log_step", "the log step's sync (once per log interval)"))
STARTUP_TEXT = {
    "digits_evenodd_eps": "the main job (`configs/digits_evenodd_eps.py`)",
    "digits_evenodd_eps:smoke": "its smoke config (20 steps + evaluation)",
    "resnet50_224": "ResNet-50, 224 px, batch 16 (`digits_image_folder.py:smoke` on PNG files)"}


def table(report: dict) -> str:
  """The docs table of a written report: the start-up table of a ``--startup`` report, else
  :func:`rows_table` of its results and, where profiled, :func:`profile_table`."""
  if "startup" in report:
    first_only = report["conditions"].get(
        "first_step_only", "--startup_first_step_only" in report["stamp"]["command"])
    return startup_table(report["startup"], first_step_only=first_only)
  text = (f"Both sides {harness.HOST_MEMORY[report['conditions']['host_memory']]}; "
          f"{report['conditions']['rounds']} rounds of {report['conditions']['chunks']} timed "
          "chunks.\n\n" + rows_table(report["results"]))
  if report.get("profile"):
    text += "\n\n" + profile_table(report["profile"])
  return text


def profile_table(profiles: dict) -> str:
  """Where a dml_jax step goes (``--profile``): ms per step of each part, per case."""
  keys = [k for k, p in profiles.items() if "error" not in p]
  return harness.markdown_table(
      ["part (dml_jax, ms per step)"] + [k.replace("px/", " px, batch ") for k in keys],
      [[text] + [f"{profiles[k][name]:.2f}" for k in keys] for name, text in PROFILE_PARTS
       if all(name in profiles[k] for k in keys)])


def startup_table(results: dict, *, first_step_only: bool = False) -> str:
  """Seconds to the first step's log line and to the exit, cold and warm compilation cache."""
  return harness.markdown_table(
      ["run", "first step, cold cache (s)", "warm (s)", "exit, cold (s)", "warm (s)"],
      [[STARTUP_TEXT.get(name, name)] + [
          "— (stopped after step 1)" if m == "exit_s" and first_step_only
          else harness.fmt(row[k][m], ".1f")
          for m in ("first_step_s", "exit_s") for k in ("cold", "warm")]
       for name, row in results.items()])


def rows_table(rows: list[dict]) -> str:
  """The markdown table: examples/s (median, IQR), ms per step and the ratios to torch."""
  out = []
  for r in rows:
    if "error" in r:
      out.append([r["image_size"], r["batch_size"], r["side"], "error", "", "", ""])
      continue
    e = r["examples_per_s"]
    out.append([r["image_size"], r["batch_size"], r["side"],
                f"{e['median']:,.0f} ({e['q25']:,.0f}–{e['q75']:,.0f})",
                f"{r['ms_per_step']:.1f}",
                f"{r['ratio_to_torch']:.2f}×" if "ratio_to_torch" in r else "—",
                f"{r['paired_ratio']:.2f}×" if "paired_ratio" in r else "—"])
  return harness.markdown_table(["px", "batch", "side", "examples/s median (IQR)", "ms/step",
                                 "/ torch (medians)", "/ torch (paired rounds)"], out)


def print_profile(profiles: dict) -> None:
  for key, p in profiles.items():
    if "error" in p:
      print(f"profile {key}: {p['error']}")
      continue
    print(f"\nprofile {key} (ms per step, {p['steps']} steps each):")
    for k, v in p.items():
      if k.endswith("_ms") or k.endswith("_step"):
        print(f"  {k:28s} {v:8.2f}")


STARTUP_RUNS = {
    "digits_evenodd_eps": ["--config=configs/digits_evenodd_eps.py"],
    "digits_evenodd_eps:smoke": ["--config=configs/digits_evenodd_eps.py:smoke"],
    "resnet50_224": ["--config=configs/digits_image_folder.py:smoke",
                     "--config.model.name=resnet50", "--config.data.image_size=224",
                     "--config.data.resize_size=256", "--config.data.options.root={data}"],
}


def time_train_py(args: list[str], *, first_step_only: bool) -> dict:
  """Runs ``python train.py ARGS --noprogress --config.log_every_steps=1``; the seconds from
  launch to the ``step 1/`` log line and to the exit (or the kill after step 1)."""
  cmd = [sys.executable, os.path.join(REPO, "train.py"), *args, "--noprogress",
         "--config.log_every_steps=1", "--alsologtostderr"]
  t0 = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
  first, tail = None, []
  for line in proc.stderr:
    tail = (tail + [line])[-20:]
    if first is None and "step 1/" in line:
      first = time.perf_counter() - t0
      if first_step_only:
        proc.terminate()
        break
  rc = proc.wait()
  total = time.perf_counter() - t0
  result = {"first_step_s": first, "exit_s": total, "returncode": rc}
  if first is None:
    result["error"] = "".join(tail)[-2000:]
  return result


def startup(names: list[str], *, first_step_only: bool) -> dict:
  """Cold and warm compilation cache for each of ``names`` (:data:`STARTUP_RUNS`)."""
  results = {}
  with tempfile.TemporaryDirectory(prefix="train_step_startup_") as tmp:
    data = os.path.join(tmp, "digits_png")
    if any("{data}" in a for n in names for a in STARTUP_RUNS[n]):
      from dml_jax.data import digits  # pylint: disable=import-outside-toplevel
      digits.write_digit_images(data)
    for name in names:
      cache = os.path.join(tmp, f"cache_{name}")
      row = {}
      for kind in ("cold", "warm"):
        args = [a.format(data=data) for a in STARTUP_RUNS[name]]
        args += [f"--workdir={os.path.join(tmp, f'work_{name}_{kind}')}",
                 f"--compilation_cache={cache}"]
        row[kind] = time_train_py(args, first_step_only=first_step_only)
        print(f"{name} {kind}: {row[kind]}", flush=True)
      row["cache_mb"] = sum(os.path.getsize(os.path.join(d, f))
                            for d, _, fs in os.walk(cache) for f in fs) / 2 ** 20
      results[name] = row
  print(startup_table(results, first_step_only=first_step_only))
  return results


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated image_size:batch")
  parser.add_argument("--sides", default="dml_jax,torch",
                      help=f"comma-separated, from {', '.join(SIDES)}")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--warmup", type=int, default=1, help="untimed chunks (first round)")
  parser.add_argument("--chunks", type=int, default=2, help="timed chunks per round")
  parser.add_argument("--chunk_steps", default="8:50,28:10",
                      help="steps per chunk: one number, or image_size:steps pairs")
  parser.add_argument("--threads", type=int, default=2, help="CPUs (and torch threads) per side")
  parser.add_argument("--host_memory", default="default", choices=("keep", "default"),
                      help="default: glibc's malloc defaults on every side; keep: every "
                      "side's worker keeps freed host memory (dml_jax/run/host_memory.py)")
  parser.add_argument("--profile", action="store_true", help="profile the dml_jax step too")
  parser.add_argument("--profile_steps", type=int, default=30)
  parser.add_argument("--torch_python", default="",
                      help="Python with torch + pytorch-metric-learning (default: see above)")
  parser.add_argument("--smoke", action="store_true",
                      help=f"--cases={SMOKE_CASES}, dml_jax only, 1 round of 1 chunk of 3 steps")
  parser.add_argument("--startup", default="",
                      help=f"comma-separated, from {', '.join(STARTUP_RUNS)}: cold/warm start-up")
  parser.add_argument("--startup_first_step_only", action="store_true",
                      help="stop train.py after its first step")
  parser.add_argument("--out", default="")
  parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    worker(args.worker, args.threads)
    return 0
  if args.startup:
    names = [n for n in args.startup.split(",") if n]
    unknown = sorted(set(names) - set(STARTUP_RUNS))
    if unknown:
      raise ValueError(f"unknown --startup runs {unknown}; allowed: {', '.join(STARTUP_RUNS)}.")
    conditions = {"cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(),
                  "first_step_only": args.startup_first_step_only}
    results = startup(names, first_step_only=args.startup_first_step_only)
    conditions["loadavg_end"] = os.getloadavg()
    print(f"load average {conditions['loadavg_start']} -> {conditions['loadavg_end']}")
    if args.out:
      harness.write_json({"script": SCRIPT, "conditions": conditions, "startup": results,
                          "stamp": harness.stamp()},
                         args.out, indent=1)
    return 0
  if args.smoke:
    args.cases, args.sides, args.rounds, args.chunks = SMOKE_CASES, "dml_jax", 1, 1
    args.warmup, args.chunk_steps, args.profile_steps = 0, "3", 3
  cases = [parse_case(c) for c in args.cases.split(",") if c]
  sides = [s for s in args.sides.split(",") if s]
  unknown = sorted(set(sides) - set(SIDES))
  if unknown:
    raise ValueError(f"unknown sides {unknown}; allowed: {', '.join(SIDES)}.")
  if ":" in args.chunk_steps:
    per_size = dict(p.split(":") for p in args.chunk_steps.split(","))
    chunk_steps = {c["image_size"]: int(per_size.get(str(c["image_size"]), 10)) for c in cases}
  else:
    chunk_steps = {c["image_size"]: int(args.chunk_steps) for c in cases}
  threads = min(args.threads, harness.available_cpus())
  env = workers.worker_env(threads, keep_host_memory=args.host_memory == "keep")
  running = workers.start_sides(
      sides, threads=threads, env=env, script=__file__, torch_python=args.torch_python,
      torch_modules="torch, pytorch_metric_learning",
      missing_torch="pip install -r requirements-bench.txt into .venv-bench")
  conditions = {"cpu_count": os.cpu_count(), "threads": threads, "machine": platform.machine(),
                "host_memory": args.host_memory,
                "python": platform.python_version(), "loadavg_start": os.getloadavg(),
                "rounds": args.rounds, "warmup_chunks": args.warmup, "chunks": args.chunks,
                "chunk_steps": chunk_steps, "config": CONFIG,
                "sides": {s: w.hello for s, w in running.items()}}
  print(json.dumps(conditions))
  runs, profiles = {}, {}
  data_dir = tempfile.mkdtemp(prefix="train_step_bench_")
  try:
    data_files = {}
    if "torch" in running:
      exporter = next((w for s, w in running.items() if s != "torch"), None)
      for case in cases:
        path = os.path.join(data_dir, f"train_{case['image_size']}.npz")
        if exporter is None:
          raise SystemExit("the torch side needs a dml_jax side to load the data")
        res = exporter.request(case=case, export_data=path)
        if "error" in res:
          raise SystemExit(f"exporting the data failed: {res['error']}")
        data_files[json.dumps(case)] = path
    for r in range(args.rounds):
      for case in cases:
        for side, w in running.items():
          res = w.request(case=case, warmup=args.warmup, chunks=args.chunks,
                          chunk_steps=chunk_steps[case["image_size"]],
                          data_file=data_files.get(json.dumps(case), ""))
          res["chunk_steps"] = chunk_steps[case["image_size"]]
          runs.setdefault((json.dumps(case), side), []).append(res)
      print(f"round {r + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}",
            flush=True)
    if args.profile and "dml_jax" in running:
      for case in cases:
        key = f"{case['image_size']}px/{case['batch_size']}"
        profiles[key] = running["dml_jax"].request(case=case, profile=True,
                                                   steps=args.profile_steps)
  finally:
    for w in running.values():
      w.close()
    for f in os.listdir(data_dir):
      os.remove(os.path.join(data_dir, f))
    os.rmdir(data_dir)
  conditions["loadavg_end"] = os.getloadavg()
  rows = [summarize(json.loads(c), side, rs) for (c, side), rs in runs.items()]
  add_ratios(rows)
  for row in rows:
    if "error" in row:
      print(f"{row['image_size']} px, {row['side']}: {row['error']}")
  print(rows_table(rows), flush=True)
  print_profile(profiles)
  print(f"load average {conditions['loadavg_start']} -> {conditions['loadavg_end']} on "
        f"{conditions['cpu_count']} CPUs; {threads} threads per side")
  if args.out:
    harness.write_json({"script": SCRIPT, "conditions": conditions, "results": rows,
                        "profile": profiles, "stamp": harness.stamp()}, args.out, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
