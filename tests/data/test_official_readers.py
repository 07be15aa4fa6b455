"""The readers of the official files (``data.official``) on small generated files in each
official layout, their errors on damaged inputs, Omniglot and MNIST on the real files (in
``$DML_JAX_TEST_DATA``; skipped without it), and the same splits as the TFDS route for the same records."""

import gzip
import os
import pickle
import shutil
import zipfile
from unittest import mock

import numpy as np
import pytest

from dml_jax import data
from dml_jax.data import official, split_protocols
from dml_jax.data.official import mnist as mnist_reader
from official_files import (drawing, idx_bytes, real_data, write_cars, write_cub,
                            write_flowers, write_mnist, write_omniglot, write_sop)

GREY = dict(image_size=28, resize_size=28, channels=1, mean=(0.0,), std=(1.0,))
SMALL = dict(image_size=12, resize_size=14)


def as_pixels(images):
  """Grey float images in [0, 1] -> uint8 ``[N, H, W]``."""
  return np.round(np.asarray(images)[..., 0] * 255).astype(np.uint8)


# ------------------------------------------------------------------------------ Omniglot


@pytest.mark.parametrize("zipped", [True, False])
def test_omniglot_zips_or_folders(tmp_path, zipped):
  written = write_omniglot(str(tmp_path), zipped=zipped)
  parts = official.read_parts("omniglot", str(tmp_path))
  alphabets = sorted({a for entries in written.values() for a, _ in entries})
  for part, entries in written.items():
    np.testing.assert_array_equal(parts[part].values["alphabet"],
                                  [alphabets.index(a) for a, _ in entries])
    np.testing.assert_array_equal(parts[part].values["label"], [c - 1 for _, c in entries])
  # Records decode (once, then from the cache) to the drawing's pixels, 0 / 255.
  (_, charid), drawer = written["test"][4], 4 % 3 + 1
  for _ in range(2):
    np.testing.assert_array_equal(parts["test"].records[4],
                                  np.where(drawing(charid, drawer), 255, 0))
  assert not zipped or not any(p.is_dir() for p in tmp_path.iterdir())  # nothing extracted
  # Picklable for grain worker processes (without the open zip or the cache).
  copy = pickle.loads(pickle.dumps(parts["test"].records))
  np.testing.assert_array_equal(copy[4], parts["test"].records[4])


def test_omniglot_undecodable_drawing_is_named(tmp_path):
  write_omniglot(str(tmp_path))
  with zipfile.ZipFile(tmp_path / "images_evaluation.zip", "a") as z:
    z.writestr("images_evaluation/Zeta/character01/0099_01.png", b"not a png")
  parts = official.read_parts("omniglot", str(tmp_path))   # lazy: nothing decoded yet
  with pytest.raises(ValueError, match=r"images_evaluation\.zip:images_evaluation/Zeta/"
                     r"character01/0099_01\.png: Cannot decode the image"):
    parts["test"].records[len(parts["test"]) - 1]


def test_omniglot_splits_by_alphabet_and_character(tmp_path):
  write_omniglot(str(tmp_path), background=("Alpha", "Beta", "Zeta"), evaluation=("Gamma",))
  splits = data.load("omniglot", root=str(tmp_path), **GREY)
  train, test = splits["train"], splits["test"]
  assert (train.name, test.name) == ("omniglot:train", "omniglot:test")
  assert set(train.label_sets) == set(test.label_sets) == {"alphabet", "character", "class"}
  np.testing.assert_array_equal(train.label_sets["alphabet"], np.repeat([0, 1, 3], 6))
  np.testing.assert_array_equal(train.labels, np.repeat([0, 1, 2], 6))   # rank of alphabet
  np.testing.assert_array_equal(test.label_sets["alphabet"], np.full(6, 2))   # Gamma
  np.testing.assert_array_equal(test.label_sets["character"], np.repeat([6, 7], 3))
  np.testing.assert_array_equal(test.labels, np.repeat([0, 1], 3))   # by character
  assert isinstance(train.images, data.LazyImages) and train.images.shape[1:] == (28, 28, 1)
  x = train.images[np.arange(3)]
  assert 0.0 <= x.min() < x.max() <= 1.0


