r"""EPHN (easy positive, hard negative) with the 1st-order NCA loss in the 2nd-order paper's CUB
setting: the 1st-order control of cub_ephn_2nd.py, for a like-for-like 1st vs 2nd comparison.

As cub_ephn_2nd.py with the 1st-order NCA loss softplus((S_an - S_ap) / 0.1) (EPHN paper's
L_EPHN): easy positive, hard negative, n = 8, SGD 0.0025 (the 2nd-order paper's CUB rate),
40 epochs, divided by 10 after epochs 20 and 30.

No table reports this setting (the 2nd-order paper's Fig. 4 plots its R@1 against n, with no
values printed). The 2nd-order paper's Table 1 row "EPHN-1st (512)" (R@1 64.9, R@2 75.3, R@4
83.5) repeats the EPHN paper's "EPSHN (512)" row, which was trained with semi-hard negatives,
n = 16 and SGD 0.0001: that row is configs/cub_epshn.py (docs/papers.md "Departures from the
papers").

Needs CUB prepared (docs/datasets.md) and weights/resnet50.npz (docs/models.md);
``smoke`` needs only the dataset.

  python train.py --config=configs/cub_ephn.py --workdir=runs/cub_ephn
  python train.py --config=configs/cub_ephn.py:smoke --workdir=/tmp/smoke
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.DATASETS["cub"], **recipes.EPHN,
       "data.group_size": 8, "optimizer.learning_rate": 0.0025,
       "loss.name": "nca"}
VARIANTS = {"smoke": recipes.smoke}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
