#!/usr/bin/env python
"""Deep RL from Human Preferences reproduced: MovingDot and Pong from an oracle teacher against
PPO on the true reward, and what DRLHP's recipe changes on MovingDot.

    python benchmarks/bench_drlhp.py dot                        # MovingDot: 0.15M steps, seeds 0-2
    python benchmarks/bench_drlhp.py dot --jobs 2 --out runs/bench_drlhp   # resumable: run again
    python benchmarks/bench_drlhp.py pong --steps 2000000       # Pong: the true score's curve
    python benchmarks/bench_drlhp.py dot --steps 4096 --seeds 0 --quick    # a smoke run
    python benchmarks/bench_drlhp.py speed                      # reward model: ms per frame
    python benchmarks/bench_drlhp.py trunk --episodes 20        # shared trunk vs separate members
    python benchmarks/bench_drlhp.py commands                   # paper-scale and Enduro commands

``dot``: MovingDot (``domain=MovingDot``, themis/environments/moving_dot.py) at mrahtz's budget,
0.15M agent steps, seeds 0-2, one run per (variant, seed) in ``OUT/dot/<variant>/seed<k>/``:

- ``random``: a uniformly random policy (no run; evaluated only);
- ``ppo_true``: PPO on the true reward (``learn_reward=false num_unsup_steps=0``);

every run with one env of 128-step rollouts (``ppo.num_envs=1``, as mrahtz's MovingDot runs
its A2C on one env: with 8 envs PPO on the true reward was still at +1.4 after 20k steps, with
one at +67 after 10k);
- ``drlhp``: PrefPPO with DRLHP's recipe and mrahtz's MovingDot reward network (``+recipe=drlhp
  reward_net=drlhp_dot``): 500 labels from the random policy (``num_seed_steps=10000``), 200
  epochs on them, then 0.1 label-passes per agent step over the newest 3000 labels, the rest of
  the ``--queries`` (1000) in rounds every 5000 steps at a rate decaying as T₀ / (T + T₀) with
  T₀ = steps / 5, bootstrap members validated out-of-bag, adaptive L2, rewards at std 0.05;
- ``drlhp_passes10``: the same with 10× the label-passes per agent step
  (``reward_passes_per_step=1.0``; mrahtz's MovingDot run trains as fast as its process runs);
- ``drlhp_onehot``: the recipe with the action one-hot into the dot's MLP
  (``reward_net=drlhp_dot_onehot``) instead of mrahtz's action index / 4;
- what the recipe's pieces change, one each, from ``drlhp_onehot``: ``drlhp_rounds`` (B-Pref's
  schedule: up to 50 epochs over every label after each round, ``reward_schedule=rounds``),
  ``drlhp_cnn`` (the
  paper's Atari network on the frames instead of the dot's position, ``reward_net=drlhp``),
  ``drlhp_no_l2`` (``reward_adaptive_l2=false reward_l2=0``), ``drlhp_constant`` (a constant
  labelling rate: the budget after the first round spread evenly over the later rounds);
- ``themis``: Themis's defaults (B-Pref's network and schedule, ``segment=25``; on pixels about
  24 h per run on one core: not in the default set).

After a run, its final agent (``checkpoints/agent.pt``) plays ``--episodes`` (10) episodes from
random starts; tabled are the dot's distance to the middle at the end of the episode (pixels of
the 160 × 210 frame; a random start is 66 px away on average, the corner 132 px), the true
return (+1 per frame closer, −1 per frame away), mean ± standard error over seeds (cached in
``drlhp_eval.json`` beside the run), and each run's wall-clock and CPU time (``timing.json``,
summed over resumes).

``pong``: ``PongNoFrameskip-v4`` (``domain=ALE``: DQN preprocessing, 4 stacked 84 × 84 frames, no
sticky actions) with the recipe and an oracle teacher (``<agent>_oracle``) and the same agent on
the true reward (``<agent>_true``): A2C with 16 envs as mrahtz's Pong run, or PPO with CleanRL's
Atari settings (8 envs, clip 0.1), seed 0 by default: the true score (mean of
``num_eval_episodes=3``) every ``--steps`` / 20 steps, tabled side by side and drawn in
``OUT/pong/curve.png``.

A run whose ``eval.csv`` reached the last step is skipped; an interrupted one continues from its
last checkpoint (``resume=true``), so running the same command again finishes what is left. Runs
go ``--jobs`` at a time, each with cores / jobs PyTorch threads. Overrides after ``--`` go to
every run; ``--quick`` shrinks the schedule for a smoke run (tiny budget, a few minutes).
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # benchmarks/: records
import records  # isort: skip
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
DOT_VARIANTS = ("random", "ppo_true", "drlhp", "drlhp_passes10", "drlhp_onehot", "drlhp_rounds",
                "drlhp_cnn", "drlhp_no_l2", "drlhp_constant", "themis")
DOT_DEFAULT = ("random", "ppo_true", "drlhp", "drlhp_onehot", "drlhp_rounds", "drlhp_no_l2",
               "drlhp_constant")
DOT_SEED_STEPS = 10_000
"""MovingDot: steps of the random policy before the first round (DRLHP's 500 labels)."""
PONG_VARIANTS = ("ppo_true", "a2c_true", "ppo_oracle", "a2c_oracle")
PONG_DEFAULT = ("ppo_true", "ppo_oracle")  # PPO chosen: docs/results/drlhp.md
PONG_SEED_STEPS = 50_000
"""Pong: random-policy steps before the first round (its 500 labels' 25-step segments are cut
from about 50 episodes of 16 envs)."""


def dot_overrides(variant: str, steps: int, seed: int, queries: int, quick: bool) -> list[str]:
    """The ``./themis_train.sh`` overrides of one MovingDot run."""
    from themis.feedback.selector import feedback_rounds

    out = ["domain=MovingDot", f"num_train_steps={steps}", f"seed={seed}",
           f"eval_frequency={max(steps // 10, 1024)}", "num_eval_episodes=5"]
    interact, envs, rollout_steps = 5000, 1, 128  # mrahtz's MovingDot: one env
    seed_steps, unsup, initial = DOT_SEED_STEPS, 0, 500
    if quick:  # a smoke run: small rollouts, a few rounds, few epochs
        interact, envs, rollout_steps = max(steps // 4, 256), 2, 64
        seed_steps, initial = max(steps // 4, 256), max(queries // 4, 1)
        out += ["reward_update=3", "reward_pretrain_epochs=5", "num_eval_episodes=1",
                "+env_kwargs.max_episode_steps=200"]
    out += [f"ppo.num_envs={envs}", f"ppo.num_steps={rollout_steps}"]
    if variant == "ppo_true":
        return [*out, "learn_reward=false", "num_unsup_steps=0", "num_seed_steps=0"]
    out += [f"max_feedback={queries}", "segment=25", f"num_interact={interact}"]
    if variant == "themis":
        return [*out, "num_unsup_steps=5000"]
    # mrahtz's dot network (the action index / 4) for drlhp and drlhp_passes10; the action
    # one-hot for drlhp_onehot and the rows of the recipe's pieces, which change one piece of it
    net = "drlhp_dot" if variant in ("drlhp", "drlhp_passes10") else "drlhp_dot_onehot"
    out += ["+recipe=drlhp", f"reward_net={net}", f"num_seed_steps={seed_steps}",
            f"num_unsup_steps={unsup}", f"first_round_queries={initial}",
            f"query_decay_steps={max(1, steps // 5)}"]
    if variant == "drlhp_passes10":
        out += ["reward_passes_per_step=1.0"]
    elif variant == "drlhp_rounds":
        out += ["reward_schedule=rounds"]
    elif variant == "drlhp_cnn":
        out += ["reward_net=drlhp"]
    elif variant == "drlhp_no_l2":
        out += ["reward_adaptive_l2=false", "reward_l2=0"]
    elif variant == "drlhp_constant":
        rounds = feedback_rounds(steps, seed_steps + unsup, interact, envs * rollout_steps)
        out += ["query_schedule=constant",
                f"reward_batch={-(-(queries - initial) // max(1, rounds - 1))}"]
    return out


def pong_overrides(variant: str, steps: int, seed: int, queries: int, quick: bool) -> list[str]:
    """The ``./themis_train.sh`` overrides of one Pong run: ``<agent>_true`` (the agent on the
    true reward) or ``<agent>_oracle`` (DRLHP's recipe and an oracle teacher), ``<agent>``
    ``ppo`` (CleanRL's ``ppo_atari.py``: 8 envs × 128 steps, 4 epochs, clip 0.1, linear heads)
    or ``a2c`` (16 envs × 5 steps, one step, RMSprop: DRLHP's and mrahtz's agent)."""
    agent, kind = variant.split("_")
    out = ["domain=ALE", "env=PongNoFrameskip-v4", f"num_train_steps={steps}", f"seed={seed}",
           f"eval_frequency={max(steps // 20, 1024)}", f"agent={agent}",
           f"checkpoint_frequency={max(steps // 40, 1024)}"]
    interact = 20_000
    if quick:  # a smoke run: small rollouts, short episodes, a few rounds
        interact = max(steps // 4, 256)
        out += [f"{agent}.num_envs=2", "num_eval_episodes=1", "num_seed_steps=0",
                f"num_unsup_steps={interact}", "reward_update=2", "reward_pretrain_epochs=2",
                f"first_round_queries={max(queries // 4, 1)}",
                "+env_kwargs.max_num_frames_per_episode=1000"]
        out += ["ppo.num_steps=64"] if agent == "ppo" else []
    else:
        out += ["num_eval_episodes=3"]
        out += ["ppo.num_envs=8", "ppo.clip_coef=0.1"] if agent == "ppo" else ["a2c.num_envs=16"]
    if kind == "true":
        return [*out, "learn_reward=false", "num_unsup_steps=0"]
    # DRLHP's recipe: 500 labels from the random policy's first PONG_SEED_STEPS steps, 200
    # epochs on them, then 0.1 label-passes per step in the background learner on a core of
    # its own, the agent waiting when the learner lags (reward_max_lag), the CNN compiled
    return [*out, "+recipe=drlhp", f"max_feedback={queries}", f"num_interact={interact}",
            f"query_decay_steps={max(1, steps // 4)}", "reward_training=async",
            "reward_compile=true",
            *([] if quick else [f"num_seed_steps={PONG_SEED_STEPS}", "num_unsup_steps=0",
                                "reward_max_lag=4096"])]


def finished(run: Path, steps: int) -> bool:
    eval_csv = run / "eval.csv"
    if not eval_csv.is_file() or eval_csv.stat().st_size == 0:
        return False
    return int(pd.read_csv(eval_csv)["step"].iloc[-1]) >= steps


def note_provenance(run: Path) -> None:
    """``<run>/provenance.json``: the date, commit, machine and command a run started with, and
    the commit of each later resume (a record names the run's own, not the tabling's;
    :func:`records.note_run`)."""
    records.note_run(run, "python benchmarks/bench_drlhp.py " + " ".join(sys.argv[1:]))


def run_one(run: Path, overrides: list[str], threads: int) -> int:
    """One run; an interrupted one continues from its last checkpoint (or starts again when it
    stopped before the first). Its console goes to ``<run>.log``."""
    run.parent.mkdir(parents=True, exist_ok=True)
    if (run / "checkpoints" / "state.pt").is_file():
        overrides = [*overrides, "resume=true"]
    else:
        shutil.rmtree(run, ignore_errors=True)
    note_provenance(run)
    start = time.time()
    with run.with_name(run.name + ".log").open("a") as log:
        proc = subprocess.Popen([str(ROOT / "themis_train.sh"), *overrides,
                                 f"torch_threads={threads}", f"hydra.run.dir={run}"],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "THEMIS_THREADS": str(threads)})
        _, status, usage = os.wait4(proc.pid, 0)  # this run's own CPU time
        proc.returncode = os.waitstatus_to_exitcode(status)
    records.add_wall(run, time.time() - start, usage.ru_utime + usage.ru_stime)
    return proc.returncode


def play_dot(env: object, act: object, episodes: int, seed: int) -> dict[str, float]:
    """``episodes`` MovingDot episodes of the policy ``act(obs)``: the distance to the middle at
    each episode's end and the true return, means."""
    distances, returns = [], []
    for i in range(episodes):
        obs, info = env.reset(seed=seed + i)  # type: ignore[attr-defined]
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, info = env.step(act(obs))  # type: ignore
            total += float(reward)
            done = terminated or truncated
        distances.append(float(info["distance"]))
        returns.append(total)
    return {"final_distance": float(np.mean(distances)), "true_return": float(np.mean(returns))}


def evaluate_random(seed: int, episodes: int, steps: int) -> dict[str, float]:
    """A uniformly random policy on MovingDot, from the starts :func:`evaluate_dot` uses."""
    from themis.environments.domains import make_env

    env = make_env("MovingDot", "MovingDotNoFrameskip-v0", seed=seed + 20_000)
    rng = np.random.default_rng(seed)
    return {"step": steps, "episodes": episodes, "wall_s": 0.0, "cpu_s": 0.0,
            **play_dot(env, lambda obs: int(rng.integers(env.action_space.n)), episodes,
                       seed + 20_000)}


def evaluate_dot(run: Path, episodes: int) -> dict[str, float]:
    """The final agent of a MovingDot run from random starts: distance to the middle at each
    episode's end and true return, means over ``episodes`` (cached in ``drlhp_eval.json``),
    and the run's wall-clock and CPU seconds (``timing.json``)."""
    import torch

    from themis.agents import PPO
    from themis.core.safe_loading import safe_load
    from themis.environments.domains import make_env
    from themis.run.received_config import load_received_config
    from themis.utils import eval_mode

    cache = run / "drlhp_eval.json"
    ckpt = safe_load(run / "checkpoints" / "agent.pt")
    timing = json.loads((run / "timing.json").read_text()) if (run / "timing.json").is_file() \
        else {"wall_s": float("nan"), "cpu_s": float("nan")}
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if cached.get("step") == ckpt["step"] and cached.get("episodes") == episodes:
            return {**cached, **timing}
    cfg = load_received_config(run / ".hydra" / "config.yaml")
    env = make_env(cfg.domain, cfg.env, seed=int(cfg.seed) + 20_000,
                   **dict(cfg.env_kwargs))
    agent = PPO(tuple(env.observation_space.shape or ()), int(env.action_space.n),
                torch.device("cpu"), load_received_config_ppo(cfg))
    agent.load_state_dict(ckpt["agent"])

    def act(obs: np.ndarray) -> int:
        with eval_mode(agent.net):
            return agent.act(obs, sample=True)

    out = {"step": int(ckpt["step"]), "episodes": episodes,
           **play_dot(env, act, episodes, int(cfg.seed) + 20_000)}
    cache.write_text(json.dumps(out))
    return {**out, **timing}


def load_received_config_ppo(cfg) -> object:
    """The run's ``ppo.*`` settings as a :class:`themis.agents.ppo.PPOConfig`."""
    from omegaconf import OmegaConf

    from themis.agents.ppo import PPOConfig

    return PPOConfig(**OmegaConf.to_container(cfg.ppo))  # type: ignore[arg-type]


def run_grid(cells: list[tuple[Path, list[str]]], steps: int, jobs: int, threads: int,
             table_only: bool) -> list[Path]:
    """Run the unfinished cells, ``jobs`` at a time; returns the failed ones."""
    todo = [(run, o) for run, o in cells if not finished(run, steps)]
    print(f"{len(cells)} runs, {len(cells) - len(todo)} already done, "
          f"{0 if table_only else len(todo)} to go ({jobs} at a time, {threads} threads each); "
          "logs: OUT/.../<run>.log", flush=True)
    if table_only:
        return []
    failed = []
    with ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(run_one, run, o, threads): run for run, o in todo}
        for n, (future, run) in enumerate(futures.items(), 1):
            code = future.result()
            print(f"[{n}/{len(todo)}] {run}: {'done' if code == 0 else f'failed ({code})'}",
                  flush=True)
            if code != 0:
                failed.append(run)
    return failed


def dot_table(out: Path, variants: list[str], seeds: list[int], steps: int,
              episodes: int, record: Path | None = None) -> None:
    """The MovingDot table: final distance and true return per variant, mean ± standard error
    over seeds; ``record``: also each run's row in that CSV (:func:`record_dot`)."""
    print(f"\nMovingDot, {steps} agent steps, oracle teacher; the final agent from random "
          f"starts ({episodes} episodes per seed): distance to the middle at the end (px) and "
          "true return, mean ± standard error over seeds\n")
    print("| variant | seeds | final distance (px) | true return | last val accuracy | "
          "wall-clock per run (min) | CPU per run (min) |")
    print("|---|---|---|---|---|---|---|")
    for variant in variants:
        rows = []
        for seed in seeds:
            run = out / "dot" / variant / f"seed{seed}"
            if variant == "random":
                rows.append({**evaluate_random(seed, episodes, steps), "val_accuracy": np.nan,
                             "seed": seed})
            elif finished(run, steps) and (run / "checkpoints" / "agent.pt").is_file():
                row = evaluate_dot(run, episodes)
                rounds = run / "reward.csv"
                val = pd.read_csv(rounds) if rounds.is_file() else pd.DataFrame()
                row["val_accuracy"] = float(val["val_accuracy"].iloc[-1]) \
                    if "val_accuracy" in val and len(val) else np.nan
                prov = run / "provenance.json"
                rows.append({**row, "seed": seed, "provenance":
                             json.loads(prov.read_text()) if prov.is_file() else None})
        if not rows:
            print(f"| {variant} | 0 | - | - | - | - | - |")
            continue
        t = pd.DataFrame(rows)
        if record is not None:
            record_dot(record, variant, t, steps)
        val = "-" if t["val_accuracy"].isna().all() else mean_std(t["val_accuracy"], ".2f")
        times = "- | -" if variant == "random" else \
            f"{mean_std(t['wall_s'] / 60)} | {mean_std(t['cpu_s'] / 60)}"
        print(f"| {variant} | {len(t)} | {mean_std(t['final_distance'])} | "
              f"{mean_std(t['true_return'])} | {val} | {times} |")


def mean_std(values: pd.Series, fmt: str = ".1f") -> str:
    """``mean ± standard error`` over seeds (sample std / √n; ``mean ± -`` for one seed)."""
    values = values.dropna()
    if len(values) < 2:
        return f"{values.mean():{fmt}} ± -"
    return f"{values.mean():{fmt}} ± {values.std(ddof=1) / np.sqrt(len(values)):{fmt}}"


def record_dot(path: Path, variant: str, runs: pd.DataFrame, steps: int) -> None:
    """Keep one row per (variant, seed) of the MovingDot table in the CSV ``path``: final
    distance (px), true return, last validation accuracy, wall-clock and CPU seconds, the
    date, commit, machine and command; a row of the same (variant, seed, steps) is replaced.
    The provenance is the run's own (its ``provenance.json``, in a ``provenance`` column of
    ``runs``: the date it started, each commit it ran under, its machine and command); a row
    without one (the random policy, evaluated here) gets this invocation's."""
    import datetime

    here = {"date": datetime.date.today().isoformat(), "commits": [_commit()],
            "machine": records.machine(),
            "command": "python benchmarks/bench_drlhp.py " + " ".join(sys.argv[1:])}
    own = [p if isinstance(p, dict) else here for p in runs.get(
        "provenance", pd.Series([None] * len(runs), index=runs.index))]
    rows = pd.DataFrame({
        "variant": variant, "seed": runs["seed"], "steps": steps,
        "final_distance": runs["final_distance"].round(2),
        "true_return": runs["true_return"].round(2),
        "val_accuracy": runs["val_accuracy"].round(3),
        "wall_s": runs["wall_s"].round(0), "cpu_s": runs["cpu_s"].round(0),
        "date": [p["date"] for p in own], "commit": [" ".join(p["commits"]) for p in own],
        "machine": [p["machine"] for p in own], "command": [p["command"] for p in own]})
    records.merge_rows(path, rows.to_dict("records"), ["variant", "seed", "steps"])


PONG_LABELS = {"ppo_true": "PPO, true reward", "a2c_true": "A2C, true reward",
               "ppo_oracle": "PrefPPO + DRLHP recipe, oracle",
               "a2c_oracle": "PrefA2C + DRLHP recipe, oracle"}


def pong_final(run: Path) -> dict[str, float]:
    """A Pong run's result: its last step, the final true score (mean true return of its last
    10 training episodes, ``train.csv``), the last evaluation, r̂'s last held-out accuracy and
    correlation (``reward.csv``), and CPU and wall seconds: the agent's process
    (``timing.json``, from ``wait4``, summed over the launches that ended: a launch killed with
    its session is missing), the background learner's (``learner_cpu.json``, its own process
    time over resumes) and the run's own (``run_time.json``, written with each checkpoint,
    resumed segments included: ``run_wall_s``, ``run_cpu_s``; NaN for a run whose checkpoints
    predate it)."""
    train = pd.read_csv(run / "train.csv")
    episodes = train.dropna(subset=["episode_reward"]).drop_duplicates("episode", keep="last")
    evals = pd.read_csv(run / "eval.csv")
    out = {"step": int(train["step"].max()),
           "final_score": float(episodes["episode_reward"].tail(10).mean()),
           "last_eval": float(evals["episode_reward"].iloc[-1]),
           "heldout_accuracy": float("nan"), "heldout_pearson": float("nan")}
    if (run / "reward.csv").is_file():
        rounds = pd.read_csv(run / "reward.csv")
        for key in ("heldout_accuracy", "heldout_pearson"):
            if key in rounds and rounds[key].notna().any():
                out[key] = float(rounds[key].dropna().iloc[-1])
    timing = json.loads((run / "timing.json").read_text()) \
        if (run / "timing.json").is_file() else {"wall_s": float("nan"), "cpu_s": float("nan")}
    learner = json.loads((run / "learner_cpu.json").read_text()) \
        if (run / "learner_cpu.json").is_file() else {"cpu_s": 0.0}
    own = json.loads((run / "run_time.json").read_text()) \
        if (run / "run_time.json").is_file() else {"wall_s": float("nan"), "cpu_s": float("nan")}
    return {**out, "wall_s": timing["wall_s"], "agent_cpu_s": timing["cpu_s"],
            "learner_cpu_s": float(learner["cpu_s"]), "run_wall_s": float(own["wall_s"]),
            "run_cpu_s": float(own["cpu_s"])}


def record_pong(path: Path, out: Path, variants: list[str], seeds: list[int],
                steps: int) -> None:
    """One row per finished (variant, seed) Pong run in the CSV ``path`` (:func:`pong_final`
    and the date, commit, machine and command of the run); a row of the same (variant, seed,
    steps) is replaced."""
    import datetime

    rows = []
    for variant in variants:
        for seed in seeds:
            run = out / "pong" / variant / f"seed{seed}"
            if not finished(run, steps):
                continue
            prov = json.loads((run / "provenance.json").read_text()) \
                if (run / "provenance.json").is_file() else {
                    "date": datetime.date.fromtimestamp(
                        (run / "eval.csv").stat().st_mtime).isoformat(),
                    "commits": [_commit()], "machine": records.machine(),
                    "command": "python benchmarks/bench_drlhp.py " + " ".join(sys.argv[1:])}
            rows.append({"variant": variant, "seed": seed, "steps": steps, **pong_final(run),
                         "date": prov["date"], "commit": " ".join(prov["commits"]),
                         "machine": prov["machine"], "command": prov["command"]})
    if not rows:
        return
    merge_rows(path, rows, ["variant", "seed", "steps"])
    print(f"recorded {len(rows)} Pong run(s) in {path}")


merge_rows = records.merge_rows
"""Write rows into a record CSV, a row of the same key replacing its old one
(:func:`records.merge_rows`)."""


CURVE_EVERY = 100_000
"""Agent steps between the rows of a Pong run's curve record (:func:`record_curves`)."""


CURVE_ROUNDS = 5
"""Feedback rounds whose held-out measurements a curve row averages (:func:`curve_rows`)."""


def curve_rows(run: Path, every: int = CURVE_EVERY) -> list[dict[str, float]]:
    """A run's training curve from its own ``train.csv``, one row per ``every`` agent steps:
    the mean true return of the last 10 episodes ended by then (``return_last10``) and the
    mean policy entropy of those rows (nats; a uniform policy over Pong's 6 actions has
    ln 6 = 1.792). A run that learns its reward adds, from its ``reward.csv``, r̂'s accuracy
    on each round's new labels before it trained on them and the Pearson correlation of r̂'s
    and the true segment returns on them (``heldout_accuracy``, ``heldout_pearson``), each the
    mean of the last :data:`CURVE_ROUNDS` rounds by then that measured it (NaN before any)."""
    train = pd.read_csv(run / "train.csv")
    train = train[train["episode_reward"].notna()]
    rounds = pd.read_csv(run / "reward.csv") if (run / "reward.csv").is_file() else None
    rows = []
    for step in range(every, int(train["step"].max()) + 1, every):
        done = train[train["step"] <= step].tail(10)
        if len(done):
            entropy = float(done["entropy"].mean()) if "entropy" in done else float("nan")
            row = {"step": step, "return_last10": round(float(done["episode_reward"].mean()), 3),
                   "entropy": round(entropy, 4)}
            if rounds is not None:
                by_then = rounds[rounds["step"] <= step]
                for column in ("heldout_accuracy", "heldout_pearson"):
                    measured = by_then[column].dropna().tail(CURVE_ROUNDS)
                    row[column] = round(float(measured.mean()), 4) if len(measured) \
                        else float("nan")
            rows.append(row)
    return rows


def record_curves(path: Path, out: Path, variants: list[str], seeds: list[int]) -> None:
    """Each Pong run's curve so far (:func:`curve_rows`), finished or not, in the CSV ``path``
    with the run's own date, commit, machine and command: the measurement the agent was chosen
    from. Rows of the same (variant, seed, step) are replaced, and a (variant, seed) holds one
    run: the rows of an earlier run of it (another start date), the steps the new run has not
    reached yet included, are removed."""
    rows = []
    for variant in variants:
        for seed in seeds:
            run = out / "pong" / variant / f"seed{seed}"
            if not (run / "train.csv").is_file() or not (run / "provenance.json").is_file():
                continue
            prov = json.loads((run / "provenance.json").read_text())
            rows += [{"variant": variant, "seed": seed, **row, "date": prov["date"],
                      "commit": " ".join(prov["commits"]), "machine": prov["machine"],
                      "command": prov["command"]} for row in curve_rows(run)]
    if not rows:
        return
    if path.is_file():  # drop the rows of an earlier run of each (variant, seed) recorded now
        kept = pd.read_csv(path)
        runs = {(r["variant"], r["seed"]): r["date"] for r in rows}
        same = [runs.get((v, s), d) == d for v, s, d in
                zip(kept["variant"], kept["seed"], kept["date"], strict=True)]
        if not all(same):
            kept[same].to_csv(path, index=False)
    merge_rows(path, rows, ["variant", "seed", "step"])
    print(f"recorded the curves of {len({(r['variant'], r['seed']) for r in rows})} Pong "
          f"run(s) in {path}")


def _commit() -> str:
    """The checkout's commit, ``-dirty`` when tracked files differ from it
    (:func:`records.commit`)."""
    return records.commit(ROOT)


def pong_table(out: Path, variants: list[str], seeds: list[int], steps: int) -> None:
    """Pong: the true score of each variant at each evaluation, and ``curve.png``."""
    curves = {}
    for variant in variants:
        frames = [pd.read_csv(out / "pong" / variant / f"seed{s}" / "eval.csv")
                  .assign(seed=s) for s in seeds
                  if (out / "pong" / variant / f"seed{s}" / "eval.csv").is_file()]
        if frames:
            curves[variant] = pd.concat(frames).groupby("step")["episode_reward"].mean()
    if not curves:
        print("\nPong: no run has evaluated yet")
        return
    table = pd.DataFrame(curves)
    over = f", mean over seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else ""
    print(f"\nPong (PongNoFrameskip-v4), true score by step (eval.csv{over}); {steps} steps "
          "planned\n")
    print("| step | " + " | ".join(table.columns) + " |")
    print("|---|" + "---|" * len(table.columns))
    for step, row in table.iterrows():
        print(f"| {step} | " + " | ".join("-" if np.isnan(v) else f"{v:.1f}" for v in row)
              + " |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for variant, curve in curves.items():
        ax.plot(curve.index, curve.values, label=PONG_LABELS[variant])
    ax.set_xlabel("agent steps")
    ax.set_ylabel("true score")
    ax.set_title("Pong from an oracle teacher")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "pong" / "curve.png", dpi=120)
    print(f"\ncurve: {out / 'pong' / 'curve.png'}")


COMMANDS = """\
Paper scale (Christiano et al. 2017: 50M timesteps; mrahtz: Pong in 20M, 16 envs, dropout 0.5), on
a GPU, resumable with resume=RUN_DIR:

  ./themis_train.sh domain=ALE env=PongNoFrameskip-v4 +recipe=drlhp num_train_steps=20000000 \\
      ppo.num_envs=16 max_feedback=5500 num_interact=100000 \\
      eval_frequency=500000 num_eval_episodes=5 device=cuda
  ./themis_train.sh domain=ALE env=PongNoFrameskip-v4 learn_reward=false num_unsup_steps=0 \\
      num_train_steps=20000000 ppo.num_envs=16 eval_frequency=500000 num_eval_episodes=5 \\
      device=cuda

Enduro with people (labelers open the printed links; the run trains on the answers that arrived
at each round, DRLHP's 500 labels first: min_labels_before_training=500):

  ./themis_train.sh domain=ALE env=EnduroNoFrameskip-v4 +recipe=drlhp human_teacher=true \\
      teacher_ui=web labelers=3 label_host=0.0.0.0 label_port=8765 max_feedback=2000 \\
      num_train_steps=2000000 ppo.num_envs=16 min_labels_before_training=500 \\
      label_instructions="Prefer the clip where the car passes more cars and stays on the road" \\
      device=cuda

The same, tried end to end with two bot labelers at a tiny budget (the bots answer by the true
return through the labeling page's HTTP API):

  python scripts/simulate_crowd.py --careful 2 --random 0 --adversaries 0 \\
      --labels-per-query 1 --gold-fraction 0 --modes none --out runs/enduro_bots -- \\
      domain=ALE env=EnduroNoFrameskip-v4 +recipe=drlhp num_train_steps=2048 \\
      num_seed_steps=0 num_unsup_steps=512 num_interact=512 max_feedback=24 reward_batch=8 \\
      query_schedule=constant ppo.num_envs=2 ppo.num_steps=64 reward_update=2 \\
      eval_frequency=2048 num_eval_episodes=1 +env_kwargs.max_num_frames_per_episode=1000
"""


SPEED_ROWS = (  # (name, reward_net, shared trunk, dropout, batch norm, precision)
    ("Themis's recipe before (Nature CNN + 3x256 MLP, BN/dropout everywhere)", "bpref", False,
     0.5, True, "fp32"),
    ("the same, bf16", "bpref", False, 0.5, True, "bf16"),
    ("DRLHP's network (BN/dropout on the convs), channels_last", "drlhp", False, 0.5, True,
     "fp32"),
    ("the same, bf16", "drlhp", False, 0.5, True, "bf16"),
    ("DRLHP's network, one shared trunk, bf16", "drlhp", True, 0.5, True, "bf16"),
    ("mrahtz's MovingDot features (no CNN)", "drlhp_dot", False, 0.0, False, "fp32"),
)


def speed_table(frames: int, reps: int) -> None:
    """CPU milliseconds per frame of a 3-member reward model on 84×84×4 frames, one thread:
    a training step (forward, backward, Adam; per frame and member, each member its own
    minibatch as in reward training) and scoring (eval mode, per frame, every member: query
    selection, the agent's reward). CPU time, not wall-clock (``time.process_time``), so that
    other processes on the machine do not count."""
    import time

    import torch

    from themis.reward import RewardEnsemble

    torch.set_num_threads(1)
    print(f"\nReward model on 84×84×4 frames, 3 members, one thread, CPU ms per frame "
          f"({frames} frames per call, {reps} calls; {torch.backends.cpu.get_cpu_capability()})"
          "\n")
    print("| network | parameters per member | train (ms per frame and member) | "
          "score (ms per frame, all members) |")
    print("|---|---|---|---|")
    for name, net, shared, dropout, batchnorm, precision in SPEED_ROWS:
        torch.manual_seed(0)
        model = RewardEnsemble(4 * 84 * 84, 6, 3, obs_shape=(4, 84, 84), net=net,
                               shared_trunk=shared, dropout=dropout, batchnorm=batchnorm)
        model.precision = torch.bfloat16 if precision == "bf16" else None
        obs = torch.randint(0, 255, (3, frames, 4 * 84 * 84), dtype=torch.uint8)
        act = torch.eye(6)[torch.randint(0, 6, (3, frames))]
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-4)
        model.train()
        for i in range(reps + 1):
            if i == 1:
                start = time.process_time()
            optimizer.zero_grad()
            model(obs, act).sum().backward()
            optimizer.step()
        train = (time.process_time() - start) / reps / frames / 3 * 1000
        model.eval()
        with torch.no_grad():
            for i in range(reps + 1):
                if i == 1:
                    start = time.process_time()
                model(obs[0], act[0])
        score = (time.process_time() - start) / reps / frames * 1000
        params = sum(p.numel() for p in model.parameters()) // 3
        print(f"| {name} | {params:,} | {train:.3f} | {score:.3f} |", flush=True)


def agent_cost(agent: str, steps: int) -> float:
    """CPU seconds per 10k agent steps of ``agent`` (``a2c``: 16 envs, ``ppo``: 8, as the Pong
    runs; one thread) on ``PongNoFrameskip-v4`` with the true reward: stepping the envs, acting
    and the updates, over at least ``steps`` steps after one warm-up rollout."""
    import time

    import torch

    from themis.agents import A2C, PPO, A2CConfig, PPOConfig
    from themis.agents.ppo import Rollout
    from themis.run.config import compose
    from themis.run.envs import make_vector_env

    torch.set_num_threads(1)
    cfg = compose(["domain=ALE", "env=PongNoFrameskip-v4", "seed=0", f"agent={agent}",
                   "a2c.num_envs=16", "ppo.num_envs=8"])  # the launcher's config, as the runs
    envs = make_vector_env(cfg)
    settings = A2CConfig(num_envs=16) if agent == "a2c" else PPOConfig(num_envs=8, clip_coef=0.1)
    obs, _ = envs.reset(seed=0)
    net = (A2C if agent == "a2c" else PPO)(obs.shape[1:], 6, torch.device("cpu"),
                                           settings)  # type: ignore[arg-type]
    horizon, n = settings.num_steps, settings.num_envs
    done_steps, start = 0, 0.0
    while done_steps < steps + horizon * n:
        if done_steps == horizon * n:
            start = time.process_time()
        buf = [np.zeros((horizon, n, *shape), dtype) for shape, dtype in
               ((obs.shape[1:], obs.dtype), ((), np.int64), ((), np.float32), ((), np.float32),
                ((), np.float32), ((), np.float32))]
        for t in range(horizon):
            act, logp, val = net.step(obs)
            buf[0][t], buf[1][t], buf[2][t], buf[3][t] = obs, act, logp, val
            obs, reward, term, trunc, _ = envs.step(act)
            buf[4][t], buf[5][t] = reward, term | trunc
        net.update(Rollout(*buf, net.value(obs)))
        done_steps += horizon * n
    envs.close()
    return (time.process_time() - start) / (done_steps - horizon * n) * 10_000


def reward_cost(threads: int, reps: int = 3, compiled: bool = False,
                precision: str = "fp32") -> tuple[float, float]:
    """CPU seconds of DRLHP's reward model (3 members) with ``threads`` threads: per
    label-pass of training (a minibatch of 32 pairs of 25-step segments per member, forward,
    backward and Adam, divided by 32) and per agent step of scoring (r̂ of a rollout);
    ``compiled``: the encoders compiled as ``reward_compile=true`` does (the compilation itself
    is not timed); ``precision``: the run's key (``auto`` is bfloat16 on CPUs with bf16
    instructions, :mod:`themis.core.precision`)."""
    import time

    import torch

    from themis.core.precision import resolve_precision
    from themis.reward import RewardEnsemble

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = RewardEnsemble(4 * 84 * 84, 6, 3, obs_shape=(4, 84, 84), net="drlhp",
                           dropout=0.5, batchnorm=True)
    model.precision = resolve_precision(precision, torch.device("cpu"))
    frames = 32 * 2 * 25
    obs = torch.randint(0, 255, (3, frames, 4 * 84 * 84), dtype=torch.uint8)
    act = torch.eye(6)[torch.randint(0, 6, (3, frames))]
    if compiled:
        for encoder in model.encoders or []:
            encoder.compile()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4)
    model.train()
    clock = time.perf_counter if threads > 1 else time.process_time  # CPU time of one thread
    for i in range(reps + 2 if compiled else reps + 1):
        if compiled and i == 1:
            start = clock()  # the first step compiled
        if i == 1 + compiled:
            start = clock()
        optimizer.zero_grad()
        model(obs, act).sum().backward()
        optimizer.step()
    per_pass = (clock() - start) / reps / 32
    model.eval()
    with torch.no_grad():
        for i in range(reps + 1 + compiled):
            if i == 1 + compiled:
                start = clock()
            model(obs[0, :2048], act[0, :2048])
    per_step = (clock() - start) / reps / 2048
    return per_pass, per_step


