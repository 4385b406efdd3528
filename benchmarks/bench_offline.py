"""Offline preference-based RL on datasets Themis builds (issue 88): IQL on the true reward, on
the Markovian ensemble's r̂ and on Preference Transformer's r̂, from the same kind of labels.

The dataset is "medium-replay"-style: the whole replay buffer of a SAC run on the true reward
stopped early (``--sac-steps``), read by ``mode=offline`` from the run folder. For each seed it
runs IQL on the true rewards (``true``), and for each label budget IQL on the r̂ of the
Markovian ensemble (``bpref``) and of Preference Transformer (``pt``), all labels from the
oracle teacher on uniformly chosen segment pairs. Recorded per run in ``--record`` (default
``results/offline.csv``): the final true return, the normalised return ``100 (R − random) /
(SAC − random)`` (random: a uniform policy's mean return over 10 episodes; SAC: the best
evaluation of the run that made the dataset), r̂'s accuracy on held-out pairs, the wall and
CPU seconds of the run and of its reward model, with the provenance columns of
``benchmarks/records.py`` (UTC date, commit, machine, command, wall seconds).

    python benchmarks/bench_offline.py --env HalfCheetah-v5 --seeds 0 1 2 --budgets 100 500
    python benchmarks/bench_offline.py --env Walker2d-v5 --seeds 0 1 2 --budgets 100 500
    python benchmarks/bench_offline.py --quick --record /tmp/offline.csv   # the suite's check

Runs are resumable: a finished run is read back, an unfinished one continued (``resume``).
A Minari dataset a user downloaded runs the same way with ``--dataset
minari:mujoco/halfcheetah/medium-v0`` (its own reference scores are then used), and a D4RL file
with D4RL's reference scores, for the rows of published tables (Preference Transformer's Table 1
uses 500 queries of 100 steps):

    python benchmarks/bench_offline.py --dataset hopper_medium_replay-v2.hdf5 --env Hopper-v5 \
        --ref-min -20.272305 --ref-max 3234.3 --segment 100 --budgets 500 --iql-steps 1000000
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # benchmarks/: records
import records  # isort: skip
import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECORD_KEY = ["env", "dataset", "variant", "budget", "seed"]
QUICK = {"env": "Pendulum-v1", "domain": "Classic", "sac_steps": 600, "iql_steps": 100,
         "budgets": [20], "seeds": [0], "segment": 10}
TINY_KEYS = dict(heldout_queries=50, reward_epochs=5, ensemble_size=2, reward_hidden_dim=16,
                 pt_embed_dim=16, pt_heads=2, pt_pref_attn_dim=8, pt_epochs=3,
                 num_eval_episodes=1, iql={"hidden_dim": 32, "batch_size": 64})


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build_dataset(out: Path, env: str, domain: str, steps: int, quick: bool) -> Path:
    """The SAC run on the true reward whose replay buffer is the dataset (made once)."""
    import themis

    run = out / f"dataset_{env}_{steps}"
    if (run / "checkpoints" / "state.pt").is_file():
        return run
    extra = ["num_seed_steps=200", "sac.hidden_dim=32", "sac.batch_size=32",
             "num_eval_episodes=1"] if quick else []
    themis.train(env=env, seed=100, run_dir=run, overrides=[
        f"domain={domain}", f"num_train_steps={steps}", "learn_reward=false",
        "num_unsup_steps=0", "reset_update=0", "torch_threads=1",
        f"eval_frequency={max(steps // 10, 100)}", *extra])
    return run


def references(dataset_run: Path, env: str, domain: str) -> tuple[float, float]:
    """(random, SAC) returns for the normalised return."""
    from themis.environments.domains import make_env
    from themis.interpret.rollouts import collect_rollouts, random_policy

    eval_env = make_env(domain, env, seed=12345)
    random = collect_rollouts(eval_env, random_policy(eval_env, 0), 10, seed=12345)
    low = float(np.mean([random.rews[s].sum() for s, _ in random.episodes()]))
    high = float(pd.read_csv(dataset_run / "eval.csv")["episode_reward"].max())
    return low, high


def run_variant(run: Path, keys: dict, steps: int) -> tuple[dict, float, float]:
    """One offline run (continued when unfinished); its last eval row, wall and CPU seconds."""
    from themis.offline.main import train_offline

    eval_csv = run / "eval.csv"
    if eval_csv.is_file():
        rows = pd.read_csv(eval_csv)
        if len(rows) and int(rows["step"].iloc[-1]) >= steps:
            return rows.iloc[-1].to_dict(), float("nan"), float("nan")
    wall, cpu = time.perf_counter(), cpu_seconds()
    if (run / "config.yaml").is_file():
        result = train_offline(resume=str(run), num_train_steps=steps)
    else:
        result = train_offline(run, **keys)
    return result.metrics, time.perf_counter() - wall, cpu_seconds() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--domain", default="Control")
    parser.add_argument("--dataset", default="", help="a dataset instead of a SAC run's buffer "
                        "(a Minari folder or minari:ID)")
    parser.add_argument("--ref-min", type=float, default=float("nan"),
                        help="with --dataset: the random return of the normalised score (D4RL's "
                        "REF_MIN_SCORE); default: the dataset's own, if it has one")
    parser.add_argument("--ref-max", type=float, default=float("nan"),
                        help="with --dataset: the expert return (D4RL's REF_MAX_SCORE)")
    parser.add_argument("--labels", default="", help="a label file (Uni-RLHF / Preference "
                        "Transformer human labels as npz or json) instead of the oracle")
    parser.add_argument("--sac-steps", type=int, default=100_000)
    parser.add_argument("--iql-steps", type=int, default=200_000)
    parser.add_argument("--budgets", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--segment", type=int, default=50)
    parser.add_argument("--variants", nargs="+", default=["true", "bpref", "pt"])
    parser.add_argument("--device", default="auto", help="the offline runs' device= (a GPU "
                        "makes Preference Transformer's training and relabelling cheap)")
    parser.add_argument("--pt-epochs", type=int, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_offline")
    parser.add_argument("--record", type=Path, default=ROOT / "results" / "offline.csv")
    parser.add_argument("--quick", action="store_true", help="a tiny run (the test suite's)")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    command = records.command(__file__, argv)
    if args.dataset:
        dataset, ref = args.dataset, (args.ref_min, args.ref_max)
    else:
        run = build_dataset(args.out, args.env, args.domain, args.sac_steps, args.quick)
        dataset, ref = str(run), references(run, args.env, args.domain)
    rows = []
    for seed in args.seeds:
        for variant in args.variants:
            for budget in ([0] if variant == "true" else args.budgets):
                keys = dict(dataset=dataset, env=args.env, domain=args.domain, seed=seed,
                            reward="true" if variant == "true" else "learned",
                            reward_net="pt" if variant == "pt" else "bpref",
                            max_feedback=max(budget, 1), reward_batch=max(1, budget // 5),
                            segment=args.segment, num_train_steps=args.iql_steps,
                            eval_frequency=max(args.iql_steps // 10, 50),
                            log_frequency=max(args.iql_steps // 100, 10),
                            checkpoint_frequency=max(args.iql_steps // 10, 50),
                            ref_min_score=ref[0], ref_max_score=ref[1], device=args.device,
                            labels=args.labels if variant != "true" else "",
                            **(TINY_KEYS if args.quick else {"pt_epochs": args.pt_epochs}))
                run = args.out / args.env / variant / str(budget) / f"seed{seed}"
                last, wall, cpu = run_variant(run, keys, args.iql_steps)
                reward_csv = run / "reward.csv"
                reward_seconds = float(pd.read_csv(reward_csv)["train_seconds"].sum()) \
                    if reward_csv.is_file() else 0.0
                rows.append({
                    **records.provenance(wall, command), "env": args.env,
                    "dataset": dataset, "variant": variant, "budget": budget, "seed": seed,
                    "iql_steps": args.iql_steps, "final_return": last.get("episode_reward"),
                    "normalised_return": last.get("normalised_return"),
                    "heldout_accuracy": last.get("heldout_accuracy"),
                    "cpu_s": round(cpu, 1), "reward_model_s": round(reward_seconds, 1)})
                print(f"{args.env} {variant} budget {budget} seed {seed}: normalised return "
                      f"{rows[-1]['normalised_return']}, held-out accuracy "
                      f"{rows[-1]['heldout_accuracy']}", flush=True)
    known: set[tuple[str, ...]] = set()  # a run read back (no timing) keeps its recorded row
    if args.record.is_file():
        old = pd.read_csv(args.record, dtype=str)
        known = set(map(tuple, old[[*RECORD_KEY, "command"]].to_numpy()))
    fresh = [row for row in rows if not (np.isnan(row["wall_s"]) and tuple(
        str(row[k]) for k in [*RECORD_KEY, "command"]) in known)]
    if fresh:
        records.merge_rows(args.record, fresh, [*RECORD_KEY, "command"])
    table = pd.DataFrame(rows).groupby(["variant", "budget"])[
        ["normalised_return", "heldout_accuracy", "wall_s"]].agg(["mean", "sem"])
    print(table.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
