r"""2nd-order triplet paper, Table 1 row "EPHN-2nd (512)", Stanford Online Products: R@1 78.8,
R@10 90.8, R@100 96.3 (reported).

SOP official train (11,318 classes) / test (11,316 classes); ResNet-50 (ImageNet), 512-D,
batch 128 with n = 2 (so the easy positive is the only positive), 2nd-order loss, SGD 0.005
divided by 10 after epochs 20 and 30, 40 epochs.

Needs SOP prepared (docs/datasets.md) and weights/resnet50.npz (docs/models.md);
``smoke`` needs only the dataset.

  python train.py --config=configs/sop_ephn_2nd.py --workdir=runs/sop_ephn_2nd
  python train.py --config=configs/sop_ephn_2nd.py:smoke --workdir=/tmp/smoke
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.DATASETS["sop"], **recipes.EPHN,
       "data.group_size": 2, "optimizer.learning_rate": 0.005}
VARIANTS = {"smoke": recipes.smoke}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
