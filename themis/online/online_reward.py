"""The agent side of online preference learning: :class:`OnlineReward`.

Shared by the wrappers of :mod:`themis.online.wrapper`, :mod:`themis.online.sb3` and the
asynchronous training of Themis's own loops (:mod:`themis.online.loop`): it records the steps a
sub-env takes, sends them to the background learner process
(:mod:`themis.online.learner_process`), takes the newest reward model it publishes between two
steps without waiting, and answers each step with r̂ (normalised, with a method's bonus where
one is configured). It starts the process, watches it for a crash and closes it, also at
interpreter exit.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from themis.methods.base import MethodContext, reward_with_bonus
from themis.methods.registry import build_methods
from themis.online.keys import online_config, saved_keys
from themis.online.learner_process import EnvSpec, main
from themis.online.segments import StepRecorder
from themis.online.weights import Ensemble, SharedWeights, flat_size
from themis.reward.ensemble import RewardEnsemble, reward_model_from
from themis.utils import ConfigError

START_TIMEOUT = 600.0
"""Seconds the constructor waits for the learner process to be ready (imports, a resumed
dataset, the fit of ``prefs_path``)."""

QUEUE_MESSAGES = 64
"""Step messages that may wait for the learner; when it falls further behind, the newest
steps are dropped (the agent never waits; a dropped message only thins the query pool)."""

STATS_COUNT = 10_000
"""Weight (in steps) of a new version's published r̂ statistics against the steps that follow."""

RESULTS = ("reward.csv", "preferences", "checkpoints")
"""What a wrapper's learner writes in its run dir."""

RESUMED_KEYS = ("warmup_reward", "n_initial_training_steps", "normalize_reward", "close_timeout")
"""The wrapper's own keys a resumed run takes from its ``online.yaml`` unless given again."""


