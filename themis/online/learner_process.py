"""The background learner: preference collection and reward training beside any agent.

:func:`main` is the target of the process :class:`themis.online.PreferenceLearningWrapper`
starts. It owns what a Themis run's preference learning owns — a bounded
:class:`~themis.agents.buffers.EpisodeStore` of the recent steps, the
:class:`~themis.feedback.PreferenceLearner` of :func:`themis.feedback.factory.make_learner`
(samplers, teachers, channels, methods, the ``preferences/`` dataset), the label store and
server for people on the web — and runs PEBBLE's feedback rounds on the steps the agent's
process sends (Christiano et al. 2017, Sec. 2.2.1: the policy, the preference collection and
the reward training run asynchronously; DRLHP's refactored ``HumanPreferencesEnvWrapper``).

Threads inside the process:

- the receiver takes step messages off the queue into an inbox (so a long round or a wait for
  people never stops the agent) and watches the agent's process: a closed control pipe or a
  vanished parent ends the learner, which then saves and exits (no orphan);
- the main thread moves the inbox into the store, runs a round every ``num_interact`` steps
  (the first after ``num_seed_steps``), gathers web answers between rounds (they enter training
  as they arrive), publishes each trained model (:class:`themis.online.weights.SharedWeights`)
  and checkpoints after each round.

A crash sends one line to the agent's process (the full traceback goes to
``RUN_DIR/learner_error.log``); a bad configuration found here (a ``prefs_path`` that does not
fit) is one :class:`~themis.utils.ConfigError` line raised by the wrapper's constructor.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from themis.agents.buffers import EpisodeStore
from themis.core.precision import flush_denormals
from themis.feedback.learner import PreferenceLearner, RoundReport
from themis.feedback.selector import DecayingSchedule
from themis.online.segments import Run, add_run
from themis.online.stream import QueryTarget
from themis.online.weights import SharedWeights
from themis.run.config import TrainConfig, frame_capacity, frame_size
from themis.utils import ConfigError

if TYPE_CHECKING:
    from themis.feedback.factory import LearnerSpec

ORPHAN_GRACE = 30.0
"""Seconds the learner may take to save after the agent's process is gone, then it exits."""

GATHER_EVERY = 2.0
"""Seconds between two looks for new web answers between rounds."""

STATS_ROWS = 20_000
"""Most recent stored steps whose r̂ gives a new version's normalisation statistics."""
PASSES_CHUNK_STEPS = 2048
"""``reward_schedule=passes``: most agent steps whose label-passes one call trains, so that
rounds and the agent's ``reward_max_lag`` see progress in steps of this size."""
PASSES_PUBLISH_STEPS = 10_000
"""``reward_schedule=passes``: agent steps between publications of the continuously trained
model (scoring the newest STATS_ROWS steps for its statistics takes seconds on pixels)."""


@dataclass
class EnvSpec:
    """What the learner knows of the agent's env (after ``obs_transform``)."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: str
    action_dim: int
    discrete: bool
    max_episode_steps: int | None
    capacity: int
    """Steps of the store of recent steps."""


class ProcessWorkspace:
    """The learner process's side of a run (what the Workspace is to the loop's side): its
    config, the store of the steps it receives, the frame ring, the label store and the step
    counter; :meth:`spec` is the :class:`~themis.feedback.factory.LearnerSpec`
    :func:`~themis.feedback.factory.make_learner` builds the learner from (the same kind of
    spec the Workspace gives in a sync run)."""

    def __init__(self, cfg: TrainConfig, spec: EnvSpec, run_dir: Path, logger: Any) -> None:
        from themis.agents.encoders import observation_kind
        from themis.environments.frames import FrameStore
        from themis.feedback.factory import make_label_store
        from themis.utils import get_device

        self.cfg, self.env_spec, self.run_dir, self.logger = cfg, spec, run_dir, logger
        self.obs_shape = tuple(spec.obs_shape)
        try:
            self.obs_kind = observation_kind(self.obs_shape)
        except ValueError as e:
            raise ConfigError(f"{spec.env_id}: {e}") from None
        self.device = get_device(cfg.device)
        try:
            self.buffer = EpisodeStore(self.obs_shape, spec.action_dim, spec.capacity,
                                       self.device, obs_dtype=np.dtype(spec.obs_dtype))
        except MemoryError as e:
            raise ConfigError(f"replay_buffer_capacity={spec.capacity}: {e}; lower it") from None
        self.frames = FrameStore(frame_capacity(cfg), spec.capacity, frame_size(cfg)) \
            if cfg.human_teacher else None
        self.step = 0
        web = make_label_store(self)
        self.label_store = web[0] if web is not None else None
        self.label_tokens = web[1] if web is not None else []

    def spec(self) -> LearnerSpec:
        """The :class:`~themis.feedback.factory.LearnerSpec` of this process: whole
        observations per slot (runs overlap: no frame links), no agent (explanations of the
        policy are refused), a method's clock counting the steps received."""
        from themis.agents.encoders import random_encoder
        from themis.core.precision import resolve_precision
        from themis.feedback.factory import LearnerSpec

        spec, cfg = self.env_spec, self.cfg
        encoder = None if self.obs_kind == "vector" else \
            random_encoder(self.obs_shape, seed=cfg.seed).to(self.device)
        return LearnerSpec(
            spec.env_id, self.obs_shape, np.dtype(spec.obs_dtype), spec.action_dim,
            spec.discrete, 1, spec.max_episode_steps, self.device,
            resolve_precision(cfg.precision, self.device), np.random.default_rng(cfg.seed),
            self.run_dir, False, self.buffer, lambda: int(self.step), self.logger_info,
            encoder, self.frames, self.label_store)

    def logger_info(self, message: str, colour: str = "") -> None:
        """A console line (learner, channels, label server)."""
        self.logger.info(message, colour or None)


