"""The HTML run report, parsed back: every image decodes, the config differences and the
mean ± std table hold the runs' numbers, and runs without evaluation are clear errors."""

import base64
import html.parser
import io
import os

import matplotlib.pyplot as plt
import ml_collections
import numpy as np
import pytest
from PIL import Image

from dml_jax.run import summary as run_report
from dml_jax.run import workdir as workdir_lib
from dml_jax.evaluation import report
from dml_test_support import small_config


class Page(html.parser.HTMLParser):
  """Images (``src``) and tables (rows of cell texts) of a page."""

  def __init__(self):
    super().__init__()
    self.images, self.tables, self.scripts = [], [], 0
    self._cell = None

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if tag == "img":
      self.images.append(attrs["src"])
    elif tag == "script":
      self.scripts += 1
    elif tag == "table":
      self.tables.append({"class": attrs.get("class"), "rows": []})
    elif tag == "tr":
      self.tables[-1]["rows"].append([])
    elif tag in ("td", "th"):
      self._cell = ""

  def handle_data(self, data):
    if self._cell is not None:
      self._cell += data

  def handle_endtag(self, tag):
    if tag in ("td", "th"):
      self.tables[-1]["rows"][-1].append(self._cell)
      self._cell = None


def fake_run(path, *, seed, positive, recall, steps=(10, 20), grid=False):
  """A workdir with a config, metrics.jsonl and eval_step files (no training)."""
  config = small_config(20)
  config.seed, config.loss.positive = seed, positive
  os.makedirs(path)
  workdir_lib.write_config(config, path)
  for step in (5, 10, 15, 20):
    workdir_lib.append_metrics(path, {"step": step, "train/loss": 1.0 / step + seed})
  for step in steps:
    results = {"test": {"recall@1": recall * step / steps[-1], "map@r": recall / 2},
               "train:digit": {"recall@1": recall / 3, "map@r": 0.1}}
    report.write_results(results, workdir=path, step=step)
  if grid:
    Image.new("RGB", (30, 20), "red").save(os.path.join(path, "retrieval_grid_test_step_20.png"))


def test_report_of_seeds_and_a_baseline(tmp_path):
  recalls = {("easy", 0): 0.5, ("easy", 1): 0.7, ("easy", 2): 0.9, ("random", 0): 0.4}
  for (positive, seed), r in recalls.items():
    fake_run(str(tmp_path / "runs" / f"{positive}_{seed}"), seed=seed, positive=positive,
             recall=r, grid=positive == "random")
  os.makedirs(tmp_path / "runs" / "unfinished")
  workdir_lib.write_config(small_config(20), str(tmp_path / "runs" / "unfinished"))
  out = run_report.build_report([str(tmp_path / "runs")], out=str(tmp_path / "r.html"))
  assert out["skipped"] == ["unfinished"] and len(out["runs"]) == 4
  page = Page()
  with open(out["out"]) as f:
    page.feed(f.read())
  assert page.scripts == 0
  # 2 groups of learning curves + 1 retrieval grid, all inline PNGs that decode.
  assert len(page.images) == 3
  for src in page.images:
    assert src.startswith("data:image/png;base64,")
    with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as image:
      image.load()
  config, metrics = ({t["class"]: t["rows"] for t in page.tables}[k] for k in ("config",
                                                                                 "metrics"))
  assert config[0] == ["run", "final step", "loss.positive", "seed"]
  assert ["easy_1", "20", "easy", "1"] in config
  header = metrics[0]
  rows = {(r[0], r[2]): dict(zip(header, r)) for r in metrics[1:]}
  easy = rows[("loss.positive=easy", "test")]
  values = 100 * np.array([0.5, 0.7, 0.9])
  assert easy["runs"] == "3"
  assert easy["recall@1"] == f"{values.mean():.2f} ± {values.std(ddof=1):.2f}"
  assert rows[("loss.positive=random", "train:digit")]["recall@1"] == f"{100 * 0.4 / 3:.2f}"


