"""Tests of the image-list datasets: In-Shop, CSV / TSV lists, class folders, Hotels."""

import logging
import os

import numpy as np
import pytest
from PIL import Image

from dml_jax.data import image_lists
from dml_jax.data.images import LazyImages
from dml_jax.evaluation import protocols as protocols_lib

import fake_datasets

# Small images: decode at S = 8 from a shorter side of 10; mean 0 / std 1 keep x = v / 255.
OPTS = dict(image_size=8, resize_size=10, mean=(0.0,), std=(1.0,))


def colour(c):
  """The RGB colour that encodes class / item ``c`` (distinct for c in 0..12)."""
  return (10 + 20 * c, 250 - 15 * c, (70 * c) % 256)


def write_image(path, c, fmt=None):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.new("RGB", (12, 10), colour(c)).save(path, format=fmt)
  return path


def decoded_colour(split, rows):
  """Mean colour (0..255) of the decoded rows ``[len(rows), 3]``; checks shape and dtype."""
  x = split.images[np.asarray(rows)]
  assert x.dtype == np.float32 and x.shape == (len(rows), 8, 8, 3)
  return x.mean(axis=(1, 2)) * 255


def assert_rows_are_their_files(split, codes, tol=1.0):
  """Every row decodes to the colour of its code, and records are absolute paths."""
  assert isinstance(split.images, LazyImages)
  assert all(os.path.isabs(r) for r in split.images.records)
  got = decoded_colour(split, np.arange(len(split)))
  np.testing.assert_allclose(got, [colour(c) for c in codes], atol=tol)


def assert_contiguous(split):
  assert split.labels.dtype == np.int32
  np.testing.assert_array_equal(np.unique(split.labels), np.arange(split.num_classes))


def assert_same_label_space(splits, protocol, key):
  """Under ``protocol`` (as evaluate parses it), equal labels <=> equal ``key`` ids."""
  split, label_set, gallery = protocols_lib.parse_protocol(protocol, splits)
  ql = protocols_lib.protocol_labels(splits[split], label_set)
  gl = protocols_lib.protocol_labels(splits[gallery], label_set)
  qk, gk = splits[split].label_sets[key], splits[gallery].label_sets[key]
  np.testing.assert_array_equal(ql[:, None] == gl[None, :], qk[:, None] == gk[None, :])


# ------------------------------------------------------------------------------ In-Shop

# (item id, status, number of images): train items 1-3, test items 7, 9, 12.
INSHOP = [(2, "train", 2), (1, "train", 2), (3, "train", 1), (9, "query", 1), (7, "query", 2),
          (12, "gallery", 2), (7, "gallery", 1), (9, "gallery", 2), (12, "query", 1)]


def write_inshop(root, entries=INSHOP, **kwargs):
  """Images coloured by item id and the partition file; returns the item of each row."""
  return fake_datasets.write_inshop(root, entries, write_image=write_image, **kwargs)


def test_inshop_splits_labels_and_images(tmp_path):
  items = write_inshop(tmp_path)
  splits = image_lists.load_inshop(root=str(tmp_path), **OPTS)
  assert set(splits) == {"train", "query", "gallery"}
  for status, split in splits.items():
    expected = [i for i, s in items if s == status]
    np.testing.assert_array_equal(split.label_sets["item"], expected)
    np.testing.assert_array_equal(split.label_sets["class"], expected)
    assert split.name == f"inshop:{status}"
    assert_contiguous(split)
    assert_rows_are_their_files(split, expected, tol=3.0)  # JPEG
  assert [len(splits[s]) for s in ("train", "query", "gallery")] == [5, 4, 5]
  # Train: rank among train items; query / gallery: rank in the sorted union {7, 9, 12}.
  np.testing.assert_array_equal(splits["train"].labels, [1, 1, 0, 0, 2])
  np.testing.assert_array_equal(splits["query"].labels, [1, 0, 0, 2])
  np.testing.assert_array_equal(splits["gallery"].labels, [2, 2, 0, 1, 1])
  assert_same_label_space(splits, "query@gallery", "item")
  assert_same_label_space(splits, "query:item@gallery", "item")
  # Records are the absolute files of the rows, in file order.
  assert splits["query"].images.records[0] == os.path.join(
      str(tmp_path), "img/WOMEN/Dresses/id_00000009/00_query.jpg")
  x = splits["gallery"].images[np.array([0, 2])]
  assert x.shape == (2, 8, 8, 3) and x.dtype == np.float32


