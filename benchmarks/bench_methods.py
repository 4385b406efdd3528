#!/usr/bin/env python
"""PEBBLE and its successors side by side: one IQM table, methods × envs × budgets × seeds.

    python benchmarks/bench_methods.py                                   # the grid of issue 18
    python benchmarks/bench_methods.py --envs HalfCheetah-v5 --steps 20000 --seeds 0 --budgets 100
    python benchmarks/bench_methods.py --jobs 4 --out results/methods     # resumable: run again
    python benchmarks/bench_methods.py --noisy HalfCheetah-v5             # + PEBBLE vs RIME, 30 %
                                                                      #   wrong labels
    python benchmarks/bench_methods.py --domain Classic --envs Pendulum-v1 -- num_unsup_steps=500
    python benchmarks/bench_methods.py --protocol ppe --jobs 2     # PPE's Table 1 (walker_walk)
    python benchmarks/bench_methods.py --protocol ppe --record results/ppe_walker_walk.csv
                                     # + the seeds recorded by earlier sessions
    python benchmarks/bench_methods.py --protocol ppe_window_open --methods pebble --seeds 0 \
        --jobs 1 --threads 1 --record results/ppe_window_open.csv   # PPE's Meta-World row

Every run is ``./themis_train.sh`` with the same overrides a user would type (``env=``,
``method=``, ``max_feedback=``, ``seed=``), in ``OUT/clean/<env>/<budget>/<method>/seed<k>/``.
The ceiling, the ``sac`` row, is plain SAC on the true reward with the same networks and
overrides: ``learn_reward=false num_unsup_steps=0 reset_update=0`` (no state-entropy
pretraining, no critic reset; these win over overrides after ``--``), in
``OUT/clean/<env>/plain_sac/seed<k>/`` (it needs no budget; ``sac/`` held the earlier ceiling
with pretraining, which is not tabled). A run whose ``eval.csv`` reached the last step is
skipped, so an interrupted benchmark continues where it stopped. Runs go ``--jobs`` at a time,
each with cores / jobs PyTorch threads. The query schedule is the same for every method:
``reward_batch`` = budget / ``--rounds`` (10 rounds, ``num_interact`` apart). With ``--noisy
ENV`` the ``mistake`` teacher (``teacher_eps_mistake=0.3``) labels PEBBLE's and RIME's runs on
ENV at the largest budget, and RIME's caught / discarded-clean counts are reported. Overrides
after ``--`` go to every run; ``--table-only`` runs nothing and tables the runs finished so far
(the seeds column says how many each cell has). ``--record CSV`` keeps each finished run's
final value, curve, date, machine and command in CSV (one row per cell and command; a run
finished here replaces a recorded one of the same command) and tables the recorded runs whose
command is the one this invocation would run, where no run folder has them: seeds run over
several sessions, whose run folders are gone, add up to one table. ``--metric success_rate``
tables Meta-World's success rate (the last evaluation's share of successful episodes) instead
of the return.

``--protocol ppe`` runs the protocol of PPE's Table 1 (Zhu et al., NeurIPS 2025: DeepMind Control
walker_walk, 500k steps, 100 queries in 10 rounds of 10 every 20k steps, 50-step segments, 9000
unsupervised steps, final return over seeds; PEBBLE, SURF, RUNE, QPA and plain SAC), each method
with the settings of its official walker_walk command (``PROTOCOLS`` below: B-Pref's
``scripts/walker_walk/*/oracle/run_PEBBLE.sh`` and SAC config, SURF's README, QPA's
``run_QPA.sh``), except the networks: 2×128 and batch 256 (``--sac-width``, ``--sac-batch``)
where the paper has 2×1024 and batch 1024, which a 2-core CPU cannot run at 500k steps (2×256
ran 105 steps/s per run, two runs at a time on the 2-core AMD EPYC: 80 min a run; 2×128 keeps
one run near an hour). ``--protocol ppe_window_open`` runs the same table's Meta-World
window-open row at the papers' own SAC (3×256, batch 512): 500k steps, 400 queries in 40 rounds
of 10 every 5000 steps, each method with its official Meta-World command, the final success
rate in % (``PROTOCOLS``). A protocol's defaults (envs, steps, budgets, rounds, methods, domain,
SAC size, metric) are its own; flags given still win. Printed after the IQM table: Themis's
mean ± standard error beside the paper's (its std converted to a standard error), Welch's
t-test per method and whether its p ≥ 0.05 ("inside": seeds can explain the gap).

Printed last: per env and budget, each method's final true return as the interquartile mean
over seeds with a 95 % bootstrap CI (``scripts/summarize.py``'s estimator) and its ratio to
SAC's IQM on the true reward (where that is positive: a ratio of negative returns means
nothing).
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # benchmarks/: records
import records  # isort: skip
import argparse
import datetime
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("sac", "pebble", "surf", "rune", "qpa", "rime")
"""The grid of issue 18; ``--methods`` also takes ``mrn``."""


PROTOCOLS = {
    "ppe": {
        "domain": "DMC", "envs": ["walker_walk"], "steps": 500_000, "budgets": [100],
        "methods": ["pebble", "surf", "rune", "qpa", "sac"],
        # B-Pref's walker_walk SAC (config/agent/sac.yaml, run scripts' learning rates) and
        # schedule, shared by every method's official walker_walk command
        "extra": ["sac.actor_lr=0.0005", "sac.critic_lr=0.0005", "sac.alpha_lr=0.0001",
                  "sac.critic_target_update_frequency=2", "num_unsup_steps=9000",
                  "num_interact=20000", "segment=50", "num_eval_episodes=10"],
        # each method's own official walker_walk settings (the rest is its config's defaults)
        "method_extra": {
            "pebble": ["feed_type=1", "reward_update=50"],  # SURF's README, PEBBLE command
            "surf": ["reward_update=1000"],                  # SURF's README (mu 4, ratio 100)
            "rune": ["reward_update=50"],                    # B-Pref's schedule, RUNE's bonus
            # run_QPA.sh (pool 10, aug 20, her 0.5); qpa.iterations: train_QPA.py's reward
            # training (since 2026-12-01), named so that earlier recorded runs stay apart
            "qpa": ["reward_update=2000", "qpa.iterations=true"],
        },
        # the published row: final return, mean ± std over 5 seeds (PPE, Table 1); the std is
        # the population std (ddof 0)
        "published": {"pebble": (453, 159), "surf": (661, 92), "rune": (415, 182),
                      "qpa": (796, 148)},
        "published_seeds": 5, "published_ddof": 0,
        "source": "PPE (Zhu et al., NeurIPS 2025), Table 1, walker_walk, 100 queries",
    },
    "ppe_window_open": {
        "domain": "MetaWorld", "envs": ["window-open-v3"], "steps": 500_000, "budgets": [400],
        "rounds": 40, "methods": ["pebble", "surf", "rune", "qpa", "sac"],
        # B-Pref's Meta-World SAC (scripts/<task>/*/oracle/run_PEBBLE.sh, SURF's and RUNE's
        # Meta-World commands): 3 layers of 256, batch 512, learning rates 3e-4, temperature
        # 1e-4 (config/agent/sac.yaml), target every 2 steps; 9000 unsupervised steps; PPE's
        # schedule: 10 queries every 5000 steps; fp32 as the official code (no bf16 products);
        # the env as utils.make_metaworld_env builds it: a new goal and window position at
        # every reset (_freeze_rand_vec = False), the goal hidden (the v2 class's default)
        "sac_width": 256, "sac_batch": 512,
        "extra": ["sac.hidden_depth=3", "sac.actor_lr=0.0003", "sac.critic_lr=0.0003",
                  "sac.alpha_lr=0.0001", "sac.critic_target_update_frequency=2",
                  "num_unsup_steps=9000", "num_interact=5000", "segment=50",
                  "num_eval_episodes=10", "precision=fp32",
                  "+env_kwargs.freeze_rand_vec=false", "+env_kwargs.partially_observable=true"],
        "method_extra": {
            "pebble": ["feed_type=1", "reward_update=10"],  # B-Pref, SURF's hammer PEBBLE
            "surf": ["reward_update=20"],                    # SURF's README, hammer (ratio 10)
            "rune": ["reward_update=10"],                    # rune scripts/window_close
            # run_QPA.sh, Meta-World: learning rates 1e-4, reward_update=200 epochs with the
            # 97 % stop, pool 30, no crops (config/method_domain/qpa/MetaWorld.yaml)
            "qpa": ["sac.actor_lr=0.0001", "sac.critic_lr=0.0001", "reward_update=200",
                    "qpa.iterations=false"],
        },
        # the published row: final success rate in %, mean ± std over 5 seeds (PPE, Table 1)
        "published": {"pebble": (87.1, 17.1), "surf": (87.3, 27.0), "rune": (96.8, 4.1),
                      "qpa": (90.2, 20.1)},
        "published_seeds": 5, "published_ddof": 0,
        "metric": "success_rate", "scale": 100.0, "unit": "success rate (%)",
        "source": "PPE (Zhu et al., NeurIPS 2025), Table 1, Meta-World window-open, 400 queries",
    },
}
"""Published protocols: their defaults, the overrides of every run and of each method's runs,
and the published row (mean ± std over ``published_seeds``; ``published_ddof`` 0: the
population std). ``sac_width`` / ``sac_batch``: the protocol's SAC size (default 128 / 256);
``metric`` and ``scale``: the ``eval.csv`` column tabled and its factor to the paper's unit."""


