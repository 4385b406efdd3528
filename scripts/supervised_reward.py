#!/usr/bin/env python
"""Train a supervised reward net: a reward ensemble regressed on the true reward of rollouts.

    python scripts/supervised_reward.py ROLLOUTS OUT --epochs 20 --balance

Writes ``OUT/checkpoints/reward_model.pt`` in the format of a learned reward model (so
``themis.load_reward_model(OUT)``, ``scripts/preprocess_reward.py`` and
``scripts/feature_vis.py`` take it) and ``OUT/supervised.json``; prints the held-out
mean-squared error and Pearson correlation (episodes held out, rewards in the env's units).
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import sys
from pathlib import Path

from tqdm import tqdm

from themis.core.script_args import ScriptParser, int_at_least, positive_float
from themis.interpret.rollouts import load_rollouts
from themis.interpret.supervised import save_supervised, train_supervised
from themis.run.threads import set_num_threads
from themis.utils import ConfigError, get_device


def fraction(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{value} must be in (0, 1)")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="supervised_reward", description=__doc__.split("\n\n")[0])
    parser.add_argument("rollouts", type=Path, help="a rollouts folder or an imitation npz")
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int_at_least(1), default=20)
    parser.add_argument("--ensemble-size", type=int_at_least(1), default=3)
    parser.add_argument("--hidden-dim", type=int_at_least(1), default=256)
    parser.add_argument("--hidden-depth", type=int_at_least(0), default=3)
    parser.add_argument("--batch-size", type=int_at_least(1), default=256)
    parser.add_argument("--lr", type=positive_float, default=3e-4)
    parser.add_argument("--heldout", type=fraction, default=0.2, help="fraction of episodes")
    parser.add_argument("--balance", action="store_true",
                        help="sample steps inversely to how common their reward is")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    set_num_threads(0)
    try:
        device = get_device(args.device)
    except ConfigError as e:
        parser.error(f"--device: {e}")
    try:
        rollouts = load_rollouts(args.rollouts)
        with tqdm(total=args.epochs, desc="regression", unit="epoch", leave=False,
                  disable=not sys.stderr.isatty()) as bar:
            model, report = train_supervised(
                rollouts, args.ensemble_size, args.hidden_dim, args.hidden_depth, args.epochs,
                args.batch_size, args.lr, args.heldout, args.balance, args.seed, device,
                bar.update)
    except (FileNotFoundError, ValueError) as e:
        print(f"supervised_reward: error: {e}", file=sys.stderr)
        return 2
    meta = {"domain": rollouts.meta.get("domain"), "env": rollouts.meta.get("env"),
            "rollouts": str(args.rollouts), "seed": args.seed, "balance": args.balance}
    path = save_supervised(model, report, args.out, meta)
    print(f"held-out ({report.heldout_steps} steps): MSE {report.heldout_mse:.4g}, Pearson "
          f"{report.heldout_pearson:.3f}; train ({report.train_steps} steps): MSE "
          f"{report.train_mse:.4g}, Pearson {report.train_pearson:.3f} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
