"""benchmarks/speed/host_memory.py: a tiny case in both modes, each in its own process; the JSON
has a row per mode with the step's time and fault counts (no timings are checked)."""

import json

import pytest

from dml_test_support import load_benchmark

bench = load_benchmark("speed.host_memory")


def test_smoke_run_measures_both_modes(tmp_path):
  out = tmp_path / "host_memory.json"
  assert bench.main(["--smoke", f"--out={out}"]) == 0
  report = json.loads(out.read_text())
  rows = {r["mode"]: r for r in report["rows"]}
  assert set(rows) == {"default", "keep"}
  for r in rows.values():
    assert r["case"] == bench.SMOKE_CASES and r["rounds"] == 1
    assert r["ms_per_step"] > 0 and r["faults_per_step"] >= 0
  kept = {r["mode"]: r["kept"] for r in report["runs"]}
  assert kept["default"] is None and kept["keep"] in (True, False)


def test_unknown_mode_is_refused():
  with pytest.raises(ValueError, match="unknown --modes.*allowed: default, keep"):
    bench.main(["--modes=fast"])
