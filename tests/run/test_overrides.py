"""Command-line config overrides: unknown keys, switching the objective, user objectives."""

import os
import sys

import pytest

from dml_jax import objectives
from dml_jax.run import overrides
from dml_test_support import ROOT, USER_MODULE, write_user_module

EPS = os.path.join(ROOT, "configs/digits_evenodd_eps.py")          # triplet
NCA = os.path.join(ROOT, "configs/digits_image_folder.py")         # nca


def test_unknown_keys_are_one_line_with_the_closest_key():
  base = overrides.load_config_file(EPS)
  with pytest.raises(ValueError, match=r"^unknown config key loss.margn \(did you mean "
                                       r"loss.margin\?\) for objective 'triplet'"):
    overrides.apply(base, {"loss.margn": 0.1})
  with pytest.raises(ValueError, match=r"^unknown config key data.group_sise \(did you mean "
                                       r"data.group_size\?\)$"):
    overrides.apply(base, {"data.group_sise": 4})
  with pytest.raises(ValueError, match="^config file configs/nope.py does not exist$"):
    overrides.load_config_file("configs/nope.py")
  with pytest.raises(ValueError, match="unknown objective loss.name='tripplet'.*triplet"):
    overrides.apply(base, {"loss.name": "tripplet"})


def test_a_config_file_that_is_not_there_is_one_line_naming_it():
  with pytest.raises(ValueError, match=r"^config file configs/sop_noise_margin.py does not "
                                       r"exist$"):
    overrides.load_config_file("configs/sop_noise_margin.py")


def test_an_unknown_variant_is_one_line_naming_the_allowed_ones():
  with pytest.raises(ValueError, match=r"^unknown variant 'smok' in --config=.*"
                                       r"digits_evenodd_eps.py:smok; allowed: smoke$"):
    overrides.load_config_file(EPS + ":smok")


def test_a_config_outside_the_checkout_without_its_configs_is_one_line(tmp_path, monkeypatch):
  """A project of one's own with a configs package first on the path (or an installed package
  run away from the checkout): ``from configs import default`` fails in one line."""
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "__init__.py").write_text("")
  (tmp_path / "configs" / "mine.py").write_text(
      "from dml_jax.run import config\n"
      "def get_config(arg=''):\n  return config.build({'seed': 1}, arg)\n")
  monkeypatch.setattr(sys, "path", list(sys.path))
  saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] == "configs"}
  try:
    with pytest.raises(ValueError, match=r"^config file .*mine.py: cannot import name 'default' "
                                         r"from 'configs' .*keep the file in the checkout's configs/"):
      overrides.load_config_file(str(tmp_path / "configs" / "mine.py"))
  finally:
    for k in [k for k in sys.modules if k.split(".")[0] == "configs"]:
      del sys.modules[k]
    sys.modules.update(saved)


def test_switching_the_objective_takes_its_defaults_and_the_given_keys():
  base = overrides.load_config_file(NCA)
  assert base.loss.name == "nca" and "temperature" in base.loss
  config = overrides.apply(base, {"loss.name": "triplet"})
  assert config.loss.to_dict() == {"name": "triplet", **objectives.hparam_defaults("triplet")}
  config = overrides.apply(base, {"loss.name": "triplet", "loss.margin": 0.3,
                                  "loss.positive": "easy"})
  assert (config.loss.margin, config.loss.positive) == (0.3, "easy")
  objectives.make(**config.loss.to_dict())
  # Same name: the file's loss block stays, given keys override it; a valid key the file does
  # not set is accepted (it is the objective's hyper-parameter, not a new config key). Every
  # hyper-parameter is recorded, the defaults the file leaves out included.
  config = overrides.apply(base, {"loss.name": "nca", "loss.temperature": 0.05})
  assert config.loss.to_dict() == {"name": "nca", **objectives.hparam_defaults("nca"),
                                   **base.loss.to_dict(), "temperature": 0.05}
  eps = overrides.apply(overrides.load_config_file(EPS), {"loss.distance": "euclidean"})
  assert eps.loss.distance == "euclidean" and eps.loss.positive == "easy"


