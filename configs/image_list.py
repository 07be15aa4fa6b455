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

  python train.py --config=configs/image_list.py --config.data.options.path=list.csv --workdir=W
  python train.py --config=configs/image_list.py:image_folder \
      --config.data.options.root=/data/birds --workdir=W
  python train.py --config=configs/image_list.py:hotels \
      --config.data.options.path=hotels.tsv --workdir=W
"""

from ml_collections import config_dict

from configs import default
from configs import recipes

FORMATS = ("image_list", "image_folder", "hotels")


def get_config(arg: str = "image_list"):
  parts = [a for a in (arg or "").split(",") if a]
  smoke = "smoke" in parts
  rest = [a for a in parts if a != "smoke"] or ["image_list"]
  if len(rest) != 1 or rest[0] not in FORMATS:
    raise ValueError(f"Unknown config argument {arg!r}; allowed: one of {', '.join(FORMATS)} "
                     "optionally followed by ',smoke'.")
  fmt = rest[0]
  c = default.get_config()
  c.data.name = fmt
  if fmt == "image_folder":
    c.data.options = config_dict.ConfigDict({"root": "", "layout": "auto"})
  else:
    c.data.options = config_dict.ConfigDict({"path": "", "root": ""})
  c.eval.splits = ("test@train",) if fmt == "hotels" else ("test",)
  c.eval.ks = (1, 10, 100) if fmt == "hotels" else (1, 2, 4, 8)
  recipes.ephn(c, learning_rate=0.0025, group_size=8)
  c.num_epochs = 50
  return recipes.finish(c, "smoke" if smoke else "")
