r"""The baseline of the EPS paper's even/odd experiment: triplet loss with a random positive.

Identical to configs/digits_evenodd_eps.py except ``loss.positive = 'random'``.

  python train.py --config=configs/digits_evenodd_triplet.py --workdir=runs/digits_triplet
"""

from configs import digits_evenodd_eps
from dml_jax.run import config

ROW = {**digits_evenodd_eps.ROW, "loss.positive": "random"}
VARIANTS = digits_evenodd_eps.VARIANTS


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
