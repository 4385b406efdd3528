"""Agents, and the choice of one from the environment's action space."""

from __future__ import annotations

import gymnasium as gym

from themis.agents.ppo import PPO, PPOConfig
from themis.agents.sac import SAC, SACConfig

__all__ = ["PPO", "SAC", "PPOConfig", "SACConfig", "resolve_agent", "select_agent"]


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
