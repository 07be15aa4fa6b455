"""The evaluation binary on tiny digits runs: evaluate_checkpoint == train, --all_steps with
model selection, --workdirs aggregation, errors; eval.py itself in subprocesses (slow)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from dml_test_support import ROOT
from dml_test_support import small_config
from dml_test_support import snapshot
from dml_jax.run import workdir as workdir_lib
from dml_jax.run import writers
from dml_jax.run import eval_checkpoints
from dml_jax.evaluation import report


@pytest.fixture(scope="module")
def runs(run20, tmp_path_factory):
  """Two copies of the shared 20-step run (checkpoints at 10 and 20), the second standing for
  a second seed (aggregation over distinct values is tested in tests/evaluation):
  {workdir: results}."""
  copies = tmp_path_factory.mktemp("copies")
  workdir, results = run20
  shutil.copytree(workdir, copies / "run0")
  shutil.copytree(workdir, copies / "run1")
  return {str(copies / "run0"): results, str(copies / "run1"): results}


def test_evaluate_checkpoint_equals_what_train_reported(runs):
  workdir, train_results = next(iter(runs.items()))
  step, results = eval_checkpoints.evaluate_checkpoint(workdir)
  assert step == 20
  assert results == train_results   # bit-identical: same checkpoint, same computation
  with open(report.results_path(workdir, 20)) as f:
    assert json.load(f)["results"] == train_results
  step, earlier = eval_checkpoints.evaluate_checkpoint(workdir, step=10)
  assert step == 10 and earlier != train_results
  with pytest.raises(ValueError, match="No checkpoint for step 15"):
    eval_checkpoints.evaluate_checkpoint(workdir, step=15)


def test_all_steps_and_best_checkpoint_on_a_validation_protocol(runs):
  workdir = next(iter(runs))
  out = eval_checkpoints.evaluate_all_steps(workdir, best_by="train:digit/map@r")
  assert sorted(out["steps"]) == [10, 20]
  assert out["steps"][20] == runs[workdir]
  values = {s: r["train:digit"]["map@r"] for s, r in out["steps"].items()}
  assert out["best"] == {"step": max(values, key=values.get), "protocol": "train:digit",
                         "metric": "map@r", "value": max(values.values())}
  with open(out["json"]) as f:
    saved = json.load(f)
  assert saved["steps"]["10"] == out["steps"][10] and saved["best"] == out["best"]
  assert out["png"].endswith("eval_all_steps.png") and os.path.getsize(out["png"]) > 1000
  with pytest.raises(ValueError, match="'test' is a test split"):
    eval_checkpoints.evaluate_all_steps(workdir, best_by="test/recall@1")


def test_retrieval_grid_export_and_tensorboard_of_one_checkpoint(runs, tmp_path):
  workdir = str(tmp_path / "copy")
  shutil.copytree(next(iter(runs)), workdir)
  # the earlier tests' evaluations stay in tensorboard/eval (nothing is purged): start empty
  shutil.rmtree(os.path.join(workdir, "tensorboard", "eval"), ignore_errors=True)
  grid = {"num_queries": 3, "k": 4, "mode": "worst", "seed": 0}
  step, results = eval_checkpoints.evaluate_checkpoint(workdir, grid=grid, export_embeddings=True)
  written = [os.path.relpath(p, workdir) for p in eval_checkpoints.extra_outputs(
      workdir, step, grid=grid, export_embeddings=True)]
  assert written == ["retrieval_grid_test_worst_step_20.png", "embeddings_step_20.npz",
                     os.path.join("tensorboard", "eval", "projector_config.pbtxt")]
  events = writers.read_events(os.path.join(workdir, "tensorboard", "eval"))
  assert events["scalars"]["eval/test/recall@1"] == [
      (20, pytest.approx(results["test"]["recall@1"]))]
  assert [s for s, _ in events["images"]["retrieval_grid/test"]] == [20]
  assert [s for s, _ in events["histograms"]["eval/test/similarity_positive"]] == [20]
  with pytest.raises(ValueError, match="--retrieval_grid=100000: the query set of protocol "
                     "'test' has"):
    eval_checkpoints.evaluate_checkpoint(workdir, grid={"num_queries": 100000})


def test_other_evaluation_settings_write_their_own_file_and_leave_the_runs(runs, tmp_path):
  """eval.py --set: other K and metrics, into eval_step_20.<tag>.json recording them; the
  run's own files (its eval_step_20.json, TensorBoard events) stay byte for byte."""
  workdir = str(tmp_path / "copy")
  shutil.copytree(next(iter(runs)), workdir)
  train_results = runs[next(iter(runs))]
  before = snapshot(workdir)
  settings = ["eval.ks=1,2", "eval.metrics=retrieval"]
  step, results = eval_checkpoints.evaluate_checkpoint(workdir, overrides=settings)
  after = snapshot(workdir)
  name = "eval_step_20.ks=1,2+metrics=retrieval.json"
  assert set(after) - set(before) == {name}
  assert all(after[path] == data for path, data in before.items())
  assert eval_checkpoints.results_file(workdir, 20, settings) == os.path.join(workdir, name)
  assert step == 20 and set(results) == set(train_results)
  for protocol, row in results.items():
    assert set(row) == {"recall@1", "recall@2", "map@r", "r_precision"}
    assert row["recall@1"] == train_results[protocol]["recall@1"]   # same embeddings
  with open(os.path.join(workdir, name)) as f:
    saved = json.load(f)
  assert saved["results"] == results
  assert saved["settings"] == {"eval.ks": [1, 2], "eval.metrics": ["retrieval"]}
  out = eval_checkpoints.evaluate_workdirs([workdir], overrides=settings,
                                           output=str(tmp_path / "seeds.json"))
  assert out["runs"] == [results]
  with open(tmp_path / "seeds.json") as f:
    assert json.load(f)["settings"] == saved["settings"]
  steps = eval_checkpoints.evaluate_all_steps(workdir, overrides=settings)
  assert steps["steps"][20] == results
  assert steps["json"] == os.path.join(workdir, "eval_all_steps.ks=1,2+metrics=retrieval.json")
  with open(steps["json"]) as f:
    assert json.load(f)["settings"] == saved["settings"]
  assert os.path.exists(os.path.join(workdir, "eval_step_10.ks=1,2+metrics=retrieval.json"))
  assert all(snapshot(workdir)[path] == data for path, data in before.items())
  with pytest.raises(ValueError, match="--set evaluates under other settings"):
    eval_checkpoints.evaluate_checkpoint(workdir, overrides=settings, grid={"num_queries": 2})


