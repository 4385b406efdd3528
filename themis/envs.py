"""Domain registry: turns ``domain=... env=...`` into a ready gymnasium environment.

Each :class:`Domain` knows how users spell its environments (``env=Breakout-v5`` or the full id
``ALE/Breakout-v5``), which registered gymnasium ids belong to it, and which wrappers it needs.
Adding a domain is one entry in :data:`DOMAINS`.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from themis.utils import ConfigError

log = logging.getLogger(__name__)
_seen_mujoco_warnings: set[str] = set()


def _mujoco_warning(message: str) -> None:
    """Log each distinct MuJoCo warning once (deprecation notes from gymnasium's model files at
    debug level) instead of MuJoCo's default: stderr on every env and a MUJOCO_LOG.TXT in cwd."""
    text = message.strip()
    if text in _seen_mujoco_warnings:
        return
    _seen_mujoco_warnings.add(text)
    log.log(logging.DEBUG if "deprecated" in text else logging.WARNING, "MuJoCo: %s", text)


def _route_mujoco_warnings() -> None:
    try:
        import mujoco
    except ImportError:  # pragma: no cover - MuJoCo is a dependency, but domains need not be
        return
    if hasattr(mujoco, "set_mju_user_warning") and mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


def _rescale_box_actions(env: gym.Env) -> gym.Env:
    """Rescale a bounded ``Box`` action space to [-1, 1] (what SAC's tanh policy emits)."""
    space = env.action_space
    if isinstance(space, gym.spaces.Box) and np.all(np.isfinite(space.low)) and \
            np.all(np.isfinite(space.high)) and \
            (np.any(space.low != -1.0) or np.any(space.high != 1.0)):
        env = gym.wrappers.RescaleAction(env, min_action=np.float32(-1.0),
                                         max_action=np.float32(1.0))
    return env


@dataclass(frozen=True)
class Domain:
    """One family of environments.

    Attributes:
        name: the ``domain=`` spelling.
        entry_points: prefixes of gymnasium entry points that belong to the domain.
        id_prefix: namespace users may leave out (``"ALE/"`` for Atari).
        wrap: wrappers applied after ``gym.make``.
        make_kwargs: extra keyword arguments for ``gym.make``.
        setup: called once before looking up ids (e.g. to register a plugin's envs).
    """

    name: str
    entry_points: tuple[str, ...]
    id_prefix: str = ""
    wrap: Callable[[gym.Env], gym.Env] = _rescale_box_actions
    make_kwargs: dict[str, Any] = field(default_factory=dict)
    setup: Callable[[], None] | None = None

    def env_ids(self) -> list[str]:
        """All registered gymnasium ids of this domain."""
        if self.setup is not None:
            self.setup()
        ids = []
        for env_id, spec in gym.registry.items():
            entry = spec.entry_point if isinstance(spec.entry_point, str) else \
                f"{getattr(spec.entry_point, '__module__', '')}:"
            if entry.startswith(self.entry_points):
                ids.append(env_id)
        return sorted(ids)

    def resolve(self, env: str) -> str:
        """Full gymnasium id for the user's ``env`` spelling.

        Raises:
            ConfigError: the env is not registered in this domain (lists close matches).
        """
        ids = self.env_ids()
        for candidate in (env, self.id_prefix + env):
            if candidate in ids:
                return candidate
        short = [i.removeprefix(self.id_prefix) for i in ids]
        close = difflib.get_close_matches(env.removeprefix(self.id_prefix), short, n=5,
                                          cutoff=0.5)
        hint = f"; close matches: {', '.join(close)}" if close else \
            f"; available: {', '.join(short[:12])}{', ...' if len(short) > 12 else ''}"
        raise ConfigError(f"env={env} is not an environment of domain={self.name}{hint}")


DOMAINS: dict[str, Domain] = {
    "Control": Domain("Control", entry_points=("gymnasium.envs.mujoco",),
                      setup=_route_mujoco_warnings),
    "Classic": Domain("Classic", entry_points=("gymnasium.envs.classic_control",)),
}


def get_domain(name: str) -> Domain:
    """Look a domain up by name.

    Raises:
        ConfigError: unknown domain (lists the known ones).
    """
    if name not in DOMAINS:
        close = difflib.get_close_matches(name, list(DOMAINS), n=3)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"domain={name} is unknown{hint}; available: {', '.join(DOMAINS)}")
    return DOMAINS[name]


def make_env(domain: str, env: str, seed: int | None = None,
             render_mode: str | None = None) -> gym.Env:
    """Create and wrap an environment of a domain.

    Args:
        domain: a key of :data:`DOMAINS`.
        env: the env spelling (short or full gymnasium id).
        seed: seeds the first ``reset`` and the action space.
        render_mode: e.g. ``"rgb_array"`` for clips.

    Raises:
        ConfigError: unknown domain or env.
    """
    dom = get_domain(domain)
    env_id = dom.resolve(env)
    e = gym.make(env_id, render_mode=render_mode, **dom.make_kwargs)
    e = dom.wrap(e)
    if seed is not None:
        e.reset(seed=seed)
        e.action_space.seed(seed)
    return e


def episode_limit(env: gym.Env) -> int | None:
    """The time limit (``max_episode_steps``) of an env, or None if it has none."""
    spec = env.spec
    return spec.max_episode_steps if spec is not None else None
