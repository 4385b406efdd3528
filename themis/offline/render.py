"""Frames of a dataset's segments, for people to watch: a MuJoCo locomotion env put in the state
each observation describes, and rendered.

An offline dataset holds observations, not frames. gymnasium's MuJoCo locomotion envs observe
the joint positions without the first ``k`` (the torso's x, or x and y: the
``exclude_current_positions_from_observation`` default) and then every joint velocity, so the
simulator state of a step is those numbers with the left-out positions put back. They are
integrated from the torso's velocity over the segment (``x_{t+1} = x_t + v_x,t · dt``, starting
at 0), so a clip moves as the recorded motion did; the tracking camera follows the torso as it
does in an online run's clips. Envs whose observation is not ``qpos[k:]`` then ``qvel``
are refused with one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from themis.utils import ConfigError

POSITIONS_LEFT_OUT = {"HalfCheetahEnv": 1, "HopperEnv": 1, "Walker2dEnv": 1, "SwimmerEnv": 2,
                      "AntEnv": 2, "HumanoidEnv": 2, "HumanoidStandupEnv": 2}
"""gymnasium's locomotion envs and how many leading positions their observation leaves out."""


def left_out_positions(env: Any) -> int:
    """How many leading joint positions ``env``'s observation leaves out (0 when it keeps them).

    Raises:
        ConfigError: not one of :data:`POSITIONS_LEFT_OUT`'s MuJoCo envs.
    """
    base = env.unwrapped
    name = type(base).__name__
    if name not in POSITIONS_LEFT_OUT or not hasattr(base, "set_state"):
        raise ConfigError(f"{name}: clips of a dataset's segments are rendered for gymnasium's "
                          f"MuJoCo locomotion envs ({', '.join(sorted(POSITIONS_LEFT_OUT))})")
    return POSITIONS_LEFT_OUT[name] if getattr(
        base, "_exclude_current_positions_from_observation", True) else 0


def states(env: Any, observations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The simulator states ``(qpos (T, nq), qvel (T, nv))`` of a segment's observations
    ``(T, obs_dim)`` (module docstring: left-out positions integrated from 0).

    Raises:
        ConfigError: an env :func:`left_out_positions` refuses, or observations too short for
            its positions and velocities.
    """
    k = left_out_positions(env)
    base = env.unwrapped
    nq, nv = int(base.model.nq), int(base.model.nv)
    obs = np.asarray(observations, dtype=np.float64)
    if obs.ndim != 2 or obs.shape[1] < nq - k + nv:
        raise ConfigError(f"observations of shape {obs.shape} do not hold the {nq - k} positions "
                          f"and {nv} velocities of {type(base).__name__}")
    qpos = np.zeros((len(obs), nq))
    qpos[:, k:] = obs[:, :nq - k]
    qvel = obs[:, nq - k:nq - k + nv]
    if k:  # the torso's x (and y), integrated from its velocity
        qpos[1:, :k] = np.cumsum(qvel[:-1, :k] * float(base.dt), axis=0)
    return qpos, qvel


def segment_frames(env: Any, observations: np.ndarray) -> np.ndarray:
    """Rendered frames ``(T, h, w, 3)`` uint8 of a segment's observations ``(T, obs_dim)``,
    in an env made with ``render_mode="rgb_array"`` (reset once before).

    Raises:
        ConfigError: as :func:`states`.
    """
    qpos, qvel = states(env, observations)
    frames = []
    for position, velocity in zip(qpos, qvel, strict=True):
        env.unwrapped.set_state(position, velocity)
        frames.append(np.asarray(env.render(), dtype=np.uint8))
    return np.stack(frames)
