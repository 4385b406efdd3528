#!/usr/bin/env python
"""Preprocess a learned reward by potential shaping (Jenner & Gleave 2022) and measure it.

    python scripts/preprocess_reward.py RUN_DIR                      # MiniGrid/BabyAI: tabular
    python scripts/preprocess_reward.py RUN_DIR --rollouts ROLLOUTS  # other envs: neural Φ
    python scripts/preprocess_reward.py SUPERVISED_DIR --objective smooth_l1 --offset

REWARD is a Themis run dir, a supervised-net folder (scripts/supervised_reward.py) or a
reward_model.pt. On gridworlds every transition of the layout (reset with --seed) is enumerated
and a potential per state minimises the objective; elsewhere a potential network is trained on
the rollouts' transitions. Writes preprocessing.json, pictures and a report fragment into --out
(default REWARD/interpret) and refreshes the run's report/report.md if it exists.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from themis.core.script_args import ScriptParser, int_at_least
from themis.environments.domains import get_domain, make_env
from themis.interpret.analysis import analyse_grid, analyse_rollouts
from themis.interpret.preprocessing import NORMALIZE, OBJECTIVES
from themis.interpret.report import update_report
from themis.interpret.rollouts import load_rollouts
from themis.interpret.sources import load_reward_source
from themis.run.threads import set_num_threads

GRID_DOMAINS = ("Minigrid", "BabyAI")


def discount(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} must be in [0, 1]")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="preprocess_reward", description=__doc__.split("\n\n")[0])
    parser.add_argument("reward", type=Path, help="run dir, supervised folder or .pt")
    parser.add_argument("--rollouts", type=Path, help="transitions (required off gridworlds)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="sparse_l1")
    parser.add_argument("--offset", action="store_true", help="also fit a constant")
    parser.add_argument("--normalize", choices=NORMALIZE, default="none")
    parser.add_argument("--gamma", type=discount, default=0.99)
    parser.add_argument("--domain")
    parser.add_argument("--env")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--epochs", type=int_at_least(1), default=20, help="neural Φ")
    parser.add_argument("--reference", type=Path,
                        help="a second reward model (e.g. a supervised net) to compare by EPIC")
    parser.add_argument("--epic-batch", type=int_at_least(2), default=1000,
                        help="rollouts: transitions compared by the sampled EPIC")
    parser.add_argument("--epic-samples", type=int_at_least(1), default=128,
                        help="rollouts: (action, next state) samples of its canonicalisation")
    parser.add_argument("--max-states", type=int_at_least(1), default=20_000)
    parser.add_argument("--tabular", choices=("auto", "yes", "no"), default="auto",
                        help="gridworlds: tabular (auto) or the rollouts' neural Φ (no)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if (args.domain is None) != (args.env is None):
        parser.error("--domain and --env go together")
    set_num_threads(0)
    try:
        source = load_reward_source(args.reward, args.domain, args.env)
        if source.domain is None or source.env is None:
            raise ValueError(f"{args.reward} does not say which env it is for: give --domain "
                             "and --env")
        get_domain(source.domain).resolve(source.env)  # an unknown env fails here, in one line
        grid = source.domain in GRID_DOMAINS and args.tabular != "no"
        if args.tabular == "yes" and source.domain not in GRID_DOMAINS:
            raise ValueError(f"--tabular yes needs a MiniGrid/BabyAI reward, not {source.domain}")
        if not grid and args.rollouts is None:
            raise ValueError(f"{source.domain}/{source.env} is not a gridworld: give --rollouts "
                             "(scripts/rollouts.py writes them)")
        rollouts = load_rollouts(args.rollouts) if args.rollouts is not None else None
        if rollouts is not None:
            width = int(rollouts.obs[0].size)
            if width != source.model.obs_dim:
                raise ValueError(f"the rollouts' observations have {width} values, the reward "
                                 f"model takes {source.model.obs_dim}")
        reference = load_reward_source(args.reference).model if args.reference else None
    except (FileNotFoundError, ValueError) as e:  # ConfigError, UnsafeFileError, formats
        print(f"preprocess_reward: error: {e}", file=sys.stderr)
        return 2
    out = args.out or ((source.run_dir or source.path.parent.parent) / "interpret"
                       if args.reward.is_dir() else args.reward.parent / "interpret")
    title = f"{source.env}: {args.objective}"
    target = (float(source.extra["target_offset"]), float(source.extra["target_scale"])) \
        if source.extra.get("supervised") else None
    try:
        if grid:
            env = make_env(source.domain, source.env, seed=args.seed)
            metrics = analyse_grid(source.model, env, out, args.objective, args.gamma,
                                   args.offset, args.normalize, args.seed, args.max_states,
                                   title, target)
        else:
            assert rollouts is not None
            with tqdm(total=args.epochs, desc="potential", unit="epoch", leave=False,
                      disable=not sys.stderr.isatty()) as bar:
                metrics = analyse_rollouts(source.model, rollouts, out, args.objective,
                                           args.gamma, args.offset, args.normalize, args.epochs,
                                           args.seed, reference, args.epic_batch,
                                           args.epic_samples, title, bar.update)
    except ValueError as e:  # a layout with too many states
        print(f"preprocess_reward: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(metrics, indent=1))
    report = update_report(source.run_dir) if source.run_dir is not None else None
    print(f"-> {out}" + (f"; report updated: {report}" if report else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
