"""Preference learning for any RL library: the reward learned online inside an env wrapper.

- :class:`PreferenceLearningWrapper` (``gymnasium.Env``), :class:`PreferenceLearningVectorEnv`
  (``gymnasium.vector.VectorEnv``) and :class:`PreferenceLearningVecEnv` (Stable-Baselines3
  ``VecEnv``, :mod:`themis.online.sb3`): the agent steps them, a background process
  (:mod:`themis.online.learner_process`) asks for preferences and trains r̂;
- :mod:`themis.online.online_reward`: the agent side the wrappers share (the newest model taken,
  r̂ for each step), on :mod:`themis.online.learner_client` (the learner process started, sent
  the recorded steps, watched for a crash and closed; also used by :mod:`themis.online.loop`);
- :mod:`themis.online.segments`: steps regrouped per episode and sub-env;
- :mod:`themis.online.weights`: model versions published through shared memory;
- :mod:`themis.online.keys`: ``./themis_train.sh``'s keys for the wrapper, checked;
- :class:`RelabelCallback` (:mod:`themis.online.relabel`): an off-policy SB3 agent's replay
  buffer relabelled with each new r̂ version (PEBBLE's relabelling);
- :func:`train_reward_model`: a reward model from a preferences folder alone, no RL run;
- :class:`HumanPreferencesEnvWrapper` (:mod:`themis.online.drlhp`): DRLHP's env wrapper, its
  keyword arguments and workflows, on :class:`PreferenceLearningWrapper`;
- :mod:`themis.online.stream`: the learner's query schedule as a target over agent steps.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HumanPreferencesEnvWrapper", "PreferenceLearnerError", "PreferenceLearningVecEnv",
           "PreferenceLearningVectorEnv",
           "PreferenceLearningWrapper", "RelabelCallback", "train_reward_model"]

_LAZY = {
    "HumanPreferencesEnvWrapper": "themis.online.drlhp",
    "PreferenceLearnerError": "themis.online.learner_client",
    "PreferenceLearningWrapper": "themis.online.wrapper",
    "PreferenceLearningVectorEnv": "themis.online.wrapper",
    "PreferenceLearningVecEnv": "themis.online.sb3",
    "RelabelCallback": "themis.online.relabel",
    "train_reward_model": "themis.online.offline",
}


def __getattr__(name: str) -> Any:
    """Import on first use (the SB3 wrapper needs stable-baselines3)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'themis.online' has no attribute {name!r}")
