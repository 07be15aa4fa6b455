r"""DRO paper, Table 1 row "DRO-KL_M", Cars196: R@1 86.4, R@2 91.9, R@4 95.4, R@8 97.5
(reported).

Pair weights p* proportional to exp(l / gamma) over the non-zero-loss pairs (gamma = 0.1; the
paper tunes it in {0.1, ..., 0.9} without stating the choice), 2K = 320 ordered pairs
sampled from p* at K = 160, as the released code (loss.mode='weight' weights all of them
instead); margin pair loss m = 0.2, lambda = 0.5;
the DRO recipe (BN-Inception, 1024-D, Adam 1e-5, batch 80 = 16 x 5).

Needs Cars196 prepared (docs/datasets.md) and weights/bn_inception.npz (docs/models.md);
``smoke`` needs only the dataset.

  python train.py --config=configs/cars_dro_kl.py --workdir=runs/cars_dro_kl
  python train.py --config=configs/cars_dro_kl.py:smoke --workdir=/tmp/smoke
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.DATASETS["cars196"], **recipes.DRO,
       "loss": {"name": "dro_kl", "gamma": 0.1, "mode": "sample", "k": 160,
                "pair_loss": "margin", "margin": 0.2, "base": 0.5}}
VARIANTS = {"smoke": recipes.smoke}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
