"""Cross-batch memory (XBM, Wang et al. CVPR 2020): earlier steps' embeddings as references.

A FIFO queue of the last ``M`` embeddings and labels of earlier train steps, stored without
gradient in the train state (so it is checkpointed and resumed exactly, and replicated: the same
on 1 and 8 devices, since the step sees the global batch). At each step, from
``start_step`` on, the anchors of the batch are compared with the references

  ``[the batch (B rows); the memory (M rows)]``, so ``S`` is ``[B, B + M]``,

self pairs and empty slots masked out (``objectives.References``); then the batch is written
into the memory, overwriting the oldest entries. With an empty memory the loss and gradient
equal the objective's without memory.

``reference_gradient`` says whether the batch's own rows, as references, carry gradient:
True (default) keeps the gradient the objective has without memory (a pair ``(i, j)`` of the
batch moves both ``i`` and ``j``); False detaches them, as pytorch-metric-learning's
``CrossBatchMemory`` (whose memory of ``M + B`` rows holds the current batch too): then our
loss and gradient equal PML's with ``memory_size = M + B`` (tested). The XBM paper's code adds
the plain batch loss to the memory loss instead; that is ``reference_gradient=True`` up to the
weighting.

State: ``{'embeddings': float32 [M, D], 'labels': int32 [M], 'valid': bool [M],
'next': int32 []}`` (``next``: the slot the next batch starts at).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dml_jax import hparams
from dml_jax.objectives import References


def check(size: int, start_step: int, *, batch_size: int, num_examples: int | None = None,
          ) -> None:
  """Validates ``config.memory`` against the global batch size and, given ``num_examples``,
  the training split's size (a larger memory holds stale copies of the same images, and a
  mistyped size fills the machine's memory with ``[B, B + M]`` similarities); raises
  ``ValueError``."""
  size = hparams.integer("memory.size", size, minimum=0)
  hparams.integer("memory.start_step", start_step, minimum=0)
  if 0 < size < batch_size:
    raise ValueError(f"memory.size={size} is smaller than batch_size={batch_size}: the memory "
                     "must hold at least one batch (or set memory.size=0 to turn it off).")
  if num_examples is not None and size > num_examples:
    raise ValueError(f"memory.size={size:,} exceeds the {num_examples:,} examples of the train "
                     "split: the memory would hold several stale embeddings of each image; use "
                     f"at most {num_examples:,}.")


def init(size: int, dim: int) -> dict:
  """An empty memory of ``size`` rows of ``dim`` floats (see the module docstring)."""
  size = hparams.integer("size", size, minimum=0)
  dim = hparams.integer("dim", dim, minimum=1)
  return {"embeddings": jnp.zeros((size, dim), jnp.float32),
          "labels": jnp.zeros((size,), jnp.int32),
          "valid": jnp.zeros((size,), bool),
          "next": jnp.zeros((), jnp.int32)}


def _check_batch(memory: dict, embeddings: jax.Array, labels: jax.Array) -> int:
  """``B``, after checking float ``embeddings [B, D]`` (the memory's ``D``) and int
  ``labels [B]``."""
  m, d = memory["embeddings"].shape
  if embeddings.ndim != 2 or embeddings.shape[1] != d:
    raise ValueError(f"embeddings must have shape [B, {d}] (the memory's dimension), got "
                     f"{tuple(embeddings.shape)}.")
  b = embeddings.shape[0]
  if tuple(labels.shape) != (b,):
    raise ValueError(f"labels must have shape [{b}] (one per embedding), got "
                     f"{tuple(labels.shape)}.")
  if not jnp.issubdtype(embeddings.dtype, jnp.floating):
    raise ValueError(f"embeddings must be floating point, got dtype {embeddings.dtype}.")
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
  return b


def references(memory: dict, embeddings: jax.Array, labels: jax.Array, *,
               active: jax.Array | bool = True, reference_gradient: bool = True) -> References:
  """The batch followed by the memory, as ``objectives.References`` (``N = B + M``).

  Args:
    memory: the memory state.
    embeddings: float ``[B, D]`` the batch's embeddings (the anchors).
    labels: int ``[B]``.
    active: bool scalar: False masks the whole memory out (before ``start_step``).
    reference_gradient: False detaches the batch's rows used as references.

  Returns:
    ``References`` with ``embeddings [B + M, D]``, ``labels [B + M]``, ``mask [B, B + M]``.
  """
  b = _check_batch(memory, embeddings, labels)
  batch_refs = embeddings if reference_gradient else jax.lax.stop_gradient(embeddings)
  ref = jnp.concatenate([batch_refs.astype(jnp.float32),
                         jax.lax.stop_gradient(memory["embeddings"])], axis=0)
  ref_labels = jnp.concatenate([labels.astype(jnp.int32), memory["labels"]], axis=0)
  mem_mask = jnp.broadcast_to((memory["valid"] & active)[None, :], (b, memory["valid"].shape[0]))
  mask = jnp.concatenate([~jnp.eye(b, dtype=bool), mem_mask], axis=1)
  return References(embeddings=ref, labels=ref_labels, mask=mask)


def enqueue(memory: dict, embeddings: jax.Array, labels: jax.Array, *,
            active: jax.Array | bool = True) -> dict:
  """Writes the batch (without gradient) over the oldest ``B`` rows; unchanged when not
  ``active``. ``B <= M`` (see :func:`check`)."""
  b, m = _check_batch(memory, embeddings, labels), memory["labels"].shape[0]
  if b > m:
    raise ValueError(f"a batch of {b} does not fit a memory of {m} rows (B <= M; see check).")
  rows = (memory["next"] + jnp.arange(b)) % m
  new = {"embeddings": memory["embeddings"].at[rows].set(
             jax.lax.stop_gradient(embeddings).astype(jnp.float32)),
         "labels": memory["labels"].at[rows].set(labels.astype(jnp.int32)),
         "valid": memory["valid"].at[rows].set(True),
         "next": (memory["next"] + b) % m}
  return jax.tree.map(lambda n, o: jnp.where(active, n, o), new, memory)
