"""Shared helpers of the analysis tools: embeddings of a workdir's checkpoint, numpy
similarity matrices and matplotlib set-up."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from dml_jax.run import overrides
from dml_jax import similarity as sim
from dml_jax.evaluation import knn
from dml_jax.evaluation import report
from dml_jax.run import cli
from dml_jax.run import restore

SIMILARITIES = sim.KINDS


def similarity_matrix(x, y=None, *, kind: str = "cosine") -> np.ndarray:
  """float32 ``[N, M]`` similarity (higher = closer) of ``x [N, D]`` and ``y [M, D]`` (``x`` when
  None), as numpy: ``dml_jax.similarity.pairwise_similarity`` (``'cosine'``, ``'dot'`` or
  ``'neg_sq_euclidean'``; the latter on both moved by ``evaluation.knn.euclidean_shift`` of
  ``y``, as the retrieval search: the same distances, without the rounding of embeddings far
  from the origin, and the same for every block of ``x``)."""
  x = np.asarray(x, np.float32)
  y = x if y is None else np.asarray(y, np.float32)
  if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
    raise ValueError(f"Embeddings must be [N, D] and [M, D], got {x.shape} and {y.shape}.")
  y, x = knn.near_origin(kind, y, x)
  return np.array(sim.pairwise_similarity(jnp.asarray(x), jnp.asarray(y), kind=kind))


# Matplotlib with the Agg backend, and saving a figure (shared with the evaluation plots).
pyplot = report.pyplot
save = report.save


def labels_of(split, label_set: str | None) -> np.ndarray:
  """``split.labels`` or ``split.label_sets[label_set]`` (ValueError listing the sets)."""
  if not label_set:
    return np.asarray(split.labels)
  if label_set not in split.label_sets:
    raise ValueError(f"Split {split.name!r} has no label set {label_set!r}; available: "
                     f"{sorted(split.label_sets)}.")
  return np.asarray(split.label_sets[label_set])


def load_embeddings(workdir: str, *, step: int | None = None,
                    splits: Sequence[str] = ("train", "test"), batch_size: int | None = None,
                    at_init: bool = False, data: Mapping[str, str] | None = None):
  """Embeds ``splits`` with a checkpoint of ``workdir`` (newest readable when ``step`` is None),
  or with the config's initial parameters (``at_init=True``; returned step 0). ``data``: where
  the run's data files are on this machine (``{'data.options.root': DIR}``, :func:`data_paths`;
  default: the paths ``config.json`` records).

  Uses ``restore.restore_model`` (the model and the dataset's splits only) and
  ``restore.embed_split``.

  Returns:
    ``(step, {split: (embeddings float32 [N, D], Split)}, config)``.

  Raises:
    FileNotFoundError: not a workdir or no checkpoint. ValueError: unknown split or step.
  """
  model = restore.restore_model(workdir, at_init=True, machine=data)
  for name in splits:
    if name not in model.splits:
      raise ValueError(f"Unknown split {name!r}; the dataset has {sorted(model.splits)}.")
  if not at_init:
    model = model.at(workdir, step)
  out = {name: (restore.embed_split(model, model.splits[name].images, batch_size=batch_size),
                model.splits[name]) for name in splits}
  return model.step, out, model.config


def add_workdir_args(parser) -> None:
  """The flags every checkpoint tool shares: ``--workdir``, ``--step``, ``--out``."""
  parser.add_argument("--workdir", required=True, help="a directory written by train.py")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default newest)")
  parser.add_argument("--out", default=None, help="output directory (default: the workdir)")
  parser.add_argument("--at_init", action="store_true",
                      help="use the initial (untrained) parameters instead of a checkpoint")
  parser.add_argument("--module", action="append", default=[],
                      help="a module to import first (a run's own objective; those recorded "
                           "in the workdir's config are imported anyway)")
  for flag, key in cli.DATA_LOCATION_FLAGS.items():
    parser.add_argument(f"--{flag}", default=None,
                        help=f"where the run's data.options.{key} is on this machine (default: "
                             "the path config.json records)")


def data_paths(args) -> dict[str, str]:
  """``{'data.options.root': '/abs/dir', ...}`` of the data location flags that are set
  (``--data_root``, ``--data_list``, ``--data_dir``; made absolute, ``~`` expanded)."""
  return {f"data.options.{key}": os.path.abspath(os.path.expanduser(getattr(args, flag)))
          for flag, key in cli.DATA_LOCATION_FLAGS.items() if getattr(args, flag, None)}


def parse_args(parser, argv):
  """``parser.parse_args(argv)``, then quiet logs and the ``--module`` imports."""
  args = parser.parse_args(argv)
  cli.quiet_logs()
  overrides.import_user_modules(args.module)
  return args


def run(main, program: str) -> int:
  """Runs a tool's ``main()``; a user error (no workdir, bad split, ...) is one line, exit 1."""
  try:
    return main()
  except cli.USER_ERRORS as e:
    print(f"{program}: {e}", file=sys.stderr)
    return 1
