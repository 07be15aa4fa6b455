r"""DRO paper, Table 1 row "DRO-KL_M", Cars196: R@1 86.4, R@2 91.9, R@4 95.4, R@8 97.5
(reported).

Pair weights p* proportional to exp(l / gamma) over the non-zero-loss pairs (gamma = 0.1; the
paper tunes it in {0.1, ..., 0.9} without stating the choice), pairs sampled from p*
(loss.mode='weight' weights all of them instead); margin pair loss m = 0.2, lambda = 0.5;
the DRO recipe (BN-Inception, 1024-D, Adam 1e-5, batch 80 = 16 x 5).

  python train.py --config=configs/cars_dro_kl.py --workdir=runs/cars_dro_kl
  python train.py --config=configs/cars_dro_kl.py:smoke --workdir=/tmp/smoke
"""

from ml_collections import config_dict

from configs import default
from configs import recipes


def get_config(arg: str = ""):
  c = default.get_config()
  recipes.dataset(c, "cars196")
  recipes.dro(c)
  c.loss = config_dict.ConfigDict({"name": "dro_kl", "gamma": 0.1, "mode": "sample",
                                   "k": 160, "pair_loss": "margin", "margin": 0.2,
                                   "base": 0.5})
  return recipes.finish(c, arg)
