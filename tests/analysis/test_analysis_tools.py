"""Collapse, sampling skew, distributions, t-SNE: numpy oracles on small batches, PNGs, CLIs."""

import json
import os

import jax
import numpy as np
import pytest

from dml_jax import mining
from dml_jax.analysis import collapse, common, distributions, scatter, skew, tsne


def blobs(centres, per, scale, rng):
  return np.concatenate([c + scale * rng.normal(size=(per, len(c))) for c in centres])


def test_similarity_matrix_kinds():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(4, 3)), rng.normal(size=(5, 3))
  d2 = ((x[:, None] - y[None]) ** 2).sum(-1)
  np.testing.assert_allclose(common.similarity_matrix(x, y, kind="neg_sq_euclidean"), -d2,
                             rtol=1e-5, atol=1e-5)
  xn = x / np.linalg.norm(x, axis=1, keepdims=True)
  yn = y / np.linalg.norm(y, axis=1, keepdims=True)
  np.testing.assert_allclose(common.similarity_matrix(x, y), xn @ yn.T, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="similarity"):
    common.similarity_matrix(x, kind="l1")


def test_squared_euclidean_similarity_of_embeddings_far_from_the_origin():
  # 256 from the origin in 16-D with distances near 0.3: 2<x, y> - |x|^2 - |y|^2 on the raw
  # embeddings rounds with |x|^2 ~ 1e6 (float32 steps of 0.06-0.12); moved by their mean the
  # distances come out as float64's.
  rng = np.random.default_rng(0)
  x = (256.0 + 0.1 * rng.normal(size=(40, 16))).astype(np.float32)
  want = -((x[:10, None].astype(np.float64) - x[None]) ** 2).sum(-1)
  got = common.similarity_matrix(x[:10], x, kind="neg_sq_euclidean")
  np.testing.assert_allclose(got, want, atol=1e-4)
  whole = common.similarity_matrix(x, kind="neg_sq_euclidean")
  np.testing.assert_array_equal(whole[:10], got)   # blocks of x: the same shift


def test_collapse_counts_modes_and_spread(tmp_path):
  rng = np.random.default_rng(0)
  class0 = blobs([[5, 0], [-5, 0], [0, 5]], 40, 0.3, rng)    # 3 modes
  class1 = blobs([[0, -5]], 120, 0.3, rng)                    # collapsed: 1 mode
  x = np.concatenate([class0, class1])
  y = np.repeat([0, 1], 120)
  sub = np.concatenate([np.repeat([0, 1, 2], 40), np.full(120, 3)])
  for method in collapse.MODE_METHODS:
    got = collapse.modes_per_class(x, y, similarity="dot", method=method, max_modes=4)
    assert got["modes"].tolist() == [3, 1], method
  spread = collapse.intra_class_spread(x, y, similarity="dot")
  want0 = np.mean(np.sum((class0 - class0.mean(0)) ** 2, 1))
  assert spread["spread"][0] == pytest.approx(want0)
  assert spread["relative_spread"][1] < 0.02 < spread["relative_spread"][0]
  report = collapse.collapse_report(x, y, sub, similarity="dot", max_modes=4)
  assert report["subclasses"] == [3, 1] and report["rho"] >= 0
  json.dumps(report)
  collapse.plot_collapse(report, path=str(tmp_path / "c.png"))
  assert (tmp_path / "c.png").stat().st_size > 1000


def test_collapse_plot_of_many_classes_draws_histograms(tmp_path, monkeypatch):
  n = collapse.PER_CLASS_PLOT_LIMIT + 1
  report = {"classes": list(range(n)), "modes": [1 + c % 3 for c in range(n)],
            "subclasses": [2] * n, "relative_spread": list(np.linspace(0.1, 0.9, n)),
            "rho": 0.5, "method": "bic"}
  drawn = {}
  monkeypatch.setattr(common, "save", lambda fig, path: drawn.update(fig=fig) or path)
  collapse.plot_collapse(report, path=str(tmp_path / "c.png"))
  a1, a2 = drawn["fig"].axes
  assert a1.get_xlabel() == "modes per class" and a2.get_ylabel() == "classes"
  assert len(a2.get_xticklabels()) < 20   # not a label per class
  heights = [p.get_height() for p in a1.patches]
  assert sum(heights) == 2 * n            # every class once in each of the two histograms


