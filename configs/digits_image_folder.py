r"""The image-file pipeline on a CPU: scikit-learn's digits written as 32 px PNG files
(train digits 0-5, test digits 6-9, one folder per digit), read by the 'digits_png'
loader (an 'image_folder' that says how to write the files when they are missing), decoded and augmented (pad 4 + random crop, no flip) in the grain pipeline, and
trained with EPHN (easy positive, hard negative, NCA 0.1) on the small CNN, 16-D.

  python -c "from dml_jax.data import digits; digits.write_digit_images('data/digits_png')"
  python train.py --config=configs/digits_image_folder.py --workdir=runs/digits_png
"""

from ml_collections import config_dict

from configs import default
from configs import recipes


def get_config(arg: str = ""):
  c = default.get_config()
  c.data.name = "digits_png"
  c.data.options = config_dict.ConfigDict({"root": "data/digits_png"})
  recipes.images(c, 32, resize_size=32, augmentation="pad_crop", grey=True)
  c.data.pad = 4
  c.data.flip = False
  c.data.group_size = 8
  c.batch_size = 48               # 6 classes x 8
  c.num_train_steps = 300
  c.log_every_steps = 25
  c.checkpoint_every_steps = 100
  c.model.name = "small_cnn"
  c.model.embedding_dim = 16
  c.loss = config_dict.ConfigDict({"name": "nca", "positive": "easy", "negative": "hard",
                                   "temperature": 0.1})
  c.optimizer.learning_rate = 1e-3
  c.eval.splits = ("test",)
  c.eval.ks = (1, 2, 4, 8)
  c.eval.plot = False
  if arg == "smoke":
    c.num_train_steps = 2
    c.log_every_steps = 1
    c.checkpoint_every_steps = 2
    c.batch_size = 16
    c.data.group_size = 4
    c.data.num_threads = 2
    c.eval.kmeans_n_init = 1
    return c
  return recipes.finish(c, arg)
