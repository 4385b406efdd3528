#!/usr/bin/env python
"""The main job, timed and recorded: ``./themis_train.sh`` with no arguments, once per seed.

    python benchmarks/bench_main_job.py --record results/main_job.csv          # the learning
        # record of the default path: seeds 0-4, one after another, every core to each run
    python benchmarks/bench_main_job.py --jobs 2 --threads 1 --record results/main_job.csv
        # two runs at a time on a 2-core machine, one thread each (one run per core)
    python benchmarks/bench_main_job.py --at b981352 --jobs 2 --threads 1 \\
        --record results/main_job.csv   # an older commit side by side, with today's .venv
    python benchmarks/bench_main_job.py --table-only --record results/main_job.csv
    python benchmarks/bench_main_job.py --seeds 3 4 -- method=rune     # overrides after --

Each run is the launcher a user types, plus ``seed=<k>`` and ``hydra.run.dir=OUT/seed<k>``
(and ``torch_threads=T`` with ``--threads``, and the overrides after ``--``). ``--at COMMIT``
runs that commit's launcher from a git worktree (``runs/worktrees/``) with this checkout's
interpreter, as ``git bisect`` would, so a record can be set beside an older one on the same
machine. The wall clock (seconds) and the peak resident memory of the run's process tree go to
``OUT/seed<k>.json`` once the run exits with 0; a seed with that file is skipped, and a seed
stopped after a checkpoint continues from it (``resume=``; its wall clock adds up the parts),
so an interrupted benchmark goes on where it stopped.

``--record CSV`` keeps every finished run as one row (``results/main_job.csv``): env, query
budget, method, seed, final return, the eval curve, wall clock, peak memory, the date the run
finished, the commit that ran it, the machine, the command, and ``fixture`` — the digest of the
default path's fixed-seed fixture (``tests/fixtures/sac``) at that commit. A run finished again
for the same commit and command replaces its row. ``tests/test_main_job_record.py`` fails when
today's fixture has no five-seed record of the default command: re-recording the fixture (a
change that moves the default path's numbers) comes with a new learning record.

Printed last: one row per seed with its wall clock, peak memory, the true eval return at every
evaluation (``eval.csv``, mean of ``num_eval_episodes`` episodes with the mean action) and
whether it met the target (``--target-return`` within ``--target-minutes``), the IQM over
seeds with a 95 % bootstrap CI (``scripts/summarize.py``), and, with ``--record``, every
recorded group (commit and command) with its mean ± standard error.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # benchmarks/: records
import records  # isort: skip
import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path("tests") / "fixtures" / "sac"
"""The default path's fixed-seed fixture (SAC + PEBBLE's loop, relative to a checkout)."""
STATE = Path("checkpoints") / "state.pt"
"""A run's full checkpoint (``themis.run.checkpoint.STATE_FILE``): the run can be resumed."""
COLUMNS = ["env", "budget", "method", "seed", "final", "steps", "curve", "wall_clock_s",
           "peak_rss_gb", "recorded", "commit", "machine", "command", "fixture"]
"""The columns of ``--record``'s CSV."""


def load_summarize():
    """``scripts/summarize.py`` as a module (its IQM and bootstrap CI)."""
    spec = importlib.util.spec_from_file_location("summarize", ROOT / "scripts" / "summarize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fixture_digest(checkout: Path) -> str:
    """SHA-256 (first 16 hex digits) of the default path's fixture files in ``checkout``
    (names and bytes, in name order); ``"none"`` where the checkout has no such fixture."""
    folder = checkout / FIXTURE
    if not folder.is_dir():
        return "none"
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def git(*args: str, cwd: Path = ROOT) -> str:
    """``git ARGS`` in ``cwd``: its stripped output.

    Raises:
        subprocess.CalledProcessError: git failed (not a repository, an unknown commit).
    """
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def checkout_at(commit: str | None) -> Path:
    """The tree whose launcher runs: this checkout, or a detached git worktree of ``commit``
    under ``runs/worktrees/`` (made once, reused).

    Raises:
        SystemExit: ``commit`` is not a commit of this repository (one line, exit 2).
    """
    if commit is None:
        return ROOT
    try:
        sha = git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"bench_main_job: --at {commit}: not a commit of {ROOT}") from None
    tree = ROOT / "runs" / "worktrees" / sha[:12]
    if not (tree / "themis_train.sh").is_file():
        tree.parent.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--force", "--detach", str(tree), sha)
    return tree


