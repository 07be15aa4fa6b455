r"""EPHN paper Fig. 4 style group-size sweep on the embedded digits (all-digit protocol).

The NCA family (EPHN paper §4) on a 16-D L2-normalised embedding of the small CNN, trained on
digits 0-7 labelled by digit and evaluated on the unseen digits 8, 9 (``data.name='digits'``),
with a fixed batch of 16 and ``n`` examples per class. With 8 training classes a batch of 16
holds 16/n classes, so n in {2, 4, 8}; n = 16 would leave a single class (no negatives) and
n = 2 at a larger batch would need more classes than the digits have.

  python -m dml_jax.run.experiments sweep --config=configs/digits_ephn_groupsize.py \
      --grid='loss.positive+loss.negative=easy+all,easy+hard,hard+all,all+all' \
      --grid='data.group_size=2,4,8' --seeds=2 --x=data.group_size \
      --workdir=runs/ephn_groupsize

(EP = easy+all, EPHN = easy+hard, HP = hard+all, batch-all = all+all.)
"""

from dml_jax.run import config

ROW = {
    "num_train_steps": 300, "batch_size": 16, "checkpoint_every_steps": 300,
    "data.name": "digits", "data.group_size": 4,
    "model.name": "small_cnn", "model.embedding_dim": 16,
    "loss": {"name": "nca", "positive": "easy", "negative": "hard", "temperature": 0.1},
    "eval.splits": ("test", "train"), "eval.plot": False,
}
VARIANTS = {"smoke": {"num_train_steps": 10, "log_every_steps": 5,
                      "checkpoint_every_steps": 10}}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
