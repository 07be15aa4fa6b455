r"""Evaluates checkpoints written by train.py; needs nothing but the workdir(s).

  python eval.py --workdir=runs/digits                 # newest checkpoint
  python eval.py --workdir=runs/digits --step=500      # one step
  python eval.py --workdir=runs/digits --all_steps [--best_by=train:digit/map@r]
  python eval.py --workdirs=runs/s0,runs/s1,runs/s2 --output=runs/summary.json
  python eval.py --workdir=runs/digits --retrieval_grid=16 [--worst] [--grid_k=8]
  python eval.py --workdir=runs/digits --export_embeddings

One checkpoint: prints a markdown table and writes <workdir>/eval_step_<N>.json.
--all_steps: every checkpoint; eval_step_<N>.json each, <workdir>/eval_all_steps.json (or
--output) and the learning curves next to it (.png: training loss and every metric against
the step). --best_by=PROTOCOL/METRIC
picks the best checkpoint on a validation protocol (a test split is refused).
--workdirs: the newest (or --step) checkpoint of each run, mean ± std per metric (e.g. over
seeds); JSON at --output and the markdown table next to it (.md).
--retrieval_grid=N: <workdir>/retrieval_grid_<protocol>_step_<N>.png, N queries of the first
protocol (drawn with --grid_seed, or the N of lowest average precision with --worst) and their
--grid_k nearest gallery images. --export_embeddings: the first protocol's embeddings for
TensorBoard's projector (<workdir>/tensorboard/eval/) and <workdir>/embeddings_step_<N>.npz.
Metrics, histograms and images also go to TensorBoard (<workdir>/tensorboard/eval) unless the
run's config.log.tensorboard is off.
Errors (no checkpoint, bad protocol, NaN embeddings, ...) print one line; exit code 1.
"""

from absl import app
from absl import flags

from dml_jax.run import cli
from dml_jax.run import overrides
from dml_jax.run import eval_checkpoints
from dml_jax.evaluation import report

PROGRAM = "eval.py"
FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A workdir written by train.py.")
flags.DEFINE_list("workdirs", None, "Several workdirs (e.g. seeds): aggregate mean ± std.")
flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: the newest).")
flags.DEFINE_bool("all_steps", False, "Evaluate every checkpoint of --workdir, plot curves.")
flags.DEFINE_string("best_by", None, "With --all_steps: 'PROTOCOL/METRIC' on a validation "
                    "protocol, e.g. 'train:digit/map@r'; test splits are refused.")
flags.DEFINE_string("output", None, "JSON path of --all_steps / --workdirs results.")
flags.DEFINE_bool("progress", True, "Progress bars for embedding and kNN.")
flags.DEFINE_bool("side_by_side", False, "With --workdirs: a row per run instead of mean ± std "
                  "(for runs that differ in more than the seed).")
flags.DEFINE_integer("retrieval_grid", 0, "Draw a retrieval grid of this many queries.")
flags.DEFINE_integer("grid_k", 8, "Gallery images per query in the retrieval grid.")
flags.DEFINE_bool("worst", False, "Retrieval grid of the queries with the lowest average "
                  "precision (instead of random ones).")
flags.DEFINE_integer("grid_seed", 0, "Seed of the retrieval grid's random queries.")
flags.DEFINE_bool("export_embeddings", False, "Write the test embeddings for TensorBoard's "
                  "projector (tensors.tsv, metadata.tsv, sprite) and as .npz.")
cli.define_cache_flag()
cli.define_host_memory_flag()
cli.define_machine_flags()
cli.define_data_location_flags()
flags.DEFINE_multi_string("set", [], "Evaluate under other evaluation settings than the "
                          "run's, e.g. --set=eval.ks=1,2,4,8,16,32 --set=eval.splits=test,"
                          "test@train (eval.* keys only): results to "
                          "eval_step_<N>.<settings>.json; the run's own files stay.")
flags.DEFINE_multi_string("module", [], "Modules to import first (a run's own objective); "
                          "those recorded in the workdir's config are imported anyway.")


