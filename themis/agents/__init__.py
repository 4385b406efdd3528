"""Agents and :func:`select_agent`, which picks one from the environment's action space."""

from __future__ import annotations

import gymnasium as gym
import torch

from themis.agents.sac import SAC, SACConfig

__all__ = ["SAC", "SACConfig", "select_agent"]


def select_agent(action_space: gym.Space) -> str:
    """Name the agent that fits an action space.

    Args:
        action_space: the environment's action space.

    Returns:
        ``"sac"`` for ``Box`` action spaces.

    Raises:
        ValueError: for any other space (PPO for ``Discrete`` comes with the domains issue).
    """
    if isinstance(action_space, gym.spaces.Box):
        return "sac"
    raise ValueError(
        f"no Themis agent supports the action space {action_space!r} yet: SAC needs a Box "
        "action space (PPO for Discrete action spaces is not supported yet)"
    )


def make_agent(name: str, obs_dim: int, action_dim: int, device: torch.device,
               cfg: SACConfig) -> SAC:
    """Build the agent called ``name`` (only ``"sac"`` so far)."""
    if name != "sac":
        raise ValueError(f"unknown agent {name!r}; available: sac")
    return SAC(obs_dim, action_dim, device, cfg)
