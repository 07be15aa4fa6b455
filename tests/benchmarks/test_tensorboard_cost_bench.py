"""benchmarks/speed/tensorboard_cost.py: the smoke config runs with TensorBoard off and on, each
in its own process, and the table reads the report (no timings are checked)."""

import json
import os

from dml_test_support import load_benchmark

bench = load_benchmark("speed.tensorboard_cost")


def test_smoke_run_times_both_settings(tmp_path):
  out = tmp_path / "tensorboard_cost.json"
  cache = os.environ.get("DML_JAX_COMPILATION_CACHE", "")   # the session's train.py cache
  assert bench.main(["--smoke", f"--out={out}", f"--compilation_cache={cache}"]) == 0
  report = json.loads(out.read_text())
  assert report["script"] == bench.SCRIPT and report["rounds"] == 1
  for setting in ("False", "True"):
    (run,) = report["runs"][setting]
    assert run["returncode"] == 0 and run["seconds"] > 0, run.get("error")
  lines = bench.table(report).splitlines()
  assert lines[0] == "| `log.tensorboard` | run 1 | mean |"
  assert lines[-1].startswith("With TensorBoard on, the run took ")


def test_a_failed_run_is_recorded_not_raised(tmp_path):
  res = bench.time_run("configs/no_such_config.py", str(tmp_path / "w"), "True")
  assert res["returncode"] != 0 and "no_such_config" in res["error"]
  report = {"rounds": 1, "runs": {"False": [res], "True": [res]}}
  assert "| `False` | failed |" in bench.table(report)
