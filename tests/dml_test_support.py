"""Configs and small runs shared by several test files (importable because conftest puts tests/
on sys.path); fake datasets: fake_datasets.py, mocked TFDS: tfds_mock.py, numpy references:
oracles.py, objective helpers: objective_support.py."""

import importlib
import os
import sys
import textwrap

import jax
import numpy as np

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


def snapshot(workdir):
  """``{relative path: bytes}`` of every file under ``workdir``."""
  files = {}
  for root, _, names in os.walk(workdir):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        files[os.path.relpath(path, workdir)] = f.read()
  return files


def leaves_equal(a, b, atol=0.0):
  """Whether two pytrees have the same leaves up to ``atol``."""
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  return all(np.allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0) for x, y in zip(la, lb))


def restore_state(workdir, step=None):
  """``(step, state, extra)`` of ``workdir``'s newest (or ``step``'s) checkpoint."""
  from dml_jax.run import checkpointing  # pylint: disable=import-outside-toplevel
  from dml_jax.run import training  # pylint: disable=import-outside-toplevel
  from dml_jax.run import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  setup = training.build(workdir_lib.load_config(workdir))
  manager = checkpointing.make_manager(workdir, read_only=True)
  try:
    return checkpointing.restore(manager, setup.init_state, step=step)
  finally:
    manager.close()


def load_benchmark(name: str):
  """The module ``benchmarks.<name>`` (``'speed.xbm'``: ``benchmarks/speed/xbm.py``), imported
  once."""
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  return importlib.import_module(f"benchmarks.{name}")


def require_kernel(source: str) -> dict:
  """The targets of the C++ kernel ``source`` (``dml_jax.kernels.load``), or skip the calling
  test saying why it is not available here (another backend, another CPU, switched off, no
  compiler)."""
  from dml_jax import kernels  # pylint: disable=import-outside-toplevel
  import pytest  # pylint: disable=import-outside-toplevel
  targets = kernels.load(source)
  if targets is None:
    pytest.skip(f"the C++ kernel {source} is not available here: "
                f"{kernels.unavailable() or 'its build failed (no compiler?)'}")
  return targets


def require_compiler() -> None:
  """Skip the calling test where there is no C++ compiler (``dml_jax.kernels.compiler``)."""
  from dml_jax import kernels  # pylint: disable=import-outside-toplevel
  import pytest  # pylint: disable=import-outside-toplevel
  try:
    kernels.compiler()
  except OSError as e:
    pytest.skip(str(e))


def load_device_script(name: str):
  """The module ``benchmarks/device/<name>.py``, imported once."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  module = sys.modules.get(f"dml_jax_device_{name}")
  if module is None:
    spec = importlib.util.spec_from_file_location(
        f"dml_jax_device_{name}", os.path.join(ROOT, "benchmarks", "device", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
  return module


def steps_on_1_and_8_devices(make_config, num_steps: int):
  """Trains ``make_config(num_devices=n)`` (SGD, learning rate 0.01) on 1 and on 8 devices
  from the same state for ``num_steps`` steps, asserting after each step that both give the
  same loss and state (to 1e-5); returns the final state."""
  import pytest  # pylint: disable=import-outside-toplevel
  from dml_jax import parallel  # pylint: disable=import-outside-toplevel
  from dml_jax.run import training  # pylint: disable=import-outside-toplevel
  overrides = {"optimizer.name": "sgd", "optimizer.learning_rate": 0.01}
  setups = {n: training.build(make_config(num_devices=n, **overrides)) for n in (1, 8)}
  steps = {n: training.make_train_step(s) for n, s in setups.items()}
  state = jax.device_get(setups[1].init_state)
  train = setups[1].splits["train"]
  for t in range(1, num_steps + 1):
    idx = setups[1].sampler.batch_indices(t - 1)
    out = {}
    for n, setup in setups.items():
      images, labels = parallel.global_batch(setup.mesh, train.images[idx], train.labels[idx],
                                             batch_size=len(idx))
      new, metrics = steps[n](parallel.replicate(setup.mesh, state), images, labels,
                              training.step_key(0, t))
      out[n] = (float(metrics["loss"]), jax.device_get(new))
    assert out[8][0] == pytest.approx(out[1][0], abs=1e-5)
    for a, b in zip(jax.tree.leaves(out[1][1]), jax.tree.leaves(out[8][1])):
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    state = out[1][1]
  return state


# A user module that registers an objective (train.py --module, config.user_modules).
USER_MODULE = textwrap.dedent('''
    from dml_jax import objectives

    @objectives.register("scaled_triplet")
    def scaled_triplet(*, scale: float = 2.0, margin: float = 0.2,
                       similarity: str = "neg_sq_euclidean"):
      init, apply = objectives.triplet(margin=margin, similarity=similarity)

      def scaled(params, embeddings, labels, *, rng=None):
        loss, aux = apply(params, embeddings, labels, rng=rng)
        return scale * loss, aux

      return init, scaled
''')


def write_user_module(directory) -> str:
  path = os.path.join(directory, "my_objectives.py")
  with open(path, "w") as f:
    f.write(USER_MODULE)
  return path
