"""benchmarks/speed/parallel.py: importing it (as the docs do, for its table) changes nothing
in the process, and its table puts each objective's device counts side by side."""

import os

from dml_test_support import load_benchmark


def test_import_leaves_the_environment_and_flags_alone():
  before = os.environ.get("XLA_FLAGS")
  bench = load_benchmark("speed.parallel")
  assert os.environ.get("XLA_FLAGS") == before
  bench_again = load_benchmark("speed.parallel")    # no absl flag is defined twice
  assert bench_again.SCRIPT == "benchmarks/speed/parallel.py"


def test_table_sets_device_counts_side_by_side():
  bench = load_benchmark("speed.parallel")
  rows = [{"objective": "nca", "batch_size": 512, "devices": n, "step_ms": ms,
           "all_gather_ms": g, "all_gather_share": share}
          for n, ms, g, share in ((1, 8.0, 0.0, 0.0), (8, 10.0, 1.5, 0.15))]
  assert bench.table({"rows": rows}).splitlines()[2] == "| `nca` | 512 | 8.0 | 10.0 | 1.5 | 15.0 % |"
