"""The on-policy loop: PPO with PEBBLE's phases, as B-Pref's PrefPPO (Lee et al. 2021).

:class:`OnPolicyWorkspace` reuses everything of :class:`~themis.workspace.Workspace` that is not
about off-policy updates (reward ensemble, teacher, samplers, feedback rounds, evaluation, logs,
snapshots) and replaces the loop:

1. ``num_seed_steps``: the initial (near-uniform) policy collects episodes, no updates;
2. ``num_unsup_steps``: PPO on the state-entropy reward of each rollout (k-NN among the
   rollout's states, in a fixed random encoder's features for pixels and grids; RE3);
3. then the first feedback round, and every ``num_interact`` steps another while
   ``total_feedback < max_feedback``; every rollout's rewards are computed by the reward ensemble
   (ensemble mean) — the agent never sees the environment reward.

``ppo.num_envs`` environments run side by side in a gymnasium ``SyncVectorEnv`` with
``AutoresetMode.SAME_STEP``: when an episode ends, ``step`` returns the first observation of the
next one and the last one in ``info["final_obs"]``. Terminations end the return; time-limit
truncations are bootstrapped with ``γ V(final_obs)`` (Pardo et al. 2018). Finished episodes go,
whole, into the episode store that queries are cut from.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from themis.agents import PPO
from themis.agents.ppo import Rollout
from themis.buffers import ReplayBuffer
from themis.envs import make_env
from themis.frames import FrameStore
from themis.intrinsic import knn_distance
from themis.utils import ConfigError, eval_mode
from themis.workspace import Workspace

PPO_STORE_CAPACITY = 100_000


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

    def flush(self, buffer: ReplayBuffer, terminated: bool = False,
              frames: FrameStore | None = None) -> None:
        """Move the staged steps into ``buffer`` (and their frames into ``frames``);
        ``terminated``: the last one ended the episode (its ``not_done`` is 0)."""
        last = len(self.obs) - 1
        for i, (o, a, r) in enumerate(zip(self.obs, self.actions, self.rewards, strict=True)):
            if frames is not None:
                frames.add(buffer.ptr, self.frames[i])
            buffer.add(o, a, 0.0, o, terminated and i == last, self.episode, self.t + i, r)
        self.t += len(self.obs)
        self.obs, self.actions, self.rewards, self.frames = [], [], [], []


class OnPolicyWorkspace(Workspace):
    """PrefPPO: PPO trained on a reward learned from preferences (discrete action spaces).

    Args and raises: as :class:`~themis.workspace.Workspace`.
    """

    agent: PPO  # type: ignore[assignment]

    episodes_started = 0

    def make_agent(self) -> PPO:  # type: ignore[override]
        """PPO with a learning-rate schedule over the planned number of rollouts."""
        ppo = self.cfg.ppo
        if self.cfg.segment > ppo.num_steps:
            raise ConfigError(f"segment={self.cfg.segment} is longer than a PPO rollout "
                              f"(ppo.num_steps={ppo.num_steps}); a query segment must fit in "
                              "one rollout: lower segment or raise ppo.num_steps")
        rollouts = max(1, self.cfg.num_train_steps // (ppo.num_envs * ppo.num_steps))
        return PPO(self.obs_shape, self.action_dim, self.device, ppo, total_updates=rollouts)

    def buffer_capacity(self) -> int:
        """The episode store only feeds queries: ``replay_buffer_capacity`` or at most 100k."""
        return self.cfg.replay_buffer_capacity or min(self.cfg.num_train_steps,
                                                      PPO_STORE_CAPACITY)

    def query_pool_start(self) -> int:
        """Queries come from the ``query_pool_episodes`` most recently started episodes."""
        return max(0, self.episodes_started - self.cfg.query_pool_episodes)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "episodes_started": self.episodes_started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.episodes_started = int(state["episodes_started"])

    def skip_interrupted_episode(self) -> None:
        """Episodes in progress restart with new ids (see :meth:`run`); nothing to do here."""

    def relabel(self) -> None:
        """Nothing to relabel: every rollout's rewards come from the current ensemble."""

    def end_pretraining(self) -> None:
        """First feedback round (uniform sampling) once the unsupervised phase is over."""
        if self.cfg.learn_reward:
            self.feedback_round(first=True)
        self.pretraining_done = True
        self.logger.info(f"step {self.step}: pretraining done", "cyan")

    # ================================================================== main loop
    def make_vector_env(self) -> gym.vector.SyncVectorEnv:
        cfg = self.cfg

        def thunk(i: int) -> Any:
            return lambda: make_env(cfg.domain, cfg.env, seed=cfg.seed + i,
                                    render_mode="rgb_array" if self.needs_frames else None,
                                    **cfg.env_kwargs)

        return gym.vector.SyncVectorEnv([thunk(i) for i in range(cfg.ppo.num_envs)],
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    def run(self, until: int | None = None) -> None:
        """Collect rollouts and update PPO from the current step up to ``until``."""
        cfg, ppo = self.cfg, self.cfg.ppo
        until = cfg.num_train_steps if until is None else until
        self.logger.info(
            f"Themis | {self.env_id} | agent {self.agent_name} ({self.agent_reason}: "
            f"{self.env.action_space}) | {ppo.num_envs} envs x {ppo.num_steps} steps per rollout"
            f" | reward: "
            f"{'learned from ' + self._teacher_name() if cfg.learn_reward else 'environment'}"
            f" | device {self.device} | run dir {self.run_dir}", "cyan")
        stored = self.buffer.episode[: len(self.buffer)]
        if len(stored):  # continuing (e.g. from a snapshot): new ids after the stored ones
            self.episodes_started = max(self.episodes_started, int(stored.max()) + 1)
        self.start_label_server()
        envs = self.make_vector_env()
        n_envs, horizon = ppo.num_envs, ppo.num_steps
        obs, _ = envs.reset(seed=[cfg.seed + self.episode + i for i in range(n_envs)])
        # frames of the current observations, when a person watches clips
        frames: Any = envs.call("render") if self.frames is not None else [None] * n_envs
        staging = [_EpisodeStaging(self.new_episode_id()) for _ in range(n_envs)]
        eye = np.eye(self.action_dim, dtype=np.float32)
        rollout_obs = np.zeros((horizon, n_envs, *self.obs_shape), dtype=self.obs_dtype)
        actions = np.zeros((horizon, n_envs), dtype=np.int64)
        logprobs = np.zeros((horizon, n_envs), dtype=np.float32)
        values = np.zeros((horizon, n_envs), dtype=np.float32)
        true_rewards = np.zeros((horizon, n_envs), dtype=np.float32)
        dones = np.zeros((horizon, n_envs), dtype=np.float32)
        bootstrap = np.zeros((horizon, n_envs), dtype=np.float32)  # V(final_obs) on truncation
        start_time = last_log_time = time.time()
        last_log_step = self.step
        while self.step < until:
            # ---------------------------------------------------- collect a rollout
            bootstrap[:] = 0.0
            for t in range(horizon):
                with eval_mode(self.agent.net):
                    act, logp, val = self.agent.step(obs)
                next_obs, reward, terminated, truncated, info = envs.step(act)
                rollout_obs[t], actions[t], logprobs[t], values[t] = obs, act, logp, val
                true_rewards[t] = reward
                dones[t] = terminated | truncated
                cut = truncated & ~terminated
                if cut.any():
                    final = np.stack([info["final_obs"][i] for i in np.flatnonzero(cut)])
                    bootstrap[t, cut] = self.agent.value(final)
                for i in range(n_envs):
                    staging[i].append(obs[i], eye[act[i]], float(reward[i]), frames[i])
                    if terminated[i] or truncated[i]:
                        self.finish_episode(staging[i], bool(terminated[i]),
                                            time.time() - start_time)
                        staging[i] = _EpisodeStaging(self.new_episode_id())
                obs = next_obs
                if self.frames is not None:  # after an autoreset: the new episode's first frame
                    frames = envs.call("render")
                self.step += n_envs
                self.interact_count += n_envs
            for stage in staging:  # unfinished episodes: this rollout's steps to the store
                stage.flush(self.buffer, frames=self.frames)
            # ---------------------------------------------------- rewards and update
            phase = self.phase
            if phase in ("unsup", "collect"):  # collect_prefs_only keeps exploring
                rewards = self.intrinsic_rewards(rollout_obs)
            elif phase == "reward":
                rewards = self.learned_rewards(rollout_obs, actions)
            else:
                rewards = true_rewards.copy()
            if phase != "seed":
                rewards = rewards + ppo.gamma * bootstrap
                with eval_mode(self.agent.net):
                    next_values = self.agent.value(obs)
                self.metrics = self.agent.update(Rollout(  # type: ignore[assignment]
                    rollout_obs, actions, logprobs, values, rewards.astype(np.float32), dones,
                    next_values))
            # ---------------------------------------------------- PEBBLE schedule
            checkpoint_now = False
            if self.step >= cfg.num_seed_steps and not self.pretraining_done and \
                    self.step >= self.pretrain_end:
                self.end_pretraining()
                self.interact_count = 0
                checkpoint_now = True
            elif (self.pretraining_done and cfg.learn_reward
                  and self.interact_count >= cfg.num_interact
                  and self.feedback_open()):
                self.feedback_round()
                self.interact_count = 0
                checkpoint_now = True
            # ---------------------------------------------------- logs, eval
            step_before = self.step - n_envs * horizon
            if self.step // cfg.log_frequency > step_before // cfg.log_frequency:
                now = time.time()
                fps = (self.step - last_log_step) / max(now - last_log_time, 1e-9)
                last_log_step, last_log_time = self.step, now
                self.logger.console("train", {
                    "step": self.step, "phase": self.phase, "fps": fps,
                    "episode_reward": self.last_episode_reward,
                    "total_feedback": self.total_feedback, "reward_acc": self.reward_accuracy})
            if self.step // cfg.eval_frequency > step_before // cfg.eval_frequency or \
                    self.step >= until:
                self.evaluate()
                self.save_checkpoints()
            self.maybe_checkpoint(force=checkpoint_now)  # after the logs: rows up to this step
        envs.close()

    def new_episode_id(self) -> int:
        """A fresh episode id for the store (ids follow the order in which episodes start)."""
        self.episodes_started += 1
        return self.episodes_started - 1

    def finish_episode(self, stage: _EpisodeStaging, terminated: bool, duration: float) -> None:
        """Move the rest of a finished episode into the episode store and log its true return."""
        stage.flush(self.buffer, terminated, self.frames)
        length, ret = stage.t, stage.episode_return
        self.last_episode_reward = ret
        self.recent_returns.append(ret)
        self.recent_lengths.append(length)
        self.logger.train.write({
            "step": self.step, "episode": self.episode, "episode_reward": ret,
            "episode_length": length, "total_feedback": self.total_feedback,
            "labeled_feedback": self.labeled_feedback, "reward_accuracy": self.reward_accuracy,
            "phase": self.phase, "duration": duration,
            **{k: float(self.metrics[k]) if k in self.metrics else float("nan")
               for k in self.agent.METRICS}})
        self.episode += 1

    def intrinsic_rewards(self, rollout_obs: np.ndarray) -> np.ndarray:
        """State-entropy reward of each state of the rollout: distance to its ``topK``-th
        nearest neighbour among the rollout's other states (RE3 / PEBBLE Eq. 3), normalised by a
        running std. Shape ``(T, N)``."""
        horizon, n_envs = rollout_obs.shape[:2]
        flat = torch.as_tensor(rollout_obs.reshape(horizon * n_envs, *self.obs_shape),
                               device=self.device)
        feats = self.state_entropy.features(flat)
        dist = knn_distance(feats, feats, min(self.cfg.topK, len(feats) - 1), exclude_self=True)
        self.state_entropy.stats.update(dist)
        reward = dist / float(self.state_entropy.stats.std + 1e-8)
        return reward.reshape(horizon, n_envs).cpu().numpy().astype(np.float32)

    def learned_rewards(self, rollout_obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Ensemble-mean r̂(s, a) of every step of the rollout, ``(T, N)``."""
        assert self.reward_model is not None
        horizon, n_envs = actions.shape
        one_hot = np.eye(self.action_dim, dtype=np.float32)[actions.reshape(-1)]
        with eval_mode(self.reward_model):
            r = self.reward_model.predict(rollout_obs.reshape(horizon * n_envs, -1), one_hot)
        return r.reshape(horizon, n_envs)

    def eval_action(self, obs: np.ndarray) -> Any:
        """Evaluation samples from the policy: PPO's policy is stochastic by design, and the
        arg-max action can loop forever in gridworlds."""
        return self.agent.act(obs, sample=True)
