r"""Host input pipeline throughput: JPEG bytes in, augmented float32 batches out, at 224 px.

  python benchmarks/speed/input_pipeline.py                      # ~1 min on 2 CPUs (1024 images)
  python benchmarks/speed/input_pipeline.py --smoke --out=/tmp/b.json   # seconds
  python benchmarks/speed/input_pipeline.py --num_images=1024 --workers=0,2,4 --threads=4

The inputs are synthetic but CUB-like JPEGs generated in memory (``--seed``): the longer side
500 px, the shorter side uniform in [300, 500], three of four landscape; each a smooth random
field (random colours on coarse grids, bicubic upsampling, several scales) plus Gaussian pixel
noise, encoded at JPEG quality 90 (about CUB's tens of kilobytes per image; the mean size is
printed). Two measurements:

* ``loop`` (a): one Python thread, so one core: for each augmentation of ``--augmentations``
  (``'resize_crop'``, ``'random_resized_crop'``, ``'none'`` = the evaluation transform), every
  record goes through ``augment.train_transform`` (``augment.eval_transform`` for ``'none'``)
  with its own ``numpy.random.Generator``, and each ``--batch_size`` outputs are stacked into
  a float32 batch ``[b, S, S, 3]``. One untimed warm-up batch first.
* ``pipeline`` (b): the training pipeline ``dml_jax.data.pipeline.train_batches`` over a
  ``LazyImages`` of the same records, the n-per-class sampler (``--group_size``, classes of
  ``--images_per_class``), ``ceil(num_images / batch_size)`` steps, for each value of
  ``--workers`` (grain worker processes; 0 = ``--threads`` threads of this process). Its rate
  is measured after the first batch (``startup s`` = time to the first batch: thread pools,
  worker processes, pickling the records); ``total s`` includes it. Skipped with a message if
  the module (or grain) does not import.

``cores`` is the number of cores a row can use: 1 for the loop, ``min(os.cpu_count(),
threads * max(1, workers))`` for the pipeline; ``images/s per core = images/s / cores`` and
``ms/image = 1000 / images/s`` (wall time). The load average before and after is recorded
(other processes share the cores: compare only quiet runs). Prints a markdown table and writes
everything as JSON to ``--out`` (``runs/bench_input_pipeline.json``).
"""

from __future__ import annotations

import io
import math
import os
import platform
import sys
import time
import traceback

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks import harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from dml_jax.data import augment  # pylint: disable=g-import-not-at-top,wrong-import-position
from dml_jax.data import images as images_lib  # pylint: disable=g-import-not-at-top
from dml_jax.data import samplers  # pylint: disable=g-import-not-at-top

DEFAULT_AUGMENTATIONS = ("resize_crop", "random_resized_crop", "none")
SMOKE = dict(num_images=32, batch_size=8, group_size=2, images_per_class=4, workers=(0,))


# ------------------------------------------------------------------------------------------
# Synthetic JPEGs.


