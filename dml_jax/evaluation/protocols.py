"""Evaluation protocols: what is scored against what, with which labels and metrics.

A *protocol* is a string ``'split[:label_set][@gallery_split]'``:

* ``split``: the query split, embedded and scored;
* ``:label_set``: score with ``split.label_sets[label_set]`` instead of the primary labels
  (with a gallery split, the gallery uses its label set of the same name);
* ``@gallery_split``: retrieve from another split (query vs gallery, nothing excluded);
  without it the query split is its own gallery with self excluded.

The protocols of the literature:

* ``'test'``: query = gallery, self excluded (CUB, Cars, SOP);
* ``'query@gallery'``: the official query split against the gallery split (In-Shop);
* ``'test@train'``: test images retrieved from the training set, which must share the label
  space (Hotels-50K style);
* ``'test'`` and ``'test:alphabet'``: character and alphabet labels (Omniglot, EPS paper
  Table 3);
* ``'test'`` and ``'train:digit'``: unseen digits; the training digits by digit, where class
  collapse shows (digits even/odd).

Metrics of a protocol (``metrics_groups=``; config ``eval.metrics``): ``'retrieval'``
(``recall@K`` for every K, ``map@r``, ``r_precision``; query vs its gallery),
``'clustering'`` (``nmi``, plus ``nmi+`` when ``overcluster`` is set; on the query split's
embeddings) and ``'spectral_decay'`` (``rho``; on the query split's embeddings); on request
``'mrr'`` (mean reciprocal rank, from the same neighbour search), ``'ami'`` (adjusted mutual
information) and ``'f1'`` (the pairwise F1 of Song et al.), both of the clustering that gives
``nmi`` (and ``ami+`` / ``f1+`` of the one that gives ``nmi+``). With ``similarity='cosine'`` the clustering and the spectrum use the L2-normalised
embeddings (the geometry the retrieval uses).

``DEFAULT_KS`` holds the Recall@K cut-offs of the literature per dataset; ``ks=()`` selects the
dataset's list.

Model selection (``parse_selection``, ``best_step``) and the ``config.eval`` options
(``eval_options``, ``validate_eval_config``) live here too: they only name protocols and metrics.
Embedding and scoring are in ``compute``; tables, JSON and plots in ``report``.
"""

from __future__ import annotations

import os
from typing import Mapping, NamedTuple, Sequence

import jax
import ml_collections
import numpy as np

from dml_jax import hparams
from dml_jax import similarity as similarity_lib
from dml_jax.data import pipeline
from dml_jax.data import splits as splits_lib
from dml_jax.evaluation import metrics
from dml_jax.evaluation import report


# Recall@K cut-offs reported in the literature, by dataset name (TFDS and short names).
DEFAULT_KS: dict[str, tuple[int, ...]] = {
    "cub": (1, 2, 4, 8, 16, 32),
    "cub200": (1, 2, 4, 8, 16, 32),
    "caltech_birds2011": (1, 2, 4, 8, 16, 32),
    "cars": (1, 2, 4, 8, 16, 32),
    "cars196": (1, 2, 4, 8, 16, 32),
    "sop": (1, 10, 100, 1000),
    "stanford_online_products": (1, 10, 100, 1000),
    "inshop": (1, 10, 20, 30, 40, 50),
    "deepfashion_inshop": (1, 10, 20, 30, 40, 50),
    "omniglot": (1, 2, 4, 8),
    "digits_evenodd": (1, 5, 10),
    "mnist_evenodd": (1, 5, 10),
    "mnist": (1, 2, 4, 8),
    "flowers102": (1, 2, 4, 8),
    "hotels": (1, 10, 100),
    "oxford_flowers102": (1, 2, 4, 8),
}


METRIC_GROUPS = ("retrieval", "clustering", "spectral_decay", "mrr", "ami", "f1")


