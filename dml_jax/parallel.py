"""Data parallelism over a 1-D ``('data',)`` device mesh, with global-batch mining.

The train step is one ``jax.jit`` program whose batch inputs are sharded along ``'data'`` and
whose state is replicated. Its semantics are those of the single-device program on the
*global* batch: the similarity matrix, the mining, the BatchNorm batch statistics (a mean over
the whole batch, i.e. synchronised BatchNorm) and the random numbers (threefry is partitionable)
are all global, and XLA's SPMD partitioner inserts the all-gathers and all-reduces. So a batch
mined on 8 devices gives the same loss, gradient and update as on 1 device, which
``tests/test_parallel.py`` checks.

Multi-host: every process computes the same global batch indices (the sampler is a pure function
of seed and step) and feeds only its own slice (:func:`process_slice`); :func:`global_batch`
assembles the global array from the per-process pieces.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

AXIS = "data"


def make_mesh(num_devices: int = 0) -> Mesh:
  """A 1-D mesh ``('data',)`` over the first ``num_devices`` devices (0 = all devices).

  Axis type ``Auto``: shardings are propagated by the compiler (``jax.make_mesh`` would
  default to ``Explicit``).

  Raises:
    ValueError: more devices asked for than exist, or a negative count.
  """
  devices = jax.devices()
  if num_devices < 0 or num_devices > len(devices):
    raise ValueError(f"num_devices={num_devices}, but {len(devices)} device(s) exist "
                     f"({devices[0].platform}); use 0 for all of them.")
  if num_devices and jax.process_count() > 1 and num_devices != len(devices):
    raise ValueError("num_devices must be 0 (all devices) when running on several hosts.")
  chosen = devices[:num_devices] if num_devices else devices
  return Mesh(np.asarray(chosen), (AXIS,), axis_types=(AxisType.Auto,))


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array (train state, PRNG keys)."""
  return NamedSharding(mesh, P())


def batch_sharded(mesh: Mesh) -> NamedSharding:
  """Split along the leading (batch) axis over ``'data'``."""
  return NamedSharding(mesh, P(AXIS))


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
  """The global batch must split evenly over devices and processes."""
  n = mesh.devices.size
  if batch_size % n:
    raise ValueError(f"batch_size={batch_size} is not divisible by the number of devices "
                     f"({n}); use a multiple of {n} or set num_devices. (Classes may be split "
                     "across devices: mining always sees the global batch.)")


def process_slice(batch_size: int) -> slice:
  """The rows of the global batch this process feeds: ``[pid * B / P, (pid + 1) * B / P)``."""
  per = batch_size // jax.process_count()
  start = jax.process_index() * per
  return slice(start, start + per)


def global_batch(mesh: Mesh, *local_arrays: np.ndarray, batch_size: int):
  """Assembles global ``[B, ...]`` arrays sharded over ``'data'`` from this process's rows.

  Args:
    mesh: from :func:`make_mesh`.
    *local_arrays: this process's rows (``[B / num_processes, ...]``; the whole batch on one host).
    batch_size: the global ``B``.

  Returns:
    A tuple of ``jax.Array`` of shape ``[B, ...]``.
  """
  sharding = batch_sharded(mesh)
  return tuple(
      jax.make_array_from_process_local_data(sharding, np.asarray(x),
                                             (batch_size,) + tuple(np.shape(x)[1:]))
      for x in local_arrays)


def replicate(mesh: Mesh, tree):
  """Puts a pytree of arrays on every device of ``mesh`` (replicated)."""
  return jax.device_put(tree, replicated(mesh))


def process_max(mesh: Mesh):
  """``vote(value: int) -> jax.Array``: the largest ``value`` any process passed, as a
  replicated int32 scalar on the devices, not fetched (a collective: every process of the mesh
  calls ``vote`` the same number of times; the caller reads the result when it needs it)."""
  sharding, n = batch_sharded(mesh), mesh.devices.size
  local = len(mesh.local_devices)
  reduce = jax.jit(lambda x: x.max(), out_shardings=replicated(mesh))

  def vote(value: int) -> jax.Array:
    x = np.full((local,), value, np.int32)
    return reduce(jax.make_array_from_process_local_data(sharding, x, (n,)))

  return vote


def describe(mesh: Mesh, batch_size: int) -> str:
  """One line on what a run computes on, e.g. ``'8 x cpu devices, 1 process, batch 128
  (16 per device)'``."""
  devices = list(mesh.devices.flat)
  kinds = sorted({d.device_kind for d in devices})
  processes = jax.process_count()
  return (f"{len(devices)} x {'/'.join(kinds)} device{'s' * (len(devices) != 1)}, "
          f"{processes} process{'es' * (processes != 1)}, batch {batch_size} "
          f"({batch_size // len(devices)} per device)")
