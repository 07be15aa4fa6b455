"""experiments/: the reproduction drivers start (their imports and flags resolve); what they
train is tested with the training loop (tests/test_training.py)."""

import os
import subprocess
import sys

import pytest

from dml_test_support import ROOT


@pytest.mark.slow
@pytest.mark.parametrize("script, words", [
    ("digits_evenodd_seeds.py", "--num_train_steps"),
    ("mnist_evenodd_figure.py", "--triplet"),
])
def test_help_names_the_flags(script, words):
  out = subprocess.run([sys.executable, os.path.join("experiments", script), "--help"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": ROOT})
  assert "Traceback" not in out.stderr, out.stderr[-2000:]
  assert words in out.stdout + out.stderr   # absl's --help exits 1, argparse's 0