# The groups that need the neighbour search, and those that need the k-means clustering (in
# the order of their scores: 'clustering' is NMI's).
RETRIEVAL_GROUPS = ("retrieval", "mrr")
CLUSTERING_GROUPS = ("clustering", "ami", "f1")


DEFAULT_METRICS = ("retrieval", "clustering")


# Splits that model selection must never use (In-Shop's query and gallery are its test set).
TEST_SPLIT_NAMES = ("test", "query", "gallery")


class Protocol(NamedTuple):
  """A parsed protocol: ``split`` scored with ``label_set`` against ``gallery``."""
  split: str
  label_set: str | None = None
  gallery: str | None = None   # None: the query split is its own gallery (self excluded)


def parse_protocol(protocol: str, splits: Mapping) -> Protocol:
  """``'test:alphabet@train'`` -> ``Protocol('test', 'alphabet', 'train')``, validated.

  Raises:
    ValueError: naming the protocol, for a malformed string, an unknown split or gallery
      split, a label set one of the splits lacks, or a gallery equal to the query split.
  """
  if not isinstance(protocol, str):
    raise ValueError(f"Evaluation protocol must be a string 'split[:label_set][@gallery]', "
                     f"got {protocol!r}.")
  query_part, at, gallery = protocol.partition("@")
  split, _, label_set = query_part.partition(":")
  available = ", ".join(sorted(splits))
  if not split or (at and not gallery) or "@" in gallery or ":" in label_set:
    raise ValueError(f"Evaluation protocol {protocol!r} is malformed; the syntax is "
                     "'split[:label_set][@gallery_split]', e.g. 'test', 'train:digit', "
                     f"'query@gallery', 'test:alphabet@train'. Splits: {available}.")
  if ":" in gallery:
    raise ValueError(f"Evaluation protocol {protocol!r}: the label set goes after the query "
                     "split and applies to both sides, e.g. 'test:digit@train'.")
  for name in (split, gallery):
    if name and name not in splits:
      raise ValueError(f"Evaluation protocol {protocol!r}: unknown split {name!r}; "
                       f"available: {available}.")
  if gallery == split:
    raise ValueError(f"Evaluation protocol {protocol!r}: the gallery is the query split; use "
                     f"{query_part!r} (query = gallery with self excluded).")
  if label_set:
    for name in (split, gallery):
      if name and label_set not in splits[name].label_sets:
        raise ValueError(f"Evaluation protocol {protocol!r}: split {name!r} has no label set "
                         f"{label_set!r}; available: "
                         f"{', '.join(sorted(splits[name].label_sets)) or 'none'}.")
  if gallery and not label_set:
    splits_lib.check_shared_label_space(protocol, splits[split], splits[gallery])
  return Protocol(split, label_set or None, gallery or None)


def protocol_labels(split, label_set: str | None) -> np.ndarray:
  """The labels ``[N]`` of ``split`` under ``label_set`` (``None``: the primary labels)."""
  return split.labels if label_set is None else split.label_sets[label_set]


def default_ks(dataset: str) -> tuple[int, ...]:
  """``DEFAULT_KS[dataset]``, or a ``ValueError`` listing the known datasets."""
  if dataset not in DEFAULT_KS:
    raise ValueError(f"No default Recall@K list for dataset {dataset!r} (eval.ks is empty); "
                     f"set eval.ks, or use one of: {', '.join(sorted(DEFAULT_KS))}.")
  return DEFAULT_KS[dataset]


def check_metrics(groups: Sequence[str]) -> tuple[str, ...]:
  """``groups`` as a non-empty tuple of names from ``METRIC_GROUPS``."""
  groups = (groups,) if isinstance(groups, str) else tuple(groups)
  bad = [g for g in groups if g not in METRIC_GROUPS]
  if bad or not groups:
    raise ValueError(f"Unknown evaluation metrics {bad or groups!r}; allowed (one or more): "
                     f"{', '.join(METRIC_GROUPS)}.")
  return groups


