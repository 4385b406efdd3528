#!/usr/bin/env python
"""How often a vision-language model agrees with the oracle on MuJoCo clips (teacher=vlm).

    THEMIS_VLM_API_KEY=... python benchmarks/bench_vlm.py \\
        --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-VL-7B-Instruct
    python benchmarks/bench_vlm.py --base-url URL --model NAME --frames key --pairs 200
    python benchmarks/bench_vlm.py --base-url URL --model NAME --learn-steps 20000

A fixed set of segment pairs (the same for every model and every run: seeded) is cut from
HalfCheetah-v5 episodes rendered ``--size`` px square (or another continuous-action env whose
goal themis/feedback/vlm_prompt.py ``TASKS`` knows: ``--domain DMC --env walker_walk``, ``--domain
MetaWorld --env door-open-v3``), each episode driven by its own random bias plus noise so that
the segments' true returns spread; pairs whose true returns are equal are left out. Each
pair's frames go to the endpoint as a run would send them
(:class:`themis.feedback.vlm.VLMTeacher`, RL-VLM-F's two-stage prompt, ``--frames``), and its
answer is compared with the oracle's (the higher true return). The answers are cached in
``OUT/vlm_answers.jsonl``: a second invocation with the same model, prompt and pairs pays
nothing.

Recorded in ``--record`` (default ``results/vlm_agreement.csv``), one row per invocation: date,
commit, machine, command, wall seconds, model, frames, pairs, agreement (share of the pairs the
VLM labelled that match the oracle), the share it could not tell, requests, prompt and
completion tokens, the endpoint-reported cost (empty where it reports none) and, with
``--learn-steps``, the final true return and mean ``vlm_oracle_agreement`` of a short
``teacher=vlm`` learning run on the same env.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # records: a recorded row's provenance
import records  # noqa: E402  # isort: skip


def clips(domain: str, name: str, episodes: int, steps: int, size: int,
          seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``episodes`` episodes of ``steps`` steps (fewer where one ends: it starts again): frames
    ``(e, steps, size, size, 3)`` uint8 and true rewards ``(e, steps)``; episode ``i`` acts
    ``clip(b_i + 0.3 ε)`` with a bias ``b_i ~ U(-1, 1)`` of its own (a continuous-action env;
    seeded: the same clips every time)."""
    from PIL import Image

    from themis.environments.domains import make_env
    from themis.environments.mujoco import choose_gl_backend

    choose_gl_backend()
    rng = np.random.default_rng(seed)
    env = make_env(domain, name, seed=seed, render_mode="rgb_array", render_size=size)
    low, high = env.action_space.low, env.action_space.high
    frames = np.zeros((episodes, steps, size, size, 3), np.uint8)
    rewards = np.zeros((episodes, steps), np.float32)
    for e in range(episodes):
        env.reset(seed=seed + e)
        bias = rng.uniform(-1, 1, size=low.shape)
        for t in range(steps):
            action = np.clip(bias + 0.3 * rng.standard_normal(low.shape), low, high)
            _, reward, terminated, truncated, _ = env.step(action.astype(np.float32))
            frame = np.asarray(env.render())
            if frame.shape[:2] != (size, size):  # envs other than MuJoCo's: their own size
                frame = np.asarray(Image.fromarray(frame).resize((size, size)))
            frames[e, t] = frame
            rewards[e, t] = reward
            if terminated or truncated:
                env.reset(seed=seed + 1000 * (t + 1) + e)
    env.close()
    return frames, rewards