def test_omniglot_errors(tmp_path):
  with pytest.raises(data.DatasetNotPreparedError) as e:
    official.read_parts("omniglot", str(tmp_path))
  message = str(e.value)
  assert "images_background.zip" in message and str(tmp_path) in message
  assert "github.com/brendenlake/omniglot" in message
  write_omniglot(str(tmp_path))
  background = tmp_path / "images_background.zip"
  with zipfile.ZipFile(background, "a") as z:
    z.writestr("images_background/Alpha/drawing.png", b"x")
  with pytest.raises(ValueError, match=r"images_background\.zip.*drawing\.png.*characterNN"):
    official.read_parts("omniglot", str(tmp_path))
  background.write_bytes(background.read_bytes()[:200])   # a truncated download
  with pytest.raises(ValueError, match=r"images_background\.zip: not a readable zip"):
    official.read_parts("omniglot", str(tmp_path))


def test_omniglot_character_ids_must_agree(tmp_path):
  write_omniglot(str(tmp_path))
  with zipfile.ZipFile(tmp_path / "images_evaluation.zip", "a") as z:
    z.writestr("images_evaluation/Gamma/character01/0001_09.png", b"")  # id of Alpha's char 1
  with pytest.raises(ValueError, match="character id 1 .*disagrees"):
    official.read_parts("omniglot", str(tmp_path))


def test_omniglot_real_files():
  root = real_data("omniglot", "images_background.zip", "images_evaluation.zip")
  parts = official.read_parts("omniglot", root)
  train, test = parts["train"], parts["test"]
  assert (len(train), len(test)) == (19_280, 13_180)
  assert len(np.unique(train.values["alphabet"])) == 30
  assert len(np.unique(test.values["alphabet"])) == 20
  assert (train.values["label"].min(), train.values["label"].max()) == (0, 963)
  assert (test.values["label"].min(), test.values["label"].max()) == (964, 1622)
  assert np.all(np.bincount(train.values["label"])[:964] == 20)
  # Alphabet_of_the_Magi/character01/0709_01.png: 905 black pixels, the first at (34, 17).
  first = train.records[0]
  assert (train.values["alphabet"][0], train.values["label"][0]) == (0, 708)
  assert first.shape == (105, 105) and (first == 0).sum() == 905
  assert first[34, 17] == 0 and first[0, 0] == 255


# --------------------------------------------------------------------------------- MNIST


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx_files(tmp_path, gz):
  written = write_mnist(str(tmp_path), gz=gz)
  parts = official.read_parts("mnist", str(tmp_path))
  for part, (images, digits) in written.items():
    np.testing.assert_array_equal(parts[part].records, images)
    np.testing.assert_array_equal(parts[part].values["label"], digits)


def test_mnist_protocols_and_image_options(tmp_path):
  written = write_mnist(str(tmp_path), per_digit=3)
  evenodd = data.load("mnist_evenodd", root=str(tmp_path), **GREY)
  assert {s: len(v) for s, v in evenodd.items()} == {"train": 18, "test": 12, "val": 18}
  np.testing.assert_array_equal(evenodd["train"].labels, evenodd["train"].label_sets["digit"] % 2)
  np.testing.assert_array_equal(evenodd["test"].labels, evenodd["test"].label_sets["digit"] - 6)
  assert set(evenodd["train"].label_sets) == {"digit", "parity", "class"}
  # Pixels come through the image options unchanged at 28 px / mean 0 / std 1.
  train_images, train_digits = written["train"]
  rows = np.flatnonzero(train_digits <= 5)
  np.testing.assert_array_equal(as_pixels(evenodd["train"].images[np.arange(4)]),
                                train_images[rows[:4]])
  plain = data.load("mnist", root=str(tmp_path), **GREY)
  assert {s: v.num_classes for s, v in plain.items()} == {"train": 8, "test": 2, "val": 8}
  assert plain["test"].name == "mnist:test"
  custom = data.load("mnist", root=str(tmp_path), train_digits=(0, 1), test_digits=(2, 3),
                     **GREY)
  assert set(custom["test"].label_sets["digit"]) == {2, 3}
  rgb = data.load("mnist", root=str(tmp_path), image_size=32)   # RGB, ImageNet statistics
  assert rgb["train"].images[np.arange(2)].shape == (2, 32, 32, 3)
  with pytest.raises(ValueError, match="train_digits / test_digits apply to mnist"):
    data.load("cub", root=str(tmp_path), train_digits=(0, 1))


