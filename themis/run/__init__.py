"""The run: workspace, configuration, checkpoints and logging.

- :mod:`themis.run.workspace`: the :class:`Workspace` that owns env, agent, store, learner and
  logger for one run, with its counters and ``state_dict`` (its loop and, with
  ``reward_training=async``, its background learner are handed to it by
  :func:`themis.builder.make_workspace`: the loops and the online learner read the workspace,
  it imports neither: :mod:`themis.run.protocols` says what it asks of them);
- :mod:`themis.run.closing`: the end of a run, finished (:func:`~themis.run.closing.finish`) or
  stopped by Ctrl-C (:func:`~themis.run.closing.stop`);
- :mod:`themis.run.envs`: the run's envs and what it reads of them once (:class:`EnvFacts`);
- :mod:`themis.run.config` / :mod:`themis.run.config_help` / :mod:`themis.run.resolve`: the
  schema of every key, its validation, ``--help``, and the config resolved once;
- :mod:`themis.run.plan`: the console lines (banner, query plan, a round, a stopped run);
- :mod:`themis.run.checkpoint`, :mod:`themis.run.snapshot`, :mod:`themis.run.logger`,
  :mod:`themis.run.evaluation`, :mod:`themis.run.threads`: checkpoints, pretraining snapshots,
  CSV/console logging, evaluation episodes and PyTorch's thread count.

The entry points (``./themis_train.sh``, ``./themis_pretrain.sh``) are in :mod:`themis.cli`.
"""
