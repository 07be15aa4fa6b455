"""k-means in JAX, on the default device: k-means++ seeding, Lloyd iterations, restarts.

``kmeans(x, n_clusters=k, seed=s, n_init=r)`` minimises the inertia
``sum_i min_j |x_i - c_j|^2`` of ``x [N, D]`` (Euclidean; pass L2-normalised embeddings for
the cosine geometry) and returns the assignment of the restart of lowest inertia.

* **Seeding: greedy k-means++** (Arthur & Vassilvitskii; the greedy form is scikit-learn's),
  drawn in rounds. The first centre is a uniformly random point. Every later one is the best of
  ``L = 2 + floor(ln k)`` candidates drawn with probability proportional to ``D(x)^2``, the
  squared distance to the nearest centre chosen so far: the candidate of lowest potential
  ``sum_i min(D(x_i)^2, |x_i - c|^2)``. A round draws the candidates of ``b`` centres at once
  (``b L`` points without replacement, proportional to ``D^2`` before the round: Gumbel
  top-``bL``), takes the best of each group of ``L`` and updates ``D^2``; every step is a
  blocked ``[rows, bL]`` product (when ``x`` is one block, the chosen candidates' distances
  update ``D^2`` without a second product). With ``b = 1`` this is greedy k-means++ itself;
  ``b = ceil((k - 1) / seeding_rounds)`` (default 256 rounds) keeps the seeding a few hundred
  matrix products at large ``k`` (SOP: 11,316 clusters) instead of ``k`` passes over the data,
  and is exact up to 257 clusters. ``greedy=False`` draws one candidate (plain k-means++).
  (faiss, which pytorch-metric-learning's NMI uses, seeds with random points instead.)
* **Lloyd iterations**: assign every point to its nearest centre, move each centre to the
  mean of its points (on the CPU by a scatter-add, elsewhere by one-hot products over row
  blocks, so that a GPU, whose scatter-add adds in the order its atomics land, gives the same
  clustering on every run); a centre left without points moves to the point farthest from its own
  centre (the farthest first), as scikit-learn does. Stops when the centres move by at most
  ``tol`` times the mean per-dimension variance of ``x`` in squared distance (scikit-learn's
  rule), when no assignment changes, or after ``max_iter`` iterations; the assignment returned
  is the one of the final centres. The iterations run in compiled loops of ``LLOYD_STEPS``
  (:func:`lloyd`), the host looking in only between them: early embeddings need tens of
  iterations, and a round trip per iteration cost more than the iteration at small ``k``.
* **The assignment step** is the evaluation's blocked similarity: row blocks of ``x`` against
  all centres, ``S = 2 <x, c> - |c|^2`` (higher = closer, ``|x - c|^2 = |x|^2 - S``), a float32
  product at full precision on every platform (``similarity.inner_products``), so a GPU assigns
  as the CPU does. Each row's best centre is ``jnp.argmax``'s, taken on the CPU by a C++ kernel
  (``top_m_kernel.argmax_rows_kernel``: XLA:CPU's argmax cost twice the product) with the same
  result. Memory: ``x`` and the centres on the device plus one ``[rows, k]`` tile
  (``memory_bytes``, default 256 MiB).

Restarts draw their seeds from ``seed`` (``jax.random``), so the result is a deterministic
function of ``(x, k, seed, n_init)`` on a platform; it is not scikit-learn's random stream, so
the clusterings (and NMI) differ from scikit-learn's by the spread of k-means itself.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from dml_jax import kernels
from dml_jax import similarity
from dml_jax.evaluation import top_m_kernel

DEFAULT_MEMORY_BYTES = 256 * 2 ** 20
SEEDING_ROUNDS = 256
MAX_ITER = 100
TOL = 1e-4


@dataclasses.dataclass(frozen=True)
class KMeansResult:
  """The restart of lowest inertia.

  Attributes:
    assignment: int32 ``[N]``, cluster ids in ``[0, k)``.
    centres: float32 ``[k, D]``.
    inertia: ``sum_i |x_i - c_{a_i}|^2``.
    iterations: Lloyd iterations of that restart.
    inertias: the final inertia of every restart.
  """
  assignment: np.ndarray
  centres: np.ndarray
  inertia: float
  iterations: int
  inertias: tuple[float, ...]


MAX_BLOCK_ROWS = 2048   # larger tiles fall out of the caches (2.4x slower at 19,280 x 900)


def block_rows(num_points: int, num_clusters: int, memory_bytes: int, *,
               max_rows: int = MAX_BLOCK_ROWS) -> int:
  """Rows per tile: ``[rows, k]`` float32 tiles (with their temporaries) within
  ``memory_bytes``, at most ``max_rows`` and ``N``, at least 8."""
  rows = memory_bytes // (4 * 4 * max(num_clusters, 1))
  return int(max(8, min(num_points, rows, max_rows)))


def _blocks(x: jax.Array, rows: int) -> tuple[jax.Array, jax.Array]:
  """``x [N, D]`` zero-padded to ``[nb, rows, D]`` and the validity mask ``[nb, rows]``."""
  n = x.shape[0]
  nb = -(-n // rows)
  pad = nb * rows - n
  xb = jnp.pad(x, ((0, pad), (0, 0))).reshape(nb, rows, x.shape[1])
  valid = (jnp.arange(nb * rows) < n).reshape(nb, rows)
  return xb, valid


def _row_argmax(s: jax.Array, selection: str) -> tuple[jax.Array, jax.Array]:
  """``(argmax int32 [R], max [R])`` of ``s [R, k]`` (the first index of the maximum): the C++
  kernel where ``kernels.choose`` gives it, else ``jnp.argmax`` (the same numbers)."""
  if kernels.choose("top_m.cc", selection) is not None:
    return top_m_kernel.argmax_rows_kernel(s)
  a = jnp.argmax(s, axis=1).astype(jnp.int32)
  return a, jnp.take_along_axis(s, a[:, None], axis=1)[:, 0]


@functools.partial(jax.jit, static_argnames=("rows", "selection"))
def assign(x: jax.Array, centres: jax.Array, *, rows: int,
           selection: str = "auto") -> tuple[jax.Array, jax.Array]:
  """Nearest centre of every point, by row blocks.

  Args:
    x: float32 ``[N, D]``.
    centres: float32 ``[k, D]``.
    rows: rows per block (:func:`block_rows`).
    selection: the rows' argmax by the C++ kernel (``'kernel'``), by XLA (``'xla'``) or by
      the kernel where it is available (``'auto'``); the same result.

  Returns:
    ``(assignment int32 [N], squared distance float32 [N])``; ties go to the lower centre id.
  """
  n = x.shape[0]
  cc = jnp.sum(jnp.square(centres), axis=1)
  xb, _ = _blocks(x, rows)

  def block(xr):
    s = 2.0 * similarity.inner_products(xr, centres) - cc[None, :]      # [rows, k]
    a, best = _row_argmax(s, selection)
    return a, jnp.maximum(jnp.sum(jnp.square(xr), axis=1) - best, 0.0)

  a, d2 = jax.lax.map(block, xb)
  return a.reshape(-1)[:n], d2.reshape(-1)[:n]


def local_trials(k: int) -> int:
  """Candidates per centre of greedy k-means++: ``2 + floor(ln k)`` (scikit-learn's)."""
  return 2 + int(math.log(k))


@functools.partial(jax.jit, static_argnames=("k", "per_round", "trials", "rows"))
def seed_centres(x: jax.Array, key: jax.Array, *, k: int, per_round: int, trials: int,
                 rows: int) -> jax.Array:
  """Greedy k-means++ centres ``[k, D]`` drawn in rounds of ``per_round`` (module docstring):
  each centre is the best of ``trials`` candidates, in row blocks of ``rows``."""
  n, d = x.shape
  rounds = -(-(k - 1) // per_round)
  first_key, key = jax.random.split(key)
  first = x[jax.random.randint(first_key, (), 0, n)]
  xx = jnp.sum(jnp.square(x), axis=1)
  d2 = jnp.maximum(xx - 2.0 * similarity.inner_products(x, first[None])[:, 0]
                   + jnp.sum(jnp.square(first)), 0.0)
  chosen = jnp.zeros((1 + rounds * per_round, d), x.dtype).at[0].set(first)
  xb, valid = _blocks(x, rows)
  xxb = _blocks(xx[:, None], rows)[0][..., 0]
  single = rows >= n

  def distances(xr, xxr, c):                     # [rows, D], [rows], [m, D] -> [rows, m]
    dist = xxr[:, None] - 2.0 * similarity.inner_products(xr, c) + jnp.sum(
        jnp.square(c), axis=1)[None, :]
    return jnp.maximum(dist, 0.0)

  def one_round(r, carry):
    chosen, d2 = carry
    gumbel = jax.random.gumbel(jax.random.fold_in(key, r), (n,))
    logits = jnp.where(d2 > 0, jnp.log(jnp.maximum(d2, 1e-30)), -jnp.inf) + gumbel
    _, idx = jax.lax.top_k(logits, min(per_round * trials, n))
    idx = jnp.resize(idx, (per_round * trials,))  # (only when N < per_round * trials)
    candidates = x[idx]                                                     # [b * L, D]
    # the potential sum_i min(D_i^2, |x_i - c|^2) of every candidate
    if single:   # one block: the candidates' distances serve the update of D^2 too
      dist = distances(x, xx, candidates)                                   # [N, b * L]
      potential = jnp.sum(jnp.minimum(d2[:, None], dist), axis=0)
    else:        # by row blocks, and the chosen centres' distances computed again
      d2b = _blocks(d2[:, None], rows)[0][..., 0]
      potential = jnp.sum(jax.lax.map(
          lambda a: jnp.sum(jnp.where(a[2][:, None], jnp.minimum(
              a[3][:, None], distances(a[0], a[1], candidates)), 0.0), axis=0),
          (xb, xxb, valid, d2b)), axis=0)
    best = jnp.argmin(potential.reshape(per_round, trials), axis=1)
    new = candidates.reshape(per_round, trials, d)[jnp.arange(per_round), best]   # [b, D]
    chosen = jax.lax.dynamic_update_slice(chosen, new, (1 + r * per_round, 0))
    new_dist = (dist[:, jnp.arange(per_round) * trials + best] if single
                else distances(x, xx, new))                                 # [N, b]
    d2 = jnp.minimum(d2, jnp.min(new_dist, axis=1))
    return chosen, d2

  chosen, _ = jax.lax.fori_loop(0, rounds, one_round, (chosen, d2))
  return chosen[:k]


def cluster_sums(x: jax.Array, assignment: jax.Array, *, k: int, rows: int,
                 one_hot: bool) -> jax.Array:
  """``[k, D]``: the sum of each cluster's points, by a scatter-add (``one_hot=False``) or by
  one-hot products over row blocks (``one_hot=True``: the same order of additions on every
  run, where an accelerator's scatter-add would add in whatever order its atomics land)."""
  if not one_hot:
    return jax.ops.segment_sum(x, assignment, num_segments=k)
  xb, valid = _blocks(x, rows)
  ab = _blocks(assignment[:, None], rows)[0][..., 0]

  def block(carry, inputs):
    xr, ar, ok = inputs
    hot = ((ar[:, None] == jnp.arange(k)[None, :]) & ok[:, None]).astype(x.dtype)
    return carry + jax.lax.dot_general(hot, xr, (((0,), (0,)), ((), ())),
                                       precision=similarity.PRECISION), None

  return jax.lax.scan(block, jnp.zeros((k, x.shape[1]), x.dtype), (xb, ab, valid))[0]


@functools.partial(jax.jit, static_argnames=("k", "rows", "one_hot"))
def update_centres(x: jax.Array, assignment: jax.Array, d2: jax.Array, centres: jax.Array, *,
                   k: int, rows: int = 1024, one_hot: bool = False) -> jax.Array:
  """The means of the clusters ``[k, D]``; an empty cluster takes the point farthest from its
  centre (the i-th empty cluster the i-th farthest point). ``one_hot``: the sums by
  :func:`cluster_sums`' one-hot products (deterministic on accelerators)."""
  sums = cluster_sums(x, assignment, k=k, rows=rows, one_hot=one_hot)
  counts = jax.ops.segment_sum(jnp.ones_like(assignment), assignment, num_segments=k)
  means = sums / jnp.maximum(counts, 1).astype(x.dtype)[:, None]
  empty = counts == 0

  def moved():   # sorting the N distances only in an iteration that left a cluster empty
    rank = jnp.cumsum(empty) - 1
    far = jnp.argsort(-d2)[:k]
    return jnp.where(empty[:, None], x[far[jnp.clip(rank, 0, far.shape[0] - 1)]], means)

  return jax.lax.cond(jnp.any(empty), moved, lambda: means).astype(x.dtype)


LLOYD_STEPS = 8   # Lloyd iterations per compiled call (the host checks progress in between)


@functools.partial(jax.jit, static_argnames=("k", "rows", "one_hot", "steps", "selection"))
def lloyd(x: jax.Array, centres: jax.Array, assignment: jax.Array, d2: jax.Array,
          threshold: jax.Array, max_steps: jax.Array, *, k: int, rows: int, one_hot: bool,
          steps: int = LLOYD_STEPS, selection: str = "auto"):
  """Up to ``min(steps, max_steps)`` Lloyd iterations from ``centres [k, D]`` and their
  ``(assignment [N], d2 [N])``, in one compiled loop: each moves the centres to their
  clusters' means (:func:`update_centres`) and assigns again (:func:`assign`), and the loop
  stops once the centres moved by at most ``threshold`` (squared, summed) or no assignment
  changed. ``selection``: :func:`assign`'s.

  Returns:
    ``(centres, assignment, d2, iterations done, converged)``.
  """
  def cond(carry):
    return ~carry[4] & (carry[3] < jnp.minimum(steps, max_steps))

  def body(carry):
    centres, a, d2, i, _ = carry
    new = update_centres(x, a, d2, centres, k=k, rows=rows, one_hot=one_hot)
    shift = jnp.sum(jnp.square(new - centres))
    new_a, new_d2 = assign(x, new, rows=rows, selection=selection)
    return new, new_a, new_d2, i + 1, (shift <= threshold) | ~jnp.any(new_a != a)

  return jax.lax.while_loop(cond, body, (centres, assignment, d2, jnp.int32(0),
                                         jnp.bool_(False)))


def _check(x, n_clusters, n_init, max_iter, tol, seeding_rounds) -> np.ndarray:
  x = np.asarray(x)
  if x.ndim != 2 or x.shape[0] < 1 or not np.issubdtype(x.dtype, np.number):
    raise ValueError(f"x must be a numeric [N, D] array with N >= 1, got shape {x.shape}.")
  x = x.astype(np.float32)
  if not np.all(np.isfinite(x)):
    raise ValueError(f"x has non-finite rows: {np.flatnonzero(~np.isfinite(x).all(1))[:5]}.")
  for name, value, low in (("n_clusters", n_clusters, 1), ("n_init", n_init, 1),
                           ("max_iter", max_iter, 1), ("seeding_rounds", seeding_rounds, 1)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
      raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
  if n_clusters > x.shape[0]:
    raise ValueError(f"n_clusters={n_clusters} exceeds the {x.shape[0]} points.")
  if not (isinstance(tol, (int, float)) and tol >= 0):
    raise ValueError(f"tol must be a number >= 0, got {tol!r}.")
  return x


def kmeans(x, *, n_clusters: int, seed: int = 0, n_init: int = 1, max_iter: int = MAX_ITER,
           tol: float = TOL, seeding_rounds: int = SEEDING_ROUNDS, greedy: bool = True,
           memory_bytes: int = DEFAULT_MEMORY_BYTES, selection: str = "auto",
           show_progress: bool = False) -> KMeansResult:
  """k-means of ``x`` (module docstring), the best of ``n_init`` restarts.

  Args:
    x: float ``[N, D]`` (numpy or JAX).
    n_clusters: ``k`` in ``[1, N]``.
    seed: the restarts' random seed.
    n_init: restarts (the lowest inertia is kept).
    max_iter: Lloyd iterations at most per restart.
    tol: convergence: centre shift ``<= tol * mean(var(x, axis=0))`` (squared, summed).
    seeding_rounds: k-means++ rounds (``k - 1`` centres drawn in this many rounds at most).
    greedy: each centre the best of ``2 + ln k`` candidates (else plain k-means++).
    memory_bytes: budget of one assignment tile ``[rows, k]``.
    selection: the assignment's argmax (:func:`assign`): ``'auto'``, ``'kernel'`` or
      ``'xla'``; the same clustering.
    show_progress: a progress line per restart (iterations, inertia).

  Returns:
    :class:`KMeansResult`.
  """
  x = _check(x, n_clusters, n_init, max_iter, tol, seeding_rounds)
  kernels.choose("top_m.cc", selection)   # a bad or unavailable selection: one clear error
  n, k = x.shape[0], int(n_clusters)
  rows = block_rows(n, k, memory_bytes)
  per_round = max(1, math.ceil((k - 1) / seeding_rounds))
  trials = local_trials(k) if greedy else 1
  # the seeding's tiles are narrow ([rows, b L]): only the memory bounds their rows
  seed_rows = block_rows(n, per_round * trials, memory_bytes, max_rows=n)
  threshold = float(tol) * float(np.mean(np.var(x, axis=0, dtype=np.float64)))
  one_hot = jax.default_backend() != "cpu"   # deterministic sums off the CPU
  xd = jnp.asarray(x)
  best = None
  inertias = []
  for restart, key in enumerate(jax.random.split(jax.random.key(seed), n_init)):
    centres = seed_centres(xd, key, k=k, per_round=per_round, trials=trials,
                           rows=seed_rows)
    a, d2 = assign(xd, centres, rows=rows, selection=selection)
    bar = tqdm.tqdm(total=max_iter, desc=f"k-means k={k} restart {restart + 1}/{n_init}",
                    unit="it", leave=False, disable=not show_progress, dynamic_ncols=True,
                    mininterval=1.0)
    iterations, converged = 0, False
    while iterations < max_iter and not converged:
      centres, a, d2, done, converged = lloyd(xd, centres, a, d2, np.float32(threshold),
                                              np.int32(max_iter - iterations), k=k,
                                              rows=rows, one_hot=one_hot,
                                              selection=selection)
      iterations += int(done)
      converged = bool(converged)
      if show_progress:
        bar.update(int(done))
        bar.set_postfix(inertia=f"{float(jnp.sum(d2)):.4g}")
    bar.close()
    inertia = float(np.sum(np.asarray(d2), dtype=np.float64))
    inertias.append(inertia)
    if best is None or inertia < best[2]:
      best = (a, centres, inertia, iterations)
  a, centres, inertia, iterations = best
  return KMeansResult(assignment=np.asarray(a), centres=np.asarray(centres), inertia=inertia,
                      iterations=iterations, inertias=tuple(inertias))