class LearnerProcessState:
    """The learner process's state — its :class:`ProcessWorkspace`, the
    :class:`~themis.feedback.PreferenceLearner` inside it, the published versions — and its
    feedback rounds (see the module docstring). The loop's end of the process is
    :class:`themis.online.loop.AsyncLearner`, the wrappers' is
    :class:`~themis.online.online_reward.OnlineReward`.

    Args:
        cfg: the validated run config.
        online: the wrapper's keys (:class:`themis.online.keys.OnlineKeys` as a dict).
        spec: the env's shapes.
        run_dir: the run folder (``preferences/``, ``reward.csv``, ``checkpoints/``).
        shared: where trained versions are published.

    Raises:
        ConfigError: a ``prefs_path``, ``gold_path``, ``reward_model`` or checkpoint that does
            not fit, a labeling port taken, ...
    """

    def __init__(self, cfg: TrainConfig, online: dict[str, Any], spec: EnvSpec, run_dir: Path,
                 shared: SharedWeights) -> None:
        from themis.feedback.factory import make_episode_clips, make_learner, run_title
        from themis.run.logger import Logger
        from themis.utils import set_seed_everywhere

        self.cfg, self.online, self.spec, self.shared = cfg, online, spec, shared
        self.run_dir = run_dir
        self.loop = bool(online.get("loop", False))
        """The learner of Themis's own loop (``reward_training=async``,
        :mod:`themis.online.loop`): no ``train.csv`` rows (the loop writes them), checkpoints
        in ``checkpoints/learner/``."""
        set_seed_everywhere(cfg.seed)
        self.logger = Logger(run_dir, backends=("csv", "tensorboard") if cfg.logger.tensorboard
                             else ("csv",))
        self.space = ProcessWorkspace(cfg, spec, run_dir, self.logger)
        self.learner: PreferenceLearner = make_learner(cfg, self.space.spec())
        # the schedule as a target over the agent's steps (themis/online/stream.py): a round
        # asks what is due and not asked yet, so rounds the learner was too busy for are
        # asked later, never lost; with Themis's loop the decay is planned over its horizon
        self.target = QueryTarget(cfg.max_feedback, max(1, int(cfg.reward_batch)),
                                  cfg.num_seed_steps, cfg.num_interact, cfg.query_schedule,
                                  decay=self.learner.schedule if self.loop and isinstance(
                                      self.learner.schedule, DecayingSchedule) else None,
                                  decay_steps=cfg.query_decay_steps,
                                  first_queries=cfg.first_round_queries)
        self.learner.schedule = self.target
        if not online.get("train_reward", True):  # collect and save labels, train nothing
            self.learner.reward_update = 0
        self.ckpt_every = int(online.get("reward_checkpoint_interval", 0) or 0)
        self.retry_at = 0  # a round that could ask nothing waits for new steps
        self.episode_clips = make_episode_clips(self.space)
        self.store = self.space.buffer
        self.steps = 0  # env steps the agent took (all sub-envs), this run and resumed ones
        self.offset = 0  # steps before the resume
        self.last_round = 0  # step of the last asking round
        self.first_done = False
        self.asking_first = False  # inside the first round (its labels may be on disk already)
        self.pretraining_to_finish = False  # resumed during DRLHP's pretraining: finish it
        self.last_checkpoint_time = time.monotonic()
        self.episodes = 0  # episodes ended
        self.newest_episode = -1
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=10)
        self.recent_lengths: collections.deque[int] = collections.deque(maxlen=10)
        self.trainings = 0  # model versions published (trained models)
        self.pretrained = False  # started from a pretrained model: r̂ is usable at once
        self.initial_epochs = int(online.get("n_initial_training_steps", 0) or 0)
        """DRLHP's ``n_initial_training_steps``: passes over the labels before the wrapper
        returns r̂; until then the learner trains one more pass whenever it is idle."""
        self.passes_seen = 0  # reward_schedule=passes: agent steps trained for so far
        self.passes_published = 0  # ... and the step of the last publication
        self.cpu_before = 0.0  # CPU seconds of the learner processes before a resume
        self.last_log = 0
        self.label_server: Any = None
        self.status: Any = None  # the status pipe (set by main; replies to save_prefs)
        if online["resume"]:
            self.resume()
        elif online["reward_model"]:
            self.load_pretrained(online["reward_model"])
        elif cfg.prefs_path:
            self.learner.fit_saved_labels(cfg.prefs_path)
            if len(self.learner.dataset):
                self.publish()
        self.title = run_title(cfg, "sac").replace("PEBBLE", "online PEBBLE", 1)

    # ------------------------------------------------------------------ start
    def load_pretrained(self, path: str) -> None:
        """Start from a pretrained reward model (published at once as version 1).

        Raises:
            ConfigError: the file is not a reward model of this env's shapes.
        """
        from themis.reward.ensemble import load_reward_model

        try:
            model = load_reward_model(path)
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(f"reward_model={path}: {e}") from None
        self.learner.model.load_state_dict(model.state_dict())
        self.pretrained = True
        self.publish()

    @property
    def checkpoint_dir(self) -> Path:
        """``checkpoints/`` of the run dir (``checkpoints/learner/`` in Themis's loop)."""
        return self.run_dir / "checkpoints" / ("learner" if self.loop else "")

    def resume(self) -> None:
        """Continue from ``checkpoints/state.pt``: counters, model, optimiser, generators; the
        labels come from ``preferences/`` (and the web store, reconciled with it).

        Raises:
            ConfigError: no intact checkpoint, or one of another env.
        """
        from themis.core.safe_loading import MALFORMED, describe
        from themis.run.checkpoint import CheckpointError, load_checkpoint

        try:
            state, path = load_checkpoint(self.checkpoint_dir, "cpu")
        except CheckpointError as e:
            raise ConfigError(f"resume: {e}") from None
        if not isinstance(state, dict) or state.get("env") != self.spec.env_id:
            raise ConfigError(f"resume: {path} is not a checkpoint of this wrapper's env "
                              f"({self.spec.env_id})")
        try:
            self.learner.load_state_dict(state)
            self.steps = self.last_round = int(state["step"])
            self.offset = 0 if self.loop else self.steps  # the loop sends its own step count
            self.passes_seen = self.passes_published = int(state.get("passes_seen",
                                                                     self.steps))
            self.shared.trained_steps.value = self.passes_seen
            self.cpu_before = float(state.get("cpu_s", 0.0))
            self.first_done = bool(state["first_done"])
            self.pretraining_to_finish = self.learner.pretraining_left()
            self.episodes = int(state["episodes"])
            self.recent_returns.extend(float(r) for r in state["recent_returns"])
            self.recent_lengths.extend(int(n) for n in state["recent_lengths"])
            self.trainings = int(state["trainings"])
            stats = tuple(float(v) for v in state["reward_stats"])[:3]
            # before the passes were counted a published version was in use: keep it so
            self.pretrained = bool(state.get("pretrained", "epochs_trained" not in state))
        except MALFORMED as e:
            raise ConfigError(f"resume: {path} does not fit this run: {describe(e)}") from None
        self.logger.info(f"resumed the preference learner from {path} at step {self.steps} "
                         f"({self.learner.total_feedback} queries asked, "
                         f"{len(self.learner.dataset)} labels)", "cyan")
        if self.trainings:  # the env side starts from the resumed model, as it was
            self.shared.publish(self.learner.model, stats, self.trainings,  # type: ignore
                                self.epochs())

    def banner(self) -> None:
        """The first console line: env, method, teacher, run dir."""
        from themis.feedback.factory import start_label_server

        cfg = self.cfg
        if cfg.max_feedback == 0:
            source = "pretrained reward model" if self.online["reward_model"] else \
                f"reward from the saved preferences in {cfg.prefs_path}"
            schedule = f"{source}, no queries"
        elif cfg.query_schedule == "continuous":
            schedule = (f"{self.title} | from step {cfg.num_seed_steps}, {cfg.reward_batch} "
                        "queries whenever the teacher has answered and new steps came "
                        "(query_schedule=continuous)")
        else:
            schedule = (f"{self.title} | queries due from step {cfg.num_seed_steps}, then "
                        f"every {cfg.num_interact} agent steps"
                        + (" (decaying)" if cfg.query_schedule == "decay" else "")
                        + "; a round the learner was too busy for is asked late, not lost")
        self.logger.info(f"Themis preference learner | {self.spec.env_id} | {schedule} | "
                         f"run dir {self.run_dir}", "cyan")
        if self.space.label_store is not None:
            self.label_server = start_label_server(self.space)

    # ------------------------------------------------------------------ steps
    def take(self, message: tuple[Any, ...]) -> None:
        """Store one step message ``("steps", runs, ended, total_steps)`` of the agent's side."""
        _, runs, ended, total = message
        for run in runs:
            self.add(run)
        self.steps = self.offset + int(total)
        self.space.step = self.steps
        for episode_return, length in ended:
            self.recent_returns.append(episode_return)
            self.recent_lengths.append(length)
            if self.loop:  # Themis's own loop writes train.csv
                self.episodes += 1
                continue
            self.logger.train.write({
                "step": self.steps, "episode": self.episodes, "episode_reward": episode_return,
                "episode_length": length, "total_feedback": self.learner.total_feedback,
                "labeled_feedback": self.learner.labeled_feedback,
                "reward_accuracy": self.learner.reward_accuracy,
                "model_version": self.trainings})
            self.episodes += 1
        if self.steps - self.last_log >= self.cfg.log_frequency and self.recent_returns \
                and not self.loop:
            self.last_log = self.steps
            self.logger.console("train", {
                "step": self.steps, "episode_reward": float(np.mean(self.recent_returns)),
                "total_feedback": self.learner.total_feedback,
                "reward_acc": self.learner.reward_accuracy, "model_version": self.trainings})

    def add(self, run: Run) -> None:
        slots = add_run(self.store, run)
        self.newest_episode = max(self.newest_episode, run.episode)
        frames = self.space.frames
        if frames is not None and run.frames is not None:
            for slot, frame in zip(slots, run.frames[-len(slots):], strict=True):
                frames.add(int(slot), frame)
            if self.episode_clips is not None:  # the last full episode, beside the pair
                self.episode_clips.add(run.episode, run.t0, run.frames, run.ends)

    # ------------------------------------------------------------------ rounds
    def whole_segments(self) -> bool:
        """Whether some stored episode holds a whole segment."""
        return len(self.store.segment_starts(self.cfg.segment)) > 0

    def due(self) -> bool:
        """A feedback round is due: queries are due by the agent's step and not asked yet
        (:class:`themis.online.stream.QueryTarget`), from ``num_seed_steps`` on, once a whole
        segment is stored. ``query_schedule=continuous``: whenever no posted query waits for
        an answer and ``segment`` new steps came since the last round (DRLHP's interface asks
        as fast as the teacher answers while segments wait)."""
        cfg = self.cfg
        learner = self.learner
        if learner.total_feedback >= learner.max_feedback or self.steps < self.retry_at \
                or self.steps < cfg.num_seed_steps:
            return False
        if cfg.query_schedule == "continuous":
            waited = not self.first_done or self.steps - self.last_round >= cfg.segment
            return waited and learner.pending() == 0 and self.whole_segments()
        return self.target.owed(self.steps, learner.total_feedback) > 0 \
            and self.whole_segments()

    def usable(self, steps: np.ndarray) -> np.ndarray:
        """Store slots a query may use: those whose frames are kept, when people watch."""
        frames = self.space.frames
        return frames.has(steps) if frames is not None else np.ones(steps.shape, bool)

    def feedback_round(self, ask: bool = True, final: bool = False) -> RoundReport | None:
        """One round of the learner (queries from the last ``query_pool_episodes`` episodes),
        logged to ``reward.csv``; the trained model is published and checkpointed."""
        first = ask and not self.first_done
        pool = max(0, self.newest_episode + 1 - self.cfg.query_pool_episodes)
        self.asking_first = first
        try:
            with self.loop_threads(first and self.loop and not self.cfg.human_teacher):
                report = self.learner.round(self.store, self.steps, first, pool,
                                            self.recent_returns, self.recent_lengths,
                                            self.usable if self.space.frames is not None
                                            else None, ask=ask, final=final)
        finally:
            self.asking_first = False
        if ask:
            asked_now = report is not None and report.postponed == 0
            self.first_done = self.first_done or asked_now
            self.last_round = self.steps
            if not asked_now:  # nothing to cut yet: wait for a segment's worth of new steps
                self.retry_at = self.steps + self.cfg.segment
        if report is not None:
            self.write_report(report)
            if report.epochs > 0:
                self.publish()
            self.checkpoint()
        self.shared.count((self.learner.total_feedback, self.learner.labeled_feedback,
                           len(self.learner.dataset), self.learner.reward_accuracy))
        return report

    def write_report(self, report: RoundReport) -> None:
        """A round's row in ``reward.csv`` (with the stream schedule's queries asked and due)
        and on the console."""
        row = report._asdict()
        row.update(row.pop("method_stats"))
        row.update(queries_asked=self.learner.total_feedback,
                   queries_due=min(self.cfg.max_feedback, self.target.due(self.steps)))
        self.logger.reward.write(row)
        console = {k: v for k, v in row.items() if k not in ("sampler", "new_labels")}
        if self.space.label_store is not None:
            console.update(round_new_labels=report.new_labels, pending=self.learner.pending())
        self.logger.console("reward", console)

    def keep_training(self) -> bool:
        """``reward_schedule=passes`` (DRLHP's continuous training in the background): the
        label-passes owed for the agent steps that arrived since the last call, once the first
        round has pretrained (:meth:`PreferenceLearner.keep_training`); the model is published
        four times per ``num_interact`` steps, at most every :data:`PASSES_PUBLISH_STEPS` (its
        reward statistics score the newest stored steps). Returns whether it trained; ``False``
        without the schedule."""
        passes = self.learner.passes
        if passes is None or not passes.pretrained:
            self.passes_seen = self.passes_published = self.steps
            self.shared.trained_steps.value = self.steps
            return False
        grown = min(self.steps - self.passes_seen, PASSES_CHUNK_STEPS)
        if grown <= 0:
            return False
        self.passes_seen += grown
        trained = self.learner.keep_training(grown)
        self.shared.trained_steps.value = self.passes_seen
        if not trained:
            return False
        if self.steps - self.passes_published >= min(PASSES_PUBLISH_STEPS,
                                                      max(1, self.cfg.num_interact // 4)):
            self.passes_published = self.steps
            self.publish()
        return True

    @contextlib.contextmanager
    def loop_threads(self, waiting: bool) -> Iterator[None]:
        """While Themis's loop waits for the first model (``waiting``), the learner uses the
        loop's threads too: pretraining on both cores of a run with one thread each; back to
        its own afterwards."""
        threads = torch.get_num_threads()
        if waiting:
            torch.set_num_threads(max(threads, min(2 * threads, len(os.sched_getaffinity(0)))))
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def finish_pretraining(self) -> None:
        """A run resumed during DRLHP's pretraining (checkpointed between its chunks of
        epochs): the epochs left, then the first round's ``reward.csv`` row (its queries from
        before the stop, the whole pretraining's epochs), and the first model is published and
        checkpointed."""
        self.pretraining_to_finish = False
        assert self.learner.passes is not None
        before = self.learner.passes.pretrained_epochs
        with self.loop_threads(self.loop):
            threads = torch.get_num_threads()
            fit = self.learner.train_after_round()
        if fit is not None:
            self.learner.model_changed()
            self.learner.reward_accuracy = fit.accuracy
        self.logger.info(f"step {self.steps}: pretraining finished after the resume "
                         f"({before} of {self.learner.passes.pretrain_epochs} epochs had run "
                         f"before the stop; {threads} threads; train accuracy "
                         f"{self.learner.reward_accuracy:.3f})",
                         "cyan")
        if self.learner.unreported is not None:  # older checkpoints did not keep the round
            self.write_report(self.learner.report(None if fit is None else replace(
                fit, epochs=self.learner.passes.pretrained_epochs)))
        self.publish()
        self.checkpoint()

    def epochs(self) -> float:
        """Passes over the labels the current model was trained with (``inf``: pretrained)."""
        return math.inf if self.pretrained else self.learner.epochs_trained

    def train_to_switch(self) -> bool:
        """The wrapper before its switch to r̂: one more pass over the labels so far while
        the model has had fewer than ``n_initial_training_steps`` (DRLHP trains its predictor
        continuously, one epoch per training step, and switches after that many), published at
        once. Returns whether it trained."""
        if self.loop or not self.first_done or self.learner.reward_update == 0 \
                or self.epochs() >= self.initial_epochs:
            return False
        if not self.learner.train_epoch():
            return False
        self.publish()
        return True

    def reward_stats(self) -> tuple[float, float, float]:
        """Mean, variance and count of the current model's r̂ (ensemble mean) on the newest
        stored steps, to normalise the returned reward from (``(0, 1, 0)`` when none)."""
        n = min(len(self.store), STATS_ROWS)
        if n == 0:
            return 0.0, 1.0, 0.0
        slots = (self.store.ptr - 1 - np.arange(n)) % self.store.capacity
        with torch.no_grad():
            r = self.learner.model.predict(self.store.observations(slots).reshape(n, -1),
                                           self.store.actions[slots]).astype(np.float64)
        return float(r.mean()), float(r.var()), float(n)

    def publish(self) -> None:
        """Publish the current model as the next version."""
        self.learner.model.eval()
        self.trainings += 1
        self.shared.count((self.learner.total_feedback, self.learner.labeled_feedback,
                           len(self.learner.dataset), self.learner.reward_accuracy))
        self.shared.publish(self.learner.model, self.reward_stats(), self.trainings,
                            self.epochs())
        if self.ckpt_every and self.trainings % self.ckpt_every == 0:
            self.reward_predictor_checkpoint()

    def reward_predictor_checkpoint(self) -> None:
        """``reward_checkpoint_interval``: the model in ``reward_predictor_checkpoints/
        reward_model.pt`` (DRLHP's folder; its training-step count is the model version)."""
        from themis.reward.ensemble import save_reward_model

        folder = self.run_dir / "reward_predictor_checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        save_reward_model(self.learner.model, folder / "reward_model.pt",
                          step=self.steps, env=self.spec.env_id, version=self.trainings)

    def save_prefs(self) -> None:
        """Write the labels so far as a training and a validation dataset,
        ``train_prefs/`` and ``val_prefs/`` (Themis's pickle-free format, beside DRLHP's
        ``train.pkl.gz`` / ``val.pkl.gz`` names; :func:`themis.online.drlhp.split_prefs`),
        then tell the agent's side (``("saved", {...})``)."""
        from themis.online.saved_prefs import split_prefs

        counts = split_prefs(self.learner.dataset, self.learner.trainer, self.run_dir)
        self.logger.info(f"saved {counts['train']} training preferences to "
                         f"{self.run_dir / 'train_prefs'} and {counts['val']} validation "
                         f"preferences to {self.run_dir / 'val_prefs'}", "cyan")
        if self.status is not None:
            self.status.send(("saved", counts))

    def state_dict(self) -> dict[str, Any]:
        """The learner's checkpoint: its state (:meth:`PreferenceLearner.state_dict`), counters
        and the last published statistics."""
        stats = np.frombuffer(self.shared.stats, np.float64).tolist()
        first_done = self.first_done or (self.asking_first and self.learner.total_feedback > 0)
        return {**self.learner.state_dict(), "env": self.spec.env_id, "step": self.steps,
                "first_done": first_done, "episodes": self.episodes,
                "recent_returns": list(self.recent_returns),
                "recent_lengths": list(self.recent_lengths), "trainings": self.trainings,
                "reward_stats": stats, "passes_seen": self.passes_seen,
                "pretrained": self.pretrained,
                "cpu_s": self.cpu_s()}

    def cpu_s(self) -> float:
        """CPU seconds of this learner process, resumed runs' included."""
        return self.cpu_before + time.process_time()

    def checkpoint(self) -> None:
        """``checkpoints/state.pt`` and ``checkpoints/reward_model.pt`` (atomic writes)."""
        import json

        from themis.reward.ensemble import save_reward_model
        from themis.run.checkpoint import save_checkpoint

        self.last_checkpoint_time = time.monotonic()
        ckpt = self.checkpoint_dir
        save_checkpoint(self.state_dict(), ckpt)
        if self.loop:  # the learner's share of a run's CPU time (benchmarks/bench_drlhp.py)
            (self.run_dir / "learner_cpu.json").write_text(json.dumps({"cpu_s": self.cpu_s()}))
        if self.trainings:
            save_reward_model(self.learner.model, ckpt / "reward_model.pt", step=self.steps,
                              env=self.spec.env_id)

    def finish(self) -> None:
        """At the end: stop the labeling server, gather and train on the answers that came
        since the last round (web: partly answered queries too, so every accepted answer is in
        ``preferences/``), write the last checkpoints."""
        if self.label_server is not None:
            self.label_server.stop()
            self.label_server = None
        if self.learner.unsaved_answers():
            self.feedback_round(ask=False, final=True)
        if len(self.learner.dataset):
            self.learner.dataset.save(self.run_dir / "preferences")
        self.checkpoint()
        if self.ckpt_every and self.trainings:  # the newest model at the end too
            self.reward_predictor_checkpoint()
        self.logger.close()


# ---------------------------------------------------------------------- the process
class Service:
    """The threads of the learner process around a :class:`LearnerProcessState`."""

    def __init__(self, steps: Any, control: Any, parent_pid: int, capacity: int) -> None:
        self.steps_queue, self.control, self.parent_pid = steps, control, parent_pid
        self.inbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self.capacity = capacity  # most steps the inbox holds (the store's size)
        self.inbox_steps = 0
        self.inbox_lock = threading.Lock()
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.done = threading.Event()
        self.save_requested = threading.Event()  # the agent's save_prefs()
        self.checkpoint_requested = threading.Event()  # the loop checkpoints (resumable async)
        self.orphaned = False

    def parent_alive(self) -> bool:
        """Whether the agent's process still runs (gone or a zombie: no)."""
        try:
            os.kill(self.parent_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:
            stat = Path(f"/proc/{self.parent_pid}/stat").read_text()
            return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (OSError, IndexError):
            return True

    def receive(self) -> None:
        """The receiver thread: queue → inbox, until stopped."""
        while not self.stop.is_set():
            try:
                message = self.steps_queue.get(timeout=0.2)
            except queue.Empty:
                message = None
            except (EOFError, OSError):
                message, self.orphaned = None, True
                self.stop.set()
            if message is not None:
                if message[0] == "close":
                    self.stop.set()
                elif message[0] == "save_prefs":  # after the steps sent before it
                    self.save_requested.set()
                elif message[0] == "checkpoint":  # ... as is a checkpoint
                    self.checkpoint_requested.set()
                else:
                    self.keep(message)
                self.wake.set()
        self.wake.set()

    def watch(self) -> None:
        """The watcher thread: the control pipe and the agent's process, twice a second.

        Its own thread, because the receiver can block for good: an agent killed halfway
        through writing a message leaves a part of it in the queue's pipe, whose writing end
        this process holds too (no end of file ever comes). Orphaned, the learner has
        ``ORPHAN_GRACE`` seconds to save, then the process exits."""
        while not self.stop.wait(0.5):
            try:
                if self.control.poll():
                    self.control.recv()  # "close" when the queue could not take it
                    self.stop.set()
            except (EOFError, OSError):  # the agent's process is gone
                self.orphaned = True
            if not self.parent_alive():
                self.orphaned = True
            if self.orphaned:
                self.stop.set()
        self.wake.set()
        if self.orphaned and not self.done.wait(ORPHAN_GRACE):
            os._exit(3)  # the main thread is stuck (waiting for people): no orphan stays

    def keep(self, message: tuple[Any, ...]) -> None:
        """Put a step message in the inbox; while a round waits long (for people), the
        oldest steps beyond the store's size give way (their episode ends stay)."""
        with self.inbox_lock:
            self._keep(message)

    def _keep(self, message: tuple[Any, ...]) -> None:
        self.inbox.append(message)
        self.inbox_steps += sum(len(run) for run in message[1])
        while self.inbox_steps > self.capacity and len(self.inbox) > 1:
            _, runs, ended, total = self.inbox.popleft()
            self.inbox_steps -= sum(len(run) for run in runs)
            self.inbox.appendleft(("steps", [], ended, total))
            if len(self.inbox) > 1 and not self.inbox[0][1]:  # merge the empty ones' ends
                _, _, first, _ = self.inbox.popleft()
                _, runs, ended, total = self.inbox.popleft()
                self.inbox.appendleft(("steps", runs, [*first, *ended], total))

    def drain(self, learner: LearnerProcessState) -> None:
        while True:
            with self.inbox_lock:
                if not self.inbox:
                    return
                message = self.inbox.popleft()
                self.inbox_steps -= sum(len(run) for run in message[1])
            learner.take(message)

    def pause(self, learner: LearnerProcessState) -> None:
        """Between chunks of DRLHP's pretraining (hours on a CPU): take the steps that arrived,
        and checkpoint when the loop asked for it (Themis's loop: its checkpoint and the
        learner's then hold the same steps) or, in a wrapper, every ``checkpoint_minutes``."""
        self.drain(learner)
        if self.checkpoint_requested.is_set():
            self.checkpoint_requested.clear()
            learner.checkpoint()
        elif not learner.loop and time.monotonic() - learner.last_checkpoint_time \
                >= 60 * learner.cfg.checkpoint_minutes:
            learner.checkpoint()

    def run(self, learner: LearnerProcessState) -> None:
        """The main thread's loop (see the module docstring)."""
        web = learner.space.label_store is not None
        next_gather = time.monotonic() + GATHER_EVERY
        learner.learner.pretraining_pause = lambda: self.pause(learner)
        if learner.pretraining_to_finish:
            learner.finish_pretraining()
        while not self.stop.is_set():
            self.drain(learner)
            if self.save_requested.is_set():
                self.save_requested.clear()
                learner.save_prefs()
            if self.checkpoint_requested.is_set():
                self.checkpoint_requested.clear()
                learner.checkpoint()
            if learner.due():
                learner.feedback_round()
            elif learner.keep_training():  # reward_schedule=passes, between the rounds
                pass
            elif learner.train_to_switch():  # the wrapper: passes before r̂ is returned
                pass
            elif web and time.monotonic() > next_gather:
                next_gather = time.monotonic() + GATHER_EVERY
                if learner.learner.unsaved_answers():  # answers enter training as they come
                    learner.feedback_round(ask=False)
            else:
                self.wake.wait(0.2)
                self.wake.clear()
        self.drain(learner)
        learner.finish()


def main(cfg: TrainConfig, online: dict[str, Any], spec: EnvSpec, run_dir: str,
         shared: SharedWeights, steps: Any, control: Any, status: Any, parent_pid: int,
         threads: int, stdin_of: int | None) -> None:
    """The learner process: set up, say ``ready`` (or the one-line ``error``), serve until
    closed or orphaned, say ``closed``; a crash says ``crash`` with its last line.

    Args:
        steps: the step queue (messages of the agent's side, ``("close",)`` last).
        control: the control pipe's reading end (closed when the agent's process ends).
        status: the status pipe's writing end.
        parent_pid: the agent's process.
        threads: PyTorch threads here.
        stdin_of: a person answers in the terminal: the pid whose stdin to read.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the agent's process
    torch.set_num_threads(threads)
    flush_denormals()  # as a run's workspace: subnormal Adam moments are slow on a CPU
    if stdin_of is not None:  # the terminal teacher reads the agent's terminal
        try:
            sys.stdin = open(f"/proc/{stdin_of}/fd/0", encoding="utf-8")
        except OSError:
            sys.stdin = open("/dev/tty", encoding="utf-8")
    service = Service(steps, control, parent_pid, spec.capacity)
    path = Path(run_dir)
    try:
        learner = LearnerProcessState(cfg, online, spec, path, shared)
        learner.status = status
        learner.banner()
    except ConfigError as e:
        status.send(("error", str(e)))
        sys.exit(2)
    except Exception as e:
        status.send(("crash", _crash_line(e, path)))
        sys.exit(1)
    status.send(("ready", {"trainings": learner.trainings, "steps": learner.steps}))
    receiver = threading.Thread(target=service.receive, name="themis-receiver", daemon=True)
    receiver.start()
    threading.Thread(target=service.watch, name="themis-watcher", daemon=True).start()
    try:
        service.run(learner)
    except Exception as e:
        service.stop.set()
        service.done.set()
        try:
            status.send(("crash", _crash_line(e, path)))
        except OSError:
            pass
        sys.exit(1)
    service.done.set()
    try:
        status.send(("closed", {"labels": len(learner.learner.dataset),
                                "queries": learner.learner.total_feedback,
                                "trainings": learner.trainings}))
    except OSError:
        pass


def _crash_line(error: BaseException, run_dir: Path) -> str:
    """One line for the agent's process; the traceback goes to ``learner_error.log``."""
    text = "".join(traceback.format_exception(error))
    log = run_dir / "learner_error.log"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        log.write_text(text, encoding="utf-8")
        where = f" (traceback in {log})"
    except OSError:
        where = ""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first}{where}" if first else \
        f"{type(error).__name__}{where}"


__all__ = ["EnvSpec", "LearnerProcessState", "ProcessWorkspace", "main"]
