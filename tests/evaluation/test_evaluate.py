"""Evaluation protocols on top of the metrics: protocol parsing, fixed-shape embedding, output."""

import json
import os

import numpy as np
import pytest

from dml_jax import data
from dml_jax.data import digits
from dml_jax.evaluation import compute
from dml_jax.evaluation import metrics
from dml_jax.evaluation import protocols as protocols_lib
from dml_jax.evaluation import report


@pytest.fixture(scope="module")
def splits():
  return digits.load_digits_evenodd()


def test_parse_protocol(splits):
  assert protocols_lib.parse_protocol("test", splits) == ("test", None, None)
  assert protocols_lib.parse_protocol("train:digit", splits) == ("train", "digit", None)
  with pytest.raises(ValueError, match="unknown split 'val'"):
    protocols_lib.parse_protocol("val", splits)
  with pytest.raises(ValueError, match="no label set 'letter'"):
    protocols_lib.parse_protocol("train:letter", splits)


def test_embed_pads_to_one_shape_and_keeps_order():
  images = np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1)
  shapes = []

  def fn(x):
    shapes.append(x.shape)
    return x.reshape(len(x), 1) * 2.0

  out = compute.embed(fn, images, batch_size=4)
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

  res = compute.evaluate_splits(fn, splits, protocols=("test", "train:digit"), ks=(1, 5),
                                 similarity="cosine", batch_size=256, plot_dir=str(tmp_path),
                                 step=7)
  assert res["test"]["recall@1"] == pytest.approx(1.0)
  assert res["train:digit"]["recall@1"] == pytest.approx(1.0)
  assert res["train:digit"]["nmi"] == pytest.approx(1.0)
  assert os.path.exists(tmp_path / "embedding_test_step_7.png")
  path = report.write_results(res, workdir=str(tmp_path), step=7)
  with open(path) as f:
    assert json.load(f) == {"step": 7, "results": res}
  table_md = report.format_table(res)
  assert "| train:digit |" in table_md and "100.00" in table_md


def test_a_results_file_is_written_whole(tmp_path, monkeypatch):
  """``eval_step_<N>.json`` marks a sweep's finished run, read by another process: a write cut
  off (a kill, a second Ctrl-C) before it is complete leaves the earlier file whole."""
  path = report.write_results({"test": {"recall@1": 0.5}}, workdir=str(tmp_path), step=7)

  def killed(*args):
    raise KeyboardInterrupt("second SIGINT")

  monkeypatch.setattr(report.os, "replace", killed)
  with pytest.raises(KeyboardInterrupt):
    report.write_results({"test": {"recall@1": 0.75}}, workdir=str(tmp_path), step=7)
  with open(path) as f:
    assert json.load(f)["results"] == {"test": {"recall@1": 0.5}}
  assert os.listdir(tmp_path) == ["eval_step_7.json"]


def flat(images):
  """The identity "model": an image [1, 1, D] is its own embedding."""
  return np.asarray(images).reshape(len(images), -1)