def test_skew_selected_distances_follow_mining_select():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(12, 4)).astype(np.float32)
  y = np.repeat(np.arange(4), 3)
  xn = x / np.linalg.norm(x, axis=1, keepdims=True)
  d = np.sqrt(np.maximum(((xn[:, None] - xn[None]) ** 2).sum(-1), 0))
  chosen, all_neg = skew.selected_negative_distances(x, y, strategy="semihard",
                                                     key=jax.random.key(0))
  # Oracle: for each (a, p) positive pair, the closest negative farther than the positive.
  want = []
  for a in range(12):
    for p in range(12):
      if p != a and y[p] == y[a]:
        cands = [d[a, n] for n in range(12) if y[n] != y[a] and d[a, n] ** 2 >= d[a, p] ** 2]
        if cands:
          want.append(min(cands))
  np.testing.assert_allclose(np.sort(chosen), np.sort(want), rtol=1e-4)
  np.testing.assert_allclose(np.sort(all_neg),
                             np.sort(d[y[:, None] != y[None, :]]), rtol=1e-4)
  hard, _ = skew.selected_negative_distances(x, y, strategy="hard", key=jax.random.key(0))
  assert np.all(hard <= np.sort(chosen).max() + 1e-6)
  with pytest.raises(ValueError, match="strategy"):
    skew.selected_negative_distances(x, y, strategy="easy", key=jax.random.key(0))


def test_skew_random_semihard_margin_is_in_the_units_of_the_distance():
  """distance='euclidean' mines on -d as the triplet objective does: the terms that find a
  random semi-hard negative are those with d_an < d_ap + margin, not d_an^2 < d_ap^2 + margin;
  every selected negative is one of the term's candidates."""
  rng = np.random.default_rng(1)
  x = rng.normal(size=(16, 4)).astype(np.float32)
  y = np.repeat(np.arange(4), 4)
  xn = x / np.linalg.norm(x, axis=1, keepdims=True)
  d = np.sqrt(np.maximum(((xn[:, None] - xn[None]) ** 2).sum(-1), 0))
  counts = {}
  for distance, f in (("squared", np.square), ("euclidean", lambda v: v)):
    chosen, _ = skew.selected_negative_distances(x, y, strategy="semihard_random", margin=0.5,
                                                 distance=distance, key=jax.random.key(0))
    candidates = [d[a, n] for a in range(16) for p in range(16) if p != a and y[p] == y[a]
                  for n in range(16) if y[n] != y[a] and f(d[a, n]) < f(d[a, p]) + 0.5]
    terms = sum(any(y[n] != y[a] and f(d[a, n]) < f(d[a, p]) + 0.5 for n in range(16))
                for a in range(16) for p in range(16) if p != a and y[p] == y[a])
    assert len(chosen) == terms, distance
    assert np.isclose(chosen[:, None], np.array(candidates)[None], atol=1e-5).any(1).all()
    counts[distance] = terms
  assert counts["squared"] != counts["euclidean"]
  with pytest.raises(ValueError, match="distance 'l1'"):
    skew.selected_negative_distances(x, y, strategy="semihard", distance="l1",
                                     key=jax.random.key(0))


def test_skew_measures_uniform_vs_skewed(tmp_path):
  rng = np.random.default_rng(0)
  reference = rng.uniform(0, 2, 100_000)
  uniform = skew.skew_measures(rng.choice(reference, 20_000), reference)
  assert uniform["eta_hat"] < 1.15 and uniform["kl"] < 0.01 and abs(uniform["mean_shift"]) < 0.05
  hard = skew.skew_measures(reference[reference < 0.5], reference)
  assert hard["eta_hat"] == pytest.approx(4.0, rel=0.05) and hard["mean_shift"] < -1
  x = rng.normal(size=(32, 8)).astype(np.float32)
  y = np.repeat(np.arange(8), 4)
  report = skew.skew_report([(x, y)], strategies=("semihard", "hard", "random"), min_count=5)
  assert report["hard"]["mean_shift"] < report["random"]["mean_shift"]
  skew.plot_skew(report, path=str(tmp_path / "k.png"))
  assert (tmp_path / "k.png").stat().st_size > 1000


def test_skew_without_batches_names_the_bad_value():
  with pytest.raises(ValueError, match="no batches"):
    skew.skew_report([])
  with pytest.raises(ValueError, match="--num_batches=0"):
    skew.main(["--workdir=/nonexistent", "--num_batches=0"])


