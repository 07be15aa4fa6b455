"""Loss forms against explicit numpy loops: values, gradients and the edge cases."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oracles import fd_grad, masked_total, np_nca_all, np_triplet_all
from dml_jax import losses

RNG = np.random.default_rng(0)
B, N = 5, 7
S_AP = RNG.uniform(-1, 1, size=(B, N))
S_NEG = RNG.uniform(-1, 1, size=(B, N))
NEG_MASK = RNG.uniform(size=(B, N)) < 0.6
NEG_MASK[3] = False            # an anchor without negatives
VALID = RNG.uniform(size=(B, N)) < 0.5


# ----------------------------------------------------------------------------- NCA


@pytest.mark.parametrize("temperature", [0.1, 1.0])
def test_nca_single_negative_is_the_two_way_softmax(temperature):
  s_ap, s_an = S_AP[0], S_NEG[0]
  want = -np.log(np.exp(s_ap / temperature)
                 / (np.exp(s_ap / temperature) + np.exp(s_an / temperature)))
  got = losses.nca(jnp.asarray(s_ap), jnp.asarray(s_an), temperature=temperature)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nca_is_stable_at_small_temperature_and_in_bf16():
  s_ap = jnp.array([1.0, -1.0, 0.3], jnp.bfloat16)
  s_an = jnp.array([-1.0, 1.0, 0.3], jnp.bfloat16)
  for fn in (losses.nca, losses.nca_2nd):
    out = fn(s_ap, s_an, temperature=0.01)
    assert out.dtype == jnp.float32
    chex.assert_tree_all_finite(out)
  out = losses.nca(s_ap, s_an, temperature=0.01)
  np.testing.assert_allclose(out, [0.0, 200.0, np.log(2.0)], rtol=1e-4, atol=1e-6)


def test_nca_2nd_matches_eq16():
  s_ap, s_an = S_AP[1], S_NEG[1]
  lp, ln = s_ap - s_ap ** 2 / 2, s_an ** 2 / 2
  want = -np.log(np.exp(lp) / (np.exp(lp) + np.exp(ln)))
  np.testing.assert_allclose(losses.nca_2nd(s_ap, s_an, temperature=1.0), want, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.1])
def test_nca_2nd_closed_form_gradient(temperature):
  """dL/dS_ap = -(1 - S_ap) q / T and dL/dS_an = S_an q / T (exactly the paper's at T = 1)."""
  s_ap, s_an = jnp.asarray(S_AP[2]), jnp.asarray(S_NEG[2])
  g_ap, g_an = jax.vmap(jax.grad(functools.partial(losses.nca_2nd, temperature=temperature),
                                 argnums=(0, 1)))(s_ap, s_an)
  lp, ln = (S_AP[2] - S_AP[2] ** 2 / 2) / temperature, (S_NEG[2] ** 2 / 2) / temperature
  q = np.exp(ln) / (np.exp(lp) + np.exp(ln))
  np.testing.assert_allclose(g_ap, -(1 - S_AP[2]) * q / temperature, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(g_an, S_NEG[2] * q / temperature, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("order", [1, 2])
def test_nca_all_negatives_matches_loop_values_and_gradients(order):
  t = 0.1
  fn = functools.partial(losses.nca_all_negatives, temperature=t, order=order)
  got = fn(S_AP, S_NEG, NEG_MASK)
  chex.assert_shape(got, (B, N))
  np.testing.assert_allclose(got, np_nca_all(S_AP, S_NEG, NEG_MASK, t, order),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[3], 0.0)
  total = lambda a, n: jnp.sum(jnp.where(VALID, fn(a, n, NEG_MASK), 0.0))
  g_ap, g_neg = jax.grad(total, argnums=(0, 1))(jnp.asarray(S_AP, jnp.float32),
                                               jnp.asarray(S_NEG, jnp.float32))
  want_ap = fd_grad(lambda a: masked_total(np_nca_all(a, S_NEG, NEG_MASK, t, order), VALID),
                    S_AP)
  want_neg = fd_grad(lambda n: masked_total(np_nca_all(S_AP, n, NEG_MASK, t, order), VALID),
                     S_NEG)
  np.testing.assert_allclose(g_ap, want_ap, rtol=1e-3, atol=1e-4)
  np.testing.assert_allclose(g_neg, want_neg, rtol=1e-3, atol=1e-4)


def test_nca_all_negatives_with_one_negative_equals_nca():
  mask = np.zeros((B, N), bool)
  mask[:, 2] = True
  got = losses.nca_all_negatives(S_AP, S_NEG, mask, temperature=0.1)
  want = losses.nca(S_AP, S_NEG[:, 2:3], temperature=0.1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  got2 = losses.nca_all_negatives(S_AP, S_NEG, mask, temperature=0.1, order=2)
  np.testing.assert_allclose(got2, losses.nca_2nd(S_AP, S_NEG[:, 2:3], temperature=0.1),
                             rtol=1e-5, atol=1e-6)


def test_masked_logsumexp_of_empty_rows_has_finite_gradient():
  mask = np.array([[True, False, True], [False, False, False]])
  x = jnp.array([[0.5, 1e4, -0.5], [1e4, 2.0, -3.0]])
  lse, nonempty = losses.masked_logsumexp(x, mask, axis=1)
  np.testing.assert_allclose(lse[0], np.log(np.exp(0.5) + np.exp(-0.5)), rtol=1e-6)
  assert lse[1] < -1e29 and list(nonempty) == [True, False]
  g = jax.grad(lambda x: jnp.sum(jax.nn.softplus(losses.masked_logsumexp(x, mask)[0])))(x)
  chex.assert_tree_all_finite(g)
  np.testing.assert_array_equal(g[1], 0.0)
  assert g[0, 1] == 0.0


# ----------------------------------------------------------------------------- triplet


def test_triplet_single_negative_hinge():
  d2_ap = jnp.array([0.5, 0.5, 1.0])
  d2_an = jnp.array([0.4, 0.9, 1.5])
  np.testing.assert_allclose(losses.triplet(d2_ap, d2_an, margin=0.2), [0.3, 0.0, 0.0],
                             atol=1e-6)
  g = jax.grad(lambda a: jnp.sum(losses.triplet(a, d2_an, margin=0.2)))(d2_ap)
  np.testing.assert_array_equal(g, [1.0, 0.0, 0.0])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_triplet_all_negatives_matches_loop_values_and_gradients(reduction):
  d2_ap, d2_neg = 2 - 2 * S_AP, 2 - 2 * S_NEG
  fn = functools.partial(losses.triplet_all_negatives, margin=0.3, reduction=reduction)
  got = fn(d2_ap, d2_neg, NEG_MASK)
  chex.assert_shape(got, (B, N))
  want = np_triplet_all(d2_ap, d2_neg, NEG_MASK, 0.3, reduction)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert (want > 0).any() and (want[NEG_MASK.any(axis=1)] == 0).any()   # both regimes occur
  total = lambda a, n: jnp.sum(jnp.where(VALID, fn(a, n, NEG_MASK), 0.0))
  g_ap, g_neg = jax.grad(total, argnums=(0, 1))(jnp.asarray(d2_ap, jnp.float32),
                                               jnp.asarray(d2_neg, jnp.float32))
  want_ap = fd_grad(lambda a: masked_total(np_triplet_all(a, d2_neg, NEG_MASK, 0.3, reduction),
                                           VALID), d2_ap)
  want_neg = fd_grad(lambda n: masked_total(np_triplet_all(d2_ap, n, NEG_MASK, 0.3, reduction),
                                            VALID), d2_neg)
  np.testing.assert_allclose(g_ap, want_ap, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(g_neg, want_neg, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- reduction


def test_masked_mean_over_valid_terms():
  values = jnp.asarray(S_AP, jnp.float32)
  np.testing.assert_allclose(losses.masked_mean(values, VALID), S_AP[VALID].mean(), rtol=1e-6)
  one = np.zeros((B, N), bool)
  one[1, 2] = True                             # a single valid term: the mean is that term
  np.testing.assert_allclose(losses.masked_mean(values, one), S_AP[1, 2], rtol=1e-6)
  np.testing.assert_allclose(losses.reduce(values, one, "mean", counts=2.0), S_AP[1, 2] / 2,
                             rtol=1e-6)


def test_masked_mean_without_valid_terms_is_zero_with_zero_gradient():
  values = jnp.asarray(S_AP * 1e6, jnp.float32)
  none = jnp.zeros((B, N), bool)
  loss, g = jax.value_and_grad(lambda v: losses.masked_mean(v, none))(values)
  assert loss == 0.0 and loss.dtype == jnp.float32
  np.testing.assert_array_equal(g, 0.0)


def test_bad_hyper_parameters_are_rejected():
  with pytest.raises(ValueError, match="temperature must be > 0"):
    losses.nca(S_AP, S_NEG, temperature=0.0)
  with pytest.raises(ValueError, match="temperature must be > 0"):
    losses.nca_all_negatives(S_AP, S_NEG, NEG_MASK, temperature=-1.0)
  with pytest.raises(ValueError, match="order must be 1 or 2"):
    losses.nca_all_negatives(S_AP, S_NEG, NEG_MASK, order=3)
  with pytest.raises(ValueError, match="mean, sum"):
    losses.triplet_all_negatives(S_AP, S_NEG, NEG_MASK, reduction="max")


def test_scales_and_eps_must_be_positive():
  # alpha = 0 was a ZeroDivisionError in binomial and a NaN in multi_similarity; eps <= 0 a
  # NaN (or infinite gradient at d^2 = 0) in euclidean_distance
  pos = NEG_MASK   # any [B, N] mask
  for call, name in (
      (lambda: losses.binomial(S_NEG, pos, alpha=0.0), "alpha"),
      (lambda: losses.binomial(S_NEG, pos, beta=-2.0), "beta"),
      (lambda: losses.multi_similarity(S_NEG, pos, ~pos, alpha=0.0), "alpha"),
      (lambda: losses.multi_similarity(S_NEG, pos, ~pos, beta=-1.0), "beta"),
      (lambda: losses.euclidean_distance(S_NEG, eps=0.0), "eps")):
    with pytest.raises(ValueError, match=f"{name} must be > 0"):
      call()