def _write(path, content, gz):
  with (gzip.open if gz else open)(path, "wb") as f:
    f.write(content)


@pytest.mark.parametrize("damage, match", [
    (lambda b: b"\x08\x03" + b[2:], r"byte 0: bad IDX magic number 08030803"),
    (lambda b: b[:-5], r"truncated: the header announces shape \(30, 28, 28\)"),
    (lambda b: b + b"\0", "has trailing bytes"),
    (lambda b: b[:6], "truncated at byte 6"),
])
def test_mnist_damaged_images(tmp_path, damage, match):
  write_mnist(str(tmp_path), gz=False)
  path = tmp_path / "train-images-idx3-ubyte"
  path.write_bytes(damage(path.read_bytes()))
  with pytest.raises(ValueError, match=f"train-images-idx3-ubyte: {match}"):
    official.read_parts("mnist", str(tmp_path))


def test_mnist_label_errors_and_truncated_gzip(tmp_path):
  write_mnist(str(tmp_path), gz=True)
  labels = np.tile(np.arange(10), 3)
  labels[7] = 10
  _write(tmp_path / "t10k-labels-idx1-ubyte.gz", idx_bytes(labels), gz=True)
  with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte\.gz: the label of record 7 "
                     r"is 10, out of range \(allowed: 0\.\.9"):
    official.read_parts("mnist_evenodd", str(tmp_path))
  _write(tmp_path / "t10k-labels-idx1-ubyte.gz", idx_bytes(labels[:29] % 10), gz=True)
  with pytest.raises(ValueError, match="has 29 labels but .*t10k-images-idx3-ubyte.gz has 30"):
    official.read_parts("mnist", str(tmp_path))
  path = tmp_path / "train-images-idx3-ubyte.gz"
  path.write_bytes(path.read_bytes()[:100])
  with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz: damaged or truncated gzip"):
    official.read_parts("mnist", str(tmp_path))


def test_mnist_missing_file_names_it_the_folder_and_the_source(tmp_path):
  write_mnist(str(tmp_path))
  os.remove(tmp_path / "t10k-images-idx3-ubyte.gz")
  with pytest.raises(data.DatasetNotPreparedError) as e:
    data.load("mnist_evenodd", root=str(tmp_path), **GREY)
  message = str(e.value)
  assert "'t10k-images-idx3-ubyte.gz' or 't10k-images-idx3-ubyte'" in message
  assert str(tmp_path) in message and "yann.lecun.com/exdb/mnist" in message
  assert "python -m dml_jax.data.prepare mnist_evenodd --root=ROOT --download" in message
  with pytest.raises(data.DatasetNotPreparedError, match="root folder .*does not exist"):
    data.load("mnist", root=str(tmp_path / "nowhere"))



@pytest.mark.parametrize("name", ["mnist", "omniglot", "cub", "cars196", "sop", "flowers102",
                                  "inshop", "image_folder", "digits_png"])
def test_a_root_that_is_a_file_is_named_as_such(tmp_path, name):
  root = tmp_path / "images.zip"
  root.write_bytes(b"PK")
  with pytest.raises(data.DatasetNotPreparedError, match=r"images\.zip'? is a file, not a folder"):
    data.load(name, root=str(root))


def test_a_list_file_that_is_a_folder_or_an_image_root_that_is_a_file_is_named(tmp_path):
  with pytest.raises(data.DatasetNotPreparedError, match=r"list file .* is a folder, not a file"):
    data.load("image_list", path=str(tmp_path))
  listed = tmp_path / "list.csv"
  listed.write_text("a.png,0\n")
  with pytest.raises(FileNotFoundError, match=r"root folder .*list\.csv' .* is a file, not a"):
    data.load("image_list", path=str(listed), root=str(listed))
  (tmp_path / "list_eval_partition.txt").mkdir()
  with pytest.raises(data.DatasetNotPreparedError, match=r"partition file .* is a folder, not a"):
    data.load("inshop", root=str(tmp_path))

