#!/usr/bin/env python
"""Peak memory of 1M-step run configurations, with every preallocated array touched.

    python benchmarks/bench_memory.py
    python benchmarks/bench_memory.py --configs halfcheetah

Each configuration is built in its own process (peak RSS is per process): the workspace of a
1M-step run is created (replay buffer or PPO episode store, preference dataset of
``max_feedback`` pairs, agent, reward ensemble) and every preallocated array is written once, as
a full buffer would be. Prints the arrays' sizes and the process's peak RSS as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "halfcheetah": ["domain=Control", "env=HalfCheetah-v5", "num_train_steps=1000000"],
    "atari": ["domain=ALE", "env=Breakout-v5", "num_train_steps=1000000"],
}


def measure(overrides: list[str]) -> dict[str, float]:
    """Build the workspace, touch its arrays, return sizes (GB) and peak RSS (GB)."""
    from themis.builder import make_workspace
    from themis.run.config import compose

    cfg = compose(overrides)
    with TemporaryDirectory() as tmp:
        ws = make_workspace(cfg, Path(tmp))
        def arrays(obj: object) -> list[np.ndarray]:  # the stores, not views of them
            return [v for v in vars(obj).values() if isinstance(v, np.ndarray)
                    and v.flags.writeable and v.dtype != object]

        buffer_arrays, dataset_arrays = arrays(ws.buffer), arrays(ws.learner.dataset)
        for array in buffer_arrays + dataset_arrays:
            array.fill(0)  # touch every page, as a full run would
        ws.logger.close()
        return {
            "capacity": ws.buffer.capacity,
            "obs_dtype": str(ws.buffer.obs.dtype),
            "frame_stack": ws.facts.frame_stack,
            "buffer_gb": sum(a.nbytes for a in buffer_arrays) / 1e9,
            "dataset_gb": sum(a.nbytes for a in dataset_arrays) / 1e9,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(CONFIGS[args.child])))
        return 0
    rows = {}
    for name in args.configs:
        out = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True,
                             text=True, check=True)
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(name, rows[name], flush=True)
    print("\n| configuration | store capacity | obs dtype | frames per stack stored | buffer (GB) "
          "| preference dataset (GB) | peak RSS (GB) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        stack = "1 (de-duplicated)" if r["frame_stack"] > 1 else "-"
        print(f"| {' '.join(CONFIGS[name])} | {r['capacity']} | {r['obs_dtype']} | {stack} | "
              f"{r['buffer_gb']:.2f} | {r['dataset_gb']:.2f} | {r['peak_rss_gb']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