def test_reciprocal_rank_ami_and_f1_of_a_trained_run(runs, tmp_path):
  """eval.py --set=eval.metrics=retrieval,clustering,mrr,ami,f1: the run's own metrics again,
  with the three on request beside them."""
  workdir = str(tmp_path / "copy")
  shutil.copytree(next(iter(runs)), workdir)
  train_results = runs[next(iter(runs))]
  _, results = eval_checkpoints.evaluate_checkpoint(
      workdir, overrides=["eval.metrics=retrieval,clustering,mrr,ami,f1"])
  for protocol, row in results.items():
    assert set(row) == set(train_results[protocol]) | {"mrr", "ami", "f1"}
    assert {k: row[k] for k in train_results[protocol]} == train_results[protocol]
    assert row["recall@1"] <= row["mrr"] <= 1 and 0 < row["f1"] <= 1 and row["ami"] <= 1


def test_extra_outputs_are_only_what_the_command_wrote(tmp_path):
  """A --worst grid does not list the random grid, nor embeddings, an earlier command left."""
  workdir = str(tmp_path)
  workdir_lib.write_config(small_config(), workdir)
  for name in ("retrieval_grid_test_step_20.png", "retrieval_grid_test_worst_step_20.png",
               "embeddings_step_20.npz"):
    open(os.path.join(workdir, name), "wb").close()
  worst = {"num_queries": 4, "k": 8, "mode": "worst", "seed": 0}
  assert [os.path.basename(p) for p in eval_checkpoints.extra_outputs(workdir, 20, grid=worst)] == [
      "retrieval_grid_test_worst_step_20.png"]
  assert [os.path.basename(p) for p in eval_checkpoints.extra_outputs(
      workdir, 20, grid={"num_queries": 4}, export_embeddings=True)] == [
          "retrieval_grid_test_step_20.png", "embeddings_step_20.npz"]
  assert eval_checkpoints.extra_outputs(workdir, 20) == []   # the config draws no grid


