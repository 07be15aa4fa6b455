"""benchmarks/speed/objectives.py: the smoke mode runs in-process and writes the JSON it
documents."""

import json
import math
import os

import numpy as np
import pytest

from dml_test_support import load_benchmark


bench = load_benchmark("speed.objectives")

TIMING_KEYS = {"median_ms", "q25_ms", "q75_ms", "iqr_ms", "min_ms", "repeats", "capped"}
MEMORY_KEYS = {"temp_bytes", "argument_bytes", "output_bytes", "alias_bytes", "peak_bytes"}


def _smoke(tmp_path, names, *, pml, **kwargs):
  out = tmp_path / "bench.json"
  report = bench.run(batch_sizes=bench.SMOKE_BATCH_SIZES, repeats=bench.SMOKE_REPEATS,
                     warmup=1, objective_names=names, pml=pml, out=str(out), log=lambda s: None,
                     **kwargs)
  with open(out) as f:
    written = json.load(f)
  return report, written


def _check_ours(row):
  ours = row["ours"]
  assert ours is not None, row.get("error")
  assert TIMING_KEYS | {"compile_s", "memory", "loss"} <= set(ours)
  assert ours["repeats"] == bench.SMOKE_REPEATS and not ours["capped"]
  assert 0 < ours["q25_ms"] <= ours["median_ms"] <= ours["q75_ms"]
  assert ours["compile_s"] > 0 and math.isfinite(ours["loss"])
  mem = ours["memory"]
  assert set(mem) == MEMORY_KEYS
  assert mem["argument_bytes"] >= 32 * 512 * 4   # the embeddings [32, 512] float32
  assert mem["output_bytes"] >= 32 * 512 * 4     # their gradient
  assert mem["peak_bytes"] == (mem["temp_bytes"] + mem["argument_bytes"] + mem["output_bytes"]
                               - mem["alias_bytes"])


def test_smoke_run_writes_the_documented_json(tmp_path):
  report, written = _smoke(tmp_path, ("nca",), pml=False, memory_batch_sizes=(64,))
  assert written == json.loads(json.dumps(report))
  assert {"config", "results", "memory_growth", "goals", "checks", "skipped"} <= set(written)
  config = written["config"]
  assert config["batch_sizes"] == [32] and config["repeats"] == bench.SMOKE_REPEATS
  assert config["memory_batch_sizes"] == [64]
  assert config["objectives"] == ["nca"] and config["cpus"] >= 1
  assert {"start", "end"} <= set(config["load_average"])
  floor, row, mem_row = written["results"]
  assert (floor["label"], floor["batch_size"]) == (bench.FLOOR_LABEL, 32)
  _check_ours(floor)
  # sum(W * X X^T) at the benchmark's inputs: the floor computes what it says.
  x, _ = bench.make_batch(32, 512, seed=0)
  w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
  assert floor["ours"]["loss"] == pytest.approx(float(np.sum(w * (x @ x.T))), rel=1e-4)
  assert (row["label"], row["objective"], row["batch_size"], row["dim"]) == ("nca", "nca", 32, 512)
  assert row["hparams"]["positive"] == "easy" and row["hparams"]["negative"] == "hard"
  _check_ours(row)
  assert row["pml"] is None and row["ratio"] is None
  # B = 64 compiled for its memory only: 4x the [B, B] temporaries of B = 32, and never run.
  assert (mem_row["label"], mem_row["batch_size"]) == ("nca", 64)
  assert mem_row["ours"]["memory_only"] and "median_ms" not in mem_row["ours"]
  assert mem_row["ours"]["memory"]["temp_bytes"] > row["ours"]["memory"]["temp_bytes"]
  (growth,) = written["memory_growth"]
  assert (growth["label"], growth["b_small"], growth["b_large"]) == ("nca", 32, 64)
  assert written["goals"] == []   # no PML time
  table = bench.markdown_table(report)
  assert "| nca | 32 |" in table and "memory only" in table


