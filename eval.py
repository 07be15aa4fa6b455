r"""Evaluates checkpoints written by train.py; needs nothing but the workdir(s).

  python eval.py --workdir=runs/digits                 # newest checkpoint
  python eval.py --workdir=runs/digits --step=500      # one step
  python eval.py --workdir=runs/digits --all_steps [--best_by=train:digit/map@r]
  python eval.py --workdirs=runs/s0,runs/s1,runs/s2 --output=runs/summary.json

One checkpoint: prints a markdown table and writes <workdir>/eval_step_<N>.json.
--all_steps: every checkpoint; eval_step_<N>.json each, <workdir>/eval_all_steps.json (or
--output) and a PNG of every metric against the step next to it. --best_by=PROTOCOL/METRIC
picks the best checkpoint on a validation protocol (a test split is refused).
--workdirs: the newest (or --step) checkpoint of each run, mean ± std per metric (e.g. over
seeds); JSON at --output and the markdown table next to it (.md).
Errors (no checkpoint, bad protocol, NaN embeddings, ...) print one line; exit code 1.
"""

from absl import app
from absl import flags

from dml_jax import cli
from dml_jax import overrides
from dml_jax.evaluation import checkpoints
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
cli.define_cache_flag()
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


def main(argv):
  if len(argv) > 1:
    cli.fail(PROGRAM, f"unexpected arguments: {' '.join(argv[1:])}")
  cli.quiet_logs()
  cli.enable_compilation_cache(FLAGS.compilation_cache)
  try:
    check_flags()
    overrides.import_user_modules(FLAGS.module)
    if FLAGS.workdirs is not None:
      out = checkpoints.evaluate_workdirs(FLAGS.workdirs, step=FLAGS.step, output=FLAGS.output,
                                       show_progress=FLAGS.progress)
      if FLAGS.side_by_side:
        print(f"{len(out['runs'])} runs, steps {out['steps']}")
        print(out["runs_table"])
      else:
        print(f"{len(out['runs'])} runs, steps {out['steps']}: mean ± std")
        print(out["table"])
      if FLAGS.output:
        print(f"Written {FLAGS.output}")
    elif FLAGS.all_steps:
      out = checkpoints.evaluate_all_steps(FLAGS.workdir, best_by=FLAGS.best_by,
                                        output=FLAGS.output, show_progress=FLAGS.progress)
      print(report.format_history_table(out["steps"]))
      if out["best"]:
        best = out["best"]
        print(f"Best checkpoint by {best['protocol']}/{best['metric']}: step {best['step']} "
              f"({report.format_value(best['metric'], best['value'])})")
      print(f"Written {out['json']} and {out['png']}")
    else:
      step, results = checkpoints.evaluate_checkpoint(FLAGS.workdir, step=FLAGS.step,
                                                   show_progress=FLAGS.progress)
      print(f"Step {step}")
      print(report.format_table(results))
      print(f"Written {report.results_path(FLAGS.workdir, step)}")
  except (FileNotFoundError, ValueError, NotImplementedError) as e:
    cli.fail(PROGRAM, str(e))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.flags_parser(PROGRAM))
