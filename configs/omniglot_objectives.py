r"""Newer objectives and cross-batch memory on the real Omniglot, on the Table 3 CPU recipe.

Everything but the objective is ``configs/omniglot_cpu.py`` (the small CNN from scratch, 28
px grey drawings, 128-D, batches of 20 alphabets x 8, Adam 1e-3, 300 steps; trained on the 30
background alphabets with language labels; evaluated on the 659 letters of the 20 evaluation
alphabets and the other protocols of that config), so each row compares with that config's
six rows in the README's Table 3.

| argument | objective |
|---|---|
| ``proxy_anchor`` | ProxyAnchor (Kim et al. 2020), margin 0.1, alpha 32; the 30 proxies at a learning rate of 1e-2 (10x the backbone's; the paper uses 100x a fine-tuning rate of 1e-4) |
| ``supcon`` | SupCon (Khosla et al. 2020), temperature 0.1 |
| ``supcon,xbm`` (default) | SupCon with a cross-batch memory of 1,600 embeddings (10 batches), filled and used from step 50 (Wang et al. 2020 wait for the embedding to settle) |

Append ``,smoke`` for a 2-step run.

  python train.py --config=configs/omniglot_objectives.py:proxy_anchor --workdir=runs/omniglot_objectives/proxy_anchor \
      --config.data.options.root=/data/omniglot
"""

from ml_collections import config_dict

from configs import omniglot_cpu

ROWS = ("proxy_anchor", "supcon", "supcon,xbm")


def get_config(arg: str = ""):
  parts = [p for p in arg.split(",") if p]
  smoke = "smoke" in parts
  row = ",".join(p for p in parts if p != "smoke") or "supcon,xbm"
  if row not in ROWS:
    raise ValueError(f"Unknown row {row!r} in --config=configs/omniglot_objectives.py:{arg}; "
                     f"allowed: {', '.join(ROWS)} (optionally followed by ',smoke').")
  c = omniglot_cpu.get_config("triplet,smoke" if smoke else "triplet")
  if row == "proxy_anchor":
    c.loss = config_dict.ConfigDict({"name": "proxy_anchor", "margin": 0.1, "alpha": 32.0})
    c.optimizer.objective_learning_rate = 1e-2
  else:
    c.loss = config_dict.ConfigDict({"name": "supcon", "temperature": 0.1})
    c.optimizer.objective_learning_rate = 0.0
  if row.endswith(",xbm"):
    c.memory.size = 16 if smoke else 1600
    c.memory.start_step = 1 if smoke else 50
  return c
