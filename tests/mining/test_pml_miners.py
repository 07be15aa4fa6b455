"""dml_jax's miners select what pytorch-metric-learning 2.9's corresponding miners select, on
the fixed inputs of tests/golden/pml_miners.npz (written by tests/golden/make_pml_miners.py in
an environment with torch + PML; CI has neither): ``BatchHardMiner`` and
``BatchEasyHardMiner`` against ``mining.select``, ``MultiSimilarityMiner`` against
``mining.multi_similarity_pairs``, and ``DistanceWeightedMiner``'s sampling distribution
against ``mining.distance_weights``."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from dml_jax import mining
from dml_jax import similarity as sim

REFERENCE = os.path.join(os.path.dirname(__file__), "..", "golden", "pml_miners.npz")
DATA = np.load(REFERENCE)
META = json.loads(str(DATA["index"]))
CASES = META["cases"]


def _batch(case):
  x, labels = DATA[f"{case}/x"], DATA[f"{case}/labels"]
  s = sim.pairwise_similarity(jnp.asarray(x))
  pos, neg = sim.label_masks(jnp.asarray(labels.astype(np.int32)))
  return s, pos, neg


def _triplets(sel: mining.Selection) -> set:
  valid, negative = np.asarray(sel.valid), np.asarray(sel.negative)
  return {(int(a), int(p), int(negative[a, p])) for a, p in zip(*np.nonzero(valid))}


def _pml_triplets(key) -> set:
  return {tuple(int(v) for v in t) for t in DATA[key]}


@pytest.mark.parametrize("case", CASES)
def test_batch_hard_and_batch_easy_hard_miners(case):
  """One triplet per anchor: the PML strategies' closest / farthest positive and negative on
  the Euclidean distance are the same indices as ours on the cosine similarity (inputs
  without ties; on exact ties PML's 'semihard' is strict, d_an > d_ap, ours d_an >= d_ap)."""
  s, pos, neg = _batch(case)
  hard = mining.select(s, pos, neg, positive="hard", negative="hard")
  assert _triplets(hard) == _pml_triplets(f"{case}/batch_hard")
  for positive, negative in META["easy_hard"]:
    sel = mining.select(s, pos, neg, positive=positive, negative=negative)
    assert _triplets(sel) == _pml_triplets(f"{case}/easy_hard/{positive}/{negative}"), (
        positive, negative)


@pytest.mark.parametrize("case", CASES)
def test_multi_similarity_miner(case):
  s, pos, neg = _batch(case)
  for eps in META["ms_epsilons"]:
    pos_kept, neg_kept = mining.multi_similarity_pairs(s, pos, neg, epsilon=eps)
    np.testing.assert_array_equal(pos_kept, DATA[f"{case}/ms/{eps}/pos"])
    np.testing.assert_array_equal(neg_kept, DATA[f"{case}/ms/{eps}/neg"])


@pytest.mark.parametrize("case", CASES)
def test_distance_weighted_miner_samples_from_the_same_distribution(case):
  """Per anchor, PML's normalised weights equal ours; an anchor with no weight left has none
  in PML either (PML drops it: ``fallback='drop'``)."""
  s, _, neg = _batch(case)
  dim = DATA[f"{case}/x"].shape[1]
  for cut in META["dw_cutoffs"]:
    w = np.asarray(mining.distance_weights(-sim.squared_distance(s), neg, dim=dim,
                                           nonzero_loss_cutoff=cut), np.float64)
    total = w.sum(axis=1, keepdims=True)
    probs = np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0)
    np.testing.assert_allclose(probs, DATA[f"{case}/dw/{cut}"], rtol=1e-4, atol=1e-6)
