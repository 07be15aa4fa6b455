"""Small generated datasets in the official layouts of the benchmarks (for the readers of
``dml_jax.data.official`` and ``prepare``), and the real data of the tests that read it: the
folder named by the environment variable ``DML_JAX_TEST_DATA`` (holding ``omniglot/`` and
``mnist/`` in their official formats), e.g. ``DML_JAX_TEST_DATA=/data``.

Every writer takes the dataset folder ``root`` and returns what it wrote (the expected labels
per part), so tests compare the readers against an independent description.
"""

import gzip
import io
import os
import struct
import zipfile

import numpy as np

DATA_ENV = "DML_JAX_TEST_DATA"


def real_data_root():
  """The folder of the real datasets (``$DML_JAX_TEST_DATA``), or None where it is unset."""
  root = os.environ.get(DATA_ENV, "").strip()
  return os.path.abspath(os.path.expanduser(root)) if root else None


def real_data(name, *files):
  """``$DML_JAX_TEST_DATA/<name>`` if it holds ``files``, else skip the test saying why."""
  import pytest  # pylint: disable=import-outside-toplevel
  root = real_data_root()
  if root is None:
    pytest.skip(f"the real {name} data: set {DATA_ENV} to a folder holding {name}/ in its "
                f"official format (e.g. {DATA_ENV}=/data with /data/{name}/)")
  folder = os.path.join(root, name)
  missing = [f for f in files if not os.path.exists(os.path.join(folder, f))]
  if missing:
    pytest.skip(f"the real {name} data is not at {folder} (missing {', '.join(missing)}); "
                f"{DATA_ENV}={root} must hold {name}/ in its official format")
  return folder


def _jpeg(path, seed, size=(20, 16)):
  from PIL import Image  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)


# ------------------------------------------------------------------------------ Omniglot


def drawing(charid, drawer, size=105):
  """A 1-bit drawing: black (0) bars whose position encodes ``charid`` and ``drawer``."""
  image = np.ones((size, size), bool)
  image[charid % 90: charid % 90 + 6, :] = False
  image[:, drawer * 4: drawer * 4 + 3] = False
  return image


def write_omniglot(root, *, zipped=True, background=("Alpha", "Beta"),
                   evaluation=("Gamma", "Delta"), characters=2, drawers=3):
  """``images_background`` / ``images_evaluation`` (zips without directory entries, or
  folders) of 1-bit 105 px PNGs; charids count up over background then evaluation.

  Returns:
    ``{part: [(alphabet, charid), ...]}`` in sorted path order (part 'train' = background).
  """
  from PIL import Image  # pylint: disable=import-outside-toplevel
  os.makedirs(root, exist_ok=True)
  charid, out = 0, {}
  for part, folder, alphabets in (("train", "images_background", background),
                                  ("test", "images_evaluation", evaluation)):
    members = {}
    for alphabet in alphabets:
      for c in range(1, characters + 1):
        charid += 1
        for d in range(1, drawers + 1):
          buffer = io.BytesIO()
          Image.fromarray(drawing(charid, d)).save(buffer, format="PNG")
          members[f"{folder}/{alphabet}/character{c:02d}/{charid:04d}_{d:02d}.png"] = (
              buffer.getvalue(), alphabet, charid)
    if zipped:
      with zipfile.ZipFile(os.path.join(root, folder + ".zip"), "w") as z:
        for name, (data, _, _) in members.items():
          z.writestr(name, data)
    else:
      for name, (data, _, _) in members.items():
        os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
        with open(os.path.join(root, name), "wb") as f:
          f.write(data)
    out[part] = [(members[n][1], members[n][2]) for n in sorted(members)]
  return out


# --------------------------------------------------------------------------------- MNIST


def idx_bytes(array, type_code=0x08):
  """The IDX encoding of a uint8 array."""
  array = np.asarray(array, np.uint8)
  header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
  return header + array.tobytes()


