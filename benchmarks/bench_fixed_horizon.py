#!/usr/bin/env python
"""Hopper with and without a fixed horizon: does ending the episode at the fall hurt PEBBLE?

    python benchmarks/bench_fixed_horizon.py                   # 2 variants x 3 seeds, 500 queries
    python benchmarks/bench_fixed_horizon.py --jobs 2          # resumable: run it again to go on
    python benchmarks/bench_fixed_horizon.py --table-only      # the table of the finished runs

The hypothesis of docs/results/fixed-horizon.md: Bradley–Terry fixes the learned reward r̂
only up to a constant, and where r̂ is negative, an episode that ends when the robot falls pays,
so the agent learns to fall. seals' fixed-horizon Hopper (``domain=seals env=Hopper-v1``:
gymnasium's Hopper-v4 with ``terminate_when_unhealthy=False`` and the position observed) takes
that exit away. Variants, each PEBBLE at ``--budget`` (500) queries in 10 rounds, ``--steps``
(100k) steps, seeds ``--seeds`` (0 1 2), with the same overrides as ``benchmarks/bench_methods.py``:

- ``early``: ``domain=Control env=Hopper-v4``, which ends the episode when the robot falls;
- ``fixed``: ``domain=seals env=Hopper-v1``, always 1000 steps;
- ``--variants ... no_term`` adds ``Hopper-v4`` with ``+env_kwargs.terminate_when_unhealthy=false``
  (the fixed horizon without the extra observed position).

Each run is ``./themis_train.sh`` in ``OUT/<variant>/seed<k>/`` (``--out``, default
``runs/bench_fixed_horizon``); a finished run (its ``eval.csv`` reached the last step) is
skipped and an interrupted one resumes from its checkpoint (``benchmarks/bench_methods.py``'s
``run_one``). Printed last: per variant, the final true return's IQM with its 95 % bootstrap CI
(``scripts/summarize.py``), the seeds' finals, and the mean length of the last ten training
episodes (a policy that falls early shows short ones). The returns of the two variants are
on the same reward function (Hopper-v4's), but a fixed-horizon episode keeps paying its control
cost after a fall and no healthy bonus, so compare them with that in mind.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "early": ["domain=Control", "env=Hopper-v4"],
    "fixed": ["domain=seals", "env=Hopper-v1"],
    "no_term": ["domain=Control", "env=Hopper-v4", "+env_kwargs.terminate_when_unhealthy=false"],
}
"""The command line of each variant (``--variants``)."""


def load_script(name: str):
    """``benchmarks/<name>.py`` (or ``scripts/<name>.py``) as a module."""
    folder = "benchmarks" if name.startswith("bench_") else "scripts"
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def overrides(variant: str, seed: int, steps: int, budget: int, rounds: int, threads: int,
              extra: list[str]) -> list[str]:
    """One run's command line: the variant's env, PEBBLE at ``budget`` queries."""
    return [*VARIANTS[variant], f"num_train_steps={steps}", f"seed={seed}",
            f"torch_threads={threads}", f"eval_frequency={max(steps // 10, 100)}",
            "method=pebble", f"max_feedback={budget}",
            f"reward_batch={max(1, budget // rounds)}", *extra]


def finished(run: Path, steps: int) -> bool:
    """Whether the run's last evaluation is at ``steps``."""
    eval_csv = run / "eval.csv"
    if not eval_csv.is_file() or eval_csv.stat().st_size == 0:
        return False
    curve = pd.read_csv(eval_csv)
    return not curve.empty and int(curve["step"].iloc[-1]) >= steps


def table(out: Path, variants: list[str], seeds: list[int], steps: int, reps: int) -> str:
    """The Markdown table of the finished runs."""
    iqm_with_ci = load_script("summarize").iqm_with_ci
    lines = ["| variant | seeds | final true return IQM [95% CI] | finals | last 10 episodes' "
             "mean length |", "|---|---|---|---|---|"]
    for variant in variants:
        runs = [out / variant / f"seed{s}" for s in seeds]
        done = [r for r in runs if finished(r, steps)]
        if not done:
            lines.append(f"| {variant} | 0 | - | - | - |")
            continue
        finals = np.array([pd.read_csv(r / "eval.csv")["episode_reward"].iloc[-1] for r in done])
        lengths = [pd.read_csv(r / "train.csv")["episode_length"].tail(10).mean() for r in done]
        iqm, lo, hi = iqm_with_ci(finals, reps)
        lines.append(f"| {variant} | {len(done)} | {iqm:.0f} [{lo:.0f}, {hi:.0f}] | "
                     f"{', '.join(f'{f:.0f}' for f in finals)} | "
                     f"{', '.join(f'{n:.0f}' for n in lengths)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["early", "fixed"],
                        choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--budget", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=10, help="feedback rounds")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0,
                        help="PyTorch threads per run (default: cores / jobs)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_fixed_horizon")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing; table the runs finished so far")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_intermixed_args(argv)  # overrides after -- reach "extra"
    if args.jobs < 1 or args.steps < 1 or args.budget < 1 or args.rounds < 1:
        print("bench_fixed_horizon: --jobs, --steps, --budget and --rounds must be positive",
              file=sys.stderr)
        return 2
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    todo = [(v, s) for v in args.variants for s in args.seeds
            if not finished(args.out / v / f"seed{s}", args.steps)]
    total = len(args.variants) * len(args.seeds)
    print(f"{total} runs, {total - len(todo)} already done, {len(todo)} to go")
    if todo and not args.table_only:
        run_one = load_script("bench_methods").run_one

        def go(item: tuple[str, int]) -> int:
            variant, seed = item
            run = args.out / variant / f"seed{seed}"
            code = run_one(run, overrides(variant, seed, args.steps, args.budget, args.rounds,
                                          threads, args.extra),
                           args.out / variant / f"seed{seed}.log", threads)
            print(f"{variant} seed {seed}: {'done' if code == 0 else f'exit code {code}'}",
                  flush=True)
            return code

        with ThreadPoolExecutor(args.jobs) as pool:
            codes = list(pool.map(go, todo))
        if any(codes):
            print(f"{sum(c != 0 for c in codes)} runs failed; their logs are in {args.out}",
                  file=sys.stderr)
    print(table(args.out, args.variants, args.seeds, args.steps, args.reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
