"""MuJoCo as every MuJoCo domain needs it: the OpenGL backend, its warnings, cheap frames.

Shared by the domain registry (:mod:`themis.environments.domains`: gymnasium's MuJoCo envs,
seals) and the suites (:mod:`themis.environments.suites`: DeepMind Control, Meta-World); MuJoCo
itself is imported only inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
from typing import Any

import gymnasium as gym

log = logging.getLogger(__name__)
_seen_mujoco_warnings: set[str] = set()


NO_GL_BACKEND = frozenset({"off", "disable", "disabled", "false", "0"})
"""``MUJOCO_GL`` values with which MuJoCo and dm_control render nothing (dm_control's
``_render/constants.py``)."""


def choose_gl_backend() -> str:
    """Choose MuJoCo's OpenGL backend as the launchers do (``scripts/gl_backend.sh``):
    ``MUJOCO_GL`` as set, else ``egl`` on NVIDIA machines (``/dev/nvidia0``) that have
    ``libEGL`` (GPU containers often do not: ``import mujoco`` then failed with a traceback),
    else ``osmesa`` (software) where ``libOSMesa`` is installed, else ``disable``: nothing
    renders (a clip asks for a backend and says so), but training runs — with ``osmesa`` and no
    ``libOSMesa``, ``import dm_control`` failed with a traceback (seen on a GPU machine's image;
    docs/benchmarks/pixels.md). Sets the variable, which MuJoCo, dm_control and gymnasium read
    when they first import or render, and returns it.

    Without it, a headless process that renders MuJoCo falls through gymnasium's backend
    search (GLFW first) and fails with "an OpenGL platform library has not been loaded".
    :func:`themis.environments.domains.make_env` calls it, so every script that makes an env
    renders as the launchers do.
    """
    if not os.environ.get("MUJOCO_GL"):
        if os.path.exists("/dev/nvidia0") and ctypes.util.find_library("EGL") is not None:
            os.environ["MUJOCO_GL"] = "egl"
        elif ctypes.util.find_library("OSMesa") is not None:
            os.environ["MUJOCO_GL"] = "osmesa"
        else:
            os.environ["MUJOCO_GL"] = "disable"
    return os.environ["MUJOCO_GL"]


def _mujoco_warning(message: str) -> None:
    """Log each distinct MuJoCo warning once (deprecation notes from gymnasium's model files at
    debug level) instead of MuJoCo's default: stderr on every env and a MUJOCO_LOG.TXT in cwd."""
    text = message.strip()
    if text in _seen_mujoco_warnings:
        return
    _seen_mujoco_warnings.add(text)
    log.log(logging.DEBUG if "deprecated" in text else logging.WARNING, "MuJoCo: %s", text)


def route_mujoco_warnings() -> None:
    """Send MuJoCo's warnings to logging, each distinct one once (instead of stderr on every
    env and a ``MUJOCO_LOG.TXT`` in the working directory), and quiet the INFO notes of PyOpenGL
    and of dm_control (absl's logger: its OpenGL backend and MuJoCo version lines).
    Called by every MuJoCo domain's ``setup``; a warning callback set by someone else wins."""
    # PyOpenGL (imported by MuJoCo's renderers) announces at INFO that an optional speed-up
    # module is missing; that is not news for a Themis user
    logging.getLogger("OpenGL").setLevel(logging.WARNING)
    # dm_control announces at INFO, through absl's logger (which the launchers' console
    # handler prints), which OpenGL backend it imports and MuJoCo's version: "MUJOCO_GL=osmesa,
    # attempting to import ..." and "MuJoCo library version is: 3.3.0" on every DMC and
    # Meta-World launch. Its warnings and errors still come through.
    absl = logging.getLogger("absl")
    if absl.level == logging.NOTSET or absl.level < logging.WARNING:
        absl.setLevel(logging.WARNING)
    try:
        import mujoco
    except ImportError:  # pragma: no cover - MuJoCo is a dependency, but domains need not be
        return
    if hasattr(mujoco, "set_mju_user_warning") and mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


def is_mujoco(env_id: str) -> bool:
    """Whether a registered id is one of gymnasium's MuJoCo envs or built on one (seals)."""
    entry = gym.spec(env_id).entry_point
    return "mujoco" in (entry if isinstance(entry, str) else getattr(entry, "__module__", ""))


class LightMujocoRender(gym.Wrapper):
    """Renders MuJoCo frames without shadows and reflections: on CPU renderers (OSMesa, EGL on
    llvmpipe) that makes a 128×128 HalfCheetah frame about 10× cheaper (75 ms -> 7.5 ms), and a
    48×48 Meta-World frame (three lights, 4096-pixel shadow maps) 62 -> 15 ms, which matters
    when every step is rendered for clips. :func:`themis.environments.domains.make_env` wraps
    every env that renders through gymnasium's ``mujoco_renderer`` (gymnasium's MuJoCo envs,
    Meta-World)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        import mujoco

        self._flags = (int(mujoco.mjtRndFlag.mjRND_SHADOW),
                       int(mujoco.mjtRndFlag.mjRND_REFLECTION))
        self._light = False

    def render(self) -> Any:
        frame = self.env.render()
        if not self._light:  # the viewer and its scene exist after the first render
            viewer = getattr(getattr(self.env.unwrapped, "mujoco_renderer", None), "viewer", None)
            scene = getattr(viewer, "scn", None)
            if scene is not None:
                for flag in self._flags:
                    scene.flags[flag] = 0
                self._light = True
                frame = self.env.render()
        return frame
