"""What a run needs to know about its environment, read once from the env Themis built:
observation shape, kind and stored dtype, action size, frame stack, episode limit.

The Workspace, the loops, the preference learner's spec and the async learner all read these
from one :class:`EnvFacts` instead of from the gymnasium spaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from themis.agents.encoders import observation_kind
from themis.environments.domains import episode_limit, frame_stack_size
from themis.environments.observations import unsupported
from themis.utils import ConfigError


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
