r"""2nd-order triplet paper, Table 1 row "EPHN-1st (512)", CUB-200-2011: R@1 64.9, R@2 75.3,
R@4 83.5 (reported; the same numbers as the EPHN paper's EPSHN (512) row).

As cub_ephn_2nd.py with the 1st-order NCA loss softplus((S_an - S_ap) / 0.1) (EPHN paper
eq. for L_EPHN): easy positive, hard negative, n = 8, SGD 0.0025, 40 epochs.

  python train.py --config=configs/cub_ephn.py --workdir=runs/cub_ephn
  python train.py --config=configs/cub_ephn.py:smoke --workdir=/tmp/smoke
"""

from configs import default
from configs import recipes


def get_config(arg: str = ""):
  c = default.get_config()
  recipes.dataset(c, "cub")
  recipes.ephn(c, learning_rate=0.0025, group_size=8)
  c.loss.name = "nca"
  return recipes.finish(c, arg)
