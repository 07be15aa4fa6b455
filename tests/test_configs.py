"""Every experiment config loads, has the config schema (configs/default.py), and builds its
objective."""

import glob
import importlib
import itertools
import json
import os
import re
import sys

import numpy as np
import pytest

from dml_jax import objectives
from dml_jax.run import config as config_lib
from dml_test_support import ROOT, write_user_module

if ROOT not in sys.path:   # ``python tests/test_configs.py`` (conftest does this under pytest)
  sys.path.insert(0, ROOT)

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


# The argument that selects the smoke variant of each config without VARIANTS.
SMOKE_ARG = {"digits_objective": "nca,smoke"}


def variants(name: str) -> tuple[str, ...]:
  """A config file's rows: one variant of each of its ``GROUPS`` (e.g. label_noise's
  'cub,margin'), or ``('',)`` for a file of one row."""
  groups = getattr(importlib.import_module(f"configs.{name}"), "GROUPS", ())
  return tuple(",".join(p) for p in itertools.product(*groups)) if groups else ("",)


# Every experiment: 'name' or 'name:variant' (the --config=configs/name.py:variant spelling).
EXPERIMENTS = [f"{n}:{v}" if v else n for n in CONFIGS for v in variants(n)]


def load(spec: str, *extra: str):
  """The config of ``spec`` ('name[:variant]') with more argument parts, e.g. ``'smoke'``."""
  name, _, variant = spec.partition(":")
  if not variant and extra == ("smoke",):
    return importlib.import_module(f"configs.{name}").get_config(SMOKE_ARG.get(name, "smoke"))
  return importlib.import_module(f"configs.{name}").get_config(
      ",".join(p for p in (variant, *extra) if p))


@pytest.mark.parametrize("spec", EXPERIMENTS)
@pytest.mark.parametrize("variant", ["", "smoke"])
def test_config_schema_and_objective(spec, variant):
  c = load(spec, variant) if variant else load(spec)
  for key in SCHEMA:
    get(c, key)  # raises if missing
  obj = objectives.make(**c.loss.to_dict())
  assert obj.name == c.loss.name
  if variant:
    assert c.num_train_steps <= 50


def _model_input(c, pixels):
  """The input the model's first layer sees for RGB ``pixels`` uint8 ``[..., 3]`` under config
  ``c`` (the data normalisation, then BN-Inception's channel reversal)."""
  from dml_jax.data import augment  # pylint: disable=import-outside-toplevel
  from dml_jax.models import bn_inception  # pylint: disable=import-outside-toplevel
  x = augment.normalize_pixels(pixels, mean=tuple(c.data.mean), std=tuple(c.data.std))
  return np.asarray(bn_inception.to_port_channels(x)) if c.model.name == "bn_inception" else x


@pytest.mark.parametrize("spec", [s for s in EXPERIMENTS if load(s).model.pretrained])
def test_pretrained_configs_normalise_as_their_weights_expect(spec):
  """torchvision's ResNets: RGB in [0, 1] with ImageNet mean / std; the BN-Inception port
  (the MS / DRO code's weights): BGR in [0, 255] minus (104, 117, 128)."""
  c = load(spec)
  rgb = np.array([[0, 0, 0], [255, 255, 255], [200, 100, 30], [7, 180, 250]], np.uint8)
  if c.model.name == "bn_inception":
    want = rgb[:, ::-1].astype(np.float32) - np.array([104.0, 117.0, 128.0], np.float32)
  else:
    want = (rgb / 255.0 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
  np.testing.assert_allclose(_model_input(c, rgb), want, rtol=1e-5, atol=1e-4)


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


# One objective per family module of dml_jax/objectives trains end to end by default (each
# run is mostly compilation, ~10 s); the others are `long` (python -m pytest -m long).
TRAINED_BY_DEFAULT = ("nca", "triplet", "margin", "proxy_anchor", "softtriple", "supcon",
                      "angular", "multi_similarity", "fastap", "dro_kl")


def objective_param(name):
  return pytest.param(name, marks=[] if name in TRAINED_BY_DEFAULT else [pytest.mark.long])


def test_trained_by_default_are_objectives():
  assert set(TRAINED_BY_DEFAULT) <= set(objectives.names())


@pytest.mark.parametrize("objective", objectives.names())
def test_digits_objective_config_makes_every_objective(objective):
  from configs import digits_objective  # pylint: disable=import-outside-toplevel
  for arg in (objective, f"{objective},smoke"):
    c = digits_objective.get_config(arg)
    assert c.loss.name == objective and objectives.make(**c.loss.to_dict()).name == objective


@pytest.mark.slow
@pytest.mark.parametrize("objective", [objective_param(n) for n in objectives.names()])
def test_every_objective_trains_on_digits(objective, tmp_path):
  """configs/digits_objective.py:NAME runs end to end and the loss stays finite."""
  from configs import digits_objective  # pylint: disable=import-outside-toplevel
  from dml_jax.run import training  # pylint: disable=import-outside-toplevel
  c = digits_objective.get_config(f"{objective},smoke")
  c.num_train_steps, c.batch_size, c.data.group_size = 2, 32, 16
  c.log_every_steps, c.checkpoint_every_steps = 1, 2
  if "k" in c.loss:
    c.loss.k = 64
  results = training.train_and_evaluate(c, str(tmp_path), show_progress=False)
  assert 0.0 < results["test"]["recall@1"] <= 1.0


def test_digits_objective_rejects_unknown_name():
  from configs import digits_objective  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="unknown variant 'npair'.*allowed: angular, arcface"):
    digits_objective.get_config("npair")


