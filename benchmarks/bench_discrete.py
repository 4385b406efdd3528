#!/usr/bin/env python
"""Does PPO learn a discrete task from preferences alone? A table against random and true reward.

    python benchmarks/bench_discrete.py                                   # MiniGrid Empty-5x5
    python benchmarks/bench_discrete.py --domain Box2d --env LunarLander-v3 --steps 200000
    python benchmarks/bench_discrete.py --seeds 0 1 2 -- max_feedback=400 feed_type=1

For every seed it runs Themis twice with the same budget: PrefPPO with the oracle teacher (the
agent sees only the learned reward) and PPO on the environment reward; a uniformly random policy
is the floor. Extra ``key=value`` arguments after ``--`` go to every run's config. Prints the
final evaluation return (true reward, mean ± std over seeds) as a Markdown table, last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from themis.environments.domains import make_env
from themis.run.closing import finish
from themis.run.config import compose
from themis.run.threads import set_num_threads

ROOT = Path(__file__).resolve().parents[1]


def random_return(domain: str, env: str, episodes: int, seed: int) -> float:
    """Mean true return of a uniformly random policy."""
    e = make_env(domain, env, seed=seed)
    returns = []
    for i in range(episodes):
        e.reset(seed=seed + i)
        done, ret = False, 0.0
        while not done:
            _, r, terminated, truncated, _ = e.step(e.action_space.sample())
            ret += float(r)
            done = terminated or truncated
        returns.append(ret)
    return float(np.mean(returns))


def run(overrides: list[str], run_dir: Path) -> tuple[float, int, float]:
    """One Themis run; returns (final eval return, total feedback, seconds)."""
    from themis.builder import make_workspace

    start = time.time()
    ws = make_workspace(compose(overrides), run_dir)
    ws.run()
    finish(ws)
    final = float(pd.read_csv(run_dir / "eval.csv")["episode_reward"].iloc[-1])
    return final, ws.total_feedback, time.time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="Minigrid")
    parser.add_argument("--env", default="Empty-5x5-v0")
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_discrete")
    parser.add_argument("overrides", nargs="*", help="extra key=value config overrides")
    args = parser.parse_args(argv)
    set_num_threads(0)

    common = [f"domain={args.domain}", f"env={args.env}", f"num_train_steps={args.steps}",
              "num_eval_episodes=20", f"eval_frequency={max(args.steps // 5, 1)}",
              f"log_frequency={max(args.steps // 10, 1)}", *args.overrides]
    results: dict[str, list[float]] = {"random policy": [], "PrefPPO, oracle preferences": [],
                                       "PPO, true reward": []}
    feedback, seconds = [], []
    for seed in args.seeds:
        results["random policy"].append(random_return(args.domain, args.env, 20, seed))
        final, fb, sec = run([*common, f"seed={seed}", "learn_reward=true"],
                             args.out / f"prefs_seed{seed}")
        results["PrefPPO, oracle preferences"].append(final)
        feedback.append(fb)
        seconds.append(sec)
        final, _, _ = run([*common, f"seed={seed}", "learn_reward=false"],
                          args.out / f"true_seed{seed}")
        results["PPO, true reward"].append(final)
        print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in results.items()),
              flush=True)

    print(f"\n{args.domain} {args.env}, {args.steps} env steps, seeds {args.seeds}, "
          f"{int(np.mean(feedback))} queries, PrefPPO run {np.mean(seconds):.0f} s\n")
    print("| policy | final true return (mean ± std) |")
    print("|---|---|")
    for name, values in results.items():
        print(f"| {name} | {np.mean(values):.3f} ± {np.std(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