def cost_table(steps: int, passes_per_step: float = 0.1, pretrain_passes: int = 100_000,
               record: Path | None = None) -> None:
    """The pieces of a Pong run with DRLHP's recipe, measured here and now, and the projected
    wall time of ``steps`` agent steps: pretraining (200 epochs on 500 labels = 100k
    label-passes, on both cores), then per agent step the agent, r̂ of its rollouts and
    0.1 label-passes of training, laid out as the run lays them: ``async`` (the reward model
    on its own core: the slower of the two lanes sets the pace) or ``sync`` (both in one
    process on two threads). ``record``: the pieces as rows of this CSV (piece, threads, CPU
    seconds per 10k agent steps, date, commit, machine, command), added to its rows."""
    import datetime

    import torch

    from themis.core.precision import resolve_precision

    one_pass, score = reward_cost(1)
    two_pass, two_score = reward_cost(2)
    fast_pass, fast_score = reward_cost(1, compiled=True)
    bf16 = resolve_precision("auto", torch.device("cpu")) is not None  # what a run computes in
    if bf16:
        bf16_pass, bf16_score = reward_cost(1, compiled=True, precision="auto")
    print(f"\nPong with DRLHP's recipe: measured pieces (CPU s per 10k agent steps, one thread; "
          f"{passes_per_step} label-passes per step)\n")
    print("| piece | 1 thread | 2 threads (wall) |")
    print("|---|---|---|")
    train = passes_per_step * 10_000
    print(f"| reward training ({train:.0f} label-passes) | {one_pass * train:.1f} | "
          f"{two_pass * train:.1f} |")
    print(f"| r̂ of the rollouts | {score * 1e4:.1f} | {two_score * 1e4:.1f} |")
    print(f"| reward training, compiled (`reward_compile=true`) | {fast_pass * train:.1f} | - |")
    print(f"| r̂ of the rollouts, compiled | {fast_score * 1e4:.1f} | - |")
    if bf16:
        print(f"| reward training, compiled, bf16 (`precision=auto` here) | "
              f"{bf16_pass * train:.1f} | - |")
        print(f"| r̂ of the rollouts, compiled, bf16 | {bf16_score * 1e4:.1f} | - |")
    agents = {agent: agent_cost(agent, 4096) for agent in ("a2c", "ppo")}
    for agent, cost in agents.items():
        print(f"| {agent.upper()} ({16 if agent == 'a2c' else 8} envs: stepping, acting, "
              f"updates) | {cost:.1f} | - |")
    if record is not None:
        pieces = [("reward training", 1, one_pass * train),
                  ("reward training", 2, two_pass * train),
                  ("reward scoring", 1, score * 1e4), ("reward scoring", 2, two_score * 1e4),
                  ("reward training, compiled", 1, fast_pass * train),
                  ("reward scoring, compiled", 1, fast_score * 1e4),
                  *((("reward training, compiled, bf16", 1, bf16_pass * train),
                     ("reward scoring, compiled, bf16", 1, bf16_score * 1e4)) if bf16 else ()),
                  *((f"{agent} agent", 1, cost) for agent, cost in agents.items())]
        rows = pd.DataFrame([{"piece": piece, "threads": threads,
                              "s_per_10k_steps": round(value, 2),
                              "date": datetime.date.today().isoformat(), "commit": _commit(),
                              "machine": records.machine(),
                              "command": "python benchmarks/bench_drlhp.py "
                                         + " ".join(sys.argv[1:])}
                             for piece, threads, value in pieces])
        old = pd.read_csv(record) if record.is_file() else None
        record.parent.mkdir(parents=True, exist_ok=True)
        pd.concat([old, rows]).to_csv(record, index=False)
    pretrain = pretrain_passes * two_pass / 3600
    print(f"\npretraining ({pretrain_passes} label-passes, 2 threads): {pretrain:.2f} h")
    for agent, cost in agents.items():
        lanes = [("", one_pass, score), (", compiled", fast_pass, fast_score)]
        if bf16:  # what the run computes in on this CPU (precision=auto)
            lanes.append((", compiled, bf16", bf16_pass, bf16_score))
        for label, learn, scoring in lanes:
            lane = (cost + scoring * 1e4, learn * train)  # agent + r̂, reward training
            hours = pretrain + steps / 10_000 * max(lane) / 3600
            print(f"{agent.upper()}, {steps / 1e6:g}M steps, async{label} (agent | reward "
                  f"model): {hours:.1f} h wall (lanes {lane[0]:.0f} | {lane[1]:.0f} s per 10k "
                  f"steps; the agent waits {max(0.0, 1 - lane[0] / lane[1]):.0%} of the time)")
        both = cost / 1.3 + two_pass * train + two_score * 1e4  # all on two threads
        print(f"{agent.upper()}, {steps / 1e6:g}M steps, sync on two threads: "
              f"{pretrain + steps / 10_000 * both / 3600:.1f} h wall (about {both:.0f} s per "
              "10k steps, the agent's own part taken 1.3× faster on two threads)")