GOLDEN = os.path.join(ROOT, "tests", "golden", "resolved_configs.json")


def resolved(spec_arg: str) -> dict:
  """``'name:arg'`` -> ``{'config': every key but loss, 'loss': the objective's hparams with
  defaults, 'name': loss.name}`` (JSON types), what an experiment resolves to."""
  name, _, arg = spec_arg.partition(":")
  c = importlib.import_module(f"configs.{name}").get_config(arg)
  tree = c.to_dict()
  loss = tree.pop("loss")
  as_json = lambda x: json.loads(json.dumps(x, default=list))
  return {"config": as_json(tree), "name": loss["name"],
          "loss": as_json(objectives.make(**loss).hparams)}


def test_experiments_resolve_as_recorded():
  """Reshaping the configs (variants instead of clone files) changed no experiment.
  A config changed on purpose is re-recorded with ``python tests/test_configs.py``."""
  with open(GOLDEN) as f:
    golden = json.load(f)
  assert {"label_noise:cub,margin", "digits_evenodd_eps:", "omniglot_cpu:eps_ms"} <= set(golden)
  changed = [spec for spec, want in golden.items() if resolved(spec) != want]
  assert not changed, f"these experiments resolve differently from {GOLDEN}: {changed}"


def write_golden() -> None:
  """Re-records every experiment already in the file and each of ``EXPERIMENTS``."""
  with open(GOLDEN) as f:
    specs = set(json.load(f)) | {s if ":" in s else f"{s}:" for s in EXPERIMENTS}
  golden = {spec: resolved(spec) for spec in specs}
  with open(GOLDEN, "w") as f:
    f.write("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
                               for k, v in sorted(golden.items())) + "\n}\n")



# ------------------------------------------------------------ rows, variants, show


def test_a_variant_argument_is_parsed_in_one_place():
  variants = {"cub": {}, "sop": {}, "margin": {}, "triplet": {}, "smoke": {}}
  groups = (("cub", "sop"), ("margin", "triplet"))
  select = lambda arg: config_lib.select(arg, variants, groups=groups, default="cub,margin",
                                         path="configs/x.py")
  assert select("") == ["cub", "margin"]
  assert select("smoke") == ["cub", "margin", "smoke"]
  assert select("smoke,triplet,sop") == ["sop", "triplet", "smoke"]   # the file's order
  with pytest.raises(ValueError, match=r"^unknown variant 'smok' in --config=configs/x.py:"
                                       r"sop,smok; allowed: cub, sop, margin, triplet, smoke$"):
    select("sop,smok")
  with pytest.raises(ValueError, match=r"^--config=configs/x.py:cub,sop,margin names more "
                                       r"than one of cub, sop$"):
    select("cub,sop,margin")
  with pytest.raises(ValueError, match=r"^--config=configs/x.py:cub needs one of margin, "
                                       r"triplet$"):
    select("cub")
  with pytest.raises(ValueError, match="allowed: none"):
    config_lib.select("smoke", {})