def test_inshop_gallery_distractor_items_keep_one_label_space(tmp_path):
  write_inshop(tmp_path, INSHOP + [(15, "gallery", 2)])
  splits = image_lists.load_inshop(root=str(tmp_path), **OPTS)
  # Query items first (7, 9, 12 -> 0, 1, 2), then the gallery-only item 15 -> 3.
  np.testing.assert_array_equal(splits["query"].labels, [1, 0, 0, 2])
  np.testing.assert_array_equal(splits["gallery"].labels, [2, 2, 0, 1, 1, 3, 3])
  assert_contiguous(splits["gallery"])
  assert_same_label_space(splits, "query@gallery", "item")


def test_inshop_query_and_gallery_must_nest(tmp_path):
  write_inshop(tmp_path, INSHOP + [(15, "gallery", 1), (16, "query", 1)])
  with pytest.raises(ValueError, match=r"1 items occur only in 'query' \(e.g. 16\).*15"):
    image_lists.load_inshop(root=str(tmp_path), **OPTS)


def test_inshop_missing_dataset_explains_how_to_get_it(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"nowhere.*does not exist.*img\.zip"):
    image_lists.load_inshop(root=str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError,
                     match=r"list_eval_partition\.txt.*does not exist.*In-shop Clothes Retrieval"
                           r".*Eval/list_eval_partition\.txt"):
    image_lists.load_inshop(root=str(tmp_path))


def test_inshop_missing_images_named_with_line_and_count(tmp_path):
  write_inshop(tmp_path)
  os.remove(tmp_path / "img/WOMEN/Dresses/id_00000001/01_train.jpg")  # line 6
  os.remove(tmp_path / "img/WOMEN/Dresses/id_00000012/00_query.jpg")
  with pytest.raises(FileNotFoundError,
                     match=r"2 of the 14 images .* missing; the first is .*id_00000001/"
                           r"01_train\.jpg' \(line 6\)\. Is img\.zip unzipped"):
    image_lists.load_inshop(root=str(tmp_path), **OPTS)
  # check_files=False defers the error to decoding.
  splits = image_lists.load_inshop(root=str(tmp_path), check_files=False, **OPTS)
  with pytest.raises(ValueError, match="01_train.jpg"):
    splits["train"].images[3]


@pytest.mark.parametrize("extra, count, match", [
    (["img/a.jpg id_00000007 val"], None, r"list_eval_partition\.txt:17: unknown "
                                          r"evaluation_status 'val'"),
    (["img/a.jpg item7 query"], None, r":17: item_id 'item7' is not of the form"),
    (["img/a.jpg id_00000007"], None, r":17: expected 3 whitespace-separated fields"),
    ([], 99, r"list_eval_partition\.txt:1: the file announces 99 images but lists 14"),
    ([], "many", r":1: the first line .* number of images, got 'many'"),
])
def test_inshop_malformed_partition_file(tmp_path, extra, count, match):
  write_inshop(tmp_path, count=count, lines_extra=extra)
  with pytest.raises(ValueError, match=match):
    image_lists.load_inshop(root=str(tmp_path), check_files=False, **OPTS)


def test_inshop_needs_all_statuses(tmp_path):
  write_inshop(tmp_path, [e for e in INSHOP if e[1] != "train"])
  with pytest.raises(ValueError, match="has no train images"):
    image_lists.load_inshop(root=str(tmp_path), **OPTS)


# ---------------------------------------------------------------------------- list files


def write_list(path, rows, header="", sep=","):
  with open(path, "w") as f:
    if header:
      f.write(header + "\n")
    for row in rows:
      f.write(sep.join(str(x) for x in row) + "\n")
  return str(path)


@pytest.fixture
def images(tmp_path):
  """``(class, relative path)``: classes 3, 5, 8, 11 with 3, 2, 2, 3 PNG / JPEG files."""
  out = []
  for c, n in ((3, 3), (5, 2), (8, 2), (11, 3)):
    for k in range(n):
      rel = f"imgs/c{c}/{k}.{'png' if k % 2 == 0 else 'JPG'}"
      write_image(str(tmp_path / rel), c, fmt="PNG" if k % 2 == 0 else "JPEG")
      out.append((c, rel))
  return out