def parse_selection(spec: str) -> tuple[str, str]:
  """``'val/recall@1'`` -> ``('val', 'recall@1')``, refusing test splits.

  Model selection ("best checkpoint") must use a validation protocol: a protocol whose query
  or gallery split is a test split (``TEST_SPLIT_NAMES`` or a name starting with ``test``)
  raises, so that numbers on the test set are never the result of selecting on it.
  """
  protocol, slash, metric = spec.partition("/")
  if not slash or not protocol or not metric:
    raise ValueError(f"Model selection {spec!r} must be 'PROTOCOL/METRIC', e.g. "
                     "'val/recall@1' or 'train:digit/map@r'.")
  if not report.is_fraction(metric):
    raise ValueError(f"Model selection metric {metric!r}: use a metric where higher is "
                     "better (recall@K, map@r, r_precision, mrr, nmi, nmi+, ami, ami+, f1, "
                     "f1+).")
  query_part, _, gallery = protocol.partition("@")
  for split in (query_part.partition(":")[0], gallery):
    if split and (split in TEST_SPLIT_NAMES or split.startswith("test")):
      raise ValueError(f"Model selection on {protocol!r} is refused: {split!r} is a test "
                       "split, and selecting the best checkpoint on the test set reports an "
                       "optimistic number. Name a validation protocol (a 'val' split, or a "
                       "training-set protocol such as 'train:digit').")
  return protocol, metric


def best_step(history: Mapping[int, Mapping[str, Mapping[str, float]]], *, protocol: str,
              metric: str) -> int:
  """The step of ``history = {step: results}`` with the highest ``results[protocol][metric]``
  (the earliest step on ties)."""
  if not history:
    raise ValueError("No evaluated checkpoint to select from.")
  for step, results in history.items():
    if protocol not in results or metric not in results[protocol]:
      raise ValueError(f"Model selection: step {step} has no {protocol}/{metric}; metrics of "
                       f"{protocol!r}: {', '.join(results.get(protocol, {})) or 'none'}.")
  return max(sorted(history), key=lambda s: history[s][protocol][metric])


# ------------------------------------------------------------------ config.eval

# Defaults of the config.eval keys that older workdir configs may lack.
EVAL_DEFAULTS = {
    "metrics": DEFAULT_METRICS,
    "rho_skip": 0,
    "kmeans_n_init": 10,
    "kmeans": "jax",
}


# The integer keys of ``config.eval`` and their smallest values (retrieval_grid 0: no grid).
EVAL_INTEGERS = {"batch_size": 1, "kmeans_n_init": 1, "rho_skip": 0, "retrieval_grid": 0}


def eval_options(config: ml_collections.ConfigDict) -> dict:
  """The keyword arguments of ``evaluate_splits`` that ``config.eval`` sets.

  Keys missing from an older ``config.json`` take ``EVAL_DEFAULTS``.
  """
  cfg = config.eval

  def get(key):
    return cfg[key] if key in cfg else EVAL_DEFAULTS[key]

  return dict(
      protocols=tuple(cfg.splits), ks=tuple(cfg.ks), similarity=cfg.similarity,
      batch_size=cfg.batch_size, overcluster=cfg.overcluster or None, seed=config.seed,
      metrics_groups=tuple(get("metrics")), rho_skip=int(get("rho_skip")),
      kmeans_n_init=int(get("kmeans_n_init")), kmeans=str(get("kmeans")),
      dataset=config.data.name, **eval_workers(config))


def eval_workers(config: ml_collections.ConfigDict) -> dict:
  """``{'num_workers', 'num_threads'}`` of the evaluation's decoding: ``data.num_workers`` and
  ``data.num_threads`` resolved as for training (``pipeline.resolve_workers``: worker
  processes on an accelerator, this process's threads on the CPU)."""
  data = config.data
  workers, threads = pipeline.resolve_workers(
      int(data.get("num_workers", 0)), int(data.get("num_threads", 8)),
      platform=jax.default_backend(), cpus=len(os.sched_getaffinity(0)))
  return {"num_workers": workers, "num_threads": threads}


