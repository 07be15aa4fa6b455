r"""2nd-order triplet paper, Table 1 row "EPHN-2nd (512)", CUB-200-2011: R@1 65.2, R@2 75.3,
R@4 82.9 (reported).

CUB classes 0-99 train / 100-199 test; ResNet-50 (ImageNet), 512-D; batches of 128 with
n = 8 per class (the paper's best group size for CUB); easy positive + hard negative with
the 2nd-order loss (eq. 16; temperature 0.1 as in the EPHN paper -- 1.0 is the formula
without one); SGD, learning rate 0.0025 divided by 10 after epochs 20 and 30, 40 epochs.
Needs CUB prepared (docs/datasets.md) and weights/resnet50.npz (docs/models.md).

  python train.py --config=configs/cub_ephn_2nd.py --workdir=runs/cub_ephn_2nd
  python train.py --config=configs/cub_ephn_2nd.py:smoke --workdir=/tmp/smoke
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.DATASETS["cub"], **recipes.EPHN,
       "data.group_size": 8, "optimizer.learning_rate": 0.0025}
VARIANTS = {"smoke": recipes.smoke}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
