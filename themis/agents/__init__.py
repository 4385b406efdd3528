"""Agents, and the choice of one from the environment's action space."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import gymnasium as gym
import numpy as np

from themis.agents.a2c import A2C, A2CConfig
from themis.agents.ppo import PPO, PPOConfig
from themis.agents.sac import SAC, SACConfig

__all__ = ["A2C", "ON_POLICY", "PPO", "SAC", "A2CConfig", "Agent", "AgentKeys", "PPOConfig",
           "SACConfig", "agent_of", "on_policy_config", "resolve_agent", "rollout_steps",
           "select_agent"]

ON_POLICY = ("ppo", "a2c")
"""The agents of the on-policy loop (:mod:`themis.loops.prefppo`), for ``Discrete`` actions."""


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


class AgentKeys(Protocol):
    """A run config's keys of its agent: ``agent`` and the on-policy groups ``ppo.*`` and
    ``a2c.*`` (:class:`themis.run.config.TrainConfig` has them)."""

    @property
    def agent(self) -> str: ...

    @property
    def ppo(self) -> PPOConfig: ...

    @property
    def a2c(self) -> A2CConfig: ...


def on_policy_config(cfg: AgentKeys) -> PPOConfig | A2CConfig:
    """The rollout settings (``num_envs``, ``num_steps``, ``gamma``, ...) of a run's on-policy
    agent: ``cfg.a2c`` with ``agent=a2c``, else ``cfg.ppo``."""
    return cfg.a2c if cfg.agent == "a2c" else cfg.ppo


def agent_of(cfg: AgentKeys, loop: str) -> str:
    """The agent a run's loop (``sac`` or ``ppo``: :mod:`themis.loops`) runs: ``sac``, ``ppo``
    or ``a2c`` (the on-policy loop runs A2C with ``agent=a2c``)."""
    return "a2c" if loop in ON_POLICY and cfg.agent == "a2c" else loop


def rollout_steps(cfg: AgentKeys, agent: str) -> int:
    """Agent steps between two updates of a run's agent, over all envs: ``num_envs ×
    num_steps`` of PPO's or A2C's rollout (feedback rounds come between rollouts), 1 for SAC."""
    if agent not in ON_POLICY:
        return 1
    settings = on_policy_config(cfg)
    return int(settings.num_envs * settings.num_steps)


def resolve_agent(requested: str, action_space: gym.Space) -> tuple[str, str]:
    """The agent to run and why: ``requested`` (``auto``, ``sac``, ``ppo`` or ``a2c``) checked
    against the action space (A2C, like PPO, needs a ``Discrete`` one).

    Returns:
        ``(name, reason)``, e.g. ``("ppo", "auto: Discrete action space")``.

    Raises:
        ValueError: the requested agent cannot act in this action space.
    """
    fitting = select_agent(action_space)
    kind = type(action_space).__name__
    if requested == "a2c" and fitting == "ppo":
        return "a2c", f"agent=a2c: {kind} action space"
    if requested in ("auto", fitting):
        return fitting, f"{'auto' if requested == 'auto' else 'agent=' + requested}: {kind} " \
            "action space"
    raise ValueError(f"agent={requested} cannot act in the action space {action_space!r}; "
                     f"use agent={fitting} or agent=auto")
