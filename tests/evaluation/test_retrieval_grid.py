"""Retrieval grid: queries (seeded / worst AP), neighbours and frames against a brute-force
reference, images of the in-memory digits and of lazy image folders (grey and colour)."""

import numpy as np
import pytest
from PIL import Image

from dml_jax import data as data_lib
from dml_jax.data import image_lists
from dml_jax.evaluation import metrics
from dml_jax.evaluation import protocols as protocols_lib
from dml_jax.evaluation import retrieval_grid

import fake_datasets


def brute_force_ap(x, labels):
  """MAP@R of every query of ``x [N, D]`` (cosine, self excluded), a loop."""
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  out = []
  for i in range(len(x)):
    s = x @ x[i]
    s[i] = -np.inf
    order = np.argsort(-s, kind="stable")
    r = int(np.sum(labels == labels[i])) - 1
    if r == 0:
      out.append(np.nan)
      continue
    hits = labels[order[:r]] == labels[i]
    out.append(np.sum(np.cumsum(hits) / np.arange(1, r + 1) * hits) / r)
  return np.array(out)


def test_queries_are_seeded_and_worst_has_the_lowest_ap():
  rng = np.random.default_rng(0)
  x, labels = rng.normal(size=(40, 3)), np.repeat(np.arange(8), 5)
  labels[-1] = 99   # a query without another item of its class is never the worst
  a = retrieval_grid.choose_queries(40, 6, seed=3)
  assert np.array_equal(a, retrieval_grid.choose_queries(40, 6, seed=3))
  assert not np.array_equal(a, retrieval_grid.choose_queries(40, 6, seed=4))
  assert len(set(a.tolist())) == 6
  ap = retrieval_grid.average_precisions(x, labels)
  np.testing.assert_allclose(ap, brute_force_ap(x, labels), atol=1e-6)
  worst = retrieval_grid.choose_queries(40, 5, mode="worst", average_precision=ap)
  assert np.nanmax(ap[worst]) <= np.nanmin(np.delete(ap, worst))
  assert 39 not in worst
  with pytest.raises(ValueError, match="needs 1 to 40"):
    retrieval_grid.choose_queries(40, 41)


def test_top_k_excludes_self_and_matches_a_sort():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(12, 4))
  rows = np.array([0, 5, 11])
  idx, sims = retrieval_grid.top_k(x, rows=rows, k=4)
  xn = x / np.linalg.norm(x, axis=1, keepdims=True)
  for r, row in enumerate(rows):
    s = xn @ xn[row]
    s[row] = -np.inf
    assert idx[r].tolist() == np.argsort(-s, kind="stable")[:4].tolist()
    np.testing.assert_allclose(sims[r], s[idx[r]], atol=1e-6)
  with pytest.raises(ValueError, match="between 1 and 11"):
    retrieval_grid.top_k(x, rows=rows, k=12)


def test_top_k_of_embeddings_far_from_the_origin_are_the_searchs():
  # -|x - y|^2 computed as 2 <x, y> - |x|^2 - |y|^2 rounds with |x|^2: 256 from the origin in
  # 16 dimensions its float32 steps (~0.1) exceed these distances; the grid must show the
  # neighbours and distances of the embeddings (the evaluation's search, knn), not rounding
  rng = np.random.default_rng(0)
  c = rng.normal(size=(20, 16)) * 0.3
  x = (c[np.arange(400) % 20] + 0.1 * rng.normal(size=(400, 16))).astype(np.float32) + 256
  rows = np.arange(0, 400, 7)
  idx, sims = retrieval_grid.top_k(x, rows=rows, k=5, similarity="neg_sq_euclidean")
  x64 = x.astype(np.float64)
  d = ((x64[rows, None] - x64[None]) ** 2).sum(-1)
  d[np.arange(len(rows)), rows] = np.inf
  want = np.argsort(d, axis=1, kind="stable")[:, :5]
  np.testing.assert_array_equal(idx, want)
  np.testing.assert_allclose(sims, -np.take_along_axis(d, want, axis=1), atol=1e-4)


def check_png(path, min_size=(200, 200)):
  with Image.open(path) as image:
    image.load()
    assert image.size[0] >= min_size[0] and image.size[1] >= min_size[1]


