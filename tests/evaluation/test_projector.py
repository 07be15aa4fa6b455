"""Projector export: tensors.tsv / metadata.tsv / sprite / projector_config.pbtxt and .npz
parse back to the embeddings, labels and images."""

import importlib.util
import os
import re

import numpy as np
from PIL import Image

from dml_jax import data as data_lib
from dml_jax.data import image_lists
from dml_jax.evaluation import projector
from dml_jax.evaluation import retrieval_grid

import fake_datasets


def parse_config(path):
  """``[{'tensor_path': ..., 'metadata_path': ..., 'image_path': ..., 'dims': [..]}]``."""
  with open(path) as f:
    text = f.read()
  entries = []
  for block in re.findall(r"embeddings \{(.*?)\n\}", text, flags=re.S):
    fields = dict(re.findall(r'(\w+): "([^"]*)"', block))
    fields["dims"] = [int(v) for v in re.findall(r"single_image_dim: (\d+)", block)]
    entries.append(fields)
  return entries


def read_metadata(path):
  with open(path) as f:
    lines = f.read().splitlines()
  return lines[0].split("\t"), [line.split("\t") for line in lines[1:]]


def test_export_digits_parses_back(tmp_path):
  splits = data_lib.load("digits_evenodd")
  test = splits["test"]
  emb = np.random.default_rng(0).normal(size=(len(test.labels), 3)).astype(np.float32)
  paths = projector.export({"test": emb}, splits, protocol="test", workdir=str(tmp_path),
                           step=7)
  np.testing.assert_allclose(np.loadtxt(paths["tensors"], delimiter="\t"), emb, rtol=1e-5)
  header, rows = read_metadata(paths["metadata"])
  assert header == ["label"] + sorted(test.label_sets)
  assert [int(r[0]) for r in rows] == test.labels.tolist()
  digit = header.index("digit")
  assert [int(r[digit]) for r in rows] == test.label_sets["digit"].tolist()
  (entry,) = parse_config(paths["config"])
  assert entry["tensor_path"] == "projector_step_7/tensors.tsv"
  base = os.path.dirname(paths["config"])
  assert os.path.exists(os.path.join(base, entry["metadata_path"]))
  thumb = entry["dims"][0]
  with Image.open(os.path.join(base, entry["image_path"])) as sprite:
    grid = int(np.ceil(np.sqrt(len(emb))))
    assert sprite.size == (grid * thumb, grid * thumb)
  saved = np.load(paths["npz"])
  np.testing.assert_array_equal(saved["embeddings"], emb)
  np.testing.assert_array_equal(saved["labels_digit"], test.label_sets["digit"])
  # A second export adds its step to the config.
  projector.export({"test": emb}, splits, protocol="test", workdir=str(tmp_path), step=9)
  assert [e["tensor_path"] for e in parse_config(paths["config"])] == [
      "projector_step_7/tensors.tsv", "projector_step_9/tensors.tsv"]
  if importlib.util.find_spec("tensorboard") is not None:
    from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
    from tensorboard.plugins.projector import projector_config_pb2  # pylint: disable=all
    with open(paths["config"]) as f:
      config = text_format.Parse(f.read(), projector_config_pb2.ProjectorConfig())
    assert config.embeddings[1].sprite.single_image_dim == [thumb, thumb]


def test_sprite_of_a_lazy_colour_folder_is_the_images(tmp_path):
  fake_datasets.write_class_images(str(tmp_path / "ds"), classes=8, per_class=4)
  splits = image_lists.load_image_folder(root=str(tmp_path / "ds"), image_size=12,
                                         resize_size=14, channels=3, mean=(0.5,) * 3,
                                         std=(0.25,) * 3)
  images = splits["test"].images
  sprite, thumb = projector.sprite(images, chunk=5)
  assert thumb == 12 and sprite.shape == (4 * 12, 4 * 12, 3)   # 16 images on a 4x4 grid
  shown = retrieval_grid.display_images(images, np.array([5]))[0]
  np.testing.assert_allclose(sprite[12:24, 12:24] / 255.0, shown, atol=1 / 255 + 1e-6)
  assert sprite[-12:, -12:].any()


def test_sprite_thumbnails_shrink_to_fit_8192_pixels():
  assert projector.thumb_side(10_000, 100, 100) == 81      # 100 x 81 = 8100 <= 8192
  assert projector.thumb_side(3, 100, 120) == 100
  sprite, thumb = projector.sprite(np.zeros((50, 20, 20, 1), np.float32), rows=np.arange(3))
  assert thumb == 20 and sprite.shape == (40, 40, 3)


def test_single_column_metadata_has_no_header(tmp_path):
  # The projector reads a one-column metadata.tsv without a header (a row per point); with
  # more columns the first line names them.
  splits = {"test": data_lib.Split(images=np.zeros((5, 4, 4, 1), np.float32),
                                   labels=np.array([0, 1, 0, 1, 2]), name="t")}
  emb = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
  paths = projector.export({"test": emb}, splits, protocol="test", workdir=str(tmp_path),
                           step=1, with_sprite=False)
  with open(paths["metadata"]) as f:
    assert f.read().splitlines() == ["0", "1", "0", "1", "2"]
  two = projector.write_metadata(str(tmp_path / "two.tsv"), {"label": [0, 1], "digit": [3, 4]})
  with open(two) as f:
    assert f.read().splitlines() == ["label\tdigit", "0\t3", "1\t4"]
