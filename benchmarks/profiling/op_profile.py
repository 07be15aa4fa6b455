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
flags.DEFINE_string("out", "", "JSON file of the table ('' = none).")

def op_times(trace_dir: str, calls: int) -> list[dict]:
  """``[{'op', 'ms_per_call', 'count_per_call'}]`` from the Perfetto trace in ``trace_dir``,
  by decreasing time."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"), recursive=True)
  if not paths:
    raise FileNotFoundError(f"no Perfetto trace under {trace_dir}")
  with gzip.open(paths[0]) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  total, count = collections.Counter(), collections.Counter()
  for e in events:
    # an XLA op's event carries its name as hlo_op (host and runtime events do not)
    if e.get("ph") == "X" and e.get("args", {}).get("hlo_op") == e["name"]:
      total[e["name"]] += e.get("dur", 0)
      count[e["name"]] += 1
  return [{"op": name, "ms_per_call": us / calls / 1e3, "count_per_call": count[name] / calls}
          for name, us in total.most_common()]


HLO_DEF = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)|\S+) ")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def hlo_origins(hlo_text: str) -> dict[str, tuple[str, str]]:
  """``{op name: (result shape, JAX operation)}`` from compiled HLO text."""
  out = {}
  for line in hlo_text.splitlines():
    definition = HLO_DEF.match(line)
    if definition:
      op_name = OP_NAME.search(line)
      origin = op_name.group(1).split("/", 1)[-1] if op_name else ""   # less "jit(...)/"
      out.setdefault(definition.group(1), (definition.group(2).replace("{1,0}", ""), origin))
  return out


def profile_call(fn, args, *, calls: int) -> tuple[float, list[dict]]:
  """``(wall ms per call, ops)`` of the jitted ``fn(*args)`` (see :func:`op_times`), each op
  with its ``shape`` and ``from`` (the JAX operation) from the compiled HLO."""
  origins = hlo_origins(fn.lower(*args).compile().as_text())
  for _ in range(3):
    jax.block_until_ready(fn(*args))
  with tempfile.TemporaryDirectory() as trace_dir:
    start = time.perf_counter()
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(calls):
        jax.block_until_ready(fn(*args))
    wall_ms = (time.perf_counter() - start) / calls * 1e3
    rows = op_times(trace_dir, calls)
  for r in rows:
    r["shape"], r["from"] = origins.get(r["op"], ("", ""))
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


def main(argv):
  del argv
  if FLAGS.backbone:
    report = profile_backbone(FLAGS.backbone, calls=FLAGS.calls)
    what = f"{FLAGS.backbone} forward + backward"
  else:
    report = profile(FLAGS.objective, batch_size=FLAGS.batch_size, dim=FLAGS.dim,
                     per_class=FLAGS.per_class, calls=FLAGS.calls)
    what = f"{FLAGS.objective}, B = {FLAGS.batch_size}, D = {FLAGS.dim}"
  wall_ms = report["wall_ms_per_call"]
  print(f"{what}: {wall_ms:.1f} ms per call under the profiler ({FLAGS.calls} calls)\n")
  print(harness.markdown_table(
      ["op", "shape", "from", "ms per call", "share of the call"],
      [[r["op"], r["shape"], r["from"], f"{r['ms_per_call']:.2f}",
        f"{100 * r['ms_per_call'] / wall_ms:.0f} %"] for r in report["ops"][:FLAGS.top]]))
  harness.write_json({**report, "stamp": harness.stamp()}, FLAGS.out)


if __name__ == "__main__":
  app.run(main)
