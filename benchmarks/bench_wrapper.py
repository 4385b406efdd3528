#!/usr/bin/env python
"""The env-side cost of :class:`themis.PreferenceLearningWrapper`, and an agent's steps/s with
and without it, in one run.

    python benchmarks/bench_wrapper.py                          # HalfCheetah-v5, 20000 steps
    python benchmarks/bench_wrapper.py --env Pendulum-v1 --steps 5000 --sac-steps 500

(a) µs/step: the same random actions stepped through the bare env and through the wrapper
    (synthetic oracle teacher, B-Pref's network: 3 members of 3×256), timed once the first
    reward model is in use (r̂ computed every step), each measured ``--repeats`` times
    alternately; the wrapper's cost is the difference of the medians. The learner process
    trains in the background meanwhile (its own core: run this on an otherwise idle machine).
(b) Stable-Baselines3 SAC (2×256, one update per step) ``--sac-steps`` steps on the bare env
    and through the wrapper: steps/s of each.

``--record [CSV]`` (default ``results/wrapper_cost.csv``) writes the measurement's row: env,
steps, repeats, the bare and wrapped µs/step and their difference, SB3 SAC's steps/s on each,
and the date, commit, machine, command and wall time (``benchmarks/records.py``).
``python scripts/results_tables.py`` quotes it on the README and ``docs/results/wrapper.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: records

import records

from themis import PreferenceLearningWrapper


def keys(steps: int) -> dict:
    """A feedback schedule that trains a model early and keeps the learner busy."""
    return {"max_feedback": 100_000, "reward_batch": 50, "segment": 50, "num_seed_steps": 500,
            "num_interact": 2000, "reward_update": 20, "torch_threads": 1}


def loop(env: gym.Env, actions: np.ndarray) -> float:
    """Seconds for ``len(actions)`` steps (resets included)."""
    env.reset(seed=0)
    start = time.perf_counter()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset()
    return time.perf_counter() - start


def sac_rate(env: gym.Env, steps: int) -> float:
    """Stable-Baselines3 SAC steps/s (after 100 random steps)."""
    from stable_baselines3 import SAC

    agent = SAC("MlpPolicy", env, learning_starts=100, batch_size=256, seed=0, verbose=0,
                device="cpu")
    agent.learn(100)
    start = time.perf_counter()
    agent.learn(steps, reset_num_timesteps=False)
    return steps / (time.perf_counter() - start)


def record_row(env: str, steps: int, repeats: int, us: dict[str, float],
               rates: dict[str, float], wall_s: float, ran: str) -> dict:
    """The ``--record`` row of one measurement: µs/step bare and wrapped (medians), the
    wrapper's cost (their difference), SB3 SAC's steps/s on each (NaN when skipped)."""
    return {"env": env, "steps": steps, "repeats": repeats,
            "bare_us": round(us["bare"], 1), "wrapped_us": round(us["wrapped"], 1),
            "wrapper_us": round(us["wrapped"] - us["bare"], 1),
            "sac_bare_steps_per_s": round(rates.get("bare", float("nan")), 1),
            "sac_wrapped_steps_per_s": round(rates.get("wrapped", float("nan")), 1),
            **records.provenance(wall_s, ran)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=20_000, help="steps per timed loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sac-steps", type=int, default=2000, help="0: skip (b)")
    parser.add_argument("--record", type=Path, nargs="?", metavar="CSV",
                        const=Path(__file__).resolve().parents[1] / "results" / "wrapper_cost.csv",
                        help="write the measurement's row (default results/wrapper_cost.csv)")
    args = parser.parse_args(argv)
    start, ran = time.time(), records.command(__file__, argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        bare = gym.make(args.env)
        wrapped = PreferenceLearningWrapper(gym.make(args.env), Path(tmp) / "run",
                                            **keys(args.steps))
        actions = rng.uniform(-1, 1, (args.steps, *bare.action_space.shape)).astype(np.float32)
        wrapped.reset(seed=0)
        warm = 0
        while wrapped.model_version == 0:  # until r̂ is computed at every step
            _, _, te, tr, _ = wrapped.step(actions[warm % len(actions)])
            if te or tr:
                wrapped.reset()
            warm += 1
            if warm % 1000 == 0:
                time.sleep(0.5)  # let the learner train the first model
        times: dict[str, list[float]] = {"bare": [], "wrapped": []}
        for _ in range(args.repeats):
            times["bare"].append(loop(bare, actions))
            times["wrapped"].append(loop(wrapped, actions))
        us = {k: statistics.median(v) / args.steps * 1e6 for k, v in times.items()}
        version = wrapped.model_version
        print(f"{args.env}: {platform.processor() or platform.machine()}, {os.cpu_count()} "
              f"cores, torch {torch.__version__}; {args.steps} steps x {args.repeats}")
        print(f"(a) bare env {us['bare']:.1f} µs/step, wrapped {us['wrapped']:.1f} µs/step "
              f"(model version {version} in use): the wrapper costs "
              f"{us['wrapped'] - us['bare']:.1f} µs/step on the agent's side")
        rates = {}
        if args.sac_steps:
            rates["wrapped"] = sac_rate(wrapped, args.sac_steps)
            rates["bare"] = sac_rate(gym.make(args.env), args.sac_steps)
            print(f"(b) SB3 SAC: {rates['bare']:.0f} steps/s on the bare env, "
                  f"{rates['wrapped']:.0f} steps/s through the wrapper "
                  f"({rates['wrapped'] / rates['bare']:.2f}x)")
        wrapped.close()
    if args.record is not None:
        records.merge_rows(args.record, [record_row(args.env, args.steps, args.repeats, us, rates,
                                                    time.time() - start, ran)], ["date", "env"])


if __name__ == "__main__":
    main()
