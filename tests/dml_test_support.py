"""Configs and small runs shared by several test files (importable because conftest puts tests/
on sys.path); fake datasets: fake_datasets.py, mocked TFDS: tfds_mock.py, numpy references:
oracles.py, objective helpers: objective_support.py."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_config(num_train_steps=20, **overrides):
  """The digits EPS smoke config shrunk for tests; ``overrides`` use dotted keys."""
  from configs import digits_evenodd_eps  # pylint: disable=import-outside-toplevel
  c = digits_evenodd_eps.get_config("smoke")
  c.num_train_steps = num_train_steps
  c.batch_size = 32
  c.data.group_size = 16
  c.log_every_steps = 5
  c.checkpoint_every_steps = 10
  c.eval.plot = False
  for key, value in overrides.items():
    node = c
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = value
  return c
