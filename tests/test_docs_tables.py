"""The results tables of the docs and the README equal their committed summaries
(docs/tables.py), and each summary says how, where and when it was measured."""

import glob
import json
import os
import re
import sys

import pytest

from dml_test_support import ROOT

sys.path.insert(0, os.path.join(ROOT, "docs"))
import tables  # pylint: disable=g-import-not-at-top,wrong-import-position
sys.path.remove(os.path.join(ROOT, "docs"))


def _page_blocks():
  for path in tables.pages():
    with open(path) as f:
      text = f.read()
    for name in tables.blocks(text):
      yield os.path.relpath(path, ROOT), name


def test_every_table_block_equals_its_summary():
  assert tables.check(write=False) == 0, "run python docs/tables.py --write"


def test_the_reproductions_and_the_readme_hold_generated_tables():
  names = {name for _, name in _page_blocks()}
  assert {"reproductions/mnist_table1", "reproductions/mnist_collapse",
          "reproductions/headline", "gpu"} <= names, names


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "docs", "results",
                                                               "reproductions", "*.json"))))
def test_a_summary_is_stamped_and_holds_every_run_it_shows(path):
  with open(path) as f:
    summary = json.load(f)
  assert summary.get("title")
  if summary.get("kind") == "claims":
    for row in summary["rows"]:
      assert ("ours" in row) != ("ours_text" in row), row["result"]
      for ref in row.get("ours", ()):
        assert tables.source_values(ref), ref
    return
  assert summary["command"] and all(isinstance(c, str) for c in summary["command"])
  assert set(summary["stamp"]) >= {"commit", "date", "machine", "jax"}
  for row in summary["rows"]:
    for column, run in zip(summary["columns"], tables.row_runs(row, len(summary["columns"]))):
      if run is None:
        continue
      seeds = summary["runs"][run]
      assert len(seeds) >= 3, f"{run}: fewer than 3 seeds"
      protocol = column.get("protocol", row.get("protocol"))
      values = tables.seed_values(summary, {**row, "run": run, "protocol": protocol},
                                  column["metric"])
      assert len(values) == len(seeds)


def test_mean_and_sample_std():
  assert tables.mean_std([1.0]) == (1.0, 0.0)
  mean, std = tables.mean_std([1.0, 2.0, 3.0])
  assert mean == 2.0 and abs(std - 1.0) < 1e-12


def test_a_changed_number_is_caught(tmp_path, monkeypatch):
  page = tmp_path / "page.md"
  with open(os.path.join(ROOT, "docs", "reproductions.md")) as f:
    text = f.read()
  cell = re.search(r"\*\*(\d+\.\d) ± ", text)   # the first bold mean of a table
  changed = text[:cell.start(1)] + f"{float(cell.group(1)) + 1:.1f}" + text[cell.end(1):]
  assert changed != text
  page.write_text(changed)
  monkeypatch.setattr(tables, "pages", lambda: [str(page)])
  assert tables.check(write=False) == 1
  assert tables.check(write=True) == 0
  assert page.read_text() == text


def test_an_unknown_summary_is_one_line(tmp_path, monkeypatch, capsys):
  page = tmp_path / "page.md"
  page.write_text("<!-- table: reproductions/nope -->\n<!-- end table -->\n")
  monkeypatch.setattr(tables, "pages", lambda: [str(page)])
  assert tables.main([]) == 2
  assert "no summary docs/results/reproductions/nope.json" in capsys.readouterr().err


def test_summarize_takes_the_newest_analysis_reports(tmp_path):
  # Steps sort as numbers (200 < 1500), for the analysis reports as for eval_step_<N>.json.
  folder = tmp_path / "runs" / "a" / "seed_0"
  folder.mkdir(parents=True)
  for step, spread in ((200, 0.5), (1500, 0.1)):
    (folder / f"eval_step_{step}.json").write_text(json.dumps(
        {"step": step, "results": {"test": {"recall@1": step / 2000}}}))
    (folder / f"collapse_train_step_{step}.json").write_text(json.dumps(
        {"relative_spread": [spread, spread], "rho": spread}))
    (folder / f"similarity_distributions_step_{step}.json").write_text(json.dumps(
        {"step": step, "similarity": "cosine",
         "statistics": {"train_same/median": spread, "test_correct/mean": 1.0}}))
  # an evaluation under other settings (eval.py --set) is not the run's result
  (folder / "eval_step_2000.ks=1.json").write_text(json.dumps(
      {"step": 2000, "results": {"test": {"recall@1": 0.99}}, "settings": {"eval.ks": [1]}}))
  summary = tmp_path / "s.json"
  summary.write_text(json.dumps({
      "title": "t", "labels": ["run"], "columns": [{"header": "R@1", "metric": "recall@1"}],
      "rows": [{"cells": ["a"], "run": "a", "protocol": "test"}]}))
  tables.summarize(str(tmp_path / "runs"), str(summary), "abc", "m")
  seed = json.loads(summary.read_text())["runs"]["a"]["0"]
  assert seed["test"]["recall@1"] == 0.75
  assert seed["collapse:train"] == {"relative_spread": 0.1, "rho": 0.1}
  assert seed["distributions"] == {"train_same/median": 0.1, "test_correct/mean": 1.0}


