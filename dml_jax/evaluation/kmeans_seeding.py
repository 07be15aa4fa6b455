"""Greedy k-means++ seeding in rounds, for :mod:`dml_jax.evaluation.kmeans`.

**Greedy k-means++** (Arthur & Vassilvitskii; the greedy form is scikit-learn's),
drawn in rounds. The first centre is a uniformly random point. Every later one is the best of
``L = 2 + floor(ln k)`` candidates drawn with probability proportional to ``D(x)^2``, the
squared distance to the nearest centre chosen so far: the candidate of lowest potential
``sum_i min(D(x_i)^2, |x_i - c|^2)``. A round draws the candidates of ``b`` centres at once
(``b L`` points without replacement, proportional to ``D^2`` before the round: Gumbel
top-``bL``), takes the best of each group of ``L`` and updates ``D^2``; every step is a
blocked ``[rows, bL]`` product (when ``x`` is one block, the chosen candidates' distances
update ``D^2`` without a second product). With ``b = 1`` this is greedy k-means++ itself,
but for its ``L`` candidates being distinct points (scikit-learn draws them with replacement);
``b = ceil((k - 1) / seeding_rounds)`` (default 256 rounds) keeps the seeding a few hundred
matrix products at large ``k`` (SOP: 11,316 clusters) instead of ``k`` passes over the data,
and is exact up to 257 clusters. ``greedy=False`` draws one candidate (plain k-means++).
(faiss, which pytorch-metric-learning's NMI uses, seeds with random points instead.)

**Seedings shared.** Round ``r`` of the seeding draws from ``(seed, r)`` alone, so a
seeding of ``k`` centres is the first ``k`` centres of any longer one with the same
candidates per centre and centres per round; ``kmeans.kmeans(seedings=...)`` keeps them for a
caller that clusters the same points several times (the evaluation's NMI and NMI+ of the
protocols of one split) and draws only the rounds not drawn yet.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from dml_jax import similarity

SEEDING_ROUNDS = 256


def row_blocks(x: jax.Array, rows: int) -> tuple[jax.Array, jax.Array]:
  """``x [N, D]`` zero-padded to ``[nb, rows, D]`` and the validity mask ``[nb, rows]``."""
  n = x.shape[0]
  nb = -(-n // rows)
  pad = nb * rows - n
  xb = jnp.pad(x, ((0, pad), (0, 0))).reshape(nb, rows, x.shape[1])
  valid = (jnp.arange(nb * rows) < n).reshape(nb, rows)
  return xb, valid


def local_trials(k: int) -> int:
  """Candidates per centre of greedy k-means++: ``2 + floor(ln k)`` (scikit-learn's)."""
  return 2 + int(math.log(k))


def seeding_schedule(k: int, seeding_rounds: int = SEEDING_ROUNDS,
                     greedy: bool = True) -> tuple[int, int, int]:
  """``(rounds, per_round, trials)`` of the seeding of ``k`` centres: ``k - 1`` centres after
  the first, ``per_round = ceil((k - 1) / seeding_rounds)`` a round, each the best of
  ``trials`` candidates (:func:`local_trials`, or 1 when not ``greedy``)."""
  per_round = max(1, math.ceil((k - 1) / seeding_rounds))
  return -(-(k - 1) // per_round), per_round, local_trials(k) if greedy else 1


@jax.jit
def first_centre(x: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The seeding's first centre, a uniformly random point ``[1, D]``, and every point's
  squared distance to it ``d2 [N]`` (the state :func:`seeding_rounds` starts from)."""
  first_key, _ = jax.random.split(key)
  first = x[jax.random.randint(first_key, (), 0, x.shape[0])]
  d2 = jnp.maximum(jnp.sum(jnp.square(x), axis=1)
                   - 2.0 * similarity.inner_products(x, first[None])[:, 0]
                   + jnp.sum(jnp.square(first)), 0.0)
  return first[None], d2


@functools.partial(jax.jit, static_argnames=("per_round", "trials", "rows"))
def seeding_rounds(x: jax.Array, key: jax.Array, chosen: jax.Array, d2: jax.Array,
                   start: jax.Array, *, per_round: int, trials: int,
                   rows: int) -> tuple[jax.Array, jax.Array]:
  """Rounds ``start, ..., R - 1`` of greedy k-means++ (module docstring), where
  ``chosen [1 + R per_round, D]`` holds the centres of the rounds before ``start`` and ``d2
  [N]`` every point's squared distance to the nearest of them. Each round adds ``per_round``
  centres, each the best of ``trials`` candidates, in row blocks of ``rows``. Round ``r``'s
  draws depend only on ``(key, r)``, so the rounds run in one call or in several give the same
  centres, and a seeding of ``R`` rounds begins with the seeding of any fewer.

  Returns:
    ``(chosen, d2)`` after round ``R - 1``.
  """
  n, d = x.shape
  rounds = (chosen.shape[0] - 1) // per_round
  _, key = jax.random.split(key)
  xx = jnp.sum(jnp.square(x), axis=1)
  xb, valid = row_blocks(x, rows)
  xxb = row_blocks(xx[:, None], rows)[0][..., 0]
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
      d2b = row_blocks(d2[:, None], rows)[0][..., 0]
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

  return jax.lax.fori_loop(start, rounds, one_round, (chosen, d2))


def seed_centres(x: jax.Array, key: jax.Array, *, k: int, per_round: int, trials: int,
                 rows: int, seedings: dict | None = None) -> jax.Array:
  """Greedy k-means++ centres ``[k, D]`` drawn in rounds of ``per_round`` (module docstring):
  each centre is the best of ``trials`` candidates, in row blocks of ``rows``.

  ``seedings``: a dict kept by the caller for one ``x`` (:func:`kmeans`), in which the longest
  seeding drawn so far for each ``(key, per_round, trials)`` is kept and continued: a seeding
  of ``k`` centres is the first ``k`` centres of any longer one, so a second clustering of
  the same points draws only the rounds the first did not.
  """
  rounds = -(-(k - 1) // per_round)
  entry = None
  if seedings is not None:
    name = (tuple(np.asarray(jax.random.key_data(key)).ravel().tolist()), per_round, trials,
            x.shape)
    entry = seedings.get(name)
  if entry is None:
    chosen, d2 = first_centre(x, key)
    done = 0
  else:
    chosen, d2, done = entry
  if done < rounds:
    chosen = jnp.pad(chosen, ((0, 1 + rounds * per_round - chosen.shape[0]), (0, 0)))
    chosen, d2 = seeding_rounds(x, key, chosen, d2, jnp.int32(done), per_round=per_round,
                                trials=trials, rows=rows)
    done = rounds
  if seedings is not None:
    seedings[name] = (chosen, d2, done)
  return chosen[:k]
