"""The papers' training recipes as named row dictionaries, merged explicitly by the
experiment configs (``ROW = {**recipes.DATASETS['cub'], **recipes.EPHN, ...}``).

Every recipe is a dict of dotted config keys -> values (``dml_jax/run/config.py``); the
settings the papers state are cited in the experiment file's docstring, those they leave
unstated are marked "our choice" here. ``smoke`` is the variant every paper config offers.
"""

# Converted ImageNet weights (python -m dml_jax.models.pretrained convert ...): the papers
# fine-tune ImageNet-pretrained backbones; train.py stops with the convert command if missing.
PRETRAINED = {
    "resnet18": "weights/resnet18.npz",
    "resnet34": "weights/resnet34.npz",
    "resnet50": "weights/resnet50.npz",
    "bn_inception": "weights/bn_inception.npz",
}

# The benchmarks with readers of their official files: ``--config.data.options.root=DIR``
# reads them from DIR (dml_jax.data.official); '' keeps the TFDS route.
OFFICIAL_FILES = ("cub", "cars196", "sop", "flowers102", "omniglot", "mnist_evenodd", "mnist")


def _dataset(name: str, splits: tuple, options: dict | None = None) -> dict:
  """The row of ``data.name``: its evaluation protocols, its loader options (``data_dir``:
  '' = TFDS's default; ``root``: the official files' folder, '' = TFDS) and ``eval.ks = ()``
  (the dataset's Recall@K list, evaluation.protocols.DEFAULT_KS)."""
  if options is None:
    options = {"data_dir": ""} | ({"root": ""} if name in OFFICIAL_FILES else {})
  return {"data.name": name, "data.options": options, "eval.splits": splits, "eval.ks": ()}


DATASETS = {
    "cub": _dataset("cub", ("test",)),
    "cars196": _dataset("cars196", ("test",)),
    "sop": _dataset("sop", ("test",)),
    "flowers102": _dataset("flowers102", ("test",)),
    "inshop": _dataset("inshop", ("query@gallery",), {"root": "data/inshop"}),
    # EPS Table 3: trained with alphabet labels, evaluated by character (letters) and by
    # alphabet (languages) on the unseen evaluation alphabets. Black strokes on white: a
    # 'pad_crop' border is white.
    "omniglot": {**_dataset("omniglot", ("test", "test:alphabet")), "data.pad_fill": 255},
    # EPS Table 1: unseen digits 6-9 by digit, and held-out images of the training digits by
    # digit (class collapse shows there).
    "mnist_evenodd": _dataset("mnist_evenodd", ("test", "val")),
    # Class-disjoint digits (train 0-7, test 8-9 by digit; val = test images of 0-7).
    "mnist": _dataset("mnist", ("test",)),
}

# Grey images (characters, digits): one channel scaled to [0, 1], no ImageNet statistics.
GREY = {"data.channels": 1, "data.mean": (0.0,), "data.std": (1.0,)}

# EPHN / 2nd-order papers: ResNet-50 (ImageNet), 512-D, batch 128 of n per class (the file
# sets data.group_size and optimizer.learning_rate), SGD for 40 epochs, the rate divided by 10
# after epochs 20 and 30, NCA 2nd order with temperature 0.1, easy positive + hard negative.
# Augmentation: our EPHN pipeline, resize 256 -> random 224 crop + flip (the papers' text says
# "re-sized to 256 by 256 ... random crops padded by 10 pixels"; for that set
# data.augmentation='pad_crop', data.image_size=256). Momentum 0.9 and no weight decay are our
# choice (not stated).
EPHN = {
    "model.name": "resnet50", "model.embedding_dim": 512, "model.normalize": True,
    "model.pretrained": PRETRAINED["resnet50"],
    "batch_size": 128,
    "data.small_class": "all",          # "a class with fewer than n images contributes all"
    "data.image_size": 224, "data.resize_size": 256, "data.augmentation": "resize_crop",
    "num_epochs": 40,
    "optimizer.name": "sgd", "optimizer.momentum": 0.9, "optimizer.schedule": "step",
    "optimizer.decay_epochs": (20, 30), "optimizer.decay_factor": 0.1,
    "loss": {"name": "nca_2nd", "positive": "easy", "negative": "hard", "temperature": 0.1},
}

# The EPHN paper's rows: its released code of the paper's time sums the loss over the anchors
# and runs SGD without momentum, and the paper's learning rates (1e-4 CUB, 5e-4 the others)
# are for that: with the mean and momentum 0.9 a step is about 10/128 of theirs. (No code of
# the 2nd-order paper was released: its rows keep the mean and momentum 0.9 of EPHN.)
EPHN_RELEASED = {"loss.reduction": "sum", "optimizer.momentum": 0.0}

