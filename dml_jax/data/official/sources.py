"""Where each benchmark comes from: its official files, addresses, checksums and the
published counts that ``python -m dml_jax.data.prepare`` checks.

The addresses and checksums are those of the files as their authors distribute them (the
same files TFDS's builders download). A ``--mirror`` replaces the address up to the file name.
"""

from __future__ import annotations

import dataclasses

# Published images per class of MNIST (LeCun et al.), digits 0..9.
MNIST_TRAIN_PER_DIGIT = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)
MNIST_TEST_PER_DIGIT = (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009)


@dataclasses.dataclass(frozen=True)
class Archive:
  """One file of a dataset's official distribution.

  Attributes:
    filename: the file's name as distributed (and as saved in ROOT).
    url: its official address ('' = none is live).
    sha256: SHA-256 of the file as distributed ('' = unknown).
    content_md5: MD5 of its decompressed content (gzip files, which mirrors recompress);
      either checksum accepts the file.
    extract: unpack it into ROOT after the download (tar or zip), then delete it.
    provides: paths relative to ROOT of which one exists once the archive is in place
      (extracted or not); then the archive is not needed.
  """

  filename: str
  url: str
  sha256: str = ""
  content_md5: str = ""
  extract: bool = False
  provides: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Expected:
  """Published counts of one part (split as distributed).

  Attributes:
    images: number of images.
    classes: number of distinct values of ``feature``.
    feature: the class feature counted (the part's ``values`` key).
    per_class: images per class: one int for all classes, a tuple indexed by class id, or
      None (not published).
  """

  images: int
  classes: int
  feature: str = "label"
  per_class: int | tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Source:
  """A benchmark's official distribution.

  Attributes:
    title: the dataset's name for messages.
    homepage: where its authors distribute it.
    layout: what ROOT holds (for error messages and the README).
    archives: the files ``prepare --download`` fetches (empty: no live official address).
    expected: ``part name -> Expected`` published counts.
    note: what to do when there is no live address, or other advice.
  """

  title: str
  homepage: str
  layout: str
  archives: tuple[Archive, ...]
  expected: dict[str, Expected]
  note: str = ""


_OMNIGLOT = "https://github.com/brendenlake/omniglot/raw/master/python/"
_MNIST = "https://storage.googleapis.com/cvdf-datasets/mnist/"
_FLOWERS = "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/"
_CARS = "http://ai.stanford.edu/~jkrause/car196/"



def _mnist(stem: str, sha256: str, content_md5: str) -> Archive:
  """One MNIST file: ``stem.gz`` at the HTTPS copy; ``stem`` (unzipped) also provides it."""
  return Archive(stem + ".gz", _MNIST + stem + ".gz", sha256, content_md5,
                 provides=(stem + ".gz", stem))


def _cars(filename: str, provides: str, sha256: str) -> Archive:
  """One file of the Cars196 devkit release (no live address; ``cars_annos.mat`` of the
  all-in-one release makes it unnecessary)."""
  return Archive(filename, "", sha256, extract=filename.endswith(".tgz"),
                 provides=(provides, "cars_annos.mat"))


MNIST = Source(
    title="MNIST", homepage="http://yann.lecun.com/exdb/mnist/",
    layout="train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
           "t10k-labels-idx1-ubyte (each .gz or not)",
    archives=(
        _mnist("train-images-idx3-ubyte",
               "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
               "6bbc9ace898e44ae57da46a324031adb"),
        _mnist("train-labels-idx1-ubyte",
               "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
               "a25bea736e30d166cdddb491f175f624"),
        _mnist("t10k-images-idx3-ubyte",
               "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
               "2646ac647ad5339dbf082846283269ea"),
        _mnist("t10k-labels-idx1-ubyte",
               "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
               "27ae3e4e09519cfbb04c329615203637"),
    ),
    expected={"train": Expected(60_000, 10, per_class=MNIST_TRAIN_PER_DIGIT),
              "test": Expected(10_000, 10, per_class=MNIST_TEST_PER_DIGIT)},
    note="LeCun's page serves plain HTTP only and often refuses downloads; --download uses "
         f"the HTTPS copy that TFDS uses, {_MNIST} (identical decompressed files).")

