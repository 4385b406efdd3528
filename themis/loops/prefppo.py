"""The on-policy loop: PPO (or A2C) with PEBBLE's phases, as B-Pref's PrefPPO (Lee et al. 2021).

1. ``num_seed_steps``: the initial (near-uniform) policy collects episodes, no updates;
2. ``num_unsup_steps``: PPO on the state-entropy reward of each rollout (k-NN among the
   rollout's other states, in a fixed random encoder's features for pixels and grids; RE3);
3. then the first feedback round, and every ``num_interact`` steps another while feedback is
   open; every rollout's rewards are the ensemble mean r̂(s, a) — the agent never sees the
   environment reward.

``ppo.num_envs`` (``a2c.num_envs`` with ``agent=a2c``) environments run side by side in a gymnasium
``SyncVectorEnv`` with ``AutoresetMode.SAME_STEP``: when an episode ends, ``step`` returns the first
observation of the next one and the last one in ``info["final_obs"]``. Terminations end the return;
time-limit truncations are bootstrapped with ``γ V(final_obs)`` (Pardo et al. 2018). Finished
episodes go, whole, into the episode store that queries are cut from. The loop is flat, in sections,
as CleanRL's ``ppo.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from themis.agents import A2C, PPO, agent_of, on_policy_config
from themis.agents.buffers import EpisodeStore
from themis.agents.intrinsic import NoveltySample, knn_distance
from themis.agents.ppo import Rollout
from themis.environments.frames import FrameStore
from themis.run.envs import make_vector_env
from themis.run.plan import log_banner
from themis.utils import eval_mode

if TYPE_CHECKING:
    from themis.run.workspace import Workspace

NAME = "ppo"
METHOD = "PrefPPO"
STORE_CAPACITY = 100_000
SEGMENTS_PER_PIECE = 4
"""Rollouts shorter than a query segment (A2C's 5 steps): each env's steps go to the episode
store in pieces of at least this many segments (query segments are cut inside one piece)."""


class _EpisodeStaging:
    """The steps of one vectorised env's current episode not yet in the episode store.

    The steps are moved to the store at the end of every rollout (bounded memory, and long
    Atari episodes become queryable before they end) and when the episode ends; each piece is
    contiguous in the store, so a query segment lies inside one rollout's piece.
    """

    def __init__(self, episode: int) -> None:
        self.episode = episode  # id in the episode store, assigned when the episode starts
        self.t = 0  # steps of this episode already moved to the store
        self.episode_return = 0.0
        self.obs: list[np.ndarray] = []
        self.actions: list[np.ndarray] = []
        self.rewards: list[float] = []
        self.frames: list[np.ndarray] = []  # only when a person watches clips

    def append(self, obs: np.ndarray, action: np.ndarray, reward: float,
               frame: np.ndarray | None = None) -> None:
        self.obs.append(obs)
        self.actions.append(action)
        self.rewards.append(reward)
        if frame is not None:
            self.frames.append(frame)
        self.episode_return += reward

    def flush(self, buffer: EpisodeStore, terminated: bool = False,
              frames: FrameStore | None = None, episode_clips: Any = None,
              ends: bool = False) -> None:
        """Move the staged steps into ``buffer`` (and their frames into ``frames`` and
        ``episode_clips``, a ``lib.clips.EpisodeClips``); ``terminated``: the last one ended
        the episode (its ``not_done`` is 0); ``ends``: the episode ended (or was cut)."""
        last = len(self.obs) - 1
        stored = []
        for i, (o, a, r) in enumerate(zip(self.obs, self.actions, self.rewards, strict=True)):
            if frames is not None:
                stored.append(frames.add(buffer.ptr, self.frames[i]))
            buffer.add(o, a, 0.0, o, terminated and i == last, self.episode, self.t + i, r)
        if episode_clips is not None and stored:
            episode_clips.add(self.episode, self.t, np.stack(stored), ends)
        self.t += len(self.obs)
        self.obs, self.actions, self.rewards, self.frames = [], [], [], []


def make_agent(ws: Workspace) -> PPO | A2C:
    """PPO (or A2C, ``agent=a2c``) with a learning-rate schedule over the planned number of
    rollouts."""
    cfg, settings = ws.cfg, on_policy_config(ws.cfg)
    rollouts = max(1, cfg.num_train_steps // (settings.num_envs * settings.num_steps))
    if cfg.agent == "a2c":
        return A2C(ws.facts.obs_shape, ws.facts.action_dim, ws.device, cfg.a2c,
                   total_updates=rollouts)
    return PPO(ws.facts.obs_shape, ws.facts.action_dim, ws.device, cfg.ppo,
               total_updates=rollouts)


def piece_steps(segment: int, horizon: int) -> int:
    """Steps an env stages before they go to the episode store at the end of a rollout (an
    episode's end moves them at once): 0, every rollout's, when a segment fits in a rollout;
    :data:`SEGMENTS_PER_PIECE` segments when a rollout is shorter than a segment (A2C's 5
    steps: a query segment lies inside one stored piece of an episode)."""
    return 0 if segment <= horizon else SEGMENTS_PER_PIECE * segment


def store(ws: Workspace) -> EpisodeStore:
    """The episode store only feeds queries: ``replay_buffer_capacity`` or at most 100k
    steps, no next observations, Atari frame stacks stored once per frame."""
    cfg = ws.cfg
    capacity = cfg.replay_buffer_capacity or min(cfg.num_train_steps, STORE_CAPACITY)
    return EpisodeStore(ws.facts.obs_shape, ws.facts.action_dim, capacity, ws.device,
                        obs_dtype=ws.facts.obs_dtype, frame_stack=ws.facts.frame_stack)


def eval_action(ws: Workspace, obs: np.ndarray) -> Any:
    """A sample of the policy: PPO's policy is stochastic by design, and the arg-max action
    can loop forever in gridworlds."""
    with eval_mode(ws.agent.net):  # type: ignore[attr-defined]
        return ws.agent.act(obs, sample=True)


def resumed(ws: Workspace) -> None:
    """Episodes in progress restart with new ids (see :func:`run`); nothing to do here."""


def end_pretraining(ws: Workspace) -> None:
    """First feedback round (uniform sampling) once the unsupervised phase is over."""
    if ws.learner is not None:
        if ws.cfg.prefs_path and ws.cfg.max_feedback:  # saved labels first, then more queries
            ws.learner.fit_saved_labels(ws.cfg.prefs_path)
        ws.feedback_round(first=True)
    ws.pretraining_done = True
    ws.logger.info(f"step {ws.step}: " + (
        f"random seed steps done; {agent_of(ws.cfg, NAME).upper()} learns from the environment "
        "reward"
        if not ws.cfg.learn_reward and ws.cfg.num_unsup_steps == 0 else "pretraining done"),
        "cyan")


def rollout_distances(ws: Workspace, rollout_obs: np.ndarray) -> torch.Tensor:
    """Each state's distance to its ``topK``-th nearest neighbour among the rollout's other
    states (RE3 / PEBBLE Eq. 3), ``(T * N,)``; the running statistics are updated."""
    horizon, n_envs = rollout_obs.shape[:2]
    flat = torch.as_tensor(rollout_obs.reshape(horizon * n_envs, *ws.facts.obs_shape),
                           device=ws.device)
    feats = ws.state_entropy.features(flat)
    dist = knn_distance(feats, feats, min(ws.cfg.topK, len(feats) - 1), exclude_self=True)
    ws.state_entropy.update(dist)
    return dist


def warm_start(ws: Workspace, rollout_obs: np.ndarray, actions: np.ndarray,
               dist: torch.Tensor) -> None:
    """The methods' pretraining step (e.g. a warm start of r̂) on the rollout: each step a
    fresh minibatch of its states with their standardised novelty
    (:func:`themis.loops.pebble.novelty_sample` for SAC)."""
    assert ws.learner is not None
    obs = torch.as_tensor(rollout_obs.reshape(-1, *ws.facts.obs_shape), device=ws.device)
    act = torch.as_tensor(np.eye(ws.facts.action_dim, dtype=np.float32)[actions.reshape(-1)],
                          device=ws.device)
    z, bound = ws.state_entropy.standardise(dist)
    size = max(1, len(z) // on_policy_config(ws.cfg).num_minibatches)

    def draw() -> NoveltySample:
        idx = torch.as_tensor(ws.rng.choice(len(z), size=size, replace=False),
                              device=ws.device)
        return NoveltySample(obs[idx], act[idx], z[idx], bound)

    ws.learner.warm_start(draw)


def learned_rewards(ws: Workspace, rollout_obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Ensemble-mean r̂(s, a) of every step of the rollout, ``(T, N)``."""
    assert ws.learner is not None
    horizon, n_envs = actions.shape
    one_hot = np.eye(ws.facts.action_dim, dtype=np.float32)[actions.reshape(-1)]
    r = ws.learner.reward(rollout_obs.reshape(horizon * n_envs, -1), one_hot)
    return r.reshape(horizon, n_envs)


def run(ws: Workspace, until: int) -> None:
    """Collect rollouts and update PPO from the current step up to ``until``."""
    cfg, ppo, buffer = ws.cfg, on_policy_config(ws.cfg), ws.buffer
    agent: PPO | A2C = ws.agent  # type: ignore[assignment]
    log_banner(ws, f" | {ppo.num_envs} envs x {ppo.num_steps} steps per rollout")
    envs = make_vector_env(cfg)
    n_envs, horizon = ppo.num_envs, ppo.num_steps
    piece = piece_steps(cfg.segment, horizon)
    obs, _ = envs.reset(seed=[cfg.seed + ws.episode + i for i in range(n_envs)])
    # frames of the current observations, when a person watches clips
    frames: Any = envs.call("render") if ws.frames is not None else [None] * n_envs
    staging = [_EpisodeStaging(ws.start_episode()) for _ in range(n_envs)]
    eye = np.eye(ws.facts.action_dim, dtype=np.float32)
    rollout_obs = np.zeros((horizon, n_envs, *ws.facts.obs_shape), dtype=ws.facts.obs_dtype)
    actions = np.zeros((horizon, n_envs), dtype=np.int64)
    logprobs = np.zeros((horizon, n_envs), dtype=np.float32)
    values = np.zeros((horizon, n_envs), dtype=np.float32)
    true_rewards = np.zeros((horizon, n_envs), dtype=np.float32)
    dones = np.zeros((horizon, n_envs), dtype=np.float32)
    bootstrap = np.zeros((horizon, n_envs), dtype=np.float32)  # V(final_obs) on truncation
    learner = ws.learner  # sync or async (its process gets every step): one protocol
    while ws.step < until:
        ws.checkpoint_before_people(round_at=ws.step + n_envs * horizon)  # before people
        # ------------------------------------------------------------ collect a rollout
        bootstrap[:] = 0.0
        for t in range(horizon):
            with eval_mode(agent.net):
                act, logp, val = agent.step(obs)
            next_obs, reward, terminated, truncated, info = envs.step(act)
            rollout_obs[t], actions[t], logprobs[t], values[t] = obs, act, logp, val
            true_rewards[t] = reward
            dones[t] = terminated | truncated
            cut = truncated & ~terminated
            if cut.any():
                final = np.stack([info["final_obs"][i] for i in np.flatnonzero(cut)])
                bootstrap[t, cut] = agent.value(final)
            for i in range(n_envs):
                staging[i].append(obs[i], eye[act[i]], float(reward[i]), frames[i])
                if learner is not None:  # async: to the learner process (sync: nothing)
                    learner.observe(i, obs[i], eye[act[i]], float(reward[i]),
                                    bool(terminated[i]), bool(terminated[i] or truncated[i]),
                                    frames[i])
                if terminated[i] or truncated[i]:
                    staging[i].flush(buffer, bool(terminated[i]), ws.frames, ws.episode_clips,
                                     ends=True)
                    ws.end_episode(staging[i].episode_return, staging[i].t, staging[i].episode)
                    staging[i] = _EpisodeStaging(ws.start_episode())
            obs = next_obs
            if ws.frames is not None:  # after an autoreset: the new episode's first frame
                frames = envs.call("render")
            ws.step += n_envs
            if learner is not None:
                learner.stepped(n_envs)
        for stage in staging:  # unfinished episodes: their staged steps to the store
            if len(stage.obs) >= piece:
                stage.flush(buffer, frames=ws.frames, episode_clips=ws.episode_clips)

        # ------------------------------------------------------------ rewards and update
        phase = ws.phase
        if phase in ("unsup", "collect"):  # collect_prefs_only keeps exploring
            dist = rollout_distances(ws, rollout_obs)
            rewards = ws.state_entropy.normalise(dist).reshape(horizon, n_envs).cpu().numpy()
            if phase == "unsup" and ws.learner is not None:  # e.g. a warm start of r̂
                warm_start(ws, rollout_obs, actions, dist)
        elif phase == "reward":
            rewards = learned_rewards(ws, rollout_obs, actions)
        else:
            rewards = true_rewards.copy()
        if phase != "seed":
            rewards = rewards + ppo.gamma * bootstrap
            with eval_mode(agent.net):
                next_values = agent.value(obs)
            agent.update(Rollout(rollout_obs, actions, logprobs, values,
                                              rewards.astype(np.float32), dones, next_values))

        # ------------------------------------------------------------ PEBBLE schedule
        checkpoint_now = False
        if ws.step >= cfg.num_seed_steps and not ws.pretraining_done and \
                ws.step >= cfg.pretrain_end and (  # async never waits for people
                    learner is None or not learner.first_model_pending()):
            end_pretraining(ws)
            checkpoint_now = True
        elif ws.pretraining_done and ws.feedback_due():
            ws.feedback_round()
            checkpoint_now = learner is not None and learner.checkpoint_after_round
        if learner is not None and phase == "reward":
            learner.keep_training(n_envs * horizon)  # reward_schedule=passes (DRLHP)

        # ------------------------------------------------------------ logs, eval, checkpoint
        ws.after_steps(n_envs * horizon, evaluate=ws.step >= until, checkpoint=checkpoint_now)
    envs.close()
