"""Data parallelism: 8 (fake CPU) devices give the single-device global-batch results."""

import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dml_jax import objectives
from dml_jax import parallel
from dml_jax import similarity
from dml_jax.run import signals
from dml_jax.run import training
from dml_jax.run import workdir as workdir_lib
from dml_test_support import small_config, steps_on_1_and_8_devices

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (fake) devices; "
                                "tests/conftest.py sets XLA_FLAGS for that")

# Every registered objective at its defaults, and a few other selections.
VARIANTS = {
    "nca_negative_all": ("nca", {"negative": "all"}),
    "triplet_eps_random_neg": ("triplet", {"positive": "easy", "negative": "random"}),
}
CASES = {**{name: (name, {}) for name in objectives.names()}, **VARIANTS}


def batch(b=32, d=16, classes=8, seed=0):
  rng = np.random.default_rng(seed)
  emb = np.asarray(similarity.l2_normalize(jnp.asarray(rng.normal(size=(b, d)), jnp.float32)))
  labels = np.repeat(np.arange(classes), b // classes).astype(np.int32)
  return emb, labels[rng.permutation(b)]


@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_grad_on_8_devices_equal_1_device(case):
  name, hp = CASES[case]
  obj = objectives.make(name, **hp)
  emb, labels = batch()
  params = obj.init(jax.random.key(0), num_classes=8, dim=emb.shape[1])
  key = jax.random.key(42)

  def loss(e, y, p, k):
    return obj.apply(p, e, y, rng=k)[0]

  single = jax.jit(jax.value_and_grad(loss))
  one_dev = jax.devices()[0]
  l1, g1 = single(*jax.device_put((emb, labels, params, key), one_dev))

  mesh = parallel.make_mesh(8)
  rep, sh = parallel.replicated(mesh), parallel.batch_sharded(mesh)
  sharded = jax.jit(jax.value_and_grad(loss), in_shardings=(sh, sh, rep, rep),
                    out_shardings=(rep, sh))
  e8, y8 = parallel.global_batch(mesh, emb, labels, batch_size=len(labels))
  l8, g8 = sharded(e8, y8, parallel.replicate(mesh, params), parallel.replicate(mesh, key))
  assert len(g8.sharding.device_set) == 8
  np.testing.assert_allclose(float(l8), float(l1), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(g8), np.asarray(g1), atol=1e-5, rtol=1e-5)


def test_processes_stop_after_the_same_step():
  """Several processes stop after the step where every one has seen the signal (a vote over
  the devices, read a step later), so that they save one checkpoint together; one process
  stops at once."""
  mesh = parallel.make_mesh(8)
  assert int(parallel.process_max(mesh)(3)) == 3
  stop = signals.StopFlag()
  check = signals.stop_check(stop, mesh, processes=2)
  assert check() is None
  stop.set(signal.SIGTERM)
  assert check() is None            # this step's vote is read after the next step
  assert check() == signal.SIGTERM
  by_hand = signals.StopFlag()
  check = signals.stop_check(by_hand, mesh, processes=1)
  assert check() is None
  by_hand.set()
  assert check() == 0
  assert signals.stop_check(None, mesh)() is None


def test_batch_not_divisible_by_devices_is_a_clear_error():
  with pytest.raises(ValueError, match="batch_size=36 is not divisible by the number of devices"):
    parallel.check_batch_size(36, parallel.make_mesh(8))
  with pytest.raises(ValueError, match="num_devices=9"):
    parallel.make_mesh(9)


# The digits config with a 16-D cosine embedding. The 2-D unnormalised main config is
# equal step by step (test_each_train_step_on_8_devices_equals_1_device) but not over a
# free run: its semi-hard selections sit on near-ties that a 1e-7 rounding difference
# (another summation order across devices) flips, and Adam turns the ~1e-9 noise of the
# last-layer bias gradient (exactly 0 in exact arithmetic: -|x - y|^2 ignores a shift) into
# full-size steps.
STABLE = {"loss.similarity": "cosine", "model.normalize": True, "model.embedding_dim": 16,
          "eval.similarity": "cosine"}


def assert_same_run(ref, state, fraction=1e-3, tol=1e-5):
  """The final states of two runs of the STABLE config that differ only in summation order
  (the device count, the process count, a resume on another device count): equal to
  ``tol`` (absolute + relative) in all but ``fraction`` of the state's elements, and no element
  a whole Adam step (the learning rate) apart. Adam moves an element whose gradient is float32
  noise by up to the learning rate per step whatever the noise's size, so the odd element
  differs by more than the noise (1.1e-4 measured with XLA's convolutions, 3.5e-5 with the CPU
  kernels, in weights of scale 0.1; the 99.9th percentile 1e-6). The odd elements fall in any
  leaf, small ones too, so they are counted over the whole state: 1 of its 457,013 elements
  with JAX 0.10.2 (1 vs 8 devices), 86 with JAX 0.8.1, 2 of them among the 32 ``bn1`` biases."""
  step = small_config().optimizer.learning_rate
  off_where, total = {}, 0
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(ref)[0], jax.tree.leaves(state)):
    a, b = np.asarray(a), np.asarray(b)
    where = jax.tree_util.keystr(path)
    assert a.shape == b.shape, (where, a.shape, b.shape)
    gap = np.abs(a - b)
    off = int((gap > tol + tol * np.abs(a)).sum())
    off_where.update({where: off} if off else {})
    total += a.size
    assert gap.max() < step, (where, float(gap.max()))
  assert sum(off_where.values()) <= fraction * total, (
      f"{sum(off_where.values())} of {total} elements differ", off_where)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """``trained(num_devices)``: ``(workdir, results)`` of one 20-step run on that many devices,
  trained once for the tests of this file (in pytest's temporary directory)."""
  runs = {}

  def run(num_devices):
    if num_devices not in runs:
      workdir = str(tmp_path_factory.mktemp(f"par{num_devices}_"))
      config = small_config(20, num_devices=num_devices, **STABLE)
      runs[num_devices] = workdir, training.train_and_evaluate(config, workdir,
                                                                show_progress=False)
    return runs[num_devices]

  return run


