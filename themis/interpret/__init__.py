"""Understand a learned reward: rollout files, supervised reward nets, reward preprocessing by
potential shaping (Jenner & Gleave 2022), EPIC distances (Gleave et al. 2021) and feature
visualisation of pixel reward nets.

Modules, lowest first (each imports only those above it and :mod:`themis`' lower layers):

- :mod:`themis.interpret.rollouts`: the pickle-free rollout format (npz + JSON), imitation's
  ``TrajectoryWithRew`` npz files, and collecting rollouts from policies.
- :mod:`themis.interpret.sb3`: Stable-Baselines3 ``.zip`` policies without unpickling.
- :mod:`themis.interpret.epic`: EPIC (canonicalisation + Pearson distance), tabular and sampled.
- :mod:`themis.interpret.gridworld`: every transition of a MiniGrid/BabyAI layout, as a table.
- :mod:`themis.interpret.preprocessing`: the potential (and offset) that makes r̂ sparse,
  smooth or close to a reference.
- :mod:`themis.interpret.supervised`: a reward ensemble regressed on the true reward.
- :mod:`themis.interpret.featvis`: activation maximisation and dataset examples.
- :mod:`themis.interpret.report`: pictures and the run report's section.
"""