def test_a_row_sets_keys_of_the_default_config_only():
  from configs import default  # pylint: disable=import-outside-toplevel
  c = config_lib.apply_row(default.get_config(), {"loss": {"name": "triplet"},
                                                  "loss.margin": 0.3, "data.options.root": "r",
                                                  "optimizer.learning_rate": 0.5})
  assert c.loss.to_dict() == {"name": "triplet", "margin": 0.3}
  assert (c.data.options.root, c.optimizer.learning_rate) == ("r", 0.5)
  with pytest.raises(ValueError, match="^config row key optimizer.learning_rat is not a key"):
    config_lib.apply_row(default.get_config(), {"optimizer.learning_rat": 0.5})


def test_paper_configs_set_no_machine_settings():
  """Machine tuning comes from train.py's flags or the environment, not from experiments."""
  from configs import default  # pylint: disable=import-outside-toplevel
  base = default.get_config()
  for spec in EXPERIMENTS:
    for c in (load(spec), load(spec, "smoke")):
      assert c.keep_host_memory == base.keep_host_memory, spec
      assert (c.data.num_threads, c.data.num_workers) == (base.data.num_threads,
                                                          base.data.num_workers), spec


def test_the_eps_losses_are_defined_once():
  from configs import recipes  # pylint: disable=import-outside-toplevel
  assert load("cub_eps_triplet").loss.to_dict() == recipes.EPS_LOSSES["eps_triplet"]["loss"]
  assert load("cub_eps_ms").loss.to_dict() == recipes.EPS_LOSSES["eps_ms"]["loss"]
  assert load("omniglot_cpu:margin").loss.to_dict() == recipes.EPS_LOSSES["margin"]["loss"]


