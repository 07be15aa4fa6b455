r"""The image-file pipeline on a CPU: scikit-learn's digits written as 32 px PNG files
(train digits 0-5, test digits 6-9, one folder per digit), read by the 'digits_png'
loader (an 'image_folder' that says how to write the files when they are missing), decoded and augmented (pad 4 + random crop, no flip) in the grain pipeline, and
trained with EPHN (easy positive, hard negative, NCA 0.1) on the small CNN, 16-D.

  python -c "from dml_jax.data import digits; digits.write_digit_images('data/digits_png')"
  python train.py --config=configs/digits_image_folder.py --workdir=runs/digits_png
"""

from configs import recipes
from dml_jax.run import config

ROW = {
    "data.name": "digits_png", "data.options": {"root": "data/digits_png"},
    "data.image_size": 32, "data.resize_size": 32, "data.augmentation": "pad_crop",
    **recipes.GREY,
    "data.pad": 4, "data.flip": False, "data.group_size": 8,
    "batch_size": 48,               # 6 classes x 8
    "num_train_steps": 300, "log_every_steps": 25, "checkpoint_every_steps": 100,
    "model.name": "small_cnn", "model.embedding_dim": 16,
    "loss": {"name": "nca", "positive": "easy", "negative": "hard", "temperature": 0.1},
    "eval.splits": ("test",), "eval.plot": False,
}
VARIANTS = {"smoke": {"num_train_steps": 2, "log_every_steps": 1, "checkpoint_every_steps": 2,
                      "batch_size": 16, "data.group_size": 4, "eval.kmeans_n_init": 1}}


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, path=__file__)