def test_grid_on_the_digits(tmp_path):
  splits = data_lib.load("digits_evenodd")
  labels = splits["test"].labels
  emb = {"test": np.eye(4)[labels] + 0.01 * np.random.default_rng(0).normal(size=(len(labels), 4))}
  out = retrieval_grid.write_grid(emb, splits, protocol="test", path=str(tmp_path / "g.png"),
                                  num_queries=5, k=3, seed=1)
  assert out["correct"].all()     # one-hot embeddings of the label retrieve the same class
  assert out["neighbours"].shape == (5, 3) and (out["neighbours"] != out["queries"][:, None]).all()
  check_png(out["path"])
  # Queries named by digit, as the embedding plots are (the test labels are 0..3 for 6..9).
  digits = splits["test"].label_sets["digit"][out["queries"]]
  assert out["captions"] == [f"digit {d}" for d in digits] and set(digits) <= {6, 7, 8, 9}
  # Other labels (train digits by digit), and the query count checked before any work.
  train = {"train": np.random.default_rng(2).normal(size=(len(splits["train"].labels), 4))}
  out = retrieval_grid.write_grid(train, splits, protocol="train:digit", num_queries=3, k=2,
                                  path=str(tmp_path / "d.png"))
  digit = splits["train"].label_sets["digit"]
  np.testing.assert_array_equal(out["correct"],
                                digit[out["neighbours"]] == digit[out["queries"]][:, None])
  with pytest.raises(ValueError, match=r"--retrieval_grid=100000: the query set of protocol "
                     r"'test' has \d+ images"):
    protocols_lib.check_retrieval_grid("test", splits, num_queries=100000)
  gallery = len(splits["test"].labels) - 1   # its own gallery, the query left out
  for k in (0, gallery + 1):
    with pytest.raises(ValueError, match=rf"--grid_k={k}: the gallery of protocol 'test' has "
                       rf"{gallery} images; ask for a top 1 to {gallery}\."):
      protocols_lib.check_retrieval_grid("test", splits, num_queries=3, k=k)
  protocols_lib.check_retrieval_grid("test", splits, num_queries=3, k=gallery)
  with pytest.raises(ValueError, match=r"--grid_k=100000: the gallery of protocol "
                     r"'test@train' has \d+ images"):
    protocols_lib.check_retrieval_grid("test@train", splits, num_queries=3, k=100000)


@pytest.mark.parametrize("channels", [1, 3])
def test_grid_on_a_lazy_image_folder(tmp_path, channels):
  fake_datasets.write_class_images(str(tmp_path / "ds"), classes=8, per_class=4)
  splits = image_lists.load_image_folder(
      root=str(tmp_path / "ds"), image_size=12, resize_size=14, channels=channels,
      mean=(0.5,) * channels, std=(0.25,) * channels)
  test = splits["test"]
  assert isinstance(test.images, data_lib.LazyImages)
  shown = retrieval_grid.display_images(test.images, np.array([0, 3]))
  assert shown.shape == (2, 12, 12, 3) and 0.0 <= shown.min() and shown.max() <= 1.0
  raw = np.asarray(test.images[np.array([0])]) * 0.25 + 0.5   # de-normalised exactly
  np.testing.assert_allclose(shown[0, ..., 0], np.clip(raw[0, ..., 0], 0, 1), atol=1e-6)
  emb = {"test": np.random.default_rng(0).normal(size=(len(test.labels), 8))}
  out = retrieval_grid.write_grid(emb, splits, protocol="test", path=str(tmp_path / "g.png"),
                                  num_queries=4, k=5, mode="worst")
  check_png(out["path"])
  ap = retrieval_grid.average_precisions(emb["test"], test.labels)
  assert np.nanmax(ap[out["queries"]]) <= np.nanmin(np.delete(ap, out["queries"]))
  with pytest.raises(ValueError, match="needs 1 to 16"):
    retrieval_grid.write_grid(emb, splits, protocol="test", path=str(tmp_path / "x.png"),
                              num_queries=17)


def test_map_at_r_of_the_grid_is_the_metric():
  """average_precisions is the per-query MAP@R whose mean is retrieval_metrics' map@r."""
  rng = np.random.default_rng(3)
  x, labels = rng.normal(size=(30, 5)), np.repeat(np.arange(6), 5)
  ap = retrieval_grid.average_precisions(x, labels)
  assert np.mean(ap) == pytest.approx(metrics.retrieval_metrics(x, labels)["map@r"], abs=1e-6)
