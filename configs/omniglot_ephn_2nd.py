r"""2nd-order triplet paper Fig. 4 (R@1 against the group size n, 1st- vs 2nd-order EPHN) on
the real Omniglot, at CPU scale.

Everything but the objective and n is the letter recipe of ``configs/omniglot_dro.py`` (the
small CNN from scratch, grey 28 x 28 drawings, 64-D, batches of 80, Adam 1e-3, 600 steps;
trained on the 964 letters of the 30 background alphabets, evaluated on the 659 unseen letters
of the 20 evaluation alphabets and on the training letters), so each row compares with the
DRO rows there.

| argument | objective |
|---|---|
| ``ephn`` | EPHN with the 1st-order NCA loss ``softplus((S_an - S_ap) / T)`` (EPHN paper), easiest positive, hardest negative, T 0.1 |
| ``ephn_2nd`` (default) | the same mining with the 2nd-order loss (2nd-order paper eq. 16), T 0.1 |

The paper's figure sweeps ``data.group_size`` (n, positives per class in the batch): at n = 2
an anchor has one positive, often far, and a close hardest negative, its Problem 1, where the
1st-order loss drives pairs to the singularity at (1, 1) and the 2nd-order loss does not.
Append ``,smoke`` for a 2-step run.

  python -m dml_jax.run.experiments sweep --config=configs/omniglot_ephn_2nd.py \
      --grid='loss.name=nca,nca_2nd' --grid='data.group_size=2,4,8' --seeds=4 \
      --workdir=runs/omniglot_ephn_2nd --set=data.options.root=/data/omniglot --x=data.group_size

(``loss.name=nca`` starts the loss block from nca's defaults: easy positive, hard negative,
T 0.1, as the file's.)
"""

from configs import omniglot_dro
from dml_jax.run import config

ROW = {**omniglot_dro.ROW, "data.group_size": 4}
VARIANTS = {
    "ephn": {"loss": {"name": "nca", "positive": "easy", "negative": "hard",
                      "temperature": 0.1}},
    "ephn_2nd": {"loss": {"name": "nca_2nd", "positive": "easy", "negative": "hard",
                          "temperature": 0.1}},
    "smoke": {**omniglot_dro.VARIANTS["smoke"], "data.group_size": 5},
}
GROUPS = (("ephn", "ephn_2nd"),)
DEFAULT = "ephn_2nd"


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, groups=GROUPS, default=DEFAULT, path=__file__)
