r"""Label-noise paper Fig. 1-2 style experiment on the embedded digits (all-digit protocol).

A 16-D L2-normalised small-CNN embedding trained on digits 0-5 labelled by digit (K = 6
classes) with uniform label noise ``data.label_noise = p`` (eq. 6) on the training labels, or
on the clean ``1 - p`` subset (``data.clean_fraction``, the topline), and evaluated on the
unseen digits 6-9. Batches of 24 = 6 classes x 4.

The argument picks the loss: ``triplet`` (FaceNet triplet, all positives, margin 0.2 on squared
distance; ``loss.negative`` 'semihard_random' = random semi-hard, eq. 28, or 'semihard' =
fixed semi-hard, eq. 29) or ``margin`` (Wu et al.'s margin loss with distance-weighted
sampling, alpha 0.2, beta0 1.2) or ``margin_paper`` (the paper's marginal loss, as
``configs/label_noise.py``: beta = 1.4 fixed, alpha = 0.2, every positive pair with its own
random semi-hard negative); append ``,smoke`` (or pass ``smoke`` alone: triplet) for a
10-step run. ``triplet`` and ``margin`` depart from the paper's losses (its triplet loss is on
the Euclidean distance; its margin loss is ``margin_paper``); the recorded table has all three.

  python -m dml_jax.run.experiments sweep --config=configs/digits_label_noise.py:triplet \
      --grid='loss.negative=semihard_random,semihard' \
      --grid='data.label_noise+data.clean_fraction=0.0+1.0,0.2+1.0,0.4+1.0,0.6+1.0,0.0+0.8,0.0+0.6,0.0+0.4' \
      --seeds=8 --workdir=runs/label_noise_triplet  # ~30 min on 2 CPU cores
  python -m dml_jax.run.experiments sweep --config=configs/digits_label_noise.py:margin \
      --grid='data.label_noise=0.0,0.2,0.4,0.6' --seeds=8 --workdir=runs/label_noise_margin
  python -m dml_jax.run.experiments sweep --config=configs/digits_label_noise.py:margin \
      --grid='data.clean_fraction=0.8,0.6,0.4' --seeds=8 --workdir=runs/label_noise_margin
  python -m dml_jax.run.experiments sweep --config=configs/digits_label_noise.py:margin_paper \
      --grid='data.label_noise+data.clean_fraction=0.0+1.0,0.2+1.0,0.4+1.0,0.6+1.0,0.0+0.8,0.0+0.6,0.0+0.4' \
      --seeds=8 --workdir=runs/label_noise_margin_paper

(the third, the clean topline of ``margin``, in the same folder as its noisy runs). The triplet
runs at p = 0.4 evaluated every 100 steps (``--set=eval_every_steps=100``) show the two
semi-hard selections over training; docs/reproductions.md has the command.
"""

from configs import recipes
from dml_jax.run import config

ROW = {
    "num_train_steps": 2000,        # ~44 epochs: long enough for the noise to be memorised
    "batch_size": 24, "log_every_steps": 100, "checkpoint_every_steps": 1000,
    "data.name": "digits",
    "data.options": {"train_digits": (0, 1, 2, 3, 4, 5), "test_digits": (6, 7, 8, 9)},
    "data.group_size": 4,
    "model.name": "small_cnn", "model.embedding_dim": 16,
    "eval.splits": ("test",), "eval.plot": False,
}
VARIANTS = {
    "triplet": {"loss": {"name": "triplet", "positive": "all", "negative": "semihard_random",
                         "margin": 0.2, "similarity": "cosine"}},
    "margin": {"loss": {"name": "margin"}},
    "margin_paper": recipes.NOISE_LOSSES["margin"],
    "smoke": {"num_train_steps": 10, "log_every_steps": 5, "checkpoint_every_steps": 10},
}
GROUPS = (("triplet", "margin", "margin_paper"),)
DEFAULT = "triplet"


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, groups=GROUPS, default=DEFAULT, path=__file__)
