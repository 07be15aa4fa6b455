r"""EPS paper, Table 3 row "EPS + Trip. + SH", Omniglot: letters R@1 68.4 (NMI 79.6), languages
R@1 85.2 (NMI+ 52.6) (reported; baseline 49.4 / 71.0).

Trained on the 30 background alphabets with alphabet labels only; evaluated on the 20
evaluation alphabets by character ('test') and by alphabet ('test:alphabet'), NMI+ with
30x the number of classes; 80 px inputs, no flip (characters), pad-10 crops (our choice: the
paper states no augmentation); the EPS recipe otherwise (ResNet-50, 128-D, Adam 1e-5,
batch 160).

  python train.py --config=configs/omniglot_eps_triplet.py --workdir=runs/omniglot_eps_triplet
  python train.py --config=configs/omniglot_eps_triplet.py:smoke --workdir=/tmp/smoke
"""

from ml_collections import config_dict

from configs import default
from configs import recipes


def get_config(arg: str = ""):
  c = default.get_config()
  recipes.dataset(c, "omniglot")
  recipes.eps(c, image_size=80)
  c.data.augmentation = "pad_crop"
  c.data.flip = False
  c.eval.overcluster = 30
  c.loss = config_dict.ConfigDict({"name": "triplet", "positive": "easy",
                                   "negative": "semihard", "margin": 0.2})
  return recipes.finish(c, arg)
