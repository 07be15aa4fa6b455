"""Tests of the n-per-class batch sampler."""

import numpy as np
import pytest

from dml_jax.data import NPerClassSampler


def _labels(seed, num_classes=9, n=60):
  """Imbalanced labels with small classes (1 and 2 examples) and odd remainders."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, size=n)
  return np.concatenate([labels, [20], [30, 30]])  # classes with 1 and 2 examples


def _runs(batch_labels):
  """Consecutive runs of equal labels: list of (label, length)."""
  cuts = np.flatnonzero(np.diff(batch_labels)) + 1
  return [(int(r[0]), len(r)) for r in np.split(batch_labels, cuts)]


def _check_batch(labels, idx, *, batch_size, group_size, small_class):
  assert idx.shape == (batch_size,) and np.issubdtype(idx.dtype, np.integer)
  assert idx.min() >= 0 and idx.max() < len(labels)
  bl = labels[idx]
  if small_class == "all":
    # Contiguous groups, one class each, no class twice, no example twice.
    runs = _runs(bl)
    assert len({c for c, _ in runs}) == len(runs), bl
    assert len(np.unique(idx)) == batch_size, idx
    counts = dict(zip(*np.unique(labels, return_counts=True)))
    for i, (c, length) in enumerate(runs):
      # A group is complete (n, or all of a class with fewer) except the batch's last group,
      # cut to fill the batch (EPHN paper); never a lone example of a class that has more.
      assert length >= min(group_size, counts[c]) or i == len(runs) - 1, (runs, i)
      assert length >= min(2, counts[c]), (runs, i)
    # One group may hold one extra example (a last single free slot).
    assert sum(length > group_size for _, length in runs) <= 1, runs
    assert all(length <= group_size + 1 for _, length in runs), runs
  else:
    groups = bl.reshape(batch_size // group_size, group_size)
    assert (groups == groups[:, :1]).all(), bl       # one class per group
    assert len(np.unique(groups[:, 0])) == len(groups), bl  # distinct classes per batch
    if small_class == "skip":
      counts = np.bincount(labels)
      assert (counts[groups[:, 0]] >= group_size).all()


@pytest.mark.parametrize("small_class", ["replace", "all", "skip"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batches_have_shape_groups_and_distinct_classes(small_class, seed):
  labels = _labels(seed)
  s = NPerClassSampler(labels, batch_size=12, group_size=3, seed=seed, small_class=small_class)
  table = s.epoch_batches(0)
  assert table.shape == (s.steps_per_epoch, 12)
  for idx in table:
    _check_batch(labels, idx, batch_size=12, group_size=3, small_class=small_class)
  # With 'replace' every group is exactly n examples, without duplicates when N_c >= n.
  if small_class == "replace":
    counts = np.bincount(labels)
    for idx in table:
      for g in idx.reshape(4, 3):
        if counts[labels[g[0]]] >= 3:
          assert len(set(g.tolist())) == 3, g


def sop_like_labels(num_classes=600, seed=0):
  """Stanford Online Products' class sizes, roughly: most classes have 2-6 images (many
  exactly 2), a tail up to 12; shuffled."""
  rng = np.random.default_rng(seed)
  sizes = rng.choice([2, 2, 2, 3, 4, 5, 6, 7, 9, 12], size=num_classes)
  return rng.permutation(np.repeat(np.arange(num_classes), sizes))


@pytest.mark.parametrize("group_size,batch_size", [(2, 32), (5, 60)])
def test_all_mode_on_sop_like_classes_gives_every_anchor_a_positive(group_size, batch_size):
  """With n = 2 the remainder of a class of 3, 5, 7, ... examples used to be a
  singleton group (an anchor without a positive); now groups are complete except for classes
  with fewer than n examples, and every anchor has a positive."""
  labels = sop_like_labels()
  s = NPerClassSampler(labels, batch_size=batch_size, group_size=group_size, seed=1)
  assert s.small_class == "all"                      # the default
  table = s.epoch_batches(0)
  for idx in table:
    _check_batch(labels, idx, batch_size=batch_size, group_size=group_size, small_class="all")
    _, per_class = np.unique(labels[idx], return_counts=True)
    assert per_class.min() >= 2                      # no anchor without a positive
  np.testing.assert_array_equal(np.unique(table), np.arange(len(labels)))
  counts = np.bincount(labels)
  # Classes with fewer than n examples contribute all they have, without duplicates.
  small = np.flatnonzero(counts < group_size)
  if len(small):
    sizes = [np.sum(labels[idx] == c) for idx in table for c in np.intersect1d(labels[idx],
                                                                               small)]
    assert sizes and set(sizes) <= set(counts[small].tolist())
  # 'replace' pads them with duplicates (released EPHN code), 'skip' leaves them out.
  rep = NPerClassSampler(labels, batch_size=batch_size, group_size=group_size, seed=1,
                         small_class="replace").epoch_batches(0)
  dup = any(len(np.unique(idx)) < batch_size for idx in rep)
  assert dup == bool(len(small))


def test_all_mode_remainders_are_completed_from_the_class():
  # A class of 7 with n = 2: groups 2, 2, 2 and the remainder completed to 2 distinct examples.
  labels = np.concatenate([np.zeros(7, int), np.repeat(np.arange(1, 9), 2)])
  s = NPerClassSampler(labels, batch_size=4, group_size=2, seed=0)
  assert s.steps_per_epoch == 6
  table = s.epoch_batches(0)
  for idx in table:
    _check_batch(labels, idx, batch_size=4, group_size=2, small_class="all")
    g = idx.reshape(2, 2)
    assert (labels[g] == labels[g[:, :1]]).all() and (g[:, 0] != g[:, 1]).all()
  zero = table[labels[table] == 0]
  assert len(zero) == 8 and set(zero.tolist()) == set(range(7))   # one example twice


def test_all_mode_last_single_slot_extends_a_group():
  # n = 4, batch 8: a class of 3 leaves 5 free slots -> a top-up group of 4 and one slot,
  # which goes to a class of the batch that has an unused example (a group of 5), never a
  # lone example of a new class.
  labels = np.concatenate([[0, 0, 0], np.repeat(np.arange(1, 4), 9)])
  s = NPerClassSampler(labels, batch_size=8, group_size=4, seed=0)
  lengths = set()
  for epoch in range(3):
    for idx in s.epoch_batches(epoch):
      _check_batch(labels, idx, batch_size=8, group_size=4, small_class="all")
      lengths |= {length for _, length in _runs(labels[idx])}
  assert 5 in lengths and 1 not in lengths


def test_all_mode_never_tops_up_with_a_class_of_one_example():
  # Classes of one example give no top-up group (it would be a lone anchor): each is in the
  # epoch once, as its own group.
  labels = np.concatenate([np.repeat(np.arange(3), 6), np.arange(3, 9)])
  s = NPerClassSampler(labels, batch_size=8, group_size=4, seed=0)
  for epoch in range(3):
    visits = np.bincount(s.epoch_batches(epoch).ravel(), minlength=len(labels))
    np.testing.assert_array_equal(visits[18:], 1)


def test_all_mode_single_slot_with_used_up_classes_enlarges_a_top_up():
  """A last free slot whose batch's classes have no unused example: a top-up group is
  replaced by a larger one of an absent class, never a repeated example (600 classes of
  2-12 images at 32 = 4 x 8 repeated one in seeds 1 and 2 before)."""
  counts = np.random.default_rng(0).integers(2, 13, size=600)
  labels = np.repeat(np.arange(600), counts)
  for seed in (1, 2):
    sampler = NPerClassSampler(labels, batch_size=32, group_size=8, seed=seed)
    for b in sampler.epoch_batches(0):
      assert len(np.unique(b)) == 32
      runs = labels[b][np.r_[True, labels[b][1:] != labels[b][:-1]]]
      assert len(runs) == len(set(runs.tolist()))      # each class's examples contiguous


@pytest.mark.parametrize("small_class", ["replace", "all"])
def test_epoch_covers_every_example(small_class):
  for seed in range(3):
    labels = _labels(seed)
    s = NPerClassSampler(labels, batch_size=12, group_size=3, seed=seed, small_class=small_class)
    for epoch in range(2):
      np.testing.assert_array_equal(np.unique(s.epoch_batches(epoch)), np.arange(len(labels)))


@pytest.mark.parametrize("small_class", ["replace", "all", "skip"])
def test_one_group_per_class_epoch(small_class):
  # SOP-like class sizes (1-12 examples): every class gives one group per epoch, min(N_c, n)
  # distinct examples drawn at random, so over epochs each class's examples all appear.
  rng = np.random.default_rng(0)
  labels = np.repeat(np.arange(60), rng.integers(1, 13, size=60))
  counts = np.bincount(labels)
  n, b = 4, 16
  s = NPerClassSampler(labels, batch_size=b, group_size=n, seed=1, small_class=small_class,
                       epoch="one_group_per_class")
  classes = np.flatnonzero(counts >= n) if small_class == "skip" else np.arange(60)
  assert s.steps_per_epoch == int(np.ceil(len(classes) / (b // n)))
  seen_over_epochs = set()
  for epoch in range(12):
    table = s.epoch_batches(epoch)
    for idx in table:
      _check_batch(labels, idx, batch_size=b, group_size=n, small_class=small_class)
    # The epoch's own groups: each class once, plus top-ups in free slots (the last batch's,
    # and with 'all' those that classes with < n examples leave).
    per_class = np.bincount(labels[table.ravel()], minlength=60)
    assert (per_class[classes] >= 1).all()
    assert per_class.sum() == s.steps_per_epoch * b
    if small_class != "all":   # full groups: only the last batch's free slots are top-ups
      assert (per_class[classes] >= n).all()
      assert per_class.sum() - n * len(classes) < b
    seen_over_epochs.update(table.ravel().tolist())
  assert seen_over_epochs == set(np.flatnonzero(np.isin(labels, classes)).tolist())
  # The same epoch again (a resumed run) gives the same batches.
  again = NPerClassSampler(labels, batch_size=b, group_size=n, seed=1, small_class=small_class,
                           epoch="one_group_per_class")
  np.testing.assert_array_equal(again.batch_indices(3 * s.steps_per_epoch + 1),
                                s.batch_indices(3 * s.steps_per_epoch + 1))


@pytest.mark.parametrize("small_class", ["all", "replace"])
def test_pad_to_largest_epoch_is_the_released_cub_cars_sampler(small_class):
  # Classes of 3-13 examples, n = 4: L = 16 (13 rounded up to a multiple of n), 4 groups per
  # class; 11 classes in rounds of 11 groups; batches of 3 groups: 15 batches, the last one
  # holds the epoch's last 2 groups and one top-up group.
  counts = np.array([3, 13, 7, 9, 4, 12, 5, 8, 11, 6, 10])
  labels = np.random.default_rng(0).permutation(np.repeat(np.arange(11), counts))
  n, b, size, k = 4, 12, 16, 11
  s = NPerClassSampler(labels, batch_size=b, group_size=n, seed=2, small_class=small_class,
                       epoch="pad_to_largest")
  assert s.steps_per_epoch == 15 == -(-k * size // b)
  for epoch in range(3):
    table = s.epoch_batches(epoch)
    groups = table.reshape(-1, n)
    group_labels = labels[groups]
    assert (group_labels == group_labels[:, :1]).all()     # a group is one class
    seq = group_labels[:, 0]
    own = k * size // n                                     # the epoch's own groups: 44
    order = seq[:k]
    assert sorted(order) == list(range(k))                   # every class once per round
    np.testing.assert_array_equal(seq[:own], np.tile(order, size // n))
    for batch in table:                                      # distinct classes in a batch
      assert len(set(labels[batch].tolist())) == b // n
    assert seq[own] not in seq[own - 2:own]                  # the top-up: a class not there
    for c in range(k):
      picked = groups[:own][seq[:own] == c].ravel()
      assert len(picked) == size
      members = np.flatnonzero(labels == c)
      assert set(picked.tolist()) == set(members.tolist())   # all of it, padded by repeats
      assert len(picked) - len(np.unique(picked)) == size - counts[c]
  assert not np.array_equal(s.epoch_batches(0), s.epoch_batches(1))
  again = NPerClassSampler(labels, batch_size=b, group_size=n, seed=2, small_class=small_class,
                           epoch="pad_to_largest")
  np.testing.assert_array_equal(again.batch_indices(17), s.batch_indices(17))


def test_pad_to_largest_keeps_a_multiple_of_n_and_refuses_skip():
  labels = np.repeat(np.arange(4), [8, 8, 5, 2])
  s = NPerClassSampler(labels, batch_size=4, group_size=2, seed=0, epoch="pad_to_largest")
  assert s.steps_per_epoch == 8   # L = 8: 4 classes x 4 groups, 2 groups a batch
  # The release's cut: a largest class of over 1,000 examples gives L = 100 (rounded up to a
  # multiple of n); a class above L gives L distinct examples.
  big = np.repeat(np.arange(3), [1001, 150, 40])
  s = NPerClassSampler(big, batch_size=16, group_size=8, seed=0, epoch="pad_to_largest")
  table = s.epoch_batches(0)
  assert s.steps_per_epoch == 3 * 104 // 16 + 1   # 19.5 -> 20 (the last one topped up)
  for c, distinct in ((0, 104), (1, 104), (2, 40)):
    own = table.ravel()[:3 * 104][big[table.ravel()[:3 * 104]] == c]
    assert len(own) == 104 and len(np.unique(own)) == distinct
  # Exactly 1,000 is not over 1,000: L = 1000.
  edge = np.repeat(np.arange(3), [1000, 150, 40])
  s = NPerClassSampler(edge, batch_size=16, group_size=8, seed=0, epoch="pad_to_largest")
  assert s.steps_per_epoch == 3 * 1000 // 16 + 1
  with pytest.raises(ValueError, match="small_class='skip' drops the classes"):
    NPerClassSampler(labels, batch_size=4, group_size=2, seed=0, small_class="skip",
                     epoch="pad_to_largest")


def test_skip_mode_visits_full_groups_and_never_small_classes():
  labels = _labels(0)
  s = NPerClassSampler(labels, batch_size=12, group_size=3, seed=0, small_class="skip")
  seen = np.unique(s.epoch_batches(0))
  counts = np.bincount(labels)
  per_class = np.bincount(labels[seen], minlength=len(counts))
  assert (per_class >= 3 * (counts // 3)).all()   # every full group visited
  assert per_class[20] == 0 and per_class[30] == 0  # classes smaller than n never appear
  assert s.steps_per_epoch == int(np.ceil((counts // 3).sum() / 4))


def test_exactly_once_when_groups_fill_the_epoch():
  # 6 classes x 8 examples, n=4: 12 groups, 3 per batch -> 4 batches, no top-up.
  labels = np.repeat(np.arange(6), 8)
  s = NPerClassSampler(labels, batch_size=12, group_size=4, seed=3)
  assert s.steps_per_epoch == 4
  table = s.epoch_batches(0)
  np.testing.assert_array_equal(np.sort(table.ravel()), np.arange(48))


def test_dominant_class_spread_over_distinct_batches():
  # Class 0 has 40 groups of 2, the others 1 each: one batch per class-0 group.
  labels = np.concatenate([np.zeros(80, int), np.repeat(np.arange(1, 6), 2)])
  s = NPerClassSampler(labels, batch_size=6, group_size=2, seed=0)
  assert s.steps_per_epoch == 40
  table = s.epoch_batches(0)
  for idx in table:
    _check_batch(labels, idx, batch_size=6, group_size=2, small_class="replace")
  np.testing.assert_array_equal(np.unique(table), np.arange(len(labels)))


def test_all_mode_fills_batch_when_classes_run_out():
  # 3 classes of 2 examples cannot fill a batch of 8 with distinct classes: the last slots
  # repeat examples of the batch, and the shape stays [8].
  labels = np.repeat(np.arange(3), 2)
  s = NPerClassSampler(labels, batch_size=8, group_size=4, seed=0, small_class="all")
  table = s.epoch_batches(0)
  assert table.shape == (s.steps_per_epoch, 8)
  np.testing.assert_array_equal(np.unique(table), np.arange(6))


def test_deterministic_for_a_seed_and_different_for_another():
  labels = _labels(5)
  a = NPerClassSampler(labels, batch_size=12, group_size=3, seed=7)
  b = NPerClassSampler(labels, batch_size=12, group_size=3, seed=7)
  c = NPerClassSampler(labels, batch_size=12, group_size=3, seed=8)
  np.testing.assert_array_equal(a.epoch_batches(1), b.epoch_batches(1))
  assert not np.array_equal(a.epoch_batches(0), c.epoch_batches(0))
  assert not np.array_equal(a.epoch_batches(0), a.epoch_batches(1))  # a new shuffle per epoch


@pytest.mark.parametrize("small_class", ["replace", "all", "skip"])
def test_random_access_equals_sequential_iteration(small_class):
  labels = _labels(1)
  kwargs = dict(batch_size=12, group_size=3, seed=11, small_class=small_class)
  seq = NPerClassSampler(labels, cache_epochs=1, **kwargs)
  steps = 3 * seq.steps_per_epoch + 2
  sequential = [seq.batch_indices(t) for t in range(steps)]
  # A "resumed" sampler jumps straight to late steps, across epochs, in any order.
  resumed = NPerClassSampler(labels, cache_epochs=1, **kwargs)
  for t in [steps - 1, 4, seq.steps_per_epoch, 2 * seq.steps_per_epoch + 1, 0]:
    np.testing.assert_array_equal(resumed.batch_indices(t), sequential[t])


def test_epoch_of_and_returned_batches_are_copies():
  labels = np.repeat(np.arange(6), 8)
  s = NPerClassSampler(labels, batch_size=12, group_size=4, seed=0)
  assert [s.epoch_of(t) for t in (0, 3, 4, 9)] == [0, 0, 1, 2]
  idx = s.batch_indices(5)
  before = idx.copy()
  idx[:] = -1
  np.testing.assert_array_equal(s.batch_indices(5), before)
  with pytest.raises(ValueError, match="step must be a non-negative int, got -1"):
    s.batch_indices(-1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=8, group_size=16), "group_size=16 is larger than batch_size=8"),
    (dict(batch_size=-4, group_size=2), r"^batch_size=-4 must be a positive number of "),
    (dict(batch_size=10, group_size=4), "batch_size=10 must be a multiple of group_size=4"),
    (dict(batch_size=8, group_size=1), "group_size=1 must be >= 2"),
    (dict(batch_size=16, group_size=2), "8 classes per batch.*only 6 classes"),
    (dict(batch_size=8, group_size=2, small_class="pad"), "'pad'.*all, replace, skip"),
    (dict(batch_size=8, group_size=2, seed=-1), "seed=-1"),
    (dict(batch_size=8, group_size=2, epoch="one"),
     "'one'.*every_example, one_group_per_class, pad_to_largest"),
])
def test_errors(kwargs, match):
  labels = np.repeat(np.arange(6), 3)
  kwargs = {"seed": 0, **kwargs}
  with pytest.raises(ValueError, match=match):
    NPerClassSampler(labels, **kwargs)


def test_skip_counts_only_classes_with_a_full_group():
  labels = np.array([0, 0, 0, 1, 1, 1, 2, 3])
  with pytest.raises(ValueError, match="only 2 classes with >= 3 examples"):
    NPerClassSampler(labels, batch_size=9, group_size=3, seed=0, small_class="skip")
  with pytest.raises(ValueError, match="labels must be integers"):
    NPerClassSampler(labels.astype(float), batch_size=6, group_size=3, seed=0)


def test_sampler_is_thread_safe_and_picklable():
  """The input pipeline reads batches from many threads, across epoch boundaries, and
  pickles the sampler into grain worker processes."""
  import concurrent.futures  # pylint: disable=import-outside-toplevel
  import pickle  # pylint: disable=import-outside-toplevel
  labels = np.repeat(np.arange(6), 5)
  sampler = NPerClassSampler(labels, batch_size=6, group_size=3, seed=2, cache_epochs=1)
  steps = list(range(0, 40 * sampler.steps_per_epoch, 3))
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    got = list(pool.map(sampler.batch_indices, steps))
  fresh = NPerClassSampler(labels, batch_size=6, group_size=3, seed=2)
  for step, idx in zip(steps, got):
    np.testing.assert_array_equal(idx, fresh.batch_indices(step))
  clone = pickle.loads(pickle.dumps(sampler))
  np.testing.assert_array_equal(clone.batch_indices(7), fresh.batch_indices(7))


def test_skip_mode_says_which_classes_it_leaves_out(caplog):
  labels = np.array([0] * 5 + [1] * 5 + [2] * 2 + [3] * 1)
  with caplog.at_level("WARNING"):
    sampler = NPerClassSampler(labels, batch_size=6, group_size=3, seed=0, small_class="skip")
  assert "leaves out 2 of 4 classes (3 examples)" in caplog.text
  assert "smallest has 1" in caplog.text
  assert set(labels[sampler.batch_indices(0)]) <= {0, 1}
  with pytest.raises(ValueError, match=r"only 1 classes with >= 5 examples"):
    NPerClassSampler(np.array([0] * 5 + [1] * 4), batch_size=10, group_size=5, seed=0,
                     small_class="skip")
