#!/usr/bin/env python
"""Environment steps per second: Stable-Baselines3 SAC vs Themis SAC vs the full PEBBLE loop.

    python benchmarks/bench_throughput.py                        # every variant, 10000 steps each
    python benchmarks/bench_throughput.py --variants sb3:1,sac:auto:bf16 --steps 2000
    python benchmarks/bench_throughput.py --device cuda --variants sb3:1,sac:1:fp32,pebble:1:fp32

HalfCheetah-v5, equal networks (2×256), batch 256, one gradient update per step. A variant
``KIND:THREADS[:PRECISION]`` runs in its own process, one after the other (run this on an
otherwise idle machine):

(a) ``sb3``: Stable-Baselines3 SAC on the true reward (a dev dependency), with
    ``torch.set_num_threads(THREADS)``;
(b) ``sac``: Themis SAC on the true reward (``learn_reward=false``, no pretraining, no reset),
    with ``torch_threads=THREADS`` (``auto``: Themis's default) and ``precision=PRECISION``;
(c) ``pebble``: the full Themis PEBBLE loop at the main job's feedback schedule (unsupervised
    pretraining, queries, reward-model training and relabelling included): the run is as long as
    the main job (``num_train_steps`` 80000, so ``reward_batch=auto`` asks 100 queries a round
    every 5000 steps) and its first ``--steps`` steps after the warm-up are measured.

Each process takes ``--warmup`` random-action steps (not measured), then ``--steps`` measured
ones. The table gives every variant's steps/s; the comparison, last, takes each kind at its best
setting: b/a (target 2.0) and c/a (target 1.5).

``--repeats R`` runs the whole list of variants R times in rotation (a, b, c, a, b, c, ...) and
gives each variant's median and range: on a machine whose speed drifts (a shared cloud host:
±20 % within the hour was measured) every variant then sees the same conditions.

``--record [CSV]`` (default ``results/throughput.csv``) writes each measurement's row as soon as
its process ends: the invocation's start (``session``, UTC: the rows of one rotation share it),
the variant (kind, threads, precision, device), the rotation (``repeat``), the warm-up and
measured steps, steps/s, the threads used, and the date, commit, machine, command and wall time
of that process (``benchmarks/records.py``). ``python scripts/results_tables.py`` tables each
session's medians and ratios into ``docs/benchmarks/throughput.md`` and the README.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # benchmarks/: records
import records  # isort: skip
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

DEFAULT_VARIANTS = ("sb3:1,sb3:2,sac:1:fp32,sac:auto:fp32,sac:1:bf16,sac:auto:bf16,"
                    "pebble:auto:fp32,pebble:auto:bf16")
NEVER = 10**9
RECORD_KEY = ["session", "kind", "threads", "precision", "device", "repeat"]
"""A measurement's identity in ``--record``'s CSV."""


def measure(kind: str, threads: str, precision: str, warmup: int, steps: int, device: str,
            run_dir: str) -> dict[str, float]:
    """Steps/s of one variant in this process (``warmup`` steps first, not measured)."""
    import torch

    total = warmup + steps
    if kind == "sb3":
        import gymnasium as gym
        from stable_baselines3 import SAC

        torch.set_num_threads(int(threads))
        model = SAC("MlpPolicy", gym.make("HalfCheetah-v5"), learning_starts=warmup,
                    batch_size=256, buffer_size=total, train_freq=1, gradient_steps=1,
                    policy_kwargs={"net_arch": [256, 256]}, device=device, seed=0, verbose=0)
        model.learn(warmup)
        start = time.perf_counter()
        model.learn(steps, reset_num_timesteps=False)
        return {"steps_per_s": steps / (time.perf_counter() - start),
                "threads": torch.get_num_threads()}
    from themis.builder import make_workspace
    from themis.run.config import TrainConfig, compose

    # PEBBLE keeps the main job's schedule (num_train_steps and so reward_batch=auto: 100
    # queries a round, every 5000 steps): a run shortened to the measured window would put the
    # whole budget (1000 queries) into its one round, a schedule no run has
    length = max(total + 1, TrainConfig().num_train_steps) if kind == "pebble" else total + 1
    common = ["env=HalfCheetah-v5", f"device={device}", f"num_train_steps={length}",
              "sac.hidden_dim=256", "sac.batch_size=256", f"eval_frequency={NEVER}",
              f"log_frequency={NEVER}", f"checkpoint_frequency={NEVER}",
              f"torch_threads={threads}", f"precision={precision}", f"num_seed_steps={warmup}"]
    if kind == "sac":
        common += ["learn_reward=false", "num_unsup_steps=0", "reset_update=0"]
    ws = make_workspace(compose(common), Path(run_dir))
    ws.logger.stream = open(os.devnull, "w")  # lives as long as the process
    ws.run(until=warmup)
    start = time.perf_counter()
    ws.run(until=total)
    return {"steps_per_s": steps / (time.perf_counter() - start),
            "threads": ws.thread_choice.threads or torch.get_num_threads()}


def parse_variant(spec: str) -> tuple[str, str, str]:
    """``KIND:THREADS[:PRECISION]`` -> its parts; ``ValueError`` on anything else."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("sb3", "sac", "pebble") or not (
            parts[1] == "auto" or parts[1].isdigit()) or (
            len(parts) == 3 and parts[2] not in ("fp32", "bf16", "auto")) or (
            parts[0] == "sb3" and (parts[1] == "auto" or len(parts) == 3)):
        raise ValueError(f"bad variant {spec!r}: use sb3:N, sac:THREADS[:fp32|bf16|auto] or "
                         "pebble:THREADS[:fp32|bf16|auto] (THREADS a number or auto)")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else "fp32"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--steps", type=int, default=10_000,
                        help="measured steps per variant (PEBBLE: pretraining and two rounds)")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rotations of the whole list of variants (median and range)")
    parser.add_argument("--record", type=Path, nargs="?", metavar="CSV",
                        const=Path(__file__).resolve().parents[1] / "results" / "throughput.csv",
                        help="write each measurement's row (default results/throughput.csv)")
    args = parser.parse_args(argv)
    session, ran = records.utc_now(), records.command(__file__, argv)
    try:
        variants = [parse_variant(v) for v in args.variants.split(",")]
    except ValueError as e:
        print(f"bench_throughput: error: {e}", file=sys.stderr)
        return 2
    if args.steps < 1 or args.warmup < 1 or args.repeats < 1:
        print("bench_throughput: error: --steps, --warmup and --repeats must be positive",
              file=sys.stderr)
        return 2
    from themis.run.config import TrainConfig

    pretraining = TrainConfig().num_unsup_steps
    if any(k == "pebble" for k, _, _ in variants) and args.steps <= pretraining:
        print(f"bench_throughput: error: --steps ({args.steps}) must exceed PEBBLE's "
              f"pretraining ({pretraining} steps) so that feedback rounds are measured",
              file=sys.stderr)
        return 2
    runs: dict[int, list[dict[str, float]]] = {i: [] for i in range(len(variants))}
    with TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for i, (kind, threads, precision) in enumerate(variants):
                start = time.time()
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", kind, threads, precision,
                     str(args.warmup), str(args.steps), args.device,
                     str(Path(tmp) / f"{i}-{rep}")],
                    capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
                if proc.returncode != 0:
                    print(proc.stderr[-2000:], file=sys.stderr)
                    print(f"bench_throughput: error: variant {kind}:{threads}:{precision} failed",
                          file=sys.stderr)
                    return 1
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                runs[i].append(result)
                if args.record is not None:
                    records.merge_rows(args.record, [{
                        "session": session, "kind": kind, "threads": threads,
                        "precision": precision if kind != "sb3" else "fp32",
                        "device": args.device, "repeat": rep, "warmup": args.warmup,
                        "steps": args.steps, "steps_per_s": round(result["steps_per_s"], 2),
                        "threads_used": int(result["threads"]),
                        **records.provenance(time.time() - start, ran)}], RECORD_KEY)
                print(f"{kind}:{threads}:{precision}: {result['steps_per_s']:.1f} steps/s "
                      f"({int(result['threads'])} threads)", flush=True)
    rows = []
    for i, (kind, threads, precision) in enumerate(variants):
        rates = sorted(r["steps_per_s"] for r in runs[i])
        rows.append((kind, threads, precision, {
            "steps_per_s": float(statistics.median(rates)), "low": rates[0], "high": rates[-1],
            "threads": runs[i][-1]["threads"]}))
    import torch

    print(f"\nHalfCheetah-v5, {args.steps} measured steps after {args.warmup} warm-up, 2×256 "
          f"networks, batch 256, device {args.device}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
          f"{time.strftime('%Y-%m-%d')}; each variant in its own process, one after the other"
          + (f", {args.repeats} rotations: medians (range)" if args.repeats > 1 else "") + "\n")
    names = {"sb3": "(a) SB3 SAC, true reward", "sac": "(b) Themis SAC, true reward",
             "pebble": "(c) Themis PEBBLE, oracle"}
    best = {}
    for kind, threads, precision, result in rows:
        if result["steps_per_s"] > best.get(kind, (0.0, ""))[0]:
            best[kind] = (result["steps_per_s"], f"{threads} threads, {precision}"
                          if kind != "sb3" else f"{threads} threads")
    a = best.get("sb3", (float("nan"), ""))[0]
    print("| method | torch threads | precision | threads used | steps/s | "
          "ratio to (a) at its best |")
    print("|---|---|---|---|---|---|")
    for kind, threads, precision, result in rows:
        r = result["steps_per_s"]
        spread = f" ({result['low']:.1f}–{result['high']:.1f})" if args.repeats > 1 else ""
        print(f"| {names[kind]} | {threads} | {precision if kind != 'sb3' else 'fp32'} | "
              f"{int(result['threads'])} | {r:.1f}{spread} | {r / a:.2f} |")
    for kind, target in (("sac", 2.0), ("pebble", 1.5)):
        if kind in best and "sb3" in best:
            print(f"\n{names[kind]} at its best ({best[kind][1]}) / {names['sb3']} at its best "
                  f"({best['sb3'][1]}) = {best[kind][0] / a:.2f} (target {target})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 9 and sys.argv[1] == "--worker":
        result = measure(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]),
                         int(sys.argv[6]), sys.argv[7], sys.argv[8])
        print(json.dumps(result), flush=True)
        sys.exit(0)
    sys.exit(main())
