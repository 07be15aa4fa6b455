"""experiments/: the reproduction drivers start (their imports and flags resolve); what they
train is tested with the training loop (tests/test_training.py)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dml_test_support import ROOT


@pytest.mark.slow
@pytest.mark.parametrize("script, words", [
    ("digits_evenodd_seeds.py", "--num_train_steps"),
    ("mnist_evenodd_figure.py", "--triplet"),
    ("label_noise_figure.py", "--summary"),
    ("group_size_figure.py", "--columns"),
])
def test_help_names_the_flags(script, words):
  out = subprocess.run([sys.executable, os.path.join("experiments", script), "--help"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": ROOT})
  assert "Traceback" not in out.stderr, out.stderr[-2000:]
  assert words in out.stdout + out.stderr   # absl's --help exits 1, argparse's 0


def _experiment(name):
  sys.path.insert(0, os.path.join(ROOT, "experiments"))
  try:
    return __import__(name)
  finally:
    sys.path.remove(os.path.join(ROOT, "experiments"))


def _label_noise_figure():
  return _experiment("label_noise_figure")


def _noise_summary():
  """A label-noise summary of two rows whose every run has 3 seeds of R@1 and NMI."""
  figure = _label_noise_figure()
  headers = [h for _, _, noisy, clean in figure.CASES for h in (noisy, clean)]
  runs, rows = {}, []
  for p, base in (("0.0", 0.5), ("0.4", 0.3)):
    row = {"cells": [p], "protocol": "test", "runs": []}
    for j, header in enumerate(headers):
      name = f"{header}/p={p}"
      runs[name] = {str(s): {"test": {"recall@1": base + 0.01 * j + 0.02 * s, "nmi": 0.1 * s}}
                    for s in range(3)}
      row["runs"].append(name)
    rows.append(row)
  return {"title": "t", "columns": [{"header": h, "metric": "recall@1"} for h in headers],
          "rows": rows, "runs": runs, "stamp": {"commit": "abc", "date": "d"}}


def test_label_noise_figure_curves_are_the_seeds_mean_and_std(tmp_path):
  figure = _label_noise_figure()
  summary = _noise_summary()
  p, mean, std = figure.curve(summary, "fixed semi-hard", "recall@1")   # column 2
  np.testing.assert_allclose(p, [0.0, 0.4])
  np.testing.assert_allclose(mean, [100 * (0.5 + 0.02 + 0.02), 100 * (0.3 + 0.02 + 0.02)])
  np.testing.assert_allclose(std, [2.0, 2.0])
  path = figure.draw(summary, str(tmp_path / "f.png"))
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  del summary["columns"][-1]
  with pytest.raises(ValueError, match="no column \"clean 1−p \\(margin, Wu et al.'s\\)\""):
    figure.draw(summary, str(tmp_path / "g.png"))


def test_label_noise_figure_leaves_out_a_case_without_columns(tmp_path):
  """A summary without Wu et al.'s two columns (the Omniglot one) draws (a)-(c) and (d); one
  without any loss's column is one error."""
  figure = _label_noise_figure()
  summary = _noise_summary()
  wu = set(figure.CASES[-1][2:])
  keep = [j for j, c in enumerate(summary["columns"]) if c["header"] not in wu]
  summary["columns"] = [summary["columns"][j] for j in keep]
  for row in summary["rows"]:
    row["runs"] = [row["runs"][j] for j in keep]
  assert [case[0] for case in figure.cases(summary)] == ["a", "b", "c"]
  path = figure.draw(summary, str(tmp_path / "f.png"), title="Omniglot")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  summary["columns"] = [{"header": "R@1", "metric": "recall@1"}]
  with pytest.raises(ValueError, match="none of the columns"):
    figure.cases(summary)


