"""Small gymnasium envs with observations of other layouts, for the tests of
:mod:`themis.environments.observations` (registered on import:
``domain=Gym env=tests.obs_envs:NAME``).

Each rewards the action that matches a bit of the observation (so a reward model has
something to learn) and ends after 50 steps.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class _Task(gym.Env):
    """The base: ``Discrete(2)`` (or ``Box(1)``) actions, reward 1 when the action matches the
    observation's hidden bit, 50 steps per episode."""

    action_space: gym.Space = gym.spaces.Discrete(2)

    def __init__(self, continuous: bool = False, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        if continuous:
            self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t, self.bit = 0, 0

    def observe(self) -> Any:
        raise NotImplementedError

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t, self.bit = 0, int(self.np_random.integers(2))
        return self.observe(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        chosen = int(np.asarray(action).reshape(-1)[0] > 0) if isinstance(
            self.action_space, gym.spaces.Box) else int(action)
        reward = float(chosen == self.bit)
        self.t += 1
        self.bit = int(self.np_random.integers(2))
        return self.observe(), reward, False, self.t >= 50, {}

    def image(self, shape: tuple[int, int, int], channels_last: bool) -> np.ndarray:
        """A uint8 image whose left or right half is bright (the bit)."""
        h, w = (shape[0], shape[1]) if channels_last else (shape[1], shape[2])
        img = self.np_random.integers(0, 60, (h, w), dtype=np.uint8)
        half = slice(w // 2, None) if self.bit else slice(None, w // 2)
        img[:, half] += 150
        c = shape[2] if channels_last else shape[0]
        return np.stack([img] * c, axis=-1 if channels_last else 0)


class ChannelsLast(_Task):
    """``(64, 64, 3)`` uint8 images, channels last (gymnasium's rgb_array layout)."""

    observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)

    def observe(self) -> np.ndarray:
        return self.image((64, 64, 3), channels_last=True)


class SmallImage(_Task):
    """``(3, 32, 32)`` uint8 images, channels first (CIFAR-sized)."""

    observation_space = gym.spaces.Box(0, 255, (3, 32, 32), np.uint8)

    def observe(self) -> np.ndarray:
        return self.image((3, 32, 32), channels_last=False)


class DictObs(_Task):
    """Dict observations: ``image`` ``(16, 16, 3)`` uint8 channels last, ``position`` a
    2-vector, ``mission`` a string."""

    observation_space = gym.spaces.Dict({
        "image": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
        "position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        "mission": gym.spaces.Text(20),
    })

    def observe(self) -> dict[str, Any]:
        return {"image": self.image((16, 16, 3), channels_last=True),
                "position": np.array([self.bit * 2 - 1, self.t / 50], np.float32),
                "mission": "brighthalf"}


class FloatImage(_Task):
    """``(32, 32, 3)`` float32 images in [0, 1] (Themis's CNNs take uint8 ones)."""

    observation_space = gym.spaces.Box(0.0, 1.0, (32, 32, 3), np.float32)

    def observe(self) -> np.ndarray:
        return self.image((32, 32, 3), channels_last=True).astype(np.float32) / 255


def position_and_bit(obs: dict[str, Any]) -> np.ndarray:
    """An ``obs_transform=tests.obs_envs:position_and_bit``: the position and the image's mean
    brightness of each half, as a 4-vector."""
    img = np.asarray(obs["image"], np.float32)
    w = img.shape[1]
    return np.concatenate([obs["position"], [img[:, : w // 2].mean() / 255,
                                             img[:, w // 2:].mean() / 255]]).astype(np.float32)


for _name, _cls in (("ChannelsLast-v0", ChannelsLast), ("SmallImage-v0", SmallImage),
                    ("DictObs-v0", DictObs), ("FloatImage-v0", FloatImage)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=_cls, max_episode_steps=50)
