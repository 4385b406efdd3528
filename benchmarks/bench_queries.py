#!/usr/bin/env python
"""Query-selection cost: k-center alone and a whole query round, at growing candidate pools.

    python benchmarks/bench_queries.py                       # pools of 1k, 10k, 100k candidates
    python benchmarks/bench_queries.py --pools 1000 10000 --labelled 1000

HalfCheetah-sized segments (50 steps × 17 observation + 6 action dims), a replay buffer of 100k
random transitions, ``--labelled`` pairs already labelled, ``reward_batch`` = 100 picks. For each
pool size it times ``kcenter_greedy`` on the pair features and a whole query round: cutting the
candidate segments out of the buffer, the k-center + disagreement sampler (ensemble scores, top
half, k-center) and the oracle's labels. B-Pref's default is a 10× pool (1k candidates for 100
queries). Prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
import torch

from themis.agents.buffers import ReplayBuffer
from themis.feedback.sampling import SAMPLERS, kcenter_greedy, pair_features
from themis.feedback.teachers import SyntheticTeacher
from themis.reward import RewardEnsemble
from themis.run.threads import set_num_threads

OBS_DIM, ACTION_DIM, SEGMENT, PICKS = 17, 6, 50, 100


def filled_buffer(size: int, rng: np.random.Generator) -> ReplayBuffer:
    buffer = ReplayBuffer((OBS_DIM,), ACTION_DIM, size, torch.device("cpu"))
    buffer.obs[:] = rng.standard_normal((size, OBS_DIM), dtype=np.float32)
    buffer.actions[:] = rng.uniform(-1, 1, (size, ACTION_DIM)).astype(np.float32)
    buffer.true_rewards[:] = rng.standard_normal(size, dtype=np.float32)
    buffer.episode[:] = np.arange(size) // 1000  # 1000-step episodes, as HalfCheetah's
    buffer.t[:] = np.arange(size) % 1000
    buffer.size, buffer.ptr = size, 0
    return buffer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--labelled", type=int, default=1000)
    args = parser.parse_args(argv)
    set_num_threads(0)
    rng = np.random.default_rng(0)
    buffer = filled_buffer(100_000, rng)
    model = RewardEnsemble(OBS_DIM, ACTION_DIM, ensemble_size=3).eval()
    teacher = SyntheticTeacher(rng=np.random.default_rng(1))
    labelled = pair_features(buffer.sample_segment_pairs(args.labelled, SEGMENT, rng)
                             .observations)
    rows = []
    for pool in args.pools:
        candidates = buffer.sample_segment_pairs(pool, SEGMENT, rng)
        features = pair_features(candidates.observations)
        start = time.perf_counter()
        kcenter_greedy(features, labelled, PICKS)
        kcenter_s = time.perf_counter() - start

        start = time.perf_counter()
        candidates = buffer.sample_segment_pairs(pool, SEGMENT, rng)
        picks = SAMPLERS["kcenter_disagreement"](candidates, model, labelled, PICKS, rng)
        queries = candidates.take(picks)
        teacher.label(queries.true_rewards[:, 0], queries.true_rewards[:, 1])
        round_s = time.perf_counter() - start
        rows.append((pool, kcenter_s, round_s))
        print(f"pool {pool}: k-center {kcenter_s:.3f} s, query round {round_s:.3f} s",
              flush=True)

    print(f"\n{PICKS} queries from pools of candidate pairs ({SEGMENT}-step HalfCheetah-sized "
          f"segments, feature size {2 * SEGMENT * OBS_DIM}), {args.labelled} pairs labelled, "
          f"torch {torch.__version__}, {os.cpu_count()} CPU cores "
          f"({platform.processor() or platform.machine()})\n")
    print("| candidates | kcenter_greedy (s) | whole query round, k-center + disagreement (s) |")
    print("|---|---|---|")
    for pool, kcenter_s, round_s in rows:
        print(f"| {pool} | {kcenter_s:.3f} | {round_s:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
