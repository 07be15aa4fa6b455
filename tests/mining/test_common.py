"""The miners' private helpers (dml_jax/mining/_common.py): the row search of the draws and
draws over a whole matrix, against numpy."""

import jax
import jax.numpy as jnp
import numpy as np

from dml_jax.mining import _common


def test_search_gathered_equals_numpy_searchsorted_right():
  rng = np.random.default_rng(0)
  for n in (1, 2, 7, 64, 100):
    rows = np.sort(rng.integers(0, 5, (6, n)).astype(np.float32), axis=1)   # ties and flats
    pick = rng.integers(0, 6, 300)
    values = rng.uniform(-1, 6, 300).astype(np.float32)
    values[:50] = rows[pick[:50], rng.integers(0, n, 50)]                      # exactly on entries
    got = np.asarray(jax.jit(_common.search_gathered)(rows, pick, values))
    want = [np.searchsorted(rows[r], v, side="right") for r, v in zip(pick, values)]
    np.testing.assert_array_equal(got, want, err_msg=f"n={n}")


def test_inverse_cdf_matrix_frequencies_and_zero_weights():
  rng = np.random.default_rng(1)
  w = (rng.random((5, 7)) * (rng.random((5, 7)) < 0.6)).astype(np.float32)
  w[3] = 0.0                                                  # a row that must never be drawn
  num = 400_000
  idx = np.asarray(jax.jit(lambda k: _common.inverse_cdf_matrix(k, jnp.asarray(w), num))(
      jax.random.key(0)))
  assert idx.dtype == np.int32 and idx.shape == (num,)
  counts = np.bincount(idx, minlength=w.size)
  assert counts[w.ravel() == 0].sum() == 0
  p = w.ravel().astype(np.float64) / w.sum()
  np.testing.assert_array_less(np.abs(counts / num - p), 5 * np.sqrt(p * (1 - p) / num) + 1e-9)


def test_inverse_cdf_matrix_resolves_entries_below_the_total_rounding():
  """A float32 CDF over all entries of a 1024 x 1024 matrix steps by about 6e-8 near its total,
  above a light entry's 1.9e-8 here: such a CDF drew none of the light half of the entries
  (1 % of the mass). In two stages (a row, then an entry of it) they keep their share."""
  n = 1024
  w = np.where(np.arange(n) % 2 == 1, 0.01, 1.0).astype(np.float32) * np.ones((n, n), np.float32)
  w /= w.sum()
  num = 200_000
  idx = np.asarray(jax.jit(lambda k, w: _common.inverse_cdf_matrix(k, w, num))(
      jax.random.key(0), w))
  light = (idx % n) % 2 == 1
  share = 0.01 / 1.01
  assert abs(light.mean() - share) < 5 * np.sqrt(share * (1 - share) / num), light.mean()
  rows = np.bincount(idx // n, minlength=n)   # every row carries 1 / n of the mass
  np.testing.assert_array_less(np.abs(rows - num / n), 5 * np.sqrt(num / n))