def fixed_pairs(frames: np.ndarray, rewards: np.ndarray, n: int, segment: int,
                seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pairs of ``segment``-step segments with unequal true returns: frames ``(n, 2,
    segment, h, w, 3)`` and true rewards ``(n, 2, segment)``."""
    rng = np.random.default_rng(seed + 1)
    episodes, steps = rewards.shape
    out_frames, out_rewards = [], []
    while len(out_frames) < n:
        ep = rng.integers(0, episodes, size=2)
        t0 = rng.integers(0, steps - segment + 1, size=2)
        r = np.stack([rewards[ep[k], t0[k]:t0[k] + segment] for k in range(2)])
        if r[0].sum() == r[1].sum():
            continue
        out_rewards.append(r)
        out_frames.append(np.stack([frames[ep[k], t0[k]:t0[k] + segment] for k in range(2)]))
    return np.stack(out_frames), np.stack(out_rewards)


def learning_run(args: argparse.Namespace, out: Path) -> dict[str, float]:
    """A short ``teacher=vlm`` run on the env: its final true return and mean
    ``vlm_oracle_agreement``."""
    run = out / f"learn_{args.env}_{args.learn_steps}"
    overrides = [f"domain={args.domain}", f"env={args.env}", "teacher=vlm",
                 f"vlm_base_url={args.base_url}", f"vlm_model={args.model}",
                 f"vlm_frames={args.frames}",
                 f"human_frame_size={args.size}", f"num_train_steps={args.learn_steps}",
                 f"num_seed_steps={min(1000, args.learn_steps // 10)}",
                 f"num_unsup_steps={min(5000, args.learn_steps // 5)}",
                 f"num_interact={max(args.learn_steps // 20, 100)}",
                 f"max_feedback={args.learn_feedback}", f"segment={args.segment}",
                 f"eval_frequency={max(args.learn_steps // 4, 100)}", *args.extra,
                 f"hydra.run.dir={run}"]
    if (run / "checkpoints" / "state.pt").is_file():
        overrides.append("resume=true")
    code = subprocess.call([str(ROOT / "themis_train.sh"), *overrides], cwd=ROOT)
    if code != 0:
        raise SystemExit(f"bench_vlm: the learning run ended with exit code {code}")
    evals = pd.read_csv(run / "eval.csv")
    rounds = pd.read_csv(run / "reward.csv")
    return {"learn_steps": args.learn_steps,
            "learn_final_return": float(evals["episode_reward"].iloc[-1]),
            "learn_vlm_oracle_agreement": float(rounds["vlm_oracle_agreement"].mean())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True, help="the OpenAI-compatible endpoint")
    parser.add_argument("--model", required=True, help="the model name it serves")
    parser.add_argument("--domain", default="Control")
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--segment", type=int, default=50)
    parser.add_argument("--frames", default="last", choices=("last", "key"))
    parser.add_argument("--size", type=int, default=256, help="frame size in pixels")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--episode-steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--learn-steps", type=int, default=0,
                        help="also a teacher=vlm learning run of this many steps")
    parser.add_argument("--learn-feedback", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_vlm")
    parser.add_argument("--record", type=Path, default=ROOT / "results" / "vlm_agreement.csv")
    parser.add_argument("extra", nargs="*", help="overrides of the learning run")
    args = parser.parse_args(argv)
    if args.episode_steps < args.segment:
        parser.error(f"--episode-steps {args.episode_steps} is shorter than --segment")

    from themis.feedback.channels import oracle_agreement
    from themis.feedback.vlm import VLMStats, VLMTeacher, make_client
    from themis.feedback.vlm_cache import CACHE_FILE, AnswerCache
    from themis.feedback.vlm_prompt import load_prompt, task_description
    from themis.reward.preference_models import true_preference

    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    frames, rewards = clips(args.domain, args.env, args.episodes, args.episode_steps, args.size,
                            args.seed)
    pair_frames, pair_rewards = fixed_pairs(frames, rewards, args.pairs, args.segment,
                                            args.seed)
    teacher = VLMTeacher(make_client(args.base_url, args.timeout, 5), args.model, load_prompt(),
                         task_description("", args.env), AnswerCache(args.out / CACHE_FILE),
                         args.frames, 4, args.concurrency)
    stats = VLMStats()
    answers = teacher.ask(pair_frames, stats)
    said = np.array([np.nan if a.label is None else a.label for a in answers])
    row: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "commit": records.commit(), "machine": records.machine(),
        "command": " ".join(["python", "benchmarks/bench_vlm.py", *(argv or sys.argv[1:])]),
        "model": args.model, "env": args.env, "frames": args.frames, "size": args.size,
        "pairs": args.pairs, "agreement": oracle_agreement(said, pair_rewards),
        "cant_tell": float(np.isnan(said).mean()),
        "oracle_first": float((true_preference(pair_rewards) == 0).mean()),
        "requests": stats.requests, "cache_hits": stats.cache_hits,
        "prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens,
        "cost": stats.cost if np.isfinite(stats.cost) else None,
    }
    if args.learn_steps:
        row.update(learning_run(args, args.out))
    row["wall_s"] = round(time.time() - start, 1)
    args.record.parent.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame([row])
    if args.record.is_file():
        table = pd.concat([pd.read_csv(args.record), table], ignore_index=True)
    table.to_csv(args.record, index=False)
    print(f"{args.model}: agreement with the oracle {row['agreement']:.3f} on {args.pairs} "
          f"pairs ({row['cant_tell']:.0%} can't tell), {stats.requests} requests, "
          f"{stats.prompt_tokens} + {stats.completion_tokens} tokens -> {args.record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