def test_out_replaces_only_an_earlier_page(tmp_path):
  fake_run(str(tmp_path / "run"), seed=0, positive="easy", recall=0.5)
  config = (tmp_path / "run" / "config.json").read_text()
  mine = tmp_path / "mine.html"
  mine.write_text("<!DOCTYPE html><html>my own page</html>")
  for other in (tmp_path / "run" / "config.json", mine):
    with pytest.raises(ValueError, match=rf"^--out={other} exists and is not an earlier page "
                       r"of this tool; it is left as it is"):
      run_report.build_report([str(tmp_path / "run")], out=str(other))
  assert (tmp_path / "run" / "config.json").read_text() == config
  assert mine.read_text() == "<!DOCTYPE html><html>my own page</html>"
  page = str(tmp_path / "r.html")
  run_report.build_report([str(tmp_path / "run")], out=page)
  run_report.build_report([str(tmp_path / "run")], out=page)   # its own page: replaced
  older = tmp_path / "older.html"   # a page written before the generator mark
  older.write_text(open(page).read().replace(run_report.GENERATOR, ""))
  run_report.build_report([str(tmp_path / "run")], out=str(older))
  assert run_report.GENERATOR in older.read_text()


def test_runs_without_evaluation_are_clear_errors(tmp_path):
  workdir_lib.write_config(small_config(20), str(tmp_path / "run"))
  with pytest.raises(ValueError, match="No run under .* has an evaluation"):
    run_report.build_report([str(tmp_path)], out=str(tmp_path / "r.html"))
  with pytest.raises(FileNotFoundError, match="is not a directory"):
    run_report.find_workdirs([str(tmp_path / "missing")])
  os.makedirs(tmp_path / "empty")
  with pytest.raises(FileNotFoundError, match="No run"):
    run_report.find_workdirs([str(tmp_path / "empty")])
  assert run_report.main([str(tmp_path / "run"), "--out", str(tmp_path / "r.html")]) == 1


def test_mean_history_averages_the_common_steps(tmp_path):
  for seed, r in ((0, 0.2), (1, 0.4)):
    fake_run(str(tmp_path / f"s{seed}"), seed=seed, positive="easy", recall=r)
  runs = [run_report.load_run(str(tmp_path / f"s{s}")) for s in (0, 1)]
  history, loss = run_report.mean_history(runs)
  assert sorted(history) == [10, 20]
  assert history[20]["test"]["recall@1"] == pytest.approx(0.3)
  assert loss[5] == pytest.approx(0.2 + 0.5)


def test_two_objectives_evaluated_once_name_count_and_mark_their_points(tmp_path, monkeypatch,
                                                                         capsys):
  """Keys only one objective has are not 'None' in the other's group name, one run is '1 run',
  and a group evaluated once draws its evaluation as a marker, not a line."""
  fake_run(str(tmp_path / "runs" / "triplet"), seed=0, positive="easy", recall=0.5, steps=(20,))
  fake_run(str(tmp_path / "runs" / "nca"), seed=0, positive="easy", recall=0.4, steps=(20,))
  config = small_config(20)
  config.loss = ml_collections.ConfigDict({"name": "nca", "temperature": 0.1})
  workdir_lib.write_config(config, str(tmp_path / "runs" / "nca"))
  figures = []
  monkeypatch.setattr(plt, "close", figures.append)
  out = run_report.build_report([str(tmp_path / "runs")], out=str(tmp_path / "r.html"))
  with open(out["out"]) as f:
    text = f.read()
  assert "2 runs in 2 groups" in text and "None" not in text.split("Config differences")[0]
  page = Page()
  page.feed(text)
  groups = [r[0] for r in {t["class"]: t["rows"] for t in page.tables}["metrics"][1:]]
  nca = next(g for g in groups if "loss.name=nca" in g)
  assert "loss.temperature=0.1" in nca and "margin" not in nca
  assert not any("None" in g for g in groups)
  titles = sorted(f._suptitle.get_text() for f in figures)
  assert len(titles) == 2 and all(t.endswith(" (1 run)") for t in titles), titles
  lines = [line for f in figures for ax in f.axes for line in ax.get_lines()]
  single = [line for line in lines if len(line.get_xdata()) == 1]
  assert single and all(line.get_linestyle() == "None" and line.get_marker() == "o"
                        for line in single)
  assert any(len(line.get_xdata()) == 4 and line.get_linestyle() == "-" for line in lines)
  monkeypatch.undo()
  assert run_report.main([str(tmp_path / "runs" / "nca"), "--out", str(tmp_path / "n.html")]) == 0
  assert capsys.readouterr().out.startswith("1 run; written")
