r"""EPS vs the triplet baseline on the digits even/odd experiment, over several seeds.

  python experiments/digits_evenodd_seeds.py --seeds=5 --out=runs/digits_seeds

Trains configs/digits_evenodd_eps.py and configs/digits_evenodd_triplet.py once per seed
(workdirs under --out), prints mean ± std of every metric per protocol as a markdown table
and writes <out>/summary.json.
"""

import json
import os
import sys
import time

from absl import app
from absl import flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import digits_evenodd_eps, digits_evenodd_triplet  # pylint: disable=g-import-not-at-top
from dml_jax.run import cli  # pylint: disable=g-import-not-at-top
from dml_jax.run import training  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_integer("seeds", 5, "Number of seeds (0 .. seeds-1).")
flags.DEFINE_string("out", "runs/digits_seeds", "Parent directory of the workdirs.")
flags.DEFINE_integer("num_train_steps", 0, "Override the configs' step count (0: keep).")

CONFIGS = {"eps": digits_evenodd_eps, "triplet": digits_evenodd_triplet}


def main(argv):
  del argv
  cli.quiet_logs()
  runs = {}
  for name, module in CONFIGS.items():
    for seed in range(FLAGS.seeds):
      config = module.get_config()
      config.seed = seed
      if FLAGS.num_train_steps:
        config.num_train_steps = FLAGS.num_train_steps
      start = time.perf_counter()
      results = training.train_and_evaluate(
          config, os.path.join(FLAGS.out, f"{name}_seed{seed}"), show_progress=False)
      print(f"{name} seed {seed}: test recall@1 {100 * results['test']['recall@1']:.2f} "
            f"({time.perf_counter() - start:.0f} s)", flush=True)
      runs.setdefault(name, []).append(results)

  summary = {}
  for name, results in runs.items():
    summary[name] = {}
    for protocol in results[0]:
      summary[name][protocol] = {
          key: {"mean": float(np.mean([r[protocol][key] for r in results])),
                "std": float(np.std([r[protocol][key] for r in results], ddof=1))
                       if len(results) > 1 else 0.0}
          for key in results[0][protocol]}
  os.makedirs(FLAGS.out, exist_ok=True)
  with open(os.path.join(FLAGS.out, "summary.json"), "w") as f:
    json.dump({"seeds": FLAGS.seeds, "summary": summary}, f, indent=2)

  keys = list(next(iter(next(iter(summary.values())).values())))
  print(f"\nmean ± std over {FLAGS.seeds} seeds (percent)\n")
  print("| config | protocol | " + " | ".join(keys) + " |")
  print("|---|---|" + "---|" * len(keys))
  for name, per_protocol in summary.items():
    for protocol, row in per_protocol.items():
      cells = [f"{100 * row[k]['mean']:.1f} ± {100 * row[k]['std']:.1f}" for k in keys]
      print(f"| {name} | {protocol} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  app.run(main)
