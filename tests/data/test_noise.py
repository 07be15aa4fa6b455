"""Label noise (label-noise paper eqs. 6-8): rates, support, pair rates vs Monte Carlo."""

import numpy as np
import pytest

from dml_jax.data import noise
from dml_jax.data import splits


def test_uniform_label_noise_rate_and_support():
  k, n = 5, 200_000
  labels = np.random.default_rng(0).integers(0, k, n)
  noisy = noise.uniform_label_noise(labels, rate=0.3, num_classes=k, seed=1)
  changed = noisy != labels
  assert noisy.dtype == np.int32 and noisy.min() >= 0 and noisy.max() < k
  assert abs(changed.mean() - 0.3) < 0.005
  # Corrupted labels are uniform over the other K-1 classes.
  for y in range(k):
    sel = changed & (labels == y)
    counts = np.bincount(noisy[sel], minlength=k) / sel.sum()
    assert counts[y] == 0
    np.testing.assert_allclose(np.delete(counts, y), 1 / (k - 1), atol=0.01)


def test_uniform_label_noise_edges_and_determinism():
  labels = np.arange(10) % 3
  np.testing.assert_array_equal(noise.uniform_label_noise(labels, rate=0.0, num_classes=3,
                                                          seed=0), labels)
  assert np.all(noise.uniform_label_noise(labels, rate=1.0, num_classes=3, seed=0) != labels)
  a = noise.uniform_label_noise(labels, rate=0.5, num_classes=3, seed=7)
  np.testing.assert_array_equal(a, noise.uniform_label_noise(labels, rate=0.5, num_classes=3,
                                                             seed=7))
  with pytest.raises(ValueError, match="rate"):
    noise.uniform_label_noise(labels, rate=1.5, num_classes=3, seed=0)
  with pytest.raises(ValueError, match="0..1"):
    noise.uniform_label_noise(labels, rate=0.1, num_classes=2, seed=0)
  with pytest.raises(ValueError, match="num_classes"):
    noise.uniform_label_noise(labels, rate=0.1, num_classes=1, seed=0)


def test_clean_subsample():
  idx = noise.clean_subsample(100, fraction=0.6, seed=3)
  assert idx.shape == (60,) and np.all(np.diff(idx) > 0) and idx.min() >= 0 and idx.max() < 100
  np.testing.assert_array_equal(idx, noise.clean_subsample(100, fraction=0.6, seed=3))
  assert noise.clean_subsample(100, fraction=1.0, seed=0).tolist() == list(range(100))
  # round(fraction N), not its floor: 0.29 * 100 is 28.999999999999996 in floating point.
  assert [len(noise.clean_subsample(n, fraction=f, seed=0))
          for n, f in ((100, 0.29), (10, 0.77), (10, 0.01))] == [29, 8, 1]
  with pytest.raises(ValueError, match="fraction"):
    noise.clean_subsample(100, fraction=0.0, seed=0)
  with pytest.raises(ValueError, match="num"):
    noise.clean_subsample(0, fraction=0.5, seed=0)


@pytest.mark.parametrize("p,k", [(0.2, 3), (0.6, 3), (0.4, 10)])
def test_pair_noise_rates_match_monte_carlo(p, k):
  rng = np.random.default_rng(0)
  n = 400_000
  yi = rng.integers(0, k, n)
  yj_pos = yi.copy()
  yj_neg = (yi + rng.integers(1, k, n)) % k
  ni = noise.uniform_label_noise(yi, rate=p, num_classes=k, seed=1)
  nj_pos = noise.uniform_label_noise(yj_pos, rate=p, num_classes=k, seed=2)
  nj_neg = noise.uniform_label_noise(yj_neg, rate=p, num_classes=k, seed=3)
  mc_pos = np.mean(ni != nj_pos)
  mc_neg = np.mean(ni == nj_neg)
  q_pos, q_neg = noise.pair_noise_rates(p, k)
  assert abs(q_pos - mc_pos) < 0.004 and abs(q_neg - mc_neg) < 0.004
  printed_pos, printed_neg = noise.pair_noise_rates(p, k, as_printed=True)
  assert printed_neg == q_neg
  assert abs(printed_pos - q_pos) == pytest.approx(p * p / (k - 1))
  if p * p / (k - 1) > 0.02:   # the printed eq. 8 is measurably off
    assert abs(printed_pos - mc_pos) > 0.01


def test_pair_noise_rates_values():
  assert noise.pair_noise_rates(0.0, 5) == (0.0, 0.0)
  with pytest.raises(ValueError, match="num_classes"):
    noise.pair_noise_rates(0.1, 1)


def test_label_noise_that_empties_classes_renumbers_the_rest(caplog):
  """SOP-like: 300 classes of 2 images; noise at p = 0.6 moves both images of some classes
  away (and brings none): the split keeps contiguous ids, the clean labels stay as they were."""
  labels = np.repeat(np.arange(300), 2)
  train = splits.Split(images=np.zeros((600, 4, 4, 1), np.float32), labels=labels,
                       label_sets={}, name="sop-like")
  with caplog.at_level("WARNING"):
    noisy = noise.prepare_train_split(train, label_noise=0.6, clean_fraction=1.0, seed=0)
  emptied = 300 - noisy.num_classes
  assert emptied > 0 and set(np.unique(noisy.labels)) == set(range(noisy.num_classes))
  np.testing.assert_array_equal(noisy.label_sets["clean"], labels)
  assert any(f"data.label_noise=0.6: {emptied} of 300 training classes" in r.getMessage()
             for r in caplog.records)
  # the same partition of the examples as the noise itself
  raw = noise.uniform_label_noise(labels, rate=0.6, num_classes=300, seed=0)
  assert np.all((raw[:, None] == raw[None]) == (noisy.labels[:, None] == noisy.labels[None]))
