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


def evaluation_row(env: gym.Env, policy: Callable[[np.ndarray], Any], episodes: int, seed: int,
                   step: int, episode: int, counters: dict[str, Any]) -> dict[str, Any]:
    """An ``eval.csv`` row: ``step``, ``episode``, the mean and std of the true return over
    ``episodes`` episodes of ``policy`` (:func:`run_episodes`), ``counters`` (feedback counts,
    teacher statistics), and ``success_rate`` (the share of episodes where ``info["success"]``
    was true at some step) for envs that report it (Meta-World)."""
    returns, successes = run_episodes(env, policy, episodes, seed)
    row = {"step": step, "episode": episode, "episode_reward": float(np.mean(returns)),
           "episode_reward_std": float(np.std(returns)), **counters}
    if successes:
        row["success_rate"] = float(np.mean(successes))
    return row