def write_mnist(root, *, per_digit=3, gz=True, size=28):
  """The four MNIST IDX files (``.gz`` or not) with ``per_digit`` train and test images of
  each digit; image ``i`` has pixel ``[0, 0] = i % 256`` and ``[1, 1] = digit * 20``.

  Returns:
    ``{part: (images uint8 [N, size, size], digits [N])}``.
  """
  os.makedirs(root, exist_ok=True)
  out = {}
  for part, prefix in (("train", "train"), ("test", "t10k")):
    digits = np.tile(np.arange(10), per_digit).astype(np.uint8)
    images = np.zeros((len(digits), size, size), np.uint8)
    images[:, 0, 0] = np.arange(len(digits)) % 256
    images[:, 1, 1] = digits * 20
    images[:, 10:18, 10:18] = 200
    for kind, array in (("images-idx3", images), ("labels-idx1", digits)):
      name = f"{prefix}-{kind}-ubyte"
      data = idx_bytes(array)
      opener = gzip.open if gz else open
      with opener(os.path.join(root, name + (".gz" if gz else "")), "wb") as f:
        f.write(data)
    out[part] = (images, digits)
  return out


# ----------------------------------------------------------------------------------- CUB


def write_cub(root, *, classes=(1, 2, 3, 101, 102, 103), per_class=3, num_classes=200):
  """``root/CUB_200_2011`` with the list files and random JPEGs of ``classes`` (1-based).

  Returns:
    ``{'all': [class - 1 per image in images.txt order]}``.
  """
  folder = os.path.join(root, "CUB_200_2011")
  os.makedirs(folder, exist_ok=True)
  names = {c: f"{c:03d}.Bird_{c}" for c in range(1, num_classes + 1)}
  with open(os.path.join(folder, "classes.txt"), "w") as f:
    f.writelines(f"{c} {n}\n" for c, n in names.items())
  images, labels, image_id = [], [], 0
  for c in classes:
    for k in range(per_class):
      image_id += 1
      rel = f"{names[c]}/Bird_{c}_{k:04d}.jpg"
      _jpeg(os.path.join(folder, "images", rel), image_id)
      images.append(f"{image_id} {rel}\n")
      labels.append(f"{image_id} {c}\n")
  with open(os.path.join(folder, "images.txt"), "w") as f:
    f.writelines(images)
  with open(os.path.join(folder, "image_class_labels.txt"), "w") as f:
    f.writelines(labels)
  return {"all": [c - 1 for c in classes for _ in range(per_class)]}


# ---------------------------------------------------------------------------------- Cars


def _struct_array(rows, fields):
  """A MATLAB struct array ``[1, N]`` (``scipy.io.savemat``) of ``rows`` (dicts)."""
  array = np.zeros((1, len(rows)), dtype=[(f, "O") for f in fields])
  for k, row in enumerate(rows):
    array[0, k] = tuple(row[f] if isinstance(row[f], str) else np.array([[row[f]]])
                        for f in fields)
  return array