def test_mnist_real_files():
  root = real_data("mnist", "train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
  parts = official.read_parts("mnist", root)
  train, test = parts["train"], parts["test"]
  assert train.records.shape == (60_000, 28, 28) and test.records.shape == (10_000, 28, 28)
  assert train.records.dtype == np.uint8
  np.testing.assert_array_equal(np.bincount(train.values["label"]),
                                official.sources.MNIST_TRAIN_PER_DIGIT)
  np.testing.assert_array_equal(np.bincount(test.values["label"]),
                                official.sources.MNIST_TEST_PER_DIGIT)
  np.testing.assert_array_equal(train.values["label"][:5], [5, 0, 4, 1, 9])
  np.testing.assert_array_equal(test.values["label"][:3], [7, 2, 1])
  np.testing.assert_array_equal(train.records[0][5:8, 12:16],
                                [[3, 18, 18, 18], [170, 253, 253, 253], [253, 253, 253, 253]])
  assert int(train.records[0].sum()) == 27525 and int(test.records[0].sum()) == 18454
  splits = split_protocols.make_splits("mnist_evenodd", parts, lambda r, s: data.LazyImages(
      r, data.ImageOptions(**GREY)))
  assert {s: len(v) for s, v in splits.items()} == {"train": 36_017, "test": 3_969,
                                                    "val": 6_031}
  np.testing.assert_array_equal(as_pixels(splits["test"].images[0:1])[0], test.records[0])


# ----------------------------------------------------------------------------------- CUB


@pytest.mark.parametrize("inner", [False, True])
def test_cub(tmp_path, inner):
  expected = write_cub(str(tmp_path))
  root = tmp_path / "CUB_200_2011" if inner else tmp_path   # ROOT: the folder or its parent
  np.testing.assert_array_equal(official.read_parts("cub", str(root))["all"].values["label"],
                                expected["all"])
  splits = data.load("cub", root=str(root), **SMALL)
  np.testing.assert_array_equal(splits["train"].label_sets["class"], np.repeat([0, 1, 2], 3))
  np.testing.assert_array_equal(splits["test"].label_sets["class"], np.repeat([100, 101, 102], 3))
  np.testing.assert_array_equal(splits["test"].labels, np.repeat([0, 1, 2], 3))
  assert splits["test"].images[np.arange(2)].shape == (2, 12, 12, 3)


@pytest.mark.parametrize("file, line, match", [
    ("images.txt", "19\n", r"images\.txt:19: expected 2 whitespace-separated fields, got 1"),
    ("image_class_labels.txt", "19 201\n", r"image_class_labels\.txt:19: the class id 201 is "
     r"out of range \(allowed: 1\.\.200\)"),
    ("images.txt", "x a.jpg\n", r"images\.txt:19: the image id 'x' is not an integer"),
])
def test_cub_malformed_lists(tmp_path, file, line, match):
  write_cub(str(tmp_path))
  with open(tmp_path / "CUB_200_2011" / file, "a") as f:
    f.write(line)
  with pytest.raises(ValueError, match=match):
    official.read_parts("cub", str(tmp_path))


def test_cub_missing_files(tmp_path):
  write_cub(str(tmp_path))
  folder = tmp_path / "CUB_200_2011"
  os.remove(folder / "images" / "002.Bird_2" / "Bird_2_0001.jpg")
  with pytest.raises(data.DatasetNotPreparedError,
                     match=r"1 of the 18 listed images are missing; the first is .*Bird_2_0001"
                     r"\.jpg' \(listed at .*images\.txt:5\)"):
    official.read_parts("cub", str(tmp_path))
  os.remove(folder / "image_class_labels.txt")
  with pytest.raises(data.DatasetNotPreparedError) as e:
    official.read_parts("cub", str(tmp_path))
  assert "'image_class_labels.txt' not found in" in str(e.value)
  assert str(folder) in str(e.value) and "cub_200_2011" in str(e.value)


# ---------------------------------------------------------------------------------- Cars


def test_cars_layouts_give_the_same_splits(tmp_path):
  labels = {}
  for layout in ("all_in_one", "devkit"):
    expected = write_cars(str(tmp_path / layout), layout=layout)
    parts = official.read_parts("cars196", str(tmp_path / layout))
    for part in ("train", "test"):
      np.testing.assert_array_equal(parts[part].values["label"], expected[part])
    splits = data.load("cars196", root=str(tmp_path / layout), **SMALL)
    labels[layout] = {s: (v.labels.tolist(), v.label_sets["class"].tolist())
                      for s, v in splits.items()}
  assert labels["all_in_one"] == labels["devkit"]
  assert sorted(set(labels["devkit"]["train"][1])) == [0, 1]
  assert sorted(set(labels["devkit"]["test"][1])) == [98, 99]


def test_cars_errors(tmp_path):
  with pytest.raises(data.DatasetNotPreparedError,
                     match=r"'cars_annos\.mat' \(all-in-one\) or 'devkit/cars_train_annos\.mat'"
                     r".*no live official address"):
    official.read_parts("cars196", str(tmp_path))
  write_cars(str(tmp_path), train=(1, 197))
  with pytest.raises(ValueError, match=r"cars_annos\.mat: the class of record 2 is 197, out of "
                     r"range \(allowed: 1\.\.196"):
    official.read_parts("cars196", str(tmp_path))
  (tmp_path / "cars_annos.mat").write_bytes(b"MATLAB 5.0 MAT-file, damaged")
  with pytest.raises(ValueError, match=r"cars_annos\.mat: not a readable MATLAB \.mat file"):
    official.read_parts("cars196", str(tmp_path))


def test_cars_devkit_missing_images_folder(tmp_path):
  write_cars(str(tmp_path), layout="devkit")
  shutil.rmtree(tmp_path / "cars_test")
  with pytest.raises(data.DatasetNotPreparedError, match="the image folder 'cars_test/'"):
    official.read_parts("cars196", str(tmp_path))


# ----------------------------------------------------------------------------------- SOP


def test_sop(tmp_path):
  expected = write_sop(str(tmp_path))
  splits = data.load("sop", root=str(tmp_path), **SMALL)
  for part in ("train", "test"):
    classes, supers = zip(*expected[part])
    np.testing.assert_array_equal(splits[part].label_sets["class"], classes)
    np.testing.assert_array_equal(splits[part].label_sets["super_class"], supers)
    np.testing.assert_array_equal(splits[part].labels,
                                  np.unique(classes, return_inverse=True)[1])


def test_sop_errors(tmp_path):
  write_sop(str(tmp_path))
  lists = tmp_path / "Stanford_Online_Products"
  with open(lists / "Ebay_test.txt", "a") as f:
    f.write("99 6 13 toaster_final/x.JPG\n")
  with pytest.raises(ValueError, match=r"Ebay_test\.txt:6: the super_class_id 13 is out of "
                     r"range \(allowed: 1\.\.12\)"):
    official.read_parts("sop", str(tmp_path))
  os.remove(lists / "Ebay_test.txt")
  with pytest.raises(data.DatasetNotPreparedError, match="'Ebay_test.txt' not found in .*"
                     "Stanford_Online_Products'.*lifted_struct"):
    official.read_parts("sop", str(tmp_path))


# ------------------------------------------------------------------------------- Flowers


def test_flowers(tmp_path):
  expected = write_flowers(str(tmp_path))
  parts = official.read_parts("flowers102", str(tmp_path))
  assert list(parts) == ["train", "validation", "test"]
  for part, labels in expected.items():
    np.testing.assert_array_equal(parts[part].values["label"], labels)
  splits = data.load("flowers102", root=str(tmp_path), **SMALL)
  assert sorted(set(splits["train"].label_sets["class"].tolist())) == [0, 1, 2]
  assert sorted(set(splits["test"].label_sets["class"].tolist())) == [51, 52, 53]
  assert len(splits["train"]) == len(splits["test"]) == 9


def test_flowers_errors(tmp_path):
  import scipy.io  # pylint: disable=import-outside-toplevel
  write_flowers(str(tmp_path))
  scipy.io.savemat(tmp_path / "imagelabels.mat", {"labels": np.array([[1] * 17 + [103]])})
  with pytest.raises(ValueError, match=r"imagelabels\.mat: the label of record 17 is 103"):
    official.read_parts("flowers102", str(tmp_path))
  scipy.io.savemat(tmp_path / "imagelabels.mat", {"labels": np.array([[1] * 18])})
  scipy.io.savemat(tmp_path / "setid.mat", {"trnid": np.array([[1]])})
  with pytest.raises(ValueError, match=r"setid\.mat: has no variable valid, tstid"):
    official.read_parts("flowers102", str(tmp_path))
  os.remove(tmp_path / "setid.mat")
  with pytest.raises(data.DatasetNotPreparedError, match="'setid.mat' not found"):
    official.read_parts("flowers102", str(tmp_path))


# ------------------------------------------------------------- the same splits as TFDS


class _Source:
  """A TFDS ``data_source`` stand-in serving a part's records as TFDS records."""

  def __init__(self, part):
    self.part = part

  def __len__(self):
    return len(self.part)

  def __getitem__(self, i):
    return {"image": self.part.records[i], **{k: v[i] for k, v in self.part.values.items()}}


@pytest.mark.parametrize("name, write", [("omniglot", write_omniglot),
                                         ("mnist_evenodd", write_mnist), ("sop", write_sop)])
def test_official_and_tfds_routes_give_the_same_splits(tmp_path, name, write):
  """Fed the same records, the TFDS route and the official route make identical splits."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  write(str(tmp_path))
  parts = official.read_parts(name, str(tmp_path))
  fake = lambda builder, split, **kwargs: _Source(parts[split])
  with mock.patch.object(tfds, "data_source", fake):
    via_tfds = data.load(name, **GREY)
  via_files = data.load(name, root=str(tmp_path), **GREY)
  assert list(via_tfds) == list(via_files)
  for split, a in via_tfds.items():
    b = via_files[split]
    assert a.name == b.name and set(a.label_sets) == set(b.label_sets)
    np.testing.assert_array_equal(a.labels, b.labels)
    for key in a.label_sets:
      np.testing.assert_array_equal(a.label_sets[key], b.label_sets[key])
    np.testing.assert_array_equal(a.images[np.arange(3)], b.images[np.arange(3)])


def test_root_and_data_dir_are_exclusive(tmp_path):
  with pytest.raises(ValueError, match="both set; set one of them"):
    data.load("cub", root=str(tmp_path), data_dir=str(tmp_path))


def test_registry_names():
  assert {"omniglot", "mnist", "mnist_evenodd", "cub", "cars196", "sop",
          "flowers102"} <= data.IMAGE_DATASETS
  assert set(official.READERS) == set(split_protocols.PROTOCOLS)
  with pytest.raises(ValueError, match="No reader of official files for 'inshop'"):
    official.read_parts("inshop", "/")
  assert mnist_reader.parse_idx(idx_bytes(np.arange(3))).tolist() == [0, 1, 2]


def test_official_route_needs_no_tensorflow_datasets(tmp_path):
  """Loading from the official files never imports TFDS (here: made unimportable)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  write_mnist(str(tmp_path / "mnist"))
  write_omniglot(str(tmp_path / "omniglot"))
  code = ("import sys\n"
          "sys.modules['tensorflow_datasets'] = sys.modules['tensorflow'] = None\n"
          "from dml_jax import data\n"
          f"for name in ('mnist_evenodd', 'omniglot'):\n"
          f"  s = data.load(name, root={str(tmp_path)!r} + '/' + name.split('_')[0], "
          "image_size=28, resize_size=28, channels=1, mean=(0.,), std=(1.,))\n"
          "  s['train'].images[0]\n"
          "print('ok')\n")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=root, check=False, env={**os.environ, "PYTHONPATH": root})
  assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
