"""The entry points: ``./themis_train.sh`` and ``./themis_pretrain.sh`` (Hydra).

- :mod:`themis.cli.train`: a run end to end (command line, run dir, resume); the
  :class:`~themis.run.workspace.Workspace` comes from :func:`themis.builder.make_workspace`;
- :mod:`themis.cli.pretrain`: the seed and unsupervised phase, then a snapshot.

The top floor of the run: it wires the workspace (:mod:`themis.run`), the loops and the
online learner, none of which imports another.
"""
