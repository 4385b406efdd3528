#!/usr/bin/env python
"""Learning quality: PEBBLE with an oracle teacher against SAC on the true reward, same budget.

    python benchmarks/bench_feedback.py           # HalfCheetah-v5, 100k steps, 500 queries, 3 seeds
    python benchmarks/bench_feedback.py --quick   # a smoke test of a few minutes
    python benchmarks/bench_feedback.py --jobs 2  # two runs at a time, one torch thread each
    python benchmarks/bench_feedback.py --seeds 0 1 2 3 4 --steps 200000 --max-feedback 1000

Each run goes through ``./themis_train.sh`` (as a user would) into ``--out/METHOD/seed_N``;
runs already finished there are reused and interrupted ones resume from their last checkpoint,
so an interrupted benchmark continues; ``--jobs N`` runs N at a time. The final
evaluation return (mean over ``num_eval_episodes`` of the true env return) of each run is read
from its ``eval.csv``. Prints, last, a Markdown table with mean ± std per method and the ratio
PEBBLE / SAC (the target is ≥ 70 %).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

METHODS = {
    "PEBBLE, oracle teacher": ["learn_reward=true", "teacher=oracle"],
    "SAC, true reward": ["learn_reward=false", "num_unsup_steps=0"],  # plain SAC, as in PEBBLE
}
QUICK = ["num_seed_steps=500", "num_unsup_steps=1000", "num_interact=1000", "reward_batch=10",
         "eval_frequency=2500", "num_eval_episodes=2", "sac.hidden_dim=64",
         "reward_hidden_dim=64", "reward_update=10"]


def final_return(run: Path) -> float | None:
    """The last evaluation's true return of a finished run (None if it did not finish)."""
    eval_csv = run / "eval.csv"
    if not (run / "learning_curve.png").is_file() or not eval_csv.is_file():
        return None
    return float(pd.read_csv(eval_csv)["episode_reward"].iloc[-1])


def without_keys(overrides: list[str], replaced: list[str]) -> list[str]:
    """``overrides`` minus those whose key ``replaced`` sets again (Hydra refuses duplicates)."""
    keys = {o.split("=")[0] for o in replaced}
    return [o for o in overrides if o.split("=")[0] not in keys]


def latest_step(run: Path) -> int:
    """The last logged training step of a run in progress (0 before its first log line)."""
    try:
        return int(pd.read_csv(run / "train.csv")["step"].iloc[-1])
    except (OSError, ValueError, KeyError, IndexError, pd.errors.EmptyDataError):
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--max-feedback", type=int, default=500)
    parser.add_argument("--reward-batch", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_feedback")
    parser.add_argument("--quick", action="store_true", help="5k steps, 40 queries, 1 seed")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at the same time (torch threads: cores // jobs each)")
    args = parser.parse_args(argv)
    extra: list[str] = []
    if args.quick:
        args.steps, args.max_feedback, args.seeds = 5000, 40, args.seeds[:1]
        args.reward_batch = 10
        extra = QUICK
        args.out = args.out.with_name(args.out.name + "_quick")
    threads = max(1, (os.cpu_count() or 1) // args.jobs)

    jobs = []  # (method, seed, run dir, command) of every run
    for seed in args.seeds:
        for method, overrides in METHODS.items():
            run = args.out / method.split(",")[0].lower() / f"seed_{seed}"
            cmd = [str(ROOT / "themis_train.sh"), f"env={args.env}", f"seed={seed}",
                   f"num_train_steps={args.steps}", f"max_feedback={args.max_feedback}",
                   f"reward_batch={args.reward_batch}", f"torch_threads={threads}",
                   *without_keys(extra, overrides), *overrides, f"hydra.run.dir={run}"]
            jobs.append((method, seed, run, cmd))
    start = time.time()
    pending = [job for job in jobs if final_return(job[2]) is None]
    running: list[tuple[subprocess.Popen[bytes], tuple[str, int, Path, list[str]]]] = []
    print(f"{len(jobs) - len(pending)} of {len(jobs)} runs already finished; running the "
          f"other {len(pending)}, {args.jobs} at a time ({threads} torch threads each); "
          f"each run's console output goes to RUN/console.log", flush=True)
    last_report = 0.0
    while pending or running:
        while pending and len(running) < args.jobs:
            method, seed, run, cmd = job = pending.pop(0)
            if (run / "checkpoints" / "state.pt").is_file():
                cmd = [*cmd, "resume=true"]  # an interrupted run continues where it stopped
            else:  # or starts again when it stopped before its first checkpoint
                shutil.rmtree(run, ignore_errors=True)
            run.mkdir(parents=True, exist_ok=True)
            log = open(run / "console.log", "ab")
            proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ), stdout=log,
                                    stderr=subprocess.STDOUT)
            log.close()
            running.append((proc, job))
            print(f"started {method}, seed {seed} -> {run}", flush=True)
        time.sleep(5)
        for proc, job in list(running):
            if proc.poll() is None:
                continue
            running.remove((proc, job))
            method, seed, run, cmd = job
            if proc.returncode != 0:
                for p, _ in running:
                    p.terminate()
                print(f"run failed ({proc.returncode}), see {run / 'console.log'}: "
                      f"{' '.join(cmd)}", file=sys.stderr)
                return 1
            print(f"finished {method}, seed {seed}: final true return "
                  f"{final_return(run):.1f} ({time.time() - start:.0f} s)", flush=True)
        if running and time.time() - last_report > 60:
            last_report = time.time()
            print(f"[{time.time() - start:.0f} s] " + "; ".join(
                f"{job[0].split(',')[0]} seed {job[1]}: step {latest_step(job[2])}"
                for _, job in running), flush=True)

    results: dict[str, list[float]] = {m: [] for m in METHODS}
    for method, _, run, _ in jobs:
        value = final_return(run)
        assert value is not None
        results[method].append(value)

    pebble, sac = (np.array(results[m]) for m in METHODS)
    ratio = pebble.mean() / sac.mean() if sac.mean() > 0 else float("nan")
    print(f"\n{args.env}, {args.steps} steps, at most {args.max_feedback} queries (PEBBLE), "
          f"seeds {args.seeds}, final evaluation return (mean ± std over seeds)\n")
    print("| method | final true return | per seed |")
    print("|---|---|---|")
    for method, values in results.items():
        arr = np.array(values)
        print(f"| {method} | {arr.mean():.1f} ± {arr.std():.1f} | "
              f"{', '.join(f'{v:.0f}' for v in values)} |")
    print(f"| ratio PEBBLE / SAC | {ratio:.1%} | target ≥ 70 % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