def trunk_table(labels: int, heldout: int, epochs: int, seed: int) -> None:
    """Separate members against one shared trunk with a head per member (``reward_net=drlhp``,
    the recipe's trainer: bootstrap, 10 % random response, BN and dropout 0.5, Adam 2e-4,
    batches of 32), trained ``epochs`` epochs on ``labels`` oracle-labelled pairs of 25-step
    MovingDot segments from a random policy; on ``heldout`` other pairs: the ensemble's
    accuracy, the members' disagreement (std of their P[σ² ≻ σ¹]) on all pairs and on the
    ones it gets wrong against right (disagreement sampling needs the wrong ones to stand
    out), training CPU seconds."""
    import time

    import torch

    from themis.agents.buffers import SegmentPairs
    from themis.environments.domains import make_env
    from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer
    from themis.reward.recipe import BootstrapCounts

    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    env = make_env("MovingDot", "MovingDotNoFrameskip-v0", seed=seed)
    obs_dim = int(np.prod(env.observation_space.shape))
    segs, rews, acts = [], [], []
    while len(segs) < 2 * (labels + heldout):  # 25-step segments of random-policy episodes
        obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
        o, r, a, done = [], [], [], False
        while not done:
            action = int(rng.integers(5))
            o.append(obs.reshape(-1))
            a.append(np.eye(5, dtype=np.float32)[action])
            obs, reward, terminated, truncated, _ = env.step(action)
            r.append(float(reward))
            done = terminated or truncated
        for lo in range(0, len(o) - 25 + 1, 25):
            segs.append(np.stack(o[lo:lo + 25]))
            acts.append(np.stack(a[lo:lo + 25]))
            rews.append(np.array(r[lo:lo + 25], np.float32))
    order = rng.permutation(len(segs))[: 2 * (labels + heldout)].reshape(-1, 2)
    pairs = SegmentPairs(np.stack([[segs[i], segs[j]] for i, j in order]),
                         np.stack([[acts[i], acts[j]] for i, j in order]),
                         np.stack([[rews[i], rews[j]] for i, j in order]),
                         np.zeros((len(order), 2), np.int64))
    true = pairs.true_rewards.sum(-1)
    y = (true[:, 1] > true[:, 0]).astype(np.float32) + 0.5 * (true[:, 1] == true[:, 0])
    train_pairs, test_pairs = pairs.take(np.arange(labels)), pairs.take(
        np.arange(labels, labels + heldout))
    print(f"\nShared trunk against separate members: {labels} labelled pairs of 25-step "
          f"MovingDot segments (random policy, oracle), {epochs} epochs, {heldout} held-out "
          f"pairs, seed {seed}, one thread\n")
    print("| reward model | parameters | held-out accuracy | disagreement (mean std of P) | "
          "disagreement on wrong / right pairs | training CPU s |")
    print("|---|---|---|---|---|---|")
    for shared in (False, True):
        torch.manual_seed(seed)
        data = PreferenceDataset(labels, 25, obs_dim, 5, obs_dtype=np.uint8, frame_stack=1)
        data.add(train_pairs, y[:labels])
        model = RewardEnsemble(obs_dim, 5, 3, obs_shape=tuple(env.observation_space.shape),
                               net="drlhp", dropout=0.5, batchnorm=True, shared_trunk=shared)
        trainer = RewardTrainer(model, lr=2e-4, batch_size=32, rng=np.random.default_rng(seed),
                                random_response=0.1, bootstrap=BootstrapCounts(3, seed),
                                target_accuracy=np.inf)
        start = time.process_time()
        trainer.train(data, epochs)
        spent = time.process_time() - start
        p = model.eval().preference_probabilities(test_pairs.observations,
                                                  test_pairs.actions)  # (E, n)
        strict = y[labels:] != 0.5
        wrong = ((p.mean(0) > 0.5) != (y[labels:] > 0.5)) & strict
        spread = p.std(0)
        ratio = spread[wrong].mean() / max(spread[strict & ~wrong].mean(), 1e-12)
        print(f"| {'one shared trunk' if shared else 'separate members'} | "
              f"{sum(q.numel() for q in model.parameters()):,} | "
              f"{1 - wrong[strict].mean():.3f} | {spread.mean():.3f} | {ratio:.2f} | "
              f"{spent:.0f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["dot", "pong", "cost", "speed", "trunk", "commands"])
    parser.add_argument("--variants", nargs="+", help="dot: a subset of "
                        + ", ".join(DOT_VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--steps", type=int, help="dot: 150000, pong: 2000000")
    parser.add_argument("--queries", type=int, help="oracle queries (dot: 1000, pong: 1500)")
    parser.add_argument("--episodes", type=int, default=10, help="dot: evaluation episodes")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0,
                        help="PyTorch threads per run (default: cores / jobs)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_drlhp")
    parser.add_argument("--quick", action="store_true", help="a smoke run's small schedule")
    parser.add_argument("--record", type=Path, metavar="CSV",
                        help="keep each finished run's row in this CSV (dot: "
                        "results/drlhp_dot.csv; pong: results/drlhp_pong.csv, the measured "
                        "pieces in drlhp_pong_cost.csv and every run's curve so far in "
                        "drlhp_pong_curves.csv beside it)")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: the table of the runs finished so far")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_intermixed_args(argv)  # overrides after -- reach "extra"
    if args.part == "commands":
        print(COMMANDS)
        return 0
    if args.part == "speed":
        speed_table(frames=800, reps=3)
        return 0
    if args.part == "cost":
        cost_table(args.steps or 3_000_000, record=args.record)
        return 0
    if args.part == "trunk":
        trunk_table(labels=args.queries or 400, heldout=200, epochs=args.episodes,
                    seed=(args.seeds or [0])[0])
        return 0
    if args.jobs < 1 or (args.steps is not None and args.steps < 1024):
        print("bench_drlhp: error: --jobs must be >= 1 and --steps >= 1024", file=sys.stderr)
        return 2
    known = DOT_VARIANTS if args.part == "dot" else PONG_VARIANTS
    bad = sorted(set(args.variants or []) - set(known))
    if bad:
        print(f"bench_drlhp: error: unknown {args.part} variant {bad[0]}; use "
              f"{', '.join(known)}", file=sys.stderr)
        return 2
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    if args.part == "dot":
        steps, seeds = args.steps or 150_000, args.seeds or [0, 1, 2]
        queries, variants = args.queries or 1000, args.variants or list(DOT_DEFAULT)
        cells = [(args.out / "dot" / v / f"seed{s}",
                  [*dot_overrides(v, steps, s, queries, args.quick), *args.extra])
                 for v in variants for s in seeds if v != "random"]
        failed = run_grid(cells, steps, args.jobs, threads, args.table_only)
        dot_table(args.out, variants, seeds, steps, args.episodes, args.record)
    else:
        steps, seeds = args.steps or 3_000_000, args.seeds or [0]
        queries, variants = args.queries or 1500, list(args.variants or PONG_DEFAULT)
        cells = [(args.out / "pong" / v / f"seed{s}",
                  [*pong_overrides(v, steps, s, queries, args.quick), *args.extra])
                 for v in variants for s in seeds]
        fresh = [run for run, _ in cells if "oracle" in run.parent.name
                 and not finished(run, steps) and not (run / "checkpoints").exists()]
        if fresh and not args.table_only and not args.quick:  # the pieces, then the projection
            # (measured once, before an oracle run starts; a resumed run goes straight on)
            cost_table(steps, record=args.record.with_name(args.record.stem + "_cost.csv")
                       if args.record else None)
        failed = run_grid(cells, steps, args.jobs, threads, args.table_only)
        pong_table(args.out, variants, seeds, steps)
        if args.record:
            record_pong(args.record, args.out, variants, seeds, steps)
            record_curves(args.record.with_name(args.record.stem + "_curves.csv"), args.out,
                          variants, seeds)
    print("\n" + COMMANDS)
    if failed:
        print(f"{len(failed)} runs failed; see their .log files", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