def test_workdirs_aggregate_mean_and_std_over_runs(runs, tmp_path):
  output = str(tmp_path / "summary.json")
  out = eval_checkpoints.evaluate_workdirs(list(runs), output=output)
  assert out["steps"] == [20, 20]
  assert out["runs"] == list(runs.values())
  for protocol, row in next(iter(runs.values())).items():
    for metric, value in row.items():
      assert out["summary"][protocol][metric] == {"mean": value, "std": 0.0,
                                                  "values": [value, value]}
  with open(output) as f:
    assert json.load(f)["summary"] == out["summary"]
  with open(str(tmp_path / "summary.md")) as f:
    assert out["table"] in f.read()
  with pytest.raises(ValueError, match="more than once"):
    eval_checkpoints.evaluate_workdirs([output, output])


def test_workdirs_that_differ_in_more_than_the_seed_are_named(runs, tmp_path, caplog):
  first = next(iter(runs))
  other = str(tmp_path / "other")
  shutil.copytree(first, other)
  config = workdir_lib.load_config(other)
  config.loss.positive, config.seed = "random", 7
  workdir_lib.write_config(config, other)
  with caplog.at_level("WARNING"):
    out = eval_checkpoints.evaluate_workdirs([first, other])
  assert out["differences"] == ["loss.positive: 'easy' (run 0), 'random' (run 1)"]
  assert any("differ in more than the seed" in r.getMessage() for r in caplog.records)
  rows = [line for line in out["runs_table"].splitlines() if line.startswith(f"| {other} |")]
  assert len(rows) == len(out["runs"][1])
  assert eval_checkpoints.evaluate_workdirs(list(runs))["differences"] == []


def test_workdir_without_checkpoints_is_a_clear_error(runs, tmp_path):
  workdir = str(tmp_path / "fresh")
  workdir_lib.write_config(small_config(), workdir)
  with pytest.raises(FileNotFoundError, match="No checkpoint in .*fresh"):
    eval_checkpoints.evaluate_checkpoint(workdir)
  with pytest.raises(FileNotFoundError, match="No checkpoint"):
    eval_checkpoints.evaluate_workdirs([next(iter(runs)), workdir])


