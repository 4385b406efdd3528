"""Action spaces as Themis's agents take them."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def rescale_box_actions(env: gym.Env) -> gym.Env:
    """Rescale a bounded ``Box`` action space to [-1, 1] (what SAC's tanh policy emits); other
    spaces (discrete, unbounded or already [-1, 1]) are left as they are."""
    space = env.action_space
    if isinstance(space, gym.spaces.Box) and np.all(np.isfinite(space.low)) and \
            np.all(np.isfinite(space.high)) and \
            (np.any(space.low != -1.0) or np.any(space.high != 1.0)):
        env = gym.wrappers.RescaleAction(env, min_action=np.float32(-1.0),
                                         max_action=np.float32(1.0))
    return env
