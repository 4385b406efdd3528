"""Domain registry: turns ``domain=... env=...`` into a ready gymnasium environment.

Each :class:`Domain` knows how users spell its environments (``env=Breakout-v5`` or the full id
``ALE/Breakout-v5``), which registered gymnasium ids belong to it, and which wrappers it needs.
Adding a domain is one entry in :data:`DOMAINS`.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from themis.core.choices import unknown_choice
from themis.core.env_names import DISTRIBUTIONS, find_env, unknown_env
from themis.environments.actions import rescale_box_actions
from themis.environments.moving_dot import atari_preprocessing
from themis.environments.mujoco import (
    NO_GL_BACKEND,
    LightMujocoRender,
    choose_gl_backend,
    is_mujoco,
    route_mujoco_warnings,
)
from themis.environments.observations import prepare_observations
from themis.environments.suites import (  # DeepMind Control and Meta-World adapters
    dmc_ids,
    dmc_setup,
    make_dmc,
    make_metaworld,
    metaworld_ids,
)
from themis.utils import ConfigError

# SDL (pygame: the rendering of classic control and Box2D envs) takes over SIGINT and SIGTERM
# when it starts and turns them into window events nobody reads, so `kill`, `timeout` and
# Ctrl-C would not stop a run that renders clips. With this hint (read when SDL starts) the
# signals keep Python's handlers; a value set by the user wins.
os.environ.setdefault("SDL_NO_SIGNAL_HANDLERS", "1")

def _atari_wrap(env: gym.Env) -> gym.Env:
    """DQN preprocessing (Mnih et al. 2015) with gymnasium's wrappers: no-op starts, frame skip 4
    with max-pooling, 84×84 grayscale, 4 stacked frames -> ``(4, 84, 84)`` uint8."""
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                          grayscale_obs=True, scale_obs=False)
    return gym.wrappers.FrameStackObservation(env, 4)


# Words of MiniGrid/BabyAI missions (minigrid's own vocabulary); unknown words are ignored.
def _mission_words() -> dict[str, int]:
    from minigrid.wrappers import DictObservationSpaceWrapper

    return dict(DictObservationSpaceWrapper.get_minigrid_words())


def _grid_wrap(with_mission: bool) -> Callable[[gym.Env], gym.Env]:
    """MiniGrid/BabyAI: the dict observation as one ``(C, 7, 7)`` uint8 grid.

    Channels: the 3 symbolic image planes (object, colour, state indices), one constant plane
    holding the agent's direction (0-3), and with ``with_mission`` (BabyAI, where the mission
    changes between episodes) one plane per vocabulary word counting its occurrences in the
    mission string (a bag of words a small CNN can read). MiniGrid tasks have one fixed mission
    per env, so it carries no information and is dropped.
    """
    def wrap(env: gym.Env) -> gym.Env:
        image_space = env.observation_space["image"]  # type: ignore[index]
        h, w, c = image_space.shape
        words = _mission_words() if with_mission else {}
        channels = c + 1 + len(words)

        def encode(obs: dict[str, Any]) -> np.ndarray:
            grid = np.zeros((channels, h, w), dtype=np.uint8)
            grid[:c] = np.transpose(obs["image"], (2, 0, 1))
            grid[c] = obs["direction"]
            if words:
                for word in str(obs["mission"]).replace(",", " , ").split():
                    if word in words:
                        grid[c + 1 + words[word]] += 1
            return grid

        space = gym.spaces.Box(0, 255, (channels, h, w), np.uint8)
        if with_mission:  # BabyAI's level generator prints each rejected sample
            env = _QuietReset(env)
        return gym.wrappers.TransformObservation(env, encode, space)
    return wrap


class _QuietReset(gym.Wrapper):
    """Routes what ``reset`` prints (BabyAI: "Sampling rejected: unreachable object") to
    logging at debug level instead of the console."""

    def reset(self, **kwargs: Any) -> Any:
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            result = self.env.reset(**kwargs)
        for line in printed.getvalue().splitlines():
            logging.getLogger("themis.environments.domains").debug("%s", line)
        return result


def _register(module: str) -> Callable[[], None]:
    """A domain ``setup`` that registers a plugin's environments with gymnasium."""
    def setup() -> None:
        import importlib

        gym.register_envs(importlib.import_module(module))
    return setup


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
    wrap: Callable[[gym.Env], gym.Env] = rescale_box_actions
    make_kwargs: dict[str, Any] = field(default_factory=dict)
    setup: Callable[[], None] | None = None
    ids: Callable[[], list[str]] | None = None
    """The domain's env names, when they are not registered gymnasium ids (Meta-World)."""
    make: Callable[..., gym.Env] | None = None
    """Builds an env from its resolved name instead of ``gym.make`` (called with ``name,
    render_mode, render_size, task_seed, **kwargs``)."""
    mujoco_make: bool = False
    """``make`` builds MuJoCo envs (DeepMind Control, Meta-World): their clips need an OpenGL
    backend, as gymnasium's MuJoCo envs' do (:func:`themis.environments.mujoco.is_mujoco`)."""
    import_modules: bool = False
    """``env=module:EnvId`` (gymnasium's spelling) imports ``module`` first, which registers
    the env (``gymnasium.register`` at its top level)."""

    def env_ids(self) -> list[str]:
        """All registered gymnasium ids (or names) of this domain; kept in :data:`LISTED` (but
        the Gym domain's, which depends on what the process registered).

        Raises:
            ConfigError: the domain's suite is not installed.
        """
        if self.setup is not None:
            self.setup()
        if self.ids is not None:
            try:
                ids = sorted(self.ids())
            except ImportError as e:
                raise ConfigError(f"domain={self.name} needs {e.name}, which is not installed: "
                                  "run scripts/setup.sh (pip install -e .)") from None
        else:
            ids = []
            for env_id, spec in gym.registry.items():
                entry = spec.entry_point if isinstance(spec.entry_point, str) else \
                    f"{getattr(spec.entry_point, '__module__', '')}:"
                if entry.startswith(self.entry_points):
                    ids.append(env_id)
            ids.sort()
        if self.name in DISTRIBUTIONS:
            LISTED[self.name] = (ids, self.id_prefix)
        return ids

    def resolve(self, env: str) -> str:
        """Full gymnasium id for the user's ``env`` spelling.

        Raises:
            ConfigError: the env is not registered in this domain (the line of
                :func:`themis.core.env_names.unknown_env`: the domain it belongs to, or close
                matches).
        """
        if self.import_modules and ":" in env:
            module, _, env = env.partition(":")
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ConfigError(f"env={module}:{env}: cannot import {module} ({e})") from None
        ids = self.env_ids()
        found = find_env(self.name, env, ids, self.id_prefix)
        if found is not None:
            return found
        raise ConfigError(unknown_env(self.name, env, ids, self.id_prefix, _listing))


