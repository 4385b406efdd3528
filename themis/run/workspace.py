"""The Workspace: what one run owns — envs, agent, store, preference learner, logger — with its
counters and ``state_dict``, and the calls both loops share (episodes, feedback rounds, logs,
evaluation, checkpoints). The run's start is :mod:`themis.run.snapshot`'s, checkpoint files
:mod:`themis.run.checkpoint`'s, console text :mod:`themis.run.plan`'s, the end of a run
:mod:`themis.run.closing`'s.

The loops themselves are drivers (:mod:`themis.loops.pebble` for SAC, :mod:`themis.loops.prefppo`
for PPO) that do not inherit from each other; the entry point picks one from the action space
(:func:`themis.builder.make_workspace`) and hands it to the Workspace, which asks it for the agent
and its store and calls it to run. A checkpoint is the list of the components' ``state_dict``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from themis.agents import agent_of, rollout_steps
from themis.agents.encoders import random_encoder
from themis.agents.intrinsic import StateEntropyReward
from themis.core.precision import flush_denormals, resolve_precision
from themis.crowd.label_store import LabelStore
from themis.feedback import QueryPool, RoundReport
from themis.feedback.factory import (
    LearnerSpec,
    make_episode_clips,
    make_label_store,
    make_learner,
    run_title,
    start_label_server,
)
from themis.reward import RewardEnsemble
from themis.run import plan
from themis.run.checkpoint import (
    resume_state,
    rng_states,
    save_checkpoint,
    save_models,
    set_rng_states,
)
from themis.run.config import TrainConfig, job_prefix
from themis.run.envs import make_envs, make_frame_store, renders_frames
from themis.run.evaluation import evaluation_row
from themis.run.logger import Logger
from themis.run.protocols import Driver, RunLearner
from themis.run.run_time import RunClock
from themis.run.snapshot import SNAPSHOT_VERSION, start_from
from themis.run.threads import run_threads
from themis.tracking import start_tracking
from themis.utils import ConfigError, get_device, set_seed_everywhere


class Workspace:
    """Everything one run owns.

    Args:
        cfg: a resolved :class:`themis.run.config.TrainConfig` (a plain dataclass: attribute
            access in the hot loop costs nanoseconds; :func:`themis.builder.make_workspace`).
        run_dir: where CSVs, checkpoints and plots go (created if missing).
        driver: the training loop that fits the env's action space.
        async_learner: builds the learner of ``reward_training=async`` from the workspace
            (:class:`themis.online.loop.AsyncLearner`, passed by
            :func:`themis.builder.make_workspace`, so the workspace and the learner that
            reads it do not import each other); either learner is a
            :class:`themis.run.protocols.RunLearner` to the loops.

    Raises:
        ConfigError: invalid configuration, unknown domain/env, missing snapshot, a checkpoint
            that does not fit.
        ValueError: ``reward_training=async`` without ``async_learner``.
    """

    def __init__(self, cfg: TrainConfig, run_dir: Path, driver: Driver,
                 async_learner: Callable[[Workspace], RunLearner] | None = None) -> None:
        self.cfg, self.driver = cfg, driver
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        set_seed_everywhere(cfg.seed)
        self.device = get_device(cfg.device)
        self.rng = np.random.default_rng(cfg.seed)

        # --- environments (a person watches clips: frames rendered for the recent steps)
        self.env, self.eval_env, self.facts = make_envs(cfg)
        facts = self.facts

        # --- PyTorch threads (themis/run/threads.py: one per run unless the config says more)
        self.thread_choice = run_threads(cfg, driver.NAME, facts.obs_kind, self.device.type)
        self.precision = resolve_precision(cfg.precision, self.device)  # None: float32
        flush_denormals()  # Adam's moments of dead units: subnormal floats are slow on a CPU

        # --- agent, store, intrinsic reward
        self.agent = driver.make_agent(self)
        try:  # a store too big for this machine ends the run here, not hours later
            self.buffer = driver.store(self)
        except MemoryError as e:
            key = "replay_buffer_capacity" if cfg.replay_buffer_capacity else "num_train_steps"
            raise ConfigError(f"{key}={getattr(cfg, key)}: {e}; lower {key}") from None
        # state entropy of pixels and grids: k-NN in a fixed random encoder's features (RE3)
        self.feature_encoder = None if facts.obs_kind == "vector" else \
            random_encoder(facts.obs_shape, seed=cfg.seed).to(self.device)
        self.state_entropy = StateEntropyReward(cfg.topK, cfg.entropy_pool_size,
                                                encoder=self.feature_encoder,
                                                scale=cfg.state_entropy_scale)

        # --- preference learning: frames for clips, label store, learner (channel inside)
        self.frames = make_frame_store(cfg, self.buffer.capacity) if renders_frames(cfg) \
            else None
        # the last full episode, beside the pair a person labels (DRLHP's second window; in
        # async runs the learner process writes it)
        self.episode_clips: Any = make_episode_clips(self) \
            if cfg.human_teacher and cfg.reward_training == "sync" else None
        web = make_label_store(self) if cfg.reward_training == "sync" else None
        self.label_store: LabelStore | None = web[0] if web is not None else None
        self.label_tokens: list[tuple[str, str | None]] = web[1] if web is not None else []
        self.label_server: Any = None
        if cfg.reward_training == "async":  # labels, store and training are in its process
            if async_learner is None:
                raise ValueError("reward_training=async needs async_learner "
                                 "(themis.builder.make_workspace passes it)")
            self.learner: RunLearner | None = async_learner(self)
        else:
            self.learner = make_learner(cfg, self.learner_spec()) if cfg.learn_reward else None
        self.reward_model: RewardEnsemble | None = \
            self.learner.model if self.learner is not None else None

        # --- counters
        self.step = 0
        self.episode = 0  # training episodes finished (the id of the current one, for SAC)
        self.episodes_started = 0  # episode ids given so far (start_episode)
        self.running_episodes: list[int] = []  # ids of the episodes in progress: not queried
        self.pretraining_done = False
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=10)
        self.recent_lengths: collections.deque[int] = collections.deque(maxlen=10)
        self.last_episode_reward = float("nan")
        self.last_eval_return = float("nan")  # the objective of hydra/sweeper=optuna
        self.round_step = 0  # the step of the last feedback round (feedback_due)
        self.last_checkpoint_step = 0
        self.last_checkpoint_time = time.monotonic()
        self.checkpointed_before_people = False  # see checkpoint_before_people
        self.start_time = time.time()
        self.clock = RunClock()  # the run's own time (run_time.json)

        resumed, path = resume_state(self.run_dir, facts.env_id, self.label_store,
                                     cfg.num_train_steps) if cfg.resume else (None, None)
        self.checkpoint_path: Path | None = path  # the checkpoint resumed from
        self.logger = Logger(self.run_dir,
                             backends=("csv", "tensorboard") if cfg.logger.tensorboard else
                             ("csv",),
                             purge_step=int(resumed["step"]) if resumed else None,
                             prefix=job_prefix())
        start_from(self, resumed)
        # W&B / MLflow (logger=wandb|mlflow): rows queued for their threads, never waited for
        self.tracking = start_tracking(cfg, cfg.logger, self.run_dir, self.facts.env_id,
                                       self.title, partial(self.logger_info, colour="yellow"))
        self.logger.attach(self.tracking)

    def learner_spec(self) -> LearnerSpec:
        """What the preference learner needs of this run (:func:`make_learner`)."""
        f = self.facts
        return LearnerSpec(
            f.env_id, f.obs_shape, f.obs_dtype, f.action_dim, f.discrete, f.frame_stack,
            f.max_episode_steps, self.device, self.precision, self.rng,
            self.run_dir, self.driver.NAME == "ppo", self.buffer, lambda: int(self.step),
            self.logger_info, self.feature_encoder, self.frames, self.label_store, self.agent,
            self.env, self.log_round, rollout_steps(self.cfg, self.driver.NAME))

    # ------------------------------------------------------------------ running
    def run(self, until: int | None = None) -> None:
        """Train from the current step up to ``until`` (default: the end) with the driver."""
        if self.label_store is not None and self.label_server is None:
            self.label_server = start_label_server(self)
        if self.learner is not None:
            self.learner.start()  # async: the learner process
        self.until = until  # the plan line of a pretraining run asks nothing
        self.running_episodes = []  # the driver starts its episodes afresh
        self.log_time, self.log_step = time.time(), self.step  # the progress line's steps/s
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

    @property
    def title(self) -> str:
        """Method, sampler and teacher (:func:`themis.feedback.factory.run_title`)."""
        return run_title(self.cfg, agent_of(self.cfg, self.driver.NAME))

    def feedback_due(self) -> bool:
        """A feedback round is due: every ``num_interact`` steps while feedback is open
        (``reward_training=async``: a new reward-model version is published)."""
        return self.learner is not None and \
            self.learner.round_due(self.step - self.round_step, self.cfg.num_interact)

    def feedback_round(self, first: bool = False, ask: bool = True,
                       final: bool = False) -> bool:
        """One round of the learner (queries from the last ``query_pool_episodes`` finished
        episodes; ``ask=False``: only gather the answers that exist; ``final``: the run ends,
        see :meth:`themis.feedback.PreferenceLearner.round`; ``reward_training=async``: the
        newest published version, ``first``: waited for). Returns whether r̂ changed."""
        assert self.learner is not None
        oldest = max(0, self.episodes_started - self.cfg.query_pool_episodes
                     - len(self.running_episodes))
        changed = self.learner.feedback_round(QueryPool(
            self.buffer, self.step, oldest, self.recent_returns, self.recent_lengths,
            self.query_slots), first, ask=ask, final=final)
        self.round_step = self.step
        return changed

    def log_round(self, report: RoundReport) -> None:
        """A round's ``reward.csv`` row and console line (web: with the queries pending)."""
        assert self.learner is not None
        plan.log_round(self.logger, report,
                       self.learner.pending() if self.label_store is not None else None)

    def query_slots(self, steps: np.ndarray) -> np.ndarray:
        """Which store slots ``steps`` (any shape) a query may use: steps of finished episodes
        only, as B-Pref's ``get_queries`` and its successors' (an episode in progress is left
        out), and, when a person watches clips, steps whose frames are kept."""
        ok = ~np.isin(self.buffer.episode[steps], self.running_episodes)
        if self.frames is not None:
            ok &= self.frames.has(steps)
        return ok

    def start_episode(self, episode: int | None = None) -> int:
        """An episode starts: its id (``episode``, SAC's count of finished episodes, or the
        next fresh one, for PPO's envs) is in progress, so no query is cut from it before
        :meth:`end_episode`. Returns the id."""
        episode = self.episodes_started if episode is None else episode
        self.episodes_started = max(self.episodes_started, episode + 1)
        self.running_episodes.append(episode)
        return episode

    def end_episode(self, episode_return: float, length: int, episode: int) -> None:
        """Record the finished training episode ``episode`` (an id of :meth:`start_episode`):
        recent returns (teacher margin), a ``train.csv`` row; its steps may now be queried."""
        self.running_episodes.remove(episode)
        self.last_episode_reward = episode_return
        self.recent_returns.append(episode_return)
        self.recent_lengths.append(length)
        metrics = self.agent.metrics  # of its last update
        self.logger.train.write({
            "step": self.step, "episode": self.episode, "episode_reward": episode_return,
            "episode_length": length, "total_feedback": self.total_feedback,
            "labeled_feedback": self.labeled_feedback, "reward_accuracy": self.reward_accuracy,
            "phase": self.phase, "duration": time.time() - self.start_time,
            # fixed columns (NaN before the first update): the CSV header is the first row
            **{k: float(metrics[k]) if k in metrics else float("nan")
               for k in self.agent.METRICS}})
        self.episode += 1

    def after_steps(self, n: int, evaluate: bool = False, checkpoint: bool = False) -> None:
        """After ``n`` more environment steps: the progress line every ``log_frequency`` steps,
        an evaluation every ``eval_frequency`` steps (or now, ``evaluate``), then a checkpoint
        every ``checkpoint_frequency`` steps (or now, ``checkpoint``)."""
        cfg, before = self.cfg, self.step - n
        if self.step // cfg.log_frequency > before // cfg.log_frequency:
            now = time.time()
            self.logger.console("train", {
                "step": self.step, "phase": self.phase,
                "fps": (self.step - self.log_step) / max(now - self.log_time, 1e-9),
                "episode_reward": self.last_episode_reward,
                "total_feedback": self.total_feedback, "reward_acc": self.reward_accuracy})
            self.log_time, self.log_step = now, self.step
        if evaluate or self.step // cfg.eval_frequency > before // cfg.eval_frequency:
            self.evaluate()
        self.maybe_checkpoint(force=checkpoint)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> float:
        """Mean true return of ``num_eval_episodes`` episodes (the driver's evaluation action:
        SAC's mean action, a PPO sample); one ``eval.csv`` row, with ``success_rate`` (share of
        episodes where ``info["success"]`` was true at some step) for envs that report it.
        Then the agent, reward model and labels a user takes are written
        (:meth:`save_checkpoints`), so that they are the evaluated ones."""
        stats = self.learner.stats.as_dict() if self.learner is not None else \
            dict.fromkeys(("skip_fraction", "equal_fraction", "oracle_agreement"), float("nan"))
        row = evaluation_row(self.eval_env, self.eval_action, self.cfg.num_eval_episodes,
                             self.cfg.seed + 10_000, self.step, self.episode, {
                                 "total_feedback": self.total_feedback,
                                 "labeled_feedback": self.labeled_feedback,
                                 "reward_accuracy": self.reward_accuracy, **stats})
        self.logger.eval.write(row)
        self.logger.console("eval", row)
        self.last_eval_return = row["episode_reward"]
        self.save_checkpoints()
        return row["episode_reward"]

    def eval_action(self, obs: np.ndarray) -> Any:
        """The action of evaluation episodes (the driver's choice)."""
        return self.driver.eval_action(self, obs)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoints(self, finished: bool = False) -> None:
        """The agent, the reward model and the labels as a user takes them (:func:`save_models`;
        ``finished`` only from the run's end, after its final checkpoint)."""
        save_models(self.run_dir, self.step, self.facts.env_id, self.agent, self.learner,
                    finished)

    def maybe_checkpoint(self, force: bool = False) -> None:
        """A full checkpoint every ``checkpoint_frequency`` steps (or now, with ``force``);
        ``reward_training=async``: the learner process checkpoints after the same steps."""
        if force or self.step - self.last_checkpoint_step >= self.cfg.checkpoint_frequency \
                or time.monotonic() - self.last_checkpoint_time >= 60 * self.cfg.checkpoint_minutes:
            if self.learner is not None:
                self.learner.checkpoint()  # async: the learner process after these steps
            state = self.state_dict()
            save_checkpoint(state, self.run_dir / "checkpoints")
            self.clock.write(self.run_dir, state["run_time"])
            self.last_checkpoint_step = self.step
            self.last_checkpoint_time = time.monotonic()

    def checkpoint_before_people(self, round_at: int) -> None:
        """A full checkpoint before the first feedback round that asks people (a person in the
        terminal or on the web), when the next one comes at step ``round_at``: a crash while
        they answer (``min_labels_before_training`` waits for them) then resumes from it with
        every answer given, and the resumed round does not post its queries again. Called by
        the drivers at the top of each iteration; writes once."""
        if self.learner is None or not self.cfg.human_teacher or self.pretraining_done \
                or round_at < self.cfg.pretrain_end \
                or self.checkpointed_before_people:
            return
        self.maybe_checkpoint(force=True)
        self.checkpointed_before_people = True

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run: counters and the components' state dicts
        (see :mod:`themis.run.checkpoint`)."""
        state: dict[str, Any] = {
            "version": SNAPSHOT_VERSION, "env": self.facts.env_id, "agent_name": self.driver.NAME,
            "step": self.step, "episode": self.episode,
            "episodes_started": self.episodes_started,
            "pretraining_done": self.pretraining_done,
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "last_episode_reward": self.last_episode_reward,
            "interact_count": self.step - self.round_step,
            "agent": self.agent.state_dict(), "buffer": self.buffer.state_dict(),
            "state_entropy_stats": self.state_entropy.stats.state_dict(),
            "state_entropy_range": self.state_entropy.range_state(),
            "rng": self.rng.bit_generator.state, "global_rng": rng_states(),
            "action_space_rng": self.env.action_space.np_random.bit_generator.state,
            "run_time": self.clock.seconds(),
        }
        if self.learner is not None:
            state.update(self.learner.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output (also one of an earlier Themis version).
        The preference labels come from the run's ``preferences/`` folder."""
        for key in ("step", "episode", "pretraining_done", "last_episode_reward"):
            setattr(self, key, state[key])
        self.round_step = self.step - int(state["interact_count"])
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
        self.clock.resume(state)
        if self.learner is not None:
            self.learner.load_state_dict(state)
        self.driver.resumed(self)
