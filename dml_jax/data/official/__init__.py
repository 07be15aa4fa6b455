"""Readers of the benchmarks' official files: no TensorFlow, no download at run time.

``read_parts(name, root)`` reads the files of benchmark ``name`` in the folder ``root`` as
their authors distribute them and returns its parts (``split_protocols.Part``: published splits,
records and TFDS-named features); ``split_protocols.make_splits`` makes the same DML splits from
them as from TFDS (``catalog.load_benchmark`` does both, ``data.name`` + ``data.options.root``):

=================  ===========================================================================
name               ROOT holds
=================  ===========================================================================
``omniglot``       ``images_background.zip``, ``images_evaluation.zip`` (read in place) or the
                   extracted ``images_background/``, ``images_evaluation/``
``mnist``,         ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``mnist_evenodd``  ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (``.gz`` or not)
``cub``            ``CUB_200_2011/`` (``images.txt``, ``image_class_labels.txt``,
                   ``classes.txt``, ``images/``); ROOT may be that folder
``cars196``        ``cars_annos.mat`` + ``car_ims/``, or ``cars_train/``, ``cars_test/``,
                   ``devkit/cars_train_annos.mat``, ``cars_test_annos_withlabels.mat``
``sop``            ``Stanford_Online_Products/`` (``Ebay_train.txt``, ``Ebay_test.txt``, class
                   folders); ROOT may be that folder
``flowers102``     ``jpg/``, ``imagelabels.mat``, ``setid.mat``
=================  ===========================================================================

Errors: a missing file raises ``DatasetNotPreparedError`` naming it, the folder searched and
where the dataset comes from; a file that does not parse raises ``ValueError`` with the file
and the line (or record / byte offset). Files are never rejected for their checksum.
``sources.SOURCES`` holds the addresses, checksums and published counts
(``python -m dml_jax.data.prepare``).
"""

from __future__ import annotations

from collections.abc import Callable

from dml_jax.data import split_protocols
from dml_jax.data.official import cars, cub, flowers, mnist, omniglot, sop
from dml_jax.data.official.sources import SOURCES

# name -> reader(name, root) -> {part: Part}
READERS: dict[str, Callable[[str, str], dict[str, split_protocols.Part]]] = {
    "omniglot": omniglot.read,
    "mnist": mnist.read,
    "mnist_evenodd": mnist.read,
    "cub": cub.read,
    "cars196": cars.read,
    "sop": sop.read,
    "flowers102": flowers.read,
}


def read_parts(name: str, root: str) -> dict[str, split_protocols.Part]:
  """The parts of benchmark ``name`` from its official files in ``root``.

  Raises:
    ValueError: an unknown name (listing the valid ones) or a file that does not parse.
    DatasetNotPreparedError: ``root`` or a required file is missing.
  """
  if name not in READERS:
    raise ValueError(f"No reader of official files for {name!r}; valid: "
                     f"{', '.join(READERS)}.")
  return READERS[name](name, root)


__all__ = ["READERS", "SOURCES", "read_parts"]