SOURCES: dict[str, Source] = {
    "omniglot": Source(
        title="Omniglot", homepage="https://github.com/brendenlake/omniglot",
        layout="images_background.zip and images_evaluation.zip, or the extracted "
               "images_background/ and images_evaluation/ folders",
        archives=(
            Archive("images_background.zip", _OMNIGLOT + "images_background.zip",
                    "ad41ab679c8b5d90b271ef46be6987cc81211774a695c29dcc5367b2b26ee640",
                    provides=("images_background.zip", "images_background")),
            Archive("images_evaluation.zip", _OMNIGLOT + "images_evaluation.zip",
                    "1f61a8f3366785b057fc117d9228e78a16e3d976c8953b2a10fcc74cf0609cee",
                    provides=("images_evaluation.zip", "images_evaluation")),
        ),
        expected={"train": Expected(19_280, 964, per_class=20),
                  "test": Expected(13_180, 659, per_class=20)}),
    "mnist": MNIST,
    "mnist_evenodd": MNIST,
    "cub": Source(
        title="CUB-200-2011", homepage="https://www.vision.caltech.edu/datasets/cub_200_2011/",
        layout="CUB_200_2011/ with images.txt, image_class_labels.txt, classes.txt, images/",
        archives=(Archive(
            "CUB_200_2011.tgz",
            "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz?download=1",
            "0c685df5597a8b24909f6a7c9db6d11e008733779a671760afef78feb49bf081", extract=True,
            provides=("CUB_200_2011/images.txt", "images.txt")),),
        expected={"all": Expected(11_788, 200)}),
    "cars196": Source(
        title="Stanford Cars (Cars196)",
        homepage="https://ai.stanford.edu/~jkrause/cars/car_dataset.html",
        layout="cars_annos.mat and car_ims/ (the all-in-one release), or the devkit layout: "
               "cars_train/, cars_test/, devkit/cars_train_annos.mat, "
               "cars_test_annos_withlabels.mat",
        archives=(
            _cars("cars_train.tgz", "cars_train",
                  "512b227b30e2f0a8aab9e09485786ab4479582073a144998da74d64b801fd288"),
            _cars("cars_test.tgz", "cars_test",
                  "bffea656d6f425cba3c91c6d83336e4c5f86c6cffd8975b0f375d3a10da8e243"),
            _cars("car_devkit.tgz", "devkit/cars_train_annos.mat",
                  "b97deb463af7d58b6bfaa18b2a4de9829f0f79e8ce663dfa9261bf7810e9accd"),
            _cars("cars_test_annos_withlabels.mat", "cars_test_annos_withlabels.mat",
                  "790f75be8ea34eeded134cc559332baf23e30e91367e9ddca97d26ed9b895f05"),
        ),
        expected={"train": Expected(8_144, 196), "test": Expected(8_041, 196)},
        note=f"Cars196 has no live official address: its files at {_CARS} and "
             "ai.stanford.edu/~jkrause/cars/ are offline (TFDS's builder fails there too). "
             "Get cars_train.tgz, cars_test.tgz, car_devkit.tgz and "
             "cars_test_annos_withlabels.mat (or the all-in-one car_ims.tgz + "
             "cars_annos.mat) from a mirror (e.g. the copies on Kaggle or the Internet "
             "Archive) and put them in ROOT (extract the .tgz files), or pass --mirror=URL "
             "of a server that holds the four devkit files (they are checked against the "
             "official SHA-256)."),
    "sop": Source(
        title="Stanford Online Products",
        homepage="https://cvgl.stanford.edu/projects/lifted_struct/",
        layout="Stanford_Online_Products/ with Ebay_train.txt, Ebay_test.txt and the class "
               "folders",
        archives=(Archive(
            "Stanford_Online_Products.zip",
            "ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",
            "b04fa78210e69fab050ce73939550e1cd0f96890bdd98ec9fee732c3b756ef48", extract=True,
            provides=("Stanford_Online_Products/Ebay_train.txt", "Ebay_train.txt")),),
        expected={"train": Expected(59_551, 11_318, feature="class_id"),
                  "test": Expected(60_502, 11_316, feature="class_id")},
        note="The only official address is FTP (no HTTPS); if it does not answer, get "
             "Stanford_Online_Products.zip from a mirror and pass --mirror=URL, or unzip it "
             "into ROOT."),
    "flowers102": Source(
        title="Oxford 102 Flowers", homepage="https://www.robots.ox.ac.uk/~vgg/data/flowers/102/",
        layout="jpg/, imagelabels.mat, setid.mat",
        archives=(
            Archive("102flowers.tgz", _FLOWERS + "102flowers.tgz",
                    "2d01ecc807db462958cfe3d92f57a8c252b4abd240eb955770201e45f783b246",
                    extract=True, provides=("jpg",)),
            Archive("imagelabels.mat", _FLOWERS + "imagelabels.mat",
                    "4903e94206bac23bf772aadf06451916df56b58fc483a62db32a97b82656651d",
                    provides=("imagelabels.mat",)),
            Archive("setid.mat", _FLOWERS + "setid.mat",
                    "46b8678f91fd95d3c8f4feab80d271a6c834a1dd896fe29fd3e6ad9ce5c8dccd",
                    provides=("setid.mat",)),
        ),
        expected={"train": Expected(1_020, 102, per_class=10),
                  "validation": Expected(1_020, 102, per_class=10),
                  "test": Expected(6_149, 102)}),
}