def test_strings_convert_to_the_replaced_type():
  base = overrides.load_config_file(EPS)
  config = overrides.apply(base, {"loss.margin": "0.5", "batch_size": "64",
                                  "eval.ks": "(1, 2)", "model.normalize": "true"},
                           from_strings=True)
  assert (config.loss.margin, config.batch_size, tuple(config.eval.ks),
          config.model.normalize) == (0.5, 64, (1, 2), True)
  with pytest.raises(ValueError, match="batch_size"):
    overrides.apply(base, {"batch_size": "many"}, from_strings=True)


def test_a_list_of_words_converts_from_commas():
  base = overrides.load_config_file(EPS)
  config = overrides.apply(base, {"eval.splits": "test, test@train", "eval.ks": "1,2,4",
                                  "eval.metrics": "retrieval"}, from_strings=True)
  assert (tuple(config.eval.splits), tuple(config.eval.ks), tuple(config.eval.metrics)) == (
      ("test", "test@train"), (1, 2, 4), ("retrieval",))
  with pytest.raises(ValueError, match="cannot convert"):   # a broken literal stays an error
    overrides.apply(base, {"eval.splits": "('test',"}, from_strings=True)


def test_evaluation_overrides_take_eval_keys_typed_by_the_run():
  base = overrides.load_config_file(EPS)
  values = overrides.evaluation_overrides(
      base, ["eval.ks=1,2", "eval.metrics=retrieval", "eval.kmeans_n_init=3"])
  assert values == {"eval.ks": (1, 2), "eval.metrics": ("retrieval",), "eval.kmeans_n_init": 3}
  assert overrides.evaluation_tag(values) == "kmeans_n_init=3+ks=1,2+metrics=retrieval"
  assert overrides.evaluation_tag({"eval.splits": ("test@train", "x/y z")}) == (
      "splits=test@train,x_y_z")
  long_tag = overrides.evaluation_tag({"eval.ks": tuple(range(1, 100))})
  assert long_tag.startswith("set-") and len(long_tag) == 14
  for items, message in (
      (["data.name=cub"], "--set=data.name=cub: eval.py changes only the evaluation"),
      (["eval.kz=1,2"], r"unknown config key \(did you mean eval.ks\?\); the eval keys: "),
      (["eval.kmeans_n_init=many"], "cannot convert 'many' for config key eval.kmeans_n_init"),
      (["eval.ks"], "needs key=value"),
      (["eval.splits="], "--set=eval.splits=: no protocol left to evaluate")):
    with pytest.raises(ValueError, match=message):
      overrides.evaluation_overrides(base, items)


def test_num_train_steps_with_num_epochs_is_refused():
  base = overrides.load_config_file(EPS)
  base.num_epochs = 3
  with pytest.raises(ValueError, match="num_train_steps=30 has no effect.*num_epochs=3"):
    overrides.apply(base, {"num_train_steps": 30})
  assert overrides.apply(base, {"num_train_steps": 30, "num_epochs": 0}).num_train_steps == 30


@pytest.fixture
def user_objective(tmp_path):
  """The path of a user module registering ``scaled_triplet``, unregistered (and unimported)
  afterwards, so the registry other tests iterate holds only the library's objectives."""
  from dml_jax.objectives import _registry  # pylint: disable=import-outside-toplevel
  yield write_user_module(tmp_path)
  _registry.REGISTRY.pop("scaled_triplet", None)
  _registry.SUPPORT.pop("scaled_triplet", None)
  for name in [m for m in sys.modules if m.startswith("dml_jax_user_my_objectives")]:
    sys.modules.pop(name)


def test_two_user_modules_of_one_file_name_are_both_imported(tmp_path, user_objective):
  from dml_jax.objectives import _registry  # pylint: disable=import-outside-toplevel
  other = tmp_path / "b" / "my_objectives.py"
  other.parent.mkdir()
  other.write_text(USER_MODULE.replace("scaled_triplet", "scaled_triplet_b"))
  try:
    a, b = overrides.import_user_modules([user_objective, str(other)])
    assert a is not b and {"scaled_triplet", "scaled_triplet_b"} <= set(objectives.names())
  finally:
    _registry.REGISTRY.pop("scaled_triplet_b", None)
    _registry.SUPPORT.pop("scaled_triplet_b", None)


