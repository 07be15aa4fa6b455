r"""EPS paper Figure 2 on the real MNIST: the 2-D embeddings of the triplet baseline and of EPS.

  python experiments/mnist_evenodd_figure.py \
      --triplet=runs/mnist_table1/loss.positive=random/seed_0 \
      --eps=runs/mnist_table1/loss.positive=easy/seed_0 --out=docs/figures/eps_fig2_mnist.png

Embeds, with each workdir's final checkpoint, the test images of the training digits 0-5
(split ``val``: the paper's "MNIST validation set") and of the unseen digits 6-9 (``test``),
and draws them as points of the 2-D embedding coloured by digit: one column per model
(triplet left, EPS right, as the paper's figure), one row per split.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dml_jax.analysis import common  # pylint: disable=g-import-not-at-top

SPLITS = (("val", "training digits 0-5 (test images)"), ("test", "unseen digits 6-9"))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--triplet", required=True, help="workdir of the triplet baseline")
  parser.add_argument("--eps", required=True, help="workdir of EPS + triplet")
  parser.add_argument("--out", default="docs/figures/eps_fig2_mnist.png")
  parser.add_argument("--max_points", type=int, default=3000,
                      help="points drawn per panel (a fixed random subset)")
  args = parser.parse_args(argv)

  plt = common.pyplot()
  fig, axes = plt.subplots(len(SPLITS), 2, figsize=(10, 9.5), dpi=90)
  for col, (title, workdir) in enumerate((("Triplet", args.triplet),
                                          ("EPS + Triplet", args.eps))):
    step, embedded, _ = common.load_embeddings(workdir, splits=[s for s, _ in SPLITS])
    for row, (split, what) in enumerate(SPLITS):
      emb, data = embedded[split]
      digits = np.asarray(data.label_sets["digit"])
      keep = np.random.default_rng(0).permutation(len(emb))[:args.max_points]
      ax = axes[row, col]
      for d in np.unique(digits):
        sel = keep[digits[keep] == d]
        ax.scatter(emb[sel, 0], emb[sel, 1], s=3, alpha=0.6, label=str(d),
                   color=plt.cm.tab10(d))
      ax.set_title(f"{title}: {what} (step {step})", fontsize=9)
      ax.legend(markerscale=4, fontsize=7, loc="best")
      ax.set_xticks([])
      ax.set_yticks([])
  fig.suptitle("MNIST even/odd, 2-D embeddings coloured by digit (EPS paper Fig. 2)",
               fontsize=10)
  fig.tight_layout()
  print(common.save(fig, args.out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
