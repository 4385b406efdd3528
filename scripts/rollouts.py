#!/usr/bin/env python
"""Write rollouts with true rewards (the pickle-free format of themis.interpret.rollouts).

    python scripts/rollouts.py OUT --source random --episodes 20 --domain Minigrid \
        --env Empty-8x8-v0
    python scripts/rollouts.py OUT --source RUN_DIR --source random --episodes 10   # mixed
    python scripts/rollouts.py OUT --source ppo_cartpole.zip --domain Classic --env CartPole-v1
    python scripts/rollouts.py OUT --from trajectories.npz --domain Classic --env CartPole-v1
    python scripts/rollouts.py OUT.npz --source random ... --format imitation

Each ``--source`` (``random``, a Themis run dir: its saved agent, or a Stable-Baselines3 .zip,
read from its weights only) plays ``--episodes`` episodes, seeds ``--seed``, ``--seed + 1``, ...;
the env is ``--domain``/``--env`` or the first run dir's. ``--from`` converts an imitation npz
file (``TrajectoryWithRew``) into a Themis folder.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import sys
from pathlib import Path

from tqdm import tqdm

from themis.core.script_args import ScriptParser, int_at_least
from themis.environments.domains import make_env
from themis.interpret.rollouts import (
    collect_rollouts,
    concatenate,
    load_rollouts,
    save_imitation_npz,
    save_rollouts,
)
from themis.interpret.sources import policy_source, run_env
from themis.run.threads import set_num_threads


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="rollouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output folder (or .npz with --format imitation)")
    parser.add_argument("--source", action="append", default=[],
                        help="random | RUN_DIR | POLICY.zip (repeat to mix)")
    parser.add_argument("--from", dest="from_file", type=Path,
                        help="convert an imitation npz (or a Themis folder) instead")
    parser.add_argument("--episodes", type=int_at_least(1), default=10, help="per source")
    parser.add_argument("--domain")
    parser.add_argument("--env")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--max-steps", type=int_at_least(1), default=None,
                        help="cut episodes here (default: the env's limit)")
    parser.add_argument("--sample", action="store_true",
                        help="SB3 policies sample actions instead of their mode")
    parser.add_argument("--format", choices=("themis", "imitation"), default="themis")
    args = parser.parse_args(argv)
    if bool(args.source) == bool(args.from_file):
        parser.error("give --source (one or more) or --from, not both or neither")
    if (args.domain is None) != (args.env is None):
        parser.error("--domain and --env go together")
    set_num_threads(0)
    try:
        if args.from_file:
            rollouts = load_rollouts(args.from_file)
            if args.domain:
                rollouts.meta.update(domain=args.domain, env=args.env)
        else:
            rollouts = collect(args)
        if args.format == "imitation":
            out = save_imitation_npz(rollouts, args.out)
        else:
            out = save_rollouts(rollouts, args.out)
    except (FileNotFoundError, ValueError) as e:  # ConfigError, RolloutFormatError, SB3...
        print(f"rollouts: error: {e}", file=sys.stderr)
        return 2
    returns = [float(rollouts.rews[s].sum()) for s, _ in rollouts.episodes()]
    print(f"{rollouts.num_episodes} episodes, {rollouts.num_steps} steps, mean true return "
          f"{sum(returns) / max(len(returns), 1):.3f} -> {out}")
    return 0


def collect(args) -> object:
    domain, env_name = args.domain, args.env
    if domain is None:
        run = next((Path(s) for s in args.source if Path(s).is_dir()), None)
        if run is None:
            raise ValueError("--domain and --env are needed unless a --source is a run dir")
        domain, env_name = run_env(run)
    env = make_env(domain, env_name, seed=args.seed)
    sources = [policy_source(spec, env, domain, env_name, args.seed, args.sample)
               for spec in args.source]  # every source checked before any episode runs
    parts = []
    with tqdm(desc="rollouts", unit="step", dynamic_ncols=True, leave=False,
              disable=not sys.stderr.isatty()) as bar:
        for i, source in enumerate(sources):
            try:
                parts.append(collect_rollouts(
                    env, source.act, args.episodes, args.seed + 1000 * i, args.max_steps,
                    source.entry, bar.update))
            finally:
                if source.close is not None:
                    source.close()
    rollouts = concatenate(parts)
    rollouts.meta.update(domain=domain, env=env_name)
    return rollouts


if __name__ == "__main__":
    sys.exit(main())
