r"""EPS paper §5.1 (MNIST even/odd) on scikit-learn's handwritten digits: the main job.

Trains a small CNN with a 2-D embedding on digits 0-5 labelled only even/odd, with the
triplet loss and easy-positive sampling (EPS); evaluates on the unseen digits 6-9 labelled by
digit, and on the training digits by their digit label (class collapse shows there).

  python train.py --config=configs/digits_evenodd_eps.py --workdir=runs/digits
  python train.py --config=configs/digits_evenodd_eps.py:smoke --workdir=/tmp/smoke
"""

from configs import default


def get_config(arg: str = ""):
  c = default.get_config()
  c.num_train_steps = 1500
  c.batch_size = 128
  c.log_every_steps = 50
  c.checkpoint_every_steps = 500
  c.data.name = "digits_evenodd"
  c.data.group_size = 64          # two classes (even, odd) of 64 each
  c.model.name = "small_cnn"
  c.model.embedding_dim = 2
  c.model.normalize = False       # a free 2-D plane, as the paper's figure 2
  c.loss.name = "triplet"
  c.loss.positive = "easy"        # EPS
  c.loss.negative = "semihard"
  c.loss.margin = 0.2
  c.loss.similarity = "neg_sq_euclidean"
  c.optimizer.learning_rate = 1e-3
  c.eval.ks = (1, 5, 10)
  c.eval.splits = ("test", "train:digit")
  c.eval.similarity = "neg_sq_euclidean"
  c.eval.overcluster = 0
  if arg == "smoke":
    c.num_train_steps = 20
    c.log_every_steps = 5
    c.checkpoint_every_steps = 10
    c.eval.plot = False
  elif arg:
    raise ValueError(f"Unknown config argument {arg!r}; allowed: '' or 'smoke'.")
  return c
