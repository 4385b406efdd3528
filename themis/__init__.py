"""Themis: reinforcement learning from human preferences (PEBBLE, BPref) in PyTorch.

Themis's own loop from Python: :func:`train` (``./themis_train.sh`` as a function: the same
keys, validation and one-line errors, raised as :class:`TrainConfigError`) and
:func:`load_run` (a run folder read back without unpickling; :mod:`themis.cli.api`).

The public entry points for using preference learning outside Themis' own loop:
:class:`PreferenceLearningWrapper` (any agent learns from preferences through the env; its
vectorised forms are in :mod:`themis.online`), :class:`LearnedRewardWrapper` (a frozen learned
reward), :func:`load_reward_model`, :class:`PreferenceDataset`, and
:class:`HumanPreferencesEnvWrapper` (DRLHP's env wrapper API on Themis).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["HumanPreferencesEnvWrapper", "LearnedRewardWrapper", "PreferenceDataset",
           "PreferenceLearningVectorEnv", "PreferenceLearningWrapper", "RewardEnsemble",
           "TrainConfigError", "__version__", "load_reward_model", "load_run", "train",
           "train_offline"]

_LAZY = {
    "HumanPreferencesEnvWrapper": "themis.online.drlhp",
    "LearnedRewardWrapper": "themis.reward.wrapper",
    "PreferenceDataset": "themis.reward.dataset",
    "PreferenceLearningWrapper": "themis.online.wrapper",
    "PreferenceLearningVectorEnv": "themis.online.wrapper",
    "RewardEnsemble": "themis.reward.ensemble",
    "load_reward_model": "themis.reward.ensemble",
    "train": "themis.cli.api",
    "load_run": "themis.cli.api",
    "TrainConfigError": "themis.cli.api",
    "train_offline": "themis.offline.main",
}


def __getattr__(name: str) -> Any:
    """Import the public classes on first use, so ``import themis`` stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'themis' has no attribute {name!r}")
