r"""Trains an embedding model and evaluates it.

  python train.py --config=configs/digits_evenodd_eps.py --workdir=runs/digits \
      [--config.loss.margin=0.1 ...]

Rerunning the same command on the same workdir resumes from the newest checkpoint.
"""

import sys

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from dml_jax import training
from dml_jax.evaluation import evaluate

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and results.")
flags.DEFINE_bool("progress", True, "Show a progress bar.")
flags.DEFINE_bool("distributed", False, "Multi-host: call jax.distributed.initialize() (its "
                  "arguments auto-detected on SLURM / TPU pods unless given below).")
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  training.quiet_checkpoint_logs()
  if FLAGS.distributed or FLAGS.coordinator_address:
    jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                               num_processes=FLAGS.num_processes, process_id=FLAGS.process_id)
  logging.info("Process %d of %d; devices: %s", jax.process_index(), jax.process_count(),
               jax.devices())
  try:
    results = training.train_and_evaluate(FLAGS.config, FLAGS.workdir,
                                          show_progress=FLAGS.progress)
  except (FileNotFoundError, ValueError, NotImplementedError,
          training.NonFiniteLossError) as e:
    # Bad config, missing data or weights (the message says how to get them), or a NaN loss:
    # the message is the whole story, no traceback.
    print(f"train.py: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(1)
  if training.is_main_process():
    print(evaluate.format_table(results))
    print(f"Results written to {FLAGS.workdir}")


if __name__ == "__main__":
  app.run(main)
