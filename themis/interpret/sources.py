"""Where the interpretability commands get their pieces: the env of a run or of a reward model,
policies for rollouts (random, a run's saved agent, an SB3 zip), and reward models as functions.

Everything a user may have received is read without pickle: run configs through
:func:`themis.run.received_config.load_received_config`, agents and reward models through
``safe_load``, SB3 zips through :mod:`themis.interpret.sb3`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from themis.core.safe_loading import safe_load
from themis.interpret.rollouts import Policy, random_policy
from themis.reward.ensemble import RewardEnsemble, load_reward_model


@dataclass
class RewardSource:
    """A reward model and what it was trained on.

    Attributes:
        model: the ensemble (eval mode).
        domain, env: its env (``None`` when neither the file nor the user says).
        run_dir: the Themis run it belongs to, if any (its report gets the pictures).
        path: the checkpoint file.
        extra: other plain entries of the checkpoint (``supervised``, ``target_offset``, ...).
    """

    model: RewardEnsemble
    domain: str | None
    env: str | None
    run_dir: Path | None
    path: Path
    extra: dict[str, Any] = field(default_factory=dict)


def run_env(run_dir: Path) -> tuple[str, str]:
    """``(domain, env)`` of a Themis run dir (its ``config.yaml``).

    Raises:
        FileNotFoundError: no ``config.yaml``.
        themis.utils.ConfigError: a config that is not a Themis run's.
    """
    from themis.run.received_config import load_received_config

    config = run_dir / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{config} not found (is {run_dir} a Themis run dir?)")
    cfg = load_received_config(config)
    return str(cfg.domain), str(cfg.env)


def load_reward_source(path: str | Path, domain: str | None = None,
                       env: str | None = None) -> RewardSource:
    """A reward model from a run dir, a supervised-net folder or a ``reward_model.pt``.

    The env comes from ``domain``/``env`` when given, else the run's ``config.yaml``, else the
    checkpoint's ``domain``/``env`` entries.

    Raises:
        FileNotFoundError: no checkpoint there.
        ValueError: not a Themis reward-model checkpoint (never unpickled), a bad config.
    """
    path = Path(path)
    run_dir = path if path.is_dir() and (path / "config.yaml").is_file() else None
    model = load_reward_model(path)
    file = path / "checkpoints" / "reward_model.pt" if path.is_dir() else path
    raw = safe_load(file)
    extra = {k: v for k, v in raw.items() if k not in ("model", "config")
             and isinstance(v, str | int | float | bool)}
    if run_dir is not None and (domain is None or env is None):
        run_domain, run_env_name = run_env(run_dir)
        domain, env = domain or run_domain, env or run_env_name
    saved = extra.get("domain")
    domain = domain or (saved if isinstance(saved, str) else None)
    env = env or model.env_id
    return RewardSource(model, domain, env, run_dir, file, extra)


# ---------------------------------------------------------------------- policies
@dataclass
class PolicySource:
    """A policy for rollouts and how it is described in ``meta.json``'s ``sources``."""

    act: Policy
    entry: dict[str, Any]
    close: Any = None


def policy_source(spec: str, env: gym.Env, domain: str, env_name: str, seed: int = 0,
                  sample: bool = False) -> PolicySource:
    """Turn a ``--source`` value into a policy for ``env``.

    Args:
        spec: ``random``; a Themis run dir (its ``checkpoints/agent.pt``: SAC's mean action,
            PPO's sampled action, as its evaluation); or a Stable-Baselines3 ``.zip``.
        env: the env the rollouts run in.
        domain, env_name: what ``env`` is (a run of another env is refused).
        seed: the random policy's seed.
        sample: SB3 policies sample their action instead of taking the mode.

    Raises:
        FileNotFoundError: no such run or file.
        ValueError: a run of another env, an SB3 policy that does not fit ``env``, unsafe or
            unreadable files (one line).
    """
    if spec == "random":
        return PolicySource(random_policy(env, seed), {"kind": "random", "seed": seed})
    path = Path(spec)
    if path.is_dir():
        from themis.interpret.inspection import load_run

        run_domain, run_env_name = run_env(path)
        if (run_domain, run_env_name) != (domain, env_name):
            raise ValueError(f"{path} is a run of {run_domain}/{run_env_name}, not "
                             f"{domain}/{env_name}")
        scratch = tempfile.TemporaryDirectory()
        ws = load_run(path, Path(scratch.name))

        def close() -> None:
            ws.logger.close()
            scratch.cleanup()

        return PolicySource(ws.eval_action, {"kind": "agent", "path": str(path)}, close)
    if path.suffix == ".zip" or path.is_file():
        from themis.interpret.sb3 import load_sb3_policy

        policy = load_sb3_policy(path)
        obs, _ = env.reset(seed=seed)
        action = policy.act(obs)  # refuses observations of another width here, not mid-run
        if isinstance(env.action_space, gym.spaces.Discrete) != policy.discrete or (
                not policy.discrete and np.shape(action) != env.action_space.shape):
            raise ValueError(f"{path}: its actions do not fit {env_name}'s action space "
                             f"{env.action_space}")
        generator = None
        if sample:
            import torch

            generator = torch.Generator().manual_seed(seed)
        return PolicySource(lambda o: policy.act(o, sample, generator),
                            {"kind": "sb3", "path": str(path), "algorithm": policy.kind})
    raise FileNotFoundError(f"--source {spec}: neither 'random', a run dir nor an SB3 .zip")
