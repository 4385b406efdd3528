#!/usr/bin/env python
"""Pixel envs: steps/s, pixel rate, reward-training time and peak memory of a short PrefPPO run.

    python benchmarks/bench_pixels.py                       # CarRacing-v3 and Breakout, 1024 steps
    python benchmarks/bench_pixels.py --steps 2048 --envs CarRacing-v3

Each (env, variant) runs in its own process (peak RSS is per process) with the same config: 8
envs × 128 steps per rollout, state-entropy pretraining for half the steps, then one feedback
round of ``--labels`` oracle labels and up to ``--epochs`` reward epochs. Variants: ``one
pass`` runs each 128-pair batch of segments through the reward CNNs at once (before), ``chunked``
in chunks of 256 images per member whose gradients add up to the same step (the default,
``RewardTrainer.chunk_images``). The pixel rate is steps/s × pixels per observation, so envs of
different image sizes compare; evaluation episodes are not run (CarRacing's are 1000 steps
each). Prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

ENVS = {"CarRacing-v3": ["domain=Box2d", "env=CarRacing-v3", "+env_kwargs.continuous=false"],
        "Breakout": ["domain=ALE", "env=ALE/Breakout-v5"]}
VARIANTS = {"one pass": None, "chunked": 256}


def one(env: str, chunk: int | None, steps: int, labels: int, epochs: int) -> dict:
    """Run one configuration in this process; returns its numbers."""
    import numpy as np

    from themis.builder import make_workspace
    from themis.run.config import compose
    from themis.run.threads import set_num_threads

    set_num_threads(0)
    never = 10**9
    cfg = compose([*ENVS[env], f"num_train_steps={steps}", "num_seed_steps=0",
                   f"num_unsup_steps={steps // 2}", f"num_interact={steps // 2}",
                   f"max_feedback={labels}", f"reward_batch={labels}", f"reward_update={epochs}",
                   f"eval_frequency={never}", f"log_frequency={never}",
                   f"checkpoint_frequency={never}"])
    with TemporaryDirectory() as tmp:
        ws = make_workspace(cfg, Path(tmp))
        ws.logger.stream = open(os.devnull, "w")
        assert ws.learner is not None
        ws.learner.trainer.chunk_images = chunk
        train = ws.learner.trainer.train
        spent = [0.0]

        def timed(*args, **kwargs):  # reward training time, separately
            start = time.perf_counter()
            out = train(*args, **kwargs)
            spent[0] += time.perf_counter() - start
            return out

        ws.learner.trainer.train = timed  # type: ignore[method-assign]
        ws.evaluate = lambda: float("nan")  # type: ignore[method-assign]  # not measured
        start = time.perf_counter()
        ws.run()
        seconds = time.perf_counter() - start
        pixels = int(np.prod(ws.facts.obs_shape))
    return {"seconds": seconds, "reward_seconds": spent[0], "pixels": pixels,
            "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--labels", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--one", nargs=2, metavar=("ENV", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 512 or args.steps % 2:
        print("bench_pixels: error: --steps must be even and at least 512", file=sys.stderr)
        return 2
    if args.one:
        env, variant = args.one
        print(json.dumps(one(env, VARIANTS[variant], args.steps, args.labels, args.epochs)))
        return 0
    rows = []
    for env in args.envs:
        for variant in VARIANTS:
            proc = subprocess.run([sys.executable, __file__, "--one", env, variant,
                                   "--steps", str(args.steps), "--labels", str(args.labels),
                                   "--epochs", str(args.epochs)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stdout + proc.stderr, file=sys.stderr)
                return 1
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append((env, variant, r))
            print(f"{env}, {variant}: {args.steps / r['seconds']:.1f} steps/s", flush=True)
    print(f"\n{args.steps} steps, {args.labels} oracle labels, up to {args.epochs} reward epochs, "
          f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})\n")
    print("| env | reward batches | steps/s | pixel rate (Mpx/s) | reward training (s) | "
          "other (s) | peak RSS (GB) |")
    print("|---|---|---|---|---|---|---|")
    for env, variant, r in rows:
        rate = args.steps / r["seconds"]
        print(f"| {env} | {variant} | {rate:.1f} | {rate * r['pixels'] / 1e6:.2f} | "
              f"{r['reward_seconds']:.1f} | {r['seconds'] - r['reward_seconds']:.1f} | "
              f"{r['rss_gb']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
