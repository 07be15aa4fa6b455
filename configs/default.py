"""Defaults shared by every experiment config (the config schema: docs/training.md "Configs").

Experiment files are rows over this config: a dict ``ROW`` of the dotted keys they change
(``dml_jax/run/config.py``; ``python -m dml_jax.run.config show FILE --diff-default``).
Every ``loss`` key except ``name`` is a keyword argument of ``objectives.make(name, ...)``.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.num_devices = 0              # data-parallel devices (0 = all local devices)
  c.num_train_steps = 1000
  c.num_epochs = 0                # > 0: train this many sampler epochs (overrides num_train_steps)
  c.batch_size = 128              # global batch
  c.log_every_steps = 50
  c.checkpoint_every_steps = 500
  c.eval_every_steps = 0          # 0: evaluate only at the end
  c.scatter_every_steps = 0       # > 0: triplet scatter diagram PNG of the eval split
  c.max_checkpoints_to_keep = 3   # newest checkpoints kept on disk (0: all of them)
  c.user_modules = ()             # modules imported first (own objectives; train.py --module)
  # Keep freed host memory in the process (dml_jax/run/host_memory.py): a machine setting that
  # experiment configs leave off. train.py's --keep_host_memory (or DML_JAX_KEEP_HOST_MEMORY)
  # decides; without it, true here forces it on, false leaves it to the data: on for images
  # (data.image_size > 0: large step buffers), off for the 8 px digits.
  c.keep_host_memory = False

  c.data = ml_collections.ConfigDict()
  c.data.name = "digits_evenodd"
  c.data.options = ml_collections.ConfigDict()   # keyword arguments of the dataset loader
  c.data.group_size = 8           # n examples per class in a batch
  # A class with < n examples: 'all' (contributes all it has; EPHN paper), 'replace' (padded
  # by sampling with replacement, the released EPHN code) or 'skip'. Groups of larger classes
  # are always complete (samplers.NPerClassSampler).
  c.data.small_class = "all"
  # What an epoch holds: 'every_example' (every class cut into all its groups of n),
  # 'one_group_per_class' (one group of n per class, drawn anew each epoch: the released EPHN
  # code's sampler on SOP, In-Shop and Hotels-50K) or 'pad_to_largest' (every class padded
  # with repeats to the largest class, visited in rounds: the released EPHN code's sampler on
  # CUB-200-2011 and Cars196).
  c.data.epoch = "every_example"
  c.data.image_size = 0           # image datasets: crop side (224); 0 for the in-memory digits
  c.data.resize_size = 0          # shorter side before the crop; 0: image_size * 8/7 (256)
  c.data.channels = 3             # 3 (RGB) or 1 (grey) model input channels
  c.data.mean = (0.485, 0.456, 0.406)   # normalisation (x/255 - mean)/std: ImageNet
  c.data.std = (0.229, 0.224, 0.225)
  # 'none' | 'resize_crop' (EPHN) | 'random_resized_crop' (MS/DRO) | 'pad_crop' (characters)
  c.data.augmentation = "none"
  c.data.flip = True              # random horizontal flip in training augmentation
  c.data.pad = 10                 # 'pad_crop' padding, pixels on each side
  c.data.pad_fill = 0             # 'pad_crop' padding value (the background; 255 Omniglot)
  # Machine settings (train.py --num_threads / --num_workers, or DML_JAX_NUM_THREADS /
  # DML_JAX_NUM_WORKERS, set them; experiment configs do not):
  c.data.num_threads = 8          # decoding threads (per worker process)
  c.data.num_workers = -1         # grain worker processes (0: threads of the trainer only;
                                  # -1: 0 on the CPU, up to 8 on an accelerator)
  c.data.prefetch = 2             # batches decoded ahead
  # Decoded-image cache (dml_jax/data/cache.py): 'auto' (decode each training image once into
  # memory and augment on the device when the cache fits cache_max_gb, else stream), 'memory',
  # 'mmap' (a memory map in <workdir>/data_cache/, reused by reruns) or 'none' (decode and
  # augment on the host every epoch). The same crops and flips either way.
  c.data.cache = "auto"
  c.data.cache_max_gb = 8.0       # budget of 'auto' (GB of uint8 pixels; CUB at 256 px: 1.5)
  # The training labels: '' (the dataset's) or a label set of its train split, e.g.
  # 'character' on omniglot (train by letter, not by alphabet) or 'digit' on mnist_evenodd.
  c.data.train_label_set = ""
  c.data.label_noise = 0.0        # rate p of uniform label noise on the train split (eq. 6)
  c.data.clean_fraction = 1.0     # < 1: the clean 'topline', a random subset of the train split
  c.data.noise_seed = 0           # seed of the label noise / the clean subset (not c.seed)

  c.model = ml_collections.ConfigDict()
  c.model.name = "small_cnn"
  c.model.embedding_dim = 128
  c.model.normalize = True        # L2-normalise the embedding
  c.model.pretrained = ""         # converted ImageNet weights (.npz, see models/pretrained.py)
  c.model.freeze_bn = False       # BatchNorm uses running statistics while training
  # Backbone options (ResNet / BN-Inception; the small CNN takes none of them):
  c.model.dtype = "float32"       # 'bfloat16': compute in bf16, float32 params and embeddings
  c.model.pooling = ""            # '' = the model's default; 'avg' | 'max' | 'avg+max'
  c.model.bn_mode = "train"       # 'frozen': running statistics fixed, affine params trained
  c.model.embedding_hidden = ()   # extra Linear+ReLU widths in the embedding head
  # How convolutions are computed (every model; the same parameters and results to rounding):
  # 'auto' | 'lax' | 'matmul' | 'lax_aligned' (dml_jax.models.conv.CONV_IMPLS)
  c.model.conv_impl = "auto"
  # BN-Inception: the RGB images are reversed to its weights' BGR (False: fed as they are, as
  # runs recorded before this key were).
  c.model.rgb_input = True

  c.loss = ml_collections.ConfigDict()
  c.loss.name = "nca"

  # Cross-batch memory (XBM; dml_jax.memory): the last memory.size embeddings of earlier steps
  # join the batch as references of pair- and triplet-based objectives. 0 = off.
  c.memory = ml_collections.ConfigDict()
  c.memory.size = 0
  c.memory.start_step = 0               # used and filled from this 0-based step on
  c.memory.reference_gradient = True    # False: the batch's own references are detached (PML)

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adam"       # 'adam' | 'sgd' (with momentum) | 'rmsprop'
  c.optimizer.learning_rate = 1e-3
  c.optimizer.momentum = 0.9      # sgd and rmsprop (label-noise configs set 0)
  c.optimizer.weight_decay = 0.0
  # 'coupled': L2 added to the gradient before the optimizer (torch.optim's weight_decay, what
  # the papers' code did); 'decoupled': AdamW (adam only), decay multiplied by the rate.
  c.optimizer.weight_decay_mode = "coupled"
  c.optimizer.schedule = "constant"   # 'constant' | 'step' | 'cosine'
  c.optimizer.decay_steps = (0,)  # 'step': multiply the rate by decay_factor at these steps
  c.optimizer.decay_epochs = ()   # 'step': also decay at these epochs (papers: (20, 30))
  c.optimizer.decay_factor = 0.1
  c.optimizer.warmup_steps = 0
  c.optimizer.objective_learning_rate = 0.0   # objective parameters (beta, proxies); 0: same
  c.optimizer.decay_objective = True   # weight_decay on the objective's parameters too
  c.optimizer.backbone_learning_rate = 0.0    # per-part rates (0: learning_rate)
  c.optimizer.head_learning_rate = 0.0

  c.eval = ml_collections.ConfigDict()
  c.eval.ks = (1, 2, 4, 8)        # Recall@K; () = evaluation.protocols.DEFAULT_KS[dataset]
  # Protocols 'split[:label_set][@gallery_split]': 'test' (query = gallery, self excluded),
  # 'train:digit' (other labels), 'query@gallery' (In-Shop), 'test@train' (train as gallery).
  c.eval.splits = ("test",)
  c.eval.similarity = "cosine"    # kNN similarity: 'cosine' | 'dot' | 'neg_sq_euclidean'
  c.eval.batch_size = 512
  # + 'spectral_decay' adds rho (Roth et al.); 'mrr', 'ami', 'f1' the mean reciprocal rank, the
  # adjusted mutual information and the pairwise F1 (docs/evaluation.md)
  c.eval.metrics = ("retrieval", "clustering")
  c.eval.overcluster = 0          # > 0 adds NMI+ with k = overcluster * classes
  c.eval.kmeans_n_init = 10       # k-means restarts of NMI / NMI+ (seeded with c.seed)
  c.eval.kmeans = "jax"           # 'jax' (on the device) | 'sklearn' (its KMeans, as before)
  c.eval.rho_skip = 0             # largest singular values left out of rho
  c.eval.plot = True              # PNG scatter of the test embedding (PCA when D > 2)
  c.eval.retrieval_grid = 0       # > 0: PNG of this many queries of the first protocol and
  c.eval.retrieval_grid_k = 8     # their top-k gallery images, at every evaluation
  c.eval.retrieval_grid_queries = "random"   # 'random' (seeded by c.seed) | 'worst' (lowest AP)
  # Evaluation cache (dml_jax/data/eval_cache.py): each evaluated image split decoded once into
  # its uint8 centre crops, the same inputs bit for bit. 'auto' (a memory map in
  # <workdir>/data_cache/, reused by later evaluations and eval.py, when a split fits
  # data.cache_max_gb, else decode at every evaluation), 'memory', 'mmap' or 'none'.
  c.eval.cache = "auto"

  # Where metrics go besides metrics.jsonl (dml_jax.run.writers); process 0 only.
  c.log = ml_collections.ConfigDict()
  c.log.tensorboard = True        # event files under <workdir>/tensorboard/ (tensorboardX)
  c.log.wandb = False             # Weights & Biases (needs: pip install wandb)
  c.log.wandb_project = "dml_jax"
  return c
