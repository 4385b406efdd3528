"""Temporal cropping of segment pairs: SURF's and QPA's data augmentation.

A labelled pair keeps its label when both segments are shortened to the same random length at
independent random starts (the preference is about the behaviour, not its exact window):

- SURF (Park et al., ICLR 2022; alinlab/SURF ``reward_model_semi_dataaug.py``,
  ``get_cropping_mask``): one crop per pair, length uniform in [H − crop_range, H + crop_range]
  of segments stored ``2 × crop_range`` steps longer. Themis stores segments of ``segment``
  steps, so the same spread of lengths is drawn as [H − 2·crop_range, H].
- QPA (Hu et al., ICLR 2024; huxiao09/QPA ``reward_model.py``, ``get_cropping_mask`` in
  ``train_reward_iter``): every pair is tiled ``data_aug_ratio`` times (20), each copy cropped
  to a length in [H − 15, H − 5].

A fresh crop is drawn for every ensemble member and every batch (as both official codes do).
"""

from __future__ import annotations

import numpy as np
import torch


class TemporalCrop:
    """Crop both segments of each pair to one random length, at independent random starts.

    Args:
        min_length, max_length: crop lengths, inclusive (steps).
        copies: crops per pair (QPA's ``data_aug_ratio``; SURF: 1).

    Raises:
        ValueError: ``1 <= min_length <= max_length`` does not hold, or ``copies < 1``.
    """

    def __init__(self, min_length: int, max_length: int, copies: int = 1) -> None:
        if not 1 <= min_length <= max_length or copies < 1:
            raise ValueError(f"crop lengths [{min_length}, {max_length}] x {copies} copies")
        self.min_length, self.max_length, self.copies = min_length, max_length, copies

    def masks(self, shape: tuple[int, ...], horizon: int, rng: np.random.Generator,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Crop masks of the two segments.

        Args:
            shape: ``(E, n)`` members × pairs (already tiled ``copies`` times).
            horizon: stored segment length ``H`` (crops longer than ``H`` are cut to ``H``).

        Returns:
            ``(mask_1, mask_2, lengths)``: float masks ``(E, n, H)`` with ``length`` ones each,
            and the ``(E, n)`` lengths.
        """
        hi = min(self.max_length, horizon)
        lo = min(self.min_length, hi)
        lengths = rng.integers(lo, hi + 1, size=shape)
        starts = [rng.integers(0, horizon - lengths + 1) for _ in range(2)]
        t = torch.arange(horizon, device=device)
        out = []
        for start in starts:
            s = torch.as_tensor(start, device=device)[..., None]
            n = torch.as_tensor(lengths, device=device)[..., None]
            out.append(((t >= s) & (t < s + n)).float())
        return out[0], out[1], lengths

    def returns(self, rewards_1: torch.Tensor, rewards_2: torch.Tensor, labels: torch.Tensor,
                rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Cropped segment returns: per-step rewards ``(E, n, H)`` of each segment and labels
        ``(E, n)`` -> returns ``(E, copies·n)`` twice and the tiled labels ``(E, copies·n)``."""
        if self.copies > 1:
            rewards_1, rewards_2, labels = (x.repeat_interleave(self.copies, dim=1)
                                            for x in (rewards_1, rewards_2, labels))
        m1, m2, _ = self.masks(tuple(labels.shape), rewards_1.shape[-1], rng,
                               rewards_1.device)
        return (rewards_1 * m1).sum(-1), (rewards_2 * m2).sum(-1), labels


__all__ = ["TemporalCrop"]
