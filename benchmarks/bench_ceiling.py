#!/usr/bin/env python
"""The ceiling, side by side: Themis's plain SAC against Stable-Baselines3's SAC on the true reward.

    python benchmarks/bench_ceiling.py --steps 50000 --seeds 0 1
    python benchmarks/bench_ceiling.py --env Hopper-v5 --steps 100000 --seeds 0 1 2 --jobs 2
    python benchmarks/bench_ceiling.py --jobs 9 --sb3-devices cpu cuda --sb3-threads 3 --out DIR

Both with 2×256 networks, batch 256, learning rate 3e-4, one update per step, 1000 random
steps first (SB3's ``learning_starts=1000``; Themis's ``num_seed_steps=1000``), automatic
temperature; Themis without pretraining or critic reset (``learn_reward=false
num_unsup_steps=0 reset_update=0``) and with its defaults otherwise (``precision=auto``). Each run
in its own process with one thread, ``--jobs`` at a time. Every 10k steps both evaluate 5
episodes with the mean (deterministic) action. Prints the mean true return per evaluation step
and per seed, as a Markdown table, last.

``--sb3-devices cpu cuda`` runs SB3 on each device given (the same algorithm: the device changes
its speed, not what it learns; one row per device), ``--sb3-threads`` its PyTorch threads on the
CPU. With ``--out DIR`` every run writes its returns to ``DIR/<kind><seed>.json`` after each
evaluation, so a run cut short still leaves its curve, and the table is built from those files
(``--table-only`` tables them without running). Run again with the same ``--out``, the
command goes on where it stopped (a session's end stops its processes): a run that finished all
its steps is not run again, a Themis run is resumed from its checkpoint, an SB3 run (no
checkpoint) starts again.

``--record [CSV]`` (default ``results/ceiling.csv``) writes each run's row as soon as it finishes
all its steps: kind (``sb3_cpu``, ``sb3_cuda``, ``themis``), env, steps, seed, the final return,
the curve (``step:return ...``), SB3's version, and the run's date, commit, machine, command and
wall time (``benchmarks/records.py``); a run recorded again replaces its row.
``python scripts/results_tables.py`` tables the record into ``docs/results/ceiling.md`` and the
README.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # benchmarks/: records
import records  # isort: skip
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD_KEY = ["kind", "env", "steps", "seed"]
"""A recorded run's identity in ``--record``'s CSV: a run of the same key recorded again
replaces its row."""


def sb3_run(env_id: str, steps: int, seed: int, device: str = "cpu", threads: int = 1,
            record: Path | None = None) -> dict[int, float]:
    """SB3 SAC: mean true return of 5 deterministic episodes every 10k steps (written to
    ``record`` as JSON after each, when given)."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(threads)
    model = SAC("MlpPolicy", gym.make(env_id), learning_starts=1000, batch_size=256,
                policy_kwargs={"net_arch": [256, 256]}, seed=seed, verbose=0, device=device)
    eval_env = gym.make(env_id)
    eval_env.reset(seed=seed + 10_000)
    returns: dict[int, float] = {}

    class Every10k(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % 10_000 == 0:
                mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=5, deterministic=True)
                returns[self.num_timesteps] = float(np.mean(mean))
                if record is not None:
                    record.write_text(json.dumps(returns))
            return True

    model.learn(steps, callback=Every10k())
    return returns


def themis_run(env_id: str, steps: int, seed: int, out: Path) -> dict[int, float]:
    """Themis plain SAC through the launcher: ``eval.csv``'s returns. A run folder ``out``
    with a checkpoint (a run stopped with its session) is resumed, not started again."""
    import pandas as pd

    where = f"resume={out}" if (out / "checkpoints").is_dir() else f"hydra.run.dir={out}"
    cmd = [str(ROOT / "themis_train.sh"), f"env={env_id}", "learn_reward=false",
           "num_unsup_steps=0", "reset_update=0", "sac.hidden_dim=256", "sac.batch_size=256",
           "num_seed_steps=1000", f"num_train_steps={steps}", "eval_frequency=10000",
           "num_eval_episodes=5", "torch_threads=1", f"seed={seed}", where]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench_ceiling: Themis run failed: {proc.stderr[-500:]}")
    evals = pd.read_csv(out / "eval.csv")
    return dict(zip(evals["step"].astype(int), evals["episode_reward"].astype(float),
                    strict=True))


def themis_progress(out: Path) -> dict[int, float]:
    """The evaluations a Themis run has written so far (``eval.csv``)."""
    import pandas as pd

    try:
        evals = pd.read_csv(out / "eval.csv")
    except (OSError, ValueError):
        return {}
    return dict(zip(evals["step"].astype(int), evals["episode_reward"].astype(float),
                    strict=True))


