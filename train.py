r"""Trains an embedding model and evaluates it.

  python train.py --config=configs/digits_evenodd_eps.py --workdir=runs/digits \
      [--config.loss.margin=0.1 ...] [--config.loss.name=nca] [--module=my_losses]

Rerunning the same command on the same workdir resumes from the newest checkpoint; a rerun
whose config differs in a key that changes the run is refused (``--overwrite`` starts the
workdir afresh). Ctrl-C (SIGINT) or SIGTERM saves a checkpoint of the current step and stops.
"""

import sys

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from dml_jax.run import cli
from dml_jax.run import signals
from dml_jax.run import training
from dml_jax.run import workdir as workdir_lib
from dml_jax.run import config as config_lib
from dml_jax.evaluation import report

PROGRAM = "train.py"
FLAGS = flags.FLAGS
# Unlocked while parsing so that --config.loss.<key> may name any hyper-parameter of the
# objective; cli.resolved_config checks every key and locks the result.
config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=False, accept_new_attributes=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and results.")
cli.define_cache_flag()
cli.define_host_memory_flag(default=None)
cli.define_machine_flags()
flags.DEFINE_multi_string("module", [], "A module to import first, e.g. one that registers an "
                          "objective (dotted name or .py path); recorded in the workdir.")
flags.DEFINE_bool("overwrite", False, "Delete what an earlier run wrote into --workdir and "
                  "start afresh (instead of resuming it).")
flags.DEFINE_bool("progress", True, "Show a progress bar (else a log line per log step).")
flags.DEFINE_bool("distributed", False, "Multi-host: call jax.distributed.initialize() (its "
                  "arguments auto-detected on SLURM / TPU pods unless given below).")
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    cli.fail(PROGRAM, f"unexpected arguments: {' '.join(argv[1:])}")
  cli.quiet_logs()
  cache = cli.enable_compilation_cache(FLAGS.compilation_cache)
  try:
    config = cli.resolved_config(FLAGS["config"], modules=FLAGS.module,
                                 machine=cli.machine_overrides())
    config_lib.validate(config)
    # before JAX starts its threads
    cli.keep_host_memory(cli.wants_host_memory(FLAGS.keep_host_memory, config))
    if FLAGS.distributed or FLAGS.coordinator_address:
      cli.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                 FLAGS.process_id)
    logging.info("Process %d of %d; devices: %s", jax.process_index(), jax.process_count(),
                 jax.devices())
    if workdir_lib.is_main_process():
      print(cli.describe_cache(cache), flush=True)
    with signals.stop_on_signals() as stop:
      results = training.train_and_evaluate(config, FLAGS.workdir, show_progress=FLAGS.progress,
                                            overwrite=FLAGS.overwrite, stop=stop)
  except training.TrainingInterrupted as e:
    cli.fail(PROGRAM, str(e), code=128 + e.signum)
  except cli.USER_ERRORS as e:
    cli.fail(PROGRAM, str(e))
  if workdir_lib.is_main_process():
    print(report.format_table(results))
    print(f"Results written to {FLAGS.workdir}")


# --help lists these after the everyday flags, and says where the config keys are.
HELP_GROUPS = (("machine flags (the environment variables DML_JAX_KEEP_HOST_MEMORY, "
                "DML_JAX_NUM_THREADS, DML_JAX_NUM_WORKERS set their defaults)",
                ("keep_host_memory", "num_threads", "num_workers")),
               ("multi-host flags (jax.distributed; one process per host)",
                ("distributed", "coordinator_address", "num_processes", "process_id")),)
HELP_EPILOG = ("Config keys (--config.KEY=VALUE): every key of configs/default.py, commented "
               "there, and the table of docs/training.md \"Configs\"; a misspelt key is "
               "refused with the closest one. --helpfull lists absl's own flags too.")

if __name__ == "__main__":
  cli.import_flag_modules(PROGRAM, sys.argv)   # before --config=FILE is read
  app.run(main, flags_parser=cli.flags_parser(PROGRAM, groups=HELP_GROUPS, epilog=HELP_EPILOG))
