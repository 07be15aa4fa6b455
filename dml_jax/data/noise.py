"""Label noise for the label-noise paper's experiments (Le & Odobez, "Theoretical guarantees
of deep embedding losses under label noise"; eqs. 6-8).

* :func:`uniform_label_noise`: each label is kept with probability ``1 - p`` and otherwise
  replaced by one of the *other* ``K - 1`` classes uniformly (eq. 6).
* :func:`clean_subsample`: the clean ``(1 - p)`` "topline": a random subset of the training
  examples with the size of the uncorrupted part, labels untouched.
* :func:`pair_noise_rates`: the pair label noise ``q_{+1}`` (positive pair -> negative) and
  ``q_{-1}`` (negative pair -> positive) induced by a sample noise rate ``p`` (eqs. 7-8).

All functions are host-side numpy and deterministic in their ``seed``.
"""

from __future__ import annotations

from absl import logging
import numpy as np

from dml_jax import hparams
from dml_jax.data.splits import Split
from dml_jax.data.images import take


def _check_rate(name: str, value, *, upper_inclusive: bool = True) -> float:
  try:
    value = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a number in [0, 1], got {value!r}.") from None
  if not (0.0 <= value <= 1.0) or (not upper_inclusive and value == 1.0):
    allowed = "[0, 1]" if upper_inclusive else "[0, 1)"
    raise ValueError(f"{name} must be in {allowed}, got {value}.")
  return value


def _check_num_classes(num_classes) -> int:
  if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) \
      or num_classes < 2:
    raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}.")
  return int(num_classes)


def check_options(*, label_noise, clean_fraction, noise_seed=0, prefix: str = "") -> None:
  """``label_noise`` in [0, 1], ``clean_fraction`` in (0, 1] and ``noise_seed`` an integer
  >= 0 (``prepare_train_split``'s options); ``ValueError`` naming ``prefix + key``, the value
  and what is allowed."""
  _check_rate(f"{prefix}label_noise", label_noise)
  hparams.fraction(f"{prefix}clean_fraction", clean_fraction)
  hparams.integer(f"{prefix}noise_seed", noise_seed, minimum=0)


def uniform_label_noise(labels, *, rate: float, num_classes: int, seed: int) -> np.ndarray:
  """Uniform label noise (label-noise paper eq. 6).

    y_hat_i = y_i                      with probability 1 - p
    y_hat_i = u, for each u != y_i     with probability p / (K - 1)

  Each example is corrupted independently; a corrupted label is never its original.

  Args:
    labels: int ``[N]`` clean labels in ``0..K-1``.
    rate: ``p`` in [0, 1].
    num_classes: ``K >= 2``.
    seed: seed of ``numpy.random.default_rng``.

  Returns:
    int32 ``[N]`` noisy labels (a new array; ``rate=0`` returns a copy).

  Raises:
    ValueError: a rate outside [0, 1], ``num_classes < 2``, or labels outside ``0..K-1``.
  """
  rate = _check_rate("rate", rate)
  k = _check_num_classes(num_classes)
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be an integer array [N], got shape {labels.shape} and "
                     f"dtype {labels.dtype}.")
  if labels.size and (labels.min() < 0 or labels.max() >= k):
    raise ValueError(f"labels must be in 0..{k - 1} (num_classes={k}), got the range "
                     f"[{labels.min()}, {labels.max()}].")
  rng = np.random.default_rng(seed)
  flip = rng.random(labels.shape[0]) < rate
  # A uniform draw among the other K-1 classes: shift by 1..K-1 modulo K.
  shift = rng.integers(1, k, size=labels.shape[0])
  return np.where(flip, (labels + shift) % k, labels).astype(np.int32)


def clean_subsample(num: int, *, fraction: float, seed: int) -> np.ndarray:
  """The clean topline's training subset: ``round(fraction * num)`` indices, sorted.

  With ``fraction = 1 - p`` this keeps as many (clean) examples as a noise rate ``p``
  leaves uncorrupted (the label-noise paper's "clean" curves, Fig. 1-2).

  Args:
    num: ``N``, the number of training examples (>= 1).
    fraction: in (0, 1]; at least one index is kept.
    seed: seed of ``numpy.random.default_rng``.

  Returns:
    int64 ``[M]`` sorted distinct indices in ``0..N-1``, ``M = max(1, round(fraction N))``.
  """
  if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num < 1:
    raise ValueError(f"num must be a positive integer, got {num!r}.")
  fraction = _check_rate("fraction", fraction)
  if fraction == 0.0:
    raise ValueError("fraction must be in (0, 1], got 0.0 (the subset would be empty).")
  size = max(1, int(round(fraction * num)))
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(int(num), size=size, replace=False)).astype(np.int64)


