"""benchmarks/device/omniglot_summary.py on run folders written as a sweep writes them."""

import json
import os

from dml_test_support import load_device_script


def write_run(root, point, seed, *, r1, finished=True):
  run = os.path.join(root, point, f"seed_{seed}")
  os.makedirs(run)
  json.dump({"num_train_steps": 10_000}, open(os.path.join(run, "config.json"), "w"))
  json.dump({"num_train_steps": 40, "steps_per_epoch": 20}, open(os.path.join(run, "run.json"),
                                                                 "w"))
  with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    for step, rate in ((10, 50.0), (20, 400.0), (30, 420.0), (40, 410.0)):
      f.write(json.dumps({"step": step, "examples_per_sec": rate, "loss": 0.1}) + "\n")
  if finished:
    results = {"test": {"recall@1": r1, "nmi": 0.5},
               "test:alphabet": {"recall@1": 2 * r1, "nmi+": 0.25}}
    json.dump({"step": 40, "results": results}, open(os.path.join(run, "eval_step_40.json"), "w"))


def test_summary_means_stds_rates_and_unfinished_runs(tmp_path):
  summary = load_device_script("omniglot_summary")
  write_run(tmp_path, "loss.positive=easy", 0, r1=0.2)
  write_run(tmp_path, "loss.positive=easy", 1, r1=0.3)
  write_run(tmp_path, "loss.positive=random", 0, r1=0.1)
  write_run(tmp_path, "loss.positive=random", 1, r1=0.1, finished=False)
  got = summary.summarize(str(tmp_path), 12.0)
  easy = got["rows"]["loss.positive=easy"]
  assert abs(easy["test/recall@1"]["mean"] - 25.0) < 1e-9 and easy["test/recall@1"]["n"] == 2
  assert abs(easy["test/recall@1"]["std"] - 7.0710678) < 1e-6      # sample std of 20, 30
  assert got["rows"]["loss.positive=random"]["test/recall@1"]["n"] == 1
  assert all(r["images_per_s"] == 410.0 for r in got["runs"])   # median without the first row
  table = summary.markdown(got)
  assert "| loss.positive=easy | 2 | 25.0 ± 7.1 | 50.0 ± 0.0 | 50.0 ± 14.1 | 25.0 ± 0.0 |" in table
  assert "not finished: loss.positive=random seed 1" in table