def _seals_setup() -> None:
    """Register the seals environments (importing ``seals`` does) and route MuJoCo's warnings."""
    route_mujoco_warnings()
    _register("seals")()


DOMAINS: dict[str, Domain] = {
    "Control": Domain("Control", entry_points=("gymnasium.envs.mujoco",),
                      setup=route_mujoco_warnings),
    "ALE": Domain("ALE", entry_points=("ale_py.env",), id_prefix="ALE/", wrap=_atari_wrap,
                  make_kwargs={"frameskip": 1}, setup=_register("ale_py")),
    # CarRacing's (96, 96, 3) pixels become channels-first in make_env (prepare_observations)
    "Box2d": Domain("Box2d", entry_points=("gymnasium.envs.box2d",)),
    "Minigrid": Domain("Minigrid", entry_points=("minigrid.envs:",), id_prefix="MiniGrid-",
                       wrap=_grid_wrap(with_mission=False), setup=_register("minigrid")),
    "BabyAI": Domain("BabyAI", entry_points=("minigrid.envs.babyai",), id_prefix="BabyAI-",
                     wrap=_grid_wrap(with_mission=True), setup=_register("minigrid")),
    # Classic control (Pendulum, CartPole, ...): tiny tasks for tests and quick checks
    "Classic": Domain("Classic", entry_points=("gymnasium.envs.classic_control",)),
    # DeepMind Control (Shimmy's gymnasium bindings): env=walker_walk, walker-walk or the id
    "DMC": Domain("DMC", entry_points=(), id_prefix="dm_control/", ids=dmc_ids,
                  make=make_dmc, wrap=lambda env: env,
                  setup=dmc_setup, mujoco_make=True),
    # MovingDot (themis/environments/moving_dot.py), with DRLHP's Atari preprocessing
    "MovingDot": Domain("MovingDot", entry_points=("themis.environments.moving_dot",),
                        wrap=atari_preprocessing),
    # any registered gymnasium env, also one's own: env=mypkg.envs:MyEnv-v0 imports mypkg.envs
    # (which registers MyEnv-v0) first; bounded Box actions rescaled to [-1, 1]
    "Gym": Domain("Gym", entry_points=("",), import_modules=True),
    # seals (HumanCompatibleAI's suite for learning specifications): fixed-horizon MuJoCo
    # (env=Hopper-v1: no early termination, positions observed; docs/guide/domains.md) and
    # diagnostic tasks with vector observations (env=CartPole-v0, MountainCar-v0, NoisyObs-v0, ...)
    "seals": Domain("seals", entry_points=("seals.",), id_prefix="seals/",
                    setup=_seals_setup),
    # Meta-World v3, one task at a time (MT1): env=door-open-v3
    "MetaWorld": Domain("MetaWorld", entry_points=(), ids=metaworld_ids,
                        make=make_metaworld, wrap=rescale_box_actions,
                        setup=route_mujoco_warnings, mujoco_make=True),
}


