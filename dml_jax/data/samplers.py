"""The n-per-class batch sampler (seed paper: "n examples per class, classes added until the
batch is full"), as a pure function of ``(seed, step)``.

A batch of ``batch_size = B`` indices holds ``c = B // n`` *groups*; a group is up to
``n = group_size`` examples of one class, stored contiguously, and no class appears in two
groups of the same batch. An epoch is built as follows (host-side numpy):

1. Every class is shuffled and cut into consecutive groups of ``n``; the last group of a
   class holds the remainder ``r = N_c mod n`` (a class with ``N_c < n`` is one such group).
   A remainder group of a class with ``N_c >= n`` is completed with ``n - r`` *other*
   examples of the class (drawn without replacement, so the group has no duplicates), in
   every mode but ``'skip'``: only a class that has fewer than ``n`` examples may form a
   group of fewer than ``n`` (the EPHN paper, §5: "When a class has fewer than n examples, we
   use all the examples from the class"), and no remainder leaves an anchor without a
   positive. ``small_class`` decides what happens to the group of a class with ``N_c < n``:

   * ``'all'`` (default; the EPHN paper's text): the group keeps its ``N_c``
     examples; the free slots of the batch go to further groups (see 4), so a batch may hold
     more than ``c`` classes. Only a class with a single example in the whole split gives an
     anchor without a positive.
   * ``'replace'`` (the released EPHN code pads classes): the group is padded to ``n`` by
     sampling the class's examples with replacement (duplicates, i.e. positive pairs with
     similarity 1, which become every duplicated anchor's easiest positive). Every group has
     exactly ``n`` examples.
   * ``'skip'``: the group is dropped, so classes with ``N_c < n`` never appear; the
     remainder of a larger class is left out of this epoch (a different remainder next
     epoch), so every group has exactly ``n`` distinct examples.

   Why ``'all'`` by default: it is what the EPHN paper states, it trains on every
   class, and it adds no duplicate images: a padded duplicate is a positive at ``S = 1``,
   which easy-positive mining (EPHN, EPS) then always selects, giving that anchor a
   zero-information term. ``'replace'`` stays for reproducing the released code.

2. The number of batches per epoch is the constant
   ``S = max(ceil(G / c), max_k G_k)`` (``G`` groups in all, ``G_k`` of class ``k``): every
   group fits once and a class with many groups can be spread over distinct batches.
3. Groups are packed batch by batch: a class with as many groups left as batches left must
   go into this batch; the other places (up to ``c`` groups) go to classes drawn at random
   without replacement with probability proportional to their remaining groups, each
   contributing its next group. This keeps the classes of a batch distinct, spreads the
   classes over the epoch like a random shuffle and always finishes in ``S`` batches.
4. A batch with free slots (the last batches, small classes with ``'all'``, or when a class
   dominates) is topped up with extra groups of classes absent from the batch, drawn at
   random (``n`` examples without replacement, or as in 1 for a class with ``N_c < n``).
   With ``'all'``, a top-up group holds ``min(n, free slots, N_c)`` examples (the EPHN
   paper: "if ... the last class in the batch does not have space for n images, we just
   include enough images to fill the batch") and never a single one: classes with one
   example are not used for top-ups, and a last single free slot goes to one more unused
   example of a class already in the batch (its group then holds up to ``n + 1``; a class
   with ``N_c < n`` has none left), so it is never a lone anchor; if the batch's classes
   have none left, a top-up group is replaced by one a slot larger of a class absent from
   the batch that has the examples. Only when neither is possible (the batch's own groups
   leave a single slot, its classes are used up and it has no top-up group to enlarge, or no
   class is large enough) do the last free slots repeat examples of the batch (sampling with
   replacement). Examples visited twice in an epoch are the top-ups and those that complete
   a class's last, partial group (1).

``epoch`` decides what an epoch holds:

* ``'every_example'`` (default): every class is cut into all its groups (1), so an epoch
  passes over every example.
* ``'one_group_per_class'`` (the released EPHN code's sampler on SOP, In-Shop and Hotels-50K):
  every class gives one group per epoch, ``min(N_c, n)`` of its examples drawn at random
  without replacement (a class with ``N_c < n`` is treated by ``small_class`` as above), so an
  epoch has ``S = ceil(K / c)`` batches for ``K`` classes (a class with ``N_c < n`` with
  ``'skip'`` gives none), and the other examples of a class are seen in later epochs.

* ``'pad_to_largest'`` (the EPHN paper's released code on CUB-200-2011 and Cars196, as of the
  paper): every class is brought to ``L`` examples, the largest class's size rounded up to a
  multiple of ``n`` (100 rounded up when the largest class has over 1,000 examples, as the
  release), by adding examples of its own drawn with replacement (duplicates), or by drawing
  ``L`` without replacement if it has more; shuffled and cut into ``L / n`` groups. The classes are shuffled once per epoch, and the epoch is ``L / n`` rounds, each
  visiting every class in that order with its next group; the batches are consecutive runs
  of ``c`` groups of that sequence (a batch can span two rounds), so within an epoch a class
  meets in its batches only the classes near it in the order. ``S = ceil(K L / B)`` batches;
  the free slots of the last one are topped up with full groups as in 4. ``small_class`` has
  no effect on the epoch's own groups (every class is padded, as the release does;
  ``'skip'`` is refused).

So every batch has exactly ``B`` indices, and with ``'replace'`` and ``'all'`` an epoch of
``'every_example'`` visits every example at least once. With ``'all'`` and ``'skip'`` an example appears at most
once in a batch except in that last-resort case; with ``'replace'`` a class with ``N_c < n``
is padded with duplicates. The epoch is a function of ``(seed, epoch)`` only
(``numpy.random.default_rng([seed, epoch])``); ``batch_indices(step)`` builds (and caches)
that epoch's batches, so a resumed run gets exactly the batches it would have had.
"""