def natural_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
  """A "natural-ish" uint8 ``[height, width, 3]`` image: smooth random colour fields at a few
  scales (bicubic upsampling of coarse random grids) plus Gaussian pixel noise (sd 6)."""
  out = np.zeros((height, width, 3), np.float32)
  for cells, weight in ((3, 0.5), (12, 0.3), (48, 0.2)):
    grid = rng.uniform(0, 255, (max(2, height * cells // 500), max(2, width * cells // 500), 3))
    field = Image.fromarray(grid.astype(np.uint8)).resize((width, height), Image.BICUBIC)
    out += weight * np.asarray(field, np.float32)
  out += rng.normal(0.0, 6.0, out.shape)
  return np.clip(out, 0, 255).astype(np.uint8)


def synthetic_jpegs(num_images: int, *, seed: int = 0, quality: int = 90) -> list[bytes]:
  """``num_images`` CUB-like JPEG byte strings (see the module docstring)."""
  rng = np.random.default_rng(seed)
  records = []
  for _ in range(num_images):
    short = int(rng.integers(300, 501))
    h, w = (short, 500) if rng.random() < 0.75 else (500, short)
    buf = io.BytesIO()
    Image.fromarray(natural_image(rng, h, w)).save(buf, "JPEG", quality=quality)
    records.append(buf.getvalue())
  return records


# ------------------------------------------------------------------------------------------
# Measurements.


def _row(stage, augmentation, workers, threads, cores, images, seconds, startup_s=None,
         total_s=None):
  rate = images / seconds if seconds > 0 else float("nan")
  return {"stage": stage, "augmentation": augmentation, "workers": workers,
          "threads": threads, "cores": cores, "images": images, "seconds": seconds,
          "images_per_s": rate, "images_per_s_per_core": rate / cores,
          "ms_per_image": 1000.0 / rate, "startup_s": startup_s,
          "total_s": seconds if total_s is None else total_s}


def bench_loop(records, augmentation: str, *, image_size: int, resize_size: int,
               batch_size: int, seed: int = 0) -> dict:
  """(a) decode + augment + stack in one thread; returns a result row."""
  options = images_lib.ImageOptions(image_size=image_size, resize_size=resize_size)

  def batches(rows):
    for start in range(0, len(rows), batch_size):
      out = []
      for i in rows[start:start + batch_size]:
        if augmentation == "none":
          out.append(options.eval_transform(records[i]))
        else:
          out.append(options.train_transform(records[i], np.random.default_rng([seed, i]),
                                             augmentation=augmentation))
      yield np.stack(out)

  for batch in batches(list(range(min(batch_size, len(records))))):   # warm-up
    assert batch.shape[1:] == (image_size, image_size, 3) and batch.dtype == np.float32
  start = time.perf_counter()
  n = sum(len(b) for b in batches(list(range(len(records)))))
  return _row("loop", augmentation, 0, 1, 1, n, time.perf_counter() - start)


def import_pipeline():
  """``(train_batches, None)`` or ``(None, why)`` if the training pipeline is not available."""
  try:
    from dml_jax.data import pipeline  # pylint: disable=import-outside-toplevel
    import grain  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    return None, f"training pipeline not benchmarked: {type(e).__name__}: {e}"
  if not hasattr(pipeline, "train_batches"):
    return None, "training pipeline not benchmarked: pipeline.train_batches does not exist."
  return pipeline.train_batches, None


def bench_pipeline(train_batches, records, augmentation: str, *, workers: int, threads: int,
                   image_size: int, resize_size: int, batch_size: int, group_size: int,
                   images_per_class: int, seed: int = 0) -> dict:
  """(b) ``pipeline.train_batches`` over all records; returns a result row."""
  options = images_lib.ImageOptions(image_size=image_size, resize_size=resize_size)
  lazy = images_lib.LazyImages(records, options, name="synthetic_jpegs")
  labels = np.arange(len(records)) // images_per_class
  sampler = samplers.NPerClassSampler(labels, batch_size=batch_size, group_size=group_size,
                                      seed=seed)
  num_steps = math.ceil(len(records) / batch_size)
  start = time.perf_counter()
  it = train_batches(lazy, labels, sampler, seed=seed, start_step=0, num_steps=num_steps,
                     augmentation=augmentation, num_threads=threads, num_workers=workers)
  first = None
  n = 0
  for step, x, y in it:
    if first is None:
      first = time.perf_counter()
      assert x.shape == (batch_size, image_size, image_size, 3) and x.dtype == np.float32
      assert y.shape == (batch_size,) and step == 0
    else:
      n += len(x)
  end = time.perf_counter()
  cores = min(harness.available_cpus(), threads * max(1, workers))
  return _row("pipeline", augmentation, workers, threads, cores, n, end - first,
              startup_s=first - start, total_s=end - start)


# ------------------------------------------------------------------------------------------
# Report.


def markdown_table(report: dict) -> str:
  return harness.markdown_table(
      ["stage", "augmentation", "workers", "threads", "cores", "images/s", "images/s per core",
       "ms/image", "startup s", "total s"],
      [[r["stage"], r["augmentation"], "—" if r["stage"] == "loop" else r["workers"],
        r["threads"], r["cores"], f"{r['images_per_s']:.1f}", f"{r['images_per_s_per_core']:.1f}",
        f"{r['ms_per_image']:.2f}", harness.fmt(r["startup_s"], ".2f"), f"{r['total_s']:.2f}"]
       for r in report["results"]])


def table(report: dict) -> str:
  """The docs table of a written report (:func:`markdown_table`)."""
  return markdown_table(report)


def run(*, num_images: int = 1024, image_size: int = 224, resize_size: int = 256,
        augmentations=DEFAULT_AUGMENTATIONS, workers=(0, 2), threads: int = 0,
        batch_size: int = 32, group_size: int = 4, images_per_class: int = 16,
        pipeline: bool = True, seed: int = 0, out: str = "", log=print) -> dict:
  """Runs the benchmark; returns the report (also written as JSON to ``out`` if given).

  Returns:
    ``{'config', 'results', 'skipped'}``; ``results`` has one row per measurement with
    ``stage`` ('loop' or 'pipeline'), ``augmentation``, ``workers``, ``threads``, ``cores``,
    ``images``, ``seconds``, ``images_per_s``, ``images_per_s_per_core``, ``ms_per_image``,
    ``startup_s`` (pipeline) and ``total_s``.
  """
  for a in augmentations:
    augment.check_options(augmentation=a, image_size=image_size, resize_size=resize_size,
                          channels=3, mean=augment.IMAGENET_MEAN, std=augment.IMAGENET_STD)
  if num_images < batch_size * 2:
    raise ValueError(f"num_images ({num_images}) must be >= 2 * batch_size ({batch_size}).")
  cpus = harness.available_cpus()
  threads = threads or cpus
  config = {"num_images": num_images, "image_size": image_size, "resize_size": resize_size,
            "augmentations": list(augmentations), "workers": [int(w) for w in workers],
            "threads": threads, "batch_size": batch_size, "group_size": group_size,
            "images_per_class": images_per_class, "seed": seed, "jpeg_quality": 90,
            "os_cpu_count": os.cpu_count(), "cpus": cpus,
            "pillow": Image.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "load_average": {"start": harness.load_average()}}
  t = time.perf_counter()
  records = synthetic_jpegs(num_images, seed=seed)
  sizes = [len(r) for r in records]
  config["mean_jpeg_bytes"] = float(np.mean(sizes))
  config["generate_s"] = time.perf_counter() - t
  log(f"{cpus} cores (os.cpu_count() = {os.cpu_count()}); {num_images} synthetic JPEGs, mean "
      f"{np.mean(sizes) / 1024:.1f} KiB, generated in {config['generate_s']:.1f} s")
  results, skipped = [], []
  start_all = time.perf_counter()
  for a in augmentations:
    row = bench_loop(records, a, image_size=image_size, resize_size=resize_size,
                     batch_size=batch_size, seed=seed)
    results.append(row)
    log(f"[{time.perf_counter() - start_all:5.0f} s] loop {a}: {row['images_per_s']:.1f} "
        "images/s")
  train_batches, why = import_pipeline() if pipeline else (None, "pipeline disabled.")
  if train_batches is None:
    skipped.append(why)
    log(why)
  else:
    for a in augmentations:
      for w in workers:
        try:
          row = bench_pipeline(train_batches, records, a, workers=int(w), threads=threads,
                               image_size=image_size, resize_size=resize_size,
                               batch_size=batch_size, group_size=group_size,
                               images_per_class=images_per_class, seed=seed)
        except Exception as e:   # pylint: disable=broad-except  (recorded, the run goes on)
          log(traceback.format_exc())
          skipped.append(f"pipeline {a} workers={w} failed: {type(e).__name__}: {e}")
          continue
        results.append(row)
        log(f"[{time.perf_counter() - start_all:5.0f} s] pipeline {a} workers={w}: "
            f"{row['images_per_s']:.1f} images/s (startup {row['startup_s']:.1f} s)")
  config["load_average"]["end"] = harness.load_average()
  config["total_s"] = time.perf_counter() - start_all
  report = {"script": "benchmarks/speed/input_pipeline.py", "config": config,
            "results": results, "skipped": skipped, "stamp": harness.stamp()}
  harness.write_json(report, out)
  return report


# ------------------------------------------------------------------------------------------
# Binary.


def define_flags():
  """The command-line flags (defined here, not at import, so tests can import the module)."""
  from absl import flags  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  flags.DEFINE_integer("num_images", 1024, "Synthetic JPEGs (each decoded once per row).")
  flags.DEFINE_integer("image_size", 224, "Output side S.")
  flags.DEFINE_integer("resize_size", 256, "Shorter side before the crop.")
  flags.DEFINE_list("augmentations", list(DEFAULT_AUGMENTATIONS),
                    "Augmentations ('none' = the evaluation transform).")
  flags.DEFINE_list("workers", ["0", "2"], "Pipeline worker processes (0 = threads only).")
  flags.DEFINE_integer("threads", 0, "Pipeline decoding threads (per worker); 0 = the cores.")
  flags.DEFINE_integer("batch_size", 32, "Batch size b.")
  flags.DEFINE_integer("group_size", 4, "Pipeline sampler: examples per class in a batch.")
  flags.DEFINE_integer("images_per_class", 16, "Synthetic labels: images per class.")
  flags.DEFINE_bool("pipeline", True, "Also time pipeline.train_batches (b).")
  flags.DEFINE_bool("smoke", False, f"Tiny run: {SMOKE}.")
  flags.DEFINE_integer("seed", 0, "Images, labels and augmentation seed.")
  flags.DEFINE_string("out", "runs/bench_input_pipeline.json", "JSON output ('' = none).")
  return flags.FLAGS


def main(argv):
  del argv
  f = FLAGS
  kwargs = dict(num_images=f.num_images, batch_size=f.batch_size, group_size=f.group_size,
                images_per_class=f.images_per_class, workers=[int(w) for w in f.workers])
  if f.smoke:
    kwargs.update(SMOKE)
  report = run(image_size=f.image_size, resize_size=f.resize_size,
               augmentations=f.augmentations, threads=f.threads, pipeline=f.pipeline,
               seed=f.seed, out=f.out, **kwargs)
  print()
  print(markdown_table(report))
  for line in report["skipped"]:
    print(f"skipped: {line}")
  c = report["config"]
  la = c["load_average"]
  print(f"\n{c['total_s']:.0f} s; {c['cpus']} cores used (os.cpu_count() = "
        f"{c['os_cpu_count']}); load average (1 min) {la['start'][0]:.2f} at start, "
        f"{la['end'][0]:.2f} at end" + (f"; results written to {f.out}" if f.out else ""))


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  FLAGS = define_flags()
  app.run(main)
