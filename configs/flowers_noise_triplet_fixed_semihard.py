r"""Label-noise paper, Fig. 3 (b) (and the topline ratio (d)): Recall@1 against the label-noise
rate p; the paper reports this only as a figure.

Oxford-102 Flowers (classes 0-50 train / 51-101 test, our choice: the paper states no
split); triplet loss on Euclidean distances (eq. 3, margin 0.2, all positive pairs) with
fixed semi-hard negatives (eq. 29: the closest negative farther than the positive);
ResNet-34, RMSProp, batches of 60 = 12 classes x 5. Label noise (eq. 6) is set by
data.label_noise (applied once, seed data.noise_seed, clean labels kept as label set
'clean'); the topline trains on a clean 1 - p fraction (data.clean_fraction).

  python train.py --config=configs/flowers_noise_triplet_fixed_semihard.py --workdir=runs/flowers_noise_triplet_fixed_semihard
  python train.py --config=configs/flowers_noise_triplet_fixed_semihard.py:smoke --workdir=/tmp/smoke
  python -m dml_jax.experiments sweep --config=configs/flowers_noise_triplet_fixed_semihard.py \
      --grid='data.label_noise+data.clean_fraction=0.0+1.0,0.2+1.0,0.4+1.0,0.6+1.0,0.0+0.8,0.0+0.6,0.0+0.4' \
      --workdir=runs/flowers_noise_triplet_fixed_semihard
"""

from configs import default
from configs import recipes


def get_config(arg: str = ""):
  c = default.get_config()
  recipes.dataset(c, "flowers102")
  recipes.label_noise(c)
  recipes.noise_loss(c, "triplet_fixed_semihard")
  return recipes.finish(c, arg)
