#!/usr/bin/env python
"""Feature visualisation of a pixel reward net: the observations that maximise and minimise r̂,
and the rollout observations with the highest and lowest r̂.

    python scripts/feature_vis.py RUN_DIR --rollouts ROLLOUTS --steps 256 --top 6
    python scripts/feature_vis.py SUPERVISED_DIR --rollouts ROLLOUTS --action 1

REWARD is a Themis run dir, a supervised-net folder or a reward_model.pt over images (ALE,
CarRacing). The optimised observation is taken with the action of the top (for the maximum) or
bottom (for the minimum) dataset example unless --action is given. Writes featvis.png,
featvis.json and a report fragment into --out (default REWARD/interpret).
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from themis.core.script_args import ScriptParser, int_at_least, positive_float
from themis.interpret.featvis import (
    dataset_examples,
    maximise_reward,
    plot_feature_vis,
)
from themis.interpret.report import update_report
from themis.interpret.rollouts import load_rollouts
from themis.interpret.sources import load_reward_source
from themis.run.threads import set_num_threads


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="feature_vis", description=__doc__.split("\n\n")[0])
    parser.add_argument("reward", type=Path, help="run dir, supervised folder or .pt")
    parser.add_argument("--rollouts", type=Path, required=True,
                        help="observations for the dataset examples")
    parser.add_argument("--steps", type=int_at_least(1), default=256)
    parser.add_argument("--lr", type=positive_float, default=0.05)
    parser.add_argument("--batch", type=int_at_least(1), default=4,
                        help="transformed copies per step")
    parser.add_argument("--top", type=int_at_least(1), default=6, help="dataset examples")
    parser.add_argument("--action", type=int_at_least(0), help="discrete action to visualise")
    parser.add_argument("--tv", type=float, default=0.0,
                        help="total-variation penalty weight (smoother images)")
    parser.add_argument("--l2", type=float, default=0.0,
                        help="penalty weight keeping the image near the rollouts' mean frame")
    parser.add_argument("--no-transforms", action="store_true")
    parser.add_argument("--no-decorrelate", action="store_true")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    set_num_threads(0)
    try:
        source = load_reward_source(args.reward)
        model = source.model
        if len(model.obs_shape) != 3 or model.encoders is None or \
                min(model.obs_shape[1:]) < 32:
            raise ValueError(f"{args.reward} is not a reward net over images (observations "
                             f"{tuple(model.obs_shape)}); feature visualisation needs pixels")
        rollouts = load_rollouts(args.rollouts)
        if tuple(rollouts.obs.shape[1:]) != tuple(model.obs_shape):
            raise ValueError(f"the rollouts' observations {tuple(rollouts.obs.shape[1:])} are "
                             f"not the model's {tuple(model.obs_shape)}")
        acts = rollouts.action_vectors()
        if acts.shape[1] != model.action_dim:
            raise ValueError(f"the rollouts' actions have {acts.shape[1]} values, the model "
                             f"takes {model.action_dim}")
        if args.action is not None and args.action >= model.action_dim:
            raise ValueError(f"--action {args.action}: the model has {model.action_dim} "
                             "actions")
    except (FileNotFoundError, ValueError) as e:
        print(f"feature_vis: error: {e}", file=sys.stderr)
        return 2
    obs = rollouts.obs[rollouts.step_obs_index]
    rewards = model.predict(obs.reshape(len(obs), -1), acts)
    top, bottom = dataset_examples(rewards, args.top)
    eye = np.eye(model.action_dim, dtype=np.float32)
    picked = {}
    with tqdm(total=2 * args.steps, desc="feature vis", unit="step", leave=False,
              disable=not sys.stderr.isatty()) as bar:
        for name, sign, example in (("max", 1.0, top[0]), ("min", -1.0, bottom[0])):
            action = eye[args.action] if args.action is not None else acts[example]
            picked[name] = maximise_reward(model, action, sign, args.steps, args.lr, args.batch,
                                           args.seed, not args.no_decorrelate,
                                           not args.no_transforms, args.tv, args.l2,
                                           obs.mean(0), bar.update)
    out = args.out or ((source.run_dir or source.path.parent.parent) / "interpret"
                       if args.reward.is_dir() else args.reward.parent / "interpret")
    out.mkdir(parents=True, exist_ok=True)
    discrete = rollouts.meta.get("action_space", {}).get("type") == "Discrete"

    def action_of(i: int) -> int:
        return int(rollouts.acts[i]) if discrete else -1

    plot_feature_vis(picked["max"], picked["min"],
                     [(obs[i], float(rewards[i]), action_of(i)) for i in top],
                     [(obs[i], float(rewards[i]), action_of(i)) for i in bottom],
                     out / "featvis.png", f"{source.env}: reward net features")
    np.savez_compressed(out / "featvis.npz", maximising=picked["max"].image,
                        minimising=picked["min"].image)
    summary = {
        "maximised_reward": picked["max"].reward, "minimised_reward": picked["min"].reward,
        "dataset_reward_max": float(rewards[top[0]]), "dataset_reward_min":
        float(rewards[bottom[0]]), "dataset_reward_mean": float(rewards.mean()),
        "top_true_reward_mean": float(rollouts.rews[top].mean()),
        "bottom_true_reward_mean": float(rollouts.rews[bottom].mean()),
        "steps": args.steps, "lr": args.lr, "seed": args.seed, "tv": args.tv, "l2": args.l2,
        "actions": {"max": picked["max"].action, "min": picked["min"].action},
    }
    (out / "featvis.json").write_text(json.dumps(summary, indent=1))
    (out / "featvis.md").write_text("\n".join([
        "### Feature visualisation", "",
        f"Observations optimised for r̂ ({args.steps} Adam steps on a decorrelated Fourier "
        f"image with jitter, scale and rotation): maximum {picked['max'].reward:.3f}, minimum "
        f"{picked['min'].reward:.3f}; over the {len(rewards)} rollout steps r̂ ranges "
        f"{rewards.min():.3f} … {rewards.max():.3f}. The top {len(top)} steps' true reward "
        f"averages {summary['top_true_reward_mean']:.3f}, the bottom "
        f"{len(bottom)}' {summary['bottom_true_reward_mean']:.3f}.", "",
        f"![feature visualisation](../{out.name}/featvis.png)", ""]))
    print(json.dumps(summary, indent=1))
    report = update_report(source.run_dir) if source.run_dir is not None else None
    print(f"-> {out}" + (f"; report updated: {report}" if report else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
