"""DeepMind Control and Meta-World as Themis domains (see
:data:`themis.environments.domains.DOMAINS`).

- DeepMind Control runs through Shimmy's gymnasium bindings (``dm_control/walker-walk-v0``):
  dict observations flattened in a fixed key order with their names kept, 1000-step episodes,
  frames from the suite's camera 0 (its tracking camera for walker and cheetah).
- Meta-World v3 runs one task at a time (``gym.make("Meta-World/MT1", env_name=...)``) with one
  goal for the whole run, chosen by the task seed, 500-step episodes and ``info["success"]``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from themis.environments.actions import rescale_box_actions
from themis.environments.mujoco import choose_gl_backend, route_mujoco_warnings


class FlatDictObservation(gym.ObservationWrapper):
    """A dict of arrays (DeepMind Control) as one float32 vector, keys in the observation
    space's (sorted, fixed) order; :attr:`feature_names` names each entry (``velocity[3]``,
    ``height``) for the explanation panels."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Dict)
        self.keys = list(space.spaces)
        self.feature_names: list[str] = []
        for key in self.keys:
            size = int(np.prod(space[key].shape or ()))
            self.feature_names += [key] if not space[key].shape else \
                [f"{key}[{i}]" for i in range(size)]
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (len(self.feature_names),),
                                                np.float32)

    def observation(self, observation: dict[str, Any]) -> np.ndarray:
        return np.concatenate([np.asarray(observation[k], np.float32).reshape(-1)
                               for k in self.keys])


def dmc_setup() -> None:
    """Shimmy's registrations; dm-control 1.0.28's warnings that say nothing to a Themis user
    (quadruped's ``np.in1d``, infinite bounds cast to float32) go to the debug log."""
    import warnings

    warnings.filterwarnings("ignore", message=".*in1d.*", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message="overflow encountered in cast",
                            category=RuntimeWarning, module="gymnasium.spaces.box")
    route_mujoco_warnings()


def dmc_ids() -> list[str]:
    choose_gl_backend()  # dm_control reads MUJOCO_GL when it is imported
    import shimmy

    gym.register_envs(shimmy)
    return [i for i in gym.registry if i.startswith("dm_control/") and
            not i.startswith("dm_control/compatibility")]


def make_dmc(env_id: str, render_mode: str | None, render_size: int, task_seed: int | None,
              **kwargs: Any) -> gym.Env:
    """DeepMind Control through Shimmy: 1000-step episodes, frames from camera 0 (the suite's
    tracking camera, e.g. walker's ``side``) at ``render_size`` pixels square."""
    render_kwargs = {"height": render_size, "width": render_size, "camera_id": 0,
                     **kwargs.pop("render_kwargs", {})}
    env = gym.make(env_id, render_mode=render_mode, render_kwargs=render_kwargs,
                   max_episode_steps=kwargs.pop("max_episode_steps", 1000), **kwargs)
    return rescale_box_actions(FlatDictObservation(env))


METAWORLD_FEATURES = (["hand_x", "hand_y", "hand_z", "gripper"]
                      + [f"obj1_{a}" for a in ("x", "y", "z", "qw", "qx", "qy", "qz")]
                      + [f"obj2_{a}" for a in ("x", "y", "z", "qw", "qx", "qy", "qz")])
METAWORLD_FEATURES = [*METAWORLD_FEATURES, *(f"prev_{n}" for n in METAWORLD_FEATURES),
                      "goal_x", "goal_y", "goal_z"]


def metaworld_ids() -> list[str]:
    choose_gl_backend()  # MuJoCo reads MUJOCO_GL when it is imported
    import metaworld

    return list(metaworld.ALL_V3_ENVIRONMENTS)


class _FixedTask(gym.Wrapper):
    """Meta-World MT1 with one task for the whole run, chosen by the task seed: the first
    reset samples a task, later resets keep it.

    ``freeze_rand_vec=False`` and ``partially_observable=True`` make it the env the B-Pref
    lineage trains on (B-Pref's and its successors' ``utils.make_metaworld_env``: the v2 env class
    built directly, ``env._freeze_rand_vec = False``): every reset draws a new goal and object
    position (from the env's own generator, seeded by ``reset(seed=...)``) and the goal's three
    entries of the observation are zeros.
    """

    def __init__(self, env: gym.Env, task_seed: int | None, freeze_rand_vec: bool = True,
                 partially_observable: bool = False) -> None:
        super().__init__(env)
        self.task_seed, self._fixed = task_seed, False
        self.freeze_rand_vec, self.partially_observable = freeze_rand_vec, partially_observable
        self.feature_names = METAWORLD_FEATURES
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, env.observation_space.shape,
                                                np.float32)

    def reset(self, **kwargs: Any) -> Any:
        if not self._fixed:
            obs, info = self.env.reset(seed=self.task_seed)  # the run's task
            inner: Any = self.env
            while not hasattr(inner, "toggle_sample_tasks_on_reset"):
                inner = inner.env
            inner.toggle_sample_tasks_on_reset(False)
            base: Any = self.env.unwrapped
            if not self.freeze_rand_vec:  # a new goal and object position at every reset
                base._freeze_rand_vec, base.seeded_rand_vec = False, True
            if self.partially_observable != base._partially_observable:  # goal hidden: zeros
                base.__dict__.pop("sawyer_observation_space", None)  # a cached property
                base._partially_observable = self.partially_observable
            self._fixed = True
        obs, info = self.env.reset(**kwargs)
        return obs.astype(np.float32), info

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs.astype(np.float32), reward, terminated, truncated, info


def make_metaworld(name: str, render_mode: str | None, render_size: int,
                    task_seed: int | None, **kwargs: Any) -> gym.Env:
    """Meta-World v3 (``gym.make("Meta-World/MT1", env_name=...)``): 500-step episodes, one
    goal per task seed, ``info["success"]``, frames from the ``corner`` camera.

    ``kwargs`` may hold ``freeze_rand_vec`` (default true; false: a new random goal and object
    position at every reset) and ``partially_observable`` (default false; true: the goal hidden
    from the observation), Meta-World's own attribute names (``+env_kwargs.freeze_rand_vec=
    false +env_kwargs.partially_observable=true``: the B-Pref lineage's env, :class:`_FixedTask`);
    the rest go to ``gym.make``.
    """
    import metaworld  # noqa: F401  (registers Meta-World/*)

    freeze = bool(kwargs.pop("freeze_rand_vec", True))
    hidden = bool(kwargs.pop("partially_observable", False))
    options = {"camera_name": "corner", "width": render_size, "height": render_size, **kwargs}
    env = gym.make("Meta-World/MT1", env_name=name, seed=task_seed, render_mode=render_mode,
                   disable_env_checker=True, **options)  # its spaces trip gymnasium's checker
    return _FixedTask(env, task_seed, freeze_rand_vec=freeze, partially_observable=hidden)