def record_row(kind: str, env_id: str, steps: int, seed: int, curve: dict[int, float],
               wall_s: float, ran: str) -> dict | None:
    """The ``--record`` row of one finished run (``None`` when its curve stops before
    ``steps``: a run cut short is not a result)."""
    if not curve or max(curve) < steps:
        return None
    version = "-"
    if kind.startswith("sb3"):
        from importlib.metadata import version as installed

        version = f"stable-baselines3 {installed('stable_baselines3')}"
    return {"kind": kind, "env": env_id, "steps": steps, "seed": seed,
            "final": round(curve[max(curve)], 1), "curve": records.curve_text(curve, 0),
            "library": version, **records.provenance(wall_s, ran)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--sb3-devices", nargs="+", default=["cpu"], choices=["cpu", "cuda"])
    parser.add_argument("--sb3-threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="where each run's returns are written")
    parser.add_argument("--table-only", action="store_true", help="with --out: table only")
    parser.add_argument("--record", type=Path, nargs="?", metavar="CSV",
                        const=ROOT / "results" / "ceiling.csv",
                        help="write each finished run's row (default results/ceiling.csv)")
    args = parser.parse_args(argv)
    ran = records.command(__file__, argv)
    if args.steps < 10_000 or args.jobs < 1 or min(args.seeds) < 0 or args.sb3_threads < 1:
        parser.error("--steps must be >= 10000 (one evaluation), --jobs >= 1, seeds >= 0, "
                     "--sb3-threads >= 1")
    if args.table_only and args.out is None:
        parser.error("--table-only needs --out")
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="bench_ceiling_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    kinds = [f"sb3_{d}" for d in args.sb3_devices] + ["themis"]
    jobs = [(kind, seed) for seed in args.seeds for kind in kinds]
    writing = threading.Lock()  # runs finish in the pool's threads; one writes at a time

    def progress(kind: str, seed: int) -> dict[int, float]:
        if kind == "themis":
            return themis_progress(out_dir / f"{kind}{seed}")
        record = out_dir / f"{kind}{seed}.json"
        return {int(k): v for k, v in json.loads(record.read_text()).items()} \
            if record.is_file() else {}

    def run(job: tuple[str, int]) -> None:
        kind, seed = job
        done = progress(kind, seed)
        if args.out is not None and done and max(done) >= args.steps:
            print(f"{kind} seed {seed}: finished in {out_dir} already (recorded when it "
                  "finished); not run again", flush=True)
            return
        start = time.time()
        out = subprocess.run([sys.executable, __file__, "--worker", kind, args.env,
                              str(args.steps), str(seed), str(out_dir / f"{kind}{seed}"),
                              str(args.sb3_threads)],
                             capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(
                                 args.sb3_threads if kind.startswith("sb3") else 1)})
        if out.returncode != 0:
            print(f"bench_ceiling: {kind} seed {seed} failed: {out.stderr[-800:]}",
                  file=sys.stderr, flush=True)
            return
        print(f"{kind} seed {seed}: {out.stdout.strip().splitlines()[-1]}", flush=True)
        if args.record is not None:
            curve = {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
            wall = time.time() - start
            clock = out_dir / f"{kind}{seed}" / "run_time.json"  # a resumed Themis run: all
            if kind == "themis" and clock.is_file():  # its segments (themis/run/run_time.py)
                wall = float(json.loads(clock.read_text())["wall_s"])
            row = record_row(kind, args.env, args.steps, seed, curve, wall, ran)
            if row is not None:
                with writing:
                    records.merge_rows(args.record, [row], RECORD_KEY)

    if not args.table_only:
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(run, jobs))
    results = [(kind, seed, progress(kind, seed)) for kind, seed in jobs]
    print(f"\n{args.env}, {args.steps} steps, 2×256, batch 256, seeds "
          f"{' '.join(map(str, args.seeds))}: true return (mean of 5 episodes, mean action)\n")
    steps = sorted({s for _, _, r in results for s in r})
    print("| method | seed | " + " | ".join(f"{s // 1000}k" for s in steps) + " |")
    print("|---|---|" + "---|" * len(steps))
    names = {"sb3_cpu": "SB3 SAC", "sb3_cuda": "SB3 SAC (CUDA)", "themis": "Themis SAC"}
    for kind, seed, r in sorted(results):
        print(f"| {names[kind]} | {seed} | " + " | ".join(
            f"{r[s]:.0f}" if s in r else "-" for s in steps) + " |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "--worker":
        kind, env_id, steps, seed, out, threads = sys.argv[2:]
        result = sb3_run(env_id, int(steps), int(seed), kind.removeprefix("sb3_"),
                         int(threads), Path(out + ".json")) if kind.startswith("sb3") else \
            themis_run(env_id, int(steps), int(seed), Path(out))
        print(json.dumps(result), flush=True)
        sys.exit(0)
    sys.exit(main())
