r"""The baseline of the EPS paper's even/odd experiment: triplet loss with a random positive.

Identical to configs/digits_evenodd_eps.py except ``loss.positive = 'random'``.

  python train.py --config=configs/digits_evenodd_triplet.py --workdir=runs/digits_triplet
"""

from configs import digits_evenodd_eps


def get_config(arg: str = ""):
  c = digits_evenodd_eps.get_config(arg)
  c.loss.positive = "random"
  return c