def test_show_prints_a_resolved_row(capsys):
  path = os.path.join(ROOT, "configs", "cub_ephn_2nd.py")
  assert config_lib.main(["show", path]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert "seed = 0" in lines and 'data.name = "cub"' in lines
  assert "loss.temperature = 0.1" in lines and "optimizer.decay_epochs = [20, 30]" in lines
  assert config_lib.main(["show", path + ":smoke", "--diff-default",
                          "--set=loss.temperature=0.05", "--set", "seed=3"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert "seed = 3" in lines and "loss.temperature = 0.05" in lines
  assert "optimizer.learning_rate = 0.0025" in lines and "num_train_steps = 2" in lines
  assert not [l for l in lines if l.startswith(("eval.similarity", "data.pad", "log."))]


def test_show_takes_a_module_and_a_configs_own_user_modules(tmp_path, monkeypatch, capsys):
  from dml_jax.objectives import _registry  # pylint: disable=import-outside-toplevel
  module = write_user_module(str(tmp_path))
  own = tmp_path / "own.py"
  own.write_text("from configs import digits_evenodd_eps\n\n\ndef get_config(arg=''):\n"
                 "  c = digits_evenodd_eps.get_config(arg)\n"
                 "  c.user_modules = ('my_objectives.py',)\n"
                 "  c.loss = {'name': 'scaled_triplet', 'scale': 2.0}\n  return c\n")
  monkeypatch.chdir(tmp_path)   # the config's user_modules path is relative to it
  try:
    objective = os.path.join(ROOT, "configs", "digits_objective.py") + ":scaled_triplet"
    assert config_lib.main(["show", objective, f"--module={module}"]) == 0
    assert 'loss.name = "scaled_triplet"' in capsys.readouterr().out.splitlines()
    assert config_lib.main(["show", str(own)]) == 0
    assert "loss.scale = 2.0" in capsys.readouterr().out.splitlines()
  finally:
    _registry.REGISTRY.pop("scaled_triplet", None)
    _registry.SUPPORT.pop("scaled_triplet", None)
    for name in [m for m in sys.modules if m.startswith("dml_jax_user_my_objectives")]:
      sys.modules.pop(name)


def test_show_refuses_a_bad_key_or_variant_in_one_line(capsys):
  path = os.path.join(ROOT, "configs", "cub_ephn_2nd.py")
  assert config_lib.main(["show", path, "--set=optimizer.learning_rat=1"]) == 1
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and "unknown config key optimizer.learning_rat" in err
  assert config_lib.main(["show", path + ":tiny"]) == 1
  assert "unknown variant 'tiny'" in capsys.readouterr().err


def test_validate_is_the_check_of_every_binary():
  from configs import default  # pylint: disable=import-outside-toplevel
  c = default.get_config()
  config_lib.validate(c)
  c.model.name, c.model.bn_mode = "resnet18", "frozn"
  with pytest.raises(ValueError, match="bn_mode='frozn'; allowed"):
    config_lib.validate(c)
  c = default.get_config()
  c.model.conv_impl = "cudnn"   # every model takes it, the small CNN too
  with pytest.raises(ValueError, match="conv_impl='cudnn'; allowed: auto, lax, matmul, "
                                       "lax_aligned"):
    config_lib.validate(c)
  c = default.get_config()
  c.data.name, c.data.image_size, c.data.augmentation = "cub", 32, "crop"
  with pytest.raises(ValueError, match="Unknown augmentation 'crop'"):
    config_lib.validate(c)


@pytest.mark.parametrize("value", [0, -3])
def test_embedding_dim_is_a_positive_integer(value):
  from configs import default  # pylint: disable=import-outside-toplevel
  c = default.get_config()
  c.model.embedding_dim = value
  with pytest.raises(ValueError, match=f"^config.model.embedding_dim must be a positive "
                                       f"integer, got {value}.$"):
    config_lib.validate(c)


def test_a_model_option_the_model_lacks_is_named_by_its_config_key():
  """The small CNN has no dtype / pooling / embedding head options: setting one is refused
  before any data is read, naming the key and the models that have it; the same value on a
  ResNet passes. An unknown model.name lists the registered models."""
  from configs import default  # pylint: disable=import-outside-toplevel
  for key, value in (("dtype", "bfloat16"), ("pooling", "max"), ("bn_mode", "frozen"),
                     ("embedding_hidden", (64,))):
    c = default.get_config()
    assert c.model.name == "small_cnn"
    c.model[key] = value
    with pytest.raises(ValueError, match=(
        rf"^config.model.{key}={re.escape(repr(value))}: model.name='small_cnn' has no {key} "
        r"option; leave it at its default \(the models with one: resnet18, resnet34, "
        r"resnet50, bn_inception\).$")):
      config_lib.validate(c)
    c.model.name = "resnet18"
    config_lib.validate(c)
  c.model.name = "resnet19"
  with pytest.raises(ValueError, match=r"^Unknown model.name 'resnet19'; allowed: bn_inception, "
                                       r"resnet18, resnet34, resnet50, small_cnn.$"):
    config_lib.validate(c)


def test_a_bad_loss_value_is_named_by_its_config_key():
  """The builder's error names the hyper-parameter; the config's names ``loss.KEY``, the key
  the user set, and leaves the builder's other errors as they are."""
  from configs import digits_objective  # pylint: disable=import-outside-toplevel
  c = digits_objective.get_config("proxy_anchor")
  assert config_lib.make_objective(c).name == "proxy_anchor"
  c.loss.alpha = -1.0
  with pytest.raises(ValueError, match=r"^loss.alpha must be a number > 0, got -1.0.$"):
    config_lib.make_objective(c)
  c = digits_objective.get_config("triplet")
  c.loss.positive = "hardest"
  with pytest.raises(ValueError, match=r"^loss.positive='hardest' is not allowed; choose one"):
    config_lib.make_objective(c)
  c.loss.name = "tripplet"
  with pytest.raises(ValueError, match=r"^unknown objective loss.name='tripplet'"):
    config_lib.make_objective(c)


@pytest.mark.parametrize("key", ["scatter_every_steps", "eval.retrieval_grid"])
def test_a_plot_of_the_first_protocol_needs_a_protocol(key):
  """``eval.splits=()`` (no evaluation) is allowed, but not with the scatter diagram or the
  retrieval grid, which draw the first protocol: one line before training, not an IndexError
  at the first scatter step."""
  from configs import default  # pylint: disable=import-outside-toplevel
  c = default.get_config()
  c.eval.splits = ()
  config_lib.validate(c)
  *parents, leaf = key.split(".")
  node = c
  for part in parents:
    node = node[part]
  node[leaf] = 4
  with pytest.raises(ValueError, match=f"config.{key}=4 draws the first protocol of "
                                       r"eval.splits, which is empty"):
    config_lib.validate(c)

if __name__ == "__main__":
  write_golden()
