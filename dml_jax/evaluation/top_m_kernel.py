"""The C++ kernels of the tiled top-m search (``dml_jax/kernels/top_m.cc``), as calls from
jitted code: the merge of a tile into the queries' running best (:func:`merge_tile_kernel`) and
the rank counts of ``top_m.top_m_and_ranks`` (:func:`count_tile_kernel`), each one pass over
the tile comparing 8 similarities at a time (AVX2, with a scalar form for other CPUs); the
``m`` best of whole rows for large ``m`` (:func:`select_rows_kernel`), by a linear-time
selection per row; and the best of each row (:func:`argmax_rows_kernel`), k-means' assignment.
Under ``jax.vmap`` each runs once per batch element (``vmap_method='sequential'``).
"""

from __future__ import annotations

import jax
import numpy as np

from dml_jax import kernels


def count_tile_kernel(s, starts, ranks, *, exclude_self: bool = False,
                      vectorized: bool = True):
  """The rank counts of one tile (``top_m._tile_ranks``) by the C++ kernel: one pass over the
  tile that compares 8 similarities at a time with the rows' and the columns' target values
  and counts the few that reach them.

  Args:
    s: float32 ``[R, G]``, raw similarities (sanitised by the kernel).
    starts: int32 ``[3]``: the index of row 0, of column 0, and the number of items.
    ranks: ``{'a': ((value [R], target [R], code [R]), (counts int32 [R, 3], read [R])),
      'codes_b': [G]}`` for the rows, plus ``'b'`` (the same ``[G]``) and ``'codes_a'`` for
      the columns of an off-diagonal tile of the symmetric search; ``None``: nothing.
    exclude_self: rows only: a row and a column of equal index never pair.
    vectorized: ``False`` runs the kernel's scalar form.

  Returns:
    ``{'a': (counts, read)}`` (and ``'b'``), updated; ``None`` for ``ranks=None``.
  """
  if ranks is None:
    return None
  targets = kernels.require("top_m.cc")
  flags = dict(vectorized=np.int32(vectorized))
  (value, target, code), (counts, read) = ranks["a"]
  if "b" not in ranks:
    out = jax.ffi.ffi_call(targets["count_rows"], (_like(counts), _like(read)),
                           input_output_aliases={6: 0, 7: 1}, vmap_method="sequential")(
        s, starts, value, target, code, ranks["codes_b"], counts, read,
        exclude_self=np.int32(exclude_self), **flags)
    return {"a": (out[0], out[1])}
  (b_value, b_target, b_code), (b_counts, b_read) = ranks["b"]
  out = jax.ffi.ffi_call(targets["count_both"], tuple(map(_like, (counts, read, b_counts,
                                                                  b_read))),
                         input_output_aliases={5: 0, 6: 1, 10: 2, 11: 3},
                         vmap_method="sequential")(
      s, starts, value, target, code, counts, read, b_value, b_target, b_code, b_counts,
      b_read, **flags)
  return {"a": (out[0], out[1]), "b": (out[2], out[3])}


def merge_tile_kernel(s, starts, best_a, best_b=None, *, exclude_self: bool = False,
                      vectorized: bool = True):
  """The C++ tile merge (``dml_jax/kernels/top_m.cc``): :func:`_merge_tile` of the rows of
  ``s [R, G]`` into ``best_a`` and, given ``best_b``, of its columns into ``best_b``.

  Args:
    s: float32 ``[R, G]``, raw similarities (sanitised by the kernel as :func:`sanitize`).
    starts: int32 ``[3]``: the index of row 0, of column 0, and the number of items (an index
      at or above it is padding and never enters).
    best_a: ``(values float32 [R, m], indices int32 [R, m])`` of the rows.
    best_b: the same ``[G, m]`` of the columns, or ``None`` (rows only).
    exclude_self: rows only: a row and a column of equal index never pair.
    vectorized: ``False`` runs the kernel's scalar form (what CPUs without AVX2 get).

  Returns:
    ``(best_a, best_b)`` merged (``best_b`` ``None`` when not given).
  """
  targets = kernels.require("top_m.cc")
  flags = dict(vectorized=np.int32(vectorized))
  if best_b is None:
    out = jax.ffi.ffi_call(targets["merge_rows"], (_like(best_a[0]), _like(best_a[1])),
                           input_output_aliases={1: 0, 2: 1}, vmap_method="sequential")(
        s, *best_a, starts, exclude_self=np.int32(exclude_self), **flags)
    return (out[0], out[1]), None
  out = jax.ffi.ffi_call(targets["merge_both"], tuple(map(_like, (*best_a, *best_b))),
                         input_output_aliases={1: 0, 2: 1, 3: 2, 4: 3},
                         vmap_method="sequential")(
      s, *best_a, *best_b, starts, **flags)
  return (out[0], out[1]), (out[2], out[3])


def _like(x) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def select_rows_kernel(s, starts, *, m: int, exclude_self: bool = False):
  """The ``m`` best items of every row of ``s [R, G]`` (whole rows), exactly as
  ``lax.top_k`` of the sanitised rows ranks them (value descending, lower index first on
  ties), with padding (an index at or above ``starts[2]``) and, when ``exclude_self``, a
  row's own index never returned: the ``m``-th best value by ``nth_element`` (linear time),
  then the items above it and as many equal to it as fit, in index order, sorted.

  Args:
    s: float32 ``[R, G]``, raw similarities.
    starts: int32 ``[3]``: the index of row 0, of column 0, and the number of items.
    m: items kept per row (at most the unmasked items of a row).
    exclude_self: a row and a column of equal index never pair.

  Returns:
    int32 ``[R, m]`` column indices (offset by ``starts[1]``).
  """
  targets = kernels.require("top_m.cc")
  out = jax.ShapeDtypeStruct((s.shape[0], m), np.int32)
  return jax.ffi.ffi_call(targets["select_rows"], out, vmap_method="sequential")(
      s, starts, exclude_self=np.int32(exclude_self))


def argmax_rows_kernel(s, *, vectorized: bool = True):
  """The largest value of each row of ``s [R, K]`` and its index, exactly as ``jnp.argmax``
  and ``take_along_axis`` give them (the first index of the maximum; the first NaN of a row
  that has one), by the C++ kernel: one pass for the maximum, 8 values at a time, one for its
  first index.

  Args:
    s: float32 ``[R, K]``, ``K >= 1``.
    vectorized: ``False`` runs the kernel's scalar form.

  Returns:
    ``(index int32 [R], value float32 [R])``.
  """
  targets = kernels.require("top_m.cc")
  out = (jax.ShapeDtypeStruct(s.shape[:1], np.int32), jax.ShapeDtypeStruct(s.shape[:1],
                                                                           np.float32))
  return jax.ffi.ffi_call(targets["argmax_rows"], out, vmap_method="sequential")(
      s, vectorized=np.int32(vectorized))
