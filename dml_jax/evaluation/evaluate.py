"""Evaluation protocols: embed dataset splits with a model, compute metrics, write results.

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
embeddings) and ``'spectral_decay'`` (``rho``; on the query split's embeddings). With
``similarity='cosine'`` the clustering and the spectrum use the L2-normalised embeddings (the
geometry the retrieval uses).

``DEFAULT_KS`` holds the Recall@K cut-offs of the literature per dataset; ``ks=()`` selects the
dataset's list.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np
import tqdm

from dml_jax.evaluation import knn
from dml_jax.evaluation import metrics

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
METRIC_GROUPS = ("retrieval", "clustering", "spectral_decay")
DEFAULT_METRICS = ("retrieval", "clustering")
# Splits that model selection must never use (In-Shop's query and gallery are its test set).
TEST_SPLIT_NAMES = ("test", "query", "gallery")
# Metrics in [0, 1], shown in percent in tables; others (rho) are shown as they are.
_FRACTION_KEYS = ("map@r", "r_precision", "nmi", "nmi+")


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
    _check_shared_label_space(protocol, splits[split], splits[gallery])
  return Protocol(split, label_set or None, gallery or None)


def _relabelling(split) -> dict | None:
  """``{primary label: original class}`` when ``labels`` relabel ``label_sets['class']``
  one to one, else ``None`` (no ``'class'`` set, or labels that group classes)."""
  if "class" not in split.label_sets:
    return None
  pairs = np.unique(np.stack([split.labels, split.label_sets["class"]]), axis=1)
  if len(np.unique(pairs[0])) != pairs.shape[1] or len(np.unique(pairs[1])) != pairs.shape[1]:
    return None
  return dict(zip(pairs[0].tolist(), pairs[1].tolist()))


def _check_shared_label_space(protocol: str, query, gallery) -> None:
  """A query@gallery protocol compares primary labels: they must name the same classes on
  both sides (e.g. In-Shop query / gallery), not two separate numberings."""
  a, b = _relabelling(query), _relabelling(gallery)
  if a is None or b is None:
    return
  clash = [k for k in a.keys() & b.keys() if a[k] != b[k]]
  if clash:
    k = clash[0]
    raise ValueError(
        f"Evaluation protocol {protocol!r}: label {k} is class {a[k]} in {query.name!r} but "
        f"class {b[k]} in {gallery.name!r} ({len(clash)} such labels): the two splits number "
        "their classes separately. Compare the original classes with a label set, e.g. "
        f"{protocol.split('@')[0]}:class@{protocol.split('@')[1]}.")


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


def embed(embed_fn: Callable, images: np.ndarray, *, batch_size: int,
          show_progress: bool = False, desc: str = "embed") -> np.ndarray:
  """Embeds ``images [N, H, W, C]`` in batches of a fixed shape (one compilation).

  The last batch is padded with copies of the first image and the padding is dropped.
  ``embed_fn`` should be jitted (``training.make_embed_fn``); batches are dispatched
  asynchronously and fetched one batch behind.

  Returns:
    float32 ``[N, D]``.
  """
  n = len(images)
  if n == 0:
    raise ValueError("Cannot embed an empty split.")
  batch_size = min(batch_size, n)
  out = []
  for start in tqdm.tqdm(range(0, n, batch_size), disable=not show_progress, desc=desc,
                         unit="batch", dynamic_ncols=True, mininterval=0.5):
    chunk = images[start:start + batch_size]
    valid = len(chunk)
    if valid < batch_size:
      pad = np.repeat(images[:1], batch_size - valid, axis=0)
      chunk = np.concatenate([chunk, pad], axis=0)
    out.append((embed_fn(chunk), valid))
  return np.concatenate([np.asarray(e, dtype=np.float32)[:valid] for e, valid in out], axis=0)


def _feasible_overcluster(overcluster: float | None, labels: np.ndarray) -> float | None:
  """``overcluster`` if ``round(overcluster * classes)`` clusters fit the ``[N]`` labels'
  points, else ``None`` (no NMI+ for that protocol)."""
  if overcluster is None:
    return None
  if round(overcluster * np.unique(labels).shape[0]) > labels.shape[0]:
    return None
  return overcluster


def evaluate_splits(embed_fn: Callable, splits: Mapping, *, protocols: tuple[str, ...],
                    ks: tuple[int, ...], similarity: str = "cosine", batch_size: int = 512,
                    overcluster: float | None = None, seed: int = 0,
                    plot_dir: str | None = None, step: int = 0,
                    metrics_groups: Sequence[str] = DEFAULT_METRICS, rho_skip: int = 0,
                    kmeans_n_init: int = metrics.KMEANS_N_INIT, dataset: str | None = None,
                    show_progress: bool = False) -> dict[str, dict[str, float]]:
  """Retrieval, clustering and spectral metrics for each protocol.

  Each split is embedded once (batched, with ``embed_fn``) and checked for NaN / inf rows.

  Args:
    embed_fn: ``images [b, H, W, C] -> embeddings [b, D]``.
    splits: ``{name: Split}`` as returned by ``dml_jax.data.load``.
    protocols: e.g. ``('test', 'train:digit', 'query@gallery')`` (module docstring).
    ks: Recall@K values; ``()`` means ``DEFAULT_KS[dataset]``.
    similarity: kNN similarity kind (``dml_jax.similarity``).
    batch_size: embedding batch size.
    overcluster: adds NMI+ with ``overcluster * classes`` clusters to every protocol where
      that is at most the number of query points (EPS Table 3: 30x on Omniglot's 20
      languages; its 659 letters have too few drawings, so those rows report NMI only).
    seed: KMeans seed.
    plot_dir: if given, writes ``embedding_<split>_step_<step>.png`` of every embedded split.
    step: the checkpoint step (names the plot).
    metrics_groups: any of ``METRIC_GROUPS``; default ``('retrieval', 'clustering')``.
    rho_skip: largest singular values left out of ``rho`` (``metrics.spectral_decay``).
    kmeans_n_init: KMeans restarts of NMI / NMI+ (default 10).
    dataset: the dataset name for ``ks=()``; ``None`` takes it from the split names
      (``'<dataset>:<split>'``).
    show_progress: progress bars for the embedding and the neighbour search.

  Returns:
    ``{protocol: {'recall@K': ..., 'map@r': ..., 'r_precision': ..., 'nmi': ..., 'rho': ...}}``.

  Raises:
    ValueError: naming the protocol, for a bad protocol, NaN / inf embeddings (the rows are
      named), a K larger than the gallery, and the other errors of the metric functions.
  """
  groups = check_metrics(metrics_groups)
  parsed = [(p, parse_protocol(p, splits)) for p in protocols]
  if not ks and "retrieval" in groups:
    ks = default_ks(dataset or _dataset_name(splits))
  cache: dict[str, np.ndarray] = {}

  def embedding(name: str) -> np.ndarray:
    if name not in cache:
      emb = embed(embed_fn, splits[name].images, batch_size=batch_size,
                  show_progress=show_progress, desc=f"embed {name}")
      cache[name] = knn.as_embeddings(f"The embeddings of split {name!r}", emb)
    return cache[name]

  results = {}
  for protocol, (split, label_set, gallery) in parsed:
    query, labels = embedding(split), protocol_labels(splits[split], label_set)
    row = {}
    try:
      if "retrieval" in groups:
        gallery_emb = None if gallery is None else embedding(gallery)
        gallery_labels = (None if gallery is None
                          else protocol_labels(splits[gallery], label_set))
        row.update(metrics.retrieval_metrics(
            query, labels, gallery_emb, gallery_labels, ks=tuple(ks), similarity=similarity,
            show_progress=show_progress))
      geometry = _normalized(query) if similarity == "cosine" else query
      if "clustering" in groups:
        row.update(metrics.clustering_metrics(
            geometry, labels, overcluster=_feasible_overcluster(overcluster, labels),
            seed=seed, n_init=kmeans_n_init))
      if "spectral_decay" in groups:
        row["rho"] = metrics.spectral_decay(geometry, skip_largest=rho_skip)
    except ValueError as e:
      raise ValueError(f"Evaluation protocol {protocol!r}: {e}") from None
    results[protocol] = {k: float(v) for k, v in row.items()}
  if plot_dir is not None:
    for split, emb in cache.items():
      sp = splits[split]
      label_set = "digit" if "digit" in sp.label_sets else None
      colours = sp.label_sets[label_set] if label_set else sp.labels
      path = os.path.join(plot_dir, f"embedding_{split}_step_{step}.png")
      plot_embedding(emb, colours, path=path,
                     title=f"{split} embedding, step {step}, coloured by {label_set or 'label'}")
  return results


def _normalized(x: np.ndarray) -> np.ndarray:
  """Rows of ``x [N, D]`` scaled to unit L2 norm (zero rows stay zero)."""
  norm = np.linalg.norm(x, axis=1, keepdims=True)
  return x / np.maximum(norm, 1e-12)


def _dataset_name(splits: Mapping) -> str:
  """The dataset of ``Split.name = '<dataset>:<split>'`` shared by all splits."""
  names = {str(getattr(s, "name", "")).partition(":")[0] for s in splits.values()}
  if len(names) != 1:
    raise ValueError(f"eval.ks is empty and the splits do not name one dataset ({sorted(names)}"
                     "); set eval.ks.")
  return names.pop()


# ------------------------------------------------------------------------ model selection


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
  if not is_fraction(metric):
    raise ValueError(f"Model selection metric {metric!r}: use a metric where higher is "
                     "better (recall@K, map@r, r_precision, nmi, nmi+).")
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


# ------------------------------------------------------------------------------ output


def flatten(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
  """``{'test': {'recall@1': x}}`` -> ``{'eval/test/recall@1': x}`` for metrics.jsonl."""
  return {f"eval/{p}/{k}": v for p, row in results.items() for k, v in row.items()}


def results_path(workdir: str, step: int) -> str:
  return os.path.join(workdir, f"eval_step_{step}.json")


def write_results(results: Mapping, *, workdir: str, step: int) -> str:
  """Writes ``{'step': N, 'results': {protocol: metrics}}`` to ``eval_step_N.json``."""
  path = results_path(workdir, step)
  with open(path, "w") as f:
    json.dump({"step": step, "results": results}, f, indent=2, sort_keys=True)
  return path


def is_fraction(metric: str) -> bool:
  """Metrics in ``[0, 1]`` (shown in percent): recall@K, map@r, r_precision, nmi, nmi+."""
  return metric.startswith("recall@") or metric in _FRACTION_KEYS


def format_value(metric: str, value: float) -> str:
  return f"{100 * value:.2f}" if is_fraction(metric) else f"{value:.4f}"


# Column order of every metric table (eval.py, train.py, the sweep): Recall@K by K, then these,
# then any other metric alphabetically.
METRIC_ORDER = ("map@r", "r_precision", "nmi", "nmi+", "rho")


def metric_sort_key(metric: str) -> tuple:
  """Sort key giving the one column order of all metric tables (see ``METRIC_ORDER``)."""
  if metric.startswith("recall@") and metric[7:].isdigit():
    return (0, int(metric[7:]), "")
  if metric in METRIC_ORDER:
    return (1, METRIC_ORDER.index(metric), "")
  return (2, 0, metric)


def _metric_keys(rows) -> list[str]:
  keys = []
  for row in rows:
    keys += [k for k in row if k not in keys]
  return sorted(keys, key=metric_sort_key)


def format_table(results: Mapping[str, Mapping[str, float]]) -> str:
  """A markdown table: a row per protocol, a column per metric (fractions in percent)."""
  keys = _metric_keys(results.values())
  lines = ["| protocol | " + " | ".join(keys) + " |",
           "|---|" + "---|" * len(keys)]
  for protocol, row in results.items():
    cells = [format_value(k, row[k]) if k in row else "" for k in keys]
    lines.append(f"| {protocol} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def format_history_table(history: Mapping[int, Mapping[str, Mapping[str, float]]]) -> str:
  """A markdown table with a row per (step, protocol)."""
  return format_runs_table({step: history[step] for step in sorted(history)}, column="step")


def format_runs_table(runs: Mapping, *, column: str = "run") -> str:
  """A markdown table with a row per (run, protocol) of ``{run name: {protocol: {metric:
  value}}}`` (fractions in percent); ``column`` heads the run names."""
  keys = _metric_keys(row for results in runs.values() for row in results.values())
  lines = [f"| {column} | protocol | " + " | ".join(keys) + " |",
           "|---|---|" + "---|" * len(keys)]
  for name, results in runs.items():
    for protocol, row in results.items():
      cells = [format_value(k, row[k]) if k in row else "" for k in keys]
      lines.append(f"| {name} | {protocol} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def aggregate(runs: Sequence[Mapping[str, Mapping[str, float]]]) -> dict:
  """Mean and sample standard deviation (``ddof=1``; 0 for one run) over runs (e.g. seeds).

  Args:
    runs: one ``{protocol: {metric: value}}`` per run; all with the same protocols and
      metrics.

  Returns:
    ``{protocol: {metric: {'mean': m, 'std': s, 'values': [...]}}}``.

  Raises:
    ValueError: no run, or runs whose protocols / metrics differ (naming the run index).
  """
  if not runs:
    raise ValueError("aggregate needs at least one run.")
  reference = {p: sorted(row) for p, row in runs[0].items()}
  for i, run in enumerate(runs[1:], start=1):
    got = {p: sorted(row) for p, row in run.items()}
    if got != reference:
      raise ValueError(f"Run {i} has protocols / metrics {got}, run 0 has {reference}; "
                       "aggregate runs evaluated the same way.")
  summary = {}
  for protocol, row in runs[0].items():
    summary[protocol] = {}
    for metric in row:
      values = [float(run[protocol][metric]) for run in runs]
      std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
      summary[protocol][metric] = {"mean": float(np.mean(values)), "std": std,
                                   "values": values}
  return summary


def format_aggregate_table(summary: Mapping) -> str:
  """Markdown ``mean ± std`` table of :func:`aggregate` (fractions in percent)."""
  keys = _metric_keys(summary.values())
  lines = ["| protocol | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
  for protocol, row in summary.items():
    cells = []
    for k in keys:
      scale, digits = (100.0, 2) if is_fraction(k) else (1.0, 4)
      cells.append(f"{scale * row[k]['mean']:.{digits}f} ± {scale * row[k]['std']:.{digits}f}")
    lines.append(f"| {protocol} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot_curves(history: Mapping[int, Mapping[str, Mapping[str, float]]], *,
                path: str, title: str = "") -> str:
  """PNG with a panel per metric: its value against the step, a line per protocol."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  steps = sorted(history)
  keys = _metric_keys(row for results in history.values() for row in results.values())
  protocols = _metric_keys(history.values())
  cols = min(3, len(keys))
  rows = math.ceil(len(keys) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), dpi=100,
                           squeeze=False)
  for ax, key in zip(axes.flat, keys):
    scale = 100.0 if is_fraction(key) else 1.0
    for protocol in protocols:
      points = [(s, scale * history[s][protocol][key]) for s in steps
                if key in history[s].get(protocol, {})]
      if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", label=protocol)
    ax.set_title(key + (" (%)" if scale == 100.0 else ""), fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(keys):]:
    ax.axis("off")
  axes.flat[0].legend(fontsize=8)
  if title:
    fig.suptitle(title, fontsize=11)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path


def plot_embedding(embeddings: np.ndarray, labels: np.ndarray, *, path: str,
                   title: str) -> str:
  """Scatter PNG of ``embeddings [N, D]`` coloured by ``labels [N]`` (PCA to 2-D if D > 2)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  x = np.asarray(embeddings, np.float64)
  if x.shape[1] > 2:
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    x = x @ vt[:2].T
    title += " (PCA)"
  elif x.shape[1] == 1:
    x = np.concatenate([x, np.zeros_like(x)], axis=1)
  fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
  for label in np.unique(labels):
    sel = labels == label
    ax.scatter(x[sel, 0], x[sel, 1], s=6, alpha=0.7, label=str(label))
  ax.legend(markerscale=3, fontsize=8, loc="best")
  ax.set_title(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path
