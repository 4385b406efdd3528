#!/usr/bin/env python
"""Steps per second when runs share the machine: the thread-default benchmark.

    python scripts/bench_contention.py                         # main job, the standard table
    python scripts/bench_contention.py --workload ppo-pixels   # PPO on a pixel env
    python scripts/bench_contention.py --rows 1:auto,2:auto,4:auto --seconds 60

Each row ``K:THREADS[:POLICY]`` starts ``K`` runs of the workload at once, each in its own
process with ``torch_threads=THREADS`` (``0``: PyTorch's default, all cores, what runs had
before; ``auto``: Themis's default, :mod:`themis.run.threads`) and the OpenMP wait policy
``POLICY``: ``default`` (libgomp's, unset; what Themis runs with), ``active``, ``passive``
(``OMP_WAIT_POLICY``) or ``spin=N`` (``GOMP_SPINCOUNT``). Every run steps for ``--seconds``
seconds after its workspace is built (the main job's first seconds: random seed steps,
state-entropy pretraining, the first feedback round) and reports its steps/s. Rows run one
after the other. The table, last, gives each run's steps/s, their sum, and the sum relative to
one ``torch_threads=1`` run alone (the first row's reference, measured too). ``--steps N``
gives every run the same work instead, its first ``N`` steps: rows of many runs then compare
the same phases of the main job as rows of few (in a fixed time four runs on two cores stop in
pretraining where two get past the first feedback round). The runs of a row build their
workspaces first and then start stepping together.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import threading
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
DEFAULT_ROWS = "1:1,1:0,2:0,2:1,4:0,1:auto,2:auto,4:auto"


def worker(workload: str, threads: str, limit: str, run_dir: str, extra: list[str]) -> None:
    """One run: build the workspace, step it for ``limit`` (``40s``: seconds; ``8000``: steps),
    print ``{"steps_per_s": x}``."""
    from themis.cli.train import make_workspace
    from themis.run.config import compose

    overrides = [*WORKLOADS[workload], *extra, f"torch_threads={threads}",
                 "eval_frequency=1000000000", "log_frequency=1000000000",
                 "checkpoint_frequency=1000000000", "seed=0"]
    ws = make_workspace(compose(overrides), Path(run_dir))
    ws.logger.stream = open(os.devnull, "w")  # lives as long as the process
    # PPO's loop evaluates and checkpoints at the end of each run(until=...) call; not measured
    ws.evaluate = lambda: 0.0  # type: ignore[method-assign]
    ws.save_checkpoints = lambda: None  # type: ignore[method-assign]
    import torch

    # every run of a row starts stepping together, once all have built their workspaces (a
    # run still importing would otherwise take CPU from the measured steps of the others)
    print("ready", flush=True)
    sys.stdin.readline()

    # where the CPU went: every 0.25 s the step and the process's CPU time; CPU spent while the
    # step count stood still is the rounds' (and relabelling's, PPO's updates')
    trace: list[tuple[int, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            trace.append((ws.step, time.process_time()))

    threading.Thread(target=sample, daemon=True).start()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start, chunk = time.perf_counter(), 100 if ws.cfg.agent != "ppo" and not ws.discrete else 1024
    first = ws.step
    if limit.endswith("s"):
        seconds = float(limit[:-1])
        while time.perf_counter() - start < seconds:
            ws.run(until=ws.step + chunk)
    else:
        ws.run(until=first + int(limit))
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    done.set()
    still = sum(c1 - c0 for (s0, c0), (s1, c1) in itertools.pairwise(trace)
                if s1 == s0)
    governor, turns = ws.thread_governor, ws.core_turns
    print(json.dumps({"steps_per_s": (ws.step - first) / elapsed, "wall_s": elapsed,
                      "cpu_s": after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime,
                      "involuntary": after.ru_nivcsw - usage.ru_nivcsw,
                      "page_faults": after.ru_minflt - usage.ru_minflt,
                      "still_cpu_s": still,
                      "waited_s": turns.waited if turns is not None else 0.0,
                      "handovers": turns.handovers if turns is not None else 0,
                      "threads": ws.thread_choice.threads or torch.get_num_threads(),
                      "switches": governor.switches if governor is not None else 0}), flush=True)


def run_row(workload: str, k: int, threads: str, policy: str, limit: str,
            tmp: Path, extra: list[str]) -> list[dict[str, float]]:
    """Start ``k`` workers at once and collect their reports."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for key in ("THEMIS_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        env.pop(key, None)
    if policy.startswith("spin="):
        env["GOMP_SPINCOUNT"] = policy.removeprefix("spin=")
    elif policy != "default":
        env["OMP_WAIT_POLICY"] = policy.upper()
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", workload, threads, limit,
         str(tmp / f"{k}_{threads}_{policy}_{i}"), *extra],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for i in range(k)]
    for p in procs:  # each built its workspace ...
        assert p.stdout is not None
        while (line := p.stdout.readline()) and line.strip() != "ready":
            pass
        if not line:
            raise SystemExit("bench_contention: a worker failed before it was ready")
    for p in procs:  # ... then all step at once
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"bench_contention: a worker failed (exit {p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="main")
    parser.add_argument("--rows", default=DEFAULT_ROWS,
                        help=f"comma-separated K:THREADS[:POLICY] (default {DEFAULT_ROWS})")
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--steps", type=int, default=0,
                        help="each run takes this many steps instead (the same work in every "
                        "row; steps/s = steps / the run's own time)")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for every run, "
                        "e.g. sac.hidden_dim=256 sac.batch_size=256")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.rows.split(","):
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[0].isdigit() or int(parts[0]) < 1 or (
                len(parts) == 3 and parts[2] not in ("active", "passive", "default")
                and not (parts[2].startswith("spin=") and parts[2][5:].isdigit())):
            print(f"bench_contention: error: bad row {spec!r} "
                  "(K:THREADS[:default|active|passive|spin=N])", file=sys.stderr)
            return 2
        rows.append((int(parts[0]), parts[1], parts[2] if len(parts) == 3 else "default"))
    if args.steps < 0 or args.seconds <= 0:
        print("bench_contention: error: --steps must be >= 0 and --seconds > 0", file=sys.stderr)
        return 2
    limit = str(args.steps) if args.steps else f"{args.seconds}s"
    window = f"first {args.steps} steps" if args.steps else f"first {args.seconds:.0f} s"
    results = []
    with TemporaryDirectory() as tmp:
        for k, threads, policy in rows:
            rates = run_row(args.workload, k, threads, policy, limit, Path(tmp),
                            args.overrides)
            results.append((k, threads, policy, rates))
            print(f"{k} run(s), torch_threads={threads}, {policy}: "
                  + ", ".join(f"{r['steps_per_s']:.0f}" for r in rates), flush=True)
            if "cpu_s" in rates[0]:  # where the time went: CPU per step, waits, switches
                cpu = sum(r["cpu_s"] for r in rates)
                print(f"  CPU {cpu:.1f} s over {max(r['wall_s'] for r in rates):.1f} s "
                      f"(busy {cpu / max(r['wall_s'] for r in rates) / (os.cpu_count() or 1):.0%}"
                      f" of the cores), waited "
                      + " / ".join(f"{r['waited_s']:.1f}" for r in rates) + " s, handovers "
                      + " / ".join(str(r["handovers"]) for r in rates) + ", involuntary switches "
                      + " / ".join(str(r["involuntary"]) for r in rates) + ", page faults "
                      + " / ".join(str(r.get("page_faults", 0)) for r in rates), flush=True)
                stepping = [1000 * (r["cpu_s"] - r["still_cpu_s"])
                            / (r["steps_per_s"] * r["wall_s"]) for r in rates]
                print("  CPU per step while stepping "
                      + " / ".join(f"{ms:.2f}" for ms in stepping)
                      + " ms; CPU while the step count stood still (rounds, relabelling, PPO's "
                      "updates) " + " / ".join(f"{r['still_cpu_s']:.1f}" for r in rates) + " s",
                      flush=True)
    reference = next((sum(r["steps_per_s"] for r in rates) for k, t, p, rates in results
                      if k == 1 and t == "1"), None)
    print(f"\n{' '.join([args.workload, *args.overrides])}: steps/s over each run's {window}, "
          f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
          f"{time.strftime('%Y-%m-%d')}\n")
    print("| runs at once | torch_threads | OpenMP wait | threads at start | thread switches | "
          "steps/s each | together | together / one 1-thread run |")
    print("|---|---|---|---|---|---|---|---|")
    for k, threads, policy, rates in results:
        total = sum(r["steps_per_s"] for r in rates)
        ratio = f"{total / reference:.2f}" if reference else "—"
        each = " / ".join(f"{r['steps_per_s']:.0f}" for r in rates)
        switches = " / ".join(str(int(r.get("switches", 0))) for r in rates)
        print(f"| {k} | {threads} | {policy} | {int(rates[0]['threads'])} | {switches} | {each} | "
              f"{total:.0f} | {ratio} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
        sys.exit(0)
    sys.exit(main())
