r"""Where an objective's (or a model's) forward + backward spends its time: XLA's ops, from a
profiler trace.

  python benchmarks/profiling/op_profile.py --objective=softtriple --batch_size=2048
  python benchmarks/profiling/op_profile.py --objective=triplet --batch_size=512 --top=10
  python benchmarks/profiling/op_profile.py --backbone=small_cnn:28:128 --calls=5

Runs ``jit(value_and_grad)`` of the objective on the batch of ``benchmarks/speed/objectives.py``
(random unit embeddings, D = 512, 8 per class; class weights from the objective's ``init``)
``--calls`` times under ``jax.profiler.trace`` and prints the ops (fusions, dots, custom
calls) by total time per call, with their share of the call's wall time, their shape and the
JAX operation they come from (from the compiled HLO's metadata). Ops that XLA runs at the same
time overlap, and an op dispatched asynchronously (a dot that XLA hands to Eigen's thread pool)
shows only its dispatch, so the shares need not add up to 100 %. Writes the table as JSON to
``--out`` when given.

  python benchmarks/profiling/op_profile.py --trace_dir=runs/tp/bfloat16 --calls=3

reads a trace written elsewhere instead (``benchmarks/speed/train_throughput.py --trace``: the
training step, with its compiled HLO in ``step.hlo.txt``). On a GPU the ops are the kernels
of the device's streams, grouped by the HLO op that launched them (a convolution's cuDNN
kernels, a fusion's kernel); ``busy`` is the time at least one of them ran. Every table also
sums the ops by kind (``benchmarks/hlo.py``: convolutions forward / input gradient / weight
gradient, matmuls, reduction and elementwise fusions, copies, other), the first thing to read
when a step is slower than it should be: on a GPU a ResNet's convolutions are bound by the
tensor cores, its BatchNorm / ReLU / residual fusions by memory. For those, ``GB/s`` (the
bytes of an op's operands and results per second of its time) set against the device's
memory bandwidth says how far an op is from its floor.
"""

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

from absl import app
from absl import flags
import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# pylint: disable=wrong-import-position
from benchmarks import backbone_step
from benchmarks import harness
from benchmarks import hlo
from benchmarks import inputs
from dml_jax import objectives
# pylint: enable=wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string("objective", "softtriple", "Registry name of the objective.")
flags.DEFINE_string("backbone", "", "A model case 'arch:image_size:batch' of "
                    "benchmarks/speed/backbones.py to profile instead of the objective.")
flags.DEFINE_integer("batch_size", 2048, "B.")
flags.DEFINE_integer("dim", 512, "D.")
flags.DEFINE_integer("per_class", 8, "Examples per class.")
flags.DEFINE_integer("calls", 10, "Profiled calls (after 3 warm-up calls).")
flags.DEFINE_integer("top", 15, "Ops printed.")
flags.DEFINE_string("trace_dir", "", "Read this trace (and its step.hlo.txt) instead of "
                    "profiling; --calls = the calls it holds.")
flags.DEFINE_string("out", "", "JSON file of the table ('' = none).")