# EPS paper (built on Roth et al.'s framework): ResNet-50 with frozen BatchNorm, 128-D, 224 px
# (80 for Omniglot), Adam 1e-5, batch 160. Not stated in the paper, taken from Roth et al.'s
# defaults: weight decay 4e-4, coupled (L2 in the gradient, as torch.optim.Adam's
# weight_decay), 150 epochs, RandomResizedCrop + flip. (The paper's appendix sets Adam's
# "other parameters" to Kingma & Ba's defaults, which have no weight decay; it also says it
# kept the framework's defaults: --config.optimizer.weight_decay=0 is the first reading.)
# Our choice: n = 4 per class (Roth's default n = 2 would leave one positive per anchor,
# making EPS identical to the baseline).
EPS = {
    "model.name": "resnet50", "model.embedding_dim": 128, "model.normalize": True,
    "model.pretrained": PRETRAINED["resnet50"], "model.bn_mode": "frozen",
    "batch_size": 160, "data.group_size": 4,
    "data.image_size": 224, "data.resize_size": 256,
    "data.augmentation": "random_resized_crop",
    "num_epochs": 150,
    "optimizer.name": "adam", "optimizer.learning_rate": 1e-5, "optimizer.weight_decay": 4e-4,
    "optimizer.objective_learning_rate": 5e-4,   # margin loss beta (Roth et al.)
    "optimizer.decay_objective": False,   # Roth et al.: beta's own group, without decay
    "eval.overcluster": 10,      # NMI+ (Table 2: 10x the number of classes)
}

# EPS paper on Omniglot: batch 160 as 20 alphabets x 8 drawings. The paper's batch of 160 at
# our n = 4 (see EPS) needs 40 distinct classes, but the background set has 30 alphabets.
# Roth et al.'s class_random sampler, which the paper ran, draws each group's class with
# replacement, so 40 groups of 4 over 30 alphabets hold ~22.3 distinct alphabets with 7.2
# drawings each on average. Our sampler keeps a batch's classes distinct; the closest
# composition at the stated batch size is 20 alphabets x 8 drawings (docs/papers.md
# "Departures from the papers").
OMNIGLOT_BATCH = {"batch_size": 160, "data.group_size": 8}


def _eps_losses(loss: dict, baseline_positive: str) -> tuple[dict, dict]:
  """(the baseline, with EPS): ``loss`` with its own positive selection, and with the easiest
  positive (``positive='easy'``); the negative selection is kept."""
  return {"loss": {**loss, "positive": baseline_positive}}, {"loss": {**loss, "positive": "easy"}}


# EPS paper Tables 2-3: the three losses, each as the baseline and with EPS (the easiest
# positive replaces the baseline's positive selection; the negative selection is kept).
EPS_LOSSES = {}
# Trip. + SH: a random positive, a semi-hard negative; margin 0.2 on squared distances (Roth
# et al.'s default). negative='semihard' is FaceNet's reading (hardest negative beyond the
# positive, anchor dropped if none); --config.loss.negative=semihard_band is Roth et al.'s
# miner that the EPS code ran (docs/papers.md "Departures from the papers").
EPS_LOSSES["triplet"], EPS_LOSSES["eps_triplet"] = _eps_losses(
    {"name": "triplet", "negative": "semihard", "margin": 0.2}, "random")
# MS: alpha 2, beta 50, lambda (base) 1 as the paper states; MS mining of the positives. With
# EPS the negatives are still mined against the hardest positive (objective default
# negative_reference='hardest', the paper's "same hard-negative method").
EPS_LOSSES["ms"], EPS_LOSSES["eps_ms"] = _eps_losses(
    {"name": "multi_similarity", "negative": "ms", "alpha": 2.0, "beta": 50.0, "base": 1.0,
     "epsilon": 0.1}, "ms")
# Dist-Margin: Wu et al.'s margin loss, alpha 0.2, learnable per-class beta from 1.2,
# distance-weighted negatives, a random positive.
EPS_LOSSES["margin"], EPS_LOSSES["eps_margin"] = _eps_losses(
    {"name": "margin", "negative": "distance_weighted", "alpha": 0.2, "beta": "class",
     "beta0": 1.2}, "random")

