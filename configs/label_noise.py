r"""Label-noise paper (Figs. 1-3): three datasets x three losses, one config with variants.

The argument is ``DATASET,LOSS`` (append ``,smoke`` for a 2-step run on tiny images; ``smoke``
alone is ``cub,triplet_random_semihard,smoke``; no argument is ``cub,triplet_random_semihard``).
The paper reports Recall@1 against the label-noise rate p only as figures:

| LOSS | SOP: Fig. 1 | CUB: Fig. 2 | Flowers: Fig. 3 |
|---|---|---|---|
| ``triplet_random_semihard`` (random semi-hard negatives) | (a) | (a) | (a) |
| ``triplet_fixed_semihard`` (fixed semi-hard negatives) | (b) | (b) | (b) |
| ``margin`` | (c) | (c) | (c) |

with DATASET ``sop``, ``cub`` or ``flowers``.

Datasets: CUB-200-2011 (classes 0-99 train / 100-199 test; the paper states no split),
Stanford Online Products (official split; trained from scratch: the paper names ImageNet
weights only for CUB and Flowers), Oxford-102 Flowers (classes 0-50 train / 51-101 test, our
choice: the paper states no split).

Losses (``recipes.NOISE_LOSSES``): the triplet loss on Euclidean distances (eq. 3, margin 0.2,
all positive pairs) with random semi-hard negatives (eq. 28: a random negative with non-zero
loss) or fixed semi-hard negatives (eq. 29: the closest negative farther than the positive);
the marginal loss with beta = 1.4 fixed and alpha = 0.2 over all positive pairs with random
semi-hard negatives. ResNet-34, RMSProp, batches of 60 = 12 classes x 5 (``recipes.LABEL_NOISE``).

Label noise (eq. 6) is set by ``data.label_noise`` (applied once, seed ``data.noise_seed``,
clean labels kept as label set 'clean'); the topline, the ratio of Fig. (d), trains on a clean
1 - p fraction (``data.clean_fraction``; SOP classes left without an example are dropped).

Needs the dataset prepared (docs/datasets.md) and, for cub and flowers, weights/resnet34.npz
(docs/models.md); ``smoke`` needs only the dataset.

  python train.py --config=configs/label_noise.py:cub,margin --workdir=runs/cub_noise_margin
  python train.py --config=configs/label_noise.py:cub,margin,smoke --workdir=/tmp/smoke
  python -m dml_jax.run.experiments sweep \
      --config=configs/label_noise.py:sop,triplet_fixed_semihard \
      --grid='data.label_noise+data.clean_fraction=0.0+1.0,0.1+1.0,0.2+1.0,0.3+1.0,0.4+1.0,0.5+1.0,0.6+1.0,0.0+0.9,0.0+0.8,0.0+0.7,0.0+0.6,0.0+0.5,0.0+0.4' \
      --workdir=runs/sop_noise_triplet_fixed_semihard

The grid steps p by 0.1: the paper reads its figures at 10% steps (fixed semi-hard falls
behind its topline after 30% on SOP, the margin loss's breakpoint on CUB is 50% against 60%
for random semi-hard); steps of 0.2 cannot show those breakpoints.
"""

from configs import recipes
from dml_jax.run import config

ROW = recipes.LABEL_NOISE
VARIANTS = {
    "cub": recipes.DATASETS["cub"],
    "sop": {**recipes.DATASETS["sop"], "model.pretrained": ""},   # from scratch
    "flowers": recipes.DATASETS["flowers102"],
    **recipes.NOISE_LOSSES,
    "smoke": recipes.smoke,
}
GROUPS = (("cub", "sop", "flowers"), tuple(recipes.NOISE_LOSSES))
DEFAULT = "cub,triplet_random_semihard"


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, groups=GROUPS, default=DEFAULT, path=__file__)
