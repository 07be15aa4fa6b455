r"""Label-noise paper Fig. 1-2 style experiment on the embedded digits (all-digit protocol).

A 16-D L2-normalised small-CNN embedding trained on digits 0-5 labelled by digit (K = 6
classes) with uniform label noise ``data.label_noise = p`` (eq. 6) on the training labels, or
on the clean ``1 - p`` subset (``data.clean_fraction``, the topline), and evaluated on the
unseen digits 6-9. Batches of 24 = 6 classes x 4.

The argument picks the loss: ``triplet`` (FaceNet triplet, all positives, margin 0.2 on squared
distance; ``loss.negative`` 'semihard_random' = random semi-hard, eq. 28, or 'semihard' =
fixed semi-hard, eq. 29) or ``margin`` (Wu et al.'s margin loss with distance-weighted
sampling, alpha 0.2, beta0 1.2); append ``,smoke`` (or pass ``smoke`` alone: triplet) for a 10-step run.

  python -m dml_jax.run.experiments sweep --config=configs/digits_label_noise.py:triplet \
      --grid='loss.negative=semihard_random,semihard' \
      --grid='data.label_noise+data.clean_fraction=0.0+1.0,0.2+1.0,0.4+1.0,0.6+1.0,0.0+0.8,0.0+0.6,0.0+0.4' \
      --seeds=2 --workdir=runs/label_noise_triplet  # ~7 min here
  python -m dml_jax.run.experiments sweep --config=configs/digits_label_noise.py:margin \
      --grid='data.label_noise=0.0,0.2,0.4,0.6' --seeds=2 --workdir=runs/label_noise_margin  # ~2 min
"""

from ml_collections import config_dict

from configs import default


def get_config(arg: str = "triplet"):
  parts = [a for a in (arg or "").split(",") if a]
  variant = "smoke" if "smoke" in parts else ""
  rest = [a for a in parts if a != "smoke"]
  if len(rest) > 1:
    raise ValueError(f"Config argument {arg!r} names more than one loss; allowed: triplet, "
                     "margin (optionally with ',smoke').")
  loss = rest[0] if rest else "triplet"
  c = default.get_config()
  c.num_train_steps = 2000        # ~44 epochs: long enough for the noise to be memorised
  c.batch_size = 24
  c.log_every_steps = 100
  c.checkpoint_every_steps = 1000
  c.data.name = "digits"
  c.data.options = config_dict.ConfigDict({"train_digits": (0, 1, 2, 3, 4, 5),
                                           "test_digits": (6, 7, 8, 9)})
  c.data.group_size = 4
  c.model.name = "small_cnn"
  c.model.embedding_dim = 16
  c.model.normalize = True
  if loss == "triplet":
    c.loss = config_dict.ConfigDict({"name": "triplet", "positive": "all",
                                     "negative": "semihard_random", "margin": 0.2,
                                     "similarity": "cosine"})
  elif loss == "margin":
    c.loss = config_dict.ConfigDict({"name": "margin"})
  else:
    raise ValueError(f"Unknown loss {loss!r} in the config argument; allowed: triplet, margin.")
  c.optimizer.learning_rate = 1e-3
  c.eval.ks = (1, 2, 4, 8)
  c.eval.splits = ("test",)
  c.eval.similarity = "cosine"
  c.eval.plot = False
  if variant == "smoke":
    c.num_train_steps = 10
    c.log_every_steps = 5
    c.checkpoint_every_steps = 10
  return c