def test_a_user_module_imported_again_replaces_its_own_objective(user_objective, monkeypatch):
  """One file imported as a module name and as a .py path (``import my_objectives`` next to
  it, then ``--module=my_objectives.py`` / ``config.user_modules``), or reloaded after an edit,
  registers its objective again: the new builder replaces its own earlier one. Another file
  taking the name is still refused, naming the file that has it."""
  import importlib  # pylint: disable=import-outside-toplevel
  folder = os.path.dirname(user_objective)
  monkeypatch.syspath_prepend(folder)
  first = importlib.import_module("my_objectives")
  try:
    (second,) = overrides.import_user_modules([user_objective])
    assert second is not first
    assert objectives.REGISTRY["scaled_triplet"] is second.scaled_triplet
    reloaded = importlib.reload(first)
    assert objectives.REGISTRY["scaled_triplet"] is reloaded.scaled_triplet
    with pytest.raises(ValueError, match="'scaled_triplet' is already registered .*"
                       "my_objectives.py"):
      objectives.register("scaled_triplet", lambda *, scale=1.0: None)
    with pytest.raises(ValueError, match="already registered"):   # the same builder twice
      objectives.register("scaled_triplet")(reloaded.scaled_triplet)
  finally:
    sys.modules.pop("my_objectives", None)


def test_a_recorded_module_file_that_moved_is_found_through_module(tmp_path, user_objective,
                                                                   monkeypatch):
  """A workdir records its module files' absolute paths; after the file moved, its old path
  is refused with one line saying what to give, and is the module of the file of that name
  given first (``eval.py --module=NEW_PATH``, imported before the recorded ones)."""
  gone = str(tmp_path / "old" / "my_objectives.py")
  with pytest.raises(ValueError, match=r"my_objectives.py does not exist; if it moved, give "
                     r"its path now with --module=PATH"):
    overrides.import_user_modules([gone])
  (given,) = overrides.import_user_modules([user_objective])
  assert overrides.import_user_modules([gone]) == [given]
  # recorded as [the old path, the new one] (a config file's missing relative path and the
  # --module given for it): the file that exists stands for the old one in either order
  from dml_jax.objectives import _registry  # pylint: disable=import-outside-toplevel
  other = tmp_path / "b" / "my_objectives.py"
  other.parent.mkdir()
  other.write_text(USER_MODULE.replace("scaled_triplet", "scaled_triplet_b"))
  try:
    moved, new = overrides.import_user_modules([str(tmp_path / "c" / "my_objectives.py"),
                                                str(other)])
    assert moved is new and "scaled_triplet_b" in objectives.names()
  finally:
    _registry.REGISTRY.pop("scaled_triplet_b", None)
    _registry.SUPPORT.pop("scaled_triplet_b", None)
  assert "scaled_triplet" in objectives.names()
  with pytest.raises(ValueError, match="my.py does not exist"):   # only a file of its name
    overrides.import_user_modules([str(tmp_path / "old" / "my.py")])
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ValueError, match=r"my.py does not exist \(from the current directory "):
    overrides.import_user_modules(["my.py"])


def test_another_workdirs_recorded_module_never_stands_for_a_moved_one(tmp_path):
  """``eval.py --workdirs=A,B``: A's recorded losses.py is imported from A's record; B's
  recorded losses.py (another file) moved. B's is refused, not silently A's module; a file
  given on the command line (``--module``) still stands for it."""
  a = tmp_path / "a" / "losses.py"
  a.parent.mkdir()
  a.write_text("WHICH = 'a'\n")
  gone = str(tmp_path / "b" / "losses.py")
  (from_a,) = overrides.import_user_modules([str(a)], from_config=True)
  assert from_a.WHICH == "a"
  with pytest.raises(ValueError, match=r"b/losses.py does not exist; if it moved"):
    overrides.import_user_modules([gone], from_config=True)
  given = tmp_path / "new" / "losses.py"
  given.parent.mkdir()
  given.write_text("WHICH = 'b'\n")
  overrides.import_user_modules([str(given)])   # eval.py --module=new/losses.py
  (stand_in,) = overrides.import_user_modules([gone], from_config=True)
  assert stand_in.WHICH == "b"


