"""The wrappers' r̂: :class:`OnlineReward`.

Shared by the wrappers of :mod:`themis.online.wrapper` and :mod:`themis.online.sb3`: from the
wrapper's keys and the env's spaces it sets up the run (config, a resumed run's keys, a
pretrained model), takes the newest reward model the learner process publishes between two steps
without waiting, and answers each step with r̂ (normalised, with a method's bonus where one is
configured). The connection to the learner process (start, steps sent, crash watch, close) is
:class:`themis.online.learner_client.LearnerClient`'s.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from themis.methods.base import MethodContext, reward_with_bonus
from themis.methods.registry import build_methods
from themis.online.keys import online_config, saved_keys
from themis.online.learner_client import LearnerClient, PreferenceLearnerError
from themis.online.learner_process import EnvSpec
from themis.online.weights import Ensemble
from themis.reward.ensemble import reward_model_from
from themis.utils import ConfigError

STATS_COUNT = 10_000
"""Weight (in steps) of a new version's published r̂ statistics against the steps that follow."""

RESULTS = ("reward.csv", "preferences", "checkpoints")
"""What a wrapper's learner writes in its run dir."""

RESUMED_KEYS = ("warmup_reward", "n_initial_training_steps", "normalize_reward", "close_timeout")
"""The wrapper's own keys a resumed run takes from its ``online.yaml`` unless given again."""


# ---------------------------------------------------------------------- observations
def observation_transform(spec: Any, space: gym.Space) -> tuple[Callable[[Any], Any] | None,
                                                                gym.spaces.Box]:
    """The function applied to each observation before it is stored and given to the reward
    model, and the space it maps into: ``obs_transform`` (:func:`themis.environments.observations.
    make_obs_transform`), then images made channels-first
    (:func:`themis.environments.observations.channels_first_fn`), as
    :func:`themis.environments.domains.make_env` prepares a run's observations.

    Args:
        spec: ``None`` (the observation itself), a key of a ``Dict`` observation, a
            ``"module:function"`` path or a callable of one observation (DRLHP's
            ``obs_transform_func``).
        space: the env's (single) observation space.

    Raises:
        ConfigError: one line: a bad transform, or observations the reward model cannot take
            (a dict without a transform, images of floats; :func:`themis.environments.observations.
            unsupported`).
    """
    from themis.environments.observations import channels_first_fn, make_obs_transform, unsupported

    first: Callable[[Any], Any] | None = None
    if spec is not None:
        try:
            first, space = make_obs_transform(spec, space)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    layout, space = channels_first_fn(space)
    reason = unsupported(space)
    if reason is not None:
        raise ConfigError(reason)
    assert isinstance(space, gym.spaces.Box)
    if first is None:
        return layout, space
    if layout is None:
        return first, space
    pick, flip = first, layout
    return (lambda obs: flip(pick(obs))), space


def action_size(space: gym.Space) -> int:
    """Size of the action vector r̂ sees: ``n`` (one-hot) for ``Discrete``, else the flat size.

    Raises:
        ConfigError: an action space other than ``Box`` or ``Discrete``.
    """
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape or (1,)))
    raise ConfigError(f"{type(space).__name__} actions: the reward model takes Box or Discrete "
                      "actions")


