"""benchmarks/speed/clustering.py: its cases and its table (the timing itself is a benchmark)."""

import numpy as np

from dml_test_support import load_benchmark


def test_cases_have_the_protocols_shapes():
  bench = load_benchmark("speed.clustering")
  full = {c["case"]: c for c in bench.cases(["omniglot"], smoke=False)}
  assert full["omniglot test letters"]["x"].shape == (13180, 128)
  assert full["omniglot test letters"]["k"] == 659
  assert full["omniglot train characters"]["k"] == 964
  assert full["omniglot test languages NMI+"]["k"] == 600
  x = full["omniglot train languages"]["x"]
  np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-5)
  assert len(np.unique(full["omniglot train languages"]["labels"])) == 30


def test_table_row():
  bench = load_benchmark("speed.clustering")
  row = {"case": "c", "n": 1000, "d": 8, "k": 10, "speedup": 12.34, "inertia_ratio": 1.0012,
         "dml_jax": {"seconds": 0.1, "inertia": 1.0, "nmi": 0.5},
         "sklearn": {"seconds": 1.234, "inertia": 1.0, "nmi": 0.25}}
  assert bench.table_row(row) == ["c", "1,000 x 8", "10", "0.10", "1.23", "12.3x", "1.0012",
                                  "0.500 / 0.250"]
  del row["sklearn"], row["speedup"], row["inertia_ratio"]
  assert bench.table_row(row) == ["c", "1,000 x 8", "10", "0.10", "—", "—", "—",
                                  "0.500 / —"]


def test_table_with_the_total():
  bench = load_benchmark("speed.clustering")
  row = {"case": "omniglot c", "n": 1000, "d": 8, "k": 10, "speedup": 2.0, "inertia_ratio": 1.0,
         "dml_jax": {"seconds": 0.5, "inertia": 1.0, "nmi": 0.5},
         "sklearn": {"seconds": 1.0, "inertia": 1.0, "nmi": 0.5}}
  text = bench.table({"rows": [row], "busy": 0,
                      "omniglot_total_seconds": {"dml_jax": 0.5, "sklearn": 1.0}})
  assert "| omniglot c | 1,000 x 8 | 10 | 0.50 | 1.00 | 2.0x |" in text
  assert text.endswith("dml_jax 0.5 s, scikit-learn 1.0 s (2.0x); 0 CPU-hog processes beside.")
