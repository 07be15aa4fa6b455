r"""Newer objectives and cross-batch memory on the real Omniglot, on the Table 3 CPU recipe.

Everything but the objective is ``configs/omniglot_cpu.py`` (the small CNN from scratch, 28
px grey drawings, 128-D, batches of 20 alphabets x 8, Adam 1e-3, 300 steps; trained on the 30
background alphabets with language labels; evaluated on the 659 letters of the 20 evaluation
alphabets and the other protocols of that config), so each row compares with that config's
six rows in docs/reproductions.md (EPS Table 3 on Omniglot).

| argument | objective |
|---|---|
| ``proxy_anchor`` | ProxyAnchor (Kim et al. 2020), margin 0.1, alpha 32; the 30 proxies at a learning rate of 1e-2 (10x the backbone's; the paper uses 100x a fine-tuning rate of 1e-4) |
| ``supcon`` | SupCon (Khosla et al. 2020), temperature 0.1 |
| ``supcon,xbm`` (default) | SupCon with a cross-batch memory of 1,600 embeddings (10 batches), filled and used from step 50 (Wang et al. 2020 wait for the embedding to settle) |

Append ``,smoke`` for a 2-step run.

  python train.py --config=configs/omniglot_objectives.py:proxy_anchor --workdir=runs/omniglot_objectives/proxy_anchor \
      --config.data.options.root=/data/omniglot
"""

from configs import omniglot_cpu
from dml_jax.run import config

ROW = omniglot_cpu.ROW


def smoke(c) -> dict:
  """omniglot_cpu's smoke run; the memory (if any) holds 16 embeddings from step 1."""
  return {**omniglot_cpu.SMOKE,
          **({"memory.size": 16, "memory.start_step": 1} if c.memory.size else {})}


VARIANTS = {
    "proxy_anchor": {"loss": {"name": "proxy_anchor", "margin": 0.1, "alpha": 32.0},
                     "optimizer.objective_learning_rate": 1e-2},
    "supcon": {"loss": {"name": "supcon", "temperature": 0.1},
               "optimizer.objective_learning_rate": 0.0},
    "xbm": {"memory.size": 1600, "memory.start_step": 50},
    "smoke": smoke,
}
GROUPS = (("proxy_anchor", "supcon"),)
DEFAULT = "supcon,xbm"


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, groups=GROUPS, default=DEFAULT, path=__file__)
