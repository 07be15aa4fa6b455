r"""EPS paper, section 5.1 / Table 1 / Fig. 2 (MNIST even/odd): EPS + triplet reported R@1 65.78
on the training digits and 42.31 on the test digits (triplet: 42.01 / 35.16).

TFDS MNIST: trained on digits 0-5 labelled even/odd; evaluated on test digits 6-9 by digit
('test') and on test images of digits 0-5 by digit ('val'). The appendix's small CNN with a
free 2-D embedding; triplet loss on squared Euclidean distance with the easiest positive and
a semi-hard negative, batches of 2 x 64 (our choice, as configs/digits_evenodd_eps.py; the
paper states neither optimizer nor batch).

  python train.py --config=configs/mnist_evenodd_eps.py --workdir=runs/mnist_evenodd_eps
  python train.py --config=configs/mnist_evenodd_eps.py:smoke --workdir=/tmp/smoke
"""

from ml_collections import config_dict

from configs import default
from configs import recipes


def get_config(arg: str = ""):
  c = default.get_config()
  recipes.dataset(c, "mnist_evenodd")
  c.num_train_steps = 3000
  c.batch_size = 128
  c.data.group_size = 64
  recipes.images(c, 28, resize_size=28, augmentation="none", grey=True)
  c.model.name = "small_cnn"
  c.model.embedding_dim = 2
  c.model.normalize = False
  c.loss = config_dict.ConfigDict({"name": "triplet", "positive": "easy",
                                   "negative": "semihard", "margin": 0.2,
                                   "similarity": "neg_sq_euclidean"})
  c.optimizer.learning_rate = 1e-3
  c.eval.ks = (1, 5, 10)
  c.eval.similarity = "neg_sq_euclidean"
  return recipes.finish(c, arg)