def check_flags() -> None:
  if (FLAGS.workdir is None) == (FLAGS.workdirs is None):
    raise ValueError("give exactly one of --workdir and --workdirs.")
  if FLAGS.all_steps and (FLAGS.step is not None or FLAGS.workdirs is not None):
    raise ValueError("--all_steps evaluates every checkpoint of one --workdir; it takes "
                     "neither --step nor --workdirs.")
  if FLAGS.best_by and not FLAGS.all_steps:
    raise ValueError("--best_by selects among checkpoints; it needs --all_steps.")
  if FLAGS.output and not (FLAGS.all_steps or FLAGS.workdirs):
    raise ValueError("--output is for --all_steps or --workdirs results.")
  if FLAGS.output:   # before the evaluation, not after it
    eval_checkpoints.check_output(FLAGS.output,
                                  "workdirs" if FLAGS.workdirs is not None else "all_steps")
  if FLAGS.workdirs is not None and (FLAGS.retrieval_grid or FLAGS.export_embeddings):
    raise ValueError("--retrieval_grid and --export_embeddings take one --workdir.")
  if FLAGS.retrieval_grid < 0:
    raise ValueError(f"--retrieval_grid={FLAGS.retrieval_grid}: the number of queries must be "
                     ">= 0 (0: no grid).")
  if FLAGS.grid_k < 1:
    raise ValueError(f"--grid_k={FLAGS.grid_k}: the gallery images per query must be >= 1.")
  if FLAGS.grid_seed < 0:
    raise ValueError(f"--grid_seed={FLAGS.grid_seed}: the seed of the grid's random queries "
                     "must be >= 0.")
  if FLAGS.worst and not FLAGS.retrieval_grid:
    raise ValueError("--worst chooses the queries of --retrieval_grid=N; give N.")


def grid_flags() -> dict | None:
  """The retrieval grid of the flags (``None``: the config's)."""
  if not FLAGS.retrieval_grid:
    return None
  return {"num_queries": FLAGS.retrieval_grid, "k": FLAGS.grid_k,
          "mode": "worst" if FLAGS.worst else "random", "seed": FLAGS.grid_seed}


def main(argv):
  if len(argv) > 1:
    cli.fail(PROGRAM, f"unexpected arguments: {' '.join(argv[1:])}")
  cli.quiet_logs()
  cli.keep_host_memory(FLAGS.keep_host_memory)
  cache = cli.enable_compilation_cache(FLAGS.compilation_cache)
  try:
    check_flags()
    print(cli.describe_cache(cache), flush=True)
    overrides.import_user_modules(FLAGS.module)
    machine = {**cli.machine_overrides(), **cli.data_location_overrides()}
    if FLAGS.workdirs is not None:
      out = eval_checkpoints.evaluate_workdirs(FLAGS.workdirs, step=FLAGS.step, output=FLAGS.output,
                                               show_progress=FLAGS.progress, machine=machine,
                                               overrides=FLAGS.set)
      if FLAGS.side_by_side:
        print(f"{len(out['runs'])} runs, steps {out['steps']}")
        print(out["runs_table"])
      else:
        print(f"{len(out['runs'])} runs, steps {out['steps']}: mean ± std")
        print(out["table"])
      if FLAGS.output:
        print(f"Written {FLAGS.output}")
    elif FLAGS.all_steps:
      out = eval_checkpoints.evaluate_all_steps(FLAGS.workdir, best_by=FLAGS.best_by,
                                        output=FLAGS.output, show_progress=FLAGS.progress,
                                        grid=grid_flags(),
                                        export_embeddings=FLAGS.export_embeddings,
                                        machine=machine, overrides=FLAGS.set)
      print(report.format_history_table(out["steps"]))
      if out["best"]:
        best = out["best"]
        print(f"Best checkpoint by {best['protocol']}/{best['metric']}: step {best['step']} "
              f"({report.format_value(best['metric'], best['value'])})")
      print(f"Written {out['json']} and {out['png']}")
    else:
      step, results = eval_checkpoints.evaluate_checkpoint(
          FLAGS.workdir, step=FLAGS.step, show_progress=FLAGS.progress, grid=grid_flags(),
          export_embeddings=FLAGS.export_embeddings, machine=machine, overrides=FLAGS.set)
      print(f"Step {step}" + (f", evaluated with {' '.join(FLAGS.set)}" if FLAGS.set else ""))
      print(report.format_table(results))
      print(f"Written {eval_checkpoints.results_file(FLAGS.workdir, step, FLAGS.set)}")
      for path in eval_checkpoints.extra_outputs(FLAGS.workdir, step, grid=grid_flags(),
                                            export_embeddings=FLAGS.export_embeddings):
        print(f"Written {path}")
  except cli.USER_ERRORS as e:
    cli.fail(PROGRAM, str(e))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.flags_parser(PROGRAM))