# ---------------------------------------------------------------------- the shared part
class OnlineReward(LearnerClient):
    """The agent side of online preference learning, for ``n_envs`` sub-envs: records the
    steps and sends them to the learner process (:class:`LearnerClient`), returns r̂ of the
    newest model.

    Args:
        observation_space, action_space: one sub-env's spaces.
        n_envs: sub-envs stepped together (1 for a plain env).
        run_dir: the run folder.
        keys: the wrapper's keyword arguments (:func:`themis.online.keys.online_config`).
        env_id: the env's name (for the dataset, checkpoints and messages).
        max_episode_steps: the env's time limit, if any (the teacher's margin).
        frames: a person watches clips: the wrapper renders every step (``render_mode
            'rgb_array'``).

    Raises:
        ConfigError: one line for bad keys, spaces the wrapper cannot take, a run dir that
            holds another run, or a learner that refused its setup.
        PreferenceLearnerError: the learner process could not start.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, n_envs: int,
                 run_dir: str | os.PathLike[str], keys: dict[str, Any], env_id: str,
                 max_episode_steps: int | None) -> None:
        self._closed = True  # until the process runs
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            raise RuntimeError("a PreferenceLearningWrapper was made while its learner process "
                               "was starting: put the training code of your script under "
                               "`if __name__ == \"__main__\":`")
        self.n_envs, self.env_id = n_envs, env_id
        self.run_dir = Path(run_dir)
        self.transform, space = observation_transform(keys.get("obs_transform"),
                                                      observation_space)
        self.obs_shape = tuple(space.shape or ())
        vector = len(self.obs_shape) == 1
        self.obs_dtype = np.dtype(np.float32 if vector or space.dtype != np.uint8 else np.uint8)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_dim = action_size(action_space)
        self.eye = np.eye(self.action_dim, dtype=np.float32) if self.discrete else None
        obs_dim = int(np.prod(self.obs_shape))

        # --- config: keys, a resumed run's saved config, a pretrained model's architecture
        resume = bool(keys.get("resume", False))
        found = [name for name in RESULTS if (self.run_dir / name).exists()]
        if found and not resume:
            raise ConfigError(f"run dir {self.run_dir} already holds a run ({found[0]}); "
                              "continue it with resume=True, or give another run dir")
        saved = self.run_dir / "config.yaml"
        if resume and not saved.is_file():
            raise ConfigError(f"resume=True: no wrapper run in {self.run_dir} (config.yaml "
                              "missing)")
        pretrained = None
        if keys.get("reward_model") and not resume:
            from themis.reward.ensemble import load_reward_model

            try:
                model = load_reward_model(str(keys["reward_model"]))
            except (FileNotFoundError, ValueError) as e:
                raise ConfigError(f"reward_model={keys['reward_model']}: {e}") from None
            if (model.obs_dim, model.action_dim) != (obs_dim, self.action_dim):
                raise ConfigError(f"reward_model={keys['reward_model']} takes obs_dim="
                                  f"{model.obs_dim}, action_dim={model.action_dim}; this env "
                                  f"has {obs_dim}, {self.action_dim}")
            pretrained = model.config()
        if resume and (self.run_dir / "online.yaml").is_file():  # the run's own keys first
            import yaml

            from themis.core.safe_loading import check_yaml_file

            try:  # a received run's file: plain YAML values only (a tag is refused)
                check_yaml_file(self.run_dir / "online.yaml")
                kept = yaml.safe_load((self.run_dir / "online.yaml").read_text()) or {}
            except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(f"{self.run_dir / 'online.yaml'} is not readable as plain "
                                  f"YAML ({first})") from None
            if not isinstance(kept, dict):
                raise ConfigError(f"{self.run_dir / 'online.yaml'} is no key: value mapping")
            keys = {**{k: kept[k] for k in RESUMED_KEYS if k in kept}, **keys}
        self.cfg, self.online = online_config(keys, self.discrete, pretrained,
                                              saved if resume else None)
        cfg, online = self.cfg, self.online
        if max_episode_steps is not None and cfg.segment > max_episode_steps:
            raise ConfigError(f"segment={cfg.segment} is longer than the episode limit "
                              f"({max_episode_steps} steps) of {env_id}")
        self.frame_height = None
        if cfg.human_teacher:
            from themis.run.config import frame_size

            self.frame_height = frame_size(cfg)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if not resume:
                self.write_config()
        except OSError as e:  # a read-only or full run dir: one line, before any process
            raise ConfigError(f"run dir {self.run_dir} cannot be written "
                              f"({e.strerror or type(e).__name__}); give another run dir"
                              ) from None

        # --- the agent side's model copy and the returned reward
        try:
            model = reward_model_from(cfg, obs_dim, self.action_dim, self.obs_shape)
        except ValueError as e:  # e.g. reward_net=drlhp for vector observations
            raise ConfigError(str(e)) from None
        self.ensemble = Ensemble(model)
        self.version = 0  # the version in use (0: none yet)
        self.mean, self.var, self.count = 0.0, 1.0, 0.0  # running statistics of r̂
        self.epochs = 0.0  # passes over the labels the version in use was trained with
        self.use_true = online.warmup_reward == "true" or cfg.collect_prefs_only \
            or (not online.train_reward and online.reward_model is None)
        # reward_norm_std: each member normalised with running statistics, then averaged
        # (DRLHP; mrahtz's reward_predictor.py keeps them over the whole run), in place of
        # normalize_reward's normalisation of the mean
        from themis.reward.recipe import RewardNormaliser

        self.normaliser = RewardNormaliser(cfg.ensemble_size, cfg.reward_norm_std) \
            if cfg.reward_norm_std else None
        self.forced_true = False
        # the methods that add to the agent's reward (the learner process runs the others)
        self.bonus_methods = build_methods(cfg, MethodContext(
            cfg.segment, obs_dim, self.action_dim, self.obs_dtype,
            clock=lambda: self.total_steps), only=("reward_bonus",))
        capacity = cfg.replay_buffer_capacity or 100_000
        self.make_recorder(n_envs, self.obs_shape, self.obs_dtype, self.action_dim)

        # --- the learner process
        spec = EnvSpec(env_id, self.obs_shape, self.obs_dtype.name, self.action_dim,
                       self.discrete, max_episode_steps, capacity)
        self.start_learner(model, spec, {
            "resume": resume, "reward_model": online.reward_model,
            "train_reward": online.train_reward,
            "n_initial_training_steps": online.n_initial_training_steps,
            "reward_checkpoint_interval": online.reward_checkpoint_interval})

    def write_config(self) -> None:
        """``config.yaml`` (the Themis keys) and ``online.yaml`` (the wrapper's)."""
        import yaml
        from omegaconf import OmegaConf

        from themis.run.received_config import mark_config

        (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(
            OmegaConf.structured(self.cfg)))
        (self.run_dir / "online.yaml").write_text(yaml.safe_dump(saved_keys(self.online)))
        mark_config(self.run_dir)  # yours: resume=True trusts its addresses and paths

    # ------------------------------------------------------------------ per step
    def observations(self, obs: Any, n: int | None = None) -> np.ndarray:
        """Observations as stored: ``(*obs_shape)`` for one (``n=None``), ``(n, *obs_shape)``
        for a batch of ``n`` (transformed sub-env by sub-env; a dict batch split per key)."""
        if n is None:
            obs = obs if self.transform is None else self.transform(obs)
            return np.asarray(obs, dtype=self.obs_dtype).reshape(self.obs_shape)
        if self.transform is not None:  # a function of one observation, sub-env by sub-env
            fn = self.transform
            obs = np.stack([np.asarray(fn({k: v[i] for k, v in obs.items()}
                                          if isinstance(obs, dict) else obs[i]))
                            for i in range(n)])
        return np.asarray(obs, dtype=self.obs_dtype).reshape(n, *self.obs_shape)

    def action_vectors(self, actions: Any, n: int) -> np.ndarray:
        """Actions as r̂ sees them: ``(n, action_dim)`` float32, one-hot for ``Discrete``."""
        if self.eye is not None:
            return self.eye[np.asarray(actions, dtype=np.int64).reshape(n)]
        return np.asarray(actions, dtype=np.float32).reshape(n, self.action_dim)

    def refresh(self) -> None:
        """Take a newer published version, if one is there and free to copy."""
        got = self.shared.read(self.version)
        if got is None:
            return
        self.version, flat, stats = got
        self.ensemble.load_flat(flat)
        self.mean, self.var = float(stats[0]), float(stats[1])
        self.count = min(float(stats[2]), STATS_COUNT)
        self.epochs = float(stats[3])

    @property
    def model_in_use(self) -> bool:
        """Whether the returned reward is r̂ now: a published model trained with at least
        ``n_initial_training_steps`` passes over the labels (DRLHP's training steps; a
        pretrained model counts as trained), and no switch to the true reward."""
        return self.version >= 1 \
            and self.epochs >= max(1, self.online.n_initial_training_steps) \
            and not self.forced_true and not self.cfg.collect_prefs_only

    def rewards(self, obs: np.ndarray, actions: np.ndarray,
                true_rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rewards to return for ``n`` steps, and r̂ (normalised; NaN before the first
        model): ``obs (n, *obs_shape)`` the observations the actions were taken in,
        ``actions (n, action_dim)``, ``true_rewards (n,)``.

        Raises:
            PreferenceLearnerError: the learner crashed or was killed.
        """
        if self.error is not None:
            raise PreferenceLearnerError(self.error)
        self.refresh()
        n = len(true_rewards)
        if self.version == 0:
            predicted = np.full(n, np.nan)
        else:
            members = self.ensemble.members(obs, actions)
            if self.normaliser is not None:  # reward_norm_std (DRLHP)
                members = self.normaliser(members)
            mean = (members[0] if len(members) == 1 else members.mean(0)).astype(np.float64)
            self._update_stats(mean)
            raw = self.with_bonus(members, mean)
            predicted = (raw - self.mean) / (np.sqrt(self.var) + 1e-8) \
                if self.online.normalize_reward and self.normaliser is None else raw
        if self.model_in_use:
            return predicted, predicted
        if self.use_true or self.forced_true:
            return np.asarray(true_rewards, dtype=np.float64), predicted
        return np.zeros(n), predicted

    def with_bonus(self, members: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """``mean`` (float64), or the mean plus the methods' ``reward_bonus`` of the members
        ``(E, n)`` when a method adds one."""
        rewarded = reward_with_bonus(self.bonus_methods, members) if self.bonus_methods \
            else None
        return mean if rewarded is None else rewarded.astype(np.float64)

    def relabel_rewards(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """r̂ of stored steps with the version in use, as :meth:`rewards` would return it now
        (normalised with the current statistics, a method's bonus as it is now), without
        changing the statistics: ``obs (n, *obs_shape)``, ``actions (n, action_dim)`` ->
        ``(n,)`` float64. Zeros before the model is in use (what :meth:`rewards` returned)."""
        if not self.model_in_use:
            return np.zeros(len(obs))
        members = self.ensemble.members(obs, actions)
        if self.normaliser is not None:  # as the steps' rewards, statistics unchanged
            stats = self.normaliser.stats
            members = ((members - stats.mean[:, None]) / (stats.std[:, None] + 1e-8)
                       * self.normaliser.std).astype(np.float32)
        mean = (members[0] if len(members) == 1 else members.mean(0)).astype(np.float64)
        raw = self.with_bonus(members, mean)
        return (raw - self.mean) / (np.sqrt(self.var) + 1e-8) \
            if self.online.normalize_reward and self.normaliser is None else raw

    def _update_stats(self, values: np.ndarray) -> None:
        """Merge a batch of r̂ into the running mean and variance (Chan et al. 1979; plain
        floats for the one value of a single env's step)."""
        n = len(values)
        if n == 1:
            b_mean, b_var = float(values[0]), 0.0
        else:
            b_mean, b_var = float(values.mean()), float(values.var())
        total = self.count + n
        delta = b_mean - self.mean
        self.var = (self.var * self.count + b_var * n + delta * delta * self.count * n / total) \
            / total
        self.mean += delta * n / total
        self.count = min(total, STATS_COUNT)

    # ------------------------------------------------------------------ switches
    def switch_to_true_reward(self) -> None:
        """Return the env's reward from now on (r̂ still goes to ``info``)."""
        self.forced_true = True

    def switch_to_predicted_reward(self) -> None:
        """Return r̂ again (once a model is in use; the warm-up reward before)."""
        self.forced_true = False



__all__ = ["OnlineReward", "PreferenceLearnerError", "action_size", "observation_transform"]
