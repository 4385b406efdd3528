"""RUNE: exploration by the reward model's uncertainty.

Liang, Shu, Lee & Abbeel, "Reward Uncertainty for Exploration in Preference-based
Reinforcement Learning", ICLR 2022; official code rll-research/rune ``agent/sac_explore.py``
(``beta``), ``reward_model_explore.py`` (``r_hat_std``) and ``config/agent/sac_explore.yaml``.

The agent's reward is r̂(s, a) + β_t · std_m r̂_m(s, a): the ensemble mean plus β_t times the
(population) standard deviation over the members, unnormalised, with β_t = β₀ (1 − ρ)^t and t
the environment step (β₀ 0.05, ρ 1e-5 as in the official scripts; the schedule named
``linear_decay`` there decays exponentially). SAC: rewards are written when the buffer is
relabelled and for new transitions, with the β_t of that moment (the official code keeps std
per transition and multiplies by β_t at each critic update; between two relabels β_t changes
by a factor (1 − ρ)^num_interact, 0.95 at the defaults). PPO (PrefPPO): each rollout's rewards
use β_t at collection time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from themis.core.ranges import NON_NEGATIVE, UNIT, Range
from themis.core.run_keys import RunKeys
from themis.methods.base import Method, MethodContext
from themis.utils import ConfigError


@dataclass
class RUNEConfig:
    """``rune.*`` keys (``method=rune`` sets ``enabled``); defaults: the official scripts."""

    enabled: bool = False
    """Switch RUNE on (``method=rune``)."""
    beta_init: float = 0.05
    """β₀, the weight of the ensemble's std at step 0."""
    beta_decay: float = 0.00001
    """ρ: β_t = β₀ (1 − ρ)^t, t in environment steps (0: constant β₀)."""
    ppo_beta: float = 0.01
    """β with PPO (PrefPPO): constant, as ``train_PrefPPO_explore.py``."""


class UncertaintyBonus:
    """β_t · std of the ensemble's per-step rewards.

    Args:
        cfg: the ``rune.*`` keys.
        clock: the current environment step.
        on_policy: the agent is PPO: β is the constant ``ppo_beta``.
    """

    def __init__(self, cfg: RUNEConfig, clock: Callable[[], int],
                 on_policy: bool = False) -> None:
        self.cfg, self.clock, self.on_policy = cfg, clock, on_policy
        self.last_std = float("nan")

    def beta(self, step: int | None = None) -> float:
        """β_t = β₀ (1 − ρ)^t (SAC), or ``ppo_beta`` (PPO)."""
        if self.on_policy:
            return float(self.cfg.ppo_beta)
        t = self.clock() if step is None else step
        return float(self.cfg.beta_init * (1.0 - self.cfg.beta_decay) ** t)

    def stats(self) -> dict[str, float]:
        """``reward.csv`` columns: β_t now and the mean ensemble std of the last rewards."""
        return {"rune_beta": self.beta(), "rune_std": self.last_std}

    def bonus(self, member_rewards: np.ndarray) -> np.ndarray:
        """β_t · std over members of each row, ``(E, n) -> (n,)`` (the members' dtype)."""
        std = member_rewards.std(axis=0)
        self.last_std = float(std.mean()) if len(std) else float("nan")
        return self.beta() * std

    def __call__(self, member_rewards: np.ndarray) -> np.ndarray:
        """Reward of each row: mean + β_t · std over members; ``(E, n) -> (n,)`` float32."""
        return (member_rewards.mean(axis=0) + self.bonus(member_rewards)).astype(np.float32)


class RUNE(Method[RUNEConfig]):
    """RUNE as a method (module docstring): β_t × the ensemble's std added to r̂."""

    name, title, published = "rune", "RUNE", "2022-05"
    Config = RUNEConfig
    RANGES: ClassVar[Mapping[str, Range]] = {
        "beta_init": NON_NEGATIVE, "beta_decay": UNIT, "ppo_beta": NON_NEGATIVE}
    ratings = True

    def __init__(self, cfg: RUNEConfig, context: MethodContext) -> None:
        super().__init__(cfg, context)
        self.uncertainty = UncertaintyBonus(cfg, context.clock, on_policy=context.on_policy)

    @classmethod
    def check(cls, run_cfg: RunKeys, agent: str | None, where: str) -> None:
        """The std needs two members or more."""
        if run_cfg.ensemble_size < 2:
            raise ConfigError("method=rune adds beta * the ensemble's std of r̂: it needs "
                              f"ensemble_size >= 2 (got {run_cfg.ensemble_size})")

    def reward_bonus(self, members: np.ndarray) -> np.ndarray:
        return self.uncertainty.bonus(members)

    def stats(self) -> dict[str, float]:
        return self.uncertainty.stats()


__all__ = ["RUNE", "RUNEConfig", "UncertaintyBonus"]
