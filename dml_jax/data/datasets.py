"""The dataset registry: ``name -> loader`` returning ``dict[str, Split]``.

* in memory, no download: ``digits_evenodd``, ``digits`` (scikit-learn's 8x8 digits);
* the benchmarks (``catalog.NAMES``): ``cub``, ``cars196``, ``sop``, ``omniglot``,
  ``mnist_evenodd``, ``mnist``, ``flowers102``, read from their official files with the option
  ``root`` (``official``) or else from a TFDS ``data_source`` (``tfds_datasets``);
* image lists (``image_lists``): ``inshop``, ``image_list`` (CSV/TSV), ``image_folder``,
  ``hotels``.

Image datasets (``IMAGE_DATASETS``) take the ``ImageOptions`` keywords (``image_size``,
``resize_size``, ``channels``, ``mean``, ``std``) besides their own options.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from dml_jax.data import catalog, digits, image_lists
from dml_jax.data.splits import Split

DATASETS: dict[str, Callable[..., dict[str, Split]]] = {
    "digits_evenodd": digits.load_digits_evenodd,
    "digits": digits.load_digits_split,
    **{name: functools.partial(catalog.load_benchmark, name) for name in catalog.NAMES},
    **image_lists.LOADERS,
}

IMAGE_DATASETS = frozenset(catalog.NAMES) | frozenset(image_lists.LOADERS)


def load(name: str, **kwargs) -> dict[str, Split]:
  """Loads the dataset ``name`` from ``DATASETS``: ``DATASETS[name](**kwargs)``.

  Raises:
    ValueError: ``name`` is not registered (the message lists the valid names), a required
      option is missing or empty (e.g. an image list's ``path``), or an option the loader
      does not take (naming it and the loader's options).
  """
  if name not in DATASETS:
    raise ValueError(f"Unknown dataset {name!r}; valid names: {', '.join(sorted(DATASETS))}.")
  loader = DATASETS[name]
  signature = inspect.signature(loader)
  required = [p for p, v in signature.parameters.items()
              if v.default is inspect.Parameter.empty and v.kind is v.KEYWORD_ONLY]
  missing = [p for p in required if kwargs.get(p) in (None, "")]
  if missing:
    raise ValueError(f"Dataset {name!r} needs {', '.join(missing)}: set "
                     + " ".join(f"--config.data.options.{p}=<value>" for p in missing))
  try:
    bound = signature.bind(**kwargs)
  except TypeError as e:
    raise ValueError(f"Dataset {name!r} got bad options {sorted(kwargs)}: {e}. Its options: "
                     f"{', '.join(signature.parameters)}.") from None
  return loader(*bound.args, **bound.kwargs)

