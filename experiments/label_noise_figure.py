r"""Label-noise paper Figs. 1-3 and 5-7 style: R@1 and NMI against the noise rate p.

  python experiments/label_noise_figure.py \
      --summary=docs/results/reproductions/label_noise.json --out=docs/figures/label_noise.png
  python experiments/label_noise_figure.py \
      --summary=docs/results/reproductions/omniglot_label_noise.json \
      --out=docs/figures/label_noise_omniglot.png \
      --title="Label-noise paper Figs. 1-3 and 5-7 style on Omniglot (the 659 unseen letters)"

Draws from the summary alone (``python docs/tables.py summarize`` keeps every seed's results
of every run in it), so the figure always shows the runs of the table. One column per loss,
as the paper's panels (a)-(c) (and (c'), Wu et al.'s training of the margin loss): the run
trained with label noise p and the topline trained on the clean 1 - p subset, mean ± std over
the seeds; the last column is panel (d), the ratio of the two means. One row per metric (R@1
as Figs. 1-3, NMI as Figs. 5-7). A case whose two columns the summary lacks is left out (the
Omniglot summary has no (c')).
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dml_jax.evaluation import report  # pylint: disable=g-import-not-at-top

# (panel, loss, column of the noisy run, column of its clean 1 - p topline): the paper's
# panels (a)-(c), and Wu et al.'s training of the margin loss beside them
CASES = (("a", "triplet, random semi-hard", "random semi-hard", "clean 1−p (random)"),
         ("b", "triplet, fixed semi-hard", "fixed semi-hard", "clean 1−p (fixed)"),
         ("c", "margin, the paper's (β 1.4, random semi-hard)", "margin, paper's",
          "clean 1−p (margin, paper's)"),
         ("c'", "margin, Wu et al.'s (distance-weighted)", "margin, Wu et al.'s",
          "clean 1−p (margin, Wu et al.'s)"))
METRICS = (("recall@1", "R@1"), ("nmi", "NMI"))
DEFAULT_TITLE = "Label-noise paper Fig. 1-2 and 5 style on the digits (unseen digits 6-9)"


def curve(summary: dict, header: str, metric: str) -> tuple[np.ndarray, np.ndarray,
                                                            np.ndarray]:
  """``(p [R], mean [R], std [R])`` in percent of ``metric`` for the column ``header``: one
  entry per row of the summary (``p`` its first cell), mean and sample std over the seeds."""
  headers = [c["header"] for c in summary["columns"]]
  if header not in headers:
    raise ValueError(f"the summary has no column {header!r}; its columns: {headers}.")
  column = headers.index(header)
  ps, means, stds = [], [], []
  for row in summary["rows"]:
    run = row["runs"][column]
    seeds = summary["runs"].get(run)
    if not seeds:
      raise ValueError(f"no results of run {run!r} (column {header!r}) in the summary: "
                       "fill it with python docs/tables.py summarize.")
    values = 100.0 * np.array([seeds[s][row["protocol"]][metric]
                               for s in sorted(seeds, key=int)])
    ps.append(float(row["cells"][0]))
    means.append(values.mean())
    stds.append(values.std(ddof=1) if len(values) > 1 else 0.0)
  return np.array(ps), np.array(means), np.array(stds)


def cases(summary: dict) -> tuple:
  """The entries of ``CASES`` whose noisy run or topline is a column of ``summary`` (a case
  with only one of the two is drawn, so that :func:`curve` names the missing one)."""
  headers = {c["header"] for c in summary["columns"]}
  found = tuple(case for case in CASES if headers & set(case[2:]))
  if not found:
    raise ValueError(f"the summary has none of the columns {[c[2] for c in CASES]}.")
  return found


def draw(summary: dict, path: str, title: str = DEFAULT_TITLE) -> str:
  """Writes the figure (``len(METRICS)`` rows x one panel per case and panel (d)) to ``path``."""
  plt = report.pyplot()
  drawn = cases(summary)
  fig, axes = plt.subplots(len(METRICS), len(drawn) + 1, figsize=(3.6 * (len(drawn) + 1), 7),
                           dpi=90, squeeze=False)
  for i, (metric, name) in enumerate(METRICS):
    for j, (panel, case_title, noisy, clean) in enumerate(drawn):
      ax, color, means = axes[i, j], f"C{j}", []
      for header, style, label in ((noisy, "-o", "noise p"), (clean, "--s", "clean 1−p")):
        p, mean, std = curve(summary, header, metric)
        ax.errorbar(p, mean, yerr=std, fmt=style, capsize=3, color=color, label=label)
        means.append(mean)
      ax.set_title(f"({panel}) {case_title}", fontsize=9)
      ax.set_xlabel("label noise p")
      ax.set_ylabel(f"test {name} (%)")
      ax.legend(fontsize=7)
      ax.grid(alpha=0.3)
      ratio_ax = axes[i, -1]
      ratio_ax.plot(p, means[0] / means[1], "-o", color=color, label=f"({panel})")
    lows, highs = zip(*(axes[i, j].get_ylim() for j in range(len(drawn))))
    for j in range(len(drawn)):   # one scale for the losses of a row
      axes[i, j].set_ylim(min(lows), max(highs))
    ratio_ax.set_title(f"(d) {name} with noise p / {name} on the clean 1−p", fontsize=9)
    ratio_ax.set_xlabel("label noise p")
    ratio_ax.set_ylabel("ratio of the seeds' means")
    ratio_ax.legend(fontsize=7, ncol=len(drawn), loc="upper right")
    ratio_ax.grid(alpha=0.3)
  seeds = sorted({int(s) for runs in summary["runs"].values() for s in runs})
  stamp = summary["stamp"]
  fig.suptitle(f"{title}: mean ± std over {len(seeds)} seeds "
               f"(commit {stamp['commit']}, {stamp['date']})", fontsize=10)
  return report.save(fig, path)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--summary", default="docs/results/reproductions/label_noise.json",
                      help="a label-noise summary of docs/tables.py summarize")
  parser.add_argument("--out", default="docs/figures/label_noise.png")
  parser.add_argument("--title", default=DEFAULT_TITLE,
                      help="what the runs are, above the panels")
  args = parser.parse_args(argv)
  try:
    with open(args.summary) as f:
      summary = json.load(f)
    print(draw(summary, args.out, args.title))
  except (OSError, ValueError) as e:
    print(f"label_noise_figure: {args.summary}: {e}", file=sys.stderr)
    return 2
  except KeyError as e:
    print(f"label_noise_figure: {args.summary} is not a summary of docs/tables.py summarize "
          f"(no {e} in it).", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
