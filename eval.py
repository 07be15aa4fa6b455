r"""Evaluates a checkpoint written by train.py; needs nothing but the workdir.

  python eval.py --workdir=runs/digits [--step=1500]

Prints a markdown table and writes <workdir>/eval_step_<N>.json.
"""

import sys

from absl import app
from absl import flags

from dml_jax import training
from dml_jax.evaluation import evaluate

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A workdir written by train.py.")
flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: the newest).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  training.quiet_checkpoint_logs()
  try:
    step, results = training.evaluate_checkpoint(FLAGS.workdir, step=FLAGS.step)
  except (FileNotFoundError, ValueError) as e:
    print(f"eval.py: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"Step {step}")
  print(evaluate.format_table(results))
  print(f"Written {evaluate.results_path(FLAGS.workdir, step)}")


if __name__ == "__main__":
  app.run(main)
