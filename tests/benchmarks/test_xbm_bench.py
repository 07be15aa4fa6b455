"""benchmarks/speed/xbm.py: the smoke run times every memory case, writes its JSON, and (with PML)
gives PML's CrossBatchMemory loss on the same batch and memory."""

import json

import numpy as np
import pytest

from dml_jax import objectives
from dml_test_support import load_benchmark


bench = load_benchmark("speed.xbm")


def _smoke(tmp_path, *, pml):
  out = tmp_path / "xbm.json"
  report = bench.run(batch_size=16, memory_sizes=(0, 32), dim=8, repeats=2, pml=pml,
                     num_classes=10, out=str(out), log=lambda s: None)
  with open(out) as f:
    assert json.load(f) == json.loads(json.dumps(report))
  return report


def test_smoke_run_without_pml(tmp_path):
  report = _smoke(tmp_path, pml=False)
  rows = {(r["objective"], r["memory_size"]): r for r in report["results"]}
  assert set(rows) == {(name, m) for name, _, _ in bench.CASES for m in (0, 32)}
  for (name, m), row in rows.items():
    assert row["pml"] is None and row["ratio"] is None
    assert row["ours"]["median_ms"] > 0 and np.isfinite(row["ours"]["loss"])
    if m:   # S [16, 48] instead of [16, 16]: more scratch memory
      assert row["ours"]["memory"]["temp_bytes"] > rows[(name, 0)]["ours"]["memory"]["temp_bytes"]
  # M = 0 is the objective on the batch alone: the loss the library gives without memory.
  name, hp, _ = bench.CASES[0]
  xs, ys = bench.make_batches(2, 16, 8, per_class=8, num_classes=10, seed=0)
  obj = objectives.make(name, **hp)
  loss, _ = obj.apply(obj.init(None, num_classes=10, dim=8), xs[-1], ys[-1])
  assert rows[(name, 0)]["ours"]["loss"] == pytest.approx(float(loss), rel=1e-6)
  assert "| contrastive | 32 | 16 × 48 |" in bench.markdown_table(report)


def test_smoke_run_against_pml(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("pytorch_metric_learning")
  report = _smoke(tmp_path, pml=True)
  for row in report["results"]:
    assert row["loss_agrees"], row


def test_memory_smaller_than_the_batch_is_refused():
  with pytest.raises(ValueError, match="memory.size=8 is smaller than batch_size=16"):
    bench.run(batch_size=16, memory_sizes=(8,), dim=8, repeats=1, pml=False, log=lambda s: None)
