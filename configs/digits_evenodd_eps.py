r"""EPS paper §5.1 (MNIST even/odd) on scikit-learn's handwritten digits: the main job.

Trains a small CNN with a 2-D embedding on digits 0-5 labelled only even/odd, with the
triplet loss and easy-positive sampling (EPS); evaluates on the unseen digits 6-9 labelled by
digit, and on the training digits by their digit label (class collapse shows there).

  python train.py --config=configs/digits_evenodd_eps.py --workdir=runs/digits
  python train.py --config=configs/digits_evenodd_eps.py:smoke --workdir=/tmp/smoke
"""

from dml_jax.run import config

ROW = {
    "num_train_steps": 1500,
    "data.name": "digits_evenodd",
    "data.group_size": 64,          # two classes (even, odd) of 64 each
    "model.name": "small_cnn", "model.embedding_dim": 2,
    "model.normalize": False,       # a free 2-D plane, as the paper's figure 2
    "loss": {"name": "triplet",
             "positive": "easy",    # EPS
             "negative": "semihard", "margin": 0.2, "similarity": "neg_sq_euclidean"},
    "eval.ks": (1, 5, 10), "eval.splits": ("test", "train:digit"),
    "eval.similarity": "neg_sq_euclidean",
}
VARIANTS = {"smoke": {"num_train_steps": 20, "log_every_steps": 5,
                      "checkpoint_every_steps": 10, "eval.plot": False}}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
