r"""EPS paper, Table 2 row "EPS + MS", CUB-200-2011: R@1 63.3, R@2 74.2, R@4 82.5, NMI 61.2,
NMI+ 68.2 (reported; baseline MS 62.3 / 73.3 / 82.1; mean of 8 seeds).

Multi-similarity loss with alpha 2, beta 50, lambda (base) 1 as the paper states, its
negative mining kept and its positive mining replaced by the easiest positive (EPS); the
EPS recipe (ResNet-50, 128-D, Adam 1e-5, batch 160).

Needs CUB prepared (docs/datasets.md) and weights/resnet50.npz (docs/models.md);
``smoke`` needs only the dataset.

  python train.py --config=configs/cub_eps_ms.py --workdir=runs/cub_eps_ms
  python train.py --config=configs/cub_eps_ms.py:smoke --workdir=/tmp/smoke
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.DATASETS["cub"], **recipes.EPS, **recipes.EPS_LOSSES["eps_ms"]}
VARIANTS = {"smoke": recipes.smoke}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
