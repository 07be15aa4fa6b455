r"""2nd-order triplet paper, Table 1 row "EPHN-2nd (512)", Cars196: R@1 83.2, R@2 89.2,
R@4 93.2 (reported).

Cars196 classes 0-97 train / 98-195 test; ResNet-50 (ImageNet), 512-D, batch 128 with
n = 16, 2nd-order loss (temperature 0.1), SGD 0.005 divided by 10 after epochs 20 and 30,
40 epochs.

Needs Cars196 prepared (docs/datasets.md) and weights/resnet50.npz (docs/models.md);
``smoke`` needs only the dataset.

  python train.py --config=configs/cars_ephn_2nd.py --workdir=runs/cars_ephn_2nd
  python train.py --config=configs/cars_ephn_2nd.py:smoke --workdir=/tmp/smoke
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.DATASETS["cars196"], **recipes.EPHN,
       "data.group_size": 16, "optimizer.learning_rate": 0.005}
VARIANTS = {"smoke": recipes.smoke}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
