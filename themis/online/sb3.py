"""The online preference-learning wrapper as a Stable-Baselines3 ``VecEnvWrapper``.

    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv
    import torch
    from themis.online.sb3 import PreferenceLearningVecEnv

    torch.set_num_threads(1)  # one thread for SB3's small networks (see below)
    venv = PreferenceLearningVecEnv(make_vec_env("CartPole-v1", 8, vec_env_cls=SubprocVecEnv),
                                    "runs/cartpole", max_feedback=300, segment=25)
    PPO("MlpPolicy", venv).learn(200_000)
    venv.close()

SB3 resets a sub-env in the step that ends its episode (the last observation is in
``info["terminal_observation"]``): the step is recorded with the observation it was taken in,
and the sub-env's next step starts a new episode. ``TimeLimit.truncated`` tells a time limit
from a termination. ``infos[i]["true_reward"]`` holds the env's reward.

One thread: Stable-Baselines3 runs on PyTorch's default intra-op threads (one per core). Its
small MLP updates gain nothing from them, and on a machine whose cores are busy (other runs,
the background learner) the threads wait on each other: the examples crawled at about 5
steps/s. ``torch.set_num_threads(1)`` before the agent is built, as in the example, keeps it
at its single-core speed (Themis's own runs choose this by ``torch_threads=auto``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper
from stable_baselines3.common.vec_env.base_vec_env import VecEnvObs, VecEnvStepReturn

from themis.online.online_reward import OnlineReward
from themis.online.wrapper import ReadsTheLearner, needs_frames
from themis.utils import ConfigError


class PreferenceLearningVecEnv(ReadsTheLearner, VecEnvWrapper):
    """:class:`themis.online.PreferenceLearningWrapper` for a Stable-Baselines3 ``VecEnv``
    (``DummyVecEnv``, ``SubprocVecEnv``): r̂ for all sub-envs in one batch.

    Args, Raises: as :class:`themis.online.PreferenceLearningWrapper` (``venv`` a ``VecEnv``;
    a person labelling needs sub-envs made with ``render_mode='rgb_array'``).
    """

    def __init__(self, venv: VecEnv, run_dir: str | os.PathLike[str], **keys: Any) -> None:
        super().__init__(venv)
        self.frames = needs_frames(keys)
        if self.frames and venv.render_mode != "rgb_array":
            raise ConfigError("human_teacher=true shows clips of the env: make the sub-envs "
                              "with render_mode='rgb_array'")
        spec = venv.get_attr("spec", [0])[0]
        self.core = OnlineReward(venv.observation_space, venv.action_space, venv.num_envs,
                                 run_dir, keys, str(getattr(spec, "id", None) or "VecEnv"),
                                 getattr(spec, "max_episode_steps", None))
        self._obs: np.ndarray | None = None
        self._frames: Any = None
        self._actions: Any = None
        self._in_episode = np.zeros(venv.num_envs, bool)

    def reset(self) -> VecEnvObs:
        for i in np.flatnonzero(self._in_episode):
            self.core.end_episode(int(i))
        self._in_episode[:] = False
        obs = self.venv.reset()
        self._obs = self.core.observations(obs, self.num_envs)
        self._frames = self.venv.get_images() if self.frames else None
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions
        self.venv.step_async(actions)

    def step_wait(self) -> VecEnvStepReturn:
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        core, n = self.core, self.num_envs
        core.check()
        prev, frames = self._obs, self._frames
        vectors = core.action_vectors(self._actions, n)
        obs, true_rewards, dones, infos = self.venv.step_wait()
        true_rewards = np.asarray(true_rewards, dtype=np.float64)
        returned, predicted = core.rewards(prev, vectors, true_rewards)
        for i in range(n):
            truncated = bool(infos[i].get("TimeLimit.truncated", False))
            core.record(i, prev[i], vectors[i], float(true_rewards[i]),
                        bool(dones[i]) and not truncated, None if frames is None else frames[i])
            if dones[i]:
                core.end_episode(i)
            infos[i]["true_reward"] = float(true_rewards[i])
            infos[i]["predicted_reward"] = float(predicted[i])
        self._in_episode = ~np.asarray(dones, bool)
        self._obs = core.observations(obs, n)
        if self.frames:
            self._frames = self.venv.get_images()
        core.stepped(n)
        return obs, returned.astype(np.float32), dones, infos

    def close(self) -> None:
        """Stop the learner (after its final gather and save), then close the sub-envs."""
        self.core.close()
        self.venv.close()


__all__ = ["PreferenceLearningVecEnv"]
