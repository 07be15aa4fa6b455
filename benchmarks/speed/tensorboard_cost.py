"""What TensorBoard logging costs a whole run: the main job with ``log.tensorboard`` off and on.

  python benchmarks/speed/tensorboard_cost.py [--rounds=2] [--out=runs/tensorboard_cost.json]
  python benchmarks/speed/tensorboard_cost.py --smoke      # the smoke config, one round
  (--compilation_cache=DIR: the runs share JAX's compilation cache in DIR instead of compiling
  cold; their seconds are then not the measurement's)

Runs ``python train.py --config=configs/digits_evenodd_eps.py --compilation_cache= --noprogress
--config.log.tensorboard=False`` and ``=True`` alternately (``--rounds`` of each), every run in
a new workdir with compilation cold, and records the seconds from launching each process to its
exit. Prints a markdown table, writes JSON (``--out``) that ``table(report)`` renders for the
docs. A run that fails is recorded with the tail of its output and the others go on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from benchmarks import harness  # pylint: disable=wrong-import-position

SCRIPT = "benchmarks/speed/tensorboard_cost.py"
CONFIG = "configs/digits_evenodd_eps.py"
SETTINGS = ("False", "True")


def time_run(config: str, workdir: str, tensorboard: str, cache: str = "") -> dict:
  """Seconds from launching ``train.py`` to its exit (``error``: the output's tail, if it
  failed); ``cache``: ``train.py``'s ``--compilation_cache`` (``''``: compiled cold)."""
  cmd = [sys.executable, os.path.join(REPO, "train.py"), f"--config={config}",
         f"--workdir={workdir}", f"--compilation_cache={cache}", "--noprogress",
         f"--config.log.tensorboard={tensorboard}"]
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
  out = {"seconds": time.perf_counter() - t0, "returncode": proc.returncode}
  if proc.returncode != 0:
    out["error"] = (proc.stdout + proc.stderr)[-2000:]
  return out


def run(*, rounds: int, config: str = CONFIG, cache: str = "", log=print) -> dict:
  """``{'config', 'rounds', 'runs': {'False': [...], 'True': [...]}}``, off and on in turns."""
  runs = {s: [] for s in SETTINGS}
  with tempfile.TemporaryDirectory(prefix="tensorboard_cost_") as tmp:
    for r in range(rounds):
      for setting in SETTINGS:
        res = time_run(config, os.path.join(tmp, f"run_{r}_{setting}"), setting, cache)
        runs[setting].append(res)
        log(f"round {r + 1}/{rounds}, log.tensorboard={setting}: {res['seconds']:.1f} s"
            + ("" if res["returncode"] == 0 else f" (failed, exit {res['returncode']})"))
  return {"config": config, "rounds": rounds, "runs": runs}


def table(report: dict) -> str:
  """Seconds of every run per setting, their mean, and the cost of ``True`` over ``False``."""
  means = {}
  rows = []
  for setting in SETTINGS:
    runs = report["runs"][setting]
    ok = [r["seconds"] for r in runs if r["returncode"] == 0]
    means[setting] = statistics.mean(ok) if ok else None
    rows.append([f"`{setting}`", *(f"{r['seconds']:.1f} s" if r["returncode"] == 0 else "failed"
                                   for r in runs),
                 "—" if means[setting] is None else f"{means[setting]:.1f} s"])
  head = ["`log.tensorboard`", *(f"run {i + 1}" for i in range(report["rounds"])), "mean"]
  text = harness.markdown_table(head, rows)
  if means["False"] and means["True"]:
    cost = 100 * (means["True"] / means["False"] - 1)
    text += f"\n\nWith TensorBoard on, the run took {cost:+.1f} % of its time off (means)."
  return text


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--smoke", action="store_true",
                      help=f"{CONFIG}:smoke, one round")
  parser.add_argument("--out", default="")
  parser.add_argument("--compilation_cache", default="",
                      help="JAX compilation cache the runs share ('': each compiles cold)")
  args = parser.parse_args(argv)
  if args.rounds < 1:
    raise SystemExit(f"--rounds must be >= 1, got {args.rounds}.")
  config, rounds = (CONFIG + ":smoke", 1) if args.smoke else (CONFIG, args.rounds)
  report = {"script": SCRIPT, **run(rounds=rounds, config=config, cache=args.compilation_cache),
            "stamp": harness.stamp()}
  print(table(report))
  harness.write_json(report, args.out, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
