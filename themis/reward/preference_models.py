"""How an answer follows from segment returns: the models shared by the synthetic teachers
(who answer with them), the trainers (who fit the reward model with them) and the audits (who
score people against them).

- :func:`true_preference`: the oracle's label of a pair, from the true segment returns;
- RbRL's rating model (White et al., "Rating-Based Reinforcement Learning", AAAI 2024, Sec. 4;
  :mod:`themis.reward.rating`): returns normalised over a batch (:func:`normalised_returns`),
  class boundaries (:func:`class_boundaries`), the class logits (:func:`rating_logits`) and the
  cross-entropy with given ratings (:func:`rating_loss`).

Numbers only (NumPy, PyTorch): nothing here imports the rest of Themis.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def true_preference(true_rewards: np.ndarray) -> np.ndarray:
    """The label of the true (undiscounted) segment returns: 1 = segment 2 better, 0 =
    segment 1, 0.5 = equal returns. Shape ``(n, 2, H) -> (n,)`` float64 (for scores and audits,
    not a teacher: no β, γ or ε)."""
    true = np.asarray(true_rewards).sum(-1)
    return np.where(true[:, 1] > true[:, 0], 1.0, np.where(true[:, 1] < true[:, 0], 0.0, 0.5))


def normalised_returns(returns: torch.Tensor) -> torch.Tensor:
    """R̃: ``(..., n)`` returns min–max scaled to [0, 1] over the last axis (0.5 if constant)."""
    lo = returns.min(-1, keepdim=True).values
    span = returns.max(-1, keepdim=True).values - lo
    return torch.where(span > 1e-8, (returns - lo) / span.clamp_min(1e-8),
                       torch.full_like(returns, 0.5))


def class_boundaries(normalised: torch.Tensor, ratings: torch.Tensor,
                     classes: int) -> torch.Tensor:
    """RbRL's boundaries R̄_0 … R̄_n: class ``i`` gets as many of the batch's segments (in order
    of R̃) as were rated ``i``; an inner boundary lies halfway between the last segment of one
    class and the first of the next.

    Shapes: ``normalised (..., n)`` in [0, 1], ``ratings (..., n)`` integer classes ->
    ``(..., classes + 1)``, first 0 and last 1 (no gradient: the boundaries follow the data).
    """
    with torch.no_grad():
        ordered = normalised.sort(-1).values
        n = ordered.shape[-1]
        counts = F.one_hot(ratings.long(), classes).sum(-2)  # (..., classes)
        ends = counts.cumsum(-1)[..., :-1]  # segments in classes 0..i
        below = ordered.gather(-1, (ends - 1).clamp(0, n - 1))
        above = ordered.gather(-1, ends.clamp(0, n - 1))
        inner = torch.where(ends <= 0, torch.zeros_like(below),
                            torch.where(ends >= n, torch.ones_like(above), (below + above) / 2))
        zeros = torch.zeros_like(ordered[..., :1])
        return torch.cat([zeros, inner, zeros + 1], -1)


def rating_logits(normalised: torch.Tensor, boundaries: torch.Tensor, k: float) -> torch.Tensor:
    """``−k (R̃ − R̄_i)(R̃ − R̄_{i+1})`` per class: ``(..., n)``, ``(..., C + 1)`` -> ``(..., n, C)``
    (log Q up to the normalising constant)."""
    x = normalised.unsqueeze(-1)
    lower, upper = boundaries[..., None, :-1], boundaries[..., None, 1:]
    return -k * (x - lower) * (x - upper)


def rating_loss(returns: torch.Tensor, ratings: torch.Tensor, classes: int,
                k: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RbRL's cross-entropy of a batch of rated segments, per ensemble member.

    Args:
        returns: ``(E, n)`` predicted segment returns.
        ratings: ``(E, n)`` given classes, 0 … ``classes`` − 1.
        classes: number of rating classes ``C``.
        k: sharpness of the class probabilities.

    Returns:
        ``(E,)`` mean loss and ``(E, n)`` predicted classes (argmax Q).
    """
    x = normalised_returns(returns)
    logits = rating_logits(x, class_boundaries(x, ratings, classes), k)
    loss = F.cross_entropy(logits.flatten(0, -2), ratings.long().flatten(),
                           reduction="none").view(ratings.shape).mean(-1)
    return loss, logits.argmax(-1)
