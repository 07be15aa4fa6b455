"""Synthetic inputs more than one benchmark uses: random unit embeddings with balanced labels
(the objectives' batch) and embeddings clustered like Omniglot's letters and alphabets."""

from __future__ import annotations

import numpy as np


def make_batch(batch_size: int, dim: int, *, per_class: int = 8, seed: int = 0):
  """Random unit embeddings and balanced labels.

  Args:
    batch_size: ``B``, a multiple of ``per_class``.
    dim: ``D``.
    per_class: examples per class; ``B / per_class`` classes, labels ``[0 0 .. 1 1 ..]``.
    seed: numpy seed.

  Returns:
    ``(x, y)``: float32 ``[B, D]`` with unit rows, int32 ``[B]``.
  """
  if per_class < 2 or batch_size % per_class or batch_size < 2 * per_class:
    raise ValueError(f"batch_size={batch_size} must be a multiple of per_class={per_class} "
                     "(>= 2) with at least 2 classes.")
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((batch_size, dim)).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  y = np.repeat(np.arange(batch_size // per_class, dtype=np.int32), per_class)
  return x, y


def omniglot_like(seed: int, alphabets: int, letters: int, per_letter: int = 20,
                  dim: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(x [N, dim], letter [N], alphabet [N])``: unit vectors around letter centres, which lie
  around their alphabet's centre; ``letters`` split evenly over ``alphabets``."""
  rng = np.random.default_rng(seed)
  alphabet_of_letter = np.arange(letters) % alphabets
  centres = rng.normal(size=(alphabets, dim))[alphabet_of_letter] + 0.8 * rng.normal(
      size=(letters, dim))
  letter = np.repeat(np.arange(letters), per_letter)
  x = centres[letter] + 0.9 * rng.normal(size=(letters * per_letter, dim))
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  return x.astype(np.float32), letter, alphabet_of_letter[letter]
