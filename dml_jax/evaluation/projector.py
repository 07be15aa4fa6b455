"""Exporting embeddings: TensorBoard's projector format and ``.npz`` (``eval.py
--export_embeddings``).

The projector reads, from a run directory of a TensorBoard logdir,
``projector_config.pbtxt`` naming for each embedding a ``tensors.tsv`` (a row of ``D``
tab-separated numbers per point), a ``metadata.tsv`` (a header of column names, then a row
per point; a single column without the header) and optionally a sprite image (thumbnails in
row-major order on a square grid, at most 8192 pixels a side). :func:`export` writes them
under ``<workdir>/tensorboard/eval/`` (the run eval.py writes), one folder per step, and
rewrites the config to list every exported step, so ``tensorboard --logdir
<workdir>/tensorboard`` shows them.
"""

from __future__ import annotations

import glob
import math
import os
from typing import Mapping

import numpy as np

from dml_jax.evaluation import protocols as protocols_lib
from dml_jax.evaluation import retrieval_grid

CONFIG_FILE = "projector_config.pbtxt"
SPRITE_MAX_SIDE = 8192


def thumb_side(n: int, height: int, width: int) -> int:
  """Side of the sprite's thumbnails of ``n`` images ``height x width``:
  ``min(height, width, 8192 // ceil(sqrt(n)))``."""
  return min(height, width, SPRITE_MAX_SIDE // max(1, math.ceil(math.sqrt(n))))


def sprite(images, *, rows: np.ndarray | None = None, chunk: int = 512) -> tuple[np.ndarray,
                                                                                   int]:
  """The sprite of ``images`` (an ``[N, H, W, C]`` array-like, e.g. ``LazyImages``).

  Thumbnails are ``t x t`` with ``t = min(H, W, 8192 // ceil(sqrt(N)))`` pixels, decoded in
  chunks, shown as ``retrieval_grid.display_images``.

  Returns:
    ``(uint8 [g t, g t, 3], t)`` with ``g = ceil(sqrt(N))``.
  """
  from PIL import Image  # pylint: disable=import-outside-toplevel
  rows = np.arange(len(images)) if rows is None else np.asarray(rows)
  n = len(rows)
  grid = max(1, math.ceil(math.sqrt(n)))
  side = thumb_side(n, int(images.shape[1]), int(images.shape[2]))
  out = np.zeros((grid * side, grid * side, 3), np.uint8)
  for start in range(0, n, chunk):
    block = retrieval_grid.display_images(images, rows[start:start + chunk])
    for k, image in enumerate(block):
      thumb = Image.fromarray(np.round(255 * image).astype(np.uint8)).resize((side, side))
      r, c = divmod(start + k, grid)
      out[r * side:(r + 1) * side, c * side:(c + 1) * side] = np.asarray(thumb)
  return out, side


def write_tsv(path: str, embeddings: np.ndarray) -> str:
  """``embeddings [N, D]`` as ``N`` lines of ``D`` tab-separated numbers."""
  np.savetxt(path, np.asarray(embeddings, np.float32), delimiter="\t", fmt="%.6g")
  return path


def write_metadata(path: str, columns: Mapping[str, np.ndarray]) -> str:
  """A header line of the column names, then a row per point (tab-separated); one column is
  written without a header, as the projector reads a one-column file (a row per point)."""
  names = list(columns)
  with open(path, "w") as f:
    if len(names) > 1:
      f.write("\t".join(names) + "\n")
    for row in zip(*(np.asarray(columns[n]) for n in names)):
      f.write("\t".join(str(v) for v in row) + "\n")
  return path


def config_text(entries: list[dict]) -> str:
  """``projector_config.pbtxt`` text for ``[{'name', 'tensor', 'metadata', 'sprite',
  'thumb'}]`` (paths relative to the config file; sprite and thumb may be ``None``)."""
  blocks = []
  for e in entries:
    lines = ["embeddings {", f'  tensor_name: "{e["name"]}"', f'  tensor_path: "{e["tensor"]}"',
             f'  metadata_path: "{e["metadata"]}"']
    if e.get("sprite"):
      lines += ["  sprite {", f'    image_path: "{e["sprite"]}"',
                f"    single_image_dim: {e['thumb']}", f"    single_image_dim: {e['thumb']}",
                "  }"]
    blocks.append("\n".join(lines + ["}"]))
  return "\n".join(blocks) + "\n"


def export(embeddings: Mapping[str, np.ndarray], splits: Mapping, *, protocol: str,
           workdir: str, step: int, logdir: str | None = None, with_sprite: bool = True) -> dict:
  """Writes the query split of ``protocol`` at ``step`` for the projector and as ``.npz``.

  Args:
    embeddings: split name -> float ``[N, D]`` (an evaluation's embeddings).
    splits: split name -> ``Split``.
    protocol: its query split is exported with all its label sets as metadata columns.
    workdir: the run directory; ``<workdir>/embeddings_step_<N>.npz`` (``embeddings``,
      ``labels``, ``labels_<set>`` per label set, ``split``, ``step``).
    logdir: the projector run directory (default ``<workdir>/tensorboard/eval``); files in
      ``projector_step_<N>/`` and ``projector_config.pbtxt`` listing every exported step.
    with_sprite: a sprite of the images (skipped for images smaller than 2x2).

  Returns:
    ``{'npz', 'config', 'tensors', 'metadata', 'sprite' (or None)}`` paths.
  """
  split, label_set, _ = protocols_lib.parse_protocol(protocol, splits)
  emb = np.asarray(embeddings[split], np.float32)
  sp = splits[split]
  columns = {"label": protocols_lib.protocol_labels(sp, label_set)}
  columns.update({name: np.asarray(v) for name, v in sorted(sp.label_sets.items())
                  if name != label_set})
  npz = os.path.join(workdir, f"embeddings_step_{step}.npz")
  np.savez(npz, embeddings=emb, labels=columns["label"], split=split, step=step,
           **{f"labels_{k}": v for k, v in columns.items() if k != "label"})
  logdir = logdir or os.path.join(workdir, "tensorboard", "eval")
  folder = f"projector_step_{step}"
  os.makedirs(os.path.join(logdir, folder), exist_ok=True)
  paths = {"npz": npz,
           "tensors": write_tsv(os.path.join(logdir, folder, "tensors.tsv"), emb),
           "metadata": write_metadata(os.path.join(logdir, folder, "metadata.tsv"), columns),
           "sprite": None}
  if with_sprite and min(sp.images.shape[1:3]) >= 2:
    from PIL import Image  # pylint: disable=import-outside-toplevel
    image, thumb = sprite(sp.images)
    paths["sprite"] = os.path.join(logdir, folder, "sprite.png")
    Image.fromarray(image).save(paths["sprite"])
    with open(os.path.join(logdir, folder, "thumb.txt"), "w") as f:
      f.write(str(thumb))
  entries = []
  for path in sorted(glob.glob(os.path.join(glob.escape(logdir), "projector_step_*",
                                            "tensors.tsv")),
                     key=lambda p: int(p.split("projector_step_")[-1].split(os.sep)[0])):
    sub = os.path.basename(os.path.dirname(path))
    thumb_file = os.path.join(logdir, sub, "thumb.txt")
    thumb = None
    if os.path.exists(thumb_file):
      with open(thumb_file) as f:
        thumb = f.read().strip()
    entries.append({"name": f"{split} {sub.replace('projector_', '')}",
                    "tensor": f"{sub}/tensors.tsv", "metadata": f"{sub}/metadata.tsv",
                    "sprite": f"{sub}/sprite.png" if thumb else None, "thumb": thumb})
  paths["config"] = os.path.join(logdir, CONFIG_FILE)
  with open(paths["config"], "w") as f:
    f.write(config_text(entries))
  return paths