def load_summarize():
    """``scripts/summarize.py`` as a module (its IQM and bootstrap CI)."""
    spec = importlib.util.spec_from_file_location("summarize", ROOT / "scripts" / "summarize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def overrides(domain: str, env: str, steps: int, budget: int, method: str, seed: int,
              rounds: int, threads: int, noisy: bool, extra: list[str],
              method_extra: dict[str, list[str]] | None = None) -> list[str]:
    """The command line of one run (``method_extra``: overrides of one method's runs only)."""
    out = [f"domain={domain}", f"env={env}", f"num_train_steps={steps}", f"seed={seed}",
           f"torch_threads={threads}", f"eval_frequency={max(steps // 10, 100)}", *extra]
    if method == "sac":  # plain SAC on the true reward: no pretraining, no critic reset
        out = [o for o in out if not o.startswith("num_unsup_steps=")]
        return [*out, "learn_reward=false", "num_unsup_steps=0", "reset_update=0"]
    out += [*(method_extra or {}).get(method, [])]
    out += [f"method={method}", f"max_feedback={budget}",
            f"reward_batch={max(1, budget // rounds)}"]
    if noisy:
        out += ["teacher=mistake", "teacher_eps_mistake=0.3"]
    return out


def run_dir(out: Path, env: str, budget: int, method: str, seed: int, noisy: bool) -> Path:
    """Where one run lives; plain SAC on the true reward needs no budget, so it runs once per
    env (``plain_sac/``: not ``sac/``, where earlier versions ran SAC after pretraining)."""
    base = out / ("noisy" if noisy else "clean") / env
    return (base / "plain_sac" if method == "sac" else base / str(budget) / method) \
        / f"seed{seed}"