def trace_events(trace_dir: str) -> list[dict]:
  """The events of the Perfetto trace under ``trace_dir`` (``jax.profiler.trace(...,
  create_perfetto_trace=True)``)."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"), recursive=True)
  if not paths:
    raise FileNotFoundError(f"no Perfetto trace under {trace_dir}")
  with gzip.open(sorted(paths)[-1]) as f:
    trace = json.load(f)
  return trace["traceEvents"] if isinstance(trace, dict) else trace


_HLO_OP_IN_TEXT = re.compile(r"hlo_op=([^,#\s]+)")
_NOT_OPS = ("XLA Modules", "Steps", "XLA TraceMe", "Launch Stats", "Framework Ops",
            "Source code")   # a device plane's lines that are not kernels or ops


def _hlo_op(event: dict) -> str:
  """The HLO op an event names: its ``hlo_op`` argument, else ``hlo_op=NAME`` inside one of
  its arguments (a kernel's annotation) or its name; '' if none."""
  args = event.get("args", {})
  if args.get("hlo_op"):
    return str(args["hlo_op"])
  for text in (*map(str, args.values()), event.get("name", "")):
    found = _HLO_OP_IN_TEXT.search(text)
    if found:
      return found.group(1)
  return ""


def _leaves(events: list[dict]) -> list[dict]:
  """The events that contain no other event of their line (a loop or call op's event spans
  its ops'), line by line in time order."""
  def line(e):
    return e.get("pid"), e.get("tid")

  ordered = sorted(events, key=lambda e: (line(e), e["ts"], -e.get("dur", 0)))
  return [e for e, nxt in zip(ordered, ordered[1:] + [None])
          if nxt is None or line(nxt) != line(e) or nxt["ts"] >= e["ts"] + e.get("dur", 0)]


def op_events(events: list[dict]) -> list[dict]:
  """The events of XLA's ops, each with its op in ``args.hlo_op``: on the device planes
  (``/device:...``) where the trace has any, else on the host (XLA:CPU runs its ops there; an
  op's event carries its name as ``hlo_op``, host and runtime events do not).

  On a device plane: its ``XLA Ops`` line when it has one (the streams' kernels repeat it; a
  loop's event left out for the ops inside it); else its kernels that name their HLO op
  (:func:`_hlo_op`); else, when none does, every kernel under its own name (``other`` to
  :func:`annotate`), so that a trace of another layout still says where the time went."""
  names = {(e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", ""))
           for e in events if e.get("ph") == "M" and e.get("name") in ("process_name",
                                                                       "thread_name")}
  spans = [e for e in events if e.get("ph") == "X"]
  devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
             and str(e.get("args", {}).get("name", "")).startswith("/device:")}

  def named(e, op):
    return dict(e, args={**e.get("args", {}), "hlo_op": op})

  on_devices = [e for e in spans if e.get("pid") in devices
                and names.get((e["pid"], e.get("tid")), "") not in _NOT_OPS]
  if on_devices:
    xla_ops = [e for e in on_devices if names.get((e["pid"], e.get("tid"))) == "XLA Ops"]
    if xla_ops:
      return [named(e, _hlo_op(e) or e["name"]) for e in _leaves(xla_ops)]
    attributed = [named(e, _hlo_op(e)) for e in on_devices if _hlo_op(e)]
    return attributed or [named(e, e["name"]) for e in on_devices]
  return [e for e in spans if e.get("args", {}).get("hlo_op") == e["name"]]


def busy_us(events: list[dict]) -> float:
  """Microseconds during which at least one of ``events`` ran (their union)."""
  total, end = 0.0, float("-inf")
  for e in sorted(events, key=lambda e: e["ts"]):
    start, stop = e["ts"], e["ts"] + e.get("dur", 0)
    if stop > end:
      total += stop - max(start, end)
      end = stop
  return total


def op_times(trace_dir: str, calls: int) -> list[dict]:
  """``[{'op', 'ms_per_call', 'count_per_call'}]`` from the Perfetto trace in ``trace_dir``
  (:func:`op_events`), by decreasing time."""
  return op_totals(op_events(trace_events(trace_dir)), calls)


def op_totals(events: list[dict], calls: int) -> list[dict]:
  """:func:`op_times` of the op events ``events`` (:func:`op_events`)."""
  total, count = collections.Counter(), collections.Counter()
  for e in events:
    name = e["args"]["hlo_op"]
    total[name] += e.get("dur", 0)
    count[name] += 1
  return [{"op": name, "ms_per_call": us / calls / 1e3, "count_per_call": count[name] / calls}
          for name, us in total.most_common()]


def kind_totals(rows: list[dict]) -> list[dict]:
  """``[{'kind', 'ms_per_call', 'ops'}]``: the rows' time summed by ``kind``, in ``hlo.KINDS``
  order (kinds with no op left out)."""
  ms, ops = collections.Counter(), collections.Counter()
  for r in rows:
    ms[r["kind"]] += r["ms_per_call"]
    ops[r["kind"]] += 1
  return [{"kind": k, "ms_per_call": ms[k], "ops": ops[k]} for k in hlo.KINDS if ops[k]]


def annotate(rows: list[dict], hlo_text: str) -> list[dict]:
  """Each row with its ``shape`` and ``from`` (``benchmarks/hlo.py``), ``kind``
  (``hlo.op_kind``; ``other`` for an op the HLO does not define) and ``gb_per_s``: the
  bytes of its operands and results (``hlo.hlo_bytes``) per second of its time, the rate a
  memory-bound op (a fusion) reaches against the device's memory bandwidth (None when the HLO
  does not define the op)."""
  definitions = hlo.hlo_definitions(hlo_text)
  sizes = hlo.op_bytes(definitions)
  for r in rows:
    shape, line = definitions.get(r["op"], ("", ""))
    r["shape"], r["from"] = shape.replace("{1,0}", ""), hlo.origin(line)
    r["kind"] = hlo.op_kind(line) if line else "other"
    moved = sizes.get(r["op"])
    r["gb_per_s"] = (moved * r["count_per_call"] / (r["ms_per_call"] * 1e6)
                     if moved and r["ms_per_call"] > 0 else None)
  return rows


def profile_call(fn, args, *, calls: int) -> tuple[float, list[dict]]:
  """``(wall ms per call, ops)`` of the jitted ``fn(*args)`` (see :func:`op_times`), each op
  with its ``shape`` and ``from`` (the JAX operation) from the compiled HLO."""
  hlo_text = fn.lower(*args).compile().as_text()
  for _ in range(3):
    jax.block_until_ready(fn(*args))
  with tempfile.TemporaryDirectory() as trace_dir:
    start = time.perf_counter()
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(calls):
        jax.block_until_ready(fn(*args))
    wall_ms = (time.perf_counter() - start) / calls * 1e3
    rows = annotate(op_times(trace_dir, calls), hlo_text)
  return wall_ms, rows


def profile(objective: str, *, batch_size: int, dim: int, per_class: int,
            calls: int) -> dict:
  """The profile of ``objective``'s forward + backward (see the module docstring):
  ``{'objective', 'batch_size', 'dim', 'wall_ms_per_call', 'ops': [{'op', 'ms_per_call',
  'count_per_call', 'shape', 'from'}, ...]}``, ops by decreasing time."""
  x, y = inputs.make_batch(batch_size, dim, per_class=per_class)
  obj = objectives.make(objective)
  key = jax.random.key(0)
  params = obj.init(key, num_classes=batch_size // per_class, dim=dim)
  fn = jax.jit(jax.value_and_grad(lambda e, p, y, k: obj.apply(p, e, y, rng=k)[0],
                                  argnums=(0, 1)))
  wall_ms, rows = profile_call(fn, (jax.device_put(x), params, jax.device_put(y), key),
                               calls=calls)
  return {"objective": objective, "batch_size": batch_size, "dim": dim,
          "wall_ms_per_call": wall_ms, "ops": rows}


def profile_backbone(case: str, *, calls: int) -> dict:
  """The same for a model's forward + backward step of ``benchmarks/speed/backbones.py``
  (``case`` = ``arch:image_size:batch``, e.g. ``small_cnn:28:128``; ``conv_impl='auto'``)."""
  model = backbone_step.JaxModel(backbone_step.parse_case(case), dtype="float32", conv_impl="auto")
  wall_ms, rows = profile_call(model.step, (model.params, model.stats, model.images),
                               calls=calls)
  return {"backbone": case, "wall_ms_per_call": wall_ms, "ops": rows}


def profile_trace(trace_dir: str, *, calls: int) -> dict:
  """The same for a trace written elsewhere (``train_throughput.py --trace``): its ops, with
  shapes, origins and kinds from ``trace_dir/step.hlo.txt`` when there is one;
  ``wall_ms_per_call`` is the span from the first op's start to the last op's end, and
  ``busy_ms_per_call`` the time at least one op ran, both per call."""
  events = op_events(trace_events(trace_dir))   # the trace read once
  if not events:
    raise ValueError(f"the trace under {trace_dir} has no XLA op events")
  hlo_path = os.path.join(trace_dir, "step.hlo.txt")
  hlo_text = open(hlo_path).read() if os.path.exists(hlo_path) else ""
  span = max(e["ts"] + e.get("dur", 0) for e in events) - min(e["ts"] for e in events)
  return {"trace_dir": trace_dir, "calls": calls, "wall_ms_per_call": span / calls / 1e3,
          "busy_ms_per_call": busy_us(events) / calls / 1e3,
          "ops": annotate(op_totals(events, calls), hlo_text)}


def main(argv):
  del argv
  if FLAGS.trace_dir:
    report = profile_trace(FLAGS.trace_dir, calls=FLAGS.calls)
    what = f"{FLAGS.trace_dir} (busy {report['busy_ms_per_call']:.1f} ms per call)"
  elif FLAGS.backbone:
    report = profile_backbone(FLAGS.backbone, calls=FLAGS.calls)
    what = f"{FLAGS.backbone} forward + backward"
  else:
    report = profile(FLAGS.objective, batch_size=FLAGS.batch_size, dim=FLAGS.dim,
                     per_class=FLAGS.per_class, calls=FLAGS.calls)
    what = f"{FLAGS.objective}, B = {FLAGS.batch_size}, D = {FLAGS.dim}"
  wall_ms = report["wall_ms_per_call"]
  print(f"{what}: {wall_ms:.1f} ms per call under the profiler ({FLAGS.calls} calls)\n")
  print(harness.markdown_table(
      ["op", "shape", "from", "ms per call", "share of the call", "GB/s (operands + results)"],
      [[r["op"], r["shape"], r["from"], f"{r['ms_per_call']:.2f}",
        f"{100 * r['ms_per_call'] / wall_ms:.0f} %", harness.fmt(r.get("gb_per_s"), ",.0f")]
       for r in report["ops"][:FLAGS.top]]))
  report["kinds"] = kind_totals(report["ops"])
  print("\n" + harness.markdown_table(
      ["kind", "ops", "ms per call", "share of the call"],
      [[k["kind"], k["ops"], f"{k['ms_per_call']:.2f}",
        f"{100 * k['ms_per_call'] / wall_ms:.0f} %"] for k in report["kinds"]]))
  harness.write_json({**report, "stamp": harness.stamp()}, FLAGS.out)


if __name__ == "__main__":
  app.run(main)
