r"""2nd-order triplet paper, Table 1 row "EPHN-2nd (512)", In-Shop: R@1 89.0, R@10 96.9,
R@20 97.8 (reported).

In-Shop official partition (3,997 train items; 14,218 query / 12,612 gallery images of
3,985 items), evaluated as query@gallery; ResNet-50 (ImageNet), 512-D, batch 128 with
n = 2, 2nd-order loss, SGD 0.005 divided by 10 after epochs 20 and 30, 40 epochs.
data.options.root must hold img/ and list_eval_partition.txt (docs/datasets.md).

Needs weights/resnet50.npz (docs/models.md).

  python train.py --config=configs/inshop_ephn_2nd.py --workdir=runs/inshop_ephn_2nd
  python train.py --config=configs/inshop_ephn_2nd.py:smoke --workdir=/tmp/smoke
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.DATASETS["inshop"], **recipes.EPHN,
       "data.group_size": 2, "optimizer.learning_rate": 0.005}
VARIANTS = {"smoke": recipes.smoke}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
