"""k-means in JAX, on the default device: k-means++ seeding, Lloyd iterations, restarts.

``kmeans(x, n_clusters=k, seed=s, n_init=r)`` minimises the inertia
``sum_i min_j |x_i - c_j|^2`` of ``x [N, D]`` (Euclidean; pass L2-normalised embeddings for
the cosine geometry) and returns the assignment of the restart of lowest inertia.

* **Seeding: greedy k-means++** in rounds (:mod:`dml_jax.evaluation.kmeans_seeding`): each
  centre the best of ``2 + floor(ln k)`` candidates drawn proportionally to ``D(x)^2``, a few
  centres a round from 257 clusters on; ``greedy=False`` draws one candidate.
* **Lloyd iterations**: assign every point to its nearest centre, move each centre to the
  mean of its points (on the CPU by a scatter-add, elsewhere by one-hot products over row
  blocks, so that a GPU, whose scatter-add adds in the order its atomics land, gives the same
  clustering on every run); a centre left without points moves to the point farthest from its own
  centre (the farthest first), as scikit-learn does, except that the point also stays in its
  old cluster's mean for that iteration (scikit-learn takes it out). Stops when the centres
  move by at most ``tol`` times the mean per-dimension variance of ``x`` in squared distance
  (scikit-learn's rule), when no assignment changes, or after ``max_iter`` iterations; the
  assignment returned is the one of the final centres. The iterations run in compiled loops
  of ``LLOYD_STEPS`` (:func:`lloyd`), the host looking in only between them: early embeddings
  need tens of iterations, and a round trip per iteration cost more than the iteration at
  small ``k``.
* **Bounds**: from the second iteration on, a point is assigned again only when a lower
  bound on its distance to every other centre no longer exceeds its distance to its own
  (Hamerly's bound, the ``min(64, k // 8)`` centres that moved most measured exactly
  (:func:`movers`); :func:`lloyd`; from 64 clusters, below that every distance is computed),
  so the
  work falls with the points still moving; the assignments are those of computing every
  distance. ``d2`` of a point whose centre the bound kept is computed row by row, so the
  inertia can differ from the dense computation's in the last digits.
* **The assignment step** is the evaluation's blocked similarity: row blocks of ``x`` against
  all centres, ``S = 2 <x, c> - |c|^2`` (higher = closer, ``|x - c|^2 = |x|^2 - S``), a float32
  product at full precision on every platform (``similarity.inner_products``), so a GPU assigns
  as the CPU does. Each row's best centre is ``jnp.argmax``'s, taken on the CPU by a C++ kernel
  (``top_m_kernel.argmax_rows_kernel``: XLA:CPU's argmax cost twice the product) with the same
  result. Memory: ``x`` and the centres on the device plus one ``[rows, k]`` tile
  (``memory_bytes``, default 256 MiB) and the bounds' ``[N, min(64, k // 8)]`` distances to
  the movers.
  That form rounds with ``|x|^2``, so the points are first moved by their mean rounded to whole
  numbers (k-means does not change; unit embeddings, whose mean coordinates lie below 0.5
  unless they collapsed, are not moved) and the centres moved back: the rounding follows the
  points' spread, not their distance from the origin (without it, 30 clusters of spread 0.1
  at 4096 from the origin in 16 dimensions came out as 6, NMI 0.32).

Restarts draw their seeds from ``seed`` (``jax.random``), so the result is a deterministic
function of ``(x, k, seed, n_init)`` on a platform; it is not scikit-learn's random stream, so
the clusterings (and NMI) differ from scikit-learn's by the spread of k-means itself.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from dml_jax import kernels
from dml_jax import similarity
from dml_jax.evaluation import knn
from dml_jax.evaluation import top_m_kernel
from dml_jax.evaluation.kmeans_seeding import SEEDING_ROUNDS
from dml_jax.evaluation.kmeans_seeding import row_blocks as _blocks
from dml_jax.evaluation.kmeans_seeding import seed_centres, seeding_schedule

DEFAULT_MEMORY_BYTES = 256 * 2 ** 20
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
ACTIVE_ROWS = 512  # rows per block of the bounded assignment's gathered rows


def rounding_margin(x: jax.Array) -> jax.Array:
  """A bound on the float32 rounding of a squared distance ``|x|^2 - 2 <x, c> + |c|^2`` between
  points of ``x [N, D]`` and their means: ``2 D 2^-23 max_i |x_i|^2`` (a D-term product's
  worst case, twice). The bounded assignment keeps a point's centre only when the bounds
  separate it from every other centre by more than this."""
  return 2.0 * x.shape[1] * 2.0 ** -23 * jnp.max(jnp.sum(jnp.square(x), axis=1))


def nearest_two(xr: jax.Array, centres: jax.Array, *,
                selection: str = "auto") -> tuple[jax.Array, jax.Array, jax.Array]:
  """The nearest centre of each row of ``xr [R, D]`` among ``centres [k, D]`` (as
  :func:`assign`: the tile ``2 <x, c> - |c|^2``, ties to the lower id), its squared distance,
  and the squared distance to the second nearest (``inf`` when ``k = 1``).

  Returns:
    ``(assignment int32 [R], d2 float32 [R], second float32 [R])``.
  """
  s = 2.0 * similarity.inner_products(xr, centres) - jnp.sum(jnp.square(centres), axis=1)[None]
  a, best = _row_argmax(s, selection)
  other = jnp.max(jnp.where(jnp.arange(centres.shape[0])[None, :] == a[:, None], -jnp.inf, s),
                  axis=1)
  xx = jnp.sum(jnp.square(xr), axis=1)
  return a, jnp.maximum(xx - best, 0.0), jnp.maximum(xx - other, 0.0)


def refresh(x: jax.Array, centres: jax.Array, assignment: jax.Array, d2: jax.Array,
            lower: jax.Array, active: jax.Array, margin: jax.Array, *, rows: int,
            selection: str = "auto") -> tuple[jax.Array, jax.Array, jax.Array]:
  """The nearest centre of every ``active`` point, computed in blocks of ``rows`` gathered
  active points (as many blocks as there are active points): their assignment, squared
  distance and the lower bound ``sqrt(second - margin)`` on the distance to every other
  centre; the other points keep ``(assignment, d2, lower)``. Shapes: ``x [N, D]``, centres
  ``[k, D]``, the rest ``[N]``.

  Returns:
    ``(assignment int32 [N], d2 float32 [N], lower float32 [N])``.
  """
  n = x.shape[0]
  count = jnp.sum(active, dtype=jnp.int32)
  ids = jnp.nonzero(active, size=n, fill_value=n)[0].astype(jnp.int32)
  ids = jnp.pad(ids, (0, -(-n // rows) * rows - n), constant_values=n)

  def body(carry):
    b, a, d2, lower = carry
    rid = jax.lax.dynamic_slice(ids, (b * rows,), (rows,))
    ra, rd2, rsecond = nearest_two(x[jnp.minimum(rid, n - 1)], centres, selection=selection)
    rlower = jnp.sqrt(jnp.maximum(rsecond - margin, 0.0))
    return (b + 1, a.at[rid].set(ra, mode="drop"), d2.at[rid].set(rd2, mode="drop"),
            lower.at[rid].set(rlower, mode="drop"))

  blocks = (count + rows - 1) // rows
  _, a, d2, lower = jax.lax.while_loop(lambda c: c[0] < blocks, body,
                                       (jnp.int32(0), assignment, d2, lower))
  return a, d2, lower


MOVERS = 64   # the most centres whose distances the bounded assignment computes exactly


def _lower_bounds(x: jax.Array, xx: jax.Array, new: jax.Array, move: jax.Array,
                  assignment: jax.Array, lower: jax.Array, margin: jax.Array) -> jax.Array:
  """Lower bounds ``[N]`` on each point's distance to every centre but its own after the
  centres moved (``new [k, D]``, squared moves ``move [k]``): the exact distances to the
  ``MOVERS`` centres that moved most (``[N, MOVERS]`` products), and for the others the old
  bound ``lower`` less the largest move among them."""
  m = movers(new.shape[0])
  top, moved = jax.lax.top_k(move, m + 1)
  c = new[moved[:m]]
  dist = (xx[:, None] - 2.0 * similarity.inner_products(x, c)
          + jnp.sum(jnp.square(c), axis=1)[None, :])                        # [N, movers]
  dist = jnp.where(moved[None, :m] == assignment[:, None], jnp.inf, dist)
  exact = jnp.sqrt(jnp.maximum(jnp.min(dist, axis=1) - margin, 0.0))
  # the old bounds less the largest other move, less a few float32 steps for the rounding
  return jnp.minimum((lower - jnp.sqrt(top[m])) * (1.0 - 2.0 ** -20), exact)


def movers(k: int) -> int:
  """The centres whose distances the bounded assignment computes exactly: ``k // 8``, at
  most ``MOVERS``; 0 (every distance computed, no bounds) below 64 centres."""
  return min(MOVERS, k // 8) if k >= 64 else 0


@functools.partial(jax.jit, static_argnames=("k", "rows", "one_hot", "steps", "selection",
                                             "pruning"))
def lloyd(x: jax.Array, centres: jax.Array, assignment: jax.Array, d2: jax.Array,
          lower: jax.Array, threshold: jax.Array, max_steps: jax.Array, *, k: int, rows: int,
          one_hot: bool, steps: int = LLOYD_STEPS, selection: str = "auto",
          pruning: bool = True):
  """Up to ``min(steps, max_steps)`` Lloyd iterations from ``centres [k, D]`` and their
  ``(assignment [N], d2 [N], lower [N])``, in one compiled loop: each moves the centres to
  their clusters' means (:func:`update_centres`) and assigns again, and the loop stops once the
  centres moved by at most ``threshold`` (squared, summed) or no assignment changed.

  The assignment (``pruning=True``, from 64 centres) computes the distances to all centres
  only for the points whose centre could have changed (Hamerly's bound, with the largest
  moves taken exactly): a point keeps its centre when its distance to it, computed again
  (``N x D``), is below ``lower``, a bound on its distance to every other centre: the
  second-nearest distance when it was last computed, less the largest move since of a centre
  outside the :func:`movers` that moved most, and the exact distances to those movers
  (:func:`_lower_bounds`); both sides by :func:`rounding_margin`. The other points are
  computed in gathered blocks (:func:`refresh`). Where the bound holds, the nearest centre is
  the same under any rounding, so the assignments, and the centres, are those of computing
  every distance (``pruning=False``; on an accelerator, whose GEMMs may round a row
  differently in tiles of another shape, up to the points within that rounding of two
  centres, unless ``rows = ACTIVE_ROWS``), and the work falls with the points still moving (on
  Omniglot-like embeddings, under 1 % after the third iteration). ``selection``:
  :func:`assign`'s.

  Returns:
    ``(centres, assignment, d2, lower, iterations done, converged)``.
  """
  margin = rounding_margin(x)
  xx = jnp.sum(jnp.square(x), axis=1)

  def cond(carry):
    return ~carry[5] & (carry[4] < jnp.minimum(steps, max_steps))

  def body(carry):
    centres, a, d2, lower, i, _ = carry
    new = update_centres(x, a, d2, centres, k=k, rows=rows, one_hot=one_hot)
    move = jnp.sum(jnp.square(new - centres), axis=1)                     # [k], squared
    if not (pruning and movers(k)):   # every distance, by row blocks
      new_a, new_d2 = assign(x, new, rows=rows, selection=selection)
      return (new, new_a, new_d2, lower, i + 1,
              (jnp.sum(move) <= threshold) | ~jnp.any(new_a != a))
    lower = _lower_bounds(x, xx, new, move, a, lower, margin)
    cc = jnp.sum(jnp.square(new), axis=1)
    own = jnp.maximum(xx - 2.0 * jnp.sum(x * new[a], axis=1) + cc[a], 0.0)
    active = jnp.sqrt(own + margin) >= lower
    new_a, new_d2, lower = refresh(x, new, a, own, lower, active, margin, rows=ACTIVE_ROWS,
                                   selection=selection)
    return (new, new_a, new_d2, lower, i + 1,
            (jnp.sum(move) <= threshold) | ~jnp.any(new_a != a))

  return jax.lax.while_loop(cond, body, (centres, assignment, d2, lower, jnp.int32(0),
                                         jnp.bool_(False)))


@functools.partial(jax.jit, static_argnames=("rows", "selection"))
def assign_with_bounds(x: jax.Array, centres: jax.Array, *, rows: int,
                       selection: str = "auto") -> tuple[jax.Array, jax.Array, jax.Array]:
  """:func:`assign` of every point plus the lower bounds :func:`lloyd` starts from:
  ``(assignment int32 [N], d2 [N], lower [N])``."""
  n = x.shape[0]
  return refresh(x, centres, jnp.zeros(n, jnp.int32), jnp.zeros(n, x.dtype),
                 jnp.zeros(n, x.dtype), jnp.ones(n, bool), rounding_margin(x), rows=rows,
                 selection=selection)


@jax.jit
def _mean_variance(x: jax.Array) -> jax.Array:
  """The mean over dimensions of the per-dimension variance of ``x [N, D]``."""
  return jnp.mean(jnp.var(x, axis=0))


def _check(x, n_clusters, n_init, max_iter, tol, seeding_rounds, seedings) -> np.ndarray:
  if seedings is not None and not isinstance(seedings, dict):
    raise ValueError(f"seedings must be a dict (kept by the caller) or None, got "
                     f"{type(seedings).__name__}.")
  x = np.asarray(x)
  # jnp's test: numpy's own does not count bfloat16 (a model run in bfloat16) as a number
  numeric = jnp.issubdtype(x.dtype, jnp.floating) or np.issubdtype(x.dtype, np.number)
  if x.ndim != 2 or x.shape[0] < 1 or not numeric:
    raise ValueError(f"x must be a numeric [N, D] array with N >= 1, got shape {x.shape}, "
                     f"dtype {x.dtype}.")
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
           seedings: dict | None = None, pruning: bool = True,
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
    seedings: an empty dict the caller keeps while it clusters the same ``x`` several times
      (NMI and NMI+ of each protocol of one split): the seedings are kept in it, and a
      clustering into ``k`` clusters takes its centres from a seeding drawn for more clusters
      with the same seed, restarts and ``seeding_schedule`` (or continues a shorter one)
      instead of drawing them again; the result is the one without it. A dict filled for
      other points is emptied first. It holds each restart's centres ``[k, D]`` and
      distances ``[N]`` (SOP, 10 restarts: 230 MB) until the caller drops it.
    pruning: Lloyd's assignment computes only the distances that its bounds cannot rule out
      (:func:`lloyd`); ``False`` computes them all (the same assignments, slower from 64
      centres).
    show_progress: a progress line per restart (iterations, inertia).

  Returns:
    :class:`KMeansResult`.
  """
  x = _check(x, n_clusters, n_init, max_iter, tol, seeding_rounds, seedings)
  kernels.choose("top_m.cc", selection)   # a bad or unavailable selection: one clear error
  # |x - c|^2 = |x|^2 - 2 <x, c> + |c|^2 rounds with |x|^2: less the points' mean, rounded to
  # whole numbers, the clustering does not change and the rounding follows the spread
  shift = knn.euclidean_shift(x)
  x = x - shift
  n, k = x.shape[0], int(n_clusters)
  rows = block_rows(n, k, memory_bytes)
  _, per_round, trials = seeding_schedule(k, seeding_rounds, greedy)
  if seedings is not None and not (isinstance(seedings.get("x"), np.ndarray)
                                   and np.array_equal(seedings["x"], x)):
    seedings.clear()
    seedings["x"] = x
  # the seeding's tiles are narrow ([rows, b L]): only the memory bounds their rows
  seed_rows = block_rows(n, per_round * trials, memory_bytes, max_rows=n)
  threshold = float(tol) * float(_mean_variance(x))
  one_hot = jax.default_backend() != "cpu"   # deterministic sums off the CPU
  xd = jnp.asarray(x)
  best = None
  inertias = []
  for restart, key in enumerate(jax.random.split(jax.random.key(seed), n_init)):
    centres = seed_centres(xd, key, k=k, per_round=per_round, trials=trials,
                           rows=seed_rows, seedings=seedings)
    if pruning and movers(k):
      a, d2, lower = assign_with_bounds(xd, centres, rows=rows, selection=selection)
    else:
      (a, d2), lower = assign(xd, centres, rows=rows, selection=selection), jnp.zeros(n)
    bar = tqdm.tqdm(total=max_iter, desc=f"k-means k={k} restart {restart + 1}/{n_init}",
                    unit="it", leave=False, disable=not show_progress, dynamic_ncols=True,
                    mininterval=1.0)
    iterations, converged = 0, False
    while iterations < max_iter and not converged:
      centres, a, d2, lower, done, converged = lloyd(
          xd, centres, a, d2, lower, np.float32(threshold), np.int32(max_iter - iterations),
          k=k, rows=rows, one_hot=one_hot, selection=selection, pruning=pruning)
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
  return KMeansResult(assignment=np.asarray(a), centres=np.asarray(centres) + shift,
                      inertia=inertia,
                      iterations=iterations, inertias=tuple(inertias))
