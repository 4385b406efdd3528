#!/usr/bin/env python
"""Environment steps per second: Stable-Baselines3 SAC vs Themis SAC vs the full PEBBLE loop.

    python scripts/bench_throughput.py                    # 20000 measured steps each
    python scripts/bench_throughput.py --steps 5000 --chunk 1000 --device cuda

One process, HalfCheetah-v5, equal networks (2×256), batch 256, one gradient update per step:

(a) Stable-Baselines3 SAC on the true reward (a dev dependency),
(b) Themis SAC on the true reward (``learn_reward=false``),
(c) the full Themis PEBBLE loop at the default feedback schedule (unsupervised pretraining,
    queries, reward-model training and relabelling included).

After ``--warmup`` steps each (random actions, excluded), the three run alternately in chunks of
``--chunk`` steps until each has done ``--steps`` measured steps, so that a change in machine load
hits all three alike. Prints steps/s and the ratios b/a and c/a as a Markdown table, last.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

from themis.config import TrainConfig, compose
from themis.utils import set_num_threads


class SB3Runner:
    """(a): SB3 SAC, learning in chunks (``reset_num_timesteps=False``)."""

    def __init__(self, warmup: int, total: int, device: str) -> None:
        import gymnasium as gym
        from stable_baselines3 import SAC

        self.model = SAC("MlpPolicy", gym.make("HalfCheetah-v5"), learning_starts=warmup,
                         batch_size=256, buffer_size=total, train_freq=1, gradient_steps=1,
                         policy_kwargs={"net_arch": [256, 256]}, device=device, seed=0,
                         verbose=0)

    def advance(self, steps: int) -> None:
        self.model.learn(steps, reset_num_timesteps=False)


class ThemisRunner:
    """(b) and (c): a Themis workspace run ``steps`` further each call."""

    def __init__(self, overrides: list[str], run_dir: Path) -> None:
        from themis.train import make_workspace

        self.ws = make_workspace(compose(overrides), run_dir)
        self.ws.logger.stream = open(os.devnull, "w")

    def advance(self, steps: int) -> None:
        self.ws.run(until=self.ws.step + steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="measured steps per method")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    set_num_threads(0)
    total = args.warmup + args.steps
    defaults = TrainConfig()
    pretraining = defaults.num_seed_steps + defaults.num_unsup_steps
    if total + 1 <= pretraining:
        print(f"bench_throughput: error: --warmup + --steps ({total}) must exceed PEBBLE's "
              f"pretraining ({pretraining} steps): raise --steps", file=sys.stderr)
        return 2
    # num_train_steps one past the end and huge frequencies: no evaluation or checkpoint runs
    # inside the measured steps (SB3 does neither)
    never = 10**9
    common = ["env=HalfCheetah-v5", f"device={args.device}", f"num_train_steps={total + 1}",
              "sac.hidden_dim=256", "sac.batch_size=256", f"eval_frequency={never}",
              f"log_frequency={never}", f"checkpoint_frequency={never}"]
    with TemporaryDirectory() as tmp:
        runners = {
            "(a) SB3 SAC, true reward": SB3Runner(args.warmup, total, args.device),
            "(b) Themis SAC, true reward": ThemisRunner(
                [*common, "learn_reward=false", f"num_seed_steps={args.warmup}",
                 "num_unsup_steps=0", "reset_update=0"], Path(tmp) / "b"),
            "(c) Themis PEBBLE, oracle": ThemisRunner(
                [*common, f"num_seed_steps={args.warmup}"], Path(tmp) / "c"),
        }
        seconds = dict.fromkeys(runners, 0.0)
        for runner in runners.values():  # warm-up: random actions, not measured
            runner.advance(args.warmup)
        done = 0
        while done < args.steps:
            chunk = min(args.chunk, args.steps - done)
            for name, runner in runners.items():
                start = time.perf_counter()
                runner.advance(chunk)
                seconds[name] += time.perf_counter() - start
            done += chunk
            print(f"{done}/{args.steps} steps: " + ", ".join(
                f"{name[:3]} {done / seconds[name]:.0f}/s" for name in runners), flush=True)
    rate = {name: args.steps / s for name, s in seconds.items()}
    a, b, c = rate.values()
    print(f"\nHalfCheetah-v5, {args.steps} steps after {args.warmup} warm-up, 2×256 networks, "
          f"batch 256, device {args.device}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})\n")
    print("| method | steps/s | ratio to (a) |")
    print("|---|---|---|")
    for name, r in rate.items():
        print(f"| {name} | {r:.1f} | {r / a:.2f} |")
    print(f"\nb/a = {b / a:.2f} (target 2.0), c/a = {c / a:.2f} (target 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