def test_distributions_oracle_and_plot(tmp_path):
  rng = np.random.default_rng(0)
  train, test = rng.normal(size=(10, 3)), rng.normal(size=(6, 3))
  ytr, yte = np.arange(10) % 3, np.arange(6) % 2
  same, diff = distributions.pair_similarities(train, ytr)
  s = common.similarity_matrix(train)
  want_same = [s[i, j] for i in range(10) for j in range(i + 1, 10) if ytr[i] == ytr[j]]
  np.testing.assert_allclose(np.sort(same), np.sort(want_same), rtol=1e-5)
  assert len(same) + len(diff) == 45
  closest = distributions.closest_gallery_similarity(test, train, block_size=4)
  np.testing.assert_allclose(closest, common.similarity_matrix(test, train).max(1), rtol=1e-6)
  d = distributions.distributions(train, ytr, test, yte)
  np.testing.assert_allclose(d["test_s_ap"], scatter.scatter_points(test, yte)[0])
  distributions.plot_distributions(d, path=str(tmp_path / "d.png"))
  assert (tmp_path / "d.png").stat().st_size > 1000


def test_pairs_unrank_in_row_major_order():
  for n in (2, 3, 7, 40):
    i, j = distributions._unrank_pairs(np.arange(n * (n - 1) // 2), n)
    want = np.array([(a, b) for a in range(n) for b in range(a + 1, n)])
    np.testing.assert_array_equal(np.stack([i, j], 1), want)
  n = 300_000   # float sqrt near row boundaries, at SOP scale and beyond
  before = lambda r: r * (2 * n - r - 1) // 2
  t = np.concatenate([before(np.arange(1, n - 1)) + d for d in (-1, 0, 1)])
  t = np.concatenate([t[t < n * (n - 1) // 2],
                      np.random.default_rng(0).integers(0, n * (n - 1) // 2, 10_000)])
  i, j = distributions._unrank_pairs(t, n)
  assert np.all((0 <= i) & (i < j) & (j < n))
  np.testing.assert_array_equal(before(i) + (j - i - 1), t)
  # one item count per index (the classes' own pairs at once)
  i, j = distributions._unrank_pairs([0, 2, 0, 5], [3, 3, 4, 4])
  np.testing.assert_array_equal(np.stack([i, j], 1), [[0, 1], [1, 2], [0, 1], [2, 3]])


@pytest.mark.parametrize("kind", ["cosine", "dot", "neg_sq_euclidean"])
def test_pair_similarities_every_pair_or_a_uniform_sample(kind):
  rng = np.random.default_rng(1)
  x, y = rng.normal(size=(130, 5)), rng.integers(0, 6, 130)
  s = common.similarity_matrix(x, kind=kind)
  i, j = np.triu_indices(130, 1)
  same = y[i] == y[j]
  got_same, got_diff = distributions.pair_similarities(x, y, similarity=kind, block_size=16)
  np.testing.assert_allclose(np.sort(got_same), np.sort(s[i[same], j[same]]), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(np.sort(got_diff), np.sort(s[i[~same], j[~same]]), rtol=1e-5,
                             atol=1e-5)
  # sampled: max_pairs distinct pairs of the right kind, the same for the same seed
  a = distributions.pair_similarities(x, y, similarity=kind, max_pairs=300, block_size=16)
  b = distributions.pair_similarities(x, y, similarity=kind, max_pairs=300, block_size=16)
  for got, want in zip(a, (s[i[same], j[same]], s[i[~same], j[~same]])):
    assert len(got) == 300 and len(np.unique(got)) == 300
    assert np.isin(got, want).all()
  for u, v in zip(a, b):
    np.testing.assert_array_equal(u, v)


def test_pair_similarities_sample_is_uniform():
  # 4 items of class 0, 3 of class 1: 9 same and 12 different pairs; 6 of each drawn, 3000
  # times: every pair is drawn about 6/9 resp. 6/12 of the times
  x = np.eye(7) + 0.1 * np.arange(7)[:, None]
  y = np.array([0, 0, 0, 0, 1, 1, 1])
  s = common.similarity_matrix(x)
  i, j = np.triu_indices(7, 1)
  same = y[i] == y[j]
  counts = [np.zeros(same.sum()), np.zeros((~same).sum())]
  for seed in range(3000):
    for c, got, want in zip(counts, distributions.pair_similarities(x, y, max_pairs=6, seed=seed),
                            (s[i[same], j[same]], s[i[~same], j[~same]])):
      c += np.isclose(got[:, None], want[None, :], rtol=0, atol=1e-6).sum(0)
  np.testing.assert_allclose(counts[0] / 3000, 6 / 9, atol=0.04)
  np.testing.assert_allclose(counts[1] / 3000, 6 / 12, atol=0.04)


def test_distributions_statistics_leave_out_missing_anchors():
  rng = np.random.default_rng(2)
  train, test = rng.normal(size=(12, 3)), rng.normal(size=(7, 3))
  ytr, yte = np.arange(12) % 4, np.array([0, 0, 1, 1, 2, 2, 3])   # test item 6: no positive
  d = distributions.distributions(train, ytr, test, yte)
  stats = distributions.statistics(d)
  assert np.isnan(d["test_s_ap"][6])
  np.testing.assert_allclose(stats["test_s_ap/mean"], np.mean(d["test_s_ap"][:6]), rtol=1e-6)
  np.testing.assert_allclose(stats["train_same/median"], np.median(d["train_same"]), rtol=1e-6)
  np.testing.assert_allclose(stats["test_to_train/q75"],
                             np.percentile(d["test_to_train"], 75), rtol=1e-6)
  s = common.similarity_matrix(train)
  np.fill_diagonal(s, -np.inf)
  np.testing.assert_allclose(d["train_to_train"], s.max(1), rtol=1e-6)
  assert stats["test_correct/mean"] == np.mean(d["test_correct"])


def test_tsne_plot(tmp_path):
  rng = np.random.default_rng(0)
  x = blobs([[4, 0, 0], [-4, 0, 0]], 15, 0.2, rng)
  points, idx = tsne.tsne_2d(x, max_points=20, similarity="dot", max_iter=250)
  assert points.shape == (20, 2) and len(np.unique(idx)) == 20
  labels = (idx >= 15).astype(int)
  tsne.plot_tsne([("train", points, {"class": labels, "sub": idx % 3})],
                 path=str(tmp_path / "t.png"))
  assert (tmp_path / "t.png").stat().st_size > 1000


def test_tsne_needs_four_points_after_subsampling():
  x = np.random.default_rng(0).normal(size=(30, 3))
  for bad in (0, 3):
    with pytest.raises(ValueError, match=f"max_points={bad}"):
      tsne.tsne_2d(x, max_points=bad)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  from dml_jax.run import training
  from dml_test_support import small_config
  wd = str(tmp_path_factory.mktemp("analysis_run"))
  training.train_and_evaluate(small_config(10), wd, show_progress=False)
  return wd


def test_clis_write_pngs(workdir, tmp_path):
  from dml_jax.analysis import scatter as sc
  out = str(tmp_path)
  assert sc.main([f"--workdir={workdir}", f"--out={out}", "--split=train",
                  "--label_set=digit"]) == 0
  assert sc.main([f"--workdir={workdir}", f"--out={out}", "--at_init"]) == 0
  assert collapse.main([f"--workdir={workdir}", f"--out={out}", "--sub_label_set=digit",
                        "--max_modes=2"]) == 0
  assert skew.main([f"--workdir={workdir}", f"--out={out}", "--num_batches=2"]) == 0
  assert distributions.main([f"--workdir={workdir}", f"--out={out}"]) == 0
  assert tsne.main([f"--workdir={workdir}", f"--out={out}", "--max_points=60",
                    "--max_iter=250", "--splits=test"]) == 0
  pngs = sorted(f for f in os.listdir(out) if f.endswith(".png"))
  assert pngs == ["collapse_train_step_10.png", "sampling_skew_train_step_10.png",
                  "similarity_distributions_step_10.png", "triplet_scatter_test_step_0.png",
                  "triplet_scatter_train_digit_step_10.png", "tsne_step_10.png"]
  assert all(os.path.getsize(os.path.join(out, f)) > 1000 for f in pngs)
  with open(os.path.join(out, "collapse_train_step_10.json")) as f:
    assert json.load(f)["subclasses"] == [3, 3]
  with open(os.path.join(out, "similarity_distributions_step_10.json")) as f:
    report = json.load(f)
  assert report["step"] == 10 and report["similarity"] == "neg_sq_euclidean"   # the config's
  assert set(report["statistics"]) >= {"train_same/mean", "test_to_train/median",
                                       "test_correct/mean"}
