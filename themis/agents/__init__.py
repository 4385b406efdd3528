"""Agents, and the choice of one from the environment's action space."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import gymnasium as gym
import numpy as np

from themis.agents.ppo import PPO, PPOConfig
from themis.agents.sac import SAC, SACConfig

__all__ = ["PPO", "SAC", "Agent", "PPOConfig", "SACConfig", "resolve_agent", "select_agent"]


class Agent(Protocol):
    """What the loops, checkpoints and explanations need of an agent (SAC and PPO have it)."""

    METRICS: ClassVar[tuple[str, ...]]
    """Names of the metrics ``update`` returns (fixed ``train.csv`` columns)."""

    def act(self, obs: np.ndarray, sample: bool = ...) -> Any:
        """An action for one observation (``sample``: from the policy, else its mode/mean)."""

    metrics: dict[str, Any]
    """The metrics of the last :meth:`update` (empty before the first)."""

    def update(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """One update (SAC: a replay batch and the step; PPO: a rollout); metrics."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def select_agent(action_space: gym.Space) -> str:
    """Name the agent that fits an action space: ``"sac"`` for ``Box``, ``"ppo"`` for
    ``Discrete``.

    Raises:
        ValueError: any other space (MultiDiscrete, Dict, ...), named in the message.
    """
    if isinstance(action_space, gym.spaces.Box):
        return "sac"
    if isinstance(action_space, gym.spaces.Discrete):
        return "ppo"
    raise ValueError(f"no Themis agent supports the action space {action_space!r}: SAC needs "
                     "a Box action space, PPO a Discrete one")


def resolve_agent(requested: str, action_space: gym.Space) -> tuple[str, str]:
    """The agent to run and why: ``requested`` (``auto``, ``sac`` or ``ppo``) checked against the
    action space.

    Returns:
        ``(name, reason)``, e.g. ``("ppo", "auto: Discrete action space")``.

    Raises:
        ValueError: the requested agent cannot act in this action space.
    """
    fitting = select_agent(action_space)
    kind = type(action_space).__name__
    if requested in ("auto", fitting):
        return fitting, f"{'auto' if requested == 'auto' else 'agent=' + requested}: {kind} " \
            "action space"
    raise ValueError(f"agent={requested} cannot act in the action space {action_space!r}; "
                     f"use agent={fitting} or agent=auto")
