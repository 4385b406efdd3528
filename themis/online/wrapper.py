"""Preference learning for any RL library: environment wrappers with a background learner.

    import torch
    from themis import PreferenceLearningWrapper

    torch.set_num_threads(1)  # SB3's small networks: one thread (see below)
    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), "runs/pendulum",
                                    max_feedback=200, reward_batch=20, segment=25,
                                    num_seed_steps=500, num_interact=1000)
    stable_baselines3.SAC("MlpPolicy", env).learn(20_000)   # never sees the true reward
    env.close()

The design of Christiano et al. (2017) and of DRLHP's refactored env wrapper: the whole of
preference learning lives in the environment, so an agent learns from preferences without a
line of its code changed. The agent's process only records the steps and answers each step
with r̂ (:class:`themis.online.online_reward.OnlineReward`, shared by the three wrappers);
query selection, the teacher (synthetic, a person in the terminal, people on the web), the
``preferences/`` dataset and reward training run in a background process
(:mod:`themis.online.learner_process`), which publishes each trained model; the agent's side
takes the newest one between two steps without waiting.

- :class:`PreferenceLearningWrapper`: a ``gymnasium.Env``;
- :class:`PreferenceLearningVectorEnv`: a ``gymnasium.vector.VectorEnv`` (both autoreset modes
  that step: next-step and same-step);
- :class:`themis.online.sb3.PreferenceLearningVecEnv`: a Stable-Baselines3 ``VecEnv`` (e.g.
  ``SubprocVecEnv(8)`` for PPO).

One thread: Stable-Baselines3 runs on PyTorch's default intra-op threads (one per core). Its
small MLP updates gain nothing from them, and on a machine whose cores are busy (other runs,
the background learner) the threads wait on each other: the examples crawled at about 5
steps/s. ``torch.set_num_threads(1)`` before the agent is built, as in the example, keeps it
at its single-core speed (Themis's own runs choose this by ``torch_threads=auto``).
"""
from __future__ import annotations

import os
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from themis.online.keys import OnlineKeys
from themis.online.online_reward import OnlineReward, PreferenceLearnerError
from themis.utils import ConfigError


def env_name(env: Any) -> str:
    """A gymnasium env's id (its spec), or its class name."""
    spec = getattr(env, "spec", None)
    return str(getattr(spec, "id", None) or type(getattr(env, "unwrapped", env)).__name__)


def needs_frames(keys: dict[str, Any]) -> bool:
    """Whether the keys ask a person to label (clips rendered from every step)."""
    return str(keys.get("human_teacher", "false")).lower() in ("true", "1", "yes")


# ---------------------------------------------------------------------- gymnasium.Env
class ReadsTheLearner:
    """What every Themis preference-learning wrapper answers about its learner, through its
    :class:`OnlineReward` (``core``): the keys, the model version, and the reward switch."""

    core: OnlineReward

    @property
    def online_keys(self) -> OnlineKeys:
        """The wrapper's own keys, as validated."""
        return self.core.online

    @property
    def model_version(self) -> int:
        """The newest reward-model version, which the next step uses (0: none yet)."""
        self.core.refresh()
        return self.core.version

    @property
    def using_predicted_reward(self) -> bool:
        """True while a step returns r̂, False for the warm-up or the env's reward."""
        return self.core.model_in_use

    def switch_to_true_reward(self) -> None:
        """Return the env's reward from now on (r̂ still goes to ``info``)."""
        self.core.switch_to_true_reward()

    def switch_to_predicted_reward(self) -> None:
        """Return r̂ again (the warm-up reward until the first model)."""
        self.core.switch_to_predicted_reward()


