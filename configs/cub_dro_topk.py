r"""DRO paper, Table 1 row "DRO-TopK_M", CUB-200-2011: R@1 67.4, R@2 77.7, R@4 85.9, R@8 91.6
(reported; DRO-TopK_B 68.1).

The K largest pair losses of the batch (K = 160 distinct pairs, as the paper counts them, the
lower end of its grid {160, 200, 240, 280}; the chosen K is not stated) with the margin pair
loss m = 0.2, lambda = 0.5; the DRO recipe (BN-Inception, 1024-D, Adam 1e-5, batch 80 = 16 x 5).
For the binomial variant: --config.loss.pair_loss=binomial.

Needs CUB prepared (docs/datasets.md) and weights/bn_inception.npz (docs/models.md);
``smoke`` needs only the dataset.

  python train.py --config=configs/cub_dro_topk.py --workdir=runs/cub_dro_topk
  python train.py --config=configs/cub_dro_topk.py:smoke --workdir=/tmp/smoke
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.DATASETS["cub"], **recipes.DRO,
       "loss": {"name": "dro_topk", "k": 160, "pair_loss": "margin", "margin": 0.2,
                "base": 0.5}}
VARIANTS = {"smoke": recipes.smoke}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