def get_domain(name: str) -> Domain:
    """Look a domain up by name.

    Raises:
        ConfigError: unknown domain (lists the known ones).
    """
    if name not in DOMAINS:  # domain=dmc: did you mean DMC?
        raise ConfigError(unknown_choice("domain", name, DOMAINS))
    return DOMAINS[name]


LISTED: dict[str, tuple[list[str], str]] = {}
"""The domains listed in this process: name -> (names, id prefix); the launchers save them
for their quick check (:func:`themis.cli.key_check.save_env_lists`)."""


def _listing(name: str) -> tuple[list[str], str] | None:
    """A domain's names and id prefix, ``None`` when its suite is not installed or does not
    import here (:data:`themis.core.env_names.Listing`)."""
    try:
        return DOMAINS[name].env_ids(), DOMAINS[name].id_prefix
    except Exception:
        return None


def make_env(domain: str, env: str, seed: int | None = None,
             render_mode: str | None = None, render_size: int = 128,
             task_seed: int | None = None,
             obs_transform: str | Callable[[Any], Any] | None = None,
             **env_kwargs: Any) -> gym.Env:
    """Create and wrap an environment of a domain.

    Args:
        domain: a key of :data:`DOMAINS`.
        env: the env spelling (short or full gymnasium id).
        seed: seeds the first ``reset`` and the action space.
        render_mode: e.g. ``"rgb_array"`` for clips.
        render_size: MuJoCo frames are rendered ``render_size`` pixels square (with
            ``render_mode="rgb_array"``; other envs render at their own size), through the
            model's ``track`` camera when it has one (it follows the agent).
        task_seed: Meta-World: chooses the run's goal (default ``seed``; the evaluation env
            passes the run's seed so it has the training goal).
        obs_transform: a dict observation's key or a ``module:function`` (or a callable)
            that makes one array of each observation
            (:func:`themis.environments.observations.make_obs_transform`).
        env_kwargs: extra ``gym.make`` arguments (``continuous=False`` for CarRacing, ...).

    Observations leave as :func:`themis.environments.observations.prepare_observations` makes
    them, after the domain's wrappers: ``obs_transform`` applied, images channels-first
    ``(C, H, W)`` (this is the one place where images are transposed).

    Raises:
        ConfigError: unknown domain or env, ``env_kwargs`` the env does not accept, or a bad
            ``obs_transform``.
    """
    if render_mode != "human":  # before the domain's suite imports MuJoCo (DMC: dm_control)
        choose_gl_backend()
    dom = get_domain(domain)
    env_id = dom.resolve(env)
    if render_mode == "rgb_array" and sys.platform.startswith("linux") and not (
            os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        # off-screen frames need no video device; without this, pygame-based envs (classic
        # control, Box2D) print "XDG_RUNTIME_DIR is invalid" on headless machines
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    kwargs = {**dom.make_kwargs, **env_kwargs}
    mujoco_frames = render_mode == "rgb_array" and dom.make is None and is_mujoco(env_id)
    if render_mode == "rgb_array" and (mujoco_frames or dom.mujoco_make) \
            and os.environ.get("MUJOCO_GL", "").lower() in NO_GL_BACKEND:
        raise ConfigError(f"{env} renders clips with MuJoCo, but MUJOCO_GL="
                          f"{os.environ['MUJOCO_GL']}: no libEGL (NVIDIA) or libOSMesa was found; "
                          "install one (apt-get install libosmesa6) or set MUJOCO_GL to a "
                          "backend this machine has")
    if mujoco_frames:
        kwargs = {"width": render_size, "height": render_size, **kwargs}
        if "camera_id" not in kwargs and "camera_name" not in kwargs:
            # the model's tracking camera keeps the agent in view (a trained HalfCheetah leaves
            # gymnasium's default free camera within a second); models without one keep it
            kwargs["camera_name"] = "track"
    try:
        if dom.make is not None:
            e = dom.make(env_id, render_mode, render_size,
                         seed if task_seed is None else task_seed, **kwargs)
        else:  # no render_mode=None: envs without rendering (seals' diagnostics) refuse it
            if render_mode is not None:
                kwargs["render_mode"] = render_mode
            e = gym.make(env_id, **kwargs)
    except TypeError as err:
        raise ConfigError(f"env={env}: gym.make rejected env_kwargs {env_kwargs}: {err}") from None
    if render_mode == "rgb_array" and hasattr(e.unwrapped, "mujoco_renderer"):
        e = LightMujocoRender(e)  # gymnasium's MuJoCo envs and Meta-World (not DMC's own)
    e = dom.wrap(e)
    try:
        e = prepare_observations(e, obs_transform)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if seed is not None:
        e.reset(seed=seed)
        e.action_space.seed(seed)
    return e


def episode_limit(env: gym.Env) -> int | None:
    """The time limit of an env in agent steps: its ``max_episode_steps`` (frames divided by the
    skip of a ``MaxAndSkipObservation``, MovingDot), MiniGrid's ``max_steps``, Atari's frame
    limit in agent steps, or None if it has none."""
    spec = env.spec
    wrapper: Any
    if spec is not None and spec.max_episode_steps is not None:
        skip, wrapper = 1, env
        while wrapper is not None:
            if isinstance(wrapper, gym.wrappers.MaxAndSkipObservation):
                skip *= int(wrapper._skip)
            wrapper = getattr(wrapper, "env", None)
        return -(-int(spec.max_episode_steps) // skip)
    max_steps = getattr(env.unwrapped, "max_steps", None)
    if isinstance(max_steps, int):
        return max_steps
    ale = getattr(env.unwrapped, "ale", None)
    if ale is not None:  # ALE: max_num_frames_per_episode emulator frames
        frames = int(ale.getInt("max_num_frames_per_episode"))
        skip = getattr(env.unwrapped, "_frameskip", 1)
        skip = skip if isinstance(skip, int) else 1
        inner: Any = env
        while inner is not None:  # AtariPreprocessing repeats each action frame_skip times
            if isinstance(inner, gym.wrappers.AtariPreprocessing):
                skip *= int(inner.frame_skip)
            inner = getattr(inner, "env", None)
        return frames // skip if frames > 0 else None
    return None


def frame_stack_size(env: gym.Env) -> int:
    """``k`` when observations are stacks of the last ``k`` frames (gymnasium's
    ``FrameStackObservation`` with reset padding, e.g. Atari), else 1."""
    inner: Any = env
    while inner is not None:
        if isinstance(inner, gym.wrappers.FrameStackObservation) and \
                isinstance(inner.padding_type, str) and inner.padding_type == "reset":
            return int(inner.stack_size)
        inner = getattr(inner, "env", None)
    return 1