class PreferenceLearningWrapper(ReadsTheLearner, gym.Wrapper):
    """A ``gymnasium.Env`` whose reward is learned from preferences while any agent trains on
    it (Christiano et al. 2017; DRLHP's env wrapper; PEBBLE's rounds and B-Pref's teachers).

    The steps go to a background learner process; ``reward_batch`` queries are due at
    ``num_seed_steps`` and every ``num_interact`` agent steps after (``query_schedule``: or
    decaying, or continuous; a round the learner was too busy for is asked late, never lost,
    :mod:`themis.online.stream`); it selects queries from the recent segments (``feed_type``
    0–5), asks the teacher (synthetic ``teacher=...``, ``human_teacher=true`` in the terminal or
    on the web with ``labelers``, gold queries, ``label_quality``), writes every label to
    ``RUN_DIR/preferences/``, trains the reward ensemble, writes ``reward.csv`` and
    ``checkpoints/reward_model.pt`` and publishes the model; the wrapper takes the newest one
    without waiting.

    Threads: call ``torch.set_num_threads(1)`` before building a Stable-Baselines3 agent on it
    (PyTorch's default of one thread per core slows SB3's small networks on a busy machine to
    a crawl; module docstring).

    Returned reward: r̂(s, a) of the transition ``(s, a, s')``, the ensemble mean, normalised to
    zero mean and unit variance with running statistics (DRLHP; ``normalize_reward=false``:
    raw); a method's ``reward_bonus`` is added (e.g. β_t · the ensemble's std). Before the
    first model (and until
    ``n_initial_training_steps`` versions): 0 — or, with ``warmup_reward="true"``, the env's
    reward, a warm-up on the true reward. ``info["true_reward"]`` always holds the env's
    reward, ``info["predicted_reward"]`` r̂ (NaN before the first model). With
    ``collect_prefs_only=true`` the agent gets the env's reward throughout, while preferences
    are collected (and a reward model trained) for later.

    Args:
        env: the environment (``Box`` or, with ``obs_transform``, ``Dict`` observations;
            ``Box`` or ``Discrete`` actions; ``render_mode='rgb_array'`` when a person labels).
        run_dir: the run folder (``preferences/``, ``reward.csv``, ``train.csv``,
            ``checkpoints/``, ``config.yaml``).
        **keys: ``./themis_train.sh`` keys (``max_feedback``, ``reward_batch``, ``segment``,
            ``feed_type``, ``teacher``, ``method``, ``human_teacher``, ``teacher_ui``,
            ``prefs_path``, ...; ``NAME={"key": 4}`` or ``**{"NAME.key": 4}`` for a method's
            keys) and the wrapper's
            own (:class:`themis.online.keys.OnlineKeys`: ``warmup_reward``,
            ``n_initial_training_steps``, ``reward_model``, ``normalize_reward``,
            ``obs_transform``, ``train_reward``, ``reward_checkpoint_interval``, ``resume``,
            ``close_timeout``). Keys of Themis's own loop
            (``sac.*``, ``num_unsup_steps``, ...) and methods that work inside the agent are
            refused.

    Raises:
        ConfigError: one line: a bad key or value, a run dir holding another run (continue it
            with ``resume=True``), spaces the wrapper cannot take.
        PreferenceLearnerError: the learner process could not start; later, at a step, when it
            crashed or was killed.

    Call :meth:`close` at the end (the learner gathers the last answers and saves); the learner
    also stops when the agent's process ends, however it ends. A script that makes the wrapper
    keeps its training code under ``if __name__ == "__main__":`` (the learner is a spawned
    process).
    """

    def __init__(self, env: gym.Env, run_dir: str | os.PathLike[str], **keys: Any) -> None:
        super().__init__(env)
        self.frames = needs_frames(keys)
        if self.frames and env.render_mode != "rgb_array":
            raise ConfigError("human_teacher=true shows clips of the env: make it with "
                              "render_mode='rgb_array'")
        from themis.environments.domains import episode_limit

        self.core = OnlineReward(env.observation_space, env.action_space, 1, run_dir, keys,
                                 env_name(env), episode_limit(env))
        self._obs: np.ndarray | None = None
        self._frame: np.ndarray | None = None
        self._in_episode = False

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self._in_episode:  # reset in the middle of an episode: it ends here
            self.core.end_episode(0)
        obs, info = self.env.reset(**kwargs)
        self._obs = self.core.observations(obs)
        self._frame = self.env.render() if self.frames else None  # type: ignore[assignment]
        self._in_episode = False
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        core = self.core
        core.check()
        prev = self._obs
        vector = core.action_vectors(action, 1)
        obs, true_reward, terminated, truncated, info = self.env.step(action)
        returned, predicted = core.rewards(prev[None], vector, np.array([float(true_reward)]))
        core.record(0, prev, vector[0], float(true_reward), bool(terminated), self._frame)
        self._in_episode = True
        if terminated or truncated:
            core.end_episode(0)
            self._in_episode = False
        self._obs = core.observations(obs)
        if self.frames:
            self._frame = self.env.render()  # type: ignore[assignment]
        core.stepped(1)
        info = {**info, "true_reward": float(true_reward), "predicted_reward": float(predicted[0])}
        return obs, float(returned[0]), terminated, truncated, info

    def close(self) -> None:
        """Stop the learner (after its final gather and save), then close the env."""
        self.core.close()
        super().close()


