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

from configs import default


def get_config(arg: str = ""):
  c = default.get_config()
  c.num_train_steps = 300
  c.batch_size = 16
  c.log_every_steps = 50
  c.checkpoint_every_steps = 300
  c.data.name = "digits"
  c.data.group_size = 4
  c.model.name = "small_cnn"
  c.model.embedding_dim = 16
  c.model.normalize = True
  c.loss.name = "nca"
  c.loss.positive = "easy"
  c.loss.negative = "hard"
  c.loss.temperature = 0.1
  c.optimizer.learning_rate = 1e-3
  c.eval.ks = (1, 2, 4, 8)
  c.eval.splits = ("test", "train")
  c.eval.similarity = "cosine"
  c.eval.plot = False
  if arg == "smoke":
    c.num_train_steps = 10
    c.log_every_steps = 5
    c.checkpoint_every_steps = 10
  elif arg:
    raise ValueError(f"Unknown config argument {arg!r}; allowed: '' or 'smoke'.")
  return c
