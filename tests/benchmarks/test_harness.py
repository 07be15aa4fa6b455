"""benchmarks/harness.py: timing, the machine stamp, JSON, tables and ratio columns."""

import json
import platform
import time

import numpy as np
import pytest

from dml_test_support import load_benchmark

harness = load_benchmark("harness")


def test_time_calls_caps_at_max_seconds():
  calls = []
  stats, capped, last = harness.time_calls(lambda: calls.append(1) or len(calls), repeats=5,
                                           warmup=2)
  assert stats["repeats"] == 5 and not capped and len(calls) == 7 and last == 7
  stats, capped, _ = harness.time_calls(lambda: time.sleep(0.01), repeats=50, warmup=0,
                                        max_seconds=0.03, min_repeats=3)
  assert capped and 3 <= stats["repeats"] < 50
  assert stats["min_ms"] >= 10 and stats["q25_ms"] <= stats["median_ms"] <= stats["q75_ms"]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds")
def test_time_calls_counts_page_faults():
  def touch_40_mib():   # above glibc's 32 MiB ceiling for reusing freed blocks: mapped afresh
    block = bytearray(40 << 20)
    block[::4096] = b"\x01" * len(range(0, len(block), 4096))   # one write per 4 KiB page
    return block[-4096]
  assert harness.time_calls(touch_40_mib, repeats=3, warmup=1)[0]["faults_per_call"] >= 5000
  assert harness.time_calls(lambda: sum(range(100)), repeats=3, warmup=1)[0]["faults_per_call"] < 50


def test_statistics_of_times_and_rates():
  stats = harness.timing_stats([0.001, 0.002, 0.003, 0.004])
  assert stats["median_ms"] == pytest.approx(2.5) and stats["min_ms"] == pytest.approx(1.0)
  assert stats["iqr_ms"] == pytest.approx(stats["q75_ms"] - stats["q25_ms"])
  assert stats["repeats"] == 4
  q = harness.quartiles([4.0, 1.0, 3.0, 2.0])
  assert (q["median"], q["q25"], q["q75"], q["n"]) == (2.5, 1.75, 3.25, 4)


def test_time_jitted_blocks_and_gives_the_median():
  x = np.ones((8, 8), np.float32)
  assert harness.time_jitted(lambda a: a @ a, x, repeats=3) > 0


def test_compile_and_time_adds_memory_and_the_loss():
  out = harness.compile_and_time(lambda x: (x.sum(), 2 * x), (np.ones(4, np.float32),),
                                 repeats=2, warmup=1)
  assert out["loss"] == 4.0 and out["compile_s"] > 0 and out["repeats"] == 2
  assert out["memory"] is None or out["memory"]["argument_bytes"] >= 16


def test_stamp_json_and_tables(tmp_path):
  s = harness.stamp(["benchmarks/speed/xbm.py", "--smoke"])
  assert s["command"] == "python benchmarks/speed/xbm.py --smoke"
  assert {"date", "commit", "python", "machine", "cpus", "load_average"} <= set(s)
  assert 1 <= s["cpus"] <= (s["cpu_count"] or s["cpus"])
  out = tmp_path / "sub" / "r.json"
  harness.write_json({"stamp": s}, str(out))
  assert json.loads(out.read_text()) == {"stamp": s}
  harness.write_json({}, "")   # '' writes nothing
  assert harness.markdown_table(["a", "b"], [[1, harness.fmt(None, ".1f")], ["x", 2.5]]) == (
      "| a | b |\n|---|---|\n| 1 | — |\n| x | 2.5 |")


def test_add_ratios_pairs_rows_by_case():
  rows = [{"case": "c", "side": "ours", "rate": 4.0, "rounds": [2.0, 6.0]},
          {"case": "c", "side": "torch", "rate": 2.0, "rounds": [2.0, 2.0]},
          {"case": "d", "side": "ours", "rate": 1.0, "rounds": [1.0]},
          {"case": "c", "side": "other", "error": "failed"}]
  harness.add_ratios(rows, case=lambda r: r["case"], value=lambda r: r["rate"], rounds="rounds")
  assert rows[0]["ratio_to_torch"] == 2.0 and rows[0]["paired_ratio"] == 2.0
  assert "ratio_to_torch" not in rows[1] and "ratio_to_torch" not in rows[2]
  assert "paired_ratio" not in rows[3]
