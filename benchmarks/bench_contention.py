#!/usr/bin/env python
"""Steps per second when runs share the machine: two default runs at once against one alone.

    python benchmarks/bench_contention.py                      # main job, first 8000 steps
    python benchmarks/bench_contention.py --before ../themis-old   # and the code of a worktree
    python benchmarks/bench_contention.py --steps 80000 --before ../themis-old   # whole main job
    python benchmarks/bench_contention.py --workload ppo-pixels --rows 1:1,2:auto,1:2

Each row ``K:THREADS`` starts ``K`` runs of the workload at once, each in its own process with
``torch_threads=THREADS`` (``auto``: Themis's default; ``0``: PyTorch's, all cores). The runs
of a row build their workspaces first and then all take the same ``--steps`` (evaluation,
logging and checkpoints off) and report their steps/s and wall-clock. Rows run one after the
other; with ``--before DIR`` each row runs for the code in ``DIR`` (a worktree of an earlier
commit, with this script) right after this checkout's, so the host's drift hits both alike.

The table gives each run's steps/s and its share of one ``torch_threads=1`` run alone of the
same code (the first row), and the check of the thread default: two default runs at once each
keep at least 90 % of a one-thread run alone. The wall-clock column of the ``1:auto`` row with
``--steps 80000`` is the main job's training time (before and after, side by side).
Environment variables (e.g. ``MALLOC_TRIM_THRESHOLD_``) reach every run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

WORKLOADS = {
    # the main job (config/train_themis.yaml defaults: HalfCheetah-v5, PEBBLE, oracle)
    "main": [],
    # PPO on pixels: Breakout's 84×84 frame stacks through the CNN encoder (PrefPPO)
    "ppo-pixels": ["domain=ALE", "env=ALE/Breakout-v5", "num_seed_steps=0", "num_unsup_steps=2048",
                   "num_interact=2048", "max_feedback=200", "reward_batch=20", "reward_update=5"],
}
DEFAULT_ROWS = "1:1,2:auto,1:auto"
KEEP = 0.9
"""Two default runs at once each keep at least this share of one one-thread run alone."""


def worker(workload: str, threads: str, steps: str, run_dir: str, extra: list[str]) -> None:
    """One run: build the workspace, wait for ``go`` on stdin, take ``steps`` steps, print
    ``{"steps_per_s": x, "wall_s": s, "threads": n}``."""
    import torch

    from themis.builder import make_workspace
    from themis.run.config import compose

    overrides = [*WORKLOADS[workload], *extra, f"torch_threads={threads}",
                 "eval_frequency=1000000000", "log_frequency=1000000000",
                 "checkpoint_frequency=1000000000", "seed=0"]
    ws = make_workspace(compose(overrides), Path(run_dir))
    ws.logger.stream = open(os.devnull, "w")  # lives as long as the process
    # PPO's loop evaluates and checkpoints at the end of each run(until=...) call; not measured
    ws.evaluate = lambda: 0.0  # type: ignore[method-assign]
    ws.save_checkpoints = lambda: None  # type: ignore[method-assign]
    print("ready", flush=True)  # the runs of a row start stepping together
    sys.stdin.readline()
    start, first = time.perf_counter(), ws.step
    ws.run(until=first + int(steps))
    elapsed = time.perf_counter() - start
    print(json.dumps({"steps_per_s": (ws.step - first) / elapsed, "wall_s": elapsed,
                      "threads": torch.get_num_threads()}), flush=True)


def script_of(code: Path) -> Path:
    """This benchmark in the checkout ``code``: ``benchmarks/`` (``scripts/`` before the move)."""
    moved = code / "benchmarks" / "bench_contention.py"
    return moved if moved.is_file() else code / "scripts" / "bench_contention.py"


def run_row(code: Path, workload: str, k: int, threads: str, steps: int, tmp: Path,
            extra: list[str]) -> list[dict[str, float]]:
    """Start ``k`` workers of the checkout ``code`` at once and collect their reports."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(code)}
    env.pop("THEMIS_THREADS", None)
    procs = [subprocess.Popen(
        [sys.executable, str(script_of(code)), "--worker", workload,
         threads, str(steps), str(tmp / f"{code.name}_{k}_{threads}_{i}_{time.time_ns()}"),
         *extra],
        env=env, cwd=code, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for i in range(k)]
    for p in procs:  # each built its workspace ...
        assert p.stdout is not None
        while (line := p.stdout.readline()) and line.strip() != "ready":
            pass
        if not line:
            raise SystemExit(f"bench_contention: a worker of {code} failed before it was ready")
    for p in procs:  # ... then all step at once
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"bench_contention: a worker of {code} failed "
                             f"(exit {p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def parse_rows(text: str) -> list[tuple[int, str]]:
    """``"1:1,2:auto"`` -> ``[(1, "1"), (2, "auto")]``.

    Raises:
        ValueError: a row that is not ``K:THREADS``.
    """
    rows = []
    for spec in text.split(","):
        k, _, threads = spec.partition(":")
        if not k.isdigit() or int(k) < 1 or not (threads == "auto" or threads.isdigit()):
            raise ValueError(f"bad row {spec!r} (K:THREADS, THREADS auto or a count)")
        rows.append((int(k), threads))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="main")
    parser.add_argument("--rows", default=DEFAULT_ROWS,
                        help=f"comma-separated K:THREADS (default {DEFAULT_ROWS}); the first "
                        "row is the reference and should be 1:1")
    parser.add_argument("--steps", type=int, default=8000,
                        help="steps each run takes (default 8000: pretraining and the first "
                        "feedback round of the main job; 80000: the whole main job)")
    parser.add_argument("--before", type=Path, default=None,
                        help="a checkout of earlier code (its benchmarks/bench_contention.py runs "
                        "its workers): every row runs for it too")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for every run, "
                        "e.g. sac.hidden_dim=256 sac.batch_size=256")
    args = parser.parse_args(argv)
    try:
        rows = parse_rows(args.rows)
    except ValueError as e:
        print(f"bench_contention: error: {e}", file=sys.stderr)
        return 2
    if args.steps < 1:
        print("bench_contention: error: --steps must be >= 1", file=sys.stderr)
        return 2
    here = Path(__file__).resolve().parents[1]
    codes = [("this checkout", here)]
    if args.before is not None:
        before = args.before.resolve()
        if not script_of(before).is_file():
            print(f"bench_contention: error: --before {before}: no benchmarks/bench_contention.py "
                  "(or scripts/, in older checkouts) there (a Themis checkout)", file=sys.stderr)
            return 2
        codes.append((f"before ({before.name})", before))
    results: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    with TemporaryDirectory() as tmp:
        for k, threads in rows:
            for name, code in codes:
                rates = run_row(code, args.workload, k, threads, args.steps, Path(tmp),
                                args.overrides)
                results[name, k, threads] = rates
                print(f"{name}: {k} run(s), torch_threads={threads}: "
                      + ", ".join(f"{r['steps_per_s']:.0f} steps/s" for r in rates), flush=True)
    print(f"\n{' '.join([args.workload, *args.overrides])}: the first {args.steps} steps of each "
          f"run, {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
          f"{time.strftime('%Y-%m-%d %H:%M')}\n")
    print("| code | runs at once | torch_threads | threads | steps/s each | each / one 1-thread "
          "run alone | wall-clock each (s) |")
    print("|---|---|---|---|---|---|---|")
    verdict = ""
    for name, _ in codes:
        reference = results.get((name, 1, "1"))
        alone = reference[0]["steps_per_s"] if reference else None
        for k, threads in rows:
            rates = results[name, k, threads]
            shares = [r["steps_per_s"] / alone for r in rates] if alone else []
            print(f"| {name} | {k} | {threads} | {int(rates[0]['threads'])} | "
                  + " / ".join(f"{r['steps_per_s']:.0f}" for r in rates) + " | "
                  + (" / ".join(f"{s:.0%}" for s in shares) or "—") + " | "
                  + " / ".join(f"{r['wall_s']:.0f}" for r in rates) + " |")
            if name == codes[0][0] and (k, threads) == (2, "auto") and shares:
                verdict = "meets" if min(shares) >= KEEP else "misses"
                verdict = (f"\ntwo default runs at once each keep {min(shares):.0%} or more of "
                           f"one 1-thread run alone: {verdict} the {KEEP:.0%} target")
    if verdict:
        print(verdict)
    return 1 if "misses" in verdict else 0


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
        sys.exit(0)
    sys.exit(main())
