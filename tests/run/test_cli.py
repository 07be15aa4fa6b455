"""The binaries' command line (dml_jax/run/cli.py) in-process, on flags of their own: one-line
errors for bad overrides, the --help page and its exit code (train.py / eval.py themselves run
in subprocesses in test_binaries.py)."""

import os

from absl import flags
from ml_collections import config_flags
import pytest

from dml_jax.run import cli
from dml_test_support import ROOT

CONFIG = os.path.join(ROOT, "configs", "digits_evenodd_eps.py")


def parse(argv, **kw):
  """``cli.flags_parser(**kw)(argv)`` over fresh flags as train.py defines them (--config,
  --workdir, a multi-host flag, the cache flag of cli)."""
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", flag_values=values,
                                  lock_config=False, accept_new_attributes=True, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "Run directory.", flag_values=values,
                      module_name="train.py")
  flags.DEFINE_bool("distributed", False, "Multi-host.", flag_values=values,
                    module_name="train.py")
  flags.DEFINE_string("compilation_cache", "", "Compilation cache.", flag_values=values,
                      module_name=cli.__name__)
  return cli.flags_parser("train.py", flag_values=values, **kw)(argv)


def error_line(capsys, argv):
  with pytest.raises(SystemExit) as exit_info:
    parse(argv)
  assert exit_info.value.code == 1
  return capsys.readouterr().err


def test_a_misspelt_section_is_one_clean_line(capsys):
  err = error_line(capsys, ["train.py", f"--config={CONFIG}",
                            "--config.optimzer.learning_rate=0.1"])
  assert err == ("train.py: unknown config section optimzer in --config.optimzer.learning_rate "
                 "(did you mean optimizer?); sections: data, eval, log, loss, memory, model, "
                 "optimizer\n")
  err = error_line(capsys, ["train.py", f"--config={CONFIG}", "--config.data.optionz.root=x"])
  assert err.startswith("train.py: unknown config section data.optionz in "
                        "--config.data.optionz.root (did you mean data.options?)")
  err = error_line(capsys, ["train.py", f"--config={CONFIG}",
                            "--config.optimizer.learning_rate.x=1"])
  assert err == ("train.py: config key optimizer.learning_rate is a value, not a section: "
                 "--config.optimizer.learning_rate.x\n")


def test_an_error_raised_by_the_config_file_is_its_own_line(capsys):
  # ml_collections hands on the config file's exception as a traceback's text
  err = error_line(capsys, ["train.py", f"--config={CONFIG}:smoke,smok"])
  assert err.startswith(f"train.py: flag --config={CONFIG}:smoke,smok: unknown variant 'smok' "
                        "in --config=") and err.endswith(":smoke,smok; allowed: smoke\n")
  assert err.count("\n") == 1 and "Traceback" not in err


def test_help_exits_0_with_the_grouped_flags_and_where_config_keys_are(capsys):
  groups = (("multi-host flags", ("distributed",)),)
  with pytest.raises(SystemExit) as exit_info:
    parse(["train.py", "--help"], groups=groups, epilog="Config keys: configs/default.py.")
  assert exit_info.value.code == 0
  page = capsys.readouterr().out
  lines = page.splitlines()
  names = [line.split(":")[0].strip() for line in lines if line.startswith("  --")]
  assert names == ["--workdir", "--compilation_cache", "--[no]distributed"]
  assert lines.index("multi-host flags:") > lines.index("flags:")
  assert page.rstrip().endswith("Config keys: configs/default.py.")


def test_machine_flags_take_their_defaults_from_the_environment(monkeypatch):
  monkeypatch.setenv("DML_JAX_NUM_THREADS", "3")
  monkeypatch.delenv("DML_JAX_NUM_WORKERS", raising=False)
  flag_values = flags.FlagValues()
  cli.define_machine_flags(flag_values)
  flag_values(["train.py"])
  assert cli.machine_overrides(flag_values) == {"data.num_threads": 3}
  flag_values(["train.py", "--num_workers=0", "--num_threads=1"])
  assert cli.machine_overrides(flag_values) == {"data.num_threads": 1, "data.num_workers": 0}
  monkeypatch.setenv("DML_JAX_KEEP_HOST_MEMORY", "0")
  assert cli.env_bool("DML_JAX_KEEP_HOST_MEMORY", None) is False
  monkeypatch.setenv("DML_JAX_KEEP_HOST_MEMORY", "")
  assert cli.env_bool("DML_JAX_KEEP_HOST_MEMORY", None) is None


def test_data_location_flags_give_absolute_data_options(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  flag_values = flags.FlagValues()
  cli.define_data_location_flags(flag_values)
  flag_values(["eval.py"])
  assert cli.data_location_overrides(flag_values) == {}
  flag_values(["eval.py", "--data_root=imgs", "--data_list=/lists/train.csv"])
  assert cli.data_location_overrides(flag_values) == {
      "data.options.root": str(tmp_path / "imgs"), "data.options.path": "/lists/train.csv"}


def test_a_compilation_cache_that_cannot_be_a_folder_is_off_with_a_warning(tmp_path, caplog):
  blocker = tmp_path / "file"
  blocker.write_text("")
  assert cli.enable_compilation_cache(str(blocker / "cache")) is None   # under a file
  assert "JAX compilation cache off: " in caplog.text and "cannot be its folder" in caplog.text
  assert cli.describe_cache(None).startswith("JAX compilation cache: off")


def test_without_a_home_the_compilation_cache_is_off(tmp_path, monkeypatch, caplog):
  monkeypatch.delenv("HOME", raising=False)   # and no passwd entry: '~' stays '~'
  monkeypatch.setattr(os.path, "expanduser", lambda p: p)
  monkeypatch.chdir(tmp_path)
  assert cli.enable_compilation_cache(cli.DEFAULT_CACHE) is None
  assert "no home folder: HOME is not set" in caplog.text
  assert not os.listdir(tmp_path)


def test_a_python_file_that_is_not_a_config_is_named(capsys, tmp_path, monkeypatch):
  """--config=a .py file without get_config(): the line names the file and what it lacks,
  not a 'bad --config override' (no override was given)."""
  import sys  # pylint: disable=import-outside-toplevel
  # ml_collections loads into sys.modules['config_config'], keeping an earlier test's names
  monkeypatch.delitem(sys.modules, "config_config", raising=False)
  path = tmp_path / "notes.py"
  path.write_text("x = 1\n")
  err = error_line(capsys, ["train.py", f"--config={path}"])
  assert err == (f"train.py: config file {path} has no get_config() function (a config file "
                 "defines get_config(arg='') returning the config; see configs/*.py)\n")


@pytest.mark.parametrize("text,message", [
    ("from dml_jax import training\n",   # a module of an earlier layout
     "cannot be executed: ImportError: cannot import name 'training' from 'dml_jax'"),
    ('{"seed": true}\n', "is JSON, not a Python config file (name 'true' is not defined)"),
    ("def get_config(:\n", "cannot be executed: SyntaxError: "),
])
def test_a_config_file_that_cannot_be_executed_is_one_line(capsys, tmp_path, monkeypatch, text,
                                                           message):
  import sys  # pylint: disable=import-outside-toplevel
  monkeypatch.delitem(sys.modules, "config_config", raising=False)
  path = tmp_path / ("config.json" if text.startswith("{") else "old.py")
  path.write_text(text)
  err = error_line(capsys, ["train.py", f"--config={path}"])
  assert err.startswith(f"train.py: config file {path} {message}")
  assert err.count("\n") == 1 and "Traceback" not in err
