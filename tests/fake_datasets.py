"""Small fake image datasets written to disk for the tests: In-Shop, class folders, image
lists."""

import os


def write_inshop(root, entries, *, write_image, count=None, lines_extra=()):
  """The In-Shop layout under ``root``: for each ``(item id, status, n)`` of ``entries``, n
  images ``img/WOMEN/Dresses/id_<item>/<k>_<status>.jpg`` written by ``write_image(path,
  item)``, and ``list_eval_partition.txt`` (``count`` overrides its first line,
  ``lines_extra`` are appended). Returns ``[(item, status)]`` per listed image."""
  lines, items = [], []
  for item, status, n in entries:
    for k in range(n):
      rel = f"img/WOMEN/Dresses/id_{item:08d}/{k:02d}_{status}.jpg"
      os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
      write_image(os.path.join(root, rel), item)
      lines.append(f"{rel}   id_{item:08d}   {status}")
      items.append((item, status))
  lines += list(lines_extra)
  with open(os.path.join(root, "list_eval_partition.txt"), "w") as f:
    f.write(f"{len(lines) if count is None else count}\n"
            "image_name item_id evaluation_status\n" + "\n".join(lines) + "\n")
  return items


def random_image_writer(size=(20, 16), seed=0):
  """``write(path, _)``: saves a random RGB image of ``size`` (W, H) (format by extension)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from PIL import Image  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)

  def write(path, _):
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)

  return write


def write_inshop_dataset(root, *, items=6, per_item=4, size=(20, 16)):
  """A tiny In-Shop dataset of random JPEGs under ``root``: ``items`` train items and
  ``items`` test items whose images are split between query and gallery; returns ``root``."""
  entries = [(i, "train", per_item) for i in range(items)]
  for i in range(items, 2 * items):
    entries += [(i, "query", per_item // 2), (i, "gallery", per_item - per_item // 2)]
  write_inshop(root, entries, write_image=random_image_writer(size))
  return root


def write_class_images(root, *, classes=8, per_class=4, size=(18, 14)):
  """``root/c<k>/<i>.png`` random images; returns ``[(relative path, class), ...]``."""
  write = random_image_writer(size, seed=1)
  rows = []
  for k in range(classes):
    os.makedirs(os.path.join(root, f"c{k}"), exist_ok=True)
    for i in range(per_class):
      rel = os.path.join(f"c{k}", f"{i}.png")
      write(os.path.join(root, rel), k)
      rows.append((rel, k))
  return rows


def fill_image_list_options(c, root):
  """Writes a small dataset for ``configs/image_list.py`` configs and points ``c`` at it:
  a CSV without split column (16 classes), a class folder, or a Hotels list (train / test)."""
  rows = write_class_images(root, classes=16 if c.data.name != "hotels" else 8)
  if c.data.name == "image_folder":
    c.data.options.root = root
    return c
  path = os.path.join(root, "list.csv")
  with open(path, "w") as f:
    for i, (rel, k) in enumerate(rows):
      split = (",test" if i % 4 == 3 else ",train") if c.data.name == "hotels" else ""
      f.write(f"{rel},{k}{split}\n")
  c.data.options.path = path
  return c
