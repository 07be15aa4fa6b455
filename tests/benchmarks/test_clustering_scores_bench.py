"""benchmarks/speed/clustering_scores.py: its labelings, scikit-learn's pairwise F1, its table and
a smoke run (the timing itself is a benchmark)."""

import json

import numpy as np

from dml_jax import evaluation
from dml_test_support import load_benchmark


def test_cases_have_the_test_splits_shapes_and_the_agreement():
  bench = load_benchmark("speed.clustering_scores")
  full = {c["case"]: c for c in bench.cases(["cub", "sop"], smoke=False)}
  assert (full["SOP test"]["n"], full["SOP test"]["classes"]) == (60502, 11316)
  assert (full["CUB-200-2011 test"]["n"], full["CUB-200-2011 test"]["classes"]) == (5924, 100)
  labels, assignment = bench.labeling(20000, 50, 0.6, seed=0)
  assert len(np.unique(labels)) == 50 and len(np.unique(assignment)) == 50
  # kept with 0.6, plus a 1-in-50 chance of drawing the class again
  assert abs(np.mean(labels == assignment) - (0.6 + 0.4 / 50)) < 0.01


def test_sklearn_pairwise_f1_is_the_library_s():
  bench = load_benchmark("speed.clustering_scores")
  rng = np.random.default_rng(0)
  for _ in range(5):
    labels, assignment = rng.integers(0, 6, size=50), rng.integers(0, 9, size=50)
    np.testing.assert_allclose(bench.sklearn_pairwise_f1(labels, assignment),
                               evaluation.pairwise_f1(labels, assignment), rtol=1e-12)
  assert bench.sklearn_pairwise_f1(np.arange(4), np.arange(4)) == 1.0


def test_table_row():
  bench = load_benchmark("speed.clustering_scores")
  side = lambda *ms: {s: {"seconds": t / 1e3, "value": 0.5} for s, t in zip(bench.SCORES, ms)}
  row = {"case": "c", "n": 60502, "classes": 11316, "dml_jax": side(0.5, 14.1, 0.25),
         "sklearn": side(2.0, 35243.2, 1.0), "max_difference": 1.8e-9, "chance_nmi": 0.8157}
  assert bench.table_row(row) == ["c", "60,502", "11,316", "0.5 / 2 (4x)",
                                  "14.1 / 35,243 (2,500x)", "0.25 / 1 (4x)", "1.8e-09", "0.816"]
  del row["sklearn"], row["max_difference"], row["chance_nmi"]
  assert bench.table_row(row)[3:] == ["0.5 / —", "14.1 / —", "0.25 / —", "—", "—"]


def test_smoke_run_writes_a_report_the_docs_can_render(tmp_path, capsys):
  bench = load_benchmark("speed.clustering_scores")
  out = tmp_path / "scores.json"
  assert bench.main(["--smoke", "--cases=cub", "--repeats=1", f"--out={out}"]) == 0
  saved = json.loads(out.read_text())
  assert saved["script"] == "benchmarks/speed/clustering_scores.py"
  row = saved["rows"][0]
  assert row["max_difference"] < 1e-12
  labels, assignment = bench.labeling(row["n"], row["classes"], 0.6, seed=0)
  assert row["dml_jax"]["ami"]["value"] == evaluation.ami(labels, assignment)
  nmi, ami = row["dml_jax"]["nmi"]["value"], row["dml_jax"]["ami"]["value"]
  assert abs(row["chance_nmi"] - (nmi - ami) / (1 - ami)) < 1e-9
  assert "| CUB-200-2011 test | 592 | 10 |" in capsys.readouterr().out
