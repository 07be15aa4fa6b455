"""experiments/: the reproduction drivers start (their imports and flags resolve); what they
train is tested with the training loop (tests/test_training.py)."""

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
])
def test_help_names_the_flags(script, words):
  out = subprocess.run([sys.executable, os.path.join("experiments", script), "--help"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": ROOT})
  assert "Traceback" not in out.stderr, out.stderr[-2000:]
  assert words in out.stdout + out.stderr   # absl's --help exits 1, argparse's 0


def _label_noise_figure():
  sys.path.insert(0, os.path.join(ROOT, "experiments"))
  try:
    import label_noise_figure  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  finally:
    sys.path.remove(os.path.join(ROOT, "experiments"))
  return label_noise_figure


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


def test_label_noise_figure_draws_the_committed_summary(tmp_path, capsys):
  figure = _label_noise_figure()
  summary = os.path.join(ROOT, "docs", "results", "reproductions", "label_noise.json")
  assert figure.main([f"--summary={summary}", f"--out={tmp_path / 'f.png'}"]) == 0
  assert os.path.getsize(tmp_path / "f.png") > 10_000
  other = os.path.join(ROOT, "docs", "results", "reproductions", "headline.json")
  assert figure.main([f"--summary={other}", f"--out={tmp_path / 'g.png'}"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "label_noise_figure: " in err, err
