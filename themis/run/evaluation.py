"""Evaluation episodes: the true return of a policy and, where the env reports it, success."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np


def run_episodes(env: gym.Env, policy: Callable[[np.ndarray], Any], episodes: int,
                 seed: int) -> tuple[list[float], list[bool]]:
    """Play ``episodes`` episodes (reset seeds ``seed``, ``seed + 1``, ...).

    Returns:
        ``(returns, successes)``: the true return of each episode, and for envs that put
        ``success`` in ``info`` (Meta-World) whether it was true at some step of each episode
        (empty otherwise).
    """
    returns, successes = [], []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, ret, success = False, 0.0, None
        while not done:
            obs, reward, terminated, truncated, info = env.step(policy(obs))
            ret += float(reward)
            done = terminated or truncated
            if "success" in info:  # solved at any step of the episode
                success = bool(success) or bool(info["success"])
        returns.append(ret)
        if success is not None:
            successes.append(success)
    return returns, successes
