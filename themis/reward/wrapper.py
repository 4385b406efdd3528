"""Use a learned reward anywhere: a gymnasium wrapper any RL library can train on.

    import torch
    from themis import LearnedRewardWrapper, load_reward_model
    from themis.environments.domains import make_env

    torch.set_num_threads(1)  # one thread for SB3's small networks (see below)
    env = LearnedRewardWrapper(make_env("Control", "HalfCheetah-v5"), load_reward_model(RUN_DIR))
    stable_baselines3.SAC("MlpPolicy", env).learn(100_000)   # never sees the true reward

One thread: Stable-Baselines3 runs on PyTorch's default intra-op threads (one per core). Its
small MLP updates gain nothing from them, and on a machine whose cores are busy (other runs,
the background learner) the threads wait on each other: the examples crawled at about 5
steps/s. ``torch.set_num_threads(1)`` before the agent is built, as in the example, keeps it
at its single-core speed (Themis's own runs choose this by ``torch_threads=auto``).
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from themis.agents.intrinsic import RunningMeanStd
from themis.reward.ensemble import RewardEnsemble


class LearnedRewardWrapper(gym.Wrapper):
    """Replace the environment reward by a reward model's r̂(s, a) (ensemble mean).

    The reward of the transition ``(s, a, s')`` is ``r̂(s, a)``, exactly how Themis relabels its
    replay buffer (PEBBLE, Lee et al. 2021, Sec. 4.2). The true reward is kept in
    ``info["true_reward"]`` so it can still be logged, and :meth:`switch_to_true_reward`
    turns the wrapper into a pass-through (for baselines or evaluation).

    Actions are given to the model as the env receives them: wrap an env made by
    :func:`themis.environments.domains.make_env` (actions rescaled to [-1, 1], as during
    training). A ``Discrete`` action is one-hot encoded.

    Args:
        env: the environment (flat ``Box`` observations, ``obs_dim`` of the model).
        reward_model: a trained :class:`~themis.reward.RewardEnsemble` (e.g. from
            :func:`themis.load_reward_model`).
        normalize: divide ``r̂ - mean`` by the std of the rewards seen so far (running
            statistics, Chan et al. 1979), for libraries that expect unit-scale rewards.
        update_stats: keep updating the normalisation statistics (turn off for evaluation).

    Raises:
        ValueError: the model's observation or action size does not match the env.
    """

    def __init__(self, env: gym.Env, reward_model: RewardEnsemble, normalize: bool = False,
                 update_stats: bool = True) -> None:
        super().__init__(env)
        obs_dim = int(np.prod(env.observation_space.shape or (0,)))
        space = env.action_space
        if isinstance(space, gym.spaces.Discrete):
            action_dim = int(space.n)
        else:
            action_dim = int(np.prod(space.shape or (0,)))
        if (obs_dim, action_dim) != (reward_model.obs_dim, reward_model.action_dim):
            raise ValueError(
                f"reward model takes obs_dim={reward_model.obs_dim}, "
                f"action_dim={reward_model.action_dim}; env has obs_dim={obs_dim}, "
                f"action_dim={action_dim}")
        self.reward_model = reward_model.eval()
        self.normalize = normalize
        self.update_stats = update_stats
        self.reward_stats = RunningMeanStd(())
        self._use_predicted = True
        self._obs: np.ndarray | None = None

    @property
    def using_predicted_reward(self) -> bool:
        """True while :meth:`step` returns the model's reward, False for the env's own."""
        return self._use_predicted

    def switch_to_true_reward(self) -> None:
        """Return the environment's reward from now on (r̂ still goes to ``info``)."""
        self._use_predicted = False

    def switch_to_predicted_reward(self) -> None:
        """Return the reward model's reward from now on (the default)."""
        self._use_predicted = True

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._obs = np.asarray(obs, dtype=np.float32)
        return obs, info

    def predicted_reward(self, obs: np.ndarray, action: Any) -> float:
        """r̂(s, a), ensemble mean, before normalisation. ``obs (obs_dim,)``."""
        a = np.asarray(action, dtype=np.float32).reshape(-1)
        if isinstance(self.action_space, gym.spaces.Discrete):
            a = np.eye(int(self.action_space.n), dtype=np.float32)[int(np.asarray(action))]
        return float(self.reward_model.predict(obs.reshape(1, -1), a.reshape(1, -1))[0])

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        predicted = self.predicted_reward(self._obs, action)
        if self.normalize:
            if self.update_stats:
                self.reward_stats.update(np.array([predicted]))
            predicted = float((predicted - self.reward_stats.mean)
                              / (self.reward_stats.std + 1e-8))
        obs, true_reward, terminated, truncated, info = self.env.step(action)
        self._obs = np.asarray(obs, dtype=np.float32)
        info = {**info, "true_reward": float(true_reward), "predicted_reward": predicted}
        reward = predicted if self._use_predicted else float(true_reward)
        return obs, reward, terminated, truncated, info
