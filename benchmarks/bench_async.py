#!/usr/bin/env python
"""reward_training=sync against reward_training=async: wall-clock time and final true return.

    python benchmarks/bench_async.py                          # the main job, seeds 0-2, both modes
    python benchmarks/bench_async.py --jobs 2 --out results/async     # resumable: run again
    python benchmarks/bench_async.py --domain Classic --env Pendulum-v1 --steps 20000 -- \\
        num_unsup_steps=1000 num_interact=2000

Every run is ``./themis_train.sh`` with the defaults of the main job (HalfCheetah-v5, 80k
steps, oracle teacher, ``max_feedback=1000``) and ``seed=``, ``reward_training=``, plus the
overrides after ``--``, in ``OUT/<env>/<mode>/seed<k>/``. A run's wall-clock time (the whole
command: start-up, training, evaluations, the final save) goes to its ``timing.json`` when it
ends; a run with one is skipped, so an interrupted benchmark continues where it stopped. An
interrupted run starts again from scratch (an async run cannot be resumed, and a resumed sync
run's time would not be one run's). Runs go ``--jobs`` at a time, each with cores / jobs PyTorch
threads; parallel runs share the cores (and an async run has a second process), so compare
times of one ``--jobs`` setting only, and ``--jobs 1`` gives the cleanest times.

Printed last: per mode, each seed's wall-clock minutes and final true return (the last row of
``eval.csv``), then the mean ± standard deviation over seeds and async's time as a share of
sync's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
MODES = ("sync", "async")


def run_dir(out: Path, env: str, mode: str, seed: int) -> Path:
    """Where one run lives."""
    return out / env / mode / f"seed{seed}"


def run_one(run: Path, args: list[str], threads: int) -> int:
    """One run from scratch; its wall-clock seconds go to ``timing.json`` when it succeeds."""
    shutil.rmtree(run, ignore_errors=True)
    run.parent.mkdir(parents=True, exist_ok=True)
    log = run.parent / f"{run.name}.log"
    start = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.call([str(ROOT / "themis_train.sh"), *args, f"hydra.run.dir={run}"],
                               cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                               env={**os.environ, "THEMIS_THREADS": str(threads)})
    if code == 0:
        (run / "timing.json").write_text(json.dumps(
            {"wall_s": time.perf_counter() - start, "args": args, "threads": threads}))
    return code


def result(run: Path) -> tuple[float, float] | None:
    """``(wall-clock minutes, final true return)`` of a finished run, or ``None``."""
    timing, evals = run / "timing.json", run / "eval.csv"
    if not timing.is_file() or not evals.is_file():
        return None
    wall = float(json.loads(timing.read_text())["wall_s"]) / 60
    return wall, float(pd.read_csv(evals)["episode_reward"].iloc[-1])


def table(out: Path, env: str, seeds: list[int]) -> str:
    """The comparison table of the finished runs (see the module docstring)."""
    lines = [f"{env}: reward_training sync vs async (wall-clock minutes, final true return)",
             f"{'mode':6s} {'seed':>4s} {'minutes':>9s} {'return':>10s}"]
    means = {}
    for mode in MODES:
        got = [(seed, r) for seed in seeds if (r := result(run_dir(out, env, mode, seed)))]
        for seed, (wall, ret) in got:
            lines.append(f"{mode:6s} {seed:>4d} {wall:9.1f} {ret:10.1f}")
        if got:
            walls = np.array([r[0] for _, r in got])
            rets = np.array([r[1] for _, r in got])
            means[mode] = walls.mean()
            lines.append(f"{mode:6s} {'mean':>4s} {walls.mean():6.1f}±{walls.std():<4.1f} "
                         f"{rets.mean():7.1f}±{rets.std():.1f}   ({len(got)} seeds)")
    if len(means) == 2 and means["sync"] > 0:
        lines.append(f"async takes {means['async'] / means['sync']:.2f}x sync's wall-clock time")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="Control")
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=0,
                        help="num_train_steps (default: the main job's)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0,
                        help="PyTorch threads per run (default: cores / jobs)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_async")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: the table of the runs finished so far")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_intermixed_args(argv)  # overrides after -- reach "extra"
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    todo = []
    for mode in args.modes:
        for seed in args.seeds:
            run = run_dir(args.out, args.env, mode, seed)
            if result(run) is None:
                steps = [f"num_train_steps={args.steps}"] if args.steps else []
                todo.append((run, [f"domain={args.domain}", f"env={args.env}", f"seed={seed}",
                                   f"reward_training={mode}", f"torch_threads={threads}",
                                   *steps, *args.extra]))
    total = len(args.modes) * len(args.seeds)
    print(f"{total} runs, {total - len(todo)} already done, {len(todo)} to go ({args.jobs} at a "
          f"time, {threads} threads each); logs: {args.out}/<env>/<mode>/seed<k>.log",
          flush=True)
    failed = []
    if not args.table_only:
        with ThreadPoolExecutor(args.jobs) as pool:
            codes = pool.map(lambda job: run_one(job[0], job[1], threads), todo)
            for (run, _), code in zip(todo, codes, strict=True):
                print(f"{run}: {'done' if code == 0 else f'failed (exit {code})'}", flush=True)
                if code != 0:
                    failed.append(run)
    print(table(args.out, args.env, args.seeds))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