def finished(run: Path, steps: int) -> bool:
    eval_csv = run / "eval.csv"
    if not eval_csv.is_file() or eval_csv.stat().st_size == 0:
        return False
    return int(pd.read_csv(eval_csv)["step"].iloc[-1]) >= steps


RECORD_KEY = ["env", "budget", "method", "seed", "noisy"]
# overrides that say how a run was driven, not what it computes: left out of a recorded command
DRIVING = ("torch_threads=", "resume=", "hydra.")


def ran_command(run: Path, composed: str) -> str:
    """The command a finished run ran: its ``.hydra/overrides.yaml`` without ``DRIVING``
    overrides, joined by spaces; ``composed`` (this invocation's) when the file lists none.
    A run folder does not encode the ``--`` extras, so the record takes the settings from
    the run itself, never from the invocation that tables it."""
    path = run / ".hydra" / "overrides.yaml"
    ran = yaml.safe_load(path.read_text()) if path.is_file() else None
    kept = [o for o in ran or [] if not o.startswith(DRIVING)]
    return " ".join(kept) if kept else composed


machine = records.machine
"""The CPU model and core count, for a recorded run's provenance (:func:`records.machine`)."""


def read_record(path: Path | None) -> pd.DataFrame:
    """The runs recorded in ``--record``'s CSV (empty without one or before the first)."""
    if path is None or not path.is_file():
        return pd.DataFrame(columns=[*RECORD_KEY, "command"])
    return pd.read_csv(path, dtype={"command": str, "curve": str})


