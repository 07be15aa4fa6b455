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
from dml_jax.run import config

ROW = {**digits_evenodd_eps.ROW,
       "model.embedding_dim": 16, "model.normalize": True, "eval.similarity": "cosine"}


def objective_row(name: str) -> dict:
  """``loss`` = objective ``name`` at its defaults; a cosine similarity where it has one; the
  DRO paper's K = 2B for the top-K objectives."""
  # A None default (e.g. dro_kl_grouped's c_pos) becomes a float placeholder so that
  # --config.loss.c_pos=0.7 can override it.
  loss = {k: config_dict.placeholder(float) if v is None else v
          for k, v in objectives.hparam_defaults(name).items()}
  loss["name"] = name
  if "similarity" in loss:
    loss["similarity"] = "cosine"
  row = {"loss": loss}
  if name in ("dro_topk", "dro_topk_pn", "dro_kl"):
    row["loss.k"] = 2 * 128   # the DRO paper's K = 2B (batch_size 128, the default)
  return row


def get_config(arg: str = ""):
  names = objectives.names()   # at call time: objectives a --module registered count too
  variants = {**{n: objective_row(n) for n in names}, **digits_evenodd_eps.VARIANTS}
  return config.build(ROW, arg, variants, groups=(names,), default="nca", path=__file__)
