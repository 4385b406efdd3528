"""The run: entry points, workspace, configuration, checkpoints and logging.

- :mod:`themis.run.train` / :mod:`themis.run.pretrain`: the Hydra entry points
  (``./themis_train.sh``, ``./themis_pretrain.sh``);
- :mod:`themis.run.workspace`: the :class:`Workspace` that owns env, agent, store, learner and
  logger for one run;
- :mod:`themis.run.config` / :mod:`themis.run.config_help`: the schema of every key, its
  validation and ``--help``;
- :mod:`themis.run.checkpoint`, :mod:`themis.run.logger`, :mod:`themis.run.evaluation`,
  :mod:`themis.run.threads`, :mod:`themis.run.precision`: snapshots, CSV/console logging,
  evaluation episodes, thread budgets and mixed precision.
"""
