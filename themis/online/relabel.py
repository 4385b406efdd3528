"""Relabel an off-policy Stable-Baselines3 agent's replay buffer when r̂ changes.

The wrapper returns r̂ of the model version in use at each step; an off-policy agent (SAC, TD3,
DDPG, DQN) keeps those rewards in its replay buffer, so without relabelling it learns from a mix
of stale versions (and the zeros of the warm-up). PEBBLE relabels the whole buffer after every
reward update (Lee, Smith & Abbeel 2021, Alg. 1 line 13; BPref ``train_PEBBLE.py``
``relabel_with_predictor``); this callback does the same for an SB3 agent trained through
:class:`themis.PreferenceLearningWrapper` (or the vectorised wrappers), without changing the
agent: ``model.learn(..., callback=RelabelCallback(env))``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback

from themis.utils import ConfigError


class RelabelCallback(BaseCallback):
    """After each new reward-model version, rewrite every stored reward with r̂ of that version.

    Args:
        env: the Themis wrapper the agent steps through (:class:`~themis.PreferenceLearningWrapper`,
            :class:`~themis.PreferenceLearningVectorEnv` or
            :class:`~themis.online.sb3.PreferenceLearningVecEnv`): anything with ``.core``.
        chunk: stored steps per r̂ batch (memory: ``chunk × obs size`` floats at a time).

    Attributes:
        relabels: the versions the buffer was relabelled with, in order.

    Raises:
        ConfigError: ``env`` is not a Themis wrapper, or (at the start of training) the agent
            has no plain ``ReplayBuffer`` (on-policy agents need no relabelling: their rollouts
            are rewarded by the newest version already; dict observations are not supported).
    """

    def __init__(self, env: Any, chunk: int = 10_000) -> None:
        super().__init__()
        core = getattr(env, "core", None)
        if core is None or not hasattr(core, "relabel_rewards"):
            raise ConfigError("RelabelCallback takes the Themis wrapper the agent steps through "
                              "(PreferenceLearningWrapper or a vectorised one)")
        self.core, self.chunk = core, int(chunk)
        self.seen = 0
        self.relabels: list[int] = []

    def _on_training_start(self) -> None:
        buffer = getattr(self.model, "replay_buffer", None)
        if not isinstance(buffer, ReplayBuffer):
            raise ConfigError(f"RelabelCallback relabels an off-policy agent's ReplayBuffer; "
                              f"{type(self.model).__name__} has "
                              f"{type(buffer).__name__ if buffer is not None else 'none'}")

    def _on_step(self) -> bool:
        core = self.core
        if core.model_in_use and core.version != self.seen:
            self.relabel()
        return True

    def relabel(self) -> None:
        """Rewrite the rewards of every stored step with r̂ of the version in use."""
        buffer: ReplayBuffer = self.model.replay_buffer  # type: ignore[attr-defined]
        core = self.core
        size = buffer.buffer_size if buffer.full else buffer.pos
        n_envs = buffer.n_envs
        obs = buffer.observations.reshape(buffer.buffer_size * n_envs,
                                          *buffer.observations.shape[2:])
        actions = buffer.actions.reshape(buffer.buffer_size * n_envs, -1)
        rewards = buffer.rewards.reshape(buffer.buffer_size * n_envs)
        box = isinstance(self.model.action_space, spaces.Box)
        for lo in range(0, size * n_envs, self.chunk):
            hi = min(lo + self.chunk, size * n_envs)
            act = actions[lo:hi]
            if box:  # SB3 stores Box actions scaled to [-1, 1]; r̂ takes the env's actions
                act = self.model.policy.unscale_action(act)  # type: ignore[union-attr]
            rewards[lo:hi] = core.relabel_rewards(
                core.observations(obs[lo:hi], hi - lo),
                core.action_vectors(np.asarray(act), hi - lo))
        self.seen = core.version
        self.relabels.append(core.version)
