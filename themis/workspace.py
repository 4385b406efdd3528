"""The Workspace: env, replay buffer, agent, reward model, teacher, logger and the PEBBLE loop.

The loop in :meth:`Workspace.run` follows PEBBLE's Algorithm 1 (Lee, Smith & Abbeel, ICML 2021):

1. ``num_seed_steps`` of uniformly random actions;
2. ``num_unsup_steps`` of unsupervised pretraining: SAC on the state-entropy reward;
3. the critic is reset and the first feedback round is asked (uniform sampling);
4. every ``num_interact`` steps, while ``total_feedback < max_feedback``: sample queries, ask
   the teacher, train the reward ensemble on all labels, relabel the whole replay buffer;
5. every step: one SAC update on the (relabelled) replay buffer.

With ``learn_reward=false`` the same loop trains SAC on the environment reward (no queries).
"""

from __future__ import annotations

import collections
import getpass
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from scipy import stats as scipy_stats
from tqdm import tqdm

from themis.agents import SAC, resolve_agent
from themis.agents.encoders import observation_kind, random_encoder
from themis.buffers import NoSegmentsError, ReplayBuffer, SegmentPairs
from themis.checkpoint import (
    CheckpointError,
    load_checkpoint,
    rng_states,
    save_checkpoint,
    set_rng_states,
    truncate_csv,
)
from themis.config import TrainConfig, validate
from themis.envs import episode_limit, frame_stack_size, get_domain, make_env
from themis.frames import FrameStore
from themis.intrinsic import StateEntropyReward
from themis.label_store import LabelStore
from themis.logger import Logger, plot_learning_curve
from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer, save_reward_model
from themis.sampling import (
    SAMPLERS,
    needs_large_batch,
    pair_features,
    resolve_feed_type,
    uses_labelled_features,
)
from themis.teacher_channels import Channel, SyntheticChannel, TerminalChannel, WebChannel
from themis.teachers import SyntheticTeacher, TeacherStats
from themis.utils import ConfigError, eval_mode, get_device, set_num_threads, set_seed_everywhere

SNAPSHOT_VERSION = 1
ORACLE = SyntheticTeacher()  # the reference the teacher's labels are compared with


