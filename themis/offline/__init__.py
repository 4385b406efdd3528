"""Offline preference-based RL: preference labels on a fixed dataset, a reward model
(Themis's Markovian ensemble or Preference Transformer) and IQL on the relabelled dataset.

``datasets`` reads the data (Minari, a Themis run's replay buffer, rollouts), ``labels`` picks
and answers queries on it (or imports a label file), ``loop`` runs it all in a run folder,
``config`` holds its keys and ``main`` its entry points (``./themis_train.sh mode=offline``,
:func:`themis.offline.main.train_offline`).
"""
