r"""Triplet scatter diagram (2nd-order paper §3, Fig. 1 and 6).

The diagram is defined (and computed) in ``dml_jax.evaluation.triplet_scatter``; this tool
draws it for a checkpoint of a workdir:

  python -m dml_jax.analysis.scatter --workdir=W [--step=N] [--split=test] [--label_set=digit]

writes ``<out or W>/triplet_scatter_<split>[_<label_set>]_step_<N>.png``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dml_jax.analysis import common
from dml_jax.evaluation.triplet_scatter import plot_scatter  # pylint: disable=unused-import
from dml_jax.evaluation.triplet_scatter import scatter_points  # pylint: disable=unused-import


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dml_jax.analysis.scatter",
                                   description="Triplet scatter diagram of a checkpoint.")
  common.add_workdir_args(parser)
  parser.add_argument("--split", default="test")
  parser.add_argument("--label_set", default="", help="label set of the split (default labels)")
  parser.add_argument("--similarity", default="", help="default: config.eval.similarity")
  args = common.parse_args(parser, argv)
  step, data, config = common.load_embeddings(args.workdir, step=args.step,
                                              data=common.data_paths(args), at_init=args.at_init,
                                              splits=(args.split,))
  emb, split = data[args.split]
  labels = common.labels_of(split, args.label_set)
  similarity = args.similarity or config.eval.similarity
  s_ap, s_an, correct = scatter_points(emb, labels, similarity=similarity)
  suffix = f"_{args.label_set}" if args.label_set else ""
  path = os.path.join(args.out or args.workdir,
                      f"triplet_scatter_{args.split}{suffix}_step_{step}.png")
  plot_scatter(s_ap, s_an, correct, path=path, similarity=similarity,
               title=f"{args.split}{suffix} step {step}: R@1 {100 * correct.mean():.1f}%")
  print(f"Written: {path}")
  return 0


if __name__ == "__main__":
  sys.exit(common.run(main, "python -m dml_jax.analysis.scatter"))
