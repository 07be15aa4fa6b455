"""pytorch-metric-learning (PML) as the other side of a comparison: its import and the
tolerances within which its loss and ours must agree (see ``requirements-bench.txt``)."""

from __future__ import annotations

import types

LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-6
MIN_REPEATS = 2            # a PML case capped by its max_seconds still gets this many calls


def import_pml() -> tuple[types.SimpleNamespace | None, str]:
  """``(namespace of torch + PML modules, versions)`` or ``(None, why not)``."""
  # pylint: disable=import-outside-toplevel
  try:
    import torch
    import pytorch_metric_learning as pml_root
    from pytorch_metric_learning import distances, losses, miners, reducers
  except ImportError as e:
    return None, f"torch / pytorch-metric-learning not importable ({e}); PML not timed."
  ns = types.SimpleNamespace(torch=torch, distances=distances, losses=losses, miners=miners,
                             reducers=reducers)
  return ns, f"torch {torch.__version__}, pytorch-metric-learning {pml_root.__version__}"
