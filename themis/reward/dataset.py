"""Preference dataset: the labelled queries the reward model is trained on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from themis.buffers import SegmentPairs


class PreferenceDataset:
    """Append-only store of labelled segment pairs, preallocated to ``capacity`` pairs.

    Args:
        capacity: maximum number of labelled pairs (``max_feedback``).
        segment: steps per segment ``H``.
        obs_dim, action_dim: feature sizes.

    Labels follow BPref: 0.0 = segment 1 preferred, 1.0 = segment 2 preferred, 0.5 = equally
    preferred.
    """

    def __init__(self, capacity: int, segment: int, obs_dim: int, action_dim: int) -> None:
        self.capacity = capacity
        self.observations = np.zeros((capacity, 2, segment, obs_dim), dtype=np.float32)
        self.actions = np.zeros((capacity, 2, segment, action_dim), dtype=np.float32)
        self.true_rewards = np.zeros((capacity, 2, segment), dtype=np.float32)
        self.labels = np.zeros(capacity, dtype=np.float32)
        self.size = 0
        self._tensors: tuple[torch.Tensor, ...] | None = None

    def __len__(self) -> int:
        return self.size

    def add(self, pairs: SegmentPairs, labels: np.ndarray) -> None:
        """Append labelled pairs.

        Raises:
            ValueError: lengths differ, a label is not in {0, 0.5, 1}, or capacity is exceeded.
        """
        n = len(pairs)
        labels = np.asarray(labels, dtype=np.float32).reshape(-1)
        if len(labels) != n:
            raise ValueError(f"{n} pairs but {len(labels)} labels")
        if not np.all(np.isin(labels, (0.0, 0.5, 1.0))):
            raise ValueError(f"preference labels must be 0, 0.5 or 1, got {np.unique(labels)}")
        if self.size + n > self.capacity:
            raise ValueError(f"preference dataset is full ({self.capacity} pairs)")
        sl = slice(self.size, self.size + n)
        self.observations[sl] = pairs.observations
        self.actions[sl] = pairs.actions
        self.true_rewards[sl] = pairs.true_rewards
        self.labels[sl] = labels
        self.size += n
        self._tensors = None

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """``(observations, actions, labels)`` of the stored pairs as tensors (cached)."""
        if self._tensors is None or self._tensors[0].device != device:
            n = self.size
            self._tensors = tuple(
                torch.as_tensor(a[:n], device=device)
                for a in (self.observations, self.actions, self.labels)
            )
        return self._tensors

    def save(self, path: str | Path) -> None:
        """Write the labelled pairs to an ``.npz`` file (no pickled objects), atomically.

        The file is written beside ``path`` and renamed over it, so a crash mid-write leaves
        the previous version intact.
        """
        path = Path(path)
        n = self.size
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as f:
            np.savez(f, format_version=np.array(1), observations=self.observations[:n],
                     actions=self.actions[:n], true_rewards=self.true_rewards[:n],
                     labels=self.labels[:n])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def state_dict(self) -> dict[str, Any]:
        n = self.size
        return {"observations": self.observations[:n].copy(), "actions": self.actions[:n].copy(),
                "true_rewards": self.true_rewards[:n].copy(), "labels": self.labels[:n].copy()}
