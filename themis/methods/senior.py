"""SENIOR: motion-distinction-based query selection (MDS).

Ni, Lu, Hu, Cai & Wang, "SENIOR: Efficient Query Selection and Preference-Guided Exploration
in Preference-based Reinforcement Learning", IROS 2025 (arXiv 2506.14648); official code
nihx9919/SENIOR (commit a15963f), ``reward_model.py`` ``RewardModel.mds_sampling``,
``compute_quries_kde``, ``compute_diff`` / ``compute_main_direction``, ``train_SENIOR.py``
``learn_reward``, ``run_SENIOR.sh``.

Every feedback round after the first (which stays uniform) cuts ``reward_batch × large_batch``
candidate pairs and keeps ``reward_batch`` of them in two stages, looking only at the position
part ``p_t = s_t[position_dims]`` of each step (Meta-World's hand xyz, dims 0–2):

1. **Motion**: each segment's density score K(P) = Σ_t log p̂_P(p_t), with p̂_P the Gaussian
   kernel density (bandwidth ``bandwidth`` h) fitted on the segment's own T positions:
   log p̂_P(x) = logsumexp_j(−‖x − p_j‖² / 2h²) − log T − (d/2) log(2πh²). A low K is a spread
   of positions, a segment that moves. The ``reward_batch × r`` pairs of highest
   1 / (K(σ⁰) + K(σ¹)) stay, r = max(1, int(``large_batch`` × ``sample_ratio``)), as the
   official ``compute_quries_kde`` ranks them. That is the lowest summed log density only while
   the sums K(σ⁰) + K(σ¹) are positive: a pair with a negative sum (segments that spread
   most) ranks below every pair with a positive one. Each step's own kernel term bounds
   log p̂ ≥ −log T − (d/2) log(2πh²), so K > 0 whenever T < (2πh²)^(−d/2): always on the
   official settings (h = 0.05, d = 3: T < 508; segment 50), not for a wider bandwidth or more
   steps (h = 0.5, d = 3: the bound is −log T + 0.68, negative from T = 2).
2. **Distinction** (when r > 1): each segment's main direction v, the first principal
   component of its centred positions; the ``reward_batch`` pairs of largest angle
   arccos(v⁰ · v¹) are the queries: two clips that both move, in different directions.

Where Themis differs from the official code, each stated:

- The official lists of scores are built by prepending (``np.append(score, scores)``), so the
  score at index j belongs to pair N − 1 − j while the pairs are indexed in their order: both
  stages pick the mirror of the intended pairs, a uniform choice in distribution (the
  candidates are i.i.d.). Themis aligns scores and pairs (the method as described);
  ``senior.mirror_index_bug=true`` reproduces the official code's picks.
- The sign of a principal component is arbitrary (scikit-learn's convention changed between
  versions): Themis makes the entry of largest magnitude positive and clips v⁰ · v¹ to
  [−1, 1] before arccos (the official code does not clip; a NaN there is never picked).
- Only MDS: SENIOR's preference-guided exploration (PGE: a bonus of the preferred states'
  density over the replay buffer's, weighted 0.1 · 0.99^step, and a 70/30 mix of replay and
  "curiosity" batches) is not included. In the official code the weight is applied with the
  global step, ≥ 10000 at its first use, so the bonus is below 1e-43: what it changes there is
  the replay mix alone. SENIOR runs on MRN in its repository; here it is a query selection that
  composes with any method (``method=[senior,mrn]`` runs both, as the official code).
- SENIOR's published numbers come from the official code as it runs: queries that are
  uniform in distribution (the mirror index above), on top of MRN (``train_SENIOR.py``), with
  PGE's 70/30 replay mix; they measure that combination, not MDS as described alone.
- The official runs are on Meta-World only (``run_SENIOR.sh``: ``segment`` 50,
  ``large_batch`` 10, ``sample_ratio`` 0.3, bandwidth 0.05); ``position_dims`` must name the
  position dims of other environments' observations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from themis.core.ranges import POSITIVE_REAL, Range
from themis.core.run_keys import RunKeys
from themis.methods.base import Method, MethodContext
from themis.utils import ConfigError


@dataclass
class SENIORConfig:
    """``senior.*`` keys (``method=senior`` sets ``enabled``); defaults: ``run_SENIOR.sh``
    and ``train_SENIOR.py`` on Meta-World."""

    enabled: bool = False
    """Switch SENIOR's query selection on (``method=senior``)."""
    position_dims: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Observation dims that hold the position whose motion is scored (Meta-World: the
    hand's x, y, z, dims 0-2)."""
    bandwidth: float = 0.05
    """Bandwidth h of the Gaussian kernel density of a segment's positions."""
    sample_ratio: float = 0.3
    """Stage 1 keeps reward_batch x max(1, int(large_batch x sample_ratio)) pairs."""
    mirror_index_bug: bool = False
    """Pick as the official code does (scores of pair N-1-j used for pair j): a uniform
    choice in distribution; for reproducing its runs only."""


def motion_scores(positions: np.ndarray, bandwidth: float) -> np.ndarray:
    """K of each segment: the summed log kernel density of its own positions.

    Args:
        positions: ``(m, T, d)`` positions of ``m`` segments of ``T`` steps.
        bandwidth: the Gaussian kernel's h.

    Returns:
        ``(m,)`` float64: Σ_t log p̂(p_t) (low: the segment moves).
    """
    x = torch.as_tensor(positions, dtype=torch.float64)
    _, steps, dims = x.shape
    sq = torch.cdist(x, x) ** 2  # (m, T, T)
    log_density = torch.logsumexp(-sq / (2 * bandwidth ** 2), dim=2) - np.log(steps) \
        - 0.5 * dims * np.log(2 * np.pi * bandwidth ** 2)
    return log_density.sum(1).numpy()


def main_directions(positions: np.ndarray) -> np.ndarray:
    """The first principal component of each segment's centred positions, its entry of
    largest magnitude positive: ``(m, T, d) -> (m, d)`` unit vectors."""
    x = torch.as_tensor(positions, dtype=torch.float64)
    x = x - x.mean(1, keepdim=True)
    v = torch.linalg.svd(x, full_matrices=False).Vh[:, 0]  # (m, d)
    sign = torch.sign(v.gather(1, v.abs().argmax(1, keepdim=True)))
    return (v * torch.where(sign == 0, 1.0, sign)).numpy()


def top(scores: np.ndarray, k: int, mirrored: bool) -> np.ndarray:
    """Indices of the ``k`` highest scores (ties: the earlier first); ``mirrored``: the
    official code's picks, scores read in reverse order."""
    ranked = scores[::-1] if mirrored else scores
    return np.argsort(-ranked, kind="stable")[:k]


class SENIOR(Method[SENIORConfig]):
    """SENIOR's motion-distinction-based query selection (module docstring)."""

    name, title, published = "senior", "SENIOR", "2025-06"
    Config = SENIORConfig
    RANGES: ClassVar[Mapping[str, Range]] = {
        "bandwidth": POSITIVE_REAL, "sample_ratio": Range(0, 1, lo_open=True)}

    def __init__(self, cfg: SENIORConfig, context: MethodContext) -> None:
        super().__init__(cfg, context)
        self.dims = np.asarray(list(cfg.position_dims), np.int64)
        if len(self.dims) == 0 or self.dims.min() < 0 or self.dims.max() >= context.obs_dim:
            raise ConfigError(f"senior.position_dims={list(cfg.position_dims)} must name "
                              f"observation dims in [0, {context.obs_dim - 1}]")

    @classmethod
    def check(cls, run_cfg: RunKeys, agent: str | None, where: str) -> None:
        """Positions are dims of a vector observation: at least one, none negative."""
        dims = list(cls.own_keys(run_cfg).position_dims)
        if not dims or min(dims) < 0 or len(set(dims)) < len(dims):
            raise ConfigError(f"senior.position_dims={dims} must be distinct observation dims "
                              "(e.g. [0,1,2], Meta-World's hand position)")

    def select_queries(self, candidates: Any, reward_model: Any, n: int,
                       rng: np.random.Generator) -> np.ndarray:
        """Two stages over the candidates' positions (module docstring)."""
        obs = candidates.observations
        pairs, _, steps = obs.shape[:3]
        positions = obs.reshape(pairs, 2, steps, -1)[..., self.dims].astype(np.float64)
        large_batch = max(1, pairs // max(1, n))
        keep = n * max(1, int(large_batch * self.cfg.sample_ratio))
        motion = motion_scores(positions.reshape(2 * pairs, steps, -1),
                               self.cfg.bandwidth).reshape(pairs, 2)
        first = top(1.0 / motion.sum(1), keep, self.cfg.mirror_index_bug)
        if keep <= n:
            return first
        directions = main_directions(positions[first].reshape(2 * len(first), steps, -1))
        directions = directions.reshape(len(first), 2, -1)
        cosine = np.clip((directions[:, 0] * directions[:, 1]).sum(1), -1.0, 1.0)
        return first[top(np.arccos(cosine), n, self.cfg.mirror_index_bug)]


__all__ = ["SENIOR", "SENIORConfig", "main_directions", "motion_scores"]