def write_cars(root, *, layout="all_in_one", train=(1, 2, 99, 100), test=(1, 2, 99, 100),
               per_class=2):
  """Cars196 in the all-in-one layout (``cars_annos.mat`` + ``car_ims/``) or the devkit
  layout, with ``per_class`` images of each class (1-based) in each half.

  Returns:
    ``{'train': [class - 1, ...], 'test': [...]}`` in annotation order.
  """
  import scipy.io  # pylint: disable=import-outside-toplevel
  os.makedirs(root, exist_ok=True)
  box = {"bbox_x1": 1, "bbox_y1": 1, "bbox_x2": 10, "bbox_y2": 8}
  out, rows, k = {}, {"train": [], "test": []}, 0
  for part, classes in (("train", train), ("test", test)):
    out[part] = [c - 1 for c in classes for _ in range(per_class)]
    for i, c in enumerate(c for c in classes for _ in range(per_class)):
      k += 1
      if layout == "all_in_one":
        rel = f"car_ims/{k:06d}.jpg"
        rows[part].append({**box, "relative_im_path": rel, "class": c,
                           "test": int(part == "test")})
      else:
        rel = f"cars_{part}/{i + 1:05d}.jpg"
        rows[part].append({**box, "class": c, "fname": f"{i + 1:05d}.jpg"})
      _jpeg(os.path.join(root, rel), k)
  fields = list(box)
  if layout == "all_in_one":
    scipy.io.savemat(os.path.join(root, "cars_annos.mat"), {
        "annotations": _struct_array(rows["train"] + rows["test"],
                                     ["relative_im_path"] + fields + ["class", "test"]),
        "class_names": np.array([[f"Car {c}" for c in range(1, 197)]], dtype=object)})
  else:
    os.makedirs(os.path.join(root, "devkit"), exist_ok=True)
    for part, path in (("train", "devkit/cars_train_annos.mat"),
                       ("test", "cars_test_annos_withlabels.mat")):
      scipy.io.savemat(os.path.join(root, path), {
          "annotations": _struct_array(rows[part], fields + ["class", "fname"])})
  return out


# ----------------------------------------------------------------------------------- SOP


def write_sop(root, *, train=((1, 1), (2, 1), (3, 2)), test=((4, 2), (5, 3)), per_class=2):
  """``root/Stanford_Online_Products`` with ``Ebay_train.txt`` / ``Ebay_test.txt`` for the
  ``(class_id, super_class_id)`` pairs (1-based) and random JPEGs.

  Returns:
    ``{part: [(class_id - 1, super_class_id - 1), ...]}``.
  """
  supers = ["bicycle", "cabinet", "chair", "coffee_maker", "fan", "kettle", "lamp", "mug",
            "sofa", "stapler", "table", "toaster"]
  folder = os.path.join(root, "Stanford_Online_Products")
  os.makedirs(folder, exist_ok=True)
  out, image_id = {}, 0
  for part, pairs in (("train", train), ("test", test)):
    lines = ["image_id class_id super_class_id path\n"]
    out[part] = []
    for class_id, super_id in pairs:
      for k in range(per_class):
        image_id += 1
        rel = f"{supers[super_id - 1]}_final/{class_id}_{k}.JPG"
        _jpeg(os.path.join(folder, rel), image_id)
        lines.append(f"{image_id} {class_id} {super_id} {rel}\n")
        out[part].append((class_id - 1, super_id - 1))
    with open(os.path.join(folder, f"Ebay_{part}.txt"), "w") as f:
      f.writelines(lines)
  return out


# ------------------------------------------------------------------------------- Flowers


def write_flowers(root, *, classes=(1, 2, 3, 52, 53, 54), per_set=1):
  """``jpg/``, ``imagelabels.mat`` and ``setid.mat`` with ``per_set`` images of each class
  (1-based) in each of trnid, valid, tstid.

  Returns:
    ``{part: [class - 1, ...]}`` (parts 'train', 'validation', 'test').
  """
  import scipy.io  # pylint: disable=import-outside-toplevel
  os.makedirs(os.path.join(root, "jpg"), exist_ok=True)
  labels, sets, out = [], {"trnid": [], "valid": [], "tstid": []}, {}
  for key, part in (("trnid", "train"), ("valid", "validation"), ("tstid", "test")):
    out[part] = []
    for c in classes:
      for _ in range(per_set):
        labels.append(c)
        sets[key].append(len(labels))
        out[part].append(c - 1)
        _jpeg(os.path.join(root, "jpg", f"image_{len(labels):05d}.jpg"), len(labels))
  scipy.io.savemat(os.path.join(root, "imagelabels.mat"), {"labels": np.array([labels])})
  scipy.io.savemat(os.path.join(root, "setid.mat"),
                   {k: np.array([v]) for k, v in sets.items()})
  return out
