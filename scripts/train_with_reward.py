#!/usr/bin/env python
"""Train a Stable-Baselines3 agent on a Themis run's learned reward; report its true return.

    python scripts/train_with_reward.py runs/2026-11-22/10-00-00_train_HalfCheetah-v5 \
        --steps 50000 --baseline

The env of the run (its ``config.yaml``) is wrapped in :class:`themis.LearnedRewardWrapper`
with the run's reward model, so the SB3 agent (SAC for ``Box`` actions, PPO otherwise) never
sees the environment reward. The table at the end compares its true return with a random policy
(and, with ``--baseline``, with the same agent trained on the true reward): proof that the
learned reward transfers to another RL library.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import yaml

from themis.core.safe_loading import check_yaml_file
from themis.core.script_args import ScriptParser, int_at_least
from themis.environments.domains import make_env
from themis.reward.ensemble import load_reward_model
from themis.reward.wrapper import LearnedRewardWrapper
from themis.run.received_config import check_named_code
from themis.run.threads import set_num_threads
from themis.utils import ConfigError, get_device


def true_return(env: gym.Env, policy, episodes: int, seed: int) -> tuple[float, float]:
    """Mean and std of the undiscounted true return of ``policy(obs) -> action``."""
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns)), float(np.std(returns))


def train_sb3(env: gym.Env, steps: int, seed: int, device: torch.device, label: str):
    """An SB3 SAC (Box actions) or PPO agent trained for ``steps`` env steps on ``env``; a
    progress line every tenth of the steps."""
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback

    class Progress(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.every, self.start = max(1, steps // 10), time.time()

        def _on_step(self) -> bool:
            if self.num_timesteps % self.every == 0:
                rate = self.num_timesteps / max(time.time() - self.start, 1e-9)
                print(f"[{label}] {self.num_timesteps}/{steps} steps ({rate:.0f} steps/s)",
                      flush=True)
            return True

    algo = SAC if isinstance(env.action_space, gym.spaces.Box) else PPO
    kwargs = {"learning_starts": min(1000, steps // 10)} if algo is SAC else {}
    model = algo("MlpPolicy", env, seed=seed, device=device, verbose=0, **kwargs)
    model.learn(total_timesteps=steps, callback=Progress())
    return model


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="train_with_reward", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a Themis run dir (config.yaml, checkpoints/)")
    parser.add_argument("--steps", type=int_at_least(1), default=50_000, help="SB3 training steps")
    parser.add_argument("--episodes", type=int_at_least(1), default=5, help="evaluation episodes")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--normalize", action="store_true", help="normalise the learned reward")
    parser.add_argument("--baseline", action="store_true",
                        help="also train the same agent on the true reward")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    set_num_threads(0)  # THEMIS_THREADS=N limits PyTorch's threads, as in the launchers
    try:
        device = get_device(args.device)
    except ConfigError as e:
        parser.error(f"--device: {e}")

    config_file = args.run_dir / "config.yaml"
    if not config_file.is_file():
        print(f"train_with_reward: error: {config_file} not found (is {args.run_dir} a Themis "
              "run dir?)", file=sys.stderr)
        return 2
    try:
        check_yaml_file(config_file)
        cfg = yaml.safe_load(config_file.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as e:
        print(f"train_with_reward: error: {config_file} is not YAML ({str(e).splitlines()[0]})",
              file=sys.stderr)
        return 2
    if not isinstance(cfg, dict) or not all(isinstance(cfg.get(k), str) for k in ("domain", "env")):
        print(f"train_with_reward: error: {config_file} is not a Themis run config (no domain "
              "and env in it)", file=sys.stderr)
        return 2

    try:  # a received run folder may not name code to import (env=module:Id, obs_transform)
        check_named_code(cfg, config_file)
    except ConfigError as e:
        print(f"train_with_reward: error: {e}", file=sys.stderr)
        return 2

    def make(wrapped: bool) -> gym.Env:
        env = make_env(cfg["domain"], cfg["env"], seed=args.seed,
                       obs_transform=cfg.get("obs_transform"))
        return LearnedRewardWrapper(env, reward_model, normalize=args.normalize) if wrapped \
            else env

    try:
        reward_model = load_reward_model(args.run_dir, device=device)
        make(wrapped=True).close()  # the model fits the env
    except (FileNotFoundError, ValueError) as e:  # ConfigError (unknown env) too
        print(f"train_with_reward: error: {e}", file=sys.stderr)
        return 2
    eval_env = make(wrapped=False)
    rows = []
    space = eval_env.action_space
    rows.append(("random policy", *true_return(eval_env, lambda _: space.sample(),
                                               args.episodes, 10_000)))
    model = train_sb3(make(wrapped=True), args.steps, args.seed, device, "learned reward")
    rows.append((f"SB3 {type(model).__name__} on learned reward",
                 *true_return(eval_env, lambda o: model.predict(o, deterministic=True)[0],
                              args.episodes, 10_000)))
    if args.baseline:
        base = train_sb3(make(wrapped=False), args.steps, args.seed, device, "true reward")
        rows.append((f"SB3 {type(base).__name__} on true reward",
                     *true_return(eval_env, lambda o: base.predict(o, deterministic=True)[0],
                                  args.episodes, 10_000)))

    print(f"\n{cfg['env']}, {args.steps} SB3 steps, {args.episodes} eval episodes (true return)")
    print(f"| {'policy':40s} | {'mean':>9s} | {'std':>8s} |")
    print(f"|{'-' * 42}|{'-' * 11}|{'-' * 10}|")
    for name, mean, std in rows:
        print(f"| {name:40s} | {mean:9.1f} | {std:8.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
