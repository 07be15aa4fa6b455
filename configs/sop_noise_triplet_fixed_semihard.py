r"""Label-noise paper, Fig. 1 (b) (and the topline ratio (d)): Recall@1 against the label-noise
rate p; the paper reports this only as a figure.

Stanford Online Products (official split; trained from scratch: the paper names ImageNet
weights only for CUB and Flowers); triplet loss on Euclidean distances (eq. 3, margin 0.2,
all positive pairs) with fixed semi-hard negatives (eq. 29: the closest negative farther
than the positive); ResNet-34, RMSProp, batches of 60 = 12 classes x 5. Label noise (eq. 6)
is set by data.label_noise (applied once, seed data.noise_seed, clean labels kept as label
set 'clean'); the topline trains on a clean 1 - p fraction (data.clean_fraction).

  python train.py --config=configs/sop_noise_triplet_fixed_semihard.py --workdir=runs/sop_noise_triplet_fixed_semihard
  python train.py --config=configs/sop_noise_triplet_fixed_semihard.py:smoke --workdir=/tmp/smoke
  python -m dml_jax.experiments sweep --config=configs/sop_noise_triplet_fixed_semihard.py \
      --grid='data.label_noise+data.clean_fraction=0.0+1.0,0.2+1.0,0.4+1.0,0.6+1.0,0.0+0.8,0.0+0.6,0.0+0.4' \
      --workdir=runs/sop_noise_triplet_fixed_semihard
"""

from configs import default
from configs import recipes


def get_config(arg: str = ""):
  c = default.get_config()
  recipes.dataset(c, "sop")
  recipes.label_noise(c, pretrained=False)
  recipes.noise_loss(c, "triplet_fixed_semihard")
  return recipes.finish(c, arg)