def test_summarize_reads_an_earlier_evaluation_a_column_names(tmp_path):
  # "test@600": the run's evaluation at step 600 beside its final one; a missing step or
  # protocol is one line
  folder = tmp_path / "runs" / "a" / "seed_0"
  folder.mkdir(parents=True)
  for step in (600, 1200, 2400):
    (folder / f"eval_step_{step}.json").write_text(json.dumps(
        {"step": step, "results": {"test": {"recall@1": step / 4000},
                                   "train": {"recall@1": step / 3000}}}))
  summary = tmp_path / "s.json"
  columns = [{"header": "R@1 at 600", "metric": "recall@1", "protocol": "test@600"},
             {"header": "R@1", "metric": "recall@1"}]
  summary.write_text(json.dumps({
      "title": "t", "labels": ["run"], "columns": columns,
      "rows": [{"cells": ["a"], "run": "a", "protocol": "test"}]}))
  tables.summarize(str(tmp_path / "runs"), str(summary), "abc", "m")
  filled = json.loads(summary.read_text())
  seed = filled["runs"]["a"]["0"]
  assert seed["test@600"] == {"recall@1": 0.15} and seed["test"] == {"recall@1": 0.6}
  assert "train@600" not in seed and "test@1200" not in seed
  filled["name"] = "reproductions/s"
  assert "| a | 15.0 ± 0.0 | 60.0 ± 0.0 |" in tables.render_seeds(filled)
  for protocol, message in (("test@300", "has no eval_step_300.json"),
                            ("valid@600", "has no protocol 'valid'")):
    columns[0]["protocol"] = protocol
    summary.write_text(json.dumps({
        "title": "t", "labels": ["run"], "columns": columns,
        "rows": [{"cells": ["a"], "run": "a", "protocol": "test"}]}))
    with pytest.raises(SystemExit, match=message):
      tables.summarize(str(tmp_path / "runs"), str(summary), "abc", "m")


def test_a_row_step_reads_each_columns_protocol_at_that_step(tmp_path, monkeypatch):
  # rows over training, columns over protocols: a row's "step" 600 reads test@600 and
  # train@600; a row without one reads the final evaluation; each run is read at the steps
  # of its own rows (run b was evaluated at 300 and 600 only)
  for run, steps in (("a", (600, 1200)), ("b", (300, 600))):
    folder = tmp_path / "runs" / run / "seed_0"
    folder.mkdir(parents=True)
    for step in steps:
      (folder / f"eval_step_{step}.json").write_text(json.dumps(
          {"step": step, "results": {"test": {"recall@1": step / 4000},
                                     "train": {"recall@1": step / 3000}}}))
  summary = tmp_path / "s.json"
  summary.write_text(json.dumps({
      "title": "t", "labels": ["step"],
      "columns": [{"header": "test", "metric": "recall@1", "protocol": "test"},
                  {"header": "train", "metric": "recall@1", "protocol": "train"}],
      "rows": [{"cells": ["600"], "run": "a", "protocol": "test", "step": 600},
               {"cells": ["1,200"], "run": "a", "protocol": "test"},
               {"cells": ["300"], "run": "b", "protocol": "test", "step": 300}]}))
  tables.summarize(str(tmp_path / "runs"), str(summary), "abc", "m")
  filled = json.loads(summary.read_text())
  seed = filled["runs"]["a"]["0"]
  assert seed["test@600"] == {"recall@1": 0.15} and seed["train@600"] == {"recall@1": 0.2}
  assert "test@1200" not in seed
  assert filled["runs"]["b"]["0"]["train@300"] == {"recall@1": 0.1}
  filled["name"] = "reproductions/s"
  table = tables.render_seeds(filled)
  assert "| 600 | 15.0 ± 0.0 | 20.0 ± 0.0 |" in table
  assert "| 1,200 | 30.0 ± 0.0 | 40.0 ± 0.0 |" in table
  # a claim citing the row reads its own protocol at its step, citing a cell that cell's
  monkeypatch.setattr(tables, "load_summary", lambda name: filled)
  assert tables.source_values({"summary": "s", "row": 0, "metric": "recall@1"}) == [0.15]
  assert tables.source_values(
      {"summary": "s", "row": 0, "column": 1, "metric": "recall@1"}) == [0.2]
  assert tables.source_values(
      {"summary": "s", "row": 1, "column": 1, "metric": "recall@1"}) == [0.4]


def test_a_benchmark_line_states_the_versions_and_a_gpu():
  with open(os.path.join(ROOT, "docs", "results", "performance", "objectives.json")) as f:
    summary = json.load(f)
  line = tables.render_benchmark(summary).splitlines()[-1]
  assert "JAX 0.10.2" in line and "torch 2.13.0+cpu" in line, line
  # a report measured on a GPU (gpu_check.sh retrieval / clustering) names the GPU
  summary["stamp"].update(backend="gpu", device="NVIDIA H200", cpu_count=16)
  line = tables.render_benchmark(summary).splitlines()[-1]
  assert "on NVIDIA H200 (gpu), 16 CPU cores" in line, line
