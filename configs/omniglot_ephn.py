r"""EPHN paper §6.1 and Fig. 4 (R@1 of the triplet mining strategies against the group size n)
on the real Omniglot, at CPU scale.

Everything but the mining is the letter recipe of ``configs/omniglot_dro.py`` (the small CNN
from scratch, grey 28 x 28 drawings, 64-D, batches of 80, Adam 1e-3, 600 steps; trained on the
964 letters of the 30 background alphabets, evaluated on the 659 unseen letters of the 20
evaluation alphabets and on the training letters). The loss is the paper's NCA (§4, T 0.1) over
the selected positive and negative(s):

| argument | strategy | positive | negative(s) |
|---|---|---|---|
| ``ep`` | EP, easy positive | the most similar | every negative |
| ``ephn`` (default) | EPHN | the most similar | the most similar |
| ``epshn`` | EPSHN (the paper's Tables 1-3) | the most similar | the most similar one less similar than the positive |
| ``hp`` | HP, hard positive | the least similar | every negative |
| ``hphn`` | HPHN | the least similar | the most similar |
| ``ba`` | BA, batch all | every positive | every negative |

At n = 2 (one positive per anchor) EP, HP and BA are the same loss (N-pair), as are EPHN and
HPHN (the paper, §6.1). Table 1's other rows on the same recipe: ``triplet`` (the triplet loss
on squared distances, every positive, semi-hard negatives, margin 0.2, as FaceNet) and
``proxy_nca`` (ProxyNCA, one proxy per training letter at a learning rate of 1e-2, T 0.1, the
NCA temperature above). The figure sweeps ``data.group_size`` (n) at the fixed batch: n = 2, 4,
8, 16 hold 40, 20, 10 and 5 letters (each letter has 20 drawings). Append ``,smoke`` for a
2-step run.

  python -m dml_jax.run.experiments sweep --config=configs/omniglot_ephn.py \
      --grid='loss.positive+loss.negative=easy+all,easy+hard,easy+semihard' \
      --grid='data.group_size=2' --seeds=3 --workdir=runs/omniglot_ephn_fig4 \
      --set=data.options.root=/data/omniglot --x=data.group_size
  python -m dml_jax.run.experiments sweep --config=configs/omniglot_ephn.py \
      --grid='loss.positive+loss.negative=easy+all,easy+hard,easy+semihard,hard+all,hard+hard,all+all' \
      --grid='data.group_size=8,16' --seeds=3 --workdir=runs/omniglot_ephn_fig4 \
      --set=data.options.root=/data/omniglot --x=data.group_size

(The first command leaves out HP, HPHN and BA, whose n = 2 losses are EP's and EPHN's; the
tables are in docs/reproductions.md. The paper: an ImageNet ResNet-18 on Cars196 at 256 px,
batch 128, SGD for 40 epochs.) Two sweeps vary the rest of the recipe around n (their full
commands are in docs/reproductions.md): 10 letters a batch at every n, on the same 48,000
training drawings a run (``--grid='batch_size+data.group_size+num_train_steps=20+2+2400,
40+4+1200,80+8+600,160+16+300'``), and four times the steps with an evaluation every 600
(``--set=num_train_steps=2400 --set=eval_every_steps=600``).
"""

from configs import omniglot_dro
from dml_jax.run import config

ROW = {**omniglot_dro.ROW, "data.group_size": 4}
STRATEGIES = {"ep": ("easy", "all"), "ephn": ("easy", "hard"), "epshn": ("easy", "semihard"),
              "hp": ("hard", "all"), "hphn": ("hard", "hard"), "ba": ("all", "all")}
VARIANTS = {
    **{name: {"loss": {"name": "nca", "positive": positive, "negative": negative,
                       "temperature": 0.1}}
       for name, (positive, negative) in STRATEGIES.items()},
    # Table 1's other rows (N-pair is ``ep`` at n = 2)
    "triplet": {"loss": {"name": "triplet", "positive": "all", "negative": "semihard",
                         "margin": 0.2}},
    "proxy_nca": {"loss": {"name": "proxy_nca", "temperature": 0.1},
                  "optimizer.objective_learning_rate": 1e-2},
    "smoke": {**omniglot_dro.VARIANTS["smoke"], "data.group_size": 5},
}
GROUPS = ((*STRATEGIES, "triplet", "proxy_nca"),)
DEFAULT = "ephn"


def get_config(arg: str = ""):
  return config.build(ROW, arg, VARIANTS, groups=GROUPS, default=DEFAULT, path=__file__)
