r"""EPS paper Table 1 / Fig. 2 baseline on the real MNIST: triplet loss with a random positive.

Identical to configs/mnist_evenodd_eps.py except ``loss.positive = 'random'`` (paper: train
digits R@1 42.01, test digits 35.16).

  python train.py --config=configs/mnist_evenodd_triplet.py --workdir=runs/mnist_evenodd_triplet \
      --config.data.options.root=/data/mnist
"""

from configs import mnist_evenodd_eps


def get_config(arg: str = ""):
  c = mnist_evenodd_eps.get_config(arg)
  c.loss.positive = "random"
  return c
