r"""Your own images, trained with the EPHN recipe (ResNet-50, 512-D, easy positive + hard
negative, 2nd-order loss; configs/recipes.py) at 50 epochs, lr 0.0025.

The argument picks the format (dml_jax/data/image_lists.py describes each):

* ``image_list`` (default): a CSV / TSV of ``path,label[,split]``; without a split column the
  sorted classes are halved into class-disjoint train / test.
* ``image_folder``: ``root/<class>/*.jpg`` (classes halved as above) or
  ``root/<split>/<class>/*.jpg``.
* ``hotels``: a Hotels-50K style list (splits train / test); test images are retrieved from
  the training images (protocol 'test@train', Recall@1/10/100).

Append ``,smoke`` for a tiny run.

Needs weights/resnet50.npz (docs/models.md).

  python train.py --config=configs/image_list.py --config.data.options.path=list.csv --workdir=W
  python train.py --config=configs/image_list.py:image_folder \
      --config.data.options.root=/data/birds --workdir=W
  python train.py --config=configs/image_list.py:hotels \
      --config.data.options.path=hotels.tsv --workdir=W
"""

from configs import recipes
from dml_jax.run import config

ROW = {**recipes.EPHN,
       "data.group_size": 8, "optimizer.learning_rate": 0.0025, "num_epochs": 50}
VARIANTS = {
    "image_list": {"data.name": "image_list", "data.options": {"path": "", "root": ""}},
    "image_folder": {"data.name": "image_folder",
                     "data.options": {"root": "", "layout": "auto"}},
    "hotels": {"data.name": "hotels", "data.options": {"path": "", "root": ""},
               "eval.splits": ("test@train",), "eval.ks": (1, 10, 100)},
    "smoke": recipes.smoke,
}
GROUPS = (("image_list", "image_folder", "hotels"),)
DEFAULT = "image_list"


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, groups=GROUPS, default=DEFAULT, path=__file__)