# DRO paper: BN-Inception (ImageNet) + a linear 1024-D embedding, Adam 1e-5, batch 80 (the
# file sets 640 for In-Shop) of M = 5 per class (M as in its ablations). Not stated: training
# length, image size, augmentation. Our choice (the MS-loss code the paper follows): frozen
# BatchNorm, RandomResizedCrop 227 + flip (the MS-loss code: area fraction 0.16-1 of the image
# resized to 256; ours: 0.08-1, torchvision's default, of the full image), evaluation resized
# to 256 and centre 227, 10,000 steps; no weight decay (the MS-loss code has Adam weight decay
# 5e-4: --config.optimizer.weight_decay=5e-4). Inputs normalised as the BN-Inception weights
# expect: pixels in [0, 255] minus (128, 117, 104) (R, G, B), which the model turns into the
# port's BGR minus (104, 117, 128) (models.bn_inception.PORT_MEAN / PORT_STD).
DRO = {
    "model.name": "bn_inception", "model.embedding_dim": 1024, "model.normalize": True,
    "model.pretrained": PRETRAINED["bn_inception"], "model.bn_mode": "frozen",
    "batch_size": 80, "data.group_size": 5,
    "data.image_size": 227, "data.resize_size": 256,
    "data.augmentation": "random_resized_crop",
    "data.mean": (128 / 255, 117 / 255, 104 / 255), "data.std": (1 / 255, 1 / 255, 1 / 255),
    "num_train_steps": 10_000,
    "optimizer.name": "adam", "optimizer.learning_rate": 1e-5,
}

# Label-noise paper: ResNet-34 (ImageNet for CUB / Flowers: the file clears model.pretrained
# for SOP), RMSProp, batch 60 = 12 classes x 5. Not stated: learning rate, length, embedding
# size, images; our choice: learning rate 1e-5, 40 epochs, 128-D, resize 256 -> random 224
# crop + flip. RMSProp as the paper's citation (Tieleman & Hinton): a running mean of g^2 with
# decay 0.9, optax's (and TensorFlow's) rule with eps inside the square root; torch's
# RMSprop differs (decay 0.99, eps outside). Sweep the noise rate with data.label_noise and
# the topline with data.clean_fraction (one per run).
LABEL_NOISE = {
    "model.name": "resnet34", "model.embedding_dim": 128, "model.normalize": True,
    "model.pretrained": PRETRAINED["resnet34"],
    "batch_size": 60, "data.group_size": 5,
    "data.image_size": 224, "data.resize_size": 256, "data.augmentation": "resize_crop",
    "num_epochs": 40,
    "optimizer.name": "rmsprop", "optimizer.momentum": 0.0, "optimizer.learning_rate": 1e-5,
}

# The three losses of the label-noise paper's figures (a)-(c). Triplet: eq. 3 on plain
# Euclidean distances d = ||f_i - f_j|| with margin 0.2, every positive pair.
NOISE_LOSSES = {
    # eq. 28: a random violating negative
    "triplet_random_semihard": {"loss": {"name": "triplet", "positive": "all",
                                         "negative": "semihard_random", "margin": 0.2,
                                         "distance": "euclidean"}},
    # eq. 29: the closest negative beyond the positive
    "triplet_fixed_semihard": {"loss": {"name": "triplet", "positive": "all",
                                        "negative": "semihard", "margin": 0.2,
                                        "distance": "euclidean"}},
    # beta = 1.4 fixed, alpha = 0.2, random semi-hard, 1-1 scheme: every positive pair with
    # its own negative (sec. 5.2)
    "margin": {"loss": {"name": "margin", "positive": "all", "negative": "semihard_random",
                        "alpha": 0.2, "beta": "fixed", "beta0": 1.4}},
}

# The 'smoke' variant of the paper configs: a tiny end-to-end run for tests (32 px images, the
# small CNN, batch 16, 2 steps, R@1/2/4); see smoke() for the keys that depend on the row.
SMOKE = {
    "num_epochs": 0, "num_train_steps": 2, "batch_size": 16,
    "data.small_class": "replace", "data.image_size": 32, "data.resize_size": 36,
    "log_every_steps": 1, "checkpoint_every_steps": 2,
    "model.name": "small_cnn", "model.pretrained": "", "model.bn_mode": "train",
    "optimizer.decay_epochs": (),
    "eval.batch_size": 32, "eval.kmeans_n_init": 1,
    "eval.ks": (1, 2, 4),       # mock splits are too small for R@100 or NMI+
    "eval.overcluster": 0, "eval.plot": False,
}


def smoke(c) -> dict:
  """``SMOKE`` plus the keys that follow the row: 2 or 8 examples per class (2 or 8 classes
  per batch), an embedding of at most 16 dimensions, a loss ``k`` of at most 32."""
  row = {**SMOKE, "data.group_size": 8 if c.data.group_size >= 8 else 2,
         "model.embedding_dim": min(c.model.embedding_dim, 16)}
  if "k" in c.loss:
    row["loss.k"] = min(c.loss.k, 32)
  if not c.data.image_size:   # an in-memory dataset (the digits): its own size
    del row["data.image_size"], row["data.resize_size"]
  return row
