r"""EPS paper, Table 2 row "EPS + Dist-Margin", Cars196: R@1 83.6, R@2 89.5, R@4 93.6,
NMI 67.3, NMI+ 72.4 (reported; baseline Dist-Margin 79.6 / 86.5 / 91.9; mean of 8 seeds).

Wu et al.'s margin loss (alpha 0.2, learnable per-class beta from 1.2) with distance-weighted
negatives and the easiest positive (EPS) instead of a random one; the EPS recipe (ResNet-50,
128-D, Adam 1e-5, batch 160; see configs/recipes.py for the settings the paper leaves to
Roth et al.'s framework).

Needs Cars196 prepared (docs/datasets.md) and weights/resnet50.npz (docs/models.md);
``smoke`` needs only the dataset.

  python train.py --config=configs/cars_eps_margin.py --workdir=runs/cars_eps_margin
  python train.py --config=configs/cars_eps_margin.py:smoke --workdir=/tmp/smoke
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.DATASETS["cars196"], **recipes.EPS, **recipes.EPS_LOSSES["eps_margin"]}
VARIANTS = {"smoke": recipes.smoke}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
