r"""Speed and memory of the retrieval metrics at benchmark scale, against faiss and PML.

  python benchmarks/speed/evaluation.py                       # N = 10,000 and 60,000, D = 512
  python benchmarks/speed/evaluation.py --smoke --out=/tmp/b  # seconds; what the test runs
  python benchmarks/speed/evaluation.py --sizes=60000 --methods=dml_jax,faiss \
      --summary=docs/results/performance/retrieval.json       # the docs table

For each N and each kind of data (``--data``), L2-normalised embeddings ``[N, D]`` with about
N/5 classes (labels uniform at random, so class sizes are Poisson(5): singletons included, as
in SOP); query = gallery, self excluded (the SOP protocol):

* ``clustered``: each point its class centre plus Gaussian noise (``--noise``), like a trained
  model's embeddings (Recall@1 about 70 % at the default noise);
* ``unstructured``: points uniform on the sphere, labels unrelated to them, like a model early
  in training or a hard dataset (Recall@1 about 0): nearly no query finds its class among its
  first neighbours, so every query needs the rank of its first relevant item.

Methods, each in a fresh subprocess:

* ``dml_jax``: ``evaluation.retrieval_metrics`` (exact tiled kNN in JAX: the symmetric
  top-m search of ``knn.neighbor_relevance`` with the rank of the first relevant item counted
  in the same pass, k = max(max K, max R)); Recall@K for every K, MAP@R, R-precision.
* ``faiss``: ``faiss.IndexFlatIP`` exact search for ``k + 1`` neighbours (self removed),
  then the same metrics from the neighbour labels with dml_jax's numpy functions;
  ``faiss_1t`` the same with one OpenMP thread (faster than faiss's default on some small
  VMs). The checks compare with the faster of those run.
* ``pml``: pytorch-metric-learning's ``AccuracyCalculator`` (``precision_at_1``,
  ``r_precision``, ``mean_average_precision_at_r``; ``k='max_bin_count'``; its kNN uses faiss
  when installed). It has no Recall@K for K > 1, so it searches only max R neighbours.

faiss and PML are optional (``requirements-bench.txt``); a missing one is reported and
skipped. Wall time is one call in a fresh process (JAX compilation included). Peak memory is
the process's peak resident memory during the call minus its resident memory just before it
(embeddings, libraries and inputs already loaded), read from /proc (Linux). Prints a markdown
table (:func:`table`) with the time ratio of each row to dml_jax's (``time / dml_jax`` of a
faiss row is dml_jax's speed-up) and writes ``<out>/evaluation.json`` (and ``--summary``, the
same report, for the docs; ``docs/tables.py`` renders its table with :func:`table`);
``checks`` gives, per data kind and N, the speed-up over the faster faiss run, whether it is
at least 1 and whether dml_jax stays within 2 GiB.
"""

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from benchmarks import harness  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command line (defined only when run as a script, so that importing the module for
  its functions leaves absl's global flags alone)."""
  flags.DEFINE_list("sizes", ["10000", "60000"], "Numbers of embeddings N.")
  flags.DEFINE_integer("dim", 512, "Embedding dimension D.")
  flags.DEFINE_list("ks", ["1", "10", "100", "1000"], "Recall@K cut-offs (SOP's by default).")
  flags.DEFINE_list("methods", ["dml_jax", "faiss", "faiss_1t", "pml"], "Methods to run.")
  flags.DEFINE_list("data", ["clustered", "unstructured"], "Kinds of embeddings (module docstring).")
  flags.DEFINE_string("summary", "", "Also write the report here (a docs summary).")
  flags.DEFINE_float("noise", 2.25, "Noise scale around the class centres (sets the recall; "
                     "--smoke uses 1.5).")
  flags.DEFINE_integer("seed", 0, "Data seed.")
  flags.DEFINE_string("out", "runs/bench_evaluation", "Directory of evaluation.json.")
  flags.DEFINE_bool("smoke", False, "Tiny sizes (N = 2000, D = 64, K up to 100) for tests.")
  flags.DEFINE_integer("timeout", 3600, "Seconds per method and size.")
  flags.DEFINE_string("worker", None, "Internal: run one method in this process.")
  flags.DEFINE_integer("n", 0, "Internal: N of the worker.")
  flags.DEFINE_string("kind", "clustered", "Internal: the worker's kind of data.")
  flags.DEFINE_string("result", None, "Internal: JSON path the worker writes.")


METHODS = ("dml_jax", "faiss", "faiss_1t", "pml")
DATA = ("clustered", "unstructured")


# ------------------------------------------------------------------------------ data


def make_data(n: int, dim: int, *, noise: float, seed: int,
              kind: str = "clustered") -> tuple[np.ndarray, np.ndarray]:
  """Unit-norm float32 ``[n, dim]`` embeddings and int64 labels ``[n]`` (about n/5 classes).

  ``clustered``: ``x_i = normalise(c_{y_i} + noise * e_i / sqrt(dim))`` with unit class
  centres ``c`` and ``e_i ~ N(0, I)``; ``unstructured``: ``x_i = normalise(e_i)``, whatever
  the label. Generated in chunks so that no float64 ``[n, dim]`` array exists.
  """
  if kind not in DATA:
    raise ValueError(f"data kind {kind!r}; allowed: {', '.join(DATA)}.")
  rng = np.random.default_rng(seed)
  num_classes = max(2, n // 5)
  centres = rng.standard_normal((num_classes, dim), dtype=np.float32)
  centres /= np.linalg.norm(centres, axis=1, keepdims=True)
  labels = rng.integers(0, num_classes, size=n)
  x = np.empty((n, dim), np.float32)
  for start in range(0, n, 8192):
    stop = min(n, start + 8192)
    chunk = rng.standard_normal((stop - start, dim), dtype=np.float32)
    if kind == "clustered":
      chunk *= np.float32(noise / np.sqrt(dim))
      chunk += centres[labels[start:stop]]
    chunk /= np.linalg.norm(chunk, axis=1, keepdims=True)
    x[start:stop] = chunk
  return x, labels


# ---------------------------------------------------------------------------- methods


def run_dml_jax(x, y, ks):
  from dml_jax import evaluation  # pylint: disable=import-outside-toplevel
  return evaluation.retrieval_metrics(x, y, ks=ks, similarity="cosine")


def run_faiss(x, y, ks, *, threads: int = 0):
  import faiss  # pylint: disable=import-outside-toplevel
  from dml_jax.evaluation import metrics  # pylint: disable=import-outside-toplevel
  if threads:
    faiss.omp_set_num_threads(threads)
  num_relevant = metrics.positive_counts(y, y, exclude_self=True)
  k = max(max(ks), int(num_relevant.max()))
  index = faiss.IndexFlatIP(x.shape[1])
  index.add(x)
  _, neighbours = index.search(x, k + 1)
  # Remove self (the query's own row); if ties pushed it out, drop the last neighbour.
  is_self = neighbours == np.arange(x.shape[0])[:, None]
  is_self[~is_self.any(axis=1), -1] = True
  neighbours = neighbours[~is_self].reshape(x.shape[0], k)
  relevant = y[neighbours] == y[:, None]
  del neighbours
  valid = num_relevant > 0
  relevant, num_relevant = relevant[valid], num_relevant[valid]
  result = {f"recall@{kk}": float(r)
            for kk, r in zip(ks, metrics.recall_at_k(relevant, ks=ks).mean(axis=0))}
  result["map@r"] = float(metrics.map_at_r(relevant, num_relevant).mean())
  result["r_precision"] = float(metrics.r_precision(relevant, num_relevant).mean())
  return result


def run_pml(x, y, ks):
  del ks  # PML has no Recall@K for K > 1.
  import torch  # pylint: disable=import-outside-toplevel
  from pytorch_metric_learning.utils import (  # pylint: disable=import-outside-toplevel
      accuracy_calculator)
  calc = accuracy_calculator.AccuracyCalculator(
      include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
      k="max_bin_count", device=torch.device("cpu"))
  out = calc.get_accuracy(torch.from_numpy(x), torch.from_numpy(y))
  return {"recall@1": float(out["precision_at_1"]),
          "map@r": float(out["mean_average_precision_at_r"]),
          "r_precision": float(out["r_precision"])}


RUNNERS = {"dml_jax": run_dml_jax, "faiss": run_faiss,
           "faiss_1t": lambda x, y, ks: run_faiss(x, y, ks, threads=1), "pml": run_pml}
IMPORTS = {"dml_jax": ("jax",), "faiss": ("faiss",), "faiss_1t": ("faiss",),
           "pml": ("torch", "pytorch_metric_learning")}


def _proc_kib(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise RuntimeError(f"/proc/self/status has no {field}.")


def worker(method: str, n: int, dim: int, ks, *, noise: float, seed: int,
           kind: str = "clustered") -> dict:
  """Runs one method in this process; returns its metrics, time and peak memory."""
  import importlib  # pylint: disable=import-outside-toplevel
  try:
    for module in IMPORTS[method]:
      importlib.import_module(module)
  except ImportError as e:
    return {"method": method, "n": n, "data": kind, "skipped": f"not installed ({e})"}
  import jax  # pylint: disable=import-outside-toplevel,unused-import
  from dml_jax.evaluation import metrics  # pylint: disable=import-outside-toplevel,unused-import
  x, y = make_data(n, dim, noise=noise, seed=seed, kind=kind)
  baseline = _proc_kib("VmRSS")
  with open("/proc/self/clear_refs", "w") as f:  # Resets the peak (VmHWM) to the current RSS.
    f.write("5")
  start = time.perf_counter()
  result = RUNNERS[method](x, y, tuple(ks))
  seconds = time.perf_counter() - start
  peak = _proc_kib("VmHWM")
  where = ({"jax": jax.__version__, "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind} if method == "dml_jax" else {})
  return {"method": method, "n": n, "data": kind, "dim": dim, "seconds": seconds,
          "peak_mib_above": (peak - baseline) / 1024, "embeddings_mib": x.nbytes / 2**20,
          "metrics": result, **where}


def report_stamp(rows: list[dict]) -> dict:
  """``harness.stamp()`` with the JAX version, backend and device of the first dml_jax row
  that ran (the workers run in subprocesses; this process does not import JAX)."""
  ran = next((r for r in rows if r["method"] == "dml_jax" and "backend" in r), {})
  return {**harness.stamp(), **{k: ran[k] for k in ("jax", "backend", "device") if k in ran}}


# ------------------------------------------------------------------------------ driver


def run_worker_subprocess(method: str, n: int, kind: str, *, dim: int, ks, out: str) -> dict:
  path = os.path.join(out, f"worker_{method}_{kind}_{n}.json")
  args = [sys.executable, os.path.abspath(__file__), f"--worker={method}", f"--n={n}",
          f"--kind={kind}", f"--dim={dim}", f"--ks={','.join(map(str, ks))}",
          f"--noise={FLAGS.noise}", f"--seed={FLAGS.seed}", f"--result={path}"]
  skipped = {"method": method, "n": n, "data": kind}
  try:
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                          timeout=FLAGS.timeout, check=False)
  except subprocess.TimeoutExpired:
    return {**skipped, "skipped": f"timed out after {FLAGS.timeout} s"}
  if proc.returncode != 0:
    return {**skipped,
            "skipped": f"failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"}
  with open(path) as f:
    return json.load(f)


def _ours(rows: list[dict], row: dict) -> dict | None:
  return next((r for r in rows if r["n"] == row["n"] and r.get("data") == row.get("data")
               and r["method"] == "dml_jax" and "skipped" not in r), None)


def table(report: dict) -> str:
  """The markdown table of a report (``main``'s JSON): one line per data kind, N and method."""
  ks = report["ks"]
  keys = [f"recall@{k}" for k in ks] + ["map@r", "r_precision"]
  cells = []
  for row in report["rows"]:
    data = row.get("data", "clustered")
    if "skipped" in row:
      cells.append([data, f"{row['n']:,}", row["method"], f"skipped: {row['skipped'][:80]}"]
                   + [""] * (2 + len(keys)))
      continue
    ours = _ours(report["rows"], row)
    cells.append([data, f"{row['n']:,}", row["method"], f"{row['seconds']:.1f}",
                  f"{row['seconds'] / ours['seconds']:.2f}" if ours else "",
                  f"{row['peak_mib_above']:,.0f}"]
                 + [f"{100 * row['metrics'][k]:.2f}" if k in row["metrics"] else "—"
                    for k in keys])
  return harness.markdown_table(
      ["data", "N", "method", "time (s)", "time / dml_jax", "peak MiB above embeddings"]
      + keys, cells)


def checks(rows: list[dict]) -> dict:
  """Per ``<data>/<N>``: dml_jax's speed-up over the faster faiss run, whether it is at least
  1, whether its peak stays within 2 GiB, and the largest metric difference."""
  out = {}
  for ours in (r for r in rows if r["method"] == "dml_jax" and "skipped" not in r):
    key = f"{ours.get('data', 'clustered')}/{ours['n']}"
    faiss_rows = [r for r in rows if r["n"] == ours["n"] and r.get("data") == ours.get("data")
                  and r["method"].startswith("faiss") and "skipped" not in r]
    out[key] = {"peak_within_2gib": ours["peak_mib_above"] <= 2048}
    if faiss_rows:
      fastest = min(faiss_rows, key=lambda r: r["seconds"])
      out[key].update(
          fastest_faiss=fastest["method"],
          speedup_vs_faiss=round(fastest["seconds"] / ours["seconds"], 2),
          not_slower_than_faiss=ours["seconds"] <= fastest["seconds"],
          max_metric_difference_vs_faiss=max(
              abs(ours["metrics"][k] - fastest["metrics"][k]) for k in fastest["metrics"]))
  return out


def main(argv):
  del argv
  ks = [int(k) for k in FLAGS.ks]
  if FLAGS.worker:
    result = worker(FLAGS.worker, FLAGS.n, FLAGS.dim, ks, noise=FLAGS.noise, seed=FLAGS.seed,
                    kind=FLAGS.kind)
    harness.write_json(result, FLAGS.result, indent=None)
    return
  sizes, dim = [int(n) for n in FLAGS.sizes], FLAGS.dim
  if FLAGS.smoke:
    sizes, dim, ks = [2000], 64, [1, 10, 100]
    FLAGS.noise = 1.5
  bad = [m for m in FLAGS.methods if m not in METHODS]
  if bad:
    raise app.UsageError(f"Unknown methods {bad}; allowed: {', '.join(METHODS)}.")
  bad = [d for d in FLAGS.data if d not in DATA]
  if bad:
    raise app.UsageError(f"Unknown data kinds {bad}; allowed: {', '.join(DATA)}.")
  os.makedirs(FLAGS.out, exist_ok=True)
  rows = []
  for kind in FLAGS.data:
    for n in sizes:
      for method in FLAGS.methods:
        row = run_worker_subprocess(method, n, kind, dim=dim, ks=ks, out=FLAGS.out)
        rows.append(row)
        status = (row.get("skipped")
                  or f"{row['seconds']:.1f} s, {row['peak_mib_above']:.0f} MiB")
        print(f"{kind} N={n} {method}: {status}", flush=True)
  report = {"script": "benchmarks/speed/evaluation.py", "dim": dim, "ks": ks, "noise": FLAGS.noise, "seed": FLAGS.seed,
            "cpu_count": os.cpu_count(), "rows": rows, "checks": checks(rows),
            "stamp": report_stamp(rows)}
  print(f"\nD = {dim}, about N/5 classes, query = gallery (self excluded); "
        f"{os.cpu_count()} CPU cores\n")
  print(table(report))
  print("\nchecks:", json.dumps(report["checks"]))
  for path in filter(None, (os.path.join(FLAGS.out, "evaluation.json"), FLAGS.summary)):
    harness.write_json(report, path)
    print(f"Written {path}")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
