#!/usr/bin/env python
"""The main job, timed: ``./themis_train.sh`` with no arguments, once per seed, one run at a time.

    python benchmarks/bench_main_job.py                      # seeds 0 1 2 (issue 18's target)
    python benchmarks/bench_main_job.py --seeds 3 4 -- method=rune       # overrides after --
    python benchmarks/bench_main_job.py --out runs/main_rune -- method=rune

Each run is the launcher a user types, plus ``seed=<k>`` and ``hydra.run.dir=OUT/seed<k>``
(and the overrides after ``--``), with every core to itself: runs go one after the other so
that each wall clock is the one a user with this machine would see. The wall clock (seconds)
and the peak resident memory of the run's process tree (MB; ``os.wait4``'s ``ru_maxrss`` of
the launcher's largest descendant) go to ``OUT/seed<k>.json`` once the run exits with 0; a
seed with that file is skipped, so an interrupted benchmark continues where it stopped.

Printed last: one row per seed with its wall clock, peak memory, the true eval return at every
evaluation (``eval.csv``, mean of ``num_eval_episodes`` episodes with the mean action) and
whether it met the target (``--target-return`` within ``--target-minutes``), then the IQM over
seeds with a 95 % bootstrap CI (``scripts/summarize.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def load_summarize():
    """``scripts/summarize.py`` as a module (its IQM and bootstrap CI)."""
    spec = importlib.util.spec_from_file_location("summarize", ROOT / "scripts" / "summarize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_seed(out: Path, seed: int, extra: list[str]) -> dict | None:
    """Run the launcher for one seed: its timing (``wall_s``, ``peak_rss_mb``); None on failure."""
    run = out / f"seed{seed}"
    shutil.rmtree(run, ignore_errors=True)  # an unfinished run starts again: it is timed
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"seed{seed}.log").open("w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen([str(ROOT / "themis_train.sh"), f"seed={seed}", *extra,
                                 f"hydra.run.dir={run}"], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        return None
    timing = {"seed": seed, "wall_s": round(wall, 1),
              "peak_rss_mb": round(usage.ru_maxrss / 1024),  # Linux: kB
              "overrides": extra}
    (out / f"seed{seed}.json").write_text(json.dumps(timing, indent=1))
    return timing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_main_job")
    parser.add_argument("--target-return", type=float, default=1500.0)
    parser.add_argument("--target-minutes", type=float, default=20.0)
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_intermixed_args(argv)  # overrides after -- reach "extra"
    todo = [s for s in args.seeds if not (args.out / f"seed{s}.json").is_file()]
    print(f"{len(args.seeds)} seeds, {len(args.seeds) - len(todo)} already done; "
          f"logs: {args.out}/seed<k>.log", flush=True)
    failed = []
    for seed in todo:
        timing = run_seed(args.out, seed, args.extra)
        print(f"seed {seed}: " + (f"{timing['wall_s'] / 60:.1f} min" if timing else "failed"),
              flush=True)
        if timing is None:
            failed.append(seed)
    rows = []
    for seed in args.seeds:
        stamp = args.out / f"seed{seed}.json"
        if stamp.is_file():
            timing = json.loads(stamp.read_text())
            curve = pd.read_csv(args.out / f"seed{seed}" / "eval.csv")
            rows.append((seed, timing, curve))
    if not rows:
        print("bench_main_job: no finished run", file=sys.stderr)
        return 1
    steps = [int(s) for s in rows[0][2]["step"]]
    print(f"\ntrue eval return; target ≥ {args.target_return:.0f} within "
          f"{args.target_minutes:.0f} min; overrides: {' '.join(args.extra) or 'none'}\n")
    print("| seed | wall clock | peak RSS | " + " | ".join(f"{s / 1000:g}k" for s in steps)
          + " | target |")
    print("|---" * (len(steps) + 4) + "|")
    finals, met = [], 0
    for seed, timing, curve in rows:
        returns = curve["episode_reward"].to_list()
        final, minutes = returns[-1], timing["wall_s"] / 60
        ok = final >= args.target_return and minutes <= args.target_minutes
        met += ok
        finals.append(final)
        mins, secs = divmod(round(timing["wall_s"]), 60)
        print(f"| {seed} | {mins} min {secs:02d} s | {timing['peak_rss_mb'] / 1024:.1f} GB | "
              + " | ".join(f"{r:.0f}" for r in returns) + f" | {'met' if ok else 'missed'} |")
    iqm, lo, hi = load_summarize().iqm_with_ci(pd.Series(finals).to_numpy(), args.reps)
    print(f"\nfinal return IQM {iqm:.0f} [95 % CI {lo:.0f}, {hi:.0f}] over {len(finals)} seeds; "
          f"target met on {met} of {len(finals)}")
    if failed:
        print(f"seeds {failed} failed; see their .log files", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
