"""eval_checkpoints: the machine's input settings replace a workdir's recorded ones."""

from dml_jax.run import eval_checkpoints
from dml_jax.run import workdir as workdir_lib
from dml_test_support import small_config


def test_machine_settings_replace_the_recorded_ones(tmp_path):
  config = small_config(2, **{"data.num_threads": 8, "data.num_workers": -1})
  workdir_lib.write_config(config, str(tmp_path))
  loaded = eval_checkpoints.load_config(str(tmp_path), {"data.num_threads": 1})
  assert (loaded.data.num_threads, loaded.data.num_workers) == (1, -1)
  assert eval_checkpoints.load_config(str(tmp_path)).data.num_threads == 8
  assert workdir_lib.load_config(str(tmp_path)).data.num_threads == 8   # the file is unchanged

