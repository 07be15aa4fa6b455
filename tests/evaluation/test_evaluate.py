"""Evaluation protocols on top of the metrics: protocol parsing, fixed-shape embedding, output."""

import json
import os

import numpy as np
import pytest

from dml_jax.data import digits
from dml_jax.evaluation import evaluate


@pytest.fixture(scope="module")
def splits():
  return digits.load_digits_evenodd()


def test_parse_protocol(splits):
  assert evaluate.parse_protocol("test", splits) == ("test", None)
  assert evaluate.parse_protocol("train:digit", splits) == ("train", "digit")
  with pytest.raises(ValueError, match="unknown split 'val'"):
    evaluate.parse_protocol("val", splits)
  with pytest.raises(ValueError, match="no label set 'letter'"):
    evaluate.parse_protocol("train:letter", splits)


def test_embed_pads_to_one_shape_and_keeps_order():
  images = np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1)
  shapes = []

  def fn(x):
    shapes.append(x.shape)
    return x.reshape(len(x), 1) * 2.0

  out = evaluate.embed(fn, images, batch_size=4)
  assert {s[0] for s in shapes} == {4}
  np.testing.assert_array_equal(out[:, 0], 2.0 * np.arange(10))


def test_evaluate_splits_scores_label_sets(splits, tmp_path):
  # An "embedding" that is the one-hot digit: perfect by digit, so train:digit is perfect
  # while the even/odd training labels are not what it separates.
  def by_digit(split):
    onehot = np.eye(10, dtype=np.float32)[split.label_sets["digit"]]
    return onehot + 1e-3 * np.arange(len(onehot))[:, None] / len(onehot)

  table = {id(s.images): by_digit(s) for s in splits.values()}
  lookup = {}
  for s in splits.values():
    for i, row in enumerate(s.images):
      lookup[row.tobytes()] = table[id(s.images)][i]

  def fn(x):
    return np.stack([lookup[row.tobytes()] for row in np.asarray(x)])

  res = evaluate.evaluate_splits(fn, splits, protocols=("test", "train:digit"), ks=(1, 5),
                                 similarity="cosine", batch_size=256, plot_dir=str(tmp_path),
                                 step=7)
  assert res["test"]["recall@1"] == pytest.approx(1.0)
  assert res["train:digit"]["recall@1"] == pytest.approx(1.0)
  assert res["train:digit"]["nmi"] == pytest.approx(1.0)
  assert os.path.exists(tmp_path / "embedding_test_step_7.png")
  path = evaluate.write_results(res, workdir=str(tmp_path), step=7)
  with open(path) as f:
    assert json.load(f) == {"step": 7, "results": res}
  table_md = evaluate.format_table(res)
  assert "| train:digit |" in table_md and "100.00" in table_md
