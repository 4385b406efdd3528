#!/usr/bin/env python
"""Proof that any library learns from preferences through the wrapper: SB3 beside Themis.

    python benchmarks/bench_wrapper_sb3.py --out bench_wrapper --jobs 2          # everything
    python benchmarks/bench_wrapper_sb3.py --out bench_wrapper --only sac,pebble # HalfCheetah only
    python benchmarks/bench_wrapper_sb3.py --out bench_wrapper --table           # print the table

Jobs (each one process, ``--jobs`` at once, seeds ``--seeds``; resumable: a finished job's
result is kept in ``OUT/results.jsonl`` and not run again):

- ``sac``: Stable-Baselines3 SAC (its defaults: 2×256, batch 256, lr 3e-4, 100 random steps)
  on HalfCheetah-v5 through :class:`themis.PreferenceLearningWrapper`, oracle teacher,
  ``--sac-steps`` steps (100k), ``--queries`` queries (500) in 10 rounds of 50 (segment 50),
  the first after 6000 steps, then every 5000 (Themis's PEBBLE schedule: the first round at
  ``num_seed_steps + num_unsup_steps``);
- ``sac-relabel``: the same, with :class:`themis.online.RelabelCallback` (SB3's replay buffer
  relabelled with each new r̂ version, as PEBBLE relabels its own);
- ``sac-true``: the same SB3 SAC on HalfCheetah-v5's true reward, no wrapper (the ceiling for
  the two above at the same steps);
- ``pebble``: Themis's own PEBBLE (``./themis_train.sh``) at the same budget: the same steps,
  queries, rounds and teacher (its defaults otherwise: SAC 2×128, unsupervised pretraining);
- ``ppo``: SB3 PPO (its defaults) with ``SubprocVecEnv(8)`` on LunarLander-v3 through
  :class:`themis.online.sb3.PreferenceLearningVecEnv`, oracle teacher, ``--ppo-steps`` steps
  (500k), ``--ppo-queries`` queries (1000) in 10 rounds, every 40k steps from 10k;
- ``ppo-true``: the same PPO on the true reward (no wrapper), the same steps.

Final true return: the mean of 10 evaluation episodes of the final policy (deterministic
actions; Themis: its last ``eval.csv`` row, 10 episodes) on the env's own reward. The table
gives each job's mean ± std over seeds, and the wall-clock time.

``--record [CSV]`` (default ``results/wrapper.csv``) writes each job's row as soon as it
finishes: job, seed, steps, queries, the final true return and the job's date, commit, machine,
command and wall time (``benchmarks/records.py``); a job recorded again replaces its row.
``python scripts/results_tables.py`` tables the record (each wrapped run beside its ceiling,
``sac-true``, on the same seeds) into ``docs/results/wrapper.md`` and the README.
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
RECORD_KEY = ["job", "seed", "steps", "queries"]
"""A recorded job's identity in ``--record``'s CSV."""
JOBS = ("sac", "sac-relabel", "sac-true", "pebble", "ppo", "ppo-true")
TITLES = {
    "sac": "SB3 SAC through PreferenceLearningWrapper (HalfCheetah-v5, oracle)",
    "sac-relabel": "SB3 SAC through PreferenceLearningWrapper + RelabelCallback (HalfCheetah-v5, "
                   "oracle)",
    "sac-true": "SB3 SAC on the true reward, no wrapper (HalfCheetah-v5, the ceiling)",
    "pebble": "Themis PEBBLE, ./themis_train.sh (HalfCheetah-v5, oracle)",
    "ppo": "SB3 PPO, SubprocVecEnv(8) through PreferenceLearningVecEnv (LunarLander-v3, oracle)",
    "ppo-true": "SB3 PPO, SubprocVecEnv(8), true reward (LunarLander-v3)",
}


def evaluate(model: object, env_id: str, seed: int) -> float:
    """Mean true return of 10 episodes with deterministic actions."""
    import gymnasium as gym
    from stable_baselines3.common.evaluation import evaluate_policy

    env = gym.make(env_id)
    env.reset(seed=seed + 10_000)
    mean, _ = evaluate_policy(model, env, n_eval_episodes=10, deterministic=True)  # type: ignore
    return float(mean)


def sac_job(args: argparse.Namespace, seed: int, out: Path, relabel: bool = False,
            wrapped: bool = True) -> float:
    import gymnasium as gym
    from stable_baselines3 import SAC

    from themis import PreferenceLearningWrapper
    from themis.online import RelabelCallback

    if not wrapped:
        model = SAC("MlpPolicy", gym.make("HalfCheetah-v5"), seed=seed, verbose=0, device="cpu")
        model.learn(args.sac_steps)
        return evaluate(model, "HalfCheetah-v5", seed)
    env = PreferenceLearningWrapper(
        gym.make("HalfCheetah-v5"), out, seed=seed, max_feedback=args.queries,
        reward_batch=args.queries // 10, segment=50, num_seed_steps=6000, num_interact=5000,
        torch_threads=1)
    model = SAC("MlpPolicy", env, seed=seed, verbose=0, device="cpu")
    model.learn(args.sac_steps, callback=RelabelCallback(env) if relabel else None)
    env.close()
    return evaluate(model, "HalfCheetah-v5", seed)


def pebble_job(args: argparse.Namespace, seed: int, out: Path) -> float:
    import pandas as pd

    proc = subprocess.run(
        [str(ROOT / "themis_train.sh"), "env=HalfCheetah-v5", f"seed={seed}",
         f"num_train_steps={args.sac_steps}", f"max_feedback={args.queries}",
         f"reward_batch={args.queries // 10}", "segment=50", "num_seed_steps=1000",
         "num_unsup_steps=5000", "num_interact=5000", f"eval_frequency={args.sac_steps}",
         "num_eval_episodes=10", "torch_threads=1", f"hydra.run.dir={out}"],
        capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-800:])
    return float(pd.read_csv(out / "eval.csv")["episode_reward"].iloc[-1])


def ppo_job(args: argparse.Namespace, seed: int, out: Path, wrapped: bool) -> float:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from themis.online.sb3 import PreferenceLearningVecEnv

    venv = make_vec_env("LunarLander-v3", 8, seed=seed, vec_env_cls=SubprocVecEnv)
    if wrapped:
        venv = PreferenceLearningVecEnv(
            venv, out, seed=seed, max_feedback=args.ppo_queries,
            reward_batch=args.ppo_queries // 10, segment=50, num_seed_steps=10_000,
            num_interact=max(1, (args.ppo_steps - 10_000) // 10), torch_threads=1)
    model = PPO("MlpPolicy", venv, seed=seed, verbose=0, device="cpu")
    model.learn(args.ppo_steps)
    venv.close()
    return evaluate(model, "LunarLander-v3", seed)


def worker(args: argparse.Namespace) -> None:
    """One job in this process: prints its result as a JSON line."""
    import torch

    torch.set_num_threads(1)
    kind, seed = args.worker, args.seed
    out = Path(args.out) / "runs" / f"{kind}_seed{seed}"
    start = time.time()
    if kind in ("sac", "sac-relabel", "sac-true"):
        value = sac_job(args, seed, out, relabel=kind == "sac-relabel", wrapped=kind != "sac-true")
    elif kind == "pebble":
        value = pebble_job(args, seed, out)
    else:
        value = ppo_job(args, seed, out, wrapped=kind == "ppo")
    print(json.dumps({"job": kind, "seed": seed, "return": value,
                      "seconds": time.time() - start}), flush=True)


def table(results: list[dict]) -> str:
    """The markdown table: mean ± std of the final true return per job, wall-clock."""
    import numpy as np

    lines = ["| run | seeds | final true return (mean ± std) | per seed | wall-clock (mean) |",
             "|---|---|---|---|---|"]
    for kind in JOBS:
        rows = sorted((r for r in results if r["job"] == kind), key=lambda r: r["seed"])
        if not rows:
            continue
        values = np.array([r["return"] for r in rows])
        lines.append(f"| {TITLES[kind]} | {','.join(str(r['seed']) for r in rows)} | "
                     f"{values.mean():.0f} ± {values.std():.0f} | "
                     f"{' / '.join(f'{v:.0f}' for v in values)} | "
                     f"{np.mean([r['seconds'] for r in rows]) / 60:.1f} min |")
    return "\n".join(lines)


def record_row(result: dict, args: argparse.Namespace, ran: str) -> dict:
    """The ``--record`` row of one finished job (its ``results.jsonl`` line ``result``): job,
    seed, the steps and queries of its kind (SAC's or PPO's), final true return, provenance."""
    ppo = result["job"].startswith("ppo")
    return {"job": result["job"], "seed": int(result["seed"]),
            "steps": args.ppo_steps if ppo else args.sac_steps,
            "queries": 0 if result["job"].endswith("-true")
            else args.ppo_queries if ppo else args.queries,
            "final": round(float(result["return"]), 1),
            **records.provenance(float(result["seconds"]), ran)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench_wrapper", help="results and runs (resumable)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="processes at once")
    parser.add_argument("--only", default=",".join(JOBS), help=f"some of {','.join(JOBS)}")
    parser.add_argument("--sac-steps", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--ppo-steps", type=int, default=500_000)
    parser.add_argument("--ppo-queries", type=int, default=1000)
    parser.add_argument("--table", action="store_true", help="print the table of results so far")
    parser.add_argument("--record", type=Path, nargs="?", metavar="CSV",
                        const=ROOT / "results" / "wrapper.csv",
                        help="write each finished job's row (default results/wrapper.csv)")
    parser.add_argument("--worker", choices=JOBS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ran = records.command(__file__, argv)
    if args.worker:
        worker(args)
        return
    kinds = [k for k in args.only.split(",") if k]
    if not kinds or set(kinds) - set(JOBS) or args.jobs < 1 or args.queries < 10 \
            or args.ppo_queries < 10:
        parser.error(f"--only takes {','.join(JOBS)}; --jobs >= 1; queries >= 10")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done_file = out / "results.jsonl"
    done = [json.loads(line) for line in done_file.read_text().splitlines()] \
        if done_file.is_file() else []
    if not args.table:
        todo = [(k, s) for s in args.seeds for k in kinds
                if not any(r["job"] == k and r["seed"] == s for r in done)]
        forwarded = [f"--sac-steps={args.sac_steps}", f"--queries={args.queries}",
                     f"--ppo-steps={args.ppo_steps}", f"--ppo-queries={args.ppo_queries}"]

        writing = threading.Lock()  # jobs finish in the pool's threads; one writes at a time

        def run(job: tuple[str, int]) -> None:
            kind, seed = job
            run_dir = out / "runs" / f"{kind}_seed{seed}"
            if run_dir.exists():  # an interrupted job starts over
                import shutil

                shutil.rmtree(run_dir)
            with tempfile.TemporaryFile("w+") as log:
                proc = subprocess.run([sys.executable, __file__, "--out", str(out),
                                       "--worker", kind, "--seed", str(seed), *forwarded],
                                      stdout=subprocess.PIPE, stderr=log, text=True,
                                      env={**os.environ, "OMP_NUM_THREADS": "1",
                                           "THEMIS_THREADS": "1"})
                if proc.returncode != 0:
                    log.seek(0)
                    print(f"{kind} seed {seed} failed:\n{log.read()[-2000:]}", flush=True)
                    return
            line = proc.stdout.strip().splitlines()[-1]
            with writing:
                with done_file.open("a") as f:
                    f.write(line + "\n")
                if args.record is not None:
                    records.merge_rows(args.record, [record_row(json.loads(line), args, ran)],
                                       RECORD_KEY)
            print(f"done: {line}", flush=True)

        print(f"{len(todo)} jobs, {args.jobs} at once; results in {done_file}", flush=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(run, todo))
        done = [json.loads(line) for line in done_file.read_text().splitlines()] \
            if done_file.is_file() else []
    print(f"\nHalfCheetah-v5: {args.sac_steps} steps, {args.queries} queries; LunarLander-v3: "
          f"{args.ppo_steps} steps, {args.ppo_queries} queries; seeds "
          f"{' '.join(map(str, args.seeds))}\n")
    print(table(done))


if __name__ == "__main__":
    main()
