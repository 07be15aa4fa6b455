"""Learning curves: the training loss of metrics.jsonl and every metric on one figure."""

from PIL import Image

from dml_jax.evaluation import report


def test_train_curve_and_one_figure_of_loss_and_metrics(tmp_path):
  rows = [{"step": 5, "train/loss": 0.9}, {"step": 10, "train/loss": 0.5},
          {"step": 10, "eval/test/recall@1": 0.3}]
  assert report.train_curve(rows) == {5: 0.9, 10: 0.5}
  history = {10: {"test": {"recall@1": 0.3, "map@r": 0.1}},
             20: {"test": {"recall@1": 0.4, "map@r": 0.2}}}
  both = report.plot_curves(history, path=str(tmp_path / "both.png"),
                            train={"train/loss": report.train_curve(rows)})
  alone = report.plot_curves(history, path=str(tmp_path / "alone.png"))
  with Image.open(both) as a, Image.open(alone) as b:
    assert a.size[0] > b.size[0]     # 3 panels in a row instead of 2
  only_loss = report.plot_curves({}, path=str(tmp_path / "loss.png"),
                                 train={"train/loss": {1: 1.0, 2: 0.5}})
  with Image.open(only_loss) as c:
    assert c.size[0] > 100