# ---------------------------------------------------------------------- gymnasium vector
class PreferenceLearningVectorEnv(ReadsTheLearner, gym.vector.VectorWrapper):
    """:class:`PreferenceLearningWrapper` for a ``gymnasium.vector.VectorEnv``: the steps of
    its sub-envs are regrouped per episode, r̂ is computed for all sub-envs in one batch.

    Autoreset modes: next-step (gymnasium's default: the step after an episode's end resets
    that sub-env; it is not recorded and returns 0) and same-step. ``info["true_reward"]``
    holds the env's rewards ``(num_envs,)``.

    Args, Raises: as :class:`PreferenceLearningWrapper` (``env`` a ``VectorEnv``).
    """

    def __init__(self, env: gym.vector.VectorEnv, run_dir: str | os.PathLike[str],
                 **keys: Any) -> None:
        super().__init__(env)
        mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        mode = getattr(mode, "value", mode)
        if str(mode) not in ("NextStep", "SameStep"):
            raise ConfigError(f"autoreset_mode={mode}: the wrapper needs sub-envs that reset "
                              "themselves (NEXT_STEP or SAME_STEP)")
        self.next_step = str(mode) == "NextStep"
        self.frames = needs_frames(keys)
        if self.frames and env.render_mode != "rgb_array":
            raise ConfigError("human_teacher=true shows clips of the env: make the sub-envs "
                              "with render_mode='rgb_array'")
        spec = getattr(env, "spec", None)
        limit = getattr(spec, "max_episode_steps", None)
        self.core = OnlineReward(env.single_observation_space, env.single_action_space,
                                 env.num_envs, run_dir, keys,
                                 str(getattr(spec, "id", None) or type(env).__name__), limit)
        self._obs: np.ndarray | None = None
        self._frames: Any = None
        self._resetting = np.zeros(env.num_envs, bool)  # next step resets (next-step mode)
        self._in_episode = np.zeros(env.num_envs, bool)

    def reset(self, *, seed: int | list[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)  # type: ignore[arg-type]
        n = self.num_envs
        mask = np.asarray((options or {}).get("reset_mask", np.ones(n, bool)), dtype=bool)
        for i in np.flatnonzero(mask & self._in_episode):
            self.core.end_episode(int(i))
        batch = self.core.observations(obs, n)
        if self._obs is None:
            self._obs = batch.copy()
        self._obs[mask] = batch[mask]
        self._in_episode[mask] = False
        self._resetting[mask] = False
        self._frames = self.env.render() if self.frames else None
        return obs, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        core, n = self.core, self.num_envs
        core.check()
        prev, frames = self._obs.copy(), self._frames
        vectors = core.action_vectors(actions, n)
        obs, true_rewards, terminated, truncated, info = self.env.step(actions)
        true_rewards = np.asarray(true_rewards, dtype=np.float64)
        active = ~self._resetting  # steps that were env steps, not resets
        returned = np.zeros(n)
        predicted = np.full(n, np.nan)
        if active.any():
            returned[active], predicted[active] = core.rewards(prev[active], vectors[active],
                                                               true_rewards[active])
        done = np.asarray(terminated, bool) | np.asarray(truncated, bool)
        for i in np.flatnonzero(active):
            core.record(int(i), prev[i], vectors[i], float(true_rewards[i]),
                        bool(terminated[i]), None if frames is None else frames[i])
            if done[i]:
                core.end_episode(int(i))
        self._in_episode = active & ~done
        self._resetting = done & active if self.next_step else np.zeros(n, bool)
        self._obs = core.observations(obs, n)
        if self.frames:
            self._frames = self.env.render()
        core.stepped(int(active.sum()))
        info = {**info, "true_reward": true_rewards, "_true_reward": np.ones(n, bool),
                "predicted_reward": predicted, "_predicted_reward": np.ones(n, bool)}
        return obs, returned, terminated, truncated, info

    def close(self, **kwargs: Any) -> None:
        """Stop the learner (after its final gather and save), then close the sub-envs."""
        self.core.close()
        self.env.close(**kwargs)


__all__ = ["PreferenceLearnerError", "PreferenceLearningVectorEnv", "PreferenceLearningWrapper"]