def pair_noise_rates(p: float, num_classes: int, *, as_printed: bool = False):
  """Pair label noise ``(q_{+1}, q_{-1})`` induced by sample noise ``p`` (eqs. 7-8).

  ``q_{-1}`` (a negative pair, ``y_i != y_j``, observed as positive), eq. 7, exact:

    q_{-1} = 2 p (1 - p) / (K - 1) + p^2 (K - 2) / (K - 1)^2

  ``q_{+1}`` (a positive pair observed as negative), eq. 8. When both labels change, the two
  new labels are uniform over the same ``K - 1`` classes, so they differ with probability
  ``1 - 1/(K - 1)``:

    q_{+1} = 2 p (1 - p) + p^2 (1 - 1/(K - 1))                 (default, exact)

  The paper prints ``p^2 (1 - 2/(K - 1))`` for the second term; ``as_printed=True`` returns
  that value (a Monte Carlo estimate agrees with the exact form; see the tests).

  Args:
    p: sample label noise rate in [0, 1].
    num_classes: ``K >= 2``.
    as_printed: use eq. 8 as printed in the paper.

  Returns:
    ``(q_pos, q_neg)`` Python floats.
  """
  p = _check_rate("p", p)
  k = _check_num_classes(num_classes)
  q_neg = 2 * p * (1 - p) / (k - 1) + p * p * (k - 2) / (k - 1) ** 2
  both = (1 - 2 / (k - 1)) if as_printed else (1 - 1 / (k - 1))
  q_pos = 2 * p * (1 - p) + p * p * both
  return float(q_pos), float(q_neg)


def _without_empty_classes(labels: np.ndarray, num_classes: int, option: str,
                          where: str) -> np.ndarray:
  """``labels [N]`` renumbered ``0..C'-1`` over the classes that still have an example, with a
  warning when some have none (``option`` and ``where`` name the cause)."""
  kept, renumbered = np.unique(labels, return_inverse=True)
  if len(kept) < num_classes:
    logging.warning("%s: %d of %d training classes have no example left %s and are left out "
                    "(the others renumbered 0..%d).", option, num_classes - len(kept),
                    num_classes, where, len(kept) - 1)
  return renumbered.astype(np.asarray(labels).dtype).reshape(np.shape(labels))


def prepare_train_split(train, *, label_noise: float, clean_fraction: float, seed: int):
  """Applies the label-noise paper's training-set options to the train ``Split``.

  ``label_noise = p > 0``: labels are corrupted once with uniform noise (eq. 6, seed
  ``seed``); the clean labels stay available as ``label_sets['clean']``.
  ``clean_fraction < 1``: the clean "topline", a random subset of that fraction of the
  training examples with their true labels (the paper's topline: as many clean examples as
  noise rate ``p = 1 - clean_fraction`` leaves). Either way, classes left with no example
  (SOP has many 2-image classes: noise can move both away, the subset can miss both) are left
  out and the others renumbered ``0..C'-1``, with a warning giving their number.
  """
  if label_noise:
    noisy = uniform_label_noise(train.labels, rate=label_noise,
                                          num_classes=train.num_classes, seed=seed)
    labels = _without_empty_classes(noisy, train.num_classes, f"data.label_noise={label_noise}",
                                    "after the noise")
    return Split(images=train.images, labels=labels,
                          label_sets={**train.label_sets, "clean": train.labels},
                          name=f"{train.name} (label noise p={label_noise})")
  if clean_fraction != 1.0:
    idx = clean_subsample(len(train.labels), fraction=clean_fraction, seed=seed)
    labels = _without_empty_classes(train.labels[idx], train.num_classes,
                                    f"data.clean_fraction={clean_fraction}",
                                    "in the clean subset")
    return Split(images=take(train.images, idx), labels=labels,
                          label_sets={k: v[idx] for k, v in train.label_sets.items()},
                          name=f"{train.name} (clean {clean_fraction:.2f})")
  return train