def test_smoke_run_against_pml(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("pytorch_metric_learning")
  report, written = _smoke(tmp_path, ("triplet",), pml=True)
  labels = [r["label"] for r in written["results"]]
  assert labels == [bench.FLOOR_LABEL, "triplet", "triplet(positive=easy, negative=hard)",
                    "triplet(positive=all, negative=semihard)",
                    "triplet(positive=all, negative=all)"]
  for row in written["results"]:
    _check_ours(row)
    if row["label"] in ("triplet", bench.FLOOR_LABEL):
      assert row["pml_pair"] is None and row["pml"] is None
      continue
    assert TIMING_KEYS <= set(row["pml"]) and row["pml"]["median_ms"] > 0
    assert row["ratio"] == pytest.approx(row["pml"]["median_ms"] / row["ours"]["median_ms"])
  checks = {c["pair"]: c for c in written["checks"]}
  assert set(checks) == {"triplet_easy_hard", "triplet_semihard", "triplet_all"}
  # Same semantics: PML and ours agree on the value and the gradient.
  for key in ("triplet_easy_hard", "triplet_all"):
    assert checks[key]["agree"] is True, checks[key]
    assert checks[key]["loss_abs_diff"] < 1e-4
  # Different by design (PML keeps every semi-hard triplet): reported, not asserted equal.
  assert checks["triplet_semihard"]["agree"] is None
  assert any("agree" in line for line in bench.summary_lines(report))


def test_memory_growth_flags_cubic_temp_bytes():
  def row(label, b, temp):
    return {"label": label, "batch_size": b, "ours": {"memory": {"temp_bytes": temp}}}
  results = [row("square", 128, 10), row("square", 512, 16 * 1000),
             row("square", 2048, 16 ** 2 * 1000), row("cube", 512, 1000),
             row("cube", 2048, 64 * 1000), row("single", 512, 5)]
  growth = {g["label"]: g for g in bench.memory_growth(results)}
  assert set(growth) == {"square", "cube"}
  assert (growth["square"]["b_small"], growth["square"]["b_large"]) == (512, 2048)
  assert growth["square"]["exponent"] == pytest.approx(2.0) and not growth["square"]["cubic"]
  assert growth["cube"]["exponent"] == pytest.approx(3.0) and growth["cube"]["cubic"]
  lines = bench.summary_lines({"checks": [], "memory_growth": list(growth.values()),
                               "results": [], "skipped": []})
  assert any(line.startswith("MEMORY: cube") for line in lines)


def test_select_cases_and_errors():
  cases, _ = bench.select_cases(("triplet",))
  assert cases[0].label == "triplet" and cases[0].pair is None
  assert all(c.name == "triplet" for c in cases)
  everything, skipped = bench.select_cases(("all",))
  registered = set(bench.objectives.names())
  assert {c.name for c in everything} == registered
  assert len(skipped) == sum(p.objective not in registered for p in bench.PML_PAIRS)
  with pytest.raises(ValueError, match="no_such_loss.*registered"):
    bench.select_cases(("no_such_loss",))
  with pytest.raises(ValueError, match="multiple of per_class"):
    bench.make_batch(30, 4, per_class=8)


def test_goals_compare_with_pml_or_with_the_floor():
  def row(label, b, ours, pml=None):
    return {"label": label, "batch_size": b, "ours": {"median_ms": ours},
            "pml": None if pml is None else {"median_ms": pml},
            "ratio": None if pml is None else pml / ours}
  results = [row(bench.FLOOR_LABEL, 512, 10.0), row(bench.FLOOR_LABEL, 2048, 100.0),
             row("slow_pml", 512, 12.0, 60.0),       # PML 6x the floor: needs >= 3x PML
             row("slow_pml", 2048, 150.0, 400.0),    # 2.7x PML only: not met
             row("near_floor", 512, 14.0, 25.0),     # PML 2.5x floor: ours 1.4x floor, met
             row("near_floor", 2048, 160.0, 200.0),  # ours 1.6x floor: not met
             row("small", 128, 1.0, 50.0),           # below TARGET_MIN_BATCH: no goal
             row("no_pml", 512, 11.0)]
  got = {(g["label"], g["batch_size"]): g for g in bench.goals(results)}
  assert set(got) == {("slow_pml", 512), ("slow_pml", 2048), ("near_floor", 512),
                      ("near_floor", 2048)}
  assert got[("slow_pml", 512)]["kind"] == "vs_pml" and got[("slow_pml", 512)]["met"]
  assert got[("slow_pml", 2048)]["value"] == pytest.approx(400 / 150)
  assert not got[("slow_pml", 2048)]["met"]
  assert got[("near_floor", 512)]["kind"] == "vs_floor" and got[("near_floor", 512)]["met"]
  assert got[("near_floor", 2048)]["value"] == pytest.approx(1.6)
  assert not got[("near_floor", 2048)]["met"]
  lines = bench.summary_lines({"checks": [], "memory_growth": [], "results": results,
                               "skipped": []})
  assert "goal NOT met: near_floor B=2048: ours / floor 1.60x (goal <= 1.5x; PML / floor 2.00x)" \
      in lines


def _report(commit, floor_ms, ours_ms, *, label="nca", pml_ms=None):
  row = {"label": label, "objective": label, "batch_size": 512, "dim": 512,
         "ours": {"median_ms": ours_ms, "faults_per_call": 3.0,
                  "memory": {"temp_bytes": 2 ** 20}},
         "pml": None if pml_ms is None else {"median_ms": pml_ms, "capped": False},
         "ratio": None if pml_ms is None else pml_ms / ours_ms,
         "pml_pair": None if pml_ms is None else {"key": label, "pml": "PmlLoss()",
                                                   "comparable": True, "semantics": "same"}}
  floor = {"label": bench.FLOOR_LABEL, "objective": None, "batch_size": 512, "dim": 512,
           "ours": {"median_ms": floor_ms, "faults_per_call": 1.0}, "pml": None, "ratio": None,
           "pml_pair": None}
  checks = [] if pml_ms is None else [{"pair": label, "objective": label, "comparable": True,
                                        "agree": True, "semantics": "same"}]
  return {"config": {"objectives": [label], "batch_sizes": [512], "total_s": 1.0},
          "results": [floor, row], "checks": checks, "skipped": [],
          "stamp": {"commit": commit, "date": f"2026-01-0{int(floor_ms)} 00:00 UTC",
                    "command": f"python benchmarks/speed/objectives.py --objectives={label} "
                               f"--out=runs/{label}.json"}}


def test_merge_divides_each_row_by_its_own_runs_floor():
  merged = bench.merge([_report("abc", 2.0, 3.0), _report("abc", 4.0, 3.0, label="triplet",
                                                          pml_ms=30.0)])
  assert merged["script"] == "benchmarks/speed/objectives.py"
  assert [r["run"] for r in merged["results"]] == [0, 0, 1, 1]
  assert merged["stamp"]["command"] == ("python benchmarks/speed/objectives.py "
                                        "--objectives=NAME --out=RUN.json")
  assert merged["stamp"]["dates"] == ["2026-01-02 00:00 UTC", "2026-01-04 00:00 UTC"]
  table = bench.table(merged)
  assert "| `nca` | — | 3.0 / — | — | 1.50× |" in table        # 3 ms over its run's 2 ms floor
  assert "| `triplet` | PmlLoss() | 3.0 / 30.0 | 10× | 0.75× |" in table   # over 4 ms
  assert "agree" in table and "B = 512: 2.0–4.0 ms" in table


def test_a_table_without_pml_has_no_pml_columns():
  table = bench.table(_report("abc", 2.0, 3.0))
  assert table.splitlines()[0] == ("| objective | B = 512: ms | ours / floor | temp MB at 512 | "
                                   "page faults a call at 512 |")
  assert "| `nca` | 3.0 | 1.50× | 1 | 3 |" in table and "PML" not in table


def test_merge_refuses_runs_of_different_commits():
  with pytest.raises(ValueError, match="different commits"):
    bench.merge([_report("abc", 2.0, 3.0), _report("def", 2.0, 3.0)])


def test_merge_takes_the_glob_pattern_the_docs_pass(tmp_path, monkeypatch):
  """docs/performance.md runs ``--merge=runs/objectives/*.json``: the shell does not expand a
  pattern inside ``--merge=``, so the script does."""
  monkeypatch.chdir(tmp_path)
  os.makedirs("runs/objectives")
  for name in ("triplet", "nca"):
    with open(f"runs/objectives/{name}.json", "w") as f:
      json.dump(_report("abc", 2.0, 3.0, label=name), f)
  assert bench.merge_paths(["runs/objectives/*.json"]) == [
      "runs/objectives/nca.json", "runs/objectives/triplet.json"]
  assert bench.merge_paths(["runs/objectives/nca.json"]) == ["runs/objectives/nca.json"]
  for bad in ("runs/none/*.json", "runs/objectives/missing.json"):
    with pytest.raises(ValueError, match="names no report file"):
      bench.merge_paths([bad])
