"""The application: what turns a config into a run and a workdir into results, on top of the
library (every other ``dml_jax`` package, which never imports this one).

* ``training``: the train state, the jitted step and the loop (``train_and_evaluate``);
  ``train_input``: the training batches; ``checkpointing``: Orbax checkpoints;
* ``restore``: ``restore_model(workdir)``, a workdir's model and evaluation data only;
  ``eval_checkpoints``: evaluating a workdir's checkpoints (eval.py);
* ``workdir``: a run's files; ``workdir_lock``: one training run per workdir; ``writers``:
  metric writers (TensorBoard, W&B);
* ``config``: a config file's row, its variants, validation and ``python -m dml_jax.run.config show``;
* ``cli``, ``signals``, ``host_memory``: command-line plumbing of train.py and eval.py;
* ``experiments`` (``python -m dml_jax.run.experiments``): sweeps over seeds and grids;
  ``summary`` (``python -m dml_jax.run.summary``): the HTML page comparing runs.
"""
