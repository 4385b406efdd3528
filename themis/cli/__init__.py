"""The entry points: ``./themis_train.sh`` and ``./themis_pretrain.sh`` (Hydra).

- :mod:`themis.cli.train`: a run end to end; :func:`~themis.cli.train.make_workspace` builds
  the :class:`~themis.run.workspace.Workspace` of a config with its loop
  (:mod:`themis.loops`) and, for ``reward_training=async``, the background learner
  (:mod:`themis.online.loop`);
- :mod:`themis.cli.pretrain`: the seed and unsupervised phase, then a snapshot.

The top floor of the run: it wires the workspace (:mod:`themis.run`), the loops and the
online learner, none of which imports another.
"""
