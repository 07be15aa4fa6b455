r"""Cost of global-batch mining across devices: loss + mining step time on 1 vs N devices.

  python benchmarks/speed/parallel.py [--batch_sizes=512,2048] [--devices=1,8] \
      [--out=runs/bench_parallel.json]

For each objective and global batch B, times ``value_and_grad`` of the loss w.r.t. the
embeddings ``[B, D]`` sharded over a ('data',) mesh of 1 and of N devices (median of
--repeats runs after compilation), and the all-gather of the embeddings alone (what global
mining adds), printing the all-gather's share of the step. On this CPU-only machine the N
devices are fake (XLA_FLAGS=--xla_force_host_platform_device_count, set below when absent) and
share 2 cores, so the N-device times show the overhead, not a speed-up; on a multi-GPU machine
the same command reports the real scaling.
"""

import os
import sys

if __name__ == "__main__" and ("xla_force_host_platform_device_count"
                               not in os.environ.get("XLA_FLAGS", "")):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks import harness  # pylint: disable=g-import-not-at-top
from dml_jax import objectives  # pylint: disable=g-import-not-at-top
from dml_jax import parallel
from dml_jax import similarity

SCRIPT = "benchmarks/speed/parallel.py"


def _define_flags():
  """The command line (defined only when run as a script, so the docs can import ``table``)."""
  flags.DEFINE_list("batch_sizes", ["512", "2048"], "Global batch sizes.")
  flags.DEFINE_list("devices", ["1", "8"], "Device counts to compare.")
  flags.DEFINE_list("objectives", ["nca", "triplet", "multi_similarity", "margin", "dro_topk"],
                    "Objectives (default hyper-parameters); unregistered ones are skipped.")
  flags.DEFINE_integer("dim", 512, "Embedding dimension.")
  flags.DEFINE_integer("per_class", 8, "Examples per class.")
  flags.DEFINE_integer("repeats", 10, "Timed runs (median reported).")
  flags.DEFINE_string("out", "runs/bench_parallel.json", "JSON output path.")
  return flags.FLAGS


def table(report: dict) -> str:
  """ms of loss + mining forward + backward per objective and batch size on each device count,
  with the all-gather that global mining needs and its share of the step."""
  steps = {}
  for r in report["rows"]:
    steps.setdefault((r["objective"], r["batch_size"]), {})[r["devices"]] = r
  counts = sorted({r["devices"] for r in report["rows"]})
  rows = []
  for (name, b), by_n in steps.items():
    most = by_n[max(by_n)]
    rows.append([f"`{name}`", b, *(harness.fmt(by_n[n]["step_ms"] if n in by_n else None, ".1f")
                                   for n in counts),
                 f"{most['all_gather_ms']:.1f}", f"{100 * most['all_gather_share']:.1f} %"])
  return harness.markdown_table(
      ["objective", "B", *(f"{n} device{'s' if n > 1 else ''} (ms)" for n in counts),
       f"all-gather on {max(counts)} (ms)", "all-gather share"], rows)


def main(argv):
  del argv
  rows = []
  names = [n for n in FLAGS.objectives if n in objectives.names()]
  for b in map(int, FLAGS.batch_sizes):
    rng = np.random.default_rng(0)
    emb = np.asarray(similarity.l2_normalize(rng.normal(size=(b, FLAGS.dim)).astype(np.float32)))
    labels = np.repeat(np.arange(b // FLAGS.per_class), FLAGS.per_class).astype(np.int32)
    for n in map(int, FLAGS.devices):
      mesh = parallel.make_mesh(n)
      rep, sh = parallel.replicated(mesh), parallel.batch_sharded(mesh)
      e, y = parallel.global_batch(mesh, emb, labels, batch_size=b)
      key = parallel.replicate(mesh, jax.random.key(0))
      gather = jax.jit(lambda x: x * 1.0, in_shardings=sh, out_shardings=rep)
      t_gather = 1e-3 * harness.time_jitted(gather, e, repeats=FLAGS.repeats) if n > 1 else 0.0
      for name in names:
        obj = objectives.make(name)
        params = parallel.replicate(mesh, obj.init(jax.random.key(0),
                                                   num_classes=b // FLAGS.per_class,
                                                   dim=FLAGS.dim))
        step = jax.jit(jax.value_and_grad(lambda p, x, l, k: obj.apply(p, x, l, rng=k)[0],
                                          argnums=1),
                       in_shardings=(rep, sh, sh, rep), out_shardings=(rep, sh))
        t = 1e-3 * harness.time_jitted(step, params, e, y, key, repeats=FLAGS.repeats)
        rows.append({"objective": name, "batch_size": b, "devices": n, "step_ms": 1e3 * t,
                     "all_gather_ms": 1e3 * t_gather,
                     "all_gather_share": t_gather / t if t else 0.0})
        print(f"{name:18s} B={b:5d} devices={n}: {1e3 * t:8.2f} ms "
              f"(all-gather {1e3 * t_gather:6.2f} ms)", flush=True)

  print(f"\n{jax.devices()[0].platform} devices: {len(jax.devices())} "
        f"({'fake host devices' if jax.devices()[0].platform == 'cpu' else 'real'})\n")
  print(harness.markdown_table(
      ["objective", "B", "devices", "loss+mining fwd+bwd (ms)", "all-gather (ms)",
       "all-gather share"],
      [[r["objective"], r["batch_size"], r["devices"], f"{r['step_ms']:.2f}",
        f"{r['all_gather_ms']:.2f}", f"{100 * r['all_gather_share']:.1f}%"] for r in rows]))
  harness.write_json({"script": SCRIPT, "platform": jax.devices()[0].platform,
                      "dim": FLAGS.dim, "rows": rows, "stamp": harness.stamp()}, FLAGS.out)


if __name__ == "__main__":
  FLAGS = _define_flags()
  app.run(main)