def test_list_with_split_column(tmp_path, images):
  split_of = {3: "train", 5: "train", 8: "test", 11: "test"}
  rows = [(rel, c, split_of[c]) for c, rel in images]
  rows[1] = (str(tmp_path / rows[1][0]), 3, "train")  # an absolute path
  path = write_list(tmp_path / "list.csv", rows, header="path,label,split")
  splits = image_lists.load_image_list(path=path, **OPTS)
  assert list(splits) == ["train", "test"]
  assert [len(splits["train"]), len(splits["test"])] == [5, 5]
  for name, split in splits.items():
    codes = [c for c, _ in images if split_of[c] == name]
    np.testing.assert_array_equal(split.label_sets["class"], codes)
    assert_contiguous(split)
    assert split.name == f"list:{name}"
    assert_rows_are_their_files(split, codes, tol=3.0)
  # Class-disjoint splits: each numbers its own classes from 0.
  np.testing.assert_array_equal(splits["train"].labels, [0, 0, 0, 1, 1])
  np.testing.assert_array_equal(splits["test"].labels, [0, 0, 1, 1, 1])


def test_list_nested_val_split_shares_the_train_label_space(tmp_path, images):
  rows = [(rel, c, "train") for c, rel in images] + [(images[3][1], 5, "val"),
                                                      (images[5][1], 8, "val")]
  path = write_list(tmp_path / "list.tsv", rows, sep="\t")
  splits = image_lists.load_image_list(path=path, **OPTS)
  assert set(splits) == {"train", "val"}
  # val's classes 5, 8 come first (0, 1), then train's other classes 3, 11 (2, 3).
  np.testing.assert_array_equal(splits["val"].labels, [0, 1])
  np.testing.assert_array_equal(splits["train"].labels, [2, 2, 2, 0, 0, 1, 1, 3, 3, 3])
  assert_same_label_space(splits, "val@train", "class")
  assert_contiguous(splits["train"])


def test_list_overlapping_splits_warn_and_number_separately(tmp_path, images, caplog):
  rows = [(rel, c, "a" if c in (3, 5) else "b") for c, rel in images] + [(images[0][1], 3, "b")]
  path = write_list(tmp_path / "list.csv", rows)
  with caplog.at_level(logging.WARNING):
    splits = image_lists.load_image_list(path=path, train_split=None, **OPTS)
  assert "'a:class@b'" in caplog.text
  np.testing.assert_array_equal(splits["a"].labels, [0, 0, 0, 1, 1])
  np.testing.assert_array_equal(splits["b"].labels, [1, 1, 2, 2, 2, 0])
  assert_same_label_space(splits, "a:class@b", "class")


@pytest.mark.parametrize("train_classes, n_train", [(None, 2), (3, 3), (0.25, 1), (1.0, 4)])
def test_list_without_split_column_is_class_disjoint(tmp_path, images, train_classes, n_train):
  path = write_list(tmp_path / "list.txt", [(rel, c) for c, rel in images], sep="\t")
  splits = image_lists.load_image_list(path=path, train_classes=train_classes, **OPTS)
  classes = [3, 5, 8, 11]
  assert set(splits) == ({"train", "test"} if n_train < 4 else {"train"})
  for name, chosen in (("train", classes[:n_train]), ("test", classes[n_train:])):
    if not chosen:
      continue
    codes = [c for c, _ in images if c in chosen]
    np.testing.assert_array_equal(splits[name].label_sets["class"], codes)
    np.testing.assert_array_equal(splits[name].labels, np.searchsorted(chosen, codes))
  assert_rows_are_their_files(splits["train"], splits["train"].label_sets["class"], tol=3.0)


def test_list_root_and_whitespace_delimiter(tmp_path, images):
  os.makedirs(tmp_path / "lists")
  path = write_list(tmp_path / "lists" / "l.lst",
                    [(rel.replace("imgs/", ""), c) for c, rel in images], sep="   ")
  splits = image_lists.load_image_list(path=path, root=str(tmp_path / "imgs"), delimiter=" ",
                                       name="mine", **OPTS)
  assert splits["train"].name == "mine:train"
  assert_rows_are_their_files(splits["test"], [8, 8, 11, 11, 11], tol=3.0)


