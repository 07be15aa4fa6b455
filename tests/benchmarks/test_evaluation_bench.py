"""benchmarks/speed/evaluation.py: its data, its table and its checks (the timing itself is a
benchmark)."""

import numpy as np
import pytest

from dml_test_support import load_benchmark

evaluation = load_benchmark("speed.evaluation")


def test_data_kinds():
  x, y = evaluation.make_data(600, 16, noise=0.5, seed=0, kind="clustered")
  u, v = evaluation.make_data(600, 16, noise=0.5, seed=0, kind="unstructured")
  for points in (x, u):
    np.testing.assert_allclose(np.linalg.norm(points, axis=1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(y, v)   # the same labels, about N/5 classes
  # Clustered points are nearer their class's other points than unstructured ones are.
  same = (y[:, None] == y[None, :]) & ~np.eye(600, dtype=bool)
  assert (x @ x.T)[same].mean() > 0.5 > abs((u @ u.T)[same].mean())
  with pytest.raises(ValueError, match="data kind 'sparse'; allowed: clustered, unstructured"):
    evaluation.make_data(10, 4, noise=1.0, seed=0, kind="sparse")


def test_table_and_checks():
  def row(method, data, seconds, r1):
    return {"method": method, "n": 1000, "data": data, "seconds": seconds,
            "peak_mib_above": 100.0, "metrics": {"recall@1": r1, "map@r": 0.1,
                                                   "r_precision": 0.2}}
  rows = [row("dml_jax", "clustered", 2.0, 0.5), row("faiss", "clustered", 3.0, 0.5),
          row("dml_jax", "unstructured", 4.0, 0.0), row("faiss", "unstructured", 2.0, 0.0),
          {"method": "pml", "n": 1000, "data": "unstructured", "skipped": "not installed"}]
  checks = evaluation.checks(rows)
  assert checks["clustered/1000"]["speedup_vs_faiss"] == 1.5
  assert checks["clustered/1000"]["not_slower_than_faiss"]
  assert not checks["unstructured/1000"]["not_slower_than_faiss"]
  text = evaluation.table({"ks": [1], "rows": rows})
  assert "| unstructured | 1,000 | faiss | 2.0 | 0.50 | 100 | 0.00 | 10.00 | 20.00 |" in text
  assert "| unstructured | 1,000 | pml | skipped: not installed |" in text


def test_the_report_names_the_device_its_dml_jax_worker_ran_on():
  # the workers run in subprocesses: the parent never imports JAX, so its stamp alone would
  # not say that a run was on a GPU
  import jax  # pylint: disable=import-outside-toplevel
  row = evaluation.worker("dml_jax", 300, 8, [1], noise=0.5, seed=0)
  assert (row["jax"], row["backend"]) == (jax.__version__, jax.default_backend())
  stamp = evaluation.report_stamp([{"method": "faiss", "n": 300}, row])
  assert (stamp["jax"], stamp["backend"], stamp["device"]) == (
      row["jax"], row["backend"], row["device"])