def test_label_noise_figure_draws_the_committed_summary(tmp_path, capsys):
  figure = _label_noise_figure()
  summary = os.path.join(ROOT, "docs", "results", "reproductions", "label_noise.json")
  assert figure.main([f"--summary={summary}", f"--out={tmp_path / 'f.png'}"]) == 0
  assert os.path.getsize(tmp_path / "f.png") > 10_000
  other = os.path.join(ROOT, "docs", "results", "reproductions", "headline.json")
  assert figure.main([f"--summary={other}", f"--out={tmp_path / 'g.png'}"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "label_noise_figure: " in err, err


def _group_size_summary():
  """Two methods over n = 2, 4: B's n = 2 row repeats A's run (``"2 (= A)"``); 3 seeds."""
  runs = {f"{m}/{n}": {str(s): {"test": {"recall@1": base + 0.1 * n + 0.02 * s},
                                "train": {"recall@1": 0.9 - 0.01 * s}} for s in range(3)}
          for m, base in (("a", 0.1), ("b", 0.2)) for n in (2, 4)}
  rows = [{"cells": ["A", "2"], "run": "a/2", "protocol": "test"},
          {"cells": ["", "4"], "run": "a/4", "protocol": "test"},
          {"cells": ["B", "2 (= A)"], "run": "a/2", "protocol": "test"},
          {"cells": ["", "4"], "run": "b/4", "protocol": "test"}]
  return {"title": "t", "labels": ["method", "n"],
          "columns": [{"header": "R@1", "metric": "recall@1"},
                      {"header": "train R@1", "metric": "recall@1", "protocol": "train"}],
          "rows": rows, "runs": runs, "stamp": {"commit": "abc", "date": "d"}}


def test_group_size_figure_curves_follow_the_rows(tmp_path):
  figure = _experiment("group_size_figure")
  summary = _group_size_summary()
  lines = figure.curves(summary, "R@1")
  assert list(lines) == ["A", "B"]
  np.testing.assert_allclose(lines["A"][0], [2, 4])
  np.testing.assert_allclose(lines["A"][1], [100 * (0.1 + 0.2 + 0.02), 100 * (0.1 + 0.4 + 0.02)])
  np.testing.assert_allclose(lines["B"][1], [100 * (0.1 + 0.2 + 0.02), 100 * (0.2 + 0.4 + 0.02)])
  np.testing.assert_allclose(lines["B"][2], [2.0, 2.0])
  np.testing.assert_allclose(figure.curves(summary, "train R@1")["A"][1], [89.0, 89.0])
  path = figure.draw(summary, ["R@1", "train R@1"], str(tmp_path / "f.png"))
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  summary["rows"][1]["cells"][-1] = "four"
  with pytest.raises(ValueError, match="'four' of a 'A' row does not start with a number"):
    figure.curves(summary, "R@1")
  summary["rows"][0]["cells"][0] = ""
  with pytest.raises(ValueError, match="first row names no method"):
    figure.curves(summary, "R@1")


def test_group_size_figure_rows_over_training_read_each_row_at_its_step():
  # rows (method, step) with a column per protocol: a row's "step" reads <protocol>@<step>,
  # its label "1,200" is the x value 1200; the last row (no step) reads the final evaluation
  figure = _experiment("group_size_figure")
  runs = {"a": {str(s): {"test@600": {"recall@1": 0.2 + 0.01 * s},
                         "train@600": {"recall@1": 0.5},
                         "test": {"recall@1": 0.4 + 0.01 * s}, "train": {"recall@1": 0.7}}
                for s in range(2)}}
  summary = {"title": "t", "labels": ["method", "steps"],
             "columns": [{"header": "R@1", "metric": "recall@1", "protocol": "test"},
                         {"header": "train R@1", "metric": "recall@1", "protocol": "train"}],
             "rows": [{"cells": ["A", "600"], "run": "a", "protocol": "test", "step": 600},
                      {"cells": ["", "1,200"], "run": "a", "protocol": "test"}],
             "runs": runs}
  x, mean, _ = figure.curves(summary, "R@1")["A"]
  np.testing.assert_allclose(x, [600, 1200])
  np.testing.assert_allclose(mean, [20.5, 40.5])
  np.testing.assert_allclose(figure.curves(summary, "train R@1")["A"][1], [50.0, 70.0])


def test_group_size_figure_steps_follow_the_evaluations(tmp_path, capsys):
  # --steps=test: one line per row over its runs' test@<step> results (the final "test" and
  # other protocols left out)
  figure = _experiment("group_size_figure")
  runs = {run: {str(s): {"test": {"recall@1": 0.9},
                         **{f"test@{t}": {"recall@1": b + t / 10_000 + s / 100}
                            for t in (600, 1200)},
                         "train@600": {"recall@1": 0.0}} for s in (0, 1)}
          for run, b in (("a", 0.1), ("b", 0.3))}
  summary = {"title": "t", "labels": ["mining", "n"],
             "columns": [{"header": "R@1", "metric": "recall@1", "protocol": "test@600"}],
             "rows": [{"cells": ["EP", "2"], "run": "a", "protocol": "test"},
                      {"cells": ["", "16"], "run": "b", "protocol": "test"}],
             "runs": runs, "stamp": {"commit": "abc", "date": "d"}}
  lines = figure.step_curves(summary, "test", "recall@1")
  assert list(lines) == ["EP, n = 2", "EP, n = 16"]
  np.testing.assert_allclose(lines["EP, n = 2"][0], [600, 1200])
  np.testing.assert_allclose(lines["EP, n = 2"][1], [100 * (0.1 + 0.06 + 0.005),
                                                     100 * (0.1 + 0.12 + 0.005)])
  np.testing.assert_allclose(lines["EP, n = 16"][2], [np.sqrt(0.5)] * 2)
  summary_path = tmp_path / "s.json"
  summary_path.write_text(json.dumps(summary))
  assert figure.main([f"--summary={summary_path}", "--steps=test", "--columns=recall@1",
                      f"--out={tmp_path / 'f.png'}"]) == 0
  for args, words in ((["--steps=valid", "--columns=recall@1"], "holds no valid@<step>"),
                      (["--steps=test", "--columns=map@r"], "no metric 'map@r'")):
    assert figure.main([f"--summary={summary_path}", *args,
                        f"--out={tmp_path / 'g.png'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_group_size_figure_steps_over_a_decade_are_on_a_log_axis(tmp_path, monkeypatch):
  """Evaluations from step 100 to 2,000 are drawn on a log axis, 600 to 1,200 on a linear
  one; each labelled at its steps. A long title is wrapped to the figure's width."""
  figure = _experiment("group_size_figure")
  drawn = []
  monkeypatch.setattr(figure.report, "save", lambda fig, path: drawn.append(fig) or path)
  for steps, scale in (((100, 300, 2000), "log"), ((600, 1200), "linear")):
    seeds = {str(s): {f"test@{t}": {"recall@1": 0.5 + t / 1e4 + s / 100} for t in steps}
             for s in (0, 1)}
    summary = {"title": "a long title " * 12, "labels": ["negative"],
               "columns": [{"header": f"R@1 {t}", "metric": "recall@1",
                            "protocol": f"test@{t}"} for t in steps],
               "rows": [{"cells": ["random"], "run": "a", "protocol": "test"}],
               "runs": {"a": seeds}, "stamp": {"commit": "abc", "date": "d"}}
    figure.draw(summary, ["recall@1"], str(tmp_path / "f.png"), steps="test")
    ax = drawn[-1].axes[0]
    assert ax.get_xscale() == scale
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"{t:,}" for t in steps]
    title = drawn[-1]._suptitle.get_text()   # pylint: disable=protected-access
    assert title.count("\n") >= 1 and max(map(len, title.split("\n"))) <= 80


def test_group_size_figure_draws_a_committed_summary(tmp_path, capsys):
  figure = _experiment("group_size_figure")
  summary = os.path.join(ROOT, "docs", "results", "reproductions", "omniglot_ephn_2nd.json")
  assert figure.main([f"--summary={summary}", "--columns=letters R@1,train letters R@1",
                      f"--out={tmp_path / 'f.png'}"]) == 0
  assert os.path.getsize(tmp_path / "f.png") > 10_000
  for args, words in (([f"--summary={summary}", "--columns=R@9"], "no column 'R@9'"),
                      ([f"--summary={summary}", "--columns=,"], "--columns names no column"),
                      ([f"--summary={os.path.join(os.path.dirname(summary), 'headline.json')}",
                        "--columns=R@1"], "is not a seeds summary")):
    assert figure.main([*args, f"--out={tmp_path / 'g.png'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "group_size_figure: " in err and words in err, err
