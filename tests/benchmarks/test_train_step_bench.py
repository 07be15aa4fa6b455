"""benchmarks/speed/train_step.py: the dml_jax side (the real loop pieces)
runs at a trivial size and the table/JSON code works; no timings are checked."""


import jax
import numpy as np
import pytest

from dml_test_support import load_benchmark


bench = load_benchmark("speed.train_step")
CASE = {"image_size": 8, "batch_size": 16}


def test_loop_runs_the_training_step_and_leaves_the_initial_state_usable():
  from dml_jax.run import training  # pylint: disable=import-outside-toplevel
  loop = bench.JaxLoop(CASE)
  assert loop.setup.config.batch_size == 16 and loop.setup.config.data.group_size == 8
  m = loop.chunk(2)
  assert set(m) >= {"loss", "grad_norm", "finite"} and m["finite"] == 1.0
  assert int(loop.state["step"]) == 2
  # the donated step left setup.init_state usable
  assert int(jax.device_get(loop.setup.init_state["step"])) == 0
  # the jitted key is training.step_key
  for step in (1, 7, 123456):
    np.testing.assert_array_equal(
        jax.random.key_data(loop.step_key(step)),
        jax.random.key_data(training.step_key(loop.config.seed, step)))


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
