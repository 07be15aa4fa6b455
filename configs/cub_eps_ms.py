r"""EPS paper, Table 2 row "EPS + MS", CUB-200-2011: R@1 63.3, R@2 74.2, R@4 82.5, NMI 61.2,
NMI+ 68.2 (reported; baseline MS 62.3 / 73.3 / 82.1; mean of 8 seeds).

Multi-similarity loss with alpha 2, beta 50, lambda (base) 1 as the paper states, its
negative mining kept and its positive mining replaced by the easiest positive (EPS); the
EPS recipe (ResNet-50, 128-D, Adam 1e-5, batch 160).

  python train.py --config=configs/cub_eps_ms.py --workdir=runs/cub_eps_ms
  python train.py --config=configs/cub_eps_ms.py:smoke --workdir=/tmp/smoke
"""

from ml_collections import config_dict

from configs import default
from configs import recipes


def get_config(arg: str = ""):
  c = default.get_config()
  recipes.dataset(c, "cub")
  recipes.eps(c)
  c.loss = config_dict.ConfigDict({"name": "multi_similarity", "positive": "easy",
                                   "negative": "ms", "alpha": 2.0, "beta": 50.0, "base": 1.0,
                                   "epsilon": 0.1})
  return recipes.finish(c, arg)