def final_state(workdir):
  setup = training.build(workdir_lib.load_config(workdir))
  from dml_jax.run import checkpointing  # pylint: disable=import-outside-toplevel
  manager = checkpointing.make_manager(workdir, read_only=True)
  try:
    return checkpointing.restore(manager, setup.init_state)
  finally:
    manager.close()


def test_training_on_8_devices_equals_1_device(trained):
  w1, r1 = trained(1)
  w8, r8 = trained(8)
  _, s1, _ = final_state(w1)
  _, s8, _ = final_state(w8)
  assert_same_run(s1, s8)
  for protocol in r1:
    assert r8[protocol] == pytest.approx(r1[protocol], abs=1e-4)


def test_checkpoint_saved_on_8_devices_resumes_on_1(tmp_path, trained):
  workdir = str(tmp_path)
  training.train_and_evaluate(small_config(10, num_devices=8, **STABLE), workdir,
                              show_progress=False)
  results = training.train_and_evaluate(small_config(20, num_devices=1, **STABLE), workdir,
                                        show_progress=False)
  _, ref, _ = final_state(trained(1)[0])
  _, state, _ = final_state(workdir)
  assert_same_run(ref, state)
  for protocol in results:
    assert results[protocol] == pytest.approx(trained(1)[1][protocol], abs=1e-4)


def test_each_train_step_on_8_devices_equals_1_device():
  """The main digits config (2-D, unnormalised, SGD to avoid Adam's sign amplification of
  zero-gradient noise): from the same state, every step gives the same loss and parameters."""
  steps_on_1_and_8_devices(lambda **kw: small_config(20, **kw), 10)


def two_processes(workdir, overrides):
  """Runs train.py as 2 processes x 4 fake CPU devices on localhost (gloo collectives) on the
  smoke digits config; ``(return codes, outputs)``."""
  import os  # pylint: disable=import-outside-toplevel
  import socket  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from dml_test_support import ROOT  # pylint: disable=import-outside-toplevel

  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
  procs = [subprocess.Popen(
      [sys.executable, "train.py", "--config=configs/digits_evenodd_eps.py:smoke",
       f"--workdir={workdir}", "--noprogress", f"--coordinator_address=localhost:{port}",
       "--num_processes=2", f"--process_id={i}",
       *[f"--config.{k}={v}" for k, v in overrides.items()]],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outs = [p.communicate(timeout=300)[0] for p in procs]
  return [p.returncode for p in procs], outs


@pytest.mark.long
def test_two_processes_with_4_devices_equal_one_process_with_8(tmp_path, trained):
  """Multi-host on localhost: 2 processes x 4 fake CPU devices (gloo collectives)."""
  import os  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / "multihost")
  codes, outs = two_processes(workdir, {"batch_size": 32, "data.group_size": 16, **STABLE})
  assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
  assert "| test |" in outs[0] and "| test |" not in outs[1]   # only process 0 reports
  assert "dml_jax: 8 x cpu devices, 2 processes, batch 32 (4 per device)" in outs[0]
  assert "dml_jax:" not in outs[1]
  # Both processes computed the batch histograms (a collective); process 0 alone wrote them.
  assert len(os.listdir(os.path.join(workdir, "tensorboard", "train"))) == 1

  _, multi, _ = final_state(workdir)
  _, single, _ = final_state(trained(8)[0])
  assert_same_run(single, multi)


@pytest.mark.long
def test_two_processes_on_a_workdir_in_use_both_stop_in_one_line(tmp_path):
  """Process 0 finds the workdir's lock held by another run; the other process stops with it
  (no process waits in a collective for one that stopped), nothing written."""
  import os  # pylint: disable=import-outside-toplevel
  from dml_jax.run import workdir_lock  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / "multihost")
  with workdir_lock.hold(workdir, program="holder"):
    codes, outs = two_processes(workdir, {"batch_size": 32, "data.group_size": 16})
    assert os.listdir(workdir) == [workdir_lock.LOCK_FILE]
  assert codes == [1, 1], outs[0][-3000:] + outs[1][-3000:]
  assert f"train.py: {workdir} is in use: holder (pid {os.getpid()} on host" in outs[0]
  assert f"train.py: {workdir}: process 0 refused it (its output says why)" in outs[1]


def test_checkpoint_saved_on_1_device_resumes_on_8(tmp_path, trained):
  workdir = str(tmp_path)
  training.train_and_evaluate(small_config(10, num_devices=1, **STABLE), workdir,
                              show_progress=False)
  training.train_and_evaluate(small_config(20, num_devices=8, **STABLE), workdir,
                              show_progress=False)
  _, ref, _ = final_state(trained(8)[0])
  _, state, _ = final_state(workdir)
  assert_same_run(ref, state)