def toy_splits(seed=0):
  """Splits whose images are embeddings: train / test / query / gallery, with label sets."""
  rng = np.random.default_rng(seed)

  def split(name, n, classes):
    y = rng.integers(0, classes, size=n)
    y[:classes] = np.arange(classes)   # contiguous ids
    x = rng.normal(size=(n, 1, 1, 4)) + 2.0 * np.eye(4)[y % 4][:, None, None, :]
    return data.Split(images=x, labels=y, label_sets={"coarse": y // 2, "fine": y},
                        name=f"toy:{name}")

  return {"train": split("train", 40, 6), "test": split("test", 30, 6),
          "query": split("query", 25, 6), "gallery": split("gallery", 35, 6)}


def test_parse_protocol_gallery_syntax():
  splits = toy_splits()
  assert protocols_lib.parse_protocol("query@gallery", splits) == ("query", None, "gallery")
  assert protocols_lib.parse_protocol("test:coarse@train", splits) == ("test", "coarse", "train")
  for bad, match in [
      ("test@test", "the gallery is the query split; use 'test'"),
      ("test:coarse@test", "use 'test:coarse'"),
      ("test@", "malformed"), ("@train", "malformed"), ("a@b@c", "malformed"),
      ("test:a:b", "malformed"), ("", "malformed"),
      ("test@train:coarse", "the label set goes after the query split"),
      ("test@val", "unknown split 'val'"),
  ]:
    with pytest.raises(ValueError, match=match):
      protocols_lib.parse_protocol(bad, splits)
  splits["train"] = data.Split(images=splits["train"].images, labels=splits["train"].labels,
                                 name="toy:train")
  with pytest.raises(ValueError, match="split 'train' has no label set 'coarse'"):
    protocols_lib.parse_protocol("test:coarse@train", splits)


def test_protocols_score_the_right_embeddings_and_labels():
  splits = toy_splits()
  res = compute.evaluate_splits(
      flat, splits, protocols=("test", "query@gallery", "test:coarse@train"), ks=(1, 3),
      similarity="cosine", batch_size=8, metrics_groups=("retrieval", "clustering",
                                                         "spectral_decay"), rho_skip=1)
  emb = {name: flat(s.images) for name, s in splits.items()}
  lab = {name: s.labels for name, s in splits.items()}
  want = {
      "test": metrics.retrieval_metrics(emb["test"], lab["test"], ks=(1, 3)),
      "query@gallery": metrics.retrieval_metrics(emb["query"], lab["query"], emb["gallery"],
                                                 lab["gallery"], ks=(1, 3)),
      "test:coarse@train": metrics.retrieval_metrics(emb["test"], lab["test"] // 2,
                                                     emb["train"], lab["train"] // 2,
                                                     ks=(1, 3)),
  }
  for protocol, split, labels in (("test", "test", lab["test"]),
                                  ("query@gallery", "query", lab["query"]),
                                  ("test:coarse@train", "test", lab["test"] // 2)):
    unit = emb[split] / np.linalg.norm(emb[split], axis=1, keepdims=True)
    want[protocol].update(metrics.clustering_metrics(unit, labels))
    want[protocol]["rho"] = metrics.spectral_decay(unit, skip_largest=1)
    assert res[protocol] == pytest.approx(want[protocol], rel=1e-6, abs=1e-9), protocol
  assert list(res["test"]) == ["recall@1", "recall@3", "map@r", "r_precision", "nmi", "rho"]


def test_reciprocal_rank_ami_and_f1_on_request():
  splits = toy_splits()
  both = compute.evaluate_splits(
      flat, splits, protocols=("test", "query@gallery"), ks=(1, 3), batch_size=8,
      metrics_groups=("f1", "retrieval", "ami", "clustering", "mrr"), kmeans="sklearn",
      kmeans_n_init=2)
  assert list(both["test"]) == ["recall@1", "recall@3", "map@r", "r_precision", "mrr", "nmi",
                                "ami", "f1"]
  emb = {name: flat(s.images) for name, s in splits.items()}
  lab = {name: s.labels for name, s in splits.items()}
  want = metrics.retrieval_metrics(emb["query"], lab["query"], emb["gallery"], lab["gallery"],
                                   ks=(1, 3), reciprocal_rank=True)
  unit = emb["query"] / np.linalg.norm(emb["query"], axis=1, keepdims=True)
  want.update(metrics.clustering_metrics(unit, lab["query"], kmeans="sklearn", n_init=2,
                                         scores=("nmi", "ami", "f1")))
  assert both["query@gallery"] == pytest.approx(want, rel=1e-6, abs=1e-9)
  # each alone: the same numbers, no cut-off needed for the reciprocal rank (ks=() and a
  # dataset without a default list)
  alone = compute.evaluate_splits(flat, splits, protocols=("test", "query@gallery"), ks=(),
                                  batch_size=8, metrics_groups=("mrr", "f1"),
                                  kmeans="sklearn", kmeans_n_init=2)
  for protocol, row in alone.items():
    assert row == {"mrr": both[protocol]["mrr"], "f1": both[protocol]["f1"]}, protocol
  # with NMI+: the same scores of the over-clustered partition; without 'clustering', no NMI+
  plus = compute.evaluate_splits(flat, splits, protocols=("test",), ks=(1,), batch_size=8,
                                 metrics_groups=("clustering", "ami", "f1"), overcluster=2,
                                 kmeans="sklearn", kmeans_n_init=2)
  assert sorted(plus["test"], key=report.metric_sort_key) == ["nmi", "nmi+", "ami", "ami+", "f1",
                                                              "f1+"]
  assert {k: plus["test"][k] for k in ("nmi", "ami", "f1")} == {
      k: both["test"][k] for k in ("nmi", "ami", "f1")}
  assert "ami+" not in compute.evaluate_splits(
      flat, splits, protocols=("test",), ks=(1,), batch_size=8, metrics_groups=("ami",),
      overcluster=2, kmeans="sklearn", kmeans_n_init=2)["test"]
  table = report.format_table(both)
  assert table.splitlines()[0] == ("| protocol | recall@1 | recall@3 | map@r | r_precision | mrr "
                                   "| nmi | ami | f1 |")
  assert protocols_lib.parse_selection("train/ami") == ("train", "ami")


def test_default_ks_by_dataset_and_metric_groups():
  splits = toy_splits()
  protocols_lib.DEFAULT_KS["toy"] = (1, 2)   # the dataset is read from the split names 'toy:*'
  try:
    res = compute.evaluate_splits(flat, splits, protocols=("test",), ks=(), batch_size=64,
                                   metrics_groups=("retrieval",))
  finally:
    del protocols_lib.DEFAULT_KS["toy"]
  assert list(res["test"]) == ["recall@1", "recall@2", "map@r", "r_precision"]
  assert protocols_lib.default_ks("sop") == (1, 10, 100, 1000)
  assert protocols_lib.default_ks("cars196") == (1, 2, 4, 8, 16, 32)
  assert protocols_lib.default_ks("inshop") == (1, 10, 20, 30, 40, 50)
  assert protocols_lib.default_ks("digits_evenodd") == (1, 5, 10)
  with pytest.raises(ValueError, match="No default Recall@K list for dataset 'toy'"):
    compute.evaluate_splits(flat, splits, protocols=("test",), ks=(), batch_size=64)
  with pytest.raises(ValueError, match="Unknown evaluation metrics .*'map'"):
    compute.evaluate_splits(flat, splits, protocols=("test",), ks=(1,),
                             metrics_groups=("retrieval", "map"))


def test_bad_embeddings_and_large_k_name_the_protocol():
  splits = toy_splits()

  def diverged(images):
    out = flat(images).copy()
    out[1, 2] = np.nan
    return out

  with pytest.raises(ValueError, match=r"embeddings of split 'test' has 1 non-finite .*"
                                       r"rows \[1\]"):
    compute.evaluate_splits(diverged, splits, protocols=("test",), ks=(1,), batch_size=64)
  with pytest.raises(ValueError, match=r"protocol 'query@gallery': Recall@50 .* 35 gallery"):
    compute.evaluate_splits(flat, splits, protocols=("query@gallery",), ks=(1, 50),
                             batch_size=64)


def test_model_selection_refuses_test_splits():
  assert protocols_lib.parse_selection("val/recall@1") == ("val", "recall@1")
  assert protocols_lib.parse_selection("train:digit/map@r") == ("train:digit", "map@r")
  for spec in ("test/recall@1", "test:digit/map@r", "query@gallery/recall@1",
               "val@test/recall@1", "test_small/nmi"):
    with pytest.raises(ValueError, match="is a test split"):
      protocols_lib.parse_selection(spec)
  for spec, match in (("val", "PROTOCOL/METRIC"), ("val/", "PROTOCOL/METRIC"),
                      ("val/rho", "higher is")):
    with pytest.raises(ValueError, match=match):
      protocols_lib.parse_selection(spec)
  history = {10: {"val": {"recall@1": 0.5}}, 20: {"val": {"recall@1": 0.7}},
             30: {"val": {"recall@1": 0.7}}}
  assert protocols_lib.best_step(history, protocol="val", metric="recall@1") == 20
  with pytest.raises(ValueError, match="no val/map@r"):
    protocols_lib.best_step(history, protocol="val", metric="map@r")


def test_aggregate_tables_and_curves(tmp_path):
  runs = [{"test": {"recall@1": 0.5, "rho": 1.0}}, {"test": {"recall@1": 0.7, "rho": 2.0}},
          {"test": {"recall@1": 0.6, "rho": 3.0}}]
  summary = report.aggregate(runs)
  assert summary["test"]["recall@1"]["mean"] == pytest.approx(0.6)
  assert summary["test"]["recall@1"]["std"] == pytest.approx(0.1)   # ddof = 1
  assert summary["test"]["rho"]["values"] == [1.0, 2.0, 3.0]
  table = report.format_aggregate_table(summary)
  assert "| test | 60.00 ± 10.00 | 2.0000 ± 1.0000 |" in table
  assert report.aggregate(runs[:1])["test"]["rho"]["std"] == 0.0
  with pytest.raises(ValueError, match="Run 1 has protocols / metrics"):
    report.aggregate([runs[0], {"test": {"recall@1": 0.5}}])
  assert "| test | 50.00 | 1.0000 |" in report.format_table(runs[0])
  history = {10: runs[0], 20: runs[1]}
  assert "| 20 | test | 70.00 | 2.0000 |" in report.format_history_table(history)
  path = report.plot_curves(history, path=str(tmp_path / "curves.png"), title="t")
  assert os.path.getsize(path) > 1000


def test_gallery_protocol_refuses_separately_numbered_splits():
  """Class-disjoint splits both number their classes from 0: 'test@train' would match
  unrelated classes; the error points to the original classes ('test:class@train')."""
  images = np.zeros((8, 2, 2, 1), np.float32)
  splits = data.class_split(images, np.array([0, 0, 1, 1, 2, 2, 3, 3]),
                              train_classes=[0, 1], test_classes=[2, 3])
  with pytest.raises(ValueError, match=r"label 0 is class 2 .* class 0 .*test:class@train"):
    protocols_lib.parse_protocol("test@train", splits)
  assert protocols_lib.parse_protocol("test:class@train", splits).label_set == "class"
  shared = {"query": splits["train"], "gallery": splits["train"]}
  assert protocols_lib.parse_protocol("query@gallery", shared).gallery == "gallery"


def test_nmi_plus_only_where_the_clusters_fit(splits):
  """EPS Table 3: NMI+ with 30x the classes on the languages; on the letters 30x the classes
  exceeds the drawings, so that protocol gets NMI only instead of an error."""
  def fn(x):
    x = np.asarray(x).reshape(len(x), -1)
    return x[:, :4] + 1e-3 * x[:, 4:8]

  # 'train': 2 classes, 1,083 points (400 clusters fit); 'train:digit': 6 classes (1,200 do not).
  res = compute.evaluate_splits(fn, splits, protocols=("train", "train:digit"), ks=(1,),
                                 overcluster=200, kmeans_n_init=1)
  assert "nmi+" in res["train"] and "nmi" in res["train"]
  assert "nmi+" not in res["train:digit"] and "nmi" in res["train:digit"]
