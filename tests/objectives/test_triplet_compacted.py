"""The sort-free paths of ``positive='all'`` triplets (dml_jax/objectives/_triplet.py):
each anchor's positives compacted to ``[B, P]`` for the smallest static ``P`` that
holds the batch (``lax.switch``), else the sorted path. Values and gradients equal the sorted
path (``losses.triplet_all_negatives``, ``mining.negatives``) and the numpy oracle, for every
bucket, the fallback, exact ties, anchors without positives or negatives, reference sets and
bfloat16 inputs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oracles import np_triplet_all
from dml_jax import losses
from dml_jax import mining
from dml_jax import objectives
from dml_jax import similarity as sim
from dml_jax.objectives import _common as objectives_common
from dml_jax.objectives import _triplet


def grid_batch(seed, b, d=4):
  """Integer embeddings in ``{-1, 0, 1}^d``: squared distances are small integers, so with an
  integer margin many negatives sit exactly on the hinge (``d_an^2 = d_ap^2 + margin``)."""
  return np.random.default_rng(seed).integers(-1, 2, size=(b, d)).astype(np.float32)


def class_labels(seed, sizes):
  """Labels of classes of the given sizes, shuffled; int32 ``[sum(sizes)]``."""
  labels = np.repeat(np.arange(len(sizes)), sizes)
  return np.random.default_rng(seed).permutation(labels).astype(np.int32)


# 24 anchors: a class of 10 (9 positives), smaller ones and two singletons (no positive).
LABELS_24 = class_labels(0, [10, 5, 3, 2, 2, 1, 1])
SIZES = [(2, 4), (4, 16), (16,), (2, 4, 8, 64)]   # (2, 4): the sorted fallback; else buckets


@functools.partial(jax.jit, static_argnames=("reduction", "sizes", "margin"))
def all_negatives_both(d2, pos, neg, weights, *, reduction, sizes, margin):
  """Values and gradients of ``sum(weights * terms)`` on the pairs: new path, sorted path."""
  def new(x):
    return _triplet.triplet_all_negatives(x, pos, neg, margin=margin, reduction=reduction,
                                          sizes=sizes)

  def old(x):
    return losses.triplet_all_negatives(x, x, neg, margin=margin, reduction=reduction)

  out = []
  for fn in (new, old):
    total = lambda x, fn=fn: jnp.sum(jnp.where(pos, weights * fn(x), 0.0))
    out.append((jnp.where(pos, fn(d2), 0.0), jax.grad(total)(d2)))
  return out


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("sizes", SIZES, ids=str)
def test_all_negatives_equal_the_sorted_path_and_the_oracle_with_ties(reduction, sizes):
  e = grid_batch(1, len(LABELS_24))
  d2 = jnp.asarray(((e[:, None] - e[None]) ** 2).sum(-1))
  pos, neg = sim.label_masks(jnp.asarray(LABELS_24))
  weights = jnp.asarray(np.random.default_rng(2).uniform(0.5, 1.5, d2.shape), jnp.float32)
  (t_new, g_new), (t_old, g_old) = all_negatives_both(d2, pos, neg, weights,
                                                      reduction=reduction, sizes=sizes,
                                                      margin=1.0)
  d2_np = np.asarray(d2)
  assert np.any(np.isclose(d2_np[:, :, None] + 1.0, d2_np[:, None, :]))   # ties on the hinge
  want = np.where(pos, np_triplet_all(d2_np, d2_np, np.asarray(neg), 1.0, reduction), 0.0)
  np.testing.assert_allclose(t_new, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(t_new, t_old, rtol=1e-6, atol=1e-6)
  # The same subgradient as the sorted form, ties included (0 for d_an^2 = d_ap^2 + margin).
  np.testing.assert_allclose(g_new, g_old, rtol=1e-6, atol=1e-6)


def test_all_negatives_with_more_than_64_terms_per_anchor_in_one_bucket():
  # P = 80 > max(COMPACT_SIZES): the backward pass reduces over P instead of unrolling it.
  labels = class_labels(3, [70, 6, 2, 1, 1])
  e = grid_batch(4, len(labels))
  d2 = jnp.asarray(((e[:, None] - e[None]) ** 2).sum(-1))
  pos, neg = sim.label_masks(jnp.asarray(labels))
  weights = jnp.asarray(np.random.default_rng(5).uniform(0.5, 1.5, d2.shape), jnp.float32)
  (t_new, g_new), (t_old, g_old) = all_negatives_both(d2, pos, neg, weights, reduction="mean",
                                                      sizes=(80,), margin=1.0)
  np.testing.assert_allclose(t_new, t_old, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(g_new, g_old, rtol=1e-6, atol=1e-6)


def test_all_negatives_without_positives_or_negatives_give_zero_terms():
  d2 = jnp.asarray(np.random.default_rng(3).uniform(0, 4, (6, 6)), jnp.float32)
  terms_and_grad = jax.jit(jax.value_and_grad(
      lambda x, pos, neg: jnp.sum(_triplet.triplet_all_negatives(
          x, pos, neg, margin=0.2, reduction="mean", sizes=(2, 4)))))
  for labels in (np.zeros(6, np.int32), np.arange(6, dtype=np.int32)):
    pos, neg = sim.label_masks(jnp.asarray(labels))
    terms, grad = terms_and_grad(d2, pos, neg)
    assert float(terms) == 0.0 and not np.any(grad)


# ------------------------------------------------------------- objectives vs the sorted path


@functools.partial(jax.jit, static_argnames=("negative", "distance"))
@jax.value_and_grad
def sorted_path_value_and_grad(e, labels, refs, *, negative, distance="squared"):
  """The ``positive='all'`` triplet loss on the sorted paths (no compaction), and its
  gradient."""
  s, pos, neg = objectives_common.similarities(e, labels, "cosine", refs)
  d2 = sim.squared_distance(s)
  d = d2 if distance == "squared" else jnp.sqrt(jnp.maximum(d2, 1e-12))
  if negative == "all":
    terms = losses.triplet_all_negatives(d, d, neg, margin=0.2)
    valid = pos & jnp.any(neg, axis=1, keepdims=True)
  else:
    idx, valid = mining.negatives(-jax.lax.stop_gradient(d), neg, pos, mode="semihard")
    terms = losses.triplet(d, jnp.take_along_axis(d, idx, axis=1), margin=0.2)
  return losses.reduce(terms, valid, "mean")


@functools.lru_cache(maxsize=None)
def objective(negative, distance="squared"):
  """``jit(value_and_grad(loss))`` of ``triplet(positive='all', negative=...)``."""
  obj = objectives.make("triplet", positive="all", negative=negative, distance=distance)
  return jax.jit(jax.value_and_grad(
      lambda e, y, refs: obj.apply({}, e, y, references=refs)[0]))


def check_equals_sorted_path(e, labels, refs=None, *, negative, distance="squared"):
  e, labels = jnp.asarray(e), jnp.asarray(labels)
  loss, grad = objective(negative, distance)(e, labels, refs)
  want, want_grad = sorted_path_value_and_grad(e, labels, refs, negative=negative,
                                               distance=distance)
  assert np.isfinite(float(loss)) and float(want) > 0
  np.testing.assert_allclose(float(loss), float(want), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(grad, np.float32), np.asarray(want_grad, np.float32),
                             rtol=1e-4, atol=1e-7)


def unit(seed, b, d=8):
  x = np.random.default_rng(seed).normal(size=(b, d)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


# Largest number of positives per anchor: 7 (size 8), 19 (size 32), 69 (> 64: sorted path).
BATCHES = {"8-per-class": class_labels(4, [8] * 10),
           "20-per-class": class_labels(5, [20, 20, 20, 10, 5, 4, 1]),
           "one-big-class": class_labels(6, [70, 6, 2, 1, 1])}


@pytest.mark.parametrize("negative", ["all", "semihard"])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_objective_equals_the_sorted_path_in_every_bucket(batch, negative):
  labels = BATCHES[batch]
  check_equals_sorted_path(unit(7, len(labels)), labels, negative=negative)


def test_euclidean_semihard_and_all_equal_the_sorted_path():
  labels = BATCHES["20-per-class"]
  for negative in ("all", "semihard"):
    check_equals_sorted_path(unit(8, len(labels)), labels, negative=negative,
                             distance="euclidean")


@pytest.mark.parametrize("negative", ["all", "semihard"])
def test_references_count_positives_in_batch_and_memory(negative):
  # N = B + M: the 7 in-batch positives plus 8 more in memory (15 per anchor: size 16).
  labels = BATCHES["8-per-class"]
  mem_labels = class_labels(9, [8] * 10)
  e, mem = unit(10, len(labels)), unit(11, len(mem_labels))
  b, m = len(labels), len(mem_labels)
  mask = np.concatenate([~np.eye(b, dtype=bool), np.ones((b, m), bool)], axis=1)
  mask[:, b + 3] = False                               # an empty memory slot
  refs = objectives.References(jnp.asarray(np.concatenate([e, mem])),
                               jnp.asarray(np.concatenate([labels, mem_labels])),
                               jnp.asarray(mask))
  check_equals_sorted_path(e, labels, refs, negative=negative)


@pytest.mark.parametrize("negative", ["all", "semihard"])
def test_bfloat16_embeddings_equal_the_sorted_path(negative):
  labels = BATCHES["8-per-class"]
  check_equals_sorted_path(unit(12, len(labels)).astype(jnp.bfloat16), labels,
                           negative=negative)


def test_objective_traces_once_per_shape():
  traces = []
  obj = objectives.make("triplet", positive="all", negative="all")

  @jax.jit
  def fn(e, labels):
    traces.append(1)
    return jax.value_and_grad(lambda x: obj.apply({}, x, labels)[0])(e)

  for batch in BATCHES.values():   # the same shape, every bucket and the fallback
    fn(jnp.asarray(unit(13, 80)), jnp.asarray(np.resize(batch, 80)))
  assert len(traces) == 1


@pytest.mark.parametrize("positive", ["random", "all"])
def test_hessian_of_all_negatives_equals_the_sorted_path(positive):
  """``jax.hessian`` (forward over reverse) differentiates the custom VJP of the sort-free
  sums and gives the sorted form's Hessian."""
  labels = jnp.asarray(class_labels(5, [3, 3, 2]))
  e = jnp.asarray(np.random.default_rng(6).normal(size=(8, 4)), jnp.float32)
  pos, neg = sim.label_masks(labels)
  pairs = pos if positive == "all" else mining.positive_pairs(
      jnp.zeros(pos.shape), pos, mode="easy")   # first positive of each anchor
  size = 4 if positive == "all" else 1
  d2 = lambda x: sim.squared_distance(sim.pairwise_similarity(x), kind="cosine")

  def hessian(fn):
    total = lambda x: jnp.sum(jnp.where(pairs, fn(d2(x)), 0.0))
    return np.asarray(jax.jit(jax.hessian(total))(e))

  new = hessian(lambda x: _triplet.triplet_all_negatives_compacted(
      x, pairs, neg, margin=0.5, reduction="mean", size=size))
  old = hessian(lambda x: losses.triplet_all_negatives(x, x, neg, margin=0.5,
                                                       reduction="mean"))
  assert np.any(new != 0)
  np.testing.assert_allclose(new, old, rtol=1e-4, atol=1e-5 * np.max(np.abs(old)))
  loss = lambda x: objectives.make("triplet", positive=positive, negative="all").apply(
      {}, x, labels, rng=jax.random.key(0))[0]
  assert np.all(np.isfinite(np.asarray(jax.jit(jax.hessian(loss))(e))))
