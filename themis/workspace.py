"""The Workspace: what one run owns — envs, agent, store, preference learner, logger — and the
pieces both training loops share (evaluation, CSV rows, checkpoints, snapshots).

The loops themselves are drivers (:mod:`themis.loops.pebble` for SAC, :mod:`themis.loops.prefppo`
for PPO) that do not inherit from each other; the entry point picks one from the action space
(:func:`themis.train.make_workspace`) and hands it to the Workspace, which asks it for the agent
and its store and calls it to run. A checkpoint is the list of the components' ``state_dict``.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from themis.agents import Agent
from themis.agents.encoders import observation_kind, random_encoder
from themis.buffers import EpisodeStore
from themis.checkpoint import (
    CheckpointError,
    UnsafeFileError,
    load_checkpoint,
    rng_states,
    safe_load,
    save_checkpoint,
    set_rng_states,
    truncate_csv,
)
from themis.config import TrainConfig, frame_capacity, frame_size, job_prefix
from themis.envs import episode_limit, frame_stack_size, get_domain, make_env
from themis.evaluation import run_episodes
from themis.feedback import PreferenceLearner, RoundReport
from themis.feedback.factory import (
    make_label_store,
    make_learner,
    start_label_server,
    teacher_description,
)
from themis.frames import FrameStore
from themis.intrinsic import StateEntropyReward
from themis.label_store import LabelStore
from themis.logger import Logger, plot_learning_curve
from themis.reward import RewardEnsemble, save_reward_model
from themis.threads import ThreadGovernor, apply_threads, choose_threads
from themis.utils import ConfigError, get_device, set_seed_everywhere

SNAPSHOT_VERSION = 1


class Driver(Protocol):
    """A training loop (a module: :mod:`themis.loops.pebble`, :mod:`themis.loops.prefppo`)."""

    NAME: str
    METHOD: str

    def make_agent(self, ws: Workspace) -> Agent: ...
    def store(self, ws: Workspace) -> EpisodeStore: ...
    def run(self, ws: Workspace, until: int) -> None: ...
    def eval_action(self, ws: Workspace, obs: np.ndarray) -> Any: ...
    def resumed(self, ws: Workspace) -> None: ...


class Workspace:
    """Everything one run owns.

    Args:
        cfg: a composed :class:`themis.config.TrainConfig`.
        run_dir: where CSVs, checkpoints and plots go (created if missing).
        driver: the training loop that fits the env's action space.

    Raises:
        ConfigError: invalid configuration, unknown domain/env, missing snapshot, a checkpoint
            that does not fit.
    """

    def __init__(self, cfg: DictConfig | TrainConfig, run_dir: Path, driver: Driver) -> None:
        if isinstance(cfg, DictConfig):
            # A plain dataclass: attribute access in the hot loop costs nanoseconds, not µs.
            cfg = OmegaConf.to_object(cfg)  # type: ignore[assignment]
        assert isinstance(cfg, TrainConfig)
        self.cfg, self.driver = cfg, driver
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        set_seed_everywhere(cfg.seed)
        self.device = get_device(cfg.device)
        self.rng = np.random.default_rng(cfg.seed)

        # --- environments (a person watches clips: frames rendered for the recent steps)
        self.needs_frames = cfg.human_teacher or cfg.xplain_action or cfg.xplain_state
        self.env = make_env(cfg.domain, cfg.env, seed=cfg.seed,
                            render_mode="rgb_array" if self.needs_frames else None,
                            render_size=frame_size(cfg), **cfg.env_kwargs)
        self.eval_env = make_env(cfg.domain, cfg.env, seed=cfg.seed + 10_000, task_seed=cfg.seed,
                                 **cfg.env_kwargs)
        self.env_id = get_domain(cfg.domain).resolve(cfg.env)
        self.max_episode_steps = episode_limit(self.env)
        if self.max_episode_steps is not None and cfg.segment > self.max_episode_steps:
            raise ConfigError(f"segment={cfg.segment} is longer than the episode limit "
                              f"({self.max_episode_steps} steps) of {self.env_id}")
        obs_space, action_space = self.env.observation_space, self.env.action_space
        self.obs_shape = tuple(obs_space.shape or ())
        try:
            self.obs_kind = observation_kind(self.obs_shape)
        except ValueError as e:
            raise ConfigError(f"{self.env_id}: {e}") from None
        self.obs_dim = int(np.prod(self.obs_shape))
        self.obs_dtype = np.float32 if self.obs_kind == "vector" else np.uint8
        self.frame_stack = frame_stack_size(self.env)  # stored once per frame, not per stack
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_dim = int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) \
            else int(np.prod(action_space.shape or ()))

        # --- PyTorch threads (themis/threads.py: the measured rule, 1 while the cores are shared)
        net = cfg.sac if driver.NAME == "sac" else cfg.ppo
        batch = cfg.sac.batch_size if driver.NAME == "sac" else \
            cfg.ppo.num_envs * cfg.ppo.num_steps // cfg.ppo.num_minibatches
        try:
            self.thread_choice = choose_threads(
                cfg.torch_threads, agent=driver.NAME, obs_kind=self.obs_kind,
                device=self.device.type, hidden_dim=net.hidden_dim, batch_size=batch)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.thread_governor: ThreadGovernor | None = apply_threads(self.thread_choice)

        # --- agent, store, intrinsic reward
        self.agent = driver.make_agent(self)
        self.buffer = driver.store(self)
        # state entropy of pixels and grids: k-NN in a fixed random encoder's features (RE3)
        self.feature_encoder = None if self.obs_kind == "vector" else \
            random_encoder(self.obs_shape, seed=cfg.seed).to(self.device)
        self.state_entropy = StateEntropyReward(cfg.topK, cfg.entropy_pool_size,
                                                encoder=self.feature_encoder,
                                                scale=cfg.state_entropy_scale)

        # --- preference learning: frames for clips, label store, learner (channel inside)
        self.frames = FrameStore(frame_capacity(cfg), self.buffer.capacity,
                                 frame_size(cfg)) if self.needs_frames else None
        web = make_label_store(self)
        self.label_store: LabelStore | None = web[0] if web is not None else None
        self.label_tokens: list[tuple[str, str | None]] = web[1] if web is not None else []
        self.label_server: Any = None
        self.learner: PreferenceLearner | None = make_learner(self) if cfg.learn_reward else None
        self.reward_model: RewardEnsemble | None = \
            self.learner.model if self.learner is not None else None

        # --- counters
        self.step = 0
        self.episode = 0  # training episodes finished (the id of the current one, for SAC)
        self.episodes_started = 0  # PPO's episode ids, in the order its envs start them
        self.running_episodes: list[int] = []  # ids of the episodes in progress (the driver's)
        self.pretraining_done = False
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=10)
        self.recent_lengths: collections.deque[int] = collections.deque(maxlen=10)
        self.last_episode_reward = float("nan")
        self.interact_count = 0
        self.last_checkpoint_step = 0
        self.metrics: dict[str, Any] = {}
        self.pretrain_end = cfg.num_seed_steps + cfg.num_unsup_steps
        self.start_time = time.time()

        resume_state = self.read_checkpoint() if cfg.resume else None
        if resume_state is not None:
            for stream in ("train", "eval", "reward"):  # rows after the checkpoint come again
                truncate_csv(self.run_dir / f"{stream}.csv", int(resume_state["step"]))
        self.logger = Logger(self.run_dir, backends=cfg.logger,
                             purge_step=int(resume_state["step"]) if resume_state else None,
                             prefix=job_prefix())
        if resume_state is not None:
            try:
                self.load_state_dict(resume_state)
            except ValueError as e:  # e.g. a checkpoint of other observation/action shapes
                self.logger.close()
                raise ConfigError(f"resume: the checkpoint does not fit this run: {e}") from None
            self.logger.info(f"resumed from {self.run_dir / 'checkpoints'} at step {self.step} "
                             f"({self.total_feedback} queries asked)", "cyan")
        elif cfg.pretrained_snapshot:
            self.load_snapshot(Path(cfg.pretrained_snapshot))

    # ------------------------------------------------------------------ running
    def run(self, until: int | None = None) -> None:
        """Train from the current step up to ``until`` (default: the end) with the driver."""
        if self.label_store is not None and self.label_server is None:
            self.label_server = start_label_server(self)
        self.driver.run(self, self.cfg.num_train_steps if until is None else until)

    def logger_info(self, message: str, colour: str = "") -> None:
        """A console line (also for the learner and channels, built before the logger)."""
        self.logger.info(message, colour or None)

    @property
    def total_feedback(self) -> int:
        return self.learner.total_feedback if self.learner is not None else 0

    @property
    def labeled_feedback(self) -> int:
        return self.learner.labeled_feedback if self.learner is not None else 0

    @property
    def reward_accuracy(self) -> float:
        return self.learner.reward_accuracy if self.learner is not None else float("nan")

    @property
    def phase(self) -> str:
        if self.step < self.cfg.num_seed_steps:
            return "seed"
        if not self.pretraining_done:
            return "unsup"
        if self.cfg.collect_prefs_only:
            return "collect"
        return "reward" if self.cfg.learn_reward else "true_reward"

    def banner(self, extra: str = "") -> None:
        """The run's first console line: env, agent, reward source, device, run dir."""
        cfg = self.cfg
        if not cfg.learn_reward:
            reward = "environment"
        elif cfg.human_teacher:
            where = self.run_dir / ("web/clips" if cfg.teacher_ui == "web" else "queries")
            reward = f"learned from a person ({teacher_description(cfg)}, clips in {where})"
        elif cfg.max_feedback == 0:
            reward = f"learned from the saved preferences in {cfg.prefs_path}"
        else:
            reward = f"learned from {teacher_description(cfg)}"
        self.logger.info(
            f"Themis | {self.env_id} | agent {self.driver.NAME} ({self.agent_reason}: "
            f"{self.env.action_space}){extra} | reward: {reward} | device {self.device}, "
            f"{self.thread_choice.describe()} | "
            f"run dir {self.run_dir}", "cyan")

    @property
    def agent_reason(self) -> str:
        return f"{'auto' if self.cfg.agent == 'auto' else 'agent=' + self.cfg.agent}: " \
            f"{type(self.env.action_space).__name__} action space"

    def feedback_due(self) -> bool:
        """A feedback round is due: every ``num_interact`` steps while feedback is open."""
        return self.learner is not None and self.interact_count >= self.cfg.num_interact \
            and self.learner.is_open()

    def feedback_round(self, first: bool = False, ask: bool = True) -> RoundReport | None:
        """One round of the learner (queries from the last ``query_pool_episodes`` finished
        episodes; ``ask=False``: only gather the answers that exist), logged."""
        assert self.learner is not None
        pool = max(0, self.episodes_started - self.cfg.query_pool_episodes
                   - len(self.running_episodes))
        report = self.learner.round(self.buffer, self.step, first, pool, self.recent_returns,
                                    self.recent_lengths, self.query_slots, ask=ask)
        if report is not None:
            row = report._asdict()
            row.update(row.pop("method_stats"))
            self.logger.reward.write(row)
            console = {k: v for k, v in row.items() if k not in ("sampler", "new_labels")}
            if self.label_store is not None:
                console.update(new_labels=report.new_labels, pending=self.learner.pending())
            self.logger.console("reward", console)
        self.interact_count = 0
        return report

    def query_slots(self, steps: np.ndarray) -> np.ndarray:
        """Which store slots ``steps`` (any shape) a query may use: steps of finished episodes
        only, as B-Pref's ``get_queries`` and its successors' (an episode in progress is left
        out), and, when a person watches clips, steps whose frames are kept."""
        ok = ~np.isin(self.buffer.episode[steps], self.running_episodes)
        if self.frames is not None:
            ok &= self.frames.has(steps)
        return ok

    def end_episode(self, episode_return: float, length: int) -> None:
        """Record a finished training episode: recent returns (teacher margin), ``train.csv``."""
        self.last_episode_reward = episode_return
        self.recent_returns.append(episode_return)
        self.recent_lengths.append(length)
        self.logger.train.write({
            "step": self.step, "episode": self.episode, "episode_reward": episode_return,
            "episode_length": length, "total_feedback": self.total_feedback,
            "labeled_feedback": self.labeled_feedback, "reward_accuracy": self.reward_accuracy,
            "phase": self.phase, "duration": time.time() - self.start_time,
            # fixed columns (NaN before the first update): the CSV header is the first row
            **{k: float(self.metrics[k]) if k in self.metrics else float("nan")
               for k in self.agent.METRICS}})
        self.episode += 1

    def log_progress(self, fps: float) -> None:
        """The periodic console line."""
        self.logger.console("train", {
            "step": self.step, "phase": self.phase, "fps": fps,
            "episode_reward": self.last_episode_reward, "total_feedback": self.total_feedback,
            "reward_acc": self.reward_accuracy})

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> float:
        """Mean true return of ``num_eval_episodes`` episodes (the driver's evaluation action:
        SAC's mean action, a PPO sample); one ``eval.csv`` row, with ``success_rate`` (share of
        episodes where ``info["success"]`` was true at some step) for envs that report it."""
        returns, successes = run_episodes(self.eval_env, self.eval_action,
                                          self.cfg.num_eval_episodes, self.cfg.seed + 10_000)
        stats = self.learner.stats.as_dict() if self.learner is not None else \
            {"skip_fraction": float("nan"), "equal_fraction": float("nan"),
             "oracle_agreement": float("nan")}
        row = {"step": self.step, "episode": self.episode,
               "episode_reward": float(np.mean(returns)),
               "episode_reward_std": float(np.std(returns)),
               "total_feedback": self.total_feedback, "labeled_feedback": self.labeled_feedback,
               "reward_accuracy": self.reward_accuracy, **stats}
        if successes:  # envs that report info["success"] (Meta-World)
            row["success_rate"] = float(np.mean(successes))
        self.logger.eval.write(row)
        self.logger.console("eval", row)
        return row["episode_reward"]

    def eval_action(self, obs: np.ndarray) -> Any:
        """The action of evaluation episodes (the driver's choice)."""
        return self.driver.eval_action(self, obs)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoints(self) -> None:
        """Write agent and reward-model checkpoints and the preference dataset."""
        ckpt = self.run_dir / "checkpoints"
        ckpt.mkdir(exist_ok=True)
        torch.save({"agent": self.agent.state_dict(), "step": self.step, "env": self.env_id},
                   ckpt / "agent.pt")
        if self.learner is not None:
            save_reward_model(self.learner.model, ckpt / "reward_model.pt", step=self.step,
                              env=self.env_id)
            self.learner.dataset.save(self.run_dir / "preferences")

    def maybe_checkpoint(self, force: bool = False) -> None:
        """A full checkpoint every ``checkpoint_frequency`` steps (or now, with ``force``)."""
        if force or self.step - self.last_checkpoint_step >= self.cfg.checkpoint_frequency:
            save_checkpoint(self.state_dict(), self.run_dir / "checkpoints")
            self.last_checkpoint_step = self.step

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run: counters and the components' state dicts
        (see :mod:`themis.checkpoint`)."""
        state: dict[str, Any] = {
            "version": SNAPSHOT_VERSION, "env": self.env_id, "agent_name": self.driver.NAME,
            "step": self.step, "episode": self.episode,
            "episodes_started": self.episodes_started,
            "pretraining_done": self.pretraining_done,
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "last_episode_reward": self.last_episode_reward,
            "interact_count": self.interact_count,
            "agent": self.agent.state_dict(), "buffer": self.buffer.state_dict(),
            "state_entropy_stats": self.state_entropy.stats.state_dict(),
            "state_entropy_range": self.state_entropy.range_state(),
            "rng": self.rng.bit_generator.state, "global_rng": rng_states(),
            "action_space_rng": self.env.action_space.np_random.bit_generator.state,
        }
        if self.learner is not None:
            state.update(self.learner.state_dict())
        return state

    def read_checkpoint(self) -> dict[str, Any]:
        """The run's last intact checkpoint.

        Raises:
            ConfigError: none intact, or one of another env.
        """
        try:
            state, path = load_checkpoint(self.run_dir / "checkpoints", self.device)
        except CheckpointError as e:
            prefs = self.run_dir / "preferences"
            hint = (f"; the labels given so far are in {prefs}: start a new run with "
                    f"prefs_path={prefs} to keep them") if (prefs / "meta.json").is_file() \
                else ""
            raise ConfigError(f"resume: {e}{hint}") from None
        if state.get("env") != self.env_id:
            raise ConfigError(f"resume: the checkpoint {path} is for env={state.get('env')}, "
                              f"not {self.env_id}")
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output (also one of an earlier Themis version).
        The preference labels come from the run's ``preferences/`` folder."""
        for key in ("step", "episode", "pretraining_done", "last_episode_reward",
                    "interact_count"):
            setattr(self, key, state[key])
        self.episodes_started = int(state.get("episodes_started", 0))
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state.get("recent_lengths", []))  # older checkpoints: none
        self.agent.load_state_dict(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.state_entropy.stats.load_state_dict(state["state_entropy_stats"])
        self.state_entropy.low, self.state_entropy.high = state.get(  # older: none kept
            "state_entropy_range", [float("inf"), float("-inf")])
        self.rng.bit_generator.state = state["rng"]
        set_rng_states(state["global_rng"])
        self.env.action_space.np_random.bit_generator.state = state["action_space_rng"]
        self.last_checkpoint_step = self.step
        if self.learner is not None:
            self.learner.load_state_dict(state)
        self.driver.resumed(self)

    def save_snapshot(self, path: Path | None = None) -> Path:
        """Snapshot after pretraining: agent, store, counters, entropy statistics and the
        recent returns (the teacher's first margin)."""
        path = path or self.run_dir / "snapshot.pt"
        torch.save({
            "version": SNAPSHOT_VERSION, "env": self.env_id, "domain": self.cfg.domain,
            "step": self.step, "episode": self.episode,
            "agent_name": self.driver.NAME, "agent": self.agent.state_dict(),
            "buffer": self.buffer.state_dict(),
            "state_entropy_stats": self.state_entropy.stats.state_dict(),
            "state_entropy_range": self.state_entropy.range_state(),
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
        }, path)
        return path

    def load_snapshot(self, path: Path) -> None:
        """Continue from a pretraining snapshot.

        Raises:
            ConfigError: the file is missing or was written for another env or shape.
        """
        if not path.is_file():
            raise ConfigError(f"pretrained_snapshot={path} does not exist; run "
                              "./themis_pretrain.sh first or drop the option")
        try:
            snap = safe_load(path, self.device)
        except UnsafeFileError as e:
            raise ConfigError(f"pretrained_snapshot: {e}") from None
        if not isinstance(snap, dict):
            raise ConfigError(f"pretrained_snapshot={path} is not a Themis snapshot")
        if snap.get("env") != self.env_id:
            raise ConfigError(f"pretrained_snapshot={path} was made for env={snap.get('env')}, "
                              f"not {self.env_id}")
        try:
            self.agent.load_state_dict(snap["agent"])
            self.buffer.load_state_dict(snap["buffer"])
        except ValueError as e:
            raise ConfigError(f"pretrained_snapshot={path}: {e}") from None
        self.state_entropy.stats.load_state_dict(snap["state_entropy_stats"])
        self.state_entropy.low, self.state_entropy.high = snap.get(
            "state_entropy_range", [float("inf"), float("-inf")])
        self.recent_returns.extend(float(r) for r in snap.get("recent_returns", []))
        self.recent_lengths.extend(int(n) for n in snap.get("recent_lengths", []))
        self.step = int(snap["step"])
        self.episode = int(snap["episode"]) + 1
        self.logger.info(f"loaded snapshot {path} at step {self.step}", "cyan")

    def finish(self) -> None:
        """Final checkpoints (a finished run can be extended with resume= and a larger
        num_train_steps), learning-curve PNG, closing of the logs.

        Web: the labeling server stops first, then the answers that arrived since the last
        round are gathered, saved and trained on, so every answer the server accepted is in
        ``preferences/``. (Answers given later to ``scripts/label_server.py`` wait in the store
        for ``resume=``.)"""
        if self.label_server is not None:
            self.label_server.stop()
            self.label_server = None
            self.logger.info("labeling server stopped; keep labeling this run with "
                             f"scripts/label_server.py {self.run_dir}", "cyan")
        if self.learner is not None and self.label_store is not None \
                and self.label_store.ungathered_count():
            self.feedback_round(ask=False)
        self.save_checkpoints()
        self.maybe_checkpoint(force=True)
        self.logger.close()
        if self.thread_governor is not None:
            self.thread_governor.stop()
        for env in (self.env, self.eval_env):  # frees renderers (OSMesa/EGL contexts) in order
            env.close()
        eval_csv = self.run_dir / "eval.csv"
        if eval_csv.exists():
            method = self.driver.METHOD if self.cfg.learn_reward else \
                f"{self.driver.NAME.upper()}, true reward"
            plot_learning_curve(eval_csv, self.run_dir / "learning_curve.png",
                                title=f"{self.env_id} ({method})")
        self.logger.info(f"done: {self.run_dir}", "cyan")