from __future__ import annotations

import collections
import math
import threading

from absl import logging
import numpy as np

SMALL_CLASS_MODES = ("all", "replace", "skip")
EPOCH_MODES = ("every_example", "one_group_per_class", "pad_to_largest")


class NPerClassSampler:
  """Batches of ``batch_size`` indices, ``group_size`` per class, a pure function of the step.

  Usage::

    sampler = NPerClassSampler(split.labels, batch_size=32, group_size=4, seed=0)
    for step in range(start_step, num_steps):
      idx = sampler.batch_indices(step)           # int64 [32]
      images, labels = split.images[idx], split.labels[idx]

  Args:
    labels: int ``[N]`` class labels (any integer values).
    batch_size: ``B``, a multiple of ``group_size``.
    group_size: ``n >= 2``, examples per class in a batch.
    seed: non-negative int; the batches depend on ``(seed, step)`` only.
    small_class: ``'all'`` (default), ``'replace'`` or ``'skip'``: the treatment of classes
      with fewer than ``n`` examples (see the module docstring; groups of larger classes are
      complete, but for a top-up group cut to the batch's last free slots).
    epoch: ``'every_example'`` (default: an epoch passes over every example),
      ``'one_group_per_class'`` (one group of each class per epoch) or ``'pad_to_largest'``
      (every class padded to the largest, in rounds; module docstring).
    cache_epochs: how many epochs' batch tables to keep (each is ``[S, B]`` int64).

  Raises:
    ValueError: ``batch_size < 1``, ``group_size < 2``, ``group_size > batch_size``,
      ``batch_size`` not a multiple of ``group_size``, fewer (usable) classes than
      ``batch_size // group_size``, an unknown ``small_class`` or ``epoch``, ``'skip'`` with
      ``'pad_to_largest'``, a negative seed or malformed labels.
  """

  def __init__(self, labels: np.ndarray, *, batch_size: int, group_size: int, seed: int,
               small_class: str = "all", epoch: str = "every_example", cache_epochs: int = 2):
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape[0] == 0:
      raise ValueError(f"labels must be a non-empty rank-1 array [N], got shape {labels.shape}.")
    if not np.issubdtype(labels.dtype, np.integer):
      raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
    for what, value in (("batch_size", batch_size), ("group_size", group_size),
                        ("seed", seed), ("cache_epochs", cache_epochs)):
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{what} must be an int, got {value!r}.")
    if batch_size < 1:
      raise ValueError(f"batch_size={batch_size} must be a positive number of examples.")
    if group_size < 2:
      raise ValueError(f"group_size={group_size} must be >= 2 (an anchor needs a positive).")
    if group_size > batch_size:
      raise ValueError(f"group_size={group_size} is larger than batch_size={batch_size}.")
    if batch_size % group_size:
      raise ValueError(f"batch_size={batch_size} must be a multiple of group_size="
                       f"{group_size}.")
    if small_class not in SMALL_CLASS_MODES:
      raise ValueError(f"Unknown small_class {small_class!r}; allowed: "
                       f"{', '.join(SMALL_CLASS_MODES)}.")
    if epoch not in EPOCH_MODES:
      raise ValueError(f"Unknown epoch {epoch!r}; allowed: {', '.join(EPOCH_MODES)}.")
    if epoch == "pad_to_largest" and small_class == "skip":
      raise ValueError("small_class='skip' drops the classes that epoch='pad_to_largest' pads; "
                       "use 'all' or 'replace'.")
    if seed < 0:
      raise ValueError(f"seed={seed} must be non-negative.")
    if cache_epochs < 1:
      raise ValueError(f"cache_epochs={cache_epochs} must be >= 1.")
    self.batch_size = int(batch_size)
    self.group_size = int(group_size)
    self.seed = int(seed)
    self.small_class = small_class
    self.epoch_mode = epoch
    self.classes_per_batch = self.batch_size // self.group_size
    self.labels = labels.copy()
    self.labels.setflags(write=False)

    self.classes, class_of, self.class_counts = np.unique(
        labels, return_inverse=True, return_counts=True)
    # Dataset indices sorted by class (stable); class k occupies [starts[k], starts[k] + N_k).
    self._by_class = np.argsort(class_of, kind="stable")
    self._starts = np.concatenate([[0], np.cumsum(self.class_counts)[:-1]])
    n = self.group_size
    if small_class == "skip":
      self._groups_per_class = self.class_counts // n
    else:
      self._groups_per_class = -(-self.class_counts // n)
    if epoch == "one_group_per_class":   # a class's first group: a random subset of it
      self._groups_per_class = np.minimum(self._groups_per_class, 1)
    # 'pad_to_largest': every class brought to L examples, L / n groups each
    largest = int(self.class_counts.max())
    self._padded_size = -(-(100 if largest > 1000 else largest) // n) * n
    if epoch == "pad_to_largest":
      self._groups_per_class = np.full(len(self.classes), self._padded_size // n)
    usable = int(np.count_nonzero(self._groups_per_class))
    # Classes that may contribute top-up groups: with 'skip', only classes with >= n; with
    # 'all', classes with >= 2 examples (a one-example top-up would be a lone anchor).
    filler = self._groups_per_class > 0
    if small_class == "all":
      filler &= self.class_counts >= 2
    self._filler_classes = np.flatnonzero(filler)
    if usable < self.classes_per_batch:
      what = f"classes with >= {n} examples" if small_class == "skip" else "classes"
      raise ValueError(f"batch_size={batch_size} // group_size={group_size} = "
                       f"{self.classes_per_batch} classes per batch, but the labels have only "
                       f"{usable} {what}.")
    if small_class == "skip" and usable < len(self.classes):
      small = self.class_counts < n
      logging.warning(
          "NPerClassSampler: small_class='skip' leaves out %d of %d classes (%d examples) "
          "with fewer than group_size=%d examples (the smallest has %d); use 'replace' or "
          "'all' to train on them.", int(small.sum()), len(self.classes),
          int(self.class_counts[small].sum()), n, int(self.class_counts.min()))
    num_groups = int(self._groups_per_class.sum())
    self.num_groups = num_groups
    self.steps_per_epoch = max(math.ceil(num_groups / self.classes_per_batch),
                               int(self._groups_per_class.max()))
    self._cache: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
    self._cache_epochs = int(cache_epochs)
    self._lock = threading.Lock()

  def __repr__(self) -> str:
    return (f"NPerClassSampler(N={len(self.labels)}, classes={len(self.classes)}, "
            f"batch_size={self.batch_size}, group_size={self.group_size}, seed={self.seed}, "
            f"small_class={self.small_class!r}, epoch={self.epoch_mode!r}, "
            f"steps_per_epoch={self.steps_per_epoch})")

  def epoch_of(self, step: int) -> int:
    """The epoch of a step: ``step // steps_per_epoch``."""
    return _check_nonnegative(step, "step") // self.steps_per_epoch

  def batch_indices(self, step: int) -> np.ndarray:
    """Dataset indices of the batch at ``step``: int64 ``[batch_size]``.

    Groups are contiguous: with ``'replace'``/``'skip'``, ``idx[g*n:(g+1)*n]`` is one class.
    """
    step = _check_nonnegative(step, "step")
    epoch, within = divmod(step, self.steps_per_epoch)
    return self.epoch_batches(epoch)[within].copy()

  def epoch_batches(self, epoch: int) -> np.ndarray:
    """All batches of an epoch: int64 ``[steps_per_epoch, batch_size]`` (read-only, cached)."""
    epoch = _check_nonnegative(epoch, "epoch")
    with self._lock:   # the input pipeline calls this from several threads
      if epoch in self._cache:
        self._cache.move_to_end(epoch)
        return self._cache[epoch]
      table = self._build_epoch(np.random.default_rng([self.seed, epoch]))
      table.setflags(write=False)
      self._cache[epoch] = table
      while len(self._cache) > self._cache_epochs:
        self._cache.popitem(last=False)
      return table

  def __getstate__(self):
    """Pickled (grain worker processes) without the lock and the epoch cache."""
    state = dict(self.__dict__)
    del state["_lock"]
    state["_cache"] = collections.OrderedDict()
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def _build_epoch(self, rng: np.random.Generator) -> np.ndarray:
    """The ``[S, B]`` batch table of one epoch, drawn with ``rng``."""
    if self.epoch_mode == "pad_to_largest":
      return self._build_padded_epoch(rng)
    groups, sizes, first_group = self._make_groups(rng)
    num_classes, c = len(self.classes), self.classes_per_batch
    remaining = self._groups_per_class.copy()
    taken = np.zeros(num_classes, np.int64)
    table = np.empty((self.steps_per_epoch, self.batch_size), np.int64)
    for b in range(self.steps_per_epoch):
      left = self.steps_per_epoch - b
      # Gumbel top-k = sampling without replacement with probability ~ remaining groups;
      # classes that need every remaining batch come first.
      with np.errstate(divide="ignore"):
        keys = np.log(remaining.astype(np.float64)) + rng.gumbel(size=num_classes)
      keys[remaining == left] = np.inf
      k = min(c, int(np.count_nonzero(remaining)))
      chosen = np.argpartition(-keys, k - 1)[:k] if k else np.zeros(0, np.int64)
      rng.shuffle(chosen)
      group_ids = first_group[chosen] + taken[chosen]
      taken[chosen] += 1
      remaining[chosen] -= 1
      parts = [groups[g, :sizes[g]] for g in group_ids]
      table[b] = self._top_up(parts, chosen.tolist(), rng)
    assert not remaining.any()
    return table

  def _build_padded_epoch(self, rng: np.random.Generator) -> np.ndarray:
    """The ``[S, B]`` table of a ``'pad_to_largest'`` epoch (module docstring)."""
    n, size, c = self.group_size, self._padded_size, self.classes_per_batch
    rows = []
    for k, count in enumerate(self.class_counts.tolist()):
      members = self._by_class[self._starts[k]:self._starts[k] + count]
      if count >= size:
        rows.append(rng.permutation(members)[:size])
      else:
        extra = rng.choice(members, size=size - count, replace=True)
        rows.append(rng.permutation(np.concatenate([members, extra])))
    order = rng.permutation(len(rows))
    # [K, L] -> [K, L / n, n] -> rounds first: group t of every class, in the epoch's order
    groups = np.stack(rows)[order].reshape(len(rows), size // n, n).transpose(1, 0, 2)
    group_classes = np.tile(order, size // n)
    groups = groups.reshape(-1, n)
    table = np.empty((self.steps_per_epoch, self.batch_size), np.int64)
    for b in range(self.steps_per_epoch):
      ids = range(b * c, min((b + 1) * c, len(groups)))
      table[b] = self._top_up([groups[g] for g in ids], [int(group_classes[g]) for g in ids],
                              rng)
    return table

  def _make_groups(self, rng: np.random.Generator):
    """Shuffles every class and cuts it into groups.

    Returns:
      ``groups`` int64 ``[G, n]`` (dataset indices, -1 where empty), ``sizes`` int ``[G]``
      and ``first_group`` int ``[K]`` (the row of each class's first group; a class's groups
      are consecutive rows).
    """
    n, counts, gpc = self.group_size, self.class_counts, self._groups_per_class
    # Random order within each class: sort by (class, random key).
    class_sorted = np.repeat(np.arange(len(counts)), counts)
    order = self._by_class[np.lexsort((rng.random(len(class_sorted)), class_sorted))]
    group_class = np.repeat(np.arange(len(counts)), gpc)
    first_group = np.concatenate([[0], np.cumsum(gpc)[:-1]])
    group_rank = np.arange(len(group_class)) - first_group[group_class]
    pos = group_rank[:, None] * n + np.arange(n)[None, :]        # position within the class
    count = counts[group_class][:, None]
    start = self._starts[group_class][:, None]
    inside = pos < count
    groups = np.where(inside, order[start + np.minimum(pos, count - 1)], -1)
    # Padding slot t of a remainder group (r = count - rank * n): the class's (t - r)-th
    # example (never in the remainder) if the class has >= n examples; with 'replace', a
    # uniformly drawn example of a class with < n examples (with replacement).
    pad_pos = np.where(count >= n, pos - count,
                       np.floor(rng.random(pos.shape) * count).astype(np.int64))
    padded = order[start + np.clip(pad_pos, 0, count - 1)]
    pad = ~inside & ((count >= n) | (self.small_class == "replace"))
    groups = np.where(pad, padded, groups)
    sizes = np.where(count[:, 0] >= n, n, np.minimum(count[:, 0] - group_rank * n, n))
    if self.small_class == "replace":
      sizes = np.full(len(group_class), n)
    return groups, sizes, first_group

  def _class_sample(self, k: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` examples of class ``k``: distinct if possible, the rest with replacement."""
    members = self._by_class[self._starts[k]:self._starts[k] + self.class_counts[k]]
    distinct = rng.permutation(members)[:size]
    extra = rng.choice(members, size=size - len(distinct), replace=True)
    return np.concatenate([distinct, extra])

  def _top_up(self, parts: list[np.ndarray], classes: list[int],
              rng: np.random.Generator) -> np.ndarray:
    """Concatenates the batch's groups (``parts``, of classes ``classes``) and fills the free
    slots (module docstring, 4)."""
    free = self.batch_size - sum(len(p) for p in parts)
    first_top_up = len(parts)
    if free:
      present = set(classes)
      cut = self.small_class == "all" and self.epoch_mode != "pad_to_largest"
      for k in rng.permutation(self._filler_classes).tolist():
        if free < (2 if cut else 1):
          break
        if k in present:
          continue
        if cut:
          size = min(self.group_size, free, int(self.class_counts[k]))
        else:  # 'replace', 'skip' and 'pad_to_largest' groups are always full.
          size = self.group_size
        parts.append(self._class_sample(k, size, rng))
        classes.append(k)
        free -= size
      if free == 1:  # Only with 'all': one more example of a class in the batch.
        free -= self._extend_a_group(parts, classes, rng)
      if free:  # Only with 'all': a top-up group of a larger class absent from the batch.
        free -= self._enlarge_a_top_up(parts, classes, first_top_up, free, rng)
      if free:  # Only with 'all': no class has more examples to give.
        batch = np.concatenate(parts)
        parts.append(rng.choice(batch, size=free, replace=True))
    return np.concatenate(parts)

  def _enlarge_a_top_up(self, parts: list[np.ndarray], classes: list[int], first_top_up: int,
                        free: int, rng: np.random.Generator) -> int:
    """Replaces a top-up group (``parts[first_top_up:]``, the newest first) by one ``free``
    examples larger, of a class absent from the batch that has that many; returns ``free``,
    or 0 if there is none (the batch's classes are used up and its top-ups cannot grow)."""
    absent = self._filler_classes[~np.isin(self._filler_classes, classes)]
    for i in range(len(parts) - 1, first_top_up - 1, -1):
      need = len(parts[i]) + free
      fits = absent[self.class_counts[absent] >= need]
      if len(fits):
        k = int(fits[int(rng.integers(len(fits)))])
        parts[i], classes[i] = self._class_sample(k, need, rng), k
        return free
    return 0

  def _extend_a_group(self, parts: list[np.ndarray], classes: list[int],
                      rng: np.random.Generator) -> int:
    """Adds one unused example of a class of the batch to its group, in place (the group
    stays contiguous); returns 1, or 0 if no class of the batch has an unused example."""
    room = [i for i, (p, k) in enumerate(zip(parts, classes))
            if len(np.unique(p)) < self.class_counts[k]]
    if not room:
      return 0
    i = room[int(rng.integers(len(room)))]
    k = classes[i]
    members = self._by_class[self._starts[k]:self._starts[k] + self.class_counts[k]]
    unused = np.setdiff1d(members, parts[i])
    parts[i] = np.concatenate([parts[i], [rng.choice(unused)]])
    return 1


def _check_nonnegative(value: int, what: str) -> int:
  """Returns ``int(value)`` or raises ``ValueError`` if it is not a non-negative int."""
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
    raise ValueError(f"{what} must be a non-negative int, got {value!r}.")
  return int(value)
