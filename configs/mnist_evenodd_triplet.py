r"""EPS paper Table 1 / Fig. 2 baseline on the real MNIST: triplet loss with a random positive.

Identical to configs/mnist_evenodd_eps.py except ``loss.positive = 'random'`` (paper: train
digits R@1 42.01, test digits 35.16).

  python train.py --config=configs/mnist_evenodd_triplet.py --workdir=runs/mnist_evenodd_triplet \
      --config.data.options.root=/data/mnist
"""

from configs import mnist_evenodd_eps
from dml_jax.run import config

ROW = {**mnist_evenodd_eps.ROW, "loss.positive": "random"}
VARIANTS = mnist_evenodd_eps.VARIANTS


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
