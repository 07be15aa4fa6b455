"""Image-list datasets: In-Shop, Hotels-50K style lists, CSV / TSV lists and class folders.

Every loader returns ``dict[str, Split]`` whose ``images`` are ``LazyImages`` over the
*absolute file paths* of the split's rows (``images.records[i]`` is the file of row ``i``;
decoding happens on access or in the training pipeline). Each split's ``labels`` are
contiguous ``0..C-1`` (``Split`` requires it) and the original ids are kept in
``label_sets['class']`` (plus a dataset-specific alias: ``'item'`` for In-Shop, ``'hotel'``
for Hotels).

Classes that several splits share get one label space (``splits.label_spaces``; e.g. In-Shop
query and gallery, Hotels test and train).

Formats
-------
``load_inshop`` -- the DeepFashion In-shop Clothes Retrieval Benchmark (``Img/img.zip``
unzipped into ``root`` so that ``root/img/...`` exists, and ``Eval/list_eval_partition.txt``
copied to ``root``). The partition file: line 1 the number of images, line 2 the header,
then whitespace-separated ``image_name item_id evaluation_status``::

    52712
    image_name item_id evaluation_status
    img/WOMEN/Dresses/id_00000002/02_1_front.jpg   id_00000002   train
    img/WOMEN/Dresses/id_00000080/01_1_front.jpg   id_00000080   query
    img/WOMEN/Dresses/id_00000080/01_2_side.jpg    id_00000080   gallery

-> ``{'train', 'query', 'gallery'}``, ``label_sets['item'] = label_sets['class'] = 80`` for
``id_00000080``; evaluate with ``eval.splits=('query@gallery',)``.

``load_image_list`` -- a CSV (``.csv``: ``,``), TSV (``.tsv`` / ``.txt``: tab) or any
``delimiter`` (``' '``: runs of whitespace) with columns ``path,label[,split]``; ``label``
an integer, ``path`` relative to ``root`` (default: the list file's folder) or absolute::

    path,label,split
    birds/001.jpg,0,train
    birds/002.jpg,0,train
    birds/107.jpg,7,test

With a split column the splits are named by its values (any names: ``train``, ``test``,
``val``, ``query``, ``gallery``...). Without one, the classes are split class-disjointly:
the first ``train_classes`` of the sorted label values (a count, or a fraction, default
one half: the CUB / Cars convention) form ``'train'`` and the rest ``'test'``.

``load_image_folder`` -- a folder per class, ``root/<class>/<image>`` (classes split into
``'train'`` / ``'test'`` by sorted folder name, like lists without a split column), or a
folder per split, ``root/<split>/<class>/<image>`` (e.g. ``train/`` and ``test/``)::

    root/train/cat/1.jpg  root/train/dog/7.png  root/test/owl/3.jpeg

Images are the files directly in a class folder with an extension in ``IMAGE_EXTENSIONS``
(any case), sorted by name; classes are sorted by folder name, ``label_sets['class']`` is
the rank of the folder name among all class folders (``sorted`` of the names).

``load_hotels`` -- Hotels-50K style: a list as above whose split column holds ``train`` and
``test``; test images are retrieved from the training set (``eval.splits=('test@train',)``),
so test and train share the hotel label space (``label_sets['hotel']``). It is
``load_image_list`` with that split check and the shared-label check made strict.

The loaders live in ``inshop``, ``list_files`` and ``image_folders`` (shared pieces in
``image_files``); ``LOADERS`` is the plain-dict registry of them.
"""

from __future__ import annotations

from collections.abc import Callable

from dml_jax.data.image_files import IMAGE_EXTENSIONS  # pylint: disable=unused-import
from dml_jax.data.image_folders import load_digits_png, load_image_folder
from dml_jax.data.inshop import INSHOP_STATUSES, load_inshop  # pylint: disable=unused-import
from dml_jax.data.list_files import HOTELS_SPLITS, load_hotels, load_image_list  # pylint: disable=unused-import
from dml_jax.data.splits import Split


LOADERS: dict[str, Callable[..., dict[str, Split]]] = {
    "digits_png": load_digits_png,
    "inshop": load_inshop,
    "image_list": load_image_list,
    "image_folder": load_image_folder,
    "hotels": load_hotels,
}