def commit_of(checkout: Path) -> str:
    """The short commit of ``checkout``, with ``-dirty`` when tracked files under ``themis/``,
    ``config/`` or ``scripts/`` differ from it (what ran is then not that commit;
    :func:`records.commit`)."""
    return records.commit(checkout, ("themis", "config", "scripts"))


def machine(jobs: int, threads: int | None) -> str:
    """The CPU model and core count (:func:`records.machine`), and how the runs shared them,
    for a record's provenance."""
    share = f"{threads} thread{'s' if threads != 1 else ''} per run" if threads \
        else "the launcher's threads"
    return f"{records.machine()}, {share}, {jobs} run{'s' if jobs > 1 else ''} at once"


def run_seed(tree: Path, out: Path, seed: int, extra: list[str],
             threads: int | None) -> dict | None:
    """Run the launcher of ``tree`` for one seed, or continue it from its last checkpoint:
    its timing (``wall_s``, ``peak_rss_mb``, summed and maxed over the parts); None on failure.
    """
    run, part = out / f"seed{seed}", out / f"seed{seed}.part.json"
    done = json.loads(part.read_text()) if part.is_file() and (run / STATE).is_file() \
        else {"wall_s": 0.0, "peak_rss_mb": 0}
    if (run / STATE).is_file():
        args = [f"resume={run}"]
    else:
        args = [f"seed={seed}", *([f"torch_threads={threads}"] if threads else []), *extra,
                f"hydra.run.dir={run}"]
    env = dict(os.environ, THEMIS_PYTHON=sys.executable)
    if threads:
        env.update(THEMIS_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads))
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"seed{seed}.log").open("a") as log:
        start = time.perf_counter()
        proc = subprocess.Popen([str(tree / "themis_train.sh"), *args], cwd=tree, stdout=log,
                                stderr=subprocess.STDOUT, env=env)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            wall = time.perf_counter() - start
            if (run / STATE).is_file():  # a stopped run keeps the time it has spent
                part.write_text(json.dumps({"wall_s": done["wall_s"] + wall,
                                            "peak_rss_mb": done["peak_rss_mb"]}))
    if os.waitstatus_to_exitcode(status) != 0:
        return None
    timing = {"seed": seed, "wall_s": round(done["wall_s"] + wall, 1),
              "peak_rss_mb": max(done["peak_rss_mb"], round(usage.ru_maxrss / 1024)),  # kB
              "overrides": extra, "threads": threads}
    (out / f"seed{seed}.json").write_text(json.dumps(timing, indent=1))
    part.unlink(missing_ok=True)
    return timing


def record_rows(out: Path, seeds: list[int], commit: str, host: str, command: str,
                fixture: str) -> list[dict]:
    """One ``--record`` row per finished seed in ``out``."""
    rows = []
    for seed in seeds:
        stamp, run = out / f"seed{seed}.json", out / f"seed{seed}"
        if not stamp.is_file():
            continue
        timing = json.loads(stamp.read_text())
        curve = pd.read_csv(run / "eval.csv")
        cfg = yaml.safe_load((run / "config.yaml").read_text()) or {}
        methods = cfg.get("method") or []
        methods = [methods] if isinstance(methods, str) else list(methods)
        rows.append({
            "env": cfg.get("env", "?"), "budget": cfg.get("max_feedback", 0),
            "method": "+".join(["pebble", *methods]) if cfg.get("learn_reward", True)
            else "sac", "seed": seed,
            "final": round(float(curve["episode_reward"].iloc[-1])),
            "steps": int(curve["step"].iloc[-1]),
            "curve": " ".join(f"{s}:{r:.0f}" for s, r in zip(curve["step"],
                                                               curve["episode_reward"],
                                                               strict=True)),
            "wall_clock_s": round(timing["wall_s"]),
            "peak_rss_gb": round(timing["peak_rss_mb"] / 1024, 1),
            "recorded": datetime.date.fromtimestamp(stamp.stat().st_mtime).isoformat(),
            "commit": commit, "machine": host, "command": command, "fixture": fixture})
    return rows