def eval_py(*args):
  return subprocess.run([sys.executable, "eval.py", "--noprogress", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_eval_py_prints_the_table_train_printed(runs):
  workdir, train_results = next(iter(runs.items()))
  out = eval_py(f"--workdir={workdir}")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Step 20" in out.stdout
  assert report.format_table(train_results) in out.stdout


@pytest.mark.slow
def test_eval_py_with_other_settings_names_the_file_it_wrote(runs, tmp_path):
  workdir = str(tmp_path / "copy")
  shutil.copytree(next(iter(runs)), workdir)
  out = eval_py(f"--workdir={workdir}", "--set=eval.splits=test", "--set=eval.ks=1,4")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Step 20, evaluated with eval.splits=test eval.ks=1,4" in out.stdout
  path = os.path.join(workdir, "eval_step_20.ks=1,4+splits=test.json")
  assert f"Written {path}" in out.stdout
  with open(path) as f:
    assert list(json.load(f)["results"]) == ["test"]


@pytest.mark.slow
def test_eval_py_all_steps_and_workdirs(runs, tmp_path):
  first = next(iter(runs))
  out = eval_py(f"--workdir={first}", "--all_steps", "--best_by=train:digit/recall@1",
                f"--output={tmp_path / 'steps.json'}")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "| 10 | test |" in out.stdout and "Best checkpoint by train:digit/recall@1" in out.stdout
  assert os.path.exists(tmp_path / "steps.png")
  out = eval_py(f"--workdirs={','.join(runs)}", f"--output={tmp_path / 'seeds.json'}")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "2 runs" in out.stdout and " ± " in out.stdout
  with open(tmp_path / "seeds.json") as f:
    assert json.load(f)["runs"] == list(runs.values())


@pytest.mark.slow
def test_eval_py_errors_exit_nonzero_without_traceback(runs):
  workdir = next(iter(runs))
  for args, message in ((["--all_steps", "--best_by=test/map@r"], "is a test split"),
                        (["--all_steps", "--step=7"], "takes neither --step"),
                        ([f"--workdirs={workdir}"], "exactly one of --workdir"),
                        (["--retrieval_grid=2", "--grid_k=0"],
                         "eval.py: --grid_k=0: the gallery images per query must be >= 1."),
                        (["--retrieval_grid=2", "--grid_seed=-1"],
                         "eval.py: --grid_seed=-1: the seed of the grid's random queries must "
                         "be >= 0."),
                        (["--all_steps", f"--output={workdir}"],   # checked before evaluating
                         f"eval.py: --output={workdir} cannot be written (Is a directory)."),
                        (["--all_steps", f"--output={workdir}/config.json"],   # the run's own
                         f"{workdir}/config.json exists and is not an earlier eval.py result"),
                        (["--set=data.name=cub"],
                         "eval.py: --set=data.name=cub: eval.py changes only the evaluation"),
                        (["--set=eval.ks=1", "--retrieval_grid=2"],
                         "eval.py: --set evaluates under other settings than the run's")):
    out = eval_py(f"--workdir={workdir}", *args)
    assert out.returncode == 1, args
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


@pytest.mark.slow
def test_evaluation_benchmark_smoke(tmp_path):
  out = subprocess.run([sys.executable, "benchmarks/speed/evaluation.py", "--smoke",
                        f"--out={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  with open(tmp_path / "evaluation.json") as f:
    report = json.load(f)
  rows = {(r["data"], r["method"]): r for r in report["rows"]}
  for data in ("clustered", "unstructured"):   # both kinds of embeddings in one run
    ours = rows[data, "dml_jax"]
    assert ours["seconds"] > 0 and ours["peak_mib_above"] < 2048
    assert 0 <= ours["metrics"]["recall@1"] < 1 and "recall@100" in ours["metrics"]
    assert f"| {data} | 2,000 | dml_jax |" in out.stdout
    for method in ("faiss", "faiss_1t", "pml"):   # optional: same numbers, or skipped
      row = rows[data, method]
      if "skipped" in row:
        assert "not installed" in row["skipped"]
      else:
        for key, value in row["metrics"].items():
          assert value == pytest.approx(ours["metrics"][key], abs=1e-3), (method, key)
  # clustered embeddings are found, unstructured ones hardly
  assert (rows["clustered", "dml_jax"]["metrics"]["recall@1"]
          > 10 * rows["unstructured", "dml_jax"]["metrics"]["recall@1"])


def test_a_grid_or_an_export_of_a_run_without_protocols_is_one_line(runs, tmp_path):
  """A run trained with ``eval.splits=()``: the retrieval grid and the embedding export take
  the first protocol, so they are refused with one line (not an IndexError after embedding)."""
  workdir = str(tmp_path / "noeval")
  shutil.copytree(next(iter(runs)), workdir)
  config = workdir_lib.load_config(workdir)
  config.eval.splits = ()
  workdir_lib.write_config(config, workdir)
  for options in ({"grid": {"num_queries": 4}}, {"export_embeddings": True}):
    with pytest.raises(ValueError, match="eval.splits is empty"):
      eval_checkpoints.evaluate_checkpoint(workdir, **options)
