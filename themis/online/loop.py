"""Asynchronous reward learning in Themis's own loops (``reward_training=async``).

With ``reward_training=sync`` (the default) the SAC and PPO loops stop at every feedback round
while the teacher answers and the ensemble trains (PEBBLE, B-Pref). With ``async`` the same
background learner as :class:`themis.PreferenceLearningWrapper`'s
(:mod:`themis.online.learner_process`: query selection, teachers and channels, the
``preferences/`` dataset, ``reward.csv``, reward training) runs beside the loop, as in
Christiano et al. (2017, Sec. 2.2.1): the loop sends it every step it takes and keeps stepping;
when a new reward-model version is published, the loop loads its weights into its own copy of
the reward model and relabels the replay buffer with it (SAC) or uses it for the next rollout
(PPO).

:class:`AsyncLearner` is the workspace's learner (``ws.learner``) in an async run: it answers
what the loops ask of any learner (:class:`themis.run.protocols.RunLearner`) — r̂ of a batch,
the counters for the logs, each step sent on (:meth:`AsyncLearner.observe`) and, as its
feedback round, the new version if one is there (:meth:`AsyncLearner.take`). With a synthetic
teacher the first version is waited for at the end of pretraining (the learner's first round
comes at ``num_seed_steps + num_unsup_steps``, as in sync), so that the critic reset and the
``reset_update`` updates see a learned reward, as in PEBBLE. With a person (web or terminal)
the loop never waits: pretraining goes on, on its own reward, until the first version arrives
(:meth:`AsyncLearner.first_model_pending`). Later versions are taken when they come.

What the learner writes: ``reward.csv``, ``preferences/`` (as a sync run), and its own
checkpoints in ``checkpoints/learner/``; the loop writes ``train.csv``, ``eval.csv`` and
``checkpoints/reward_model.pt`` (the version the agent uses). Each full checkpoint of the loop
asks the learner to checkpoint after the same steps; a resume (synthetic teachers) starts the
learner from its own checkpoint and the loop from its, the learner's passes owed for the steps
in between trained as they arrive. With ``reward_max_lag`` the loop waits while the learner's
label-passes lag more than that many steps behind (DRLHP's rate of reward training on a core
of its own). Refused (:func:`themis.run.validation.check_reward_training`): a resume with
people as teachers, methods that work inside the agent, a warm start of r̂ in pretraining and
explained clips, which need the agent inside the learner.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from themis.agents import on_policy_config, rollout_steps
from themis.agents.buffers import EpisodeStore
from themis.methods.base import MethodContext, reward_with_bonus
from themis.methods.registry import build_methods
from themis.online.keys import OnlineKeys
from themis.online.learner_client import LearnerClient, PreferenceLearnerError
from themis.online.learner_process import EnvSpec
from themis.online.segments import Run
from themis.online.weights import load_flat
from themis.reward.ensemble import RewardEnsemble, reward_model_from
from themis.utils import eval_mode

if TYPE_CHECKING:
    from themis.feedback.learner import QueryPool
    from themis.run.workspace import Workspace

WAIT_LINE_AFTER = 10.0
"""Seconds of waiting for the first reward model before the loop says that it waits."""


class LoopChannel(LearnerClient):
    """The wrapper's agent side, for a workspace: the step recorder, the queue to the learner
    process, its start, crash watch and close (:class:`themis.online.learner_client.LearnerClient`),
    configured from the run's own config (not from wrapper keys).

    Args:
        ws: the workspace; its config, env shapes, run dir and step.
        model: the loop's reward model (gives the size of the published weights).

    Raises:
        ConfigError: the learner refused its setup (one line: a labeling port taken, ...).
        PreferenceLearnerError: the learner process could not start.
    """

    def __init__(self, ws: Workspace, model: RewardEnsemble, resume: bool = False) -> None:
        facts = ws.facts
        self.run_dir = ws.run_dir
        self.obs_dtype = np.dtype(facts.obs_dtype)
        # the learner's first round comes when the loop's pretraining ends
        self.cfg = dataclasses.replace(ws.cfg, num_seed_steps=ws.cfg.pretrain_end,
                                       num_unsup_steps=0)
        self.online = OnlineKeys()  # close_timeout: the final gather and save
        self.frame_height = None  # the loop's frames are rendered at the clip size already
        n_envs = on_policy_config(ws.cfg).num_envs if ws.driver.NAME == "ppo" else 1
        self.make_recorder(n_envs, facts.obs_shape, self.obs_dtype, facts.action_dim, ws.step)
        spec = EnvSpec(facts.env_id, facts.obs_shape, self.obs_dtype.name, facts.action_dim,
                       facts.discrete, facts.max_episode_steps, ws.buffer.capacity)
        self.start_learner(model, spec, {"resume": resume, "reward_model": None, "loop": True})
        if len(ws.buffer) and not resume:  # a pretraining snapshot's steps: queries from them
            self.send_stored(ws.buffer, ws.step,
                             list(zip(ws.recent_returns, ws.recent_lengths, strict=False)))

    def send_stored(self, buffer: EpisodeStore, step: int,
                    ended: list[tuple[float, int]]) -> None:
        """Send the steps already in the loop's store (a pretraining snapshot's), oldest
        first, in runs of one episode; the loop's next episodes are numbered after them.

        Args:
            buffer: the workspace's store.
            step: the loop's step (the learner's step count starts there).
            ended: ``(true return, length)`` of the recent episodes (the teacher's margin).
        """
        n = len(buffer)
        slots = (buffer.ptr - n + np.arange(n)) % buffer.capacity
        episodes = buffer.episode[slots]
        runs = []
        for part in np.split(slots, np.flatnonzero(np.diff(episodes) != 0) + 1):
            if len(part) < self.cfg.segment:
                continue
            try:
                obs = buffer.observations(part)
            except ValueError:  # stacked frames partly overwritten: not a whole clip
                continue
            runs.append(Run(int(buffer.episode[part[0]]), int(buffer.t[part[0]]),
                            obs.astype(self.obs_dtype, copy=False),
                            buffer.actions[part].astype(np.float32),
                            buffer.true_rewards[part].copy(), buffer.not_dones[part] == 0))
        base = int(episodes.max()) + 1
        for i, recorder in enumerate(self.recorder.recorders):
            recorder.episode = base + i
        self.recorder.next_episode = base + len(self.recorder.recorders)
        if runs:
            self.queue.put(("steps", runs, ended, step), timeout=60)


class PublishedLabels:
    """``len()`` of the labels the learner had at its last round (the loop relabels once
    there are some); the learner process writes ``preferences/`` itself."""

    def __init__(self, owner: AsyncLearner) -> None:
        self.owner = owner

    def __len__(self) -> int:
        return int(self.owner.counts()["labels"])

    def save(self, path: Any) -> None:
        """Nothing: the learner process saves the dataset."""


class NoStats:
    """The label statistics of ``eval.csv`` (in ``reward.csv`` per round with async)."""

    def as_dict(self) -> dict[str, float]:
        """NaN for ``skip_fraction``, ``equal_fraction`` and ``oracle_agreement``."""
        return dict.fromkeys(("skip_fraction", "equal_fraction", "oracle_agreement"),
                             float("nan"))


class AsyncLearner:
    """``ws.learner`` with ``reward_training=async`` (a :class:`themis.run.protocols.RunLearner`,
    as the synchronous :class:`themis.feedback.PreferenceLearner`): the loop's end of the
    learner process — its client (:class:`LoopChannel`) and the loop's copy of the reward
    model, fed by the published versions (see the module docstring).

    Args:
        ws: the workspace (its shapes, device and config; the process starts in
            :meth:`start`, when the run starts).
    """

    checkpoint_after_round = False
    """A round here only loads a version: no checkpoint for it
    (:class:`themis.run.protocols.RunLearner`)."""

    def __init__(self, ws: Workspace) -> None:
        cfg, facts = ws.cfg, ws.facts
        self.ws = ws
        self.model = reward_model_from(cfg, facts.obs_dim, facts.action_dim,
                                       facts.obs_shape).to(ws.device)
        self.model.precision = ws.precision
        self.model.eval()
        # the methods that add to the agent's reward (the learner process runs the others)
        self.bonus_methods = build_methods(cfg, MethodContext(
            cfg.segment, facts.obs_dim, facts.action_dim, facts.obs_dtype,
            clock=lambda: int(ws.step),
            on_policy=ws.driver.NAME == "ppo"), only=("reward_bonus",))
        self.channel: LoopChannel | None = None
        self.version = 0  # the version in use (0: none yet)
        self.dataset = PublishedLabels(self)
        self.stats = NoStats()
        # DRLHP's query schedule runs in the learner process (the banner reads it here); its
        # reward normaliser here, on the loop's side, where r̂ relabels the buffer (SAC) or
        # rewards the rollouts (PPO)
        from themis.feedback.factory import decaying_schedule
        from themis.reward.recipe import RewardNormaliser

        self.schedule: Any = decaying_schedule(cfg, rollout_steps(cfg, ws.driver.NAME)) \
            if cfg.query_schedule == "decay" else None
        self.normaliser: RewardNormaliser | None = RewardNormaliser(
            cfg.ensemble_size, cfg.reward_norm_std) if cfg.reward_norm_std else None
        self.said_no_model = False  # the console line of a run that goes on without r̂
        self.resuming = False  # the workspace was loaded from a checkpoint

    def fit_normaliser(self, store: Any, most: int = 10_000) -> None:
        """``reward_norm_std``: fit the normaliser on up to ``most`` stored transitions and
        freeze it until the next version (as :meth:`PreferenceLearner.fit_normaliser`)."""
        if self.normaliser is not None:
            self.normaliser.fit_store(self.model, store, most)

    def first_model_pending(self) -> bool:
        """Whether the end of pretraining must wait for a first reward model that people's
        answers will make: with a person as teacher (web or terminal) the loop does not wait
        (async never waits for people) and goes on with the pretraining reward until the
        first version arrives (a console line says so once); a synthetic teacher's first
        model is waited for (it is a few seconds of compute, and PEBBLE's critic reset
        should see a learned reward).

        Raises:
            PreferenceLearnerError: the learner crashed or was killed.
        """
        channel = self.channel
        if channel is None or not self.ws.cfg.human_teacher or self.version > 0:
            return False
        channel.check()
        if channel.shared.version.value != 0:
            return False
        if not self.said_no_model:
            self.said_no_model = True
            channel.flush(block=True)  # the learner gets the steps to ask about
            self.ws.logger_info(
                f"step {self.ws.step}: no reward model yet (the first comes from people's "
                "answers); the agent goes on with the pretraining reward and switches to r̂ "
                "when the first model arrives (reward_training=async never waits for people)",
                "cyan")
        return True

    # ------------------------------------------------------------------ the process
    def start(self) -> None:
        """Start the learner process (once; the run's start).

        Raises:
            ConfigError, PreferenceLearnerError: see :class:`LoopChannel`.
        """
        if self.channel is not None:
            return
        ws = self.ws
        resume = self.resuming and (ws.run_dir / "checkpoints" / "learner" / "state.pt").is_file()
        self.channel = LoopChannel(ws, self.model, resume=resume)
        if self.resuming and ws.pretraining_done and ws.driver.NAME == "ppo":
            self.take(wait=True)  # the next rollout's rewards come from the resumed model

    def checkpoint(self) -> None:
        """The loop checkpoints: the learner checkpoints too, after the steps sent so far
        (its ``checkpoints/learner/``; a resume continues both)."""
        if self.channel is not None and not self.channel._closed:
            self.channel.flush(block=True)
            self.channel.queue.put(("checkpoint",), timeout=60)

    def close(self) -> None:
        """Send the last steps, let the learner gather the last answers and save, stop it;
        then take its last version."""
        if self.channel is not None and not self.channel._closed:
            self.channel.close()
            self.take()

    # ------------------------------------------------------------------ steps
    def observe(self, i: int, obs: np.ndarray, action: np.ndarray, true_reward: float,
                terminated: bool, ended: bool, frame: np.ndarray | None = None) -> None:
        """Sub-env ``i``'s step, for the learner process: ``obs`` the observation the action
        was taken in, ``action`` ``(action_dim,)`` (one-hot for discrete actions), the env's
        reward, termination, whether the episode ended with it (terminated or truncated),
        the frame of ``obs`` (people watch clips)."""
        assert self.channel is not None
        self.channel.record(i, obs, np.asarray(action, np.float32).reshape(-1), true_reward,
                            terminated, frame)
        if ended:
            self.channel.end_episode(i)

    def stepped(self, n: int) -> None:
        """``n`` env steps were recorded (sent to the learner when due).

        Raises:
            PreferenceLearnerError: the learner crashed or was killed.
        """
        channel = self.channel
        assert channel is not None
        channel.check()
        channel.stepped(n)
        lag = self.ws.cfg.reward_max_lag
        if lag and self.version > 0 and \
                channel.total_steps - channel.shared.trained_steps.value > lag:
            channel.flush(block=True)  # the learner trains for the steps it has
            while channel.total_steps - channel.shared.trained_steps.value > lag:
                channel.check()
                if not channel.process.is_alive():
                    raise PreferenceLearnerError("the preference learner process ended")
                time.sleep(0.01)

    # ------------------------------------------------------------------ versions
    def newer(self) -> bool:
        """A newer version than the one in use is published (a few ns: one shared read)."""
        return self.channel is not None and self.channel.shared.version.value != self.version

    def round_due(self, steps_since_round: int, every: int) -> bool:
        """The loop's "round": a newer version is published (:meth:`newer`); the learner
        process keeps its own schedule of queries."""
        return self.newer()

    def feedback_round(self, pool: QueryPool, first: bool = False, ask: bool = True,
                       final: bool = False) -> bool:
        """The loop's side of a round: the newest published version is loaded (:meth:`take`;
        ``first``: the end of pretraining, waited for) and a console line says so. The
        learner process asks, labels, trains and writes ``reward.csv`` itself.

        Returns:
            whether r̂ changed (a newer version was loaded: the caller relabels).
        """
        version = self.take(wait=first)
        if version is not None:
            self.ws.logger_info(f"step {pool.step}: reward model version {version} in use "
                                f"({len(self.dataset)} labels)", "cyan")
        return version is not None

    def take(self, wait: bool = False) -> int | None:
        """Load the newest published version into :attr:`model`; ``wait``: the end of
        pretraining, wait for the first one (the steps are sent first).

        Returns:
            the version loaded, or ``None`` when there is none newer.

        Raises:
            PreferenceLearnerError: the learner crashed or ended while waited for.
        """
        channel = self.channel
        if channel is None:
            return None
        if wait and self.version == 0:
            channel.flush(block=True)
            start, said = time.monotonic(), False
            while channel.shared.version.value == 0:
                channel.check()
                if not channel.process.is_alive():
                    channel.process.join(1)
                    raise PreferenceLearnerError(f"the preference learner process ended "
                                                 f"(exit code {channel.process.exitcode})")
                if not said and time.monotonic() - start > WAIT_LINE_AFTER:
                    said = True
                    self.ws.logger_info(f"step {self.ws.step}: waiting for the first reward "
                                        "model of the background learner", "cyan")
                # DRLHP's pretraining takes hours on a CPU: the run checkpoints meanwhile (the
                # learner between its chunks of epochs), every checkpoint_minutes
                self.ws.maybe_checkpoint()
                time.sleep(0.01)
        got = channel.shared.read(self.version)
        while wait and got is None and channel.shared.version.value != self.version:
            time.sleep(0.001)  # the learner is writing it right now
            got = channel.shared.read(self.version)
        if got is None:
            return None
        self.version, flat, _ = got
        load_flat(self.model, flat)
        self.model.eval()
        if self.normaliser is not None:  # a new model: its statistics start again
            self.normaliser.reset()
        return self.version

    # ------------------------------------------------------------------ the learner's face
    def reward(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Ensemble-mean r̂(s, a) of the version in use, plus the methods' ``reward_bonus``:
        ``(n, *obs_shape), (n, action_dim) -> (n,)`` float32."""
        with eval_mode(self.model):
            if self.normaliser is not None:  # reward_norm_std: members normalised (DRLHP)
                members = self.normaliser(self.model.predict_members(obs, action))
            elif self.bonus_methods:
                members = self.model.predict_members(obs, action)
            else:
                return self.model.predict(obs, action)
            rewarded = reward_with_bonus(self.bonus_methods, members) \
                if self.bonus_methods else None
            return members.mean(0) if rewarded is None else rewarded

    def counts(self) -> dict[str, float]:
        """The learner's last published counters (zeros before it runs)."""
        if self.channel is None:
            return {"total_feedback": 0.0, "labeled_feedback": 0.0, "labels": 0.0,
                    "reward_accuracy": float("nan")}
        return self.channel.shared.counts()

    @property
    def total_feedback(self) -> int:
        return int(self.counts()["total_feedback"])

    @property
    def labeled_feedback(self) -> int:
        return int(self.counts()["labeled_feedback"])

    @property
    def reward_accuracy(self) -> float:
        return float(self.counts()["reward_accuracy"])

    def is_open(self) -> bool:
        """Feedback is the learner's business: always open from the loop's side."""
        return True

    def pending(self) -> int:
        return 0

    def unsaved_answers(self) -> bool:
        """The learner process gathers and saves the answers itself."""
        return False

    def fit_saved_labels(self, source: str) -> None:
        """Nothing: the learner process fits ``prefs_path`` when it starts."""

    def warm_start(self, draw: Any) -> None:
        """Nothing (a method with a pretraining step that trains r̂ is refused with async)."""

    def replay(self, buffer: Any) -> Any:
        """The whole buffer (a method with its own replay is refused with async)."""
        return buffer

    def update_between_rounds(self, agent: Any, step: int, sample: Any) -> bool:
        """Nothing (a method inside the agent is refused with async)."""
        return False

    def keep_training(self, steps: int) -> bool:
        """Nothing: ``reward_schedule=passes`` runs in the learner process."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """What a workspace checkpoint holds of it: the version in use (the learner
        checkpoints itself in ``checkpoints/learner/``)."""
        return {"reward_training": "async", "model_version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resume: :meth:`start` starts the learner from its own checkpoint (labels, model,
        counters; from scratch when it has none yet) and, past pretraining, PPO's loop takes
        its model before the next rollout (SAC's relabels at its next check)."""
        self.resuming = True


__all__ = ["AsyncLearner", "LoopChannel"]