def read_record(path: Path | None) -> pd.DataFrame:
    """The runs kept in ``--record``'s CSV (empty without one); older rows without a
    ``fixture`` column read as ``none``."""
    if path is None or not path.is_file():
        return pd.DataFrame(columns=COLUMNS)
    record = pd.read_csv(path, dtype={"commit": str, "fixture": str})
    for column in COLUMNS:
        if column not in record:
            record[column] = "none" if column == "fixture" else np.nan
    return record[COLUMNS]


def write_record(path: Path, record: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    """``record`` with ``rows`` merged in (a row of the same commit, command and seed replaced),
    written to ``path``; returns the merged table."""
    merged = pd.concat([record, pd.DataFrame(rows, columns=COLUMNS)], ignore_index=True)
    merged = merged.drop_duplicates(["commit", "command", "seed"], keep="last")
    path.parent.mkdir(parents=True, exist_ok=True)
    merged.to_csv(path, index=False)
    return merged


def default_record(record: pd.DataFrame, fixture: str) -> pd.DataFrame:
    """The rows of ``record`` that are the main job as a user runs it (no overrides after
    ``--``) with the default path's fixture digest ``fixture``: the newest such commit's rows
    (empty when there is none)."""
    plain = record[(record["fixture"].astype(str) == fixture)
                   & ~record["command"].map(lambda c: "--" in shlex.split(str(c)))]
    if plain.empty:
        return plain
    newest = plain.sort_values("recorded", kind="stable")["commit"].iloc[-1]
    return plain[plain["commit"] == newest]


def record_table(record: pd.DataFrame, reps: int) -> list[str]:
    """Markdown lines: one row per recorded group (commit and command), oldest first, with its
    seeds' finals, mean ± standard error, IQM and 95 % bootstrap CI, wall clock and machine."""
    iqm_with_ci = load_summarize().iqm_with_ci
    lines = ["| commit | recorded | command | seeds | finals | mean ± SE | IQM [95 % CI] | "
             "wall clock (mean) | machine |", "|---|---|---|---|---|---|---|---|---|"]
    groups = record.groupby(["commit", "command"], sort=False)
    for (commit, command), group in sorted(groups, key=lambda g: str(g[1]["recorded"].max())):
        finals = group.sort_values("seed")["final"].to_numpy(float)
        se = finals.std(ddof=1) / np.sqrt(len(finals)) if len(finals) > 1 else float("nan")
        iqm, lo, hi = iqm_with_ci(finals, reps)
        lines.append(
            f"| {commit} | {group['recorded'].max()} | `{command}` | "
            f"{' '.join(str(s) for s in sorted(group['seed']))} | "
            f"{' '.join(f'{f:.0f}' for f in finals)} | {finals.mean():.0f} ± {se:.0f} | "
            f"{iqm:.0f} [{lo:.0f}, {hi:.0f}] | {group['wall_clock_s'].mean() / 60:.1f} min | "
            f"{group['machine'].iloc[-1]} |")
    return lines


def recorded_command(args: argparse.Namespace) -> str:
    """The command that ran a record's group as a user types it: what it runs (``--at``, the
    overrides) and how (``--jobs``, ``--threads``), not which seeds or where the files go."""
    words = ["python", "benchmarks/bench_main_job.py"]
    if args.at:
        words += ["--at", *args.at]
    for flag, value in (("--jobs", args.jobs if args.jobs > 1 else None),
                        ("--threads", args.threads)):
        if value is not None:
            words += [flag, str(value)]
    return shlex.join(words + (["--", *args.extra] if args.extra else []))


def report(out: Path, seeds: list[int], extra: list[str], target_return: float,
           target_minutes: float, reps: int) -> None:
    """Print one tree's table: a row per finished seed and the IQM over them."""
    rows = [(seed, json.loads((out / f"seed{seed}.json").read_text()),
             pd.read_csv(out / f"seed{seed}" / "eval.csv"))
            for seed in seeds if (out / f"seed{seed}.json").is_file()]
    if not rows:
        return
    steps = [int(s) for s in rows[0][2]["step"]]
    print(f"\n{out}: true eval return; target ≥ {target_return:.0f} within "
          f"{target_minutes:.0f} min; overrides: {' '.join(extra) or 'none'}\n")
    print("| seed | wall clock | peak RSS | " + " | ".join(f"{s / 1000:g}k" for s in steps)
          + " | target |")
    print("|---" * (len(steps) + 4) + "|")
    finals, met = [], 0
    for seed, timing, curve in rows:
        returns = curve["episode_reward"].to_list()
        final, minutes = returns[-1], timing["wall_s"] / 60
        ok = final >= target_return and minutes <= target_minutes
        met += ok
        finals.append(final)
        mins, secs = divmod(round(timing["wall_s"]), 60)
        print(f"| {seed} | {mins} min {secs:02d} s | {timing['peak_rss_mb'] / 1024:.1f} GB | "
              + " | ".join(f"{r:.0f}" for r in returns) + f" | {'met' if ok else 'missed'} |")
    iqm, lo, hi = load_summarize().iqm_with_ci(pd.Series(finals).to_numpy(), reps)
    print(f"\nfinal return IQM {iqm:.0f} [95 % CI {lo:.0f}, {hi:.0f}] over {len(finals)} seeds; "
          f"target met on {met} of {len(finals)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, default=None,
                        help="run folders (default runs/bench_main_job, with --at "
                             "runs/bench_main_job_COMMIT for each commit)")
    parser.add_argument("--at", metavar="COMMIT", nargs="+", default=None,
                        help="run these commits' launchers (HEAD: the last commit), their "
                             "seeds interleaved so that the commits run side by side")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch_threads of each run (default: the launcher's own)")
    parser.add_argument("--record", type=Path, metavar="CSV", default=None)
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: table the record (needs --record)")
    parser.add_argument("--target-return", type=float, default=1500.0)
    parser.add_argument("--target-minutes", type=float, default=20.0)
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_intermixed_args(argv)  # overrides after -- reach "extra"
    if args.jobs < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--jobs and --threads take a positive number")
    if args.table_only:
        if args.record is None:
            parser.error("--table-only tables the runs of --record CSV")
        print("\n".join(record_table(read_record(args.record), args.reps)))
        return 0
    if args.at and args.out and len(args.at) > 1:
        parser.error("--out names one folder: leave it out with several --at commits")
    trees = [checkout_at(c) for c in args.at] if args.at else [ROOT]
    arms = [(tree, commit_of(tree)) for tree in trees]
    if args.at:  # the record names the commits, not HEAD or a branch that moves on
        args.at = [commit for _, commit in arms]
    outs = [args.out or ROOT / "runs" / ("bench_main_job" + (f"_{commit}" if args.at else ""))
            for _, commit in arms]
    todo = [(arm, seed) for seed in args.seeds for arm in range(len(arms))
            if not (outs[arm] / f"seed{seed}.json").is_file()]
    for (_, commit), out in zip(arms, outs, strict=True):
        done = sum((out / f"seed{s}.json").is_file() for s in args.seeds)
        print(f"commit {commit}: {len(args.seeds)} seeds, {done} already done; logs: "
              f"{out}/seed<k>.log", flush=True)
    failed = []

    def one(task: tuple[int, int]) -> dict | None:
        arm, seed = task
        return run_seed(arms[arm][0], outs[arm], seed, args.extra, args.threads)

    with ThreadPoolExecutor(args.jobs) as pool:  # the launcher's processes do the work
        for (arm, seed), timing in zip(todo, pool.map(one, todo), strict=True):
            print(f"commit {arms[arm][1]} seed {seed}: " + (
                f"{timing['wall_s'] / 60:.1f} min" if timing else "failed"), flush=True)
            if timing is None:
                failed.append(f"{arms[arm][1]}:{seed}")
    for out in outs:
        report(out, args.seeds, args.extra, args.target_return, args.target_minutes, args.reps)
    if not any((out / f"seed{s}.json").is_file() for out in outs for s in args.seeds):
        print("bench_main_job: no finished run", file=sys.stderr)
        return 1
    if args.record is not None:
        record, host = read_record(args.record), machine(args.jobs, args.threads)
        rows = [row for (tree, commit), out in zip(arms, outs, strict=True)
                for row in record_rows(out, args.seeds, commit, host, recorded_command(args),
                                       fixture_digest(tree))]
        merged = write_record(args.record, record, rows)
        print(f"\nrecorded in {args.record}:\n" + "\n".join(record_table(merged, args.reps)))
    if failed:
        print(f"runs {failed} failed; see their .log files", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