@pytest.mark.parametrize("content, kwargs, match", [
    ("path,label\na.png,0\nb.png,cat\n", {}, r"list\.csv:3: label 'cat' is not an integer"),
    ("a.png,cat\n", {}, r"list\.csv:1: label 'cat' is not an integer"),
    ("path,label\n\na.png,1.5\n", {}, r"list\.csv:3: label '1.5' is not an integer"),
    ("path,label\n", {}, r"list\.csv' has no rows"),
    ("", {}, "has no rows"),
    ("a.png,0,train,x\n", {}, r":1: expected 2 or 3 ','-separated columns .* got 4"),
    ("a.png,0,train\nb.png,1\n", {}, r":2: expected 3 ','-separated columns like the first"),
    ("a.png,0,test\nb.png,0,val\n", {}, r"no 'train' rows \(splits found: test, val\)"),
    ("a.png,0,train\n,1,train\n", {}, r":2: the path is empty"),
    ("a.png,0,train\nb.png,1,\n", {}, r":2: the split is empty"),
    ("a.png,99999999999\n", {}, r":1: label '99999999999' does not fit in int32"),
    ("a.png,0\nb.png,1\n", dict(train_classes=5), r"train_classes=5 must be in 1\.\.2"),
    ("a.png,0\nb.png,1\n", dict(train_classes=1.5), r"fraction must be in \(0, 1\]"),
    ("a.png,0,train\n", dict(train_classes=1), "applies to lists without a split column"),
])
def test_list_errors_name_file_line_and_value(tmp_path, content, kwargs, match):
  (tmp_path / "list.csv").write_text(content)
  with pytest.raises(ValueError, match=match):
    image_lists.load_image_list(path=str(tmp_path / "list.csv"), check_files=False, **kwargs)


def test_list_missing_images_and_files(tmp_path, images):
  rows = [(rel, c) for c, rel in images]
  rows.insert(2, ("imgs/nope.png", 3))
  rows.append(("imgs/gone.png", 3))
  path = write_list(tmp_path / "list.csv", rows, header="path,label")
  with pytest.raises(FileNotFoundError,
                     match=r"2 of the 12 images listed in .*list\.csv' are missing; the first "
                           r"is '.*imgs/nope\.png' \(line 4\)"):
    image_lists.load_image_list(path=path)
  with pytest.raises(FileNotFoundError, match=r"Image list file .*none\.csv' does not exist"):
    image_lists.load_image_list(path=str(tmp_path / "none.csv"))
  with pytest.raises(FileNotFoundError, match=r"Image root folder .*nowhere"):
    image_lists.load_image_list(path=path, root=str(tmp_path / "nowhere"))
  (tmp_path / "list.json").write_text("a.png,0\n")
  with pytest.raises(ValueError, match=r"delimiter .* extension '\.json'"):
    image_lists.load_image_list(path=str(tmp_path / "list.json"))


# ----------------------------------------------------------------------------- Hotels


def test_hotels_test_retrieves_from_train(tmp_path, images):
  # Train: all hotels; test: hotels 5 and 11 only (nested in train).
  rows = ([(rel, c, "train") for c, rel in images] +
          [(images[3][1], 5, "test"), (images[4][1], 5, "test"), (images[8][1], 11, "test")])
  path = write_list(tmp_path / "hotels.csv", rows, header="path,hotel_id,split")
  splits = image_lists.load_hotels(path=path, **OPTS)
  assert set(splits) == {"train", "test"} and splits["test"].name == "hotels:test"
  np.testing.assert_array_equal(splits["test"].labels, [0, 0, 1])
  np.testing.assert_array_equal(splits["test"].label_sets["hotel"], [5, 5, 11])
  assert_same_label_space(splits, "test@train", "hotel")
  for split in splits.values():
    assert_contiguous(split)
  assert_rows_are_their_files(splits["test"], [5, 5, 11], tol=3.0)


@pytest.mark.parametrize("rows, match", [
    ([("a.png", 1, "train"), ("b.png", 1, "val")], r"hotels\.csv:3: unknown split 'val'"),
    ([("a.png", 1), ("b.png", 1)], r"hotels\.csv:2: .* needs a third column 'split'"),
    ([("a.png", 1, "train")], "has no test rows"),
    ([("a.png", 1, "train"), ("b.png", 2, "test")], "no hotels occurs in both 'test' and"),
    ([("a.png", 1, "train"), ("b.png", 2, "train"), ("c.png", 1, "test"), ("d.png", 3, "test")],
     r"1 hotels occur only in 'test' \(e.g. 3\) and 1 only in 'train' \(e.g. 2\)"),
])
def test_hotels_errors(tmp_path, rows, match):
  path = write_list(tmp_path / "hotels.csv", rows, header="path,hotel,split")
  with pytest.raises(ValueError, match=match):
    image_lists.load_hotels(path=path, check_files=False)


# ------------------------------------------------------------------------ class folders


