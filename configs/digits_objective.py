r"""Any registered objective on the embedded digits: a quick, runnable check of each method.

The even/odd digits protocol of configs/digits_evenodd_eps.py with a 16-D L2-normalised
(cosine) embedding and the objective named by the config argument at its paper defaults:

  python train.py --config=configs/digits_objective.py:multi_similarity --workdir=runs/ms
  python train.py --config=configs/digits_objective.py:dro_kl --workdir=runs/dro \
      --config.loss.gamma=0.05
  python train.py --config=configs/digits_objective.py:nca,smoke --workdir=/tmp/nca

The argument is ``NAME`` or ``NAME,smoke`` with NAME one of dml_jax.objectives.names()
(default ``nca``).
Objective-specific keys (``--config.loss.<hparam>``) are those of objectives.make(NAME).
"""

from ml_collections import config_dict

from configs import digits_evenodd_eps
from dml_jax import objectives


def get_config(arg: str = ""):
  name, _, variant = (arg or "nca").partition(",")
  if name not in objectives.names():
    raise ValueError(f"Unknown objective {name!r} in --config=configs/digits_objective.py:"
                     f"{arg}; available: {', '.join(objectives.names())}.")
  c = digits_evenodd_eps.get_config(variant)
  c.model.embedding_dim = 16
  c.model.normalize = True
  c.eval.similarity = "cosine"
  # A None default (e.g. dro_kl_grouped's c_pos) becomes a float placeholder so that
  # --config.loss.c_pos=0.7 can override it.
  c.loss = {k: config_dict.placeholder(float) if v is None else v
            for k, v in objectives.hparam_defaults(name).items()}
  c.loss.name = name
  if "similarity" in c.loss:
    c.loss.similarity = "cosine"
  if name in ("dro_topk", "dro_topk_pn", "dro_kl"):
    c.loss.k = 2 * c.batch_size   # the DRO paper's K = 2B
  return c
