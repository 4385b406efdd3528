"""The run: workspace, configuration, checkpoints and logging.

- :mod:`themis.run.workspace`: the :class:`Workspace` that owns env, agent, store, learner and
  logger for one run (its loop and, with ``reward_training=async``, its background learner are
  handed to it by :func:`themis.builder.make_workspace`: the loops and the online learner
  read the workspace, it imports neither);
- :mod:`themis.run.config` / :mod:`themis.run.config_help`: the schema of every key, its
  validation and ``--help``;
- :mod:`themis.run.checkpoint`, :mod:`themis.run.logger`, :mod:`themis.run.evaluation`,
  :mod:`themis.run.threads`: checkpoints, CSV/console logging, evaluation episodes and PyTorch's
  thread count.

The entry points (``./themis_train.sh``, ``./themis_pretrain.sh``) are in :mod:`themis.cli`.
"""