def validate_eval_config(config: ml_collections.ConfigDict, splits: dict) -> None:
  """Checks ``config.eval`` against the dataset before any work (protocol names, label sets,
  metric groups, the similarity, the K list against each protocol's gallery); raises
  ``ValueError`` naming the bad value."""
  options = eval_options(config)
  for key, minimum in EVAL_INTEGERS.items():
    hparams.integer(f"eval.{key}", config.eval.get(key, EVAL_DEFAULTS.get(key, minimum)),
                    minimum=minimum)
  hparams.number("eval.overcluster", config.eval.overcluster, positive=False)   # 0: no NMI+
  parsed = {protocol: parse_protocol(protocol, splits) for protocol in options["protocols"]}
  groups = check_metrics(options["metrics_groups"])
  try:
    similarity_lib.check_kind(options["similarity"])
  except ValueError as e:
    raise ValueError(f"eval.similarity: {e}") from None
  if any(group in groups for group in RETRIEVAL_GROUPS):
    ks = (options["ks"] or default_ks(options["dataset"])) if "retrieval" in groups else (1,)
    for protocol, (split, _, gallery) in parsed.items():
      available = len(splits[gallery or split].labels) - (gallery is None)
      try:
        metrics.check_ks(ks, available)
      except ValueError as e:
        raise ValueError(f"eval.ks={ks} (protocol {protocol!r}): {e}") from None
  if "spectral_decay" in groups:   # rho leaves out the largest rho_skip of min(N, D) values
    dim = int(config.model.embedding_dim)
    for protocol, (split, _, _) in parsed.items():
      count = min(len(splits[split].labels), dim)
      if not config.eval.rho_skip < count:
        raise ValueError(f"eval.rho_skip={config.eval.rho_skip}: protocol {protocol!r} has "
                         f"min(N, D) = {count} singular values (N = {len(splits[split].labels)} "
                         f"images, D = model.embedding_dim = {dim}); use 0 to {count - 1}.")
  if options["kmeans"] not in ("jax", "sklearn"):
    raise ValueError(f"eval.kmeans={options['kmeans']!r}: allowed: 'jax' (k-means on the "
                     "device) or 'sklearn' (scikit-learn's KMeans).")
  if config.eval.get("retrieval_grid", 0):
    check_retrieval_grid(options["protocols"][0], splits,
                         num_queries=int(config.eval.retrieval_grid),
                         mode=config.eval.get("retrieval_grid_queries", "random"),
                         k=config.eval.get("retrieval_grid_k", 8),
                         what="eval.retrieval_grid", what_k="eval.retrieval_grid_k")


def check_retrieval_grid(protocol: str, splits: Mapping, *, num_queries: int,
                         mode: str = "random", k: int = 8, what: str = "--retrieval_grid",
                         what_k: str = "--grid_k") -> None:
  """A retrieval grid of ``num_queries`` queries of ``protocol``, each with its top ``k``, is
  possible: ``num_queries`` between 1 and the size of its query split, ``k`` between 1 and
  its gallery's size (the query split less the query itself when it is its own gallery),
  and ``mode`` is ``'random'`` or ``'worst'``."""
  parsed = parse_protocol(protocol, splits)
  size = len(splits[parsed.split].labels)
  if not 1 <= num_queries <= size:
    raise ValueError(f"{what}={num_queries}: the query set of protocol {protocol!r} has "
                     f"{size} images; ask for 1 to {size} queries.")
  gallery = (len(splits[parsed.gallery].labels) if parsed.gallery else size - 1)
  if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= gallery:
    raise ValueError(f"{what_k}={k!r}: the gallery of protocol {protocol!r} has {gallery} "
                     f"images; ask for a top 1 to {gallery}.")
  if mode not in ("random", "worst"):
    raise ValueError(f"Retrieval grid queries {mode!r}: use 'random' or 'worst'.")
