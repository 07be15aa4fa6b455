"""The top-m search's two ways for large m, back to back on the same embeddings: merging tiles
into lists of m (``selection='kernel'``, the C++ merge; ``'xla'`` without it) against whole rows
(``selection='rows'``, what ``'auto'`` takes from ``top_m.ROWS_MIN_M`` on).

  python benchmarks/speed/top_m_selection.py --ms=64,256,659

Embeddings shaped like Omniglot's test set (13,180 x 128, ``benchmarks/inputs.py``), the
query set its own gallery. Each (m, selection) is timed once after an untimed call (compilation);
the neighbours of every selection must equal the first's up to near-ties (``check_same``).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks.inputs import omniglot_like  # noqa: E402
from dml_jax import kernels  # noqa: E402
from dml_jax.evaluation import top_m  # noqa: E402


def check_same(x: np.ndarray, a: np.ndarray, b: np.ndarray, *, m: int, selection: str) -> None:
  """The two lists hold the same neighbours up to near-ties: products of other shapes round
  differently in float32, so two items within that rounding (~1e-7) may swap; their float64
  similarities must agree to 1e-6 in every position."""
  x64 = x.astype(np.float64)
  sa = np.einsum("nd,nmd->nm", x64, x64[a])
  sb = np.einsum("nd,nmd->nm", x64, x64[b])
  if not np.allclose(sa, sb, rtol=0, atol=1e-6):
    raise SystemExit(f"m={m}: selection {selection!r} found other neighbours")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--ms", default="64,256,659")
  p.add_argument("--smoke", action="store_true", help="1,300 embeddings, m = 8, 64")
  args = p.parse_args(argv)
  x, _, _ = omniglot_like(0, 20, 65 if args.smoke else 659)
  ms = [8, 64] if args.smoke else [int(m) for m in args.ms.split(",") if m]
  tiles = "kernel" if kernels.load("top_m.cc") is not None else "xla"
  print(harness.markdown_table(["m", f"tiles ({tiles}) s", "rows s", "tiles / rows"], []))
  for m in ms:
    seconds, first = {}, None
    for selection in (tiles, "rows"):
      top_m.top_m_neighbors(x, m=m, selection=selection)
      t0 = time.perf_counter()
      idx = top_m.top_m_neighbors(x, m=m, selection=selection)
      seconds[selection] = time.perf_counter() - t0
      if first is None:
        first = idx
      else:
        check_same(x, first, idx, m=m, selection=selection)
    print(f"| {m} | {seconds[tiles]:.2f} | {seconds['rows']:.2f} | "
          f"{seconds[tiles] / seconds['rows']:.2f}x |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
