"""Offline preference-based RL: preference labels on a fixed dataset, a reward model
(Themis's Markovian ensemble or Preference Transformer) and IQL on the relabelled dataset.

``datasets`` reads the data (Minari, D4RL files, a Themis run's replay buffer, rollouts),
``labels`` answers queries on it (or imports a label file or preference dataset), ``render``
draws its segments for people (``scripts/offline_queries.py``), ``loop`` runs it all in a run
folder, ``config`` holds its keys and ``main`` its entry points (``./themis_train.sh
mode=offline``, :func:`themis.offline.main.train_offline`).
"""