class Workspace:
    """Everything one run owns.

    Args:
        cfg: a composed :class:`themis.config.TrainConfig`.
        run_dir: where CSVs, checkpoints and plots go (created if missing).

    Raises:
        ConfigError: invalid configuration, unknown domain/env, missing snapshot.
    """

    def __init__(self, cfg: DictConfig | TrainConfig, run_dir: Path) -> None:
        if isinstance(cfg, DictConfig):
            # A plain dataclass: attribute access in the hot loop costs nanoseconds, not µs.
            cfg = OmegaConf.to_object(cfg)  # type: ignore[assignment]
        assert isinstance(cfg, TrainConfig)
        validate(cfg)
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        set_num_threads(cfg.torch_threads)
        set_seed_everywhere(cfg.seed)
        self.device = get_device(cfg.device)
        self.rng = np.random.default_rng(cfg.seed)

        # --- environments
        # a person watches clips: render every step (frames kept for the recent steps only)
        self.needs_frames = cfg.human_teacher or cfg.xplain_action or cfg.xplain_state
        render_mode = "rgb_array" if self.needs_frames else None
        self.env = make_env(cfg.domain, cfg.env, seed=cfg.seed, render_mode=render_mode,
                            render_size=cfg.human_frame_size, **cfg.env_kwargs)
        self.eval_env = make_env(cfg.domain, cfg.env, seed=cfg.seed + 10_000, **cfg.env_kwargs)
        self.env_id = get_domain(cfg.domain).resolve(cfg.env)
        self.max_episode_steps = episode_limit(self.env)
        if self.max_episode_steps is not None and cfg.segment > self.max_episode_steps:
            raise ConfigError(f"segment={cfg.segment} is longer than the episode limit "
                              f"({self.max_episode_steps} steps) of {self.env_id}")
        obs_space, action_space = self.env.observation_space, self.env.action_space
        try:
            self.agent_name, why = resolve_agent(cfg.agent, action_space)
            self.obs_kind = observation_kind(tuple(obs_space.shape or ()))
        except ValueError as e:
            raise ConfigError(f"{self.env_id}: {e}") from None
        self.agent_reason = why
        self.obs_shape = tuple(obs_space.shape or ())
        self.obs_dim = int(np.prod(self.obs_shape))
        self.obs_dtype = np.float32 if self.obs_kind == "vector" else np.uint8
        self.frame_stack = frame_stack_size(self.env)  # stored once per frame, not per stack
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_dim = int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) \
            else int(np.prod(action_space.shape or ()))

        # --- agent, replay buffer (or PPO's episode store), intrinsic reward
        self.agent = self.make_agent()
        self.buffer = ReplayBuffer(self.obs_shape, self.action_dim, self.buffer_capacity(),
                                   self.device, obs_dtype=self.obs_dtype,
                                   store_next_obs=self.agent_name == "sac",
                                   frame_stack=self.frame_stack if self.agent_name != "sac"
                                   else 1)
        # state entropy of pixels and grids: k-NN in a fixed random encoder's features (RE3)
        self.feature_encoder = None if self.obs_kind == "vector" else \
            random_encoder(self.obs_shape, seed=cfg.seed).to(self.device)
        self.state_entropy = StateEntropyReward(cfg.topK, cfg.entropy_pool_size,
                                                encoder=self.feature_encoder)

        # --- reward learning from preferences
        self.sampler_name = resolve_feed_type(cfg.feed_type)
        self.reward_model: RewardEnsemble | None = None
        if cfg.learn_reward:
            self.reward_model = RewardEnsemble(self.obs_dim, self.action_dim, cfg.ensemble_size,
                                               cfg.reward_hidden_dim, cfg.reward_hidden_depth,
                                               obs_shape=self.obs_shape).to(self.device)
            self.reward_trainer = RewardTrainer(self.reward_model, cfg.reward_lr,
                                                cfg.reward_train_batch,
                                                np.random.default_rng(cfg.seed + 1))
            self.dataset = self.make_dataset()
            self.teacher = SyntheticTeacher(cfg.teacher_beta, cfg.teacher_gamma,
                                            cfg.teacher_eps_mistake, cfg.teacher_eps_skip,
                                            cfg.teacher_eps_equal,
                                            rng=np.random.default_rng(cfg.seed + 2))
        self.frames: FrameStore | None = None
        self.human: Any = None  # lib.human_interface.TerminalTeacher when a person labels
        self.clips_saved = 0  # explained clips of synthetic teachers' queries
        if self.needs_frames:
            self.frames = FrameStore(cfg.human_frame_capacity, self.buffer.capacity,
                                     cfg.human_frame_size)
        self.label_store: LabelStore | None = None  # teacher_ui=web: posted queries, answers
        self.label_server: Any = None
        if cfg.human_teacher and cfg.teacher_ui == "web":
            self.label_store = LabelStore(self.run_dir / "labels.sqlite", self.run_dir / "web")
            self.label_tokens = self.label_store.add_labelers(cfg.labelers)
        elif cfg.human_teacher:
            self.human = self.make_human_teacher()
        self.channel: Channel | None = None  # who answers: posted queries, gathered answers
        if cfg.learn_reward:
            self.channel = WebChannel(self) if self.label_store is not None else \
                TerminalChannel(self) if self.human is not None else \
                SyntheticChannel(self.teacher, self.teacher_description())
        if cfg.xplain_action or cfg.xplain_state:
            from lib.explain import METHODS

            if cfg.xplain_method not in METHODS:
                raise ConfigError(f"xplain_method={cfg.xplain_method} is unknown; use one of "
                                  f"{', '.join(METHODS)} (or register one in lib/explain.py)")

        # --- counters and logs
        self.step = 0
        self.episode = 0
        self.total_feedback = 0
        self.labeled_feedback = 0
        self.feedback_rounds = 0
        self.teacher_stats = TeacherStats()
        self.reward_accuracy = float("nan")
        self.pretraining_done = False
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=10)
        self.recent_lengths: collections.deque[int] = collections.deque(maxlen=10)
        self.postponed_rounds = 0  # feedback rounds without a segment to cut (episodes too short)
        self.last_episode_reward = float("nan")
        self.interact_count = 0
        self.last_checkpoint_step = 0
        self.metrics: dict[str, torch.Tensor] = {}
        self.pretrain_end = cfg.num_seed_steps + cfg.num_unsup_steps

        resume_state = None
        if cfg.resume:
            try:
                resume_state, path = load_checkpoint(self.run_dir / "checkpoints", self.device)
            except CheckpointError as e:
                prefs = self.run_dir / "preferences"
                hint = (f"; the labels given so far are in {prefs}: start a new run with "
                        f"prefs_path={prefs} to keep them") if (prefs / "meta.json").is_file() \
                    else ""
                raise ConfigError(f"resume: {e}{hint}") from None
            if resume_state.get("env") != self.env_id:
                raise ConfigError(f"resume: the checkpoint {path} is for env="
                                  f"{resume_state.get('env')}, not {self.env_id}")
            for stream in ("train", "eval", "reward"):  # rows after the checkpoint come again
                truncate_csv(self.run_dir / f"{stream}.csv", int(resume_state["step"]))
        self.logger = Logger(self.run_dir, backends=cfg.logger,
                             purge_step=int(resume_state["step"]) if resume_state else None)
        if resume_state is not None:
            try:
                self.load_state_dict(resume_state)
            except ValueError as e:  # e.g. a checkpoint of other observation/action shapes
                self.logger.close()
                raise ConfigError(f"resume: {path} does not fit this run: {e}") from None
            self.logger.info(f"resumed from {path} at step {self.step} "
                             f"({self.total_feedback} queries asked)", "cyan")
        elif cfg.pretrained_snapshot:
            self.load_snapshot(Path(cfg.pretrained_snapshot))

    def make_agent(self) -> SAC:
        """The off-policy agent (SAC) for this env; :class:`OnPolicyWorkspace` builds PPO.

        Raises:
            ConfigError: SAC on pixel or grid observations (not supported yet).
        """
        if self.agent_name != "sac":
            raise ConfigError(f"{self.env_id}: the {self.agent_name} agent runs in "
                              "OnPolicyWorkspace; build workspaces with make_workspace(cfg)")
        if self.obs_kind != "vector":
            raise ConfigError(f"{self.env_id}: SAC on {self.obs_kind} observations is not "
                              "supported yet; use a discrete-action variant with agent=ppo "
                              "(CarRacing-v3: +env_kwargs.continuous=false)")
        return SAC(self.obs_dim, self.action_dim, self.device, self.cfg.sac)

    def buffer_capacity(self) -> int:
        """``replay_buffer_capacity``, or every step of the run (SAC)."""
        return self.cfg.replay_buffer_capacity or self.cfg.num_train_steps

    def make_dataset(self) -> PreferenceDataset:
        """An empty preference dataset, or the one at ``prefs_path`` with room to grow.

        Raises:
            ConfigError: ``prefs_path`` is missing, unreadable, or recorded for other shapes.
        """
        cfg = self.cfg
        meta = {"env": self.env_id, "domain": cfg.domain, "teacher": self.teacher_description(),
                "obs_shape": list(self.obs_shape)}
        # on the web each query may get labels_per_query labels, all kept as training labels
        capacity = cfg.max_feedback * (cfg.labels_per_query if cfg.human_teacher
                                       and cfg.teacher_ui == "web" else 1)
        if not cfg.prefs_path:
            return PreferenceDataset(capacity, cfg.segment, self.obs_dim, self.action_dim,
                                     metadata=meta, obs_dtype=self.obs_dtype,
                                     frame_stack=self.frame_stack)
        try:
            loaded = PreferenceDataset.load(cfg.prefs_path)
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(f"prefs_path={cfg.prefs_path}: {e}") from None
        if (loaded.obs_dim, loaded.action_dim) != (self.obs_dim, self.action_dim):
            raise ConfigError(
                f"prefs_path={cfg.prefs_path} holds obs_dim={loaded.obs_dim}, "
                f"action_dim={loaded.action_dim} (env {loaded.metadata.get('env')}); "
                f"{self.env_id} has obs_dim={self.obs_dim}, action_dim={self.action_dim}")
        if loaded.segment != cfg.segment:
            raise ConfigError(f"prefs_path={cfg.prefs_path} was recorded with "
                              f"segment={loaded.segment}; set segment={loaded.segment}")
        data = PreferenceDataset(len(loaded) + capacity, cfg.segment, self.obs_dim,
                                 self.action_dim, metadata={**loaded.metadata, **meta},
                                 obs_dtype=self.obs_dtype, frame_stack=self.frame_stack)
        data.extend(loaded)
        return data

    def make_human_teacher(self) -> Any:
        """The terminal teacher of ``lib/human_interface.py`` (imported only when used)."""
        from lib.human_interface import KeyReader, TerminalTeacher

        cfg = self.cfg
        clip_dir = self.run_dir / "queries"
        done = len(list(clip_dir.glob("query_*"))) if clip_dir.is_dir() else 0
        return TerminalTeacher(clip_dir, KeyReader(piped=cfg.human_piped), cfg.human_viewer,
                               cfg.clip_fps, first_query=done)

    def teacher_description(self) -> str:
        """Who labels the queries, as stored with each label (``labeler`` column): ``human:NAME``
        for a person, ``synthetic(...)`` with the B-Pref parameters otherwise."""
        cfg = self.cfg
        if cfg.human_teacher:
            return f"human:{cfg.human_labeler or getpass.getuser()}"
        return (f"synthetic(beta={cfg.teacher_beta},gamma={cfg.teacher_gamma},"
                f"eps_mistake={cfg.teacher_eps_mistake},eps_skip={cfg.teacher_eps_skip},"
                f"eps_equal={cfg.teacher_eps_equal})")

    # ================================================================== main loop
    def run(self, until: int | None = None) -> None:
        """Run the PEBBLE loop from the current step up to ``until`` (default: the end)."""
        cfg = self.cfg
        until = cfg.num_train_steps if until is None else until
        self.logger.info(
            f"Themis | {self.env_id} | agent {self.agent_name} ({self.agent_reason}: "
            f"{self.env.action_space}) | reward: "
            f"{'learned from ' + self._teacher_name() if cfg.learn_reward else 'environment'}"
            f" | device {self.device} | run dir {self.run_dir}", "cyan")
        self.start_label_server()
        obs, _ = self.env.reset(seed=cfg.seed + self.episode)
        frame: Any = self.env.render() if self.frames is not None else None
        episode_reward, episode_step = 0.0, 0
        start_time = last_log_time = time.time()
        last_log_step = self.step
        bar = tqdm(total=until, initial=self.step, unit="step", dynamic_ncols=True,
                   disable=None, leave=False)
        while self.step < until:
            # -------------------------------------------------------- act
            if self.step < cfg.num_seed_steps:
                action = self.env.action_space.sample()
            else:
                with eval_mode(self.agent.actor):
                    action = self.agent.act(obs, sample=True)

            # ------------------------------------------------------ learn
            if self.step >= cfg.num_seed_steps:
                if not self.pretraining_done and self.step >= self.pretrain_end:
                    self.end_pretraining()
                    self.interact_count = 0
                    self.maybe_checkpoint(force=True)
                if not self.pretraining_done:
                    self.unsupervised_update()
                else:
                    if (cfg.learn_reward and self.interact_count >= cfg.num_interact
                            and self.feedback_open()):
                        self.feedback_round()
                        self.interact_count = 0
                        self.maybe_checkpoint(force=True)
                    if cfg.collect_prefs_only:  # the agent keeps exploring, labels are not used
                        self.unsupervised_update()
                    else:
                        self.metrics = self.agent.update(
                            self.buffer.sample(cfg.sac.batch_size, self.rng), self.step)

            # ------------------------------------------------------- step
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            true_reward = float(reward)
            # With learn_reward the agent never sees the true reward: the slot holds 0 until
            # the first feedback round relabels the buffer (pretraining uses the intrinsic
            # reward), and the reward model labels every later transition (lazily, in batches).
            stored_reward = 0.0 if cfg.learn_reward else true_reward
            if self.frames is not None:  # the frame shows `obs`, the state the action was taken in
                self.frames.add(self.buffer.ptr, frame)
                frame = self.env.render()
            self.buffer.add(obs, action, stored_reward, next_obs, terminated, self.episode,
                            episode_step, true_reward)
            episode_reward += true_reward
            episode_step += 1
            obs = next_obs
            self.step += 1
            self.interact_count += 1
            bar.update(1)

            if terminated or truncated:
                self.last_episode_reward = episode_reward
                self.recent_returns.append(episode_reward)
                self.recent_lengths.append(episode_step)
                self.logger.train.write({
                    "step": self.step, "episode": self.episode,
                    "episode_reward": episode_reward, "episode_length": episode_step,
                    "total_feedback": self.total_feedback,
                    "labeled_feedback": self.labeled_feedback,
                    "reward_accuracy": self.reward_accuracy,
                    "phase": self.phase,
                    "duration": time.time() - start_time,
                    # fixed columns (NaN before the first update): the CSV header is the first row
                    **{k: float(self.metrics[k]) if k in self.metrics else float("nan")
                       for k in self.agent.METRICS},
                })
                self.episode += 1
                obs, _ = self.env.reset()
                if self.frames is not None:
                    frame = self.env.render()
                episode_reward, episode_step = 0.0, 0

            if self.step % cfg.log_frequency == 0:
                now = time.time()
                fps = (self.step - last_log_step) / max(now - last_log_time, 1e-9)
                last_log_step, last_log_time = self.step, now
                self.logger.console("train", {
                    "step": self.step, "phase": self.phase, "fps": fps,
                    "episode_reward": self.last_episode_reward,
                    "total_feedback": self.total_feedback,
                    "reward_acc": self.reward_accuracy,
                })
            if self.step % cfg.eval_frequency == 0 or self.step == cfg.num_train_steps:
                self.evaluate()
                self.save_checkpoints()
            self.maybe_checkpoint()
        bar.close()

    @property
    def phase(self) -> str:
        if self.step < self.cfg.num_seed_steps:
            return "seed"
        if not self.pretraining_done:
            return "unsup"
        if self.cfg.collect_prefs_only:
            return "collect"
        return "reward" if self.cfg.learn_reward else "true_reward"

    def _teacher_name(self) -> str:
        c = self.cfg
        if c.human_teacher:
            return f"a person ({self.teacher_description()}, clips in {self.run_dir / 'queries'})"
        return (f"synthetic teacher (beta={c.teacher_beta}, gamma={c.teacher_gamma}, "
                f"eps_mistake={c.teacher_eps_mistake}, eps_skip={c.teacher_eps_skip}, "
                f"eps_equal={c.teacher_eps_equal})")

    # ============================================================ phases of PEBBLE
    def unsupervised_update(self) -> None:
        """One SAC update on the state-entropy reward of ``next_obs`` (PEBBLE, Eq. 3)."""
        batch = self.buffer.sample(self.cfg.sac.batch_size, self.rng)
        intrinsic = self.state_entropy(batch.next_observations,
                                       self.buffer.obs[: len(self.buffer)], self.rng)
        self.metrics = self.agent.update(batch._replace(rewards=intrinsic), self.step)

    def end_pretraining(self) -> None:
        """First feedback round, relabel, critic reset and ``reset_update`` updates (BPref)."""
        cfg = self.cfg
        if cfg.learn_reward and cfg.prefs_path and len(self.dataset) and cfg.max_feedback:
            # collect now, train later: learn from the saved labels before asking for more
            fit = self.reward_trainer.train(self.dataset, cfg.reward_update)
            self.reward_accuracy = fit.accuracy
            self.logger.info(f"reward model trained on {len(self.dataset)} preferences from "
                             f"{cfg.prefs_path} (train accuracy {fit.accuracy:.3f})", "cyan")
        if cfg.learn_reward:  # otherwise the stored rewards are the true ones already
            self.feedback_round(first=True)
        self.agent.reset_critic()
        for index in range(cfg.reset_update):  # B-Pref update_after_reset: its own counter
            self.agent.update(self.buffer.sample(cfg.sac.batch_size, self.rng), index)
        self.pretraining_done = True
        self.logger.info(f"step {self.step}: pretraining done, critic reset", "cyan")

    def select_queries(self, n_queries: int, sampler: str) -> SegmentPairs:
        """``n_queries`` segment pairs chosen by ``sampler`` among candidates cut from the query
        pool (only segments whose frames are stored, when clips are shown)."""
        cfg = self.cfg
        n_candidates = n_queries * cfg.large_batch if needs_large_batch(sampler) else n_queries
        usable = self.frames.has if self.frames is not None else None  # a person needs frames
        candidates = self.buffer.sample_segment_pairs(n_candidates, cfg.segment, self.rng,
                                                      self.query_pool_start(), usable)
        labelled = self.pair_features(self.dataset.observations[: len(self.dataset)]) \
            if uses_labelled_features(sampler) else np.zeros((0, 0), dtype=np.float32)
        picks = SAMPLERS[sampler](candidates, self.reward_model, labelled, n_queries, self.rng,
                                  features=self.pair_features)
        return candidates.take(picks)

    def feedback_open(self) -> bool:
        """Whether feedback rounds go on: queries left to ask, or (web) answers still to come."""
        if self.total_feedback < self.cfg.max_feedback:
            return True
        return self.label_store is not None and self.label_store.pending_count() > 0

    def feedback_round(self, first: bool = False) -> None:
        """One feedback round: select queries and post them to the teacher, gather the answers
        that exist (a synthetic teacher's and a person's in the terminal at once, web answers
        whenever people gave them), retrain the reward model on all labels, relabel."""
        cfg = self.cfg
        assert self.reward_model is not None and self.channel is not None
        n_queries = min(cfg.reward_batch, cfg.max_feedback - self.total_feedback)
        web_pending = self.label_store is not None and self.label_store.pending_count() > 0
        if n_queries <= 0 and not web_pending:
            if first and len(self.dataset):  # prefs_path alone: learn from the saved labels
                offline = self.reward_trainer.train(self.dataset, cfg.reward_update)
                self.reward_accuracy = offline.accuracy
                self.relabel()
                self.logger.info(f"reward model trained on {len(self.dataset)} saved preferences "
                                 f"(train accuracy {offline.accuracy:.3f})", "cyan")
            return
        sampler = "uniform" if first else self.sampler_name
        postponed = False
        if n_queries > 0:
            try:
                queries = self.select_queries(n_queries, sampler)
            except NoSegmentsError as e:  # e.g. Hopper falling early: ask again next round
                postponed, n_queries = True, 0
                self.postponed_rounds += 1
                self.logger.info(f"step {self.step}: feedback round postponed: {e}", "yellow")
        if n_queries > 0:
            self.set_teacher_margin()
            self.total_feedback += self.channel.post(queries)  # skipped queries count (B-Pref)
            if isinstance(self.channel, SyntheticChannel) and (cfg.xplain_action
                                                               or cfg.xplain_state):
                self.save_explained_clips(queries.take(np.arange(
                    min(len(queries), cfg.xplain_clips_per_round))))
        wait_for = max(0, cfg.min_labels_before_training - len(self.dataset)) \
            if self.label_store is not None else 0
        got = self.channel.gather(self.empty_pairs(), at_least=wait_for)
        answered, labels = got.pairs.take(got.keep), got.labels
        self.labeled_feedback += int(got.keep.sum())
        true = got.pairs.true_rewards
        oracle_labels = ORACLE.label(true[got.keep, 0], true[got.keep, 1])[1]
        round_stats = TeacherStats()
        for stats in (round_stats, self.teacher_stats):
            stats.update(got.keep, labels, oracle_labels)

        # --- quality of the current model on the fresh labels (held out: not trained on yet)
        quality = {"heldout_accuracy": float("nan"), "heldout_pearson": float("nan"),
                   "heldout_spearman": float("nan")}
        if self.feedback_rounds > 0 and len(answered):
            quality = self.reward_quality(answered, labels)
        if len(answered) and not got.saved:  # a person's terminal answers are saved as given
            runs = np.flatnonzero(np.r_[True, np.array(got.labelers[1:]) !=
                                        np.array(got.labelers[:-1])])
            for lo, hi in zip(runs, [*runs[1:], len(answered)], strict=True):
                self.dataset.add(answered.take(np.arange(lo, hi)), labels[lo:hi],
                                 labeler=got.labelers[lo])
            self.dataset.save(self.run_dir / "preferences")  # labels are on disk at once
        self.feedback_rounds += 1
        fit = None
        if len(self.dataset):
            fit = self.reward_trainer.train(self.dataset, cfg.reward_update)
            self.reward_accuracy = fit.accuracy
            self.relabel()
        row = {
            "step": self.step, "round": self.feedback_rounds, "sampler": sampler,
            "total_feedback": self.total_feedback, "labeled_feedback": self.labeled_feedback,
            "skipped": round_stats.skipped, "equal": round_stats.equal,
            "oracle_agreement": round_stats.as_dict()["oracle_agreement"],
            **quality,
            "train_accuracy": fit.accuracy if fit else float("nan"),
            "train_loss": fit.loss if fit else float("nan"),
            "epochs": fit.epochs if fit else 0,
            "postponed": int(postponed),
        }
        self.logger.reward.write(row)
        console = {k: v for k, v in row.items() if k != "sampler"}
        if self.label_store is not None:
            console.update(new_labels=len(labels), pending=self.label_store.pending_count())
        self.logger.console("reward", console)

    def set_teacher_margin(self) -> None:
        """B-Pref's margin: the mean return of the recent episodes scaled to one segment
        (``× segment / episode length``), with the env's time limit as the episode length
        (Atari: its frame limit in agent steps) or, without one, the recent mean length."""
        length = self.max_episode_steps or (float(np.mean(self.recent_lengths))
                                            if self.recent_lengths else None)
        if self.recent_returns and length:
            self.teacher.set_margin(float(np.mean(self.recent_returns)) * self.cfg.segment
                                    / length)
        elif self.teacher.margin == 0.0 and (self.cfg.teacher_eps_skip > 0
                                             or self.cfg.teacher_eps_equal > 0):
            self.logger.info("no episode has ended yet, so the teacher has no margin: "
                             "teacher_eps_skip/teacher_eps_equal have no effect this round",
                             "yellow")

    def empty_pairs(self) -> SegmentPairs:
        """No segment pairs, with this run's shapes."""
        h = self.cfg.segment
        return SegmentPairs(np.zeros((0, 2, h, *self.obs_shape), dtype=self.obs_dtype),
                            np.zeros((0, 2, h, self.action_dim), dtype=np.float32),
                            np.zeros((0, 2, h), dtype=np.float32), np.zeros((0, 2), np.int64))

    # ------------------------------------------------------------ web labeling
    def start_label_server(self) -> None:
        """Serve the labeling page (lib/label_server.py) from a thread; print its URLs."""
        if self.label_server is not None or self.label_store is None:
            return
        from lib.label_server import LabelServer

        cfg = self.cfg
        try:
            self.label_server = LabelServer(self.label_store, cfg.label_host, cfg.label_port,
                                            self.run_dir).start()
        except (RuntimeError, ValueError) as e:
            raise ConfigError(str(e)) from None
        url = self.label_server.url
        if self.label_tokens:
            for name, token in self.label_tokens:
                self.logger.info(f"labeling page for {name}: {url}?token={token}", "green")
        else:
            self.logger.info(f"labeling page: {url} (status: {url}status)", "green")

    def post_web_queries(self, queries: SegmentPairs) -> None:
        """Write the queries' clips (with explanation panels when ``xplain_*`` is on) and post
        them to the label store, where the labeling page finds them."""
        assert self.label_store is not None
        from lib.human_interface import side_by_side, write_clip

        cfg = self.cfg
        frames = self.query_frames(queries)
        clip_dir = self.run_dir / "web" / "clips"
        clip_dir.mkdir(parents=True, exist_ok=True)
        panels = self.explain_panels(queries, frames) \
            if cfg.xplain_action or cfg.xplain_state else None
        clips = []
        for i in range(len(queries)):
            path = clip_dir / f"round{self.feedback_rounds + 1:04d}_{i:03d}.mp4"
            extra = panels(i, path) if panels is not None else (None, None)
            clips.append(write_clip(side_by_side(frames[i, 0], frames[i, 1], *extra), path,
                                    cfg.clip_fps))
        self.label_store.post(self.feedback_rounds + 1, queries, clips, cfg.labels_per_query)

    def ask_person(self, queries: SegmentPairs) -> tuple[SegmentPairs, np.ndarray, np.ndarray]:
        """Show the queries' clips to a person and read the answers; each answer is appended
        to ``preferences/`` on disk the moment it is given.

        Returns:
            The queries actually asked (the person may stop the round with ``q``), the mask
            of those answered (not skipped) and their labels.
        """
        frames = self.query_frames(queries)  # (n, 2, H, h, w, 3)
        labeler = self.teacher_description()
        folder = self.run_dir / "preferences"

        def record(i: int, label: float | None) -> None:
            if label is not None:
                self.dataset.add(queries.take(np.array([i])), np.array([label], np.float32),
                                 labeler=labeler)
                self.dataset.save(folder)

        header = (f"round {self.feedback_rounds + 1}, {self.total_feedback} of "
                  f"{self.cfg.max_feedback} queries asked before it")
        panels = self.explain_panels(queries, frames) \
            if self.cfg.xplain_action or self.cfg.xplain_state else None
        result = self.human.ask(frames, record, header, panels)
        asked = queries.take(np.arange(result.asked))
        keep = np.array(result.keep, dtype=bool)
        labels = np.array(result.labels, dtype=np.float32)[keep]
        return asked, keep, labels

    def query_frames(self, queries: SegmentPairs) -> np.ndarray:
        """Stored frames of the queries' segments, ``(n, 2, H, h, w, 3)`` uint8."""
        assert self.frames is not None
        horizon = queries.observations.shape[2]
        slots = (queries.starts[..., None] + np.arange(horizon)) % self.buffer.capacity
        return self.frames.get(slots)

    def explain_panels(self, queries: SegmentPairs, frames: np.ndarray
                       ) -> Callable[[int, Path], tuple[np.ndarray, np.ndarray]]:
        """``(query index, clip path) -> (left panel, right panel)`` with the Captum
        explanations of ``lib/explain.py``; also saves the clip's summary PNGs beside it."""
        from lib.explain import Explainer, action_forward, feature_names, reward_forward

        cfg = self.cfg
        idx = self.rng.integers(0, len(self.buffer), size=64)
        idx = idx[self.buffer.readable(idx)]
        if len(idx) == 0:  # unlikely: take the readable ones in storage order
            idx = np.flatnonzero(self.buffer.readable(np.arange(len(self.buffer))))[:64]
        explainer = Explainer(
            cfg.xplain_method, self.obs_shape, self.buffer.observations(idx),
            self.buffer.actions[idx],
            cfg.xplain_baseline,
            action_forward(self.agent, self.discrete, cfg.xplain_action_dim)
            if cfg.xplain_action else None,
            reward_forward(self.reward_model) if cfg.xplain_state else None,
            discrete=self.discrete,
            names=feature_names(self.env, self.obs_dim) if self.obs_kind == "vector" else (),
            top_k=cfg.xplain_top_k, device=self.device)
        height, width = frames.shape[3:5]

        def panels(i: int, clip: Path) -> tuple[np.ndarray, np.ndarray]:
            attributions = [explainer.explain(queries.observations[i, s], queries.actions[i, s])
                            for s in (0, 1)]
            explainer.summaries(attributions, clip.with_suffix(""))
            left, right = (explainer.panel(queries.observations[i, s], attributions[s], width,
                                           height) for s in (0, 1))
            return left, right

        return panels

    def save_explained_clips(self, queries: SegmentPairs) -> None:
        """Synthetic teachers: write the queries' clips with explanation panels and summary
        PNGs to ``queries/`` for inspection (no person watches them)."""
        from lib.human_interface import side_by_side, write_clip

        if not len(queries):
            return
        frames = self.query_frames(queries)
        panels = self.explain_panels(queries, frames)
        for i in range(len(queries)):
            path = self.run_dir / "queries" / f"query_{self.clips_saved:06d}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_clip(side_by_side(frames[i, 0], frames[i, 1], *panels(i, path)), path,
                       self.cfg.clip_fps)
            self.clips_saved += 1

    def query_pool_start(self) -> int:
        """Smallest episode number queries may come from (the last ``query_pool_episodes``)."""
        return max(0, self.episode - self.cfg.query_pool_episodes + 1)

    def pair_features(self, observations: np.ndarray) -> np.ndarray:
        """k-center features of query pairs ``(n, 2, H, ...) -> (n, d)``: the flattened
        observations for vectors (B-Pref); for pixels and grids each segment's mean feature of
        the fixed random encoder, ``d = 2 * feature_dim``."""
        if self.feature_encoder is None:
            return pair_features(observations)
        n, _, horizon = observations.shape[:3]
        out = np.zeros((n, 2 * self.feature_encoder.feature_dim), dtype=np.float32)
        chunk = max(1, 2048 // (2 * horizon))  # pairs per encoder call: bounded memory
        for lo in range(0, n, chunk):
            part = observations[lo:lo + chunk]  # copied chunk by chunk (stacks may be views)
            m = len(part)
            frames = torch.as_tensor(part.reshape(m * 2 * horizon, *self.obs_shape),
                                     device=self.device)
            with torch.no_grad():
                feats = self.feature_encoder(frames)
            out[lo:lo + m] = feats.reshape(m, 2, horizon, -1).mean(2).reshape(m, -1).cpu().numpy()
        return out

    def reward_quality(self, pairs: SegmentPairs, labels: np.ndarray) -> dict[str, float]:
        """Held-out quality of the reward model on labelled pairs it was not trained on.

        Returns:
            ``heldout_accuracy``: agreement of the predicted preference with the teacher's
            labels (ties excluded); ``heldout_pearson`` / ``heldout_spearman``: correlation of
            predicted and true returns of the ``2 n`` segments.
        """
        assert self.reward_model is not None
        accuracy = self.reward_trainer.accuracy(pairs.observations, pairs.actions, labels)
        n, _, horizon = pairs.true_rewards.shape
        obs = pairs.observations.reshape(n * 2 * horizon, -1)
        act = pairs.actions.reshape(n * 2 * horizon, -1)
        with eval_mode(self.reward_model):
            predicted = self.reward_model.predict(obs, act).reshape(n * 2, horizon).sum(1)
        true = pairs.true_rewards.reshape(n * 2, horizon).sum(1)
        pearson = spearman = float("nan")
        if len(true) > 2 and np.ptp(true) > 0 and np.ptp(predicted) > 0:
            pearson = float(scipy_stats.pearsonr(predicted, true).statistic)
            spearman = float(scipy_stats.spearmanr(predicted, true).statistic)
        return {"heldout_accuracy": accuracy, "heldout_pearson": pearson,
                "heldout_spearman": spearman}

    def relabel(self) -> None:
        """Relabel every stored transition with the ensemble-mean reward (PEBBLE, Sec. 4.2).
        With ``collect_prefs_only`` the agent does not use the learned reward: nothing to do."""
        assert self.reward_model is not None
        if self.cfg.collect_prefs_only:
            return
        with eval_mode(self.reward_model):
            self.buffer.relabel(self.reward_model.predict)

    # ============================================================== evaluation
    def evaluate(self) -> float:
        """Mean true return of ``num_eval_episodes`` episodes (actions: :meth:`eval_action`)."""
        returns = []
        for i in range(self.cfg.num_eval_episodes):
            obs, _ = self.eval_env.reset(seed=self.cfg.seed + 10_000 + i)
            done, ret = False, 0.0
            while not done:
                with eval_mode(self.agent.actor):
                    action = self.eval_action(obs)
                obs, reward, terminated, truncated, _ = self.eval_env.step(action)
                ret += float(reward)
                done = terminated or truncated
            returns.append(ret)
        row = {"step": self.step, "episode": self.episode,
               "episode_reward": float(np.mean(returns)),
               "episode_reward_std": float(np.std(returns)),
               "total_feedback": self.total_feedback, "labeled_feedback": self.labeled_feedback,
               "reward_accuracy": self.reward_accuracy, **self.teacher_stats.as_dict()}
        self.logger.eval.write(row)
        self.logger.console("eval", row)
        return row["episode_reward"]

    def eval_action(self, obs: np.ndarray) -> Any:
        """The action taken in evaluation episodes: SAC's mean action."""
        return self.agent.act(obs, sample=False)

    # ====================================================== checkpoints/snapshots
    def save_checkpoints(self) -> None:
        """Write agent and reward-model checkpoints and the preference dataset."""
        ckpt = self.run_dir / "checkpoints"
        ckpt.mkdir(exist_ok=True)
        torch.save({"agent": self.agent.state_dict(), "step": self.step, "env": self.env_id},
                   ckpt / "agent.pt")
        if self.reward_model is not None:
            save_reward_model(self.reward_model, ckpt / "reward_model.pt", step=self.step,
                              env=self.env_id)
            self.dataset.save(self.run_dir / "preferences")

    # ------------------------------------------------------------ full checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run (see :mod:`themis.checkpoint`)."""
        state: dict[str, Any] = {
            "version": SNAPSHOT_VERSION, "env": self.env_id, "agent_name": self.agent_name,
            "step": self.step, "episode": self.episode, "total_feedback": self.total_feedback,
            "labeled_feedback": self.labeled_feedback, "feedback_rounds": self.feedback_rounds,
            "pretraining_done": self.pretraining_done, "reward_accuracy": self.reward_accuracy,
            "teacher_stats": vars(self.teacher_stats).copy(),
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "postponed_rounds": self.postponed_rounds,
            "last_episode_reward": self.last_episode_reward,
            "interact_count": self.interact_count,
            "agent": self.agent.state_dict(), "buffer": self.buffer.state_dict(),
            "state_entropy_stats": self.state_entropy.stats.state_dict(),
            "rng": self.rng.bit_generator.state, "global_rng": rng_states(),
            "action_space_rng": self.env.action_space.np_random.bit_generator.state,
        }
        if self.reward_model is not None:
            state.update({
                "reward_model": self.reward_model.state_dict(),
                "reward_optimizer": self.reward_trainer.optimizer.state_dict(),
                "reward_trainer_rng": self.reward_trainer.rng.bit_generator.state,
                "teacher_rng": self.teacher.rng.bit_generator.state,
                "teacher_margin": self.teacher.margin,
                "dataset_size": len(self.dataset),
            })
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output. The preference labels come from the run's
        ``preferences/`` folder: the pairs the checkpoint counted (a synthetic teacher labels
        any later query again, identically)."""
        for key in ("step", "episode", "total_feedback", "labeled_feedback", "feedback_rounds",
                    "pretraining_done", "reward_accuracy", "last_episode_reward",
                    "interact_count"):
            setattr(self, key, state[key])
        vars(self.teacher_stats).update(state["teacher_stats"])
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state.get("recent_lengths", []))  # older checkpoints: none
        self.postponed_rounds = int(state.get("postponed_rounds", 0))
        self.agent.load_state_dict(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.state_entropy.stats.load_state_dict(state["state_entropy_stats"])
        self.rng.bit_generator.state = state["rng"]
        set_rng_states(state["global_rng"])
        self.env.action_space.np_random.bit_generator.state = state["action_space_rng"]
        self.last_checkpoint_step = self.step
        self.skip_interrupted_episode()
        if self.reward_model is not None and "reward_model" in state:
            self.reward_model.load_state_dict(state["reward_model"])
            self.reward_trainer.optimizer.load_state_dict(state["reward_optimizer"])
            self.reward_trainer.rng.bit_generator.state = state["reward_trainer_rng"]
            self.teacher.rng.bit_generator.state = state["teacher_rng"]
            self.teacher.set_margin(state["teacher_margin"])
            self.dataset = self.resumed_dataset(int(state["dataset_size"]))
            if self.pretraining_done and len(self.dataset):
                self.relabel()

    def skip_interrupted_episode(self) -> None:
        """After a resume the episode in progress at the checkpoint is not continued (its steps
        stay in the buffer): the next one gets a new number."""
        last = (self.buffer.ptr - 1) % self.buffer.capacity
        if len(self.buffer) and self.buffer.episode[last] == self.episode:
            self.episode += 1

    def resumed_dataset(self, size: int) -> PreferenceDataset:
        """The labels on disk: the ``size`` pairs the checkpoint counted, plus any later pair a
        person labelled (a labeler that is not ``synthetic(...)``), which is kept and counted —
        a synthetic teacher's later labels are dropped, it asks those queries again.

        Raises:
            ConfigError: fewer pairs on disk than the checkpoint counted.
        """
        folder = self.run_dir / "preferences"
        data = PreferenceDataset(self.dataset.capacity, self.cfg.segment, self.obs_dim,
                                 self.action_dim, metadata=self.dataset.metadata,
                                 obs_dtype=self.obs_dtype, frame_stack=self.frame_stack)
        if size == 0:
            return data
        try:
            saved = PreferenceDataset.load(folder)
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(f"resume: {e}") from None
        if len(saved) < size:
            raise ConfigError(f"resume: {folder} holds {len(saved)} labelled pairs, the "
                              f"checkpoint counted {size}")
        later = [i for i in range(size, len(saved))
                 if not str(saved.labelers[i]).startswith("synthetic")]
        saved.size = size
        data.extend(saved)
        for i in later[: data.capacity - len(data)]:
            pair = SegmentPairs(saved.observations[i:i + 1], saved.actions[i:i + 1],
                                saved.true_rewards[i:i + 1], np.zeros((1, 2), dtype=np.int64))
            data.add(pair, saved.labels[i:i + 1], labeler=str(saved.labelers[i]))
            data.timestamps[len(data) - 1] = saved.timestamps[i]
            self.total_feedback += 1
            self.labeled_feedback += 1
        return data

    def maybe_checkpoint(self, force: bool = False) -> None:
        """A full checkpoint every ``checkpoint_frequency`` steps (or now, with ``force``)."""
        if force or self.step - self.last_checkpoint_step >= self.cfg.checkpoint_frequency:
            save_checkpoint(self.state_dict(), self.run_dir / "checkpoints")
            self.last_checkpoint_step = self.step

    def save_snapshot(self, path: Path | None = None) -> Path:
        """Snapshot after pretraining: agent, replay buffer, counters and entropy statistics."""
        path = path or self.run_dir / "snapshot.pt"
        torch.save({
            "version": SNAPSHOT_VERSION, "env": self.env_id, "domain": self.cfg.domain,
            "step": self.step, "episode": self.episode,
            "agent_name": self.agent_name, "agent": self.agent.state_dict(),
            "buffer": self.buffer.state_dict(),
            "state_entropy_stats": self.state_entropy.stats.state_dict(),
            "recent_returns": list(self.recent_returns),  # the teacher's first margin
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
        snap = torch.load(path, map_location=self.device, weights_only=False)
        if snap.get("env") != self.env_id:
            raise ConfigError(f"pretrained_snapshot={path} was made for env={snap.get('env')}, "
                              f"not {self.env_id}")
        try:
            self.agent.load_state_dict(snap["agent"])
            self.buffer.load_state_dict(snap["buffer"])
        except ValueError as e:
            raise ConfigError(f"pretrained_snapshot={path}: {e}") from None
        self.state_entropy.stats.load_state_dict(snap["state_entropy_stats"])
        self.recent_returns.extend(float(r) for r in snap.get("recent_returns", []))
        self.recent_lengths.extend(int(n) for n in snap.get("recent_lengths", []))
        self.step = int(snap["step"])
        self.episode = int(snap["episode"]) + 1
        self.logger.info(f"loaded snapshot {path} at step {self.step}", "cyan")

    def finish(self) -> None:
        """Final checkpoints (a finished run can be extended with resume= and a larger
        num_train_steps), learning-curve PNG, closing of the logs."""
        self.save_checkpoints()
        self.maybe_checkpoint(force=True)
        self.logger.close()
        for env in (self.env, self.eval_env):  # frees renderers (OSMesa/EGL contexts) in order
            env.close()
        if self.label_server is not None:
            self.label_server.stop()
            self.logger.info("labeling server stopped; keep labeling this run with "
                             f"scripts/label_server.py {self.run_dir}", "cyan")
        eval_csv = self.run_dir / "eval.csv"
        if eval_csv.exists():
            method = "PEBBLE" if self.cfg.learn_reward else "SAC, true reward"
            plot_learning_curve(eval_csv, self.run_dir / "learning_curve.png",
                                                title=f"{self.env_id} ({method})")
        self.logger.info(f"done: {self.run_dir}", "cyan")


def make_workspace(cfg: DictConfig | TrainConfig, run_dir: Path) -> Workspace:
    """The workspace for a config: :class:`Workspace` (SAC, off-policy PEBBLE) or, when the
    agent is PPO (``agent=ppo``, or ``auto`` with a Discrete action space),
    :class:`themis.onpolicy.OnPolicyWorkspace`.

    Raises:
        ConfigError: as the workspaces.
    """
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    assert isinstance(cfg, TrainConfig)
    validate(cfg)
    probe = make_env(cfg.domain, cfg.env, **cfg.env_kwargs)
    try:
        name, _ = resolve_agent(cfg.agent, probe.action_space)
    except ValueError as e:
        raise ConfigError(f"{cfg.env}: {e}") from None
    finally:
        probe.close()
    if name == "ppo":
        from themis.onpolicy import OnPolicyWorkspace

        return OnPolicyWorkspace(cfg, run_dir)
    return Workspace(cfg, run_dir)
