"""A run's environments: the training and evaluation envs (:func:`make_envs`), what the run
needs to know about them, read once (:class:`EnvFacts`: observation shape, kind and stored dtype,
action size, frame stack, episode limit), and the ring of rendered frames clips are cut from
(:func:`make_frame_store`).

The Workspace, the loops, the preference learner's spec and the async learner all read the
shapes from one :class:`EnvFacts` instead of from the gymnasium spaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from themis.agents import on_policy_config
from themis.agents.encoders import observation_kind
from themis.core.run_keys import RunKeys
from themis.environments.domains import episode_limit, frame_stack_size, get_domain, make_env
from themis.environments.frames import FrameStore
from themis.environments.observations import unsupported
from themis.run.config import TrainConfig, frame_capacity, frame_size
from themis.utils import ConfigError, check_memory


@dataclass(frozen=True)
class EnvFacts:
    """An environment's shapes as Themis stores and learns from them.

    Attributes:
        env_id: the gymnasium id the domain resolved (``HalfCheetah-v5``, ``ALE/Pong-v5``).
        obs_shape: one observation's shape, e.g. ``(17,)``, ``(4, 84, 84)``.
        obs_kind: ``vector``, ``pixels`` or ``grid`` (:func:`observation_kind`).
        obs_dim: the number of values in one observation (``prod(obs_shape)``).
        obs_dtype: stored observations' dtype: ``float32`` vectors, ``uint8`` images and grids.
        frame_stack: frames per stacked observation (1: none); stores keep each frame once.
        discrete: the action space is ``Discrete``.
        action_dim: actions as vectors: ``n`` for ``Discrete(n)`` (one-hot), else the size of
            the ``Box``.
        max_episode_steps: the env's time limit in steps, ``None`` without one.
    """

    env_id: str
    obs_shape: tuple[int, ...]
    obs_kind: str
    obs_dim: int
    obs_dtype: Any
    frame_stack: int
    discrete: bool
    action_dim: int
    max_episode_steps: int | None


def env_facts(env_id: str, env: gym.Env) -> EnvFacts:
    """The :class:`EnvFacts` of ``env`` (built by :func:`themis.environments.domains.make_env`).

    Raises:
        ConfigError: observations Themis cannot learn from (a dict without ``obs_transform``,
            float images, a shape that is neither a vector nor an image).
    """
    obs_space, action_space = env.observation_space, env.action_space
    why = unsupported(obs_space)
    if why is not None:
        raise ConfigError(f"{env_id}: {why}")
    obs_shape = tuple(obs_space.shape or ())
    try:
        kind = observation_kind(obs_shape)
    except ValueError as e:
        raise ConfigError(f"{env_id}: {e}") from None
    discrete = isinstance(action_space, gym.spaces.Discrete)
    action_dim = int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) \
        else int(np.prod(action_space.shape or ()))
    return EnvFacts(env_id, obs_shape, kind, int(np.prod(obs_shape)),
                    np.float32 if kind == "vector" else np.uint8, frame_stack_size(env),
                    discrete, action_dim, episode_limit(env))


def renders_frames(cfg: RunKeys) -> bool:
    """Whether the training env renders a frame per step: a person watches clips
    (``human_teacher``), a VLM looks at them (``teacher=vlm``) or clips are explained
    (``xplain_action``, ``xplain_state``)."""
    return bool(cfg.human_teacher or cfg.vlm_teacher or cfg.xplain_action or cfg.xplain_state)


def make_envs(cfg: RunKeys) -> tuple[gym.Env, gym.Env, EnvFacts]:
    """The run's training env (rendering frames when a person watches clips or clips are
    explained), its evaluation env (seeded 10,000 further, the same task) and their facts.

    Raises:
        ConfigError: an unknown domain or env, observations Themis cannot learn from, a
            ``segment`` longer than the episode limit, an ``xplain_action_dim`` that is not an
            action dimension.
    """
    env = make_env(cfg.domain, cfg.env, seed=cfg.seed,
                   render_mode="rgb_array" if renders_frames(cfg) else None,
                   render_size=frame_size(cfg), obs_transform=cfg.obs_transform,
                   **cfg.env_kwargs)
    eval_env = make_env(cfg.domain, cfg.env, seed=cfg.seed + 10_000, task_seed=cfg.seed,
                        obs_transform=cfg.obs_transform, **cfg.env_kwargs)
    facts = env_facts(get_domain(cfg.domain).resolve(cfg.env), env)
    if facts.max_episode_steps is not None and cfg.segment > facts.max_episode_steps:
        raise ConfigError(f"segment={cfg.segment} is longer than the episode limit "
                          f"({facts.max_episode_steps} steps) of {facts.env_id}")
    if cfg.xplain_action and not facts.discrete \
            and not -1 <= cfg.xplain_action_dim < facts.action_dim:
        raise ConfigError(f"xplain_action_dim={cfg.xplain_action_dim} is not an action "
                          f"dimension of {facts.env_id} (0 … {facts.action_dim - 1}, or -1 for "
                          "the norm of the action)")
    return env, eval_env, facts


def make_vector_env(cfg: TrainConfig) -> gym.vector.SyncVectorEnv:
    """The on-policy agent's ``ppo.num_envs`` (``a2c.num_envs``) training envs side by side
    (env ``i`` seeded ``seed + i``, all on the task of ``seed``; rendering frames as
    :func:`make_envs`'s), in a gymnasium ``SyncVectorEnv`` with ``AutoresetMode.SAME_STEP``:
    when an episode ends, ``step`` returns the next one's first observation and the last one
    in ``info["final_obs"]``."""
    def env_maker(i: int) -> Any:
        return lambda: make_env(cfg.domain, cfg.env, seed=cfg.seed + i, task_seed=cfg.seed,
                                render_mode="rgb_array" if renders_frames(cfg) else None,
                                obs_transform=cfg.obs_transform, **cfg.env_kwargs)

    return gym.vector.SyncVectorEnv([env_maker(i) for i in range(on_policy_config(cfg).num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def make_frame_store(cfg: RunKeys, slots: int) -> FrameStore:
    """The ring of ``frame_capacity(cfg)`` rendered frames (square, ``frame_size(cfg)`` px)
    for clips, indexed by the store's ``slots``.

    Raises:
        ConfigError: the ring does not fit in this machine's memory.
    """
    try:
        check_memory(f"a ring of {frame_capacity(cfg)} clip frames",
                     frame_capacity(cfg) * frame_size(cfg) ** 2 * 3)
    except MemoryError as e:
        raise ConfigError(f"human_frame_size={frame_size(cfg)}: {e}; lower human_frame_size or "
                          "human_frame_capacity") from None
    return FrameStore(frame_capacity(cfg), slots, frame_size(cfg))
