"""MovingDot: a white dot moved around a black frame; the true reward favours the middle.

The test environment of mrahtz's reproduction of Deep RL from Human Preferences
(github.com/mrahtz/gym-moving-dot, whose dynamics and reward this follows), where an agent learns
from synthetic preferences to move the dot to the middle in 0.15M timesteps.

- Observation: a 210 × 160 RGB frame, the size of an Atari screen, black (0) with a 4 × 4 white
  dot (255) centred on the dot's position ``(x, y)``.
- Actions (``Discrete(5)``): 0 do nothing, 1 down (y + 1), 2 right (x + 1), 3 up (y − 1), 4 left
  (x − 1); one pixel per frame, the dot kept inside the frame (x in [2, 157], y in [2, 207]).
- Reward: +1 when the dot moved closer to the middle ``(80, 105)``, −1 when it moved away, 0
  when its distance stayed (Euclidean distance in pixels); ``info["distance"]`` is the distance
  after the step.
- Episodes: 1000 frames (a time limit: truncation); the dot starts at a uniformly random position
  (``random_start=True``, the default) or in the top-left corner.

Registered ids: ``MovingDotNoFrameskip-v0`` (the name DRLHP's Atari wrappers expect) and its
synonym ``MovingDot-v0``, frame by frame as in gym-moving-dot. The Themis domain ``MovingDot``
(``themis.environments.domains``) adds the Atari preprocessing DRLHP ran it with
(:func:`atari_preprocessing`:
4-frame skip with max-pooling, 84 × 84 grayscale, 4 stacked frames), so one agent step moves the
dot 4 pixels, an episode has 250 agent steps and a step's reward is in [−4, 4].

Differences from gym-moving-dot: the start position is drawn inside the reachable area (there a
start within 2 pixels of the left or top edge drew no dot until the first step), and the
generator is gymnasium's (``reset(seed=...)``).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

WIDTH, HEIGHT = 160, 210
"""Frame size in pixels (an Atari screen)."""
HALF_DOT = 2
"""The dot covers ``[x − 2, x + 2) × [y − 2, y + 2)``."""
MIDDLE = (80, 105)
"""``(x, y)`` the true reward pulls the dot towards."""
MOVES = {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (0, -1), 4: (-1, 0)}
"""Action -> ``(dx, dy)``: noop, down, right, up, left."""
MAX_FRAMES = 1000
"""Frames per episode (gym-moving-dot's ``max_steps``)."""


class MovingDotEnv(gym.Env[np.ndarray, np.int64]):
    """The MovingDot environment (see the module docstring).

    Args:
        render_mode: ``"rgb_array"`` (the observation frame) or ``None``.
        random_start: a uniformly random start position (else the top-left corner).

    Shapes: observations ``(210, 160, 3)`` uint8.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 60}  # noqa: RUF012

    def __init__(self, render_mode: str | None = None, random_start: bool = True) -> None:
        self.render_mode = render_mode
        self.random_start = random_start
        self.observation_space = gym.spaces.Box(0, 255, (HEIGHT, WIDTH, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(len(MOVES))
        self.pos = (HALF_DOT, HALF_DOT)
        """The dot's ``(x, y)`` in pixels."""

    @staticmethod
    def clip(x: int, y: int) -> tuple[int, int]:
        """``(x, y)`` kept where the whole dot is inside the frame."""
        return (min(max(x, HALF_DOT), WIDTH - 1 - HALF_DOT),
                min(max(y, HALF_DOT), HEIGHT - 1 - HALF_DOT))

    def distance(self) -> float:
        """Euclidean distance of the dot from the middle, in pixels."""
        return math.hypot(self.pos[0] - MIDDLE[0], self.pos[1] - MIDDLE[1])

    def frame(self) -> np.ndarray:
        """The current frame ``(210, 160, 3)`` uint8."""
        ob = np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)
        x, y = self.pos
        ob[y - HALF_DOT:y + HALF_DOT, x - HALF_DOT:x + HALF_DOT] = 255
        return ob

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if self.random_start:
            self.pos = self.clip(int(self.np_random.integers(0, WIDTH)),
                                 int(self.np_random.integers(0, HEIGHT)))
        else:
            self.pos = self.clip(0, 0)
        return self.frame(), {"distance": self.distance()}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = int(action)
        if a not in MOVES:
            raise ValueError(f"MovingDot actions are 0-4, got {action!r}")
        before = self.distance()
        dx, dy = MOVES[a]
        self.pos = self.clip(self.pos[0] + dx, self.pos[1] + dy)
        after = self.distance()
        reward = 1.0 if after < before else -1.0 if after > before else 0.0
        return self.frame(), reward, False, False, {"distance": after}

    def render(self) -> np.ndarray | None:  # type: ignore[override]
        return self.frame() if self.render_mode == "rgb_array" else None

    def get_action_meanings(self) -> list[str]:
        """Names of the actions, as ALE envs give them."""
        return ["NOOP", "DOWN", "RIGHT", "UP", "LEFT"]


def atari_preprocessing(env: gym.Env, frame_skip: int = 4, size: int = 84,
                        stack: int = 4) -> gym.Env:
    """The Atari preprocessing of DRLHP's runs (Mnih et al. 2015, as OpenAI baselines'
    ``wrap_deepmind``) for an env of RGB frames: each action repeated ``frame_skip`` frames
    (rewards summed, the last two frames max-pooled), grayscale, resized to ``size`` × ``size``
    (OpenCV, area interpolation), the last ``stack`` frames stacked -> ``(stack, size, size)``
    uint8. Rewards are not clipped (MovingDot's step reward is in [−4, 4])."""
    import cv2

    def warp(frame: np.ndarray) -> np.ndarray:  # baselines' WarpFrame, in OpenCV
        gray = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
        return cv2.resize(gray, (size, size), interpolation=cv2.INTER_AREA)

    env = gym.wrappers.MaxAndSkipObservation(env, skip=frame_skip)
    env = gym.wrappers.TransformObservation(env, warp,
                                            gym.spaces.Box(0, 255, (size, size), np.uint8))
    return gym.wrappers.FrameStackObservation(env, stack)


for _id in ("MovingDotNoFrameskip-v0", "MovingDot-v0"):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point="themis.environments.moving_dot:MovingDotEnv",
                     max_episode_steps=MAX_FRAMES)
