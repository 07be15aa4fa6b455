"""benchmarks/train_step.py: the dml_jax side (the real loop pieces, the proposed fast step)
runs at a trivial size and the table/JSON code works; no timings are checked."""

import importlib.util
import os
import sys

import jax
import numpy as np
import pytest

from dml_test_support import ROOT


def _load_bench():
  path = os.path.join(ROOT, "benchmarks", "train_step.py")
  spec = importlib.util.spec_from_file_location("bench_train_step", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


bench = _load_bench()
CASE = {"image_size": 8, "batch_size": 16}


def test_loops_run_and_the_fast_step_matches_the_real_one():
  from dml_jax import training  # pylint: disable=import-outside-toplevel
  plain = bench.JaxLoop(CASE, fast=False)
  fast = bench.JaxLoop(CASE, fast=True)
  assert plain.setup.config.batch_size == 16 and plain.setup.config.data.group_size == 8
  m1, m2 = plain.chunk(2), fast.chunk(2)
  assert set(m1) >= {"loss", "grad_norm", "finite"} and m1["finite"] == 1.0
  np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5)   # same batches, same program
  leaves = jax.tree.leaves(jax.tree.map(
      lambda a, b: np.max(np.abs(np.asarray(a) - np.asarray(b))), plain.state, fast.state))
  assert max(leaves) < 1e-5
  assert int(fast.state["step"]) == 2
  # the donated step left setup.init_state usable
  assert int(jax.device_get(fast.setup.init_state["step"])) == 0
  # the jitted key is training.step_key
  key = bench.fast_step_key(plain.config.seed)
  for step in (1, 7, 123456):
    np.testing.assert_array_equal(jax.random.key_data(key(step)),
                                  jax.random.key_data(training.step_key(plain.config.seed, step)))


def test_smoke_writes_json(tmp_path):
  out = tmp_path / "train_step.json"
  assert bench.main(["--smoke", f"--out={out}"]) == 0
  import json  # pylint: disable=import-outside-toplevel
  report = json.loads(out.read_text())
  (row,) = report["results"]
  assert (row["side"], row["image_size"], row["batch_size"]) == ("dml_jax", 8, 16)
  assert row["examples_per_s"]["median"] > 0 and row["examples_per_s"]["n"] == 1
  assert report["conditions"]["threads"] >= 1


def test_summaries_and_ratios():
  runs = [{"chunk_s": [1.0, 2.0], "build_and_first_step_s": 3.0, "last_metrics": {},
           "chunk_steps": 10}]
  torch_runs = [{**runs[0], "chunk_s": [2.0, 4.0]}]
  rows = [bench.summarize({"image_size": 8, "batch_size": 10}, "dml_jax", runs),
          bench.summarize({"image_size": 8, "batch_size": 10}, "torch", torch_runs)]
  bench.add_ratios(rows)
  assert rows[0]["examples_per_s"]["median"] == pytest.approx(75.0)
  assert rows[0]["ratio_to_torch"] == pytest.approx(2.0)
  assert rows[0]["paired_ratio"] == pytest.approx(2.0)
  assert "ratio_to_torch" not in rows[1]
  with pytest.raises(ValueError, match="image_size:batch"):
    bench.parse_case("8x128")
