"""Learning-rate schedules and the optimizers of ``config.optimizer`` against plain-numpy update
rules (torch.optim's MultiStepLR / SGD, the RMSProp of Tieleman & Hinton's lecture)."""

import ml_collections
import numpy as np
import pytest

from dml_jax import optimizers


def rates(n, **kw):
  kw = {"learning_rate": 0.1, "num_train_steps": n, **kw}
  sched = optimizers.learning_rate_schedule(**kw)
  return np.array([float(sched(t)) for t in range(n)])


def test_step_decays_at_the_named_steps_as_multisteplr():
  got = rates(40, schedule="step", decay_steps=(20, 30))
  want = 0.1 * 0.1 ** ((np.arange(40) >= 20).astype(int) + (np.arange(40) >= 30))
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_step_named_twice_decays_twice():
  got = rates(12, schedule="step", decay_steps=(5, 5))    # decay_steps and decay_epochs agree
  np.testing.assert_allclose(got[5:], 0.1 * 0.01, rtol=1e-6)


def test_warm_up_ramps_from_the_first_update_and_keeps_the_decays_at_their_steps():
  got = rates(40, schedule="step", decay_steps=(20, 30), warmup_steps=5)
  np.testing.assert_allclose(got[:5], 0.1 * np.arange(1, 6) / 5, rtol=1e-6)
  np.testing.assert_allclose(got[5:20], 0.1, rtol=1e-6)
  np.testing.assert_allclose(got[20:30], 0.01, rtol=1e-6)
  np.testing.assert_allclose(got[30:], 0.001, rtol=1e-6)
  cosine = rates(41, schedule="cosine", warmup_steps=5)
  assert cosine[0] > 0 and cosine[5] == pytest.approx(0.1)
  sched = optimizers.learning_rate_schedule(learning_rate=0.1, num_train_steps=41,
                                           schedule="cosine", warmup_steps=5)
  assert float(sched(41)) == pytest.approx(0.0, abs=1e-9)


def test_rmsprop_is_the_lectures_rule():
  """decay 0.9 (Tieleman & Hinton; TensorFlow's default), eps inside the square root."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  opt = ml_collections.ConfigDict({
      "name": "rmsprop", "learning_rate": 1e-3, "momentum": 0.0, "weight_decay": 0.0,
      "weight_decay_mode": "coupled", "schedule": "constant", "decay_steps": (),
      "decay_epochs": (), "decay_factor": 0.1, "warmup_steps": 0,
      "objective_learning_rate": 0.0, "backbone_learning_rate": 0.0,
      "head_learning_rate": 0.0})
  tx, _ = optimizers.make_optimizer(opt, num_train_steps=10)
  params = {"model": {"w": jnp.array([0.5, -2.0])}, "objective": {}}
  state = tx.init(params)
  w, ms = np.array([0.5, -2.0]), np.zeros(2)
  grads = np.random.default_rng(0).normal(size=(5, 2)) * 1e-3
  for g in grads:
    updates, state = tx.update({"model": {"w": jnp.asarray(g, jnp.float32)}, "objective": {}},
                               state, params)
    params = {"model": {"w": params["model"]["w"] + updates["model"]["w"]}, "objective": {}}
    ms = 0.9 * ms + 0.1 * g * g
    w = w - 1e-3 * g / np.sqrt(ms + 1e-8)
  np.testing.assert_allclose(params["model"]["w"], w, rtol=1e-5)


@pytest.mark.parametrize("decay_objective", [True, False])
def test_decay_objective_says_whether_the_objectives_parameters_decay(decay_objective):
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  opt = ml_collections.ConfigDict({
      "name": "sgd", "learning_rate": 0.1, "momentum": 0.0, "weight_decay": 0.5,
      "weight_decay_mode": "coupled", "schedule": "constant", "decay_steps": (),
      "decay_epochs": (), "decay_factor": 0.1, "warmup_steps": 0,
      "objective_learning_rate": 0.0, "backbone_learning_rate": 0.0,
      "head_learning_rate": 0.0, "decay_objective": decay_objective})
  tx, _ = optimizers.make_optimizer(opt, num_train_steps=10)
  params = {"model": {"w": jnp.ones(2)}, "objective": {"beta": jnp.ones(3)}}
  zeros = {"model": {"w": jnp.zeros(2)}, "objective": {"beta": jnp.zeros(3)}}
  updates, _ = tx.update(zeros, tx.init(params), params)
  np.testing.assert_allclose(updates["model"]["w"], -0.05)            # -lr * wd * w
  np.testing.assert_allclose(updates["objective"]["beta"], -0.05 if decay_objective else 0.0)
