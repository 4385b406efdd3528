"""Step stores with episode bookkeeping: segment pairs for queries, replay sampling, relabeling.

:class:`EpisodeStore` keeps the steps of recent episodes, which feedback rounds cut query
segments from (PPO's store: no next observations, Atari frame stacks once per frame);
:class:`ReplayBuffer` is the same store with next observations, uniform batch sampling and
relabeling (SAC), as Stable-Baselines3's ``BaseBuffer`` → ``ReplayBuffer`` / ``RolloutBuffer``.

The store is preallocated and circular. Besides the usual transition fields it keeps
the true environment reward (for synthetic teachers and evaluation of the reward model) and, per
transition, the episode it belongs to and its time step in that episode, so that fixed-length
segments for preference queries are cut straight out of the buffer without a second copy of the
trajectories (BPref keeps one inside its reward model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from themis.environments.framestack import stacked
from themis.utils import check_memory


class NoSegmentsError(ValueError):
    """No stored episode (in the query pool) is long enough to cut a segment from."""


class ReplayBufferSamples(NamedTuple):
    """A batch of transitions (Stable-Baselines3 style). Shapes: ``(B, ...)``; rewards ``(B,)``."""

    observations: torch.Tensor
    actions: torch.Tensor
    next_observations: torch.Tensor
    rewards: torch.Tensor
    not_dones: torch.Tensor


class SegmentPairs(NamedTuple):
    """``n`` pairs of ``segment``-step segments (query candidates or queries).

    Shapes: observations ``(n, 2, segment, obs_dim)``, actions ``(n, 2, segment, action_dim)``,
    true_rewards ``(n, 2, segment)``, starts ``(n, 2)`` (buffer index of each segment's first
    step). Index 0 of the second axis is segment 1, index 1 is segment 2.
    """

    observations: np.ndarray
    actions: np.ndarray
    true_rewards: np.ndarray
    starts: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)

    def take(self, idx: np.ndarray) -> SegmentPairs:
        """The pairs at positions ``idx`` (an index array or boolean mask)."""
        return SegmentPairs(*(field[idx] for field in self))


class EpisodeStore:
    """Circular store of the last ``capacity`` steps, with their episode and time step.

    Args:
        obs_shape: shape of one observation.
        action_dim: size of one action vector.
        capacity: maximum number of stored steps; older ones are overwritten.
        device: where sampled batches are placed.
        obs_dtype: storage type of observations: float32 for vectors, uint8 for pixels and
            grids (4× less memory; converted on sampling).
        frame_stack: ``k > 1`` for observations that are stacks of the last ``k`` frames,
            ``(k, *frame_shape)`` oldest first (Atari): only the newest frame of each step is
            stored, with a link to the episode's previous step, and stacks are rebuilt on
            reading (:mod:`themis.environments.framestack`; 4× less memory).

    Stored per step: ``obs``, ``action`` (float32), ``reward`` (what the agent is trained on),
    ``true_reward``, ``not_done`` (0 only on termination, not on time-limit truncation),
    ``episode`` and ``t``. Read observations with :meth:`observations` (``obs`` is empty when
    frames are stacked).

    Raises:
        ValueError: a non-positive capacity, or a frame stack that does not fit ``obs_shape``.
        MemoryError: the arrays would not fit in this machine's memory
            (:func:`themis.utils.check_memory`).
    """

    store_next_obs = False

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, capacity: int,
                 device: torch.device, obs_dtype: np.dtype | type = np.float32,
                 frame_stack: int = 1) -> None:
        if capacity <= 0:
            raise ValueError(f"replay buffer capacity must be positive, got {capacity}")
        if frame_stack > 1 and (len(obs_shape) < 2 or obs_shape[0] != frame_stack):
            raise ValueError(f"frame_stack={frame_stack} needs observations (frame_stack, ...) "
                             f"(got {obs_shape}) in an EpisodeStore")
        obs_bytes = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
        per_step = (obs_bytes // frame_stack + 8 if frame_stack > 1 else obs_bytes) \
            + (obs_bytes if self.store_next_obs else 0) + 4 * action_dim + 3 * 4 + 2 * 8
        check_memory(f"a {type(self).__name__} of {capacity} steps", capacity * per_step)
        self.capacity = capacity
        self.device = device
        self.obs_shape = tuple(obs_shape)
        self.frame_stack = frame_stack
        self.obs = np.zeros((0 if frame_stack > 1 else capacity, *obs_shape), dtype=obs_dtype)
        # stacked observations: newest frame of each step, and the slot of the step before it
        # in its episode (itself at t = 0: the stack is padded with the reset frame; -1: unknown)
        self.frames = np.zeros((capacity if frame_stack > 1 else 0, *obs_shape[1:]),
                               dtype=obs_dtype)
        self.prev = np.full(capacity if frame_stack > 1 else 0, -1, dtype=np.int64)
        self._tails: dict[int, int] = {}  # episode -> slot of its newest stored step
        self.next_obs = np.zeros((capacity if self.store_next_obs else 0, *obs_shape),
                                 dtype=obs_dtype)
        self.actions = np.zeros((capacity, action_dim), dtype=np.float32)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.true_rewards = np.zeros(capacity, dtype=np.float32)
        self.not_dones = np.zeros(capacity, dtype=np.float32)
        self.episode = np.full(capacity, -1, dtype=np.int64)
        self.t = np.zeros(capacity, dtype=np.int64)
        self.ptr = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs: np.ndarray, action: np.ndarray, reward: float, next_obs: np.ndarray,
            terminated: bool, episode: int, t: int, true_reward: float | None = None) -> None:
        """Store one transition; ``t`` is its time step within episode number ``episode``."""
        i = self.ptr
        if self.frame_stack > 1:
            self._add_frame(i, obs, episode, t)
        else:
            self.obs[i] = obs
        self.actions[i] = action
        if self.store_next_obs:
            self.next_obs[i] = next_obs
        self.rewards[i] = reward
        self.true_rewards[i] = reward if true_reward is None else true_reward
        self.not_dones[i] = 0.0 if terminated else 1.0
        self.episode[i] = episode
        self.t[i] = t
        self.ptr = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    # -------------------------------------------------------- stacked frames
    def _add_frame(self, i: int, obs: np.ndarray, episode: int, t: int) -> None:
        """Store the newest frame of ``obs`` in slot ``i``, linked to the episode's step t-1.

        Raises:
            ValueError: ``obs`` does not continue the episode's previous stack (or, at t = 0,
                is not one frame repeated): not a frame stack this buffer can de-duplicate.
        """
        self.episode[i] = -1  # slot i no longer holds what it held (checked by _history)
        prev = i
        if t > 0:
            tail = self._tails.pop(episode, -1)
            ok = tail >= 0 and self.episode[tail] == episode and self.t[tail] == t - 1
            prev = tail if ok else -1
        if prev >= 0:  # cheap check per step: the frame before the newest is the last stored
            same = bool((obs[:-1] == obs[-1]).all()) if t == 0 else \
                np.array_equal(self.frames[prev], obs[-2])
            if not same:
                raise ValueError(
                    f"observation at step {t} of episode {episode} does not continue the "
                    f"episode's frame stack: frame_stack={self.frame_stack} expects "
                    "FrameStackObservation stacks (oldest frame first, reset padding)")
        self.frames[i] = obs[-1]
        self.prev[i] = prev
        self._tails[episode] = i
        if len(self._tails) > 4096:  # episodes that never ended (e.g. cut by a resume)
            del self._tails[next(iter(self._tails))]

    def _history(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of the ``k`` frames of each slot's stack, oldest first: ``(*slots.shape, k)``,
        and whether each stack is still complete (no link overwritten or unknown)."""
        k = self.frame_stack
        hist = np.empty((*slots.shape, k), dtype=np.int64)
        ok = self.episode[slots] >= 0
        cur = hist[..., k - 1] = slots
        for j in range(k - 2, -1, -1):
            prev = self.prev[cur]
            valid = prev >= 0
            prev = np.where(valid, prev, cur)
            start = self.t[cur] == 0
            ok &= valid & (start | ((self.episode[prev] == self.episode[cur])
                                    & (self.t[prev] == self.t[cur] - 1)))
            cur = hist[..., j] = prev
        return hist, ok

    def readable(self, idx: np.ndarray) -> np.ndarray:
        """Whether the observation at each slot of ``idx`` can still be read (a stacked one
        whose earlier frames were overwritten cannot)."""
        idx = np.asarray(idx)
        return self._history(idx)[1] if self.frame_stack > 1 else np.ones(idx.shape, bool)

    def observations(self, idx: np.ndarray) -> np.ndarray:
        """Stored observations at slots ``idx`` (any shape): ``(*idx.shape, *obs_shape)``.

        Raises:
            ValueError: a stacked observation whose earlier frames were overwritten.
        """
        idx = np.asarray(idx)
        if self.frame_stack == 1:
            return self.obs[idx]
        hist, ok = self._history(idx)
        if not ok.all():
            raise ValueError("some stacked observations lost earlier frames to newer steps")
        return self.frames[hist]

    # --------------------------------------------------------------- segments
    def segment_starts(self, segment: int, min_episode: int = 0) -> np.ndarray:
        """Storage slots where a whole ``segment``-step segment of one episode begins.

        A slot ``i`` qualifies when slot ``i + segment - 1`` (mod capacity) holds the same
        episode, ``segment - 1`` steps later, and the episode number is at least ``min_episode``.
        """
        if self.size < segment:
            return np.zeros(0, dtype=np.int64)
        starts = np.arange(self.size)
        ends = (starts + segment - 1) % self.capacity
        ok = ends < self.size
        ok &= self.episode[starts] == self.episode[ends]
        ok &= self.t[ends] - self.t[starts] == segment - 1
        ok &= self.episode[starts] >= min_episode
        if self.frame_stack > 1:  # the first step's earlier frames must still be stored
            ok &= self._history(starts)[1]
        return starts[ok]

    def sample_segment_pairs(self, n: int, segment: int, rng: np.random.Generator,
                             min_episode: int = 0,
                             usable: Callable[[np.ndarray], np.ndarray] | None = None
                             ) -> SegmentPairs:
        """Draw ``n`` pairs of segments uniformly from the stored episodes.

        Args:
            usable: optional filter: given buffer slots ``(s, segment)`` returns a boolean mask
                of the same shape; only segments whose every step is usable are drawn (e.g.
                steps whose frames are still stored for a person to watch).

        Raises:
            NoSegmentsError: no stored episode is at least ``segment`` steps long.
        """
        starts = self.segment_starts(segment, min_episode)
        if usable is not None and len(starts):
            steps = (starts[:, None] + np.arange(segment)) % self.capacity
            starts = starts[usable(steps).all(axis=1)]
        if len(starts) == 0:
            raise NoSegmentsError(
                f"no stored episode has {segment} consecutive steps; lower `segment` "
                f"(now {segment}) or collect more steps before asking for preferences"
            )
        chosen = starts[rng.integers(0, len(starts), size=(n, 2))]
        idx = (chosen[..., None] + np.arange(segment)) % self.capacity  # (n, 2, segment)
        if self.frame_stack == 1:
            observations = self.obs[idx]
        else:  # segment + k - 1 frames per segment, viewed as stacks
            older = self._history(chosen)[0][..., :-1]
            frames = self.frames[np.concatenate([older, idx], axis=-1)]
            observations = stacked(frames, self.frame_stack, len(self.obs_shape) - 1,
                                   writeable=True)  # a fresh gather: nothing else reads it
        return SegmentPairs(observations, self.actions[idx], self.true_rewards[idx], chosen)

    # ------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """The stored part of the buffer as NumPy arrays (for snapshots)."""
        n = self.size
        frames = {"frames": self.frames[:n].copy(), "prev": self.prev[:n].copy()} \
            if self.frame_stack > 1 else {}
        return {
            "capacity": self.capacity, "ptr": self.ptr, "size": n, **frames,
            "obs": self.obs[:n].copy(), "next_obs": self.next_obs[:n].copy(),
            "actions": self.actions[:n].copy(), "rewards": self.rewards[:n].copy(),
            "true_rewards": self.true_rewards[:n].copy(), "not_dones": self.not_dones[:n].copy(),
            "episode": self.episode[:n].copy(), "t": self.t[:n].copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into this (possibly larger) buffer.

        Raises:
            ValueError: observation or action shapes differ, or the data does not fit.
        """
        n = int(state["size"])
        if state["obs"].shape[1:] != self.obs.shape[1:] or \
                state["actions"].shape[1:] != self.actions.shape[1:]:
            raise ValueError(
                f"snapshot holds observations {state['obs'].shape[1:]} and actions "
                f"{state['actions'].shape[1:]}, but this environment has "
                f"{self.obs.shape[1:]} and {self.actions.shape[1:]}"
            )
        if "frames" in state and self.frame_stack == 1:
            raise ValueError("snapshot stores frame stacks once per frame; this buffer does not")
        if n > self.capacity:
            raise ValueError(f"snapshot holds {n} transitions, more than capacity {self.capacity}")
        if n == state["capacity"] and state["ptr"] != 0:
            # Unroll a wrapped buffer so the oldest transition comes first.
            order = np.roll(np.arange(n), -int(state["ptr"]))
        else:
            order = np.arange(n)
        keys = ["actions", "rewards", "true_rewards", "not_dones", "episode", "t"]
        if self.frame_stack > 1 and "frames" in state:
            keys.append("frames")
            new_slot = np.empty(n, dtype=np.int64)
            new_slot[order] = np.arange(n)  # old slot -> slot after unrolling
            prev = state["prev"][order]
            self.prev[:n] = np.where(prev >= 0, new_slot[np.maximum(prev, 0)], -1)
            self._tails = {}
        elif self.frame_stack == 1:
            keys.append("obs")
        if self.store_next_obs:
            if len(state["next_obs"]) != n:
                raise ValueError("snapshot holds no next observations; this buffer needs them")
            keys.append("next_obs")
        for key in keys:
            getattr(self, key)[:n] = state[key][order]
        self.size = n
        self.ptr = n % self.capacity
        if self.frame_stack > 1 and "frames" not in state:  # whole stacks (older snapshots)
            self._frames_from_stacks(state["obs"][order])

    def _frames_from_stacks(self, stacks: np.ndarray, chunk: int = 4096) -> None:
        """Fill ``frames`` and ``prev`` of the first ``len(stacks)`` slots from whole stacks
        (slot order, ``episode`` and ``t`` already restored); a step whose earlier frames are
        not stored stays unreadable.

        Raises:
            ValueError: the stacks are not consecutive frame stacks.
        """
        n, self._tails = len(stacks), {}
        self.frames[:n] = stacks[:, -1]
        episode, t = self.episode[:n], self.t[:n]
        by_step = np.lexsort((t, episode))  # each episode's steps in order of t
        before, after = by_step[:-1], by_step[1:]
        linked = (episode[after] == episode[before]) & (t[after] == t[before] + 1)
        self.prev[:n] = -1
        self.prev[after[linked]] = before[linked]
        starts = np.flatnonzero(t == 0)
        self.prev[starts] = starts
        for lo in range(0, n, chunk):
            idx = np.arange(lo, min(lo + chunk, n))
            hist, ok = self._history(idx)
            if not np.array_equal(self.frames[hist[ok]], stacks[idx[ok]]):
                raise ValueError("snapshot observations are not frame stacks of consecutive "
                                 f"steps (frame_stack={self.frame_stack})")


class ReplayBuffer(EpisodeStore):
    """The off-policy replay buffer: an :class:`EpisodeStore` that also keeps ``next_obs``,
    samples uniform batches and relabels its rewards with a reward model.

    Args: as :class:`EpisodeStore` (no frame stacks: SAC acts on vectors).

    Once :attr:`reward_fn` is set (by :meth:`relabel`), the reward passed to :meth:`add` is
    ignored: new transitions are labelled by ``reward_fn`` lazily, in one batch, the first time
    a sample could contain one of them. No sample ever holds an unlabelled reward, and the
    reward model runs once per few dozen steps instead of once per step.
    """

    store_next_obs = True

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, capacity: int,
                 device: torch.device, obs_dtype: np.dtype | type = np.float32) -> None:
        super().__init__(obs_shape, action_dim, capacity, device, obs_dtype)
        self.reward_fn: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
        self._pending = 0  # newest transitions whose reward reward_fn has not computed yet

    def add(self, obs: np.ndarray, action: np.ndarray, reward: float, next_obs: np.ndarray,
            terminated: bool, episode: int, t: int, true_reward: float | None = None) -> None:
        """Store one transition (see :meth:`EpisodeStore.add`)."""
        super().add(obs, action, reward, next_obs, terminated, episode, t, true_reward)
        if self.reward_fn is not None:
            self._pending = min(self._pending + 1, self.capacity)

    def _label_pending(self) -> None:
        """Compute the rewards of transitions added since the last labelling."""
        if self._pending and self.reward_fn is not None:
            self._relabel_slots((self.ptr - np.arange(self._pending, 0, -1)) % self.capacity)
        self._pending = 0

    def _relabel_slots(self, idx: np.ndarray) -> None:
        """``rewards[idx] = reward_fn(obs, action)``."""
        assert self.reward_fn is not None
        self.rewards[idx] = self.reward_fn(self.observations(idx), self.actions[idx])

    def sample_indices(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """Uniform indices into the stored transitions, shape ``(batch_size,)``."""
        return rng.integers(0, self.size, size=batch_size)

    def sample(self, batch_size: int, rng: np.random.Generator) -> ReplayBufferSamples:
        """Uniformly sample ``batch_size`` transitions as tensors on ``device``."""
        return self.samples(self.sample_indices(batch_size, rng))

    def samples(self, idx: np.ndarray) -> ReplayBufferSamples:
        """The transitions in slots ``idx`` as tensors on ``device`` (rewards up to date)."""
        if self._pending and np.any((self.ptr - 1 - idx) % self.capacity < self._pending):
            self._label_pending()
        fields = (self.obs[idx], self.actions[idx], self.next_obs[idx], self.rewards[idx],
                  self.not_dones[idx])
        return ReplayBufferSamples(*(torch.from_numpy(f).to(self.device) for f in fields))

    # ---------------------------------------------------------------- relabel
    def relabel(self, reward_fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
                chunk_size: int = 16384) -> None:
        """Overwrite every stored reward with ``reward_fn(obs, action)`` and keep using it.

        PEBBLE (Lee et al. 2021, Sec. 4.2) relabels every stored transition each time the reward
        model changes, so that off-policy updates use one consistent reward. All stored slots
        are relabelled in chunks of ``chunk_size``; the storage order does not matter, so this is
        correct after the buffer has wrapped around. Later transitions are labelled by
        ``reward_fn`` too (see the class docstring).

        Args:
            reward_fn: maps ``obs (n, *obs_shape)`` and ``actions (n, action_dim)`` to ``(n,)``.
            chunk_size: transitions per call of ``reward_fn``.
        """
        self.reward_fn = reward_fn
        self._pending = 0
        for lo in range(0, self.size, chunk_size):
            self._relabel_slots(np.arange(lo, min(lo + chunk_size, self.size)))

    def state_dict(self) -> dict[str, Any]:
        """As :meth:`EpisodeStore.state_dict`, every reward labelled."""
        self._label_pending()
        return super().state_dict()