def test_folder_of_classes(tmp_path):
  names = ["owl", "cat", "Dog", "emu"]  # sorted: Dog, cat, emu, owl
  for k, n in enumerate(names):
    for j in range(2 + k % 2):
      write_image(str(tmp_path / "ds" / n / f"{j}.{['png', 'JPEG', 'bmp'][j]}"), k,
                  fmt=["PNG", "JPEG", "BMP"][j])
  (tmp_path / "ds" / "cat" / "notes.txt").write_text("not an image")
  os.makedirs(tmp_path / "ds" / ".hidden")
  splits = image_lists.load_image_folder(root=str(tmp_path / "ds"), **OPTS)
  # Train: Dog (2 files), cat (3; notes.txt ignored) = ranks 0, 1; test: emu (3), owl (2) =
  # ranks 2, 3 -> labels 0, 1.
  np.testing.assert_array_equal(splits["train"].label_sets["class"], [0, 0, 1, 1, 1])
  np.testing.assert_array_equal(splits["train"].labels, [0, 0, 1, 1, 1])
  np.testing.assert_array_equal(splits["test"].label_sets["class"], [2, 2, 2, 3, 3])
  np.testing.assert_array_equal(splits["test"].labels, [0, 0, 0, 1, 1])
  assert splits["test"].name == "ds:test"
  assert_rows_are_their_files(splits["train"], [2, 2, 1, 1, 1], tol=3.0)
  assert_rows_are_their_files(splits["test"], [3, 3, 3, 0, 0], tol=3.0)
  three = image_lists.load_image_folder(root=str(tmp_path / "ds"), train_classes=0.75, **OPTS)
  assert [three["train"].num_classes, three["test"].num_classes] == [3, 1]
  assert set(image_lists.load_image_folder(root=str(tmp_path / "ds"), train_classes=4)) == {
      "train"}


def test_folder_of_splits_shares_nested_label_spaces(tmp_path):
  for split, classes in (("train", ["a", "b"]), ("test", ["c", "d"]),
                         ("query", ["d"]), ("gallery", ["c", "d"])):
    for c in classes:
      for j in range(2):
        write_image(str(tmp_path / split / c / f"{j}.png"), ord(c) - ord("a"))
  splits = image_lists.load_image_folder(root=str(tmp_path), name="f", **OPTS)
  assert set(splits) == {"train", "test", "query", "gallery"}
  np.testing.assert_array_equal(splits["train"].label_sets["class"], [0, 0, 1, 1])
  np.testing.assert_array_equal(splits["test"].labels, [1, 1, 0, 0])  # d first (query's)
  np.testing.assert_array_equal(splits["query"].labels, [0, 0])
  assert_same_label_space(splits, "query@gallery", "class")
  assert_same_label_space(splits, "query@test", "class")
  for split in splits.values():
    assert_contiguous(split)
  assert_rows_are_their_files(splits["gallery"], [2, 2, 3, 3])


def test_folder_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere.*ROOT/<class>/<image>"):
    image_lists.load_image_folder(root=str(tmp_path / "nowhere"))
  os.makedirs(tmp_path / "empty")
  with pytest.raises(ValueError, match="has no class folder"):
    image_lists.load_image_folder(root=str(tmp_path / "empty"))
  write_image(str(tmp_path / "ds" / "a" / "0.png"), 0)
  os.makedirs(tmp_path / "ds" / "b")
  (tmp_path / "ds" / "b" / "x.txt").write_text("")
  with pytest.raises(ValueError, match=r"Class folder .*ds/b' has no image"):
    image_lists.load_image_folder(root=str(tmp_path / "ds"))
  with pytest.raises(ValueError, match="Unknown layout 'flat'"):
    image_lists.load_image_folder(root=str(tmp_path / "ds"), layout="flat")
  write_image(str(tmp_path / "sp" / "train" / "a" / "0.png"), 0)
  write_image(str(tmp_path / "sp" / "test" / "1.png"), 0)
  with pytest.raises(ValueError, match=r"Split folder .*test' holds image files directly"):
    image_lists.load_image_folder(root=str(tmp_path / "sp"), layout="splits")


def test_loaders_registry():
  assert image_lists.LOADERS == {"inshop": image_lists.load_inshop,
                                 "image_list": image_lists.load_image_list,
                                 "image_folder": image_lists.load_image_folder,
                                 "hotels": image_lists.load_hotels,
                                 "digits_png": image_lists.load_digits_png}


def test_missing_digits_png_folder_says_how_to_write_it(tmp_path):
  from dml_jax.data import image_lists  # pylint: disable=import-outside-toplevel
  from dml_jax.data.images import DatasetNotPreparedError  # pylint: disable=import-outside-toplevel
  root = str(tmp_path / "digits_png")
  with pytest.raises(DatasetNotPreparedError,
                     match=r"digits_png does not exist; .*digits.write_digit_images\("):
    image_lists.load_digits_png(root=root, image_size=32)