class PreferenceLearnerError(RuntimeError):
    """The background preference learner stopped (a crash, or killed): raised in the agent's
    process at its next step, with the learner's last line."""


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
class OnlineReward:
    """The agent side of online preference learning, for ``n_envs`` sub-envs: records the
    steps, sends them to the learner process, returns r̂ of the newest model.

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

            try:  # a received run's file: plain YAML values only (a tag is refused)
                kept = yaml.safe_load((self.run_dir / "online.yaml").read_text()) or {}
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
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
        self.total_steps = 0
        self.use_true = online.warmup_reward == "true" or cfg.collect_prefs_only \
            or (not online.train_reward and online.reward_model is None)
        # reward_norm_std: each member normalised with running statistics, then averaged
        # (DRLHP; mrahtz's reward_predictor.py keeps them over the whole run), in place of
        # normalize_reward's normalisation of the mean
        from themis.reward.recipe import RewardNormaliser

        self.normaliser = RewardNormaliser(cfg.ensemble_size, cfg.reward_norm_std) \
            if cfg.reward_norm_std else None
        self.saved_prefs = threading.Event()
        self.saved_counts: dict[str, int] = {}
        self.forced_true = False
        # the methods that add to the agent's reward (the learner process runs the others)
        self.bonus_methods = build_methods(cfg, MethodContext(
            cfg.segment, obs_dim, self.action_dim, self.obs_dtype,
            clock=lambda: self.total_steps), only=("reward_bonus",))
        capacity = cfg.replay_buffer_capacity or 100_000
        self.flush_steps = max(256, 4 * cfg.segment * n_envs)
        self.recorder = StepRecorder(n_envs, cfg.segment, self.obs_shape, self.obs_dtype,
                                     self.action_dim, self.flush_steps + cfg.segment)
        self.last_flush = time.monotonic()
        self.dropped = 0

        # --- the learner process
        spec = EnvSpec(env_id, self.obs_shape, self.obs_dtype.name, self.action_dim,
                       self.discrete, max_episode_steps, capacity)
        self.start_learner(model, spec, {
            "resume": resume, "reward_model": online.reward_model,
            "train_reward": online.train_reward,
            "reward_checkpoint_interval": online.reward_checkpoint_interval})

    def start_learner(self, model: RewardEnsemble, spec: EnvSpec,
                      online_dict: dict[str, Any]) -> None:
        """Start the learner process (:func:`themis.online.learner_process.main`) for
        ``self.cfg`` and wait until it is ready; ``model`` gives the published weights' size.

        Raises:
            ConfigError: the learner refused the setup (one line).
            PreferenceLearnerError: it could not start.
        """
        ctx: Any = torch.multiprocessing.get_context(
            "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn")
        if ctx.get_start_method() == "forkserver":
            ctx.set_forkserver_preload(["themis.online.learner_process"])
        self.shared = SharedWeights(ctx, flat_size(model))
        self.queue = ctx.Queue(maxsize=QUEUE_MESSAGES)
        control_read, self.control = ctx.Pipe(duplex=False)
        self.status, status_write = ctx.Pipe(duplex=False)
        cfg = self.cfg
        threads = int(cfg.torch_threads) if str(cfg.torch_threads).isdigit() \
            and int(cfg.torch_threads) > 0 else 1
        terminal = cfg.human_teacher and cfg.teacher_ui == "terminal"
        self.process = ctx.Process(
            target=main, name="themis-learner", daemon=True,
            args=(cfg, online_dict, spec, str(self.run_dir), self.shared, self.queue,
                  control_read, status_write, os.getpid(), threads,
                  os.getpid() if terminal else None))
        self.process.start()
        control_read.close()
        status_write.close()
        self._closed = False
        self.error: str | None = None
        self.closed_info: dict[str, Any] | None = None
        self.wait_ready()
        self.monitor = threading.Thread(target=self._watch, name="themis-learner-watch",
                                        daemon=True)
        self.monitor.start()
        _LIVE.add(self)

    def write_config(self) -> None:
        """``config.yaml`` (the Themis keys) and ``online.yaml`` (the wrapper's)."""
        import yaml
        from omegaconf import OmegaConf

        from themis.run.received_config import mark_config

        (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(
            OmegaConf.structured(self.cfg)))
        (self.run_dir / "online.yaml").write_text(yaml.safe_dump(saved_keys(self.online)))
        mark_config(self.run_dir)  # yours: resume=True trusts its addresses and paths

    def wait_ready(self) -> None:
        """Wait for the learner's ``ready``; its refusal or crash is raised here.

        Raises:
            ConfigError: the learner refused the setup (one line).
            PreferenceLearnerError: it crashed or ended before it was ready.
        """
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.status.poll(0.2):
                try:
                    kind, payload = self.status.recv()
                except (EOFError, OSError):
                    break
                if kind == "ready":
                    self.ready = payload
                    return
                self._stop_process(0)
                if kind == "error":
                    raise ConfigError(payload)
                raise PreferenceLearnerError(f"the preference learner could not start: "
                                             f"{payload}")
            if not self.process.is_alive():
                break
        self._stop_process(0)
        hint = "" if self.process.exitcode == 0 else \
            (" (a script that makes the wrapper must keep its training code under "
             "`if __name__ == \"__main__\":`, as for any multiprocessing program)")
        raise PreferenceLearnerError(f"the preference learner process ended before it was "
                                     f"ready (exit code {self.process.exitcode}){hint}")

    def _watch(self) -> None:
        """The monitor thread: the learner's messages (``crash``, ``closed``) and its end."""
        while True:
            try:
                kind, payload = self.status.recv()
            except (EOFError, OSError):
                if not self._closed and self.error is None:
                    self.process.join(5)
                    self.error = (f"the preference learner process ended (exit code "
                                  f"{self.process.exitcode})")
                return
            if kind == "crash":
                self.error = f"the preference learner crashed: {payload}"
            elif kind == "closed":
                self.closed_info = payload
            elif kind == "saved":
                self.saved_counts = dict(payload)
                self.saved_prefs.set()

    def check(self) -> None:
        """Raise the learner's error in the agent's process.

        Raises:
            PreferenceLearnerError: the learner crashed or was killed.
        """
        if self.error is not None:
            raise PreferenceLearnerError(self.error)

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

    @property
    def model_in_use(self) -> bool:
        """Whether the returned reward is r̂ now (a model version past
        ``n_initial_training_steps``, and no switch to the true reward)."""
        return self.version >= max(1, self.online.n_initial_training_steps) \
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

    def record(self, i: int, obs: np.ndarray, action: np.ndarray, true_reward: float,
               terminated: bool, frame: np.ndarray | None = None) -> None:
        """Record sub-env ``i``'s step (see :meth:`StepRecorder.add`)."""
        if frame is not None and self.frame_height is not None:
            from themis.environments.frames import downscale

            frame = downscale(np.asarray(frame), self.frame_height)
        self.recorder.add(i, obs, action, true_reward, terminated, frame)

    def end_episode(self, i: int) -> None:
        """Sub-env ``i``'s episode ended after its last recorded step."""
        self.recorder.end_episode(i)

    def stepped(self, n: int) -> None:
        """``n`` env steps were recorded: send what is due to the learner."""
        self.total_steps += n
        if self.recorder.pending >= self.flush_steps or (
                self.recorder.pending and time.monotonic() - self.last_flush > 1.0):
            self.flush()

    def flush(self, block: bool = False) -> None:
        """Send the recorded runs to the learner (dropped when its queue is full)."""
        import queue

        pending = self.recorder.pending
        runs, ended = self.recorder.take()
        self.last_flush = time.monotonic()
        if not runs and not ended:
            return
        try:
            self.queue.put(("steps", runs, ended, self.total_steps), block=block,
                           timeout=5 if block else None)
        except queue.Full:
            if not self.dropped:
                print(f"themis: the preference learner is behind the agent: {pending} steps "
                      "were not sent to it (queries come from the steps it has; the agent does "
                      "not wait)", file=sys.stderr, flush=True)
            self.dropped += pending

    def save_prefs(self, timeout: float = 60.0) -> dict[str, int]:
        """Ask the learner to write its labels as ``train_prefs/`` and ``val_prefs/`` in the
        run dir (after the steps sent so far) and wait until it has.

        Returns:
            ``{"train": n, "val": m}``: the labels in each.

        Raises:
            PreferenceLearnerError: the learner crashed, or did not answer in ``timeout`` s.
        """
        self.check()
        self.saved_prefs.clear()
        self.flush(block=True)
        self.queue.put(("save_prefs",), timeout=timeout)
        if not self.saved_prefs.wait(timeout):
            self.check()
            raise PreferenceLearnerError(f"the preference learner did not save the "
                                         f"preferences within {timeout:.0f} s")
        return dict(self.saved_counts)

    # ------------------------------------------------------------------ switches
    def switch_to_true_reward(self) -> None:
        """Return the env's reward from now on (r̂ still goes to ``info``)."""
        self.forced_true = True

    def switch_to_predicted_reward(self) -> None:
        """Return r̂ again (once a model is in use; the warm-up reward before)."""
        self.forced_true = False

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """Send the last steps, let the learner gather the last answers and save, stop it.
        Waits at most ``close_timeout`` seconds, then stops it by force (what it saved stays:
        labels on disk, web answers in the label store for ``resume=True``)."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        if self.process.is_alive():
            import queue

            self.flush(block=True)
            try:
                self.queue.put(("close",), timeout=5)
            except queue.Full:
                try:
                    self.control.send("close")
                except OSError:
                    pass
        self._stop_process(self.online.close_timeout)

    def _stop_process(self, timeout: float) -> None:
        self._closed = True
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.queue.cancel_join_thread()  # nothing left to read it: never wait on it
        self.queue.close()
        self.control.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:
                pass


_LIVE: weakref.WeakSet[OnlineReward] = weakref.WeakSet()


@atexit.register
def _close_live() -> None:
    """At interpreter exit (also after Ctrl-C), close the learners still running: they save
    before multiprocessing's own exit handler would terminate them."""
    for core in list(_LIVE):
        try:
            core.close()
        except Exception:
            pass
