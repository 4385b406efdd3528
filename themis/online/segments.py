"""Cutting an outside agent's steps into runs the learner's store can cut segments from.

The agent steps one env, or ``n`` sub-envs of a vectorised env, whose steps arrive
interleaved. The learner's :class:`themis.agents.buffers.EpisodeStore` cuts a query segment out of
consecutive slots of one episode, so the steps are regrouped per sub-env into :class:`Run` s
(consecutive steps of one episode) before they are sent: :class:`StepRecorder` keeps one
:class:`EpisodeRecorder` per sub-env, and :meth:`StepRecorder.take` hands over what was
recorded since the last call (the wrapper sends it to the learner process in one message).

An episode still running when its steps are taken is cut, and the last ``segment − 1`` steps
are kept to start its next run: each ``segment``-step window of an episode then lies whole in
exactly one run, so every segment the episode holds can be asked about, once (DRLHP cuts
fixed, non-overlapping segments instead, and pads episode ends; B-Pref cuts any window of a
stored episode, as here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Run:
    """Consecutive steps of one episode of one sub-env.

    Shapes: ``obs (n, *obs_shape)``, ``actions (n, action_dim)`` float32, ``true_rewards (n,)``
    float32, ``terminated (n,)`` bool (only the episode's last step can be true), ``frames
    (n, h, w, 3)`` uint8 or ``None``. ``t0`` is the time step of the first one in its episode.
    """

    episode: int
    t0: int
    obs: np.ndarray
    actions: np.ndarray
    true_rewards: np.ndarray
    terminated: np.ndarray
    frames: np.ndarray | None = None
    ends: bool = False
    """The episode ended with this run's last step (its last run)."""

    def __len__(self) -> int:
        return len(self.true_rewards)


class EpisodeRecorder:
    """The steps of one sub-env, in runs of one episode each.

    Args:
        segment: steps per query segment (runs shorter than that hold no segment and are not
            handed over; a cut keeps ``segment − 1`` steps for the next run).
        obs_shape, obs_dtype: one stored observation.
        action_dim: size of one action vector.
        capacity: steps held before a run is cut on its own (at least ``segment``).
        episode: the number of the first episode.
    """

    def __init__(self, segment: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype | type,
                 action_dim: int, capacity: int, episode: int = 0) -> None:
        self.segment = segment
        self.capacity = max(capacity, 2 * segment)
        self.obs = np.zeros((self.capacity, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((self.capacity, action_dim), dtype=np.float32)
        self.true_rewards = np.zeros(self.capacity, dtype=np.float32)
        self.terminated = np.zeros(self.capacity, dtype=bool)
        self.frames: np.ndarray | None = None  # allocated with the first frame
        self.n = 0  # steps held
        self.t0 = 0  # time step of the first held step in its episode
        self.episode = episode
        self.done: list[Run] = []  # runs cut, waiting for take()

    def add(self, obs: np.ndarray, action: np.ndarray, true_reward: float, terminated: bool,
            frame: np.ndarray | None = None) -> None:
        """Record one step: ``obs`` the observation the action was taken in, ``action``
        ``(action_dim,)``, the env's reward, and whether the step ended the episode by
        termination (not by a time limit)."""
        if self.n == self.capacity:
            self._cut(ended=False)
        i = self.n
        self.obs[i] = obs
        self.actions[i] = action
        self.true_rewards[i] = true_reward
        self.terminated[i] = terminated
        if frame is not None:
            if self.frames is None:
                self.frames = np.zeros((self.capacity, *frame.shape), dtype=np.uint8)
            self.frames[i] = frame
        self.n = i + 1

    def end_episode(self, next_episode: int) -> None:
        """The episode ended (terminated or truncated) after the last added step; the next
        steps belong to episode number ``next_episode``."""
        self._cut(ended=True)
        self.episode, self.t0 = next_episode, 0

    def take(self) -> list[Run]:
        """The runs recorded since the last call, the current episode's steps cut so far
        included (its last ``segment − 1`` steps stay to begin its next run)."""
        if self.n >= self.segment:
            self._cut(ended=False)
        runs, self.done = self.done, []
        return runs

    def _cut(self, ended: bool) -> None:
        n = self.n
        if n >= self.segment:
            self.done.append(Run(self.episode, self.t0, self.obs[:n].copy(),
                                 self.actions[:n].copy(), self.true_rewards[:n].copy(),
                                 self.terminated[:n].copy(),
                                 None if self.frames is None else self.frames[:n].copy(),
                                 ends=ended))
        keep = 0 if ended else min(n, self.segment - 1)
        if keep:  # the episode goes on: its last segment - 1 steps start the next run
            for array in (self.obs, self.actions, self.true_rewards, self.terminated,
                          self.frames):
                if array is not None:
                    array[:keep] = array[n - keep:n]
        self.t0 += n - keep
        self.n = keep


class StepRecorder:
    """The steps of ``n_envs`` sub-envs, regrouped into runs per episode.

    Episodes are numbered in the order they start, across sub-envs (sub-env ``i`` starts
    with episode ``i``). Also keeps each episode's true return and length.

    Args: as :class:`EpisodeRecorder`, plus ``n_envs``.
    """

    def __init__(self, n_envs: int, segment: int, obs_shape: tuple[int, ...],
                 obs_dtype: np.dtype | type, action_dim: int, capacity: int) -> None:
        self.recorders = [EpisodeRecorder(segment, obs_shape, obs_dtype, action_dim, capacity,
                                          episode=i) for i in range(n_envs)]
        self.next_episode = n_envs
        self.returns = np.zeros(n_envs)
        self.lengths = np.zeros(n_envs, dtype=np.int64)
        self.ended: list[tuple[float, int]] = []  # (true return, length) since take()
        self.pending = 0  # steps recorded since take()

    def add(self, i: int, obs: np.ndarray, action: np.ndarray, true_reward: float,
            terminated: bool, frame: np.ndarray | None = None) -> None:
        """One step of sub-env ``i`` (see :meth:`EpisodeRecorder.add`)."""
        self.recorders[i].add(obs, action, true_reward, terminated, frame)
        self.returns[i] += true_reward
        self.lengths[i] += 1
        self.pending += 1

    def end_episode(self, i: int) -> None:
        """Sub-env ``i``'s episode ended after its last step; its next one gets a new number."""
        self.recorders[i].end_episode(self.next_episode)
        self.next_episode += 1
        self.ended.append((float(self.returns[i]), int(self.lengths[i])))
        self.returns[i], self.lengths[i] = 0.0, 0

    def take(self) -> tuple[list[Run], list[tuple[float, int]]]:
        """The runs and the ended episodes' ``(true return, length)`` since the last call."""
        runs = [run for recorder in self.recorders for run in recorder.take()]
        ended, self.ended, self.pending = self.ended, [], 0
        return runs, ended


def add_run(store: object, run: Run) -> np.ndarray:
    """Write a run into consecutive slots of an :class:`themis.agents.buffers.EpisodeStore` (one
    observation per slot, ``frame_stack == 1``); returns the slots, ``(len(run),)``."""
    from themis.agents.buffers import EpisodeStore

    assert isinstance(store, EpisodeStore) and store.frame_stack == 1
    n = len(run)
    if n > store.capacity:  # only the newest steps fit
        drop = n - store.capacity
        run = Run(run.episode, run.t0 + drop, run.obs[drop:], run.actions[drop:],
                  run.true_rewards[drop:], run.terminated[drop:],
                  None if run.frames is None else run.frames[drop:], run.ends)
        n = store.capacity
    slots = (store.ptr + np.arange(n)) % store.capacity
    store.obs[slots] = run.obs
    store.actions[slots] = run.actions
    store.rewards[slots] = 0.0
    store.true_rewards[slots] = run.true_rewards
    store.not_dones[slots] = ~run.terminated
    store.episode[slots] = run.episode
    store.t[slots] = run.t0 + np.arange(n)
    store.ptr = int((store.ptr + n) % store.capacity)
    store.size = min(store.size + n, store.capacity)
    return slots


__all__ = ["EpisodeRecorder", "Run", "StepRecorder", "add_run"]
