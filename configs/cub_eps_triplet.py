r"""EPS paper, Table 2 row "EPS + Trip. + SH", CUB-200-2011: R@1 61.8, R@2 73.6, R@4 82.4,
NMI 62.4, NMI+ 68.0 (reported; baseline Trip. + SH 61.5 / 73.4 / 82.5; mean of 8 seeds).

Triplet loss on squared distances with margin 0.2 (not stated in the paper: Roth et al.'s
default), the easiest positive (EPS) and a semi-hard negative chosen for it; the EPS recipe
(ResNet-50, 128-D, Adam 1e-5, batch 160).

Needs CUB prepared (docs/datasets.md) and weights/resnet50.npz (docs/models.md);
``smoke`` needs only the dataset.

  python train.py --config=configs/cub_eps_triplet.py --workdir=runs/cub_eps_triplet
  python train.py --config=configs/cub_eps_triplet.py:smoke --workdir=/tmp/smoke
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.DATASETS["cub"], **recipes.EPS, **recipes.EPS_LOSSES["eps_triplet"]}
VARIANTS = {"smoke": recipes.smoke}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
