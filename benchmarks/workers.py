"""Side-by-side measurements in worker processes: one process per side (dml_jax, torch, ...),
each with its own thread pool and compiled once, answering one JSON request per line, so
that the sides can take turns case by case and a change in the machine's load hits every side.

The parent starts a :class:`Worker` (``python SCRIPT --worker=SIDE --threads=N``, restricted to
``N`` CPUs) with :func:`worker_env`; the script's ``--worker`` mode calls :func:`serve`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Callable

from benchmarks import harness


def jax_conditions() -> dict:
  """JAX's version, backend and device kind."""
  import jax  # pylint: disable=import-outside-toplevel
  return {"jax": jax.__version__, "backend": jax.default_backend(),
          "device": str(jax.devices()[0].device_kind)}


def serve(side: str, threads: int, handle: Callable[[dict], dict], *,
          torch_conditions: Callable[[], dict]) -> None:
  """The loop of ``side``'s worker: sets torch's threads (torch side), writes
  ``{'ready': True, **conditions, 'cpus': [...]}`` as one JSON line (``torch_conditions()`` or
  :func:`jax_conditions`), then answers every JSON line of stdin with ``handle(request)`` as
  one JSON line. An exception becomes ``{'ready': False, 'error'}`` (then the worker ends) or
  ``{'error'}`` (one request)."""
  out = sys.stdout
  sys.stdout = sys.stderr  # library prints must not break the protocol
  try:
    if side == "torch":
      import torch  # pylint: disable=import-outside-toplevel
      torch.set_num_threads(threads)
      conditions = torch_conditions()
    else:
      conditions = jax_conditions()
    conditions["cpus"] = sorted(os.sched_getaffinity(0))
    out.write(json.dumps({"ready": True, **conditions}) + "\n")
  except Exception as e:  # noqa: BLE001 (reported to the parent)
    out.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
    out.flush()
    return
  out.flush()
  for line in sys.stdin:
    try:
      result = handle(json.loads(line))
    except Exception as e:  # noqa: BLE001 (reported to the parent)
      result = {"error": f"{type(e).__name__}: {e}"}
    out.write(json.dumps(result) + "\n")
    out.flush()


def default_torch_python(modules: str = "torch, pytorch_metric_learning") -> str | None:
  """This Python if it imports ``modules``, else ``.venv-bench/bin/python`` if that does."""
  candidates = [sys.executable, os.path.join(harness.REPO, ".venv-bench", "bin", "python")]
  for python in candidates:
    if os.path.exists(python) and subprocess.run(
        [python, "-c", f"import {modules}"], capture_output=True).returncode == 0:
      return python
  return None


def worker_env(threads: int, *, keep_host_memory: bool) -> dict:
  """The environment of every side's worker process: this one's, the repository on the
  path, ``OMP_NUM_THREADS = threads`` and, with ``keep_host_memory``, glibc's settings of
  ``dml_jax/run/host_memory.py`` (what ``train.py`` applies to itself), the same for each side."""
  from dml_jax.run import host_memory  # pylint: disable=import-outside-toplevel
  env = dict(os.environ)
  env["PYTHONPATH"] = harness.REPO + os.pathsep + env.get("PYTHONPATH", "")
  env["OMP_NUM_THREADS"] = str(threads)
  if keep_host_memory:
    env.update(host_memory.ENVIRONMENT)
  return env


class Worker:
  """A worker process (``script --worker=side --threads=n``) for one side, answering one JSON
  line per request; restricted to ``threads`` CPUs. ``hello`` is its first line."""

  def __init__(self, side: str, python: str, *, threads: int, env: dict, script: str):
    self.side = side
    self.stderr = tempfile.TemporaryFile("w+")
    cpus = sorted(os.sched_getaffinity(0))
    restrict = None
    if threads < len(cpus):  # XLA:CPU sizes its pool by the CPUs it may use
      restrict = lambda: os.sched_setaffinity(0, cpus[:threads])  # noqa: E731
    self.proc = subprocess.Popen(
        [python, os.path.abspath(script), f"--worker={side}", f"--threads={threads}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
        env=env, cwd=harness.REPO, preexec_fn=restrict)
    self.hello = self._read()

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      self.proc.wait(timeout=60)
      self.stderr.seek(0)
      return {"ready": False, "error": f"worker exited: {self.stderr.read()[-2000:]}"}
    return json.loads(line)

  def request(self, **request) -> dict:
    self.proc.stdin.write(json.dumps(request) + "\n")
    self.proc.stdin.flush()
    return self._read()

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.close()
      self.proc.wait(timeout=60)


def start_sides(sides, *, threads: int, env: dict, script: str, torch_python: str | None,
                torch_modules: str, missing_torch: str) -> dict:
  """``{side: Worker}`` for each of ``sides`` that starts; a side that cannot (no Python with
  ``torch_modules`` for the torch side, or a worker that fails to come up) is skipped with a
  printed line (``missing_torch``: what to install)."""
  running = {}
  for side in sides:
    python = sys.executable
    if side == "torch":
      python = torch_python or default_torch_python(torch_modules)
      if python is None:
        print(f"torch side skipped: no Python with {torch_modules} (pass --torch_python, or "
              f"{missing_torch})")
        continue
    worker = Worker(side, python, threads=threads, env=env, script=script)
    if not worker.hello.get("ready"):
      print(f"{side} side skipped: {worker.hello.get('error')}")
      worker.close()
      continue
    running[side] = worker
  return running