def test_user_modules_are_recorded_absolute_and_once(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert overrides.user_modules(("my.py", "pkg.losses"), (str(tmp_path / "my.py"),)) == (
      str(tmp_path / "my.py"), "pkg.losses")


def test_a_user_objective_registers_and_overrides_like_a_builtin(user_objective):
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  path = user_objective
  overrides.import_user_modules([path])
  overrides.import_user_modules([path])           # importing twice is harmless
  assert "scaled_triplet" in objectives.names()
  config = overrides.apply(overrides.load_config_file(EPS),
                           {"loss.name": "scaled_triplet", "loss.scale": 3.0})
  assert config.loss.to_dict() == {"name": "scaled_triplet", "scale": 3.0, "margin": 0.2,
                                   "similarity": "neg_sq_euclidean"}
  x = np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32)
  y = np.array([0, 0, 1, 1, 2, 2, 3, 3])
  key = jax.random.key(0)
  scaled, _ = objectives.make("scaled_triplet", scale=3.0).apply({}, x, y, rng=key)
  plain, _ = objectives.make("triplet", similarity="neg_sq_euclidean").apply({}, x, y, rng=key)
  assert float(scaled) == pytest.approx(3.0 * float(plain), rel=1e-6)
  with pytest.raises(ValueError, match="already registered"):
    objectives.register("triplet", lambda *, a=1: None)
  with pytest.raises(ValueError, match="keyword-only"):
    objectives.register("bad_objective", lambda margin: None)
  with pytest.raises(ValueError, match="cannot be imported"):
    overrides.import_user_modules(["no_such_module_here"])


def test_a_negative_num_epochs_is_not_taken_for_training_by_epochs():
  """--config.num_epochs=-1 with num_train_steps: the bad value is left to config.validate,
  which names it, instead of a message that says the config trains -1 epochs."""
  from dml_jax.run import config as config_lib  # pylint: disable=import-outside-toplevel
  config = overrides.apply(overrides.load_config_file(EPS),
                           {"num_train_steps": 30, "num_epochs": -1})
  with pytest.raises(ValueError, match=r"config.num_epochs must be an integer >= 0, got -1"):
    config_lib.validate(config)


def test_a_recorded_module_name_from_another_directory_is_found_through_module(
    tmp_path, user_objective, monkeypatch):
  """``--module=my_objectives`` (a name importable from the directory train.py ran in) is
  recorded as given; read from another directory, the file of that name given with
  ``--module=PATH`` stands for it, and without it the line says what to give. A module that
  is found but imports a missing one says that."""
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  with pytest.raises(ValueError, match=r"user module 'my_objectives' cannot be imported .* "
                     r"from the current directory .*elsewhere; .* --module=PATH"):
    overrides.import_user_modules(["my_objectives"])
  (given,) = overrides.import_user_modules([user_objective])
  assert overrides.import_user_modules(["my_objectives", "pkg.my_objectives"]) == [given, given]
  (elsewhere / "needs_more.py").write_text("import no_such_dependency_here\n")
  with pytest.raises(ValueError, match="'needs_more' cannot be imported: No module named "
                     "'no_such_dependency_here'"):
    overrides.import_user_modules(["needs_more"])
  sys.modules.pop("needs_more", None)
  # a module written for an earlier layout of dml_jax, as a name or as a file
  (elsewhere / "older.py").write_text("from dml_jax import training\n")
  for spec in ("older", str(elsewhere / "older.py")):
    with pytest.raises(ValueError, match=r"user module .*older.* cannot be imported: cannot "
                       r"import name 'training' from 'dml_jax'"):
      overrides.import_user_modules([spec])
  sys.modules.pop("older", None)


def test_a_config_file_of_ones_own_loads_outside_the_repository(tmp_path):
  """``python -m dml_jax.run.config show configs/my.py`` (or the sweep) run in a project of
  one's own, with dml_jax importable but the repository root not on ``sys.path`` (an
  installed package): the config still builds on the repository's configs/default.py, also
  when the project's own folder is called configs/."""
  import subprocess  # pylint: disable=import-outside-toplevel
  site = tmp_path / "site"
  site.mkdir()
  (site / "dml_jax").symlink_to(os.path.join(ROOT, "dml_jax"))
  project = tmp_path / "project"
  (project / "configs").mkdir(parents=True)
  (project / "configs" / "my.py").write_text(
      "from dml_jax.run import config\n\n"
      "def get_config(arg=''):\n"
      "  return config.build({'num_train_steps': 7}, arg, path=__file__)\n")
  env = {**os.environ, "PYTHONPATH": str(site)}
  out = subprocess.run([sys.executable, "-m", "dml_jax.run.config", "show", "configs/my.py",
                        "--diff-default"], cwd=project, env=env, capture_output=True,
                       text=True, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "num_train_steps = 7" in out.stdout
