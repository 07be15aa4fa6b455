r"""Label-noise paper (Figs. 1-3, panels (a)-(d)) on the real Omniglot by letter, at CPU scale.

The three losses of the paper's panels, each trained under uniform label noise p (eq. 6,
``data.label_noise``) and on the clean 1 - p fraction of the training drawings (the topline,
``data.clean_fraction``); panel (d) is the ratio of the two:

| argument | panel | loss |
|---|---|---|
| ``triplet_random_semihard`` (default) | (a) | triplet loss (eq. 3, plain distances, margin 0.2), every positive pair with a random semi-hard negative (eq. 28) |
| ``triplet_fixed_semihard`` | (b) | the same with the fixed semi-hard negative (eq. 29) |
| ``margin`` | (c) | the marginal loss, beta 1.4 fixed, alpha 0.2, random semi-hard negatives |

The losses are ``configs/label_noise.py``'s (``recipes.NOISE_LOSSES``); append ``,smoke`` for a
2-step run.

**Our CPU recipe** (the paper: ResNet-34 on SOP, CUB and Flowers, ImageNet weights for the last
two, RMSProp): the Omniglot letter recipe of ``configs/omniglot_dro.py`` (the EPS paper's small
CNN from scratch, grey 28 x 28 drawings, Adam 1e-3; the 964 letters of the 30 background
alphabets, 20 drawings each) with the paper's batch of 60 = 12 letters x 5 drawings and 128-D
embedding, 600 steps (1.9 epochs), as the
DRO and EPHN tables on this recipe; evaluated on the 659 unseen letters of the 20 evaluation
alphabets. With 964 classes, noise moves a drawing to one of 963 other letters, so a
different-letter pair is almost never read as a same-letter one (eq. 7's q_-1 is 0.0007 at
p = 0.4), while a same-letter pair is read as different with q_+1 = 0.64.

  python -m dml_jax.run.experiments sweep \
      --config=configs/omniglot_label_noise.py:triplet_random_semihard \
      --grid='data.label_noise+data.clean_fraction=0.0+1.0,0.2+1.0,0.4+1.0,0.6+1.0,0.0+0.8,0.0+0.6,0.0+0.4' \
      --seeds=3 --workdir=runs/omniglot_label_noise/triplet_random_semihard \
      --set=data.options.root=/data/omniglot

(and the same for ``triplet_fixed_semihard`` and ``margin``, each in its own folder). Two
sweeps vary the recipe around p = 0.4 (their full commands are in docs/reproductions.md): the
triplet hinge on squared distances (``--set=loss.distance=squared``) and four times the steps
with an evaluation every 600 (``--set=num_train_steps=2400 --set=eval_every_steps=600``);
panel (d) corrected for chance adds ``--set="eval.metrics=('retrieval','clustering','ami','f1')"``.
"""

from configs import omniglot_dro, recipes
from dml_jax.run import config

ROW = {
    **omniglot_dro.ROW,
    "batch_size": 60, "data.group_size": 5,          # the paper's 12 classes x 5
    "model.embedding_dim": 128,
    "num_train_steps": 600, "log_every_steps": 50, "checkpoint_every_steps": 600,
    "eval.splits": ("test",),
}
VARIANTS = {
    **recipes.NOISE_LOSSES,
    # 2 steps on 2 letters x 5 drawings; only the unseen letters are evaluated.
    "smoke": omniglot_dro.VARIANTS["smoke"],
}
GROUPS = (tuple(recipes.NOISE_LOSSES),)
DEFAULT = "triplet_random_semihard"


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, groups=GROUPS, default=DEFAULT, path=__file__)