def write_record(path: Path, record: pd.DataFrame, rows: list[dict]) -> None:
    """Merge the runs finished here into the record: one row per grid cell (env, budget,
    method, seed, noisy) and command, a run finished here replacing a recorded one of the same
    cell and command (a run of the cell under other settings, e.g. another rule of a method or
    other network sizes, is kept beside it)."""
    new = pd.DataFrame(rows)
    merged = pd.concat([record, new], ignore_index=True).drop_duplicates(
        [*RECORD_KEY, "command"], keep="last")
    path.parent.mkdir(parents=True, exist_ok=True)
    merged.sort_values(RECORD_KEY).to_csv(path, index=False)


def run_one(run: Path, args: list[str], log: Path, threads: int) -> int:
    """One run; an interrupted one continues from its last checkpoint (or starts again
    when it stopped before the first). Its provenance (the date, commit, machine and command
    it started with, the commit of each resume) and its wall seconds over all starts go into
    the run folder (``records.note_run``, ``records.add_wall``) for its record row."""
    run.parent.mkdir(parents=True, exist_ok=True)
    if (run / "checkpoints" / "state.pt").is_file():
        args = [*args, "resume=true"]
    else:
        shutil.rmtree(run, ignore_errors=True)
    start, date, sha = time.time(), records.utc_now(), records.commit()
    with log.open("w") as out:
        code = subprocess.call([str(ROOT / "themis_train.sh"), *args, f"hydra.run.dir={run}"],
                               cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                               env={**os.environ, "THEMIS_THREADS": str(threads)})
    if run.is_dir():  # noted after the start: a launcher that never began leaves no folder
        records.note_run(run, records.command(__file__), date, sha)
        records.add_wall(run, time.time() - start)
    return code


def published_table(table: pd.DataFrame, protocol: dict, summarize) -> None:
    """Print :func:`published_lines`."""
    print("\n" + "\n".join(published_lines(table, protocol, summarize)))


