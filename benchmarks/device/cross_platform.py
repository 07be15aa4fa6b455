"""The same numbers on an accelerator as on the CPU: every objective's loss and gradient, the
exact kNN and the retrieval metrics, computed on the default device and on the CPU of the same
process from the same inputs.

  python benchmarks/device/cross_platform.py --out=runs/cross_platform.json
  python benchmarks/device/cross_platform.py --smoke      # seconds, for the tests (CPU vs CPU)

For each registered objective (default hyper-parameters, a batch of ``--batch`` = 32 classes x
n, ``--dim``-D unit embeddings with class structure) it reports the relative difference of the
loss, ``|L_dev - L_cpu| / max(|L_cpu|, 1e-3)`` (:func:`loss_rel_diff`), and of the gradient w.r.t. the embeddings,
``max |g_dev - g_cpu| / max |g_cpu|``; once with the library as it is (similarities at full
float32 precision, ``similarity.PRECISION``), and for six of them (``BEFORE``) also with the
similarity products at the platform's default precision (TF32 on NVIDIA GPUs), for scale.
Then ``evaluation.retrieval_metrics`` and ``evaluation.nearest_neighbors`` of ``--num``
clustered embeddings on both devices: the metrics' largest difference and the fraction of
neighbour lists that differ. Exits 1 when the full-precision differences exceed the tolerances
(``--loss_tol``, ``--grad_tol``, ``--metric_tol``). Writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dml_jax import evaluation  # noqa: E402
from dml_jax import objectives  # noqa: E402
from dml_jax import similarity  # noqa: E402


def clustered(rng: np.random.Generator, classes: int, per_class: int, dim: int,
              spread: float) -> tuple[np.ndarray, np.ndarray]:
  """Unit embeddings ``[classes * per_class, dim]`` around random class centres, and labels."""
  centres = rng.normal(size=(classes, dim))
  x = np.repeat(centres, per_class, axis=0) + spread * rng.normal(size=(classes * per_class, dim))
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  return x.astype(np.float32), np.repeat(np.arange(classes), per_class).astype(np.int32)


LOSS_FLOOR = 1e-3


def loss_rel_diff(a: float, b: float) -> float:
  """``|a - b| / max(|b|, LOSS_FLOOR)``: relative, except for losses near 0, which several
  objectives compute as a difference of O(1) terms (e.g. FastAP's ``1 - AP``), where float32
  rounding is absolute."""
  return abs(a - b) / max(abs(b), LOSS_FLOOR)


def loss_and_grad(obj, params, x, labels, device):
  """``(loss, d loss / d x)`` as numpy, computed on ``device``."""
  f = jax.jit(jax.value_and_grad(lambda e: obj.apply(params, e, labels,
                                                     rng=jax.random.key(1))[0]))
  put = lambda a: jax.device_put(a, device)
  with jax.default_device(device):
    loss, g = f(put(x))
  return float(loss), np.asarray(g)


# The objectives also run with the similarity products at the platform's default, for scale.
BEFORE = ("nca", "triplet", "multi_similarity", "proxy_anchor", "supcon", "softtriple")


def objective_rows(x, labels, *, precision, accel, cpu, names) -> list[dict]:
  """One row per objective: the relative loss and gradient differences, accel vs CPU."""
  old = similarity.PRECISION
  similarity.PRECISION = precision
  rows = []
  try:
    for name in names:
      obj = objectives.make(name)
      params = obj.init(jax.random.key(0), num_classes=int(labels.max()) + 1, dim=x.shape[1])
      la, ga = loss_and_grad(obj, params, x, labels, accel)
      lc, gc = loss_and_grad(obj, params, x, labels, cpu)
      rows.append({"objective": name, "loss_cpu": lc, "loss_device": la,
                   "loss_rel_diff": loss_rel_diff(la, lc),
                   "grad_rel_diff": float(np.abs(ga - gc).max() / max(np.abs(gc).max(), 1e-30))})
  finally:
    similarity.PRECISION = old
  return rows


def retrieval_rows(x, labels, *, accel, cpu, ks) -> dict:
  """Metrics and neighbour lists of ``x`` on both devices."""
  out = {}
  for where, device in (("device", accel), ("cpu", cpu)):
    with jax.default_device(device):
      t0 = time.perf_counter()
      metrics = evaluation.retrieval_metrics(x, labels, ks=ks)
      idx, _ = evaluation.nearest_neighbors(x, k=max(ks))
      out[where] = {"metrics": metrics, "seconds": time.perf_counter() - t0}
      out[where + "_idx"] = idx
  diffs = {m: abs(out["device"]["metrics"][m] - out["cpu"]["metrics"][m])
           for m in out["cpu"]["metrics"]}
  rows_differ = np.any(out.pop("device_idx") != out.pop("cpu_idx"), axis=1)
  return {**out, "metric_abs_diff": diffs, "max_metric_abs_diff": max(diffs.values()),
          "neighbour_lists_differ": float(rows_differ.mean())}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=256)
  p.add_argument("--dim", type=int, default=128)
  p.add_argument("--num", type=int, default=20000, help="embeddings of the retrieval check")
  p.add_argument("--loss_tol", type=float, default=1e-4)
  p.add_argument("--grad_tol", type=float, default=1e-4)
  p.add_argument("--metric_tol", type=float, default=1e-4)
  p.add_argument("--smoke", action="store_true", help="batch 32, 8-D, 600 embeddings")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  if args.smoke:
    args.batch, args.dim, args.num = 32, 8, 600
  rng = np.random.default_rng(0)
  cpu, accel = jax.devices("cpu")[0], jax.devices()[0]
  x, labels = clustered(rng, 32, args.batch // 32, args.dim, spread=0.6)
  result = {"device": str(accel.device_kind), "platform": accel.platform,
            "jax": jax.__version__, "batch": args.batch, "dim": args.dim, "num": args.num}
  result["objectives"] = objective_rows(x, labels, precision=similarity.PRECISION,
                                        accel=accel, cpu=cpu, names=objectives.names())
  result["objectives_platform_default"] = objective_rows(x, labels, precision=None,
                                                         accel=accel, cpu=cpu, names=BEFORE)
  xr, lr = clustered(rng, args.num // 20, 20, args.dim, spread=1.0)
  result["retrieval"] = retrieval_rows(xr, lr, accel=accel, cpu=cpu, ks=(1, 2, 4, 8, 16))
  worst = {k: max(r[k] for r in result["objectives"]) for k in ("loss_rel_diff",
                                                                "grad_rel_diff")}
  before = {k: max(r[k] for r in result["objectives_platform_default"])
            for k in ("loss_rel_diff", "grad_rel_diff")}
  ok = (worst["loss_rel_diff"] <= args.loss_tol and worst["grad_rel_diff"] <= args.grad_tol
        and result["retrieval"]["max_metric_abs_diff"] <= args.metric_tol)
  result.update(worst=worst, worst_platform_default=before, ok=bool(ok))
  print(f"{accel.platform} ({accel.device_kind}) vs CPU, {len(result['objectives'])} objectives: "
        f"loss rel diff <= {worst['loss_rel_diff']:.2e}, grad <= {worst['grad_rel_diff']:.2e} "
        f"(platform-default products: {before['loss_rel_diff']:.2e}, "
        f"{before['grad_rel_diff']:.2e}); retrieval metrics differ by <= "
        f"{result['retrieval']['max_metric_abs_diff']:.2e}, neighbour lists differ in "
        f"{100 * result['retrieval']['neighbour_lists_differ']:.3f}% of queries"
        f" -> {'OK' if ok else 'FAILED'}", flush=True)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
