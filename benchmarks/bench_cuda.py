#!/usr/bin/env python
"""The CUDA path beside the CPU one: steps per second of SAC, the PEBBLE loop, PPO on pixels
and DRLHP's reward model, on each device asked for, recorded with the machine, GPU and command.

    python benchmarks/bench_cuda.py --devices cpu cuda --record results/cuda_path.csv
    python benchmarks/bench_cuda.py --devices cpu --quick      # the test suite's smoke run

Prepared for the first session with a GPU (issue 84 item 6): the whole list takes under 8
minutes there (``--budget`` says how long each run of the training loops may take, 60 s by
default; on a 2-core CPU the CPU half alone takes about 5 minutes). Each piece runs in this
process, one after the other, with one CPU thread (``torch_threads=1``) and ``precision=fp32``:

- ``sac``: Themis SAC on HalfCheetah-v5's true reward (``learn_reward=false``), 2×128, batch
  256, one update per step: agent steps per second after the 1000 seed steps;
- ``pebble``: the PEBBLE loop on HalfCheetah-v5 with an oracle teacher (state-entropy
  pretraining, rounds of queries, reward training and relabelling every 1000 steps): agent
  steps per second after pretraining;
- ``ppo_pixels``: PPO on PongNoFrameskip-v4's true reward (8 envs × 128 steps, 4 epochs, the
  Nature CNN): agent steps per second;
- ``drlhp_reward_train`` and ``drlhp_reward_score``: DRLHP's reward network (3 members, batch
  norm, dropout 0.5) on 4 × 84 × 84 frames: label-passes per second of training (minibatches
  of 32 pairs of 25-step segments, Adam) and frames per second of scoring.

The loops' rates come from each run's own ``train.csv`` (steps and seconds since the start of
the rows after the warm-up), the reward model's from timed steps after one warm-up step, with
``torch.cuda.synchronize`` on CUDA.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # records: a recorded row's provenance
import records  # noqa: E402  # isort: skip

PIECES = ("sac", "pebble", "ppo_pixels", "drlhp_reward_train", "drlhp_reward_score")
UNITS = {"sac": "agent steps/s", "pebble": "agent steps/s", "ppo_pixels": "agent steps/s",
         "drlhp_reward_train": "label-passes/s", "drlhp_reward_score": "frames/s"}


def loop_keys(piece: str, device: str, steps: int, quick: bool = False) -> dict[str, Any]:
    """The :func:`themis.train` keys of a loop piece: ``steps`` agent steps after its warm-up
    (the first 1000 steps of SAC and PEBBLE; PPO's first 2048, its first episodes). Episodes
    are cut short (100 steps; Pong's at 1000 frames) so that ``train.csv``, one row per
    episode, times the steps densely; the cost of a step does not depend on it. ``quick``
    (the suite's check): PPO runs its first two rollouts only, in 100-step episodes."""
    common = {"device": device, "precision": "fp32", "torch_threads": 1, "seed": 0,
              "eval_frequency": 10 * steps + 10_000, "num_eval_episodes": 1,
              "save_snapshot": False}
    if piece in ("sac", "pebble"):
        common["env_kwargs"] = {"max_episode_steps": 100}
    if piece == "sac":
        return {**common, "env": "HalfCheetah-v5", "learn_reward": False, "num_unsup_steps": 0,
                "num_seed_steps": 1000, "num_train_steps": 1000 + steps}
    if piece == "pebble":
        return {**common, "env": "HalfCheetah-v5", "num_seed_steps": 500,
                "num_unsup_steps": 500, "num_train_steps": 1000 + steps, "num_interact": 1000,
                "max_feedback": 1000, "reward_batch": 50, "reward_update": 10}
    return {**common, "domain": "ALE", "env": "PongNoFrameskip-v4", "agent": "ppo",
            "learn_reward": False, "num_unsup_steps": 0, "num_seed_steps": 0,
            "ppo": {"num_envs": 8}, "num_train_steps": 2048 if quick else 2048 + steps,
            "env_kwargs": {"max_num_frames_per_episode": 400 if quick else 1000}}


def loop_rate(run_dir: Path, after: int) -> float:
    """Agent steps per second of a finished run from its ``train.csv`` rows past step
    ``after`` (``duration``: seconds since the run started)."""
    rows = pd.read_csv(run_dir / "train.csv")
    rows = rows[rows["step"] >= after]
    if len(rows) < 2:
        raise RuntimeError(f"{run_dir}: fewer than two train.csv rows after step {after}")
    first, last = rows.iloc[0], rows.iloc[-1]
    return float((last["step"] - first["step"]) / (last["duration"] - first["duration"]))


def run_loop(piece: str, device: str, steps: int, folder: Path,
             quick: bool = False) -> tuple[float, float]:
    """``(steps per second, wall seconds)`` of one loop piece on ``device``."""
    import themis

    keys = loop_keys(piece, device, steps, quick)
    start = time.perf_counter()
    run = themis.train(run_dir=folder / f"{piece}_{device}", **keys)
    wall = time.perf_counter() - start
    # PPO's 8 envs end their 250-step episodes together: its first row (about step 2000) starts
    # the timing, after the first rollouts (quick: 100-step episodes, rows at 800 and 1600)
    return loop_rate(run.run_dir, 0 if piece == "ppo_pixels" else 1000), wall


def reward_rates(device: str, reps: int, pairs: int = 32) -> tuple[float, float, float]:
    """DRLHP's reward network on ``device``: ``(label-passes per second of training, frames per
    second of scoring, wall seconds)``, training on minibatches of ``pairs`` labelled pairs
    (DRLHP's 32; the suite's check uses fewer)."""
    import torch

    from themis.reward import RewardEnsemble

    dev = torch.device(device)
    torch.manual_seed(0)
    model = RewardEnsemble(4 * 84 * 84, 6, 3, obs_shape=(4, 84, 84), net="drlhp", dropout=0.5,
                           batchnorm=True).to(dev)
    frames = pairs * 2 * 25  # a minibatch of pairs of 25-step segments, per member
    obs = torch.randint(0, 255, (3, frames, 4 * 84 * 84), dtype=torch.uint8, device=dev)
    act = torch.eye(6, device=dev)[torch.randint(0, 6, (3, frames), device=dev)]
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    began = time.perf_counter()
    model.train()
    for i in range(reps + 1):
        if i == 1:
            sync()
            start = time.perf_counter()
        optimizer.zero_grad()
        model(obs, act).sum().backward()
        optimizer.step()
    sync()
    train = reps * pairs / (time.perf_counter() - start)
    model.eval()
    scored = min(frames, 2048)
    with torch.no_grad():
        for i in range(reps + 1):
            if i == 1:
                sync()
                start = time.perf_counter()
            model(obs[0, :scored], act[0, :scored])
        sync()
    score = reps * scored / (time.perf_counter() - start)
    return train, score, time.perf_counter() - began


def machine(device: str) -> str:
    """The CPU (model, cores: ``records.machine``), and the GPU's name on CUDA."""
    cpu = records.machine()
    if device.startswith("cuda"):
        import torch

        return f"{cpu}; {torch.cuda.get_device_name(torch.device(device))}"
    return cpu


def measure(devices: list[str], pieces: list[str], quick: bool) -> pd.DataFrame:
    """One row per (piece, device): the rate, its unit and the wall seconds it took."""
    import torch

    torch.set_num_threads(1)
    steps = {"sac": 300, "pebble": 300, "ppo_pixels": 0} if quick else \
        {"sac": 3000, "pebble": 3000, "ppo_pixels": 8192}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for device in devices:
            for piece in pieces:
                if piece.startswith("drlhp_reward"):
                    if piece == "drlhp_reward_score":
                        continue  # measured with the training below
                    train, score, wall = reward_rates(device, 1, 4) if quick \
                        else reward_rates(device, 20)
                    rows += [(("drlhp_reward_train"), device, train, wall),
                             ("drlhp_reward_score", device, score, wall)]
                else:
                    rate, wall = run_loop(piece, device, steps[piece], Path(tmp), quick)
                    rows.append((piece, device, rate, wall))
                print(f"| {rows[-1][0]} | {device} | {rows[-1][2]:.1f} "
                      f"{UNITS[rows[-1][0]]} |", flush=True)
    out = pd.DataFrame(rows, columns=["piece", "device", "rate", "wall_s"])
    out = out[out["piece"].isin(pieces)]
    out["unit"] = out["piece"].map(UNITS)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    parser.add_argument("--pieces", nargs="+", default=list(PIECES), choices=PIECES)
    parser.add_argument("--quick", action="store_true", help="tiny runs (the suite's check)")
    parser.add_argument("--record", type=Path, metavar="CSV",
                        help="append the rows, with date, commit, machine and command")
    args = parser.parse_args(argv)
    import torch

    if any(d.startswith("cuda") for d in args.devices) and not torch.cuda.is_available():
        print("bench_cuda: error: no CUDA device here; run --devices cpu, or on a GPU machine",
              file=sys.stderr)
        return 2
    print("| piece | device | rate |\n|---|---|---|")
    rows = measure(args.devices, args.pieces, args.quick)
    if args.record is not None:
        rows = rows.assign(
            date=datetime.date.today().isoformat(), commit=records.commit(),
            machine=[machine(d) for d in rows["device"]], quick=args.quick,
            command="python benchmarks/bench_cuda.py " + " ".join(
                sys.argv[1:] if argv is None else argv))
        old = pd.read_csv(args.record) if args.record.is_file() else None
        args.record.parent.mkdir(parents=True, exist_ok=True)
        pd.concat([old, rows] if old is not None else [rows]).to_csv(args.record, index=False)
        print(f"recorded {len(rows)} rows in {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