def published_lines(table: pd.DataFrame, protocol: dict, summarize) -> list[str]:
    """Themis's final values beside a paper's, both as mean ± standard error, with Welch's
    t-test per method (``summarize.compare_with_published``; the paper's std converted as its
    ``published_ddof`` says) and both orderings, as Markdown lines (a sentence, the table, the
    orderings). ``inside``: Welch's p ≥ 0.05 (the two means do not differ at the 5 % level:
    seed-to-seed variation can explain the gap)."""
    scale, n_paper = protocol.get("scale", 1.0), protocol["published_seeds"]
    ddof = protocol.get("published_ddof", 0)
    digits = 1 if scale != 1.0 else 0

    def num(value: float) -> str:
        return "-" if not np.isfinite(value) else f"{value:.{digits}f}"

    conversion = f"σ/√{n_paper - 1}" if ddof == 0 else f"s/√{n_paper}"
    lines = [f"beside {protocol['source']}: final {protocol.get('unit', 'return')}, mean ± "
             f"standard error over seeds (Themis: sample std / √n; the paper's: its "
             f"{'population' if ddof == 0 else 'sample'} std over {n_paper} seeds as "
             f"{conversion}); Welch's t-test; inside: p ≥ 0.05, seeds can explain the gap", "",
             "| method | paper (mean ± std) | paper (mean ± SE) | Themis (mean ± SE) | seeds | "
             "Themis per seed | gap / SE | Welch p | inside / outside |",
             "|---|---|---|---|---|---|---|---|---|"]
    ours = {}
    for method, (mean, std) in protocol["published"].items():
        runs = table[table["method"] == method]["final"].to_numpy(dtype=float) * scale
        if not len(runs):
            lines.append(f"| {method} | {mean} ± {std} | - | - | 0 | - | - | - | - |")
            continue
        c = summarize.compare_with_published(runs, mean, std, n_paper, ddof)
        ours[method] = c.mean
        verdict = "-" if c.inside is None else "inside" if c.inside else "outside"
        lines.append(f"| {method} | {mean} ± {std} | {num(c.published_mean)} ± "
                     f"{num(c.published_se)} | {num(c.mean)} ± {num(c.se)} | {c.n} | "
                     f"{', '.join(num(v) for v in runs)} | "
                     f"{'-' if np.isnan(c.gap_se) else f'{c.gap_se:.2f}'} | "
                     f"{'-' if np.isnan(c.p) else f'{c.p:.3f}'} | {verdict} |")
    sac = table[table["method"] == "sac"]["final"].to_numpy(dtype=float) * scale
    if len(sac):
        se = sac.std(ddof=1) / np.sqrt(len(sac)) if len(sac) > 1 else np.nan
        lines.append(f"| sac (true reward) | - | - | {num(sac.mean())} ± {num(se)} | "
                     f"{len(sac)} | {', '.join(num(v) for v in sac)} | - | - | - |")
    paper_order = sorted(protocol["published"], key=lambda m: -protocol["published"][m][0])
    lines += ["", f"ordering, paper: {' > '.join(paper_order)}; Themis: "
              f"{' > '.join(sorted(ours, key=lambda m: -ours[m])) or '-'}"]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS),
                        help="a published protocol: its env, steps, budgets, methods, settings")
    parser.add_argument("--sac-width", type=int, default=None,
                        help="with --protocol: SAC's hidden width (default: the protocol's; "
                        "ppe 128, where the paper has 1024; ppe_window_open 256)")
    parser.add_argument("--sac-batch", type=int, default=None,
                        help="with --protocol: SAC's batch size (default: the protocol's; ppe "
                        "256, where the paper has 1024; ppe_window_open 512)")
    parser.add_argument("--domain", default=None, help="default Control")
    parser.add_argument("--envs", nargs="+", default=None,
                        help="default HalfCheetah-v5 Hopper-v5")
    parser.add_argument("--methods", nargs="+", default=None, choices=(*METHODS, "mrn"),
                        help=f"default {' '.join(METHODS)}")
    parser.add_argument("--budgets", nargs="+", type=int, default=None, help="default 100 500")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="default 100000")
    parser.add_argument("--rounds", type=int, default=None,
                        help="feedback rounds per budget (default 10; a protocol's own)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0,
                        help="PyTorch threads per run (default: cores / jobs)")
    parser.add_argument("--noisy", metavar="ENV", help="also PEBBLE vs RIME with 30 %% "
                        "wrong labels on ENV")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_methods")
    parser.add_argument("--metric", default=None, choices=["episode_reward", "success_rate"],
                        help="eval.csv column tabled (default episode_reward; a protocol's own)")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--record", type=Path, metavar="CSV",
                        help="keep each finished run's final return and curve in CSV (merged, "
                        "one row per cell and command) and table recorded runs of the same "
                        "command too: seeds run in sessions whose run folders are gone")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: the table of the runs finished so far")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_intermixed_args(argv)  # overrides after -- reach "extra"
    protocol = PROTOCOLS.get(args.protocol or "", {})
    for key, default in (("domain", "Control"), ("envs", ["HalfCheetah-v5", "Hopper-v5"]),
                         ("methods", list(METHODS)), ("budgets", [100, 500]),
                         ("steps", 100_000), ("rounds", 10), ("metric", "episode_reward"),
                         ("sac_width", 128), ("sac_batch", 256)):
        if getattr(args, key) is None:
            setattr(args, key, protocol.get(key, default))
    method_extra = protocol.get("method_extra", {})
    if protocol:
        args.extra = [*protocol["extra"], f"sac.hidden_dim={args.sac_width}",
                      f"sac.batch_size={args.sac_batch}", *args.extra]
        if args.out == parser.get_default("out"):
            args.out = ROOT / "runs" / f"bench_methods_{args.protocol}"
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    grid = []  # seed by seed: an interrupted benchmark has whole seeds of every method
    for seed in args.seeds:
        for env in args.envs:
            for budget in args.budgets:
                for method in args.methods:
                    grid.append((env, budget, method, seed, False))
    if args.noisy:
        for method in ("pebble", "rime"):
            for seed in args.seeds:
                grid.append((args.noisy, max(args.budgets), method, seed, True))
    todo = []
    for env, budget, method, seed, noisy in grid:
        run = run_dir(args.out, env, budget, method, seed, noisy)
        if not finished(run, args.steps) and run not in [r for r, _ in todo]:
            todo.append((run, overrides(args.domain, env, args.steps, budget, method, seed,
                                        args.rounds, threads, noisy, args.extra,
                                        method_extra)))
    runs = {run_dir(args.out, *cell) for cell in grid}
    print(f"{len(runs)} runs, {len(runs) - len(todo)} already done, {len(todo)} to go "
          f"({args.jobs} at a time, {threads} threads each); logs: OUT/.../run.log", flush=True)
    if args.table_only:
        todo = []
    failed = []
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_one, run, o, run.with_name(run.name + ".log"), threads): run
                   for run, o in todo}
        for n, (future, run) in enumerate(futures.items(), 1):
            code = future.result()
            print(f"[{n}/{len(todo)}] {run.relative_to(args.out)}: "
                  f"{'done' if code == 0 else f'failed ({code})'}", flush=True)
            if code != 0:
                failed.append(run)
    summarize = load_summarize()
    record = read_record(args.record)
    rows, recorded, local = [], 0, []
    host = machine() if args.record else ""
    for env, budget, method, seed, noisy in grid:
        run = run_dir(args.out, env, budget, method, seed, noisy)
        command = " ".join(o for o in overrides(args.domain, env, args.steps, budget, method,
                                                seed, args.rounds, 1, noisy, args.extra,
                                                method_extra)
                           if not o.startswith("torch_threads="))
        if finished(run, args.steps):
            curve = pd.read_csv(run / "eval.csv")
            rewards = pd.read_csv(run / "reward.csv") if (run / "reward.csv").is_file() \
                else pd.DataFrame()
            rows.append({"env": env, "budget": budget, "method": method, "seed": seed,
                         "noisy": noisy, "final": float(curve[args.metric].iloc[-1]),
                         "caught": rewards["rime_caught"].iloc[-1]
                         if "rime_caught" in rewards else np.nan,
                         "discarded": rewards["rime_discarded_clean"].iloc[-1]
                         if "rime_discarded_clean" in rewards else np.nan})
            points = zip(curve["step"], curve[args.metric], strict=True)
            prov = records.run_provenance(run) or {"machine": host, "commits": [],
                                                   "wall_s": np.nan}
            local.append({**rows[-1], "steps": args.steps, "curve": " ".join(
                f"{int(st)}:{v:.1f}" for st, v in points),
                "recorded": datetime.date.fromtimestamp((run / "eval.csv").stat().st_mtime)
                .isoformat(), "machine": prov["machine"],
                "commit": " ".join(prov["commits"]) or np.nan, "wall_s": prov["wall_s"],
                "command": ran_command(run, command)})
            continue
        same = record[(record["env"] == env) & (record["budget"] == budget)
                      & (record["method"] == method) & (record["seed"] == seed)
                      & (record["noisy"] == noisy) & (record["command"] == command)]
        if len(same):  # the same command, run in an earlier session
            rows.append({k: same.iloc[0][k] for k in (*RECORD_KEY, "final", "caught",
                                                       "discarded")})
            recorded += 1
    if args.record:
        if local:
            write_record(args.record, record, local)
        print(f"{len(local)} finished runs here, {recorded} from {args.record} (the same "
              "command, run earlier)")
    table = pd.DataFrame(rows)
    if table.empty:
        print("bench_methods: no finished run", file=sys.stderr)
        return 1
    what = "success rate" if args.metric == "success_rate" else "true return"

    def fmt(value: float) -> str:
        return f"{value:.2f}" if args.metric == "success_rate" else f"{value:.0f}"

    print(f"\nfinal {what} (eval), IQM over seeds [95 % bootstrap CI]; {args.steps} steps, "
          f"oracle teacher, reward_batch = budget / {args.rounds}\n")
    print("| env | queries | method | seeds | IQM [95 % CI] | ratio to SAC |")
    print("|---|---|---|---|---|---|")
    sac_shown = set()  # SAC needs no budget: its row once per env, its IQM in every ratio
    for (env, budget), group in table[~table["noisy"]].groupby(["env", "budget"], sort=False):
        sac = group[group["method"] == "sac"]["final"].to_numpy()
        ceiling = summarize.iqm_with_ci(sac, args.reps)[0] if len(sac) else np.nan
        for method, runs in group.groupby("method", sort=False):
            if method == "sac":
                if env in sac_shown:
                    continue
                sac_shown.add(env)
            iqm, lo, hi = summarize.iqm_with_ci(runs["final"].to_numpy(), args.reps)
            ratio = iqm / ceiling if np.isfinite(ceiling) and ceiling > 0 else np.nan
            print(f"| {env} | {'-' if method == 'sac' else budget} | {method} | {len(runs)} | "
                  f"{fmt(iqm)} [{fmt(lo)}, {fmt(hi)}] | "
                  f"{'-' if np.isnan(ratio) else f'{ratio:.2f}'} |")
    if protocol.get("published"):
        published_table(table[~table["noisy"]], protocol, summarize)
    noisy = table[table["noisy"]]
    if len(noisy):
        print(f"\nnoisy labels: mistake teacher, teacher_eps_mistake=0.3, {args.noisy}, "
              f"{max(args.budgets)} queries\n")
        print("| method | seeds | IQM [95 % CI] | wrong labels caught | clean labels discarded |")
        print("|---|---|---|---|---|")
        for method, runs in noisy.groupby("method", sort=False):
            iqm, lo, hi = summarize.iqm_with_ci(runs["final"].to_numpy(), args.reps)
            caught = runs["caught"].mean()
            discarded = runs["discarded"].mean()
            print(f"| {method} | {len(runs)} | {iqm:.0f} [{lo:.0f}, {hi:.0f}] | "
                  f"{'-' if np.isnan(caught) else f'{caught:.0f}'} | "
                  f"{'-' if np.isnan(discarded) else f'{discarded:.0f}'} |")
    if failed:
        print(f"\n{len(failed)} runs failed; see their .log files", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
