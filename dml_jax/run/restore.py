"""A run's model and evaluation data from its config, and ``restore_model(workdir)``: the model
of a workdir's checkpoint with the data it is evaluated on.

Restoring builds the dataset's splits and the model only: no sampler, objective or optimizer,
and it reads only the parameters and batch statistics of the checkpoint
(``checkpointing.restore(..., partial=True)``), so every checkpoint ``train.py`` wrote
restores, whatever its optimizer state. ``training.build`` builds its model and data with the
same functions, so the restored model is the trained one.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any, Callable

from flax import nnx
import jax
import ml_collections
import numpy as np

from dml_jax import data as data_lib
from dml_jax import models
from dml_jax.run import overrides
from dml_jax.data import noise as noise_lib
from dml_jax.data import splits as splits_lib
from dml_jax.evaluation import compute
from dml_jax.run import checkpointing
from dml_jax.run import config as config_lib
from dml_jax.run import workdir as workdir_lib


def input_options(model_name: str, image_shape) -> dict:
  """``image_size`` / ``in_channels`` for models whose layers depend on the input shape (the
  small CNN's dense layer), from the train images ``[N, H, W, C]``."""
  if model_name not in models.MODELS:
    return {}
  params = inspect.signature(models.MODELS[model_name].__init__).parameters
  options = {}
  if "image_size" in params:
    options["image_size"] = tuple(int(d) for d in image_shape[1:3])
  if "in_channels" in params:
    options["in_channels"] = int(image_shape[3])
  return options


def dataset_options(data: ml_collections.ConfigDict) -> dict:
  """Keyword arguments of the dataset loader: ``data.options`` plus, for image datasets, the
  ``ImageOptions`` keys (``resize_size`` 0 means ``round(image_size * 8 / 7)``, 256 for 224)."""
  options = data.options.to_dict()
  if data.name in data_lib.IMAGE_DATASETS:
    options.update(image_size=data.image_size,
                   resize_size=data.resize_size or round(data.image_size * 8 / 7),
                   channels=data.channels, mean=tuple(data.mean), std=tuple(data.std))
  return options


def load_splits(config: ml_collections.ConfigDict) -> dict:
  """``{name: Split}`` of ``config.data`` as the run sees them: the training split by
  ``data.train_label_set`` (``data.splits.relabel``) with its label noise or clean subset
  (``data.noise``); checks ``config.eval`` against them."""
  splits = dict(data_lib.load(config.data.name, **dataset_options(config.data)))
  train = splits_lib.relabel(splits["train"], config.data.train_label_set,
                             key="config.data.train_label_set")
  splits["train"] = noise_lib.prepare_train_split(
      train, label_noise=config.data.label_noise,
      clean_fraction=config.data.clean_fraction, seed=config.data.noise_seed)
  config_lib.validate(config, splits)
  return splits


def make_model(config: ml_collections.ConfigDict, image_shape, key: jax.Array, *,
               pretrained: bool = True) -> nnx.Module:
  """``config.model`` initialised with ``key`` for images ``[N, H, W, C]``, with the
  ``model.pretrained`` backbone weights when ``pretrained``."""
  model = models.make(config.model.name, embedding_dim=config.model.embedding_dim,
                      normalize=config.model.normalize, rngs=nnx.Rngs(params=key),
                      **config_lib.model_options(config.model),
                      **input_options(config.model.name, image_shape))
  if pretrained and config.model.pretrained:
    models.load_pretrained(model, config.model.pretrained)
  return model


def make_embed_fn(graphdef: Any) -> Callable:
  """``embed(variables, images [B,H,W,C]) -> embeddings [B, D]`` of the model ``graphdef``
  (eval mode) with ``variables = {'params', 'batch_stats', ...}`` (a train state), jitted."""

  @jax.jit
  def embed(variables, images):
    model = nnx.merge(graphdef, variables["params"], variables["batch_stats"])
    return model(images)

  return embed


@dataclasses.dataclass(frozen=True)
class RestoredModel:
  """A workdir's model at one checkpoint and the data it is evaluated on.

  Attributes:
    config: the workdir's resolved config.
    splits: ``{name: Split}`` (``load_splits``).
    graphdef: the model's eval-mode graph.
    variables: ``{'params': nnx.State, 'batch_stats': nnx.State}`` of the checkpoint.
    step: the checkpoint's step (0: the initial parameters).
  """
  config: ml_collections.ConfigDict
  splits: dict
  graphdef: Any
  variables: dict
  step: int

  def embed_fn(self) -> Callable:
    """``embed(variables, images) -> embeddings`` (``make_embed_fn``), jitted."""
    return make_embed_fn(self.graphdef)

  def at(self, workdir: str, step: int | None = None) -> RestoredModel:
    """The same model and data with the variables of another checkpoint of ``workdir``
    (the newest readable when ``step`` is None)."""
    restored_step, variables = restore_variables(workdir, self.variables, step=step)
    return dataclasses.replace(self, variables=variables, step=restored_step)


def restore_variables(workdir: str, target: dict, *,
                      step: int | None = None) -> tuple[int, dict]:
  """``(step, {'params', 'batch_stats'})`` of a checkpoint of ``workdir`` (the newest
  readable when ``step`` is None), in the structure of ``target``'s.

  Raises:
    FileNotFoundError: no checkpoint. ValueError: ``step`` does not exist or no checkpoint is
      readable. checkpointing.CheckpointMismatchError: the config's model has other shapes.
  """
  manager = checkpointing.make_manager(workdir, partial=True)
  try:
    restored = checkpointing.restore(manager, target, step=step, partial=True)
  finally:
    manager.close()
  if restored is None:
    raise FileNotFoundError(
        f"No checkpoint in {checkpointing.checkpoint_dir(workdir)}: train first with "
        f"python train.py --config=<config> --workdir={workdir}")
  restored_step, variables, _ = restored
  return restored_step, dict(variables)


def initial_model(config: ml_collections.ConfigDict, *,
                  pretrained: bool = True) -> RestoredModel:
  """The model of ``config`` with the parameters training starts from (step 0: the seed's
  initialisation and, when ``pretrained``, the ``model.pretrained`` backbone; without it, a
  model whose variables a checkpoint replaces, ``RestoredModel.at``) and its evaluation
  data; imports ``config.user_modules`` first."""
  overrides.import_user_modules(config.get("user_modules", ()), from_config=True)
  splits = load_splits(config)
  model_key, _ = jax.random.split(jax.random.key(config.seed))   # as training.build
  model = make_model(config, splits["train"].images.shape, model_key, pretrained=pretrained)
  model.eval()
  graphdef, params, batch_stats = nnx.split(model, nnx.Param, ...)
  return RestoredModel(config=config, splits=splits, graphdef=graphdef,
                       variables={"params": params, "batch_stats": batch_stats}, step=0)


def load_config(workdir: str, machine: Mapping[str, Any] | None = None):
  """The workdir's ``config.json`` with this machine's settings (``{'data.num_threads': 4}``,
  what ``cli.machine_overrides`` gives; ``{'data.options.root': '/data/cub'}``, what
  ``cli.data_location_overrides`` gives) in place of the recorded ones.

  Raises:
    ValueError: a ``data.options`` key the run's dataset does not read (e.g. a ``root`` for
      the in-memory digits).
  """
  config = workdir_lib.load_config(workdir)
  for key, value in (machine or {}).items():
    *sections, name = key.split(".")
    node = config
    for section in sections:
      node = node[section]
    if sections == ["data", "options"] and name not in node:
      raise ValueError(f"{workdir}: its dataset {config.data.name!r} reads no "
                       f"data.options.{name} (its options: {', '.join(sorted(node)) or 'none'}),"
                       f" so it takes no {name} location.")
    node[name] = value
  return config


def restore_model(workdir: str, step: int | None = None, *, at_init: bool = False,
                  machine: Mapping[str, Any] | None = None) -> RestoredModel:
  """The model of a checkpoint of ``workdir`` (the newest readable when ``step`` is None;
  the initial parameters with ``at_init``) and its evaluation data, from the workdir's
  ``config.json`` (with this machine's settings ``machine``, :func:`load_config`). Builds no
  sampler, objective or optimizer.

  Raises:
    FileNotFoundError: not a workdir, or no checkpoint. ValueError: ``step`` does not exist,
      or a bad evaluation setting. checkpointing.CheckpointMismatchError: the checkpoint does
      not fit the config's model.
  """
  model = initial_model(load_config(workdir, machine), pretrained=at_init)
  return model if at_init else model.at(workdir, step)


def embed_split(model: RestoredModel, images, *, batch_size: int | None = None,
                show_progress: bool = False) -> np.ndarray:
  """float32 ``[N, D]`` embeddings of ``images [N, H, W, C]`` with ``model``, in batches of
  ``batch_size`` (default ``config.eval.batch_size``)."""
  embed_fn = model.embed_fn()
  return compute.embed(lambda x: embed_fn(model.variables, x), images,
                       batch_size=batch_size or model.config.eval.batch_size,
                       show_progress=show_progress)
