"""Every experiment config loads, has the DESIGN schema, and builds its objective."""

import glob
import importlib
import os

import pytest

from dml_jax import objectives
from dml_test_support import ROOT

CONFIGS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
                 if not os.path.basename(p).startswith("_")
                 and os.path.basename(p) not in ("default.py", "recipes.py"))
SCHEMA = ("seed", "num_train_steps", "batch_size", "log_every_steps", "checkpoint_every_steps",
          "eval_every_steps", "data.name", "data.group_size", "data.image_size",
          "data.label_noise", "data.clean_fraction", "model.name", "model.embedding_dim",
          "model.pretrained", "model.freeze_bn", "loss.name", "optimizer.name",
          "optimizer.learning_rate", "optimizer.schedule", "eval.ks")


def get(c, dotted):
  for part in dotted.split("."):
    c = c[part]
  return c


# The argument that selects the smoke variant of each config.
SMOKE_ARG = {"digits_objective": "nca,smoke"}


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("variant", ["", "smoke"])
def test_config_schema_and_objective(name, variant):
  arg = SMOKE_ARG.get(name, "smoke") if variant else ""
  c = importlib.import_module(f"configs.{name}").get_config(arg)
  for key in SCHEMA:
    get(c, key)  # raises if missing
  obj = objectives.make(**c.loss.to_dict())
  assert obj.name == c.loss.name
  if variant:
    assert c.num_train_steps <= 50


def test_the_two_digits_configs_differ_only_in_the_positive():
  from configs import digits_evenodd_eps, digits_evenodd_triplet  # pylint: disable=import-outside-toplevel
  eps, base = digits_evenodd_eps.get_config(), digits_evenodd_triplet.get_config()
  assert eps.loss.positive == "easy" and base.loss.positive == "random"
  base.loss.positive = "easy"
  assert eps.to_dict() == base.to_dict()


def test_unknown_config_argument():
  from configs import digits_evenodd_eps  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="smoke"):
    digits_evenodd_eps.get_config("smok")


@pytest.mark.slow
@pytest.mark.parametrize("objective", objectives.names())
def test_every_objective_trains_on_digits(objective, tmp_path):
  """configs/digits_objective.py:NAME runs end to end and the loss stays finite."""
  from configs import digits_objective  # pylint: disable=import-outside-toplevel
  from dml_jax import training  # pylint: disable=import-outside-toplevel
  c = digits_objective.get_config(f"{objective},smoke")
  c.num_train_steps, c.batch_size, c.data.group_size = 4, 32, 16
  c.log_every_steps, c.checkpoint_every_steps = 2, 4
  if "k" in c.loss:
    c.loss.k = 64
  results = training.train_and_evaluate(c, str(tmp_path), show_progress=False)
  assert 0.0 < results["test"]["recall@1"] <= 1.0
  c2 = digits_objective.get_config(objective)
  assert c2.loss.name == objective and objectives.make(**c2.loss.to_dict()).name == objective


def test_digits_objective_rejects_unknown_name():
  from configs import digits_objective  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="Unknown objective 'npair'.*available: binomial"):
    digits_objective.get_config("npair")
