#!/usr/bin/env python
"""Look inside a run's learned reward and write a one-page report.

    python scripts/inspect_reward.py RUN_DIR                 # RUN_DIR/report/report.md + PNGs
    python scripts/inspect_reward.py RUN_DIR --episodes 3 --max-steps 500

Reward curves of fresh episodes of the saved agent and of a random policy (true reward and the
learned one, aligned by least squares, with Pearson/Spearman), gridworld heatmaps for
MiniGrid/BabyAI, learning and reward-model curves, teacher statistics and links to the clips
(see :mod:`themis.interpret.inspection`).
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import sys
from pathlib import Path

from themis.core.script_args import ScriptParser, int_at_least


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="inspect_reward", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--episodes", type=int_at_least(1), default=2,
                        help="per policy (agent, random)")
    parser.add_argument("--max-steps", type=int_at_least(1), default=1000,
                        help="steps per episode at most")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():  # before PyTorch and the envs load, and nothing written
        what = "a file" if args.run_dir.exists() else "not found"
        print(f"inspect_reward: error: {args.run_dir} is {what}: give a run folder (the one "
              "that holds config.yaml)", file=sys.stderr)
        return 2
    from themis.interpret.inspection import inspect_run

    try:
        report = inspect_run(args.run_dir, args.episodes, args.max_steps, args.seed)
    except (FileNotFoundError, ValueError) as e:  # ConfigError, UnsafeFileError too
        print(f"inspect_reward: error: {e}", file=sys.stderr)
        return 2
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
