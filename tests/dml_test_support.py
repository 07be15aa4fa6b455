"""Helpers shared by several test files (importable because conftest puts tests/ on sys.path)."""

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


def ranked_gallery(query, gallery, kind):
  """Brute-force oracle in float64: for every query, ``[(similarity, gallery index), ...]``
  over explicit pairs, sorted by (-similarity, index); self excluded when ``gallery`` is None."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  exclude_self = gallery is None
  q = np.asarray(query, np.float64)
  g = q if exclude_self else np.asarray(gallery, np.float64)
  ranked = []
  for i in range(q.shape[0]):
    scored = []
    for j in range(g.shape[0]):
      if exclude_self and i == j:
        continue
      if kind == "cosine":
        s = q[i] @ g[j] / (np.linalg.norm(q[i]) * np.linalg.norm(g[j]))
      elif kind == "dot":
        s = q[i] @ g[j]
      else:
        s = -np.sum((q[i] - g[j]) ** 2)
      scored.append((-s, j))
    scored.sort()
    ranked.append([(-s, j) for s, j in scored])
  return ranked


def random_batch(seed=0, b=12, d=4, normalize=True):
  """float32 ``[b, d]`` Gaussian rows, L2-normalised unless ``normalize=False``."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  x = np.random.default_rng(seed).normal(size=(b, d)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True) if normalize else x


_COMPILED = {}


def objective_value_and_grad(name, argnums=1, **hparams):
  """``jit(value_and_grad(make(name, **hparams).apply, argnums, has_aux=True))``, built once per
  configuration and shared by every test file (compilation dominates test time here)."""
  key = (name, argnums, tuple(sorted(hparams.items())))
  if key not in _COMPILED:
    import jax  # pylint: disable=import-outside-toplevel
    from dml_jax import objectives  # pylint: disable=import-outside-toplevel
    obj = objectives.make(name, **hparams)
    _COMPILED[key] = jax.jit(jax.value_and_grad(obj.apply, argnums=argnums, has_aux=True))
  return _COMPILED[key]
