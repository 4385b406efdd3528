"""Reward learning from ratings of single segments (rating feedback, ``feedback=rating``).

Rating-based RL (White et al., "Rating-Based Reinforcement Learning", AAAI 2024, Sec. 4): a
person puts one segment σ into one of ``n`` ordered classes (0 = worst). The reward model's
segment return R̂(σ) = Σ_t r̂(s_t, a_t) is normalised over the segments X of a batch,

    R̃(σ) = (R̂(σ) − min_X R̂) / (max_X R̂ − min_X R̂),

class boundaries 0 = R̄_0 < R̄_1 < … < R̄_n = 1 are placed so that each class gets as many
segments of the batch (in order of R̃) as were rated into it, and the probability of class i is

    Q_σ(i) = exp(−k (R̃(σ) − R̄_i)(R̃(σ) − R̄_{i+1})) / Σ_j exp(−k (R̃(σ) − R̄_j)(R̃(σ) − R̄_{j+1}))

(largest for the class whose interval holds R̃(σ)); the loss is the cross-entropy of Q with the
given ratings. ``k`` (``rating_k``) sets how sharp the classes are.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from themis.agents.encoders import observation_kind
from themis.reward.dataset import PreferenceDataset
from themis.reward.ensemble import RewardEnsemble
from themis.reward.preference_models import (
    class_boundaries,
    normalised_returns,
    rating_logits,
    rating_loss,
)
from themis.reward.trainer import RewardTrainer, StepBudget


class RatingTrainer(RewardTrainer):
    """Fits a :class:`RewardEnsemble` to a rating dataset (``PreferenceDataset`` with
    ``rating_classes``) with :func:`rating_loss`: :class:`themis.reward.RewardTrainer` with
    another epoch and accuracy (``train`` stops as BPref's, once train accuracy > 0.97).

    Every member sees the dataset in its own random order each epoch; the batch is the set X
    the returns are normalised over. Accuracy: share of segments whose predicted class (argmax
    Q within their batch) is the given rating.

    Args:
        model: the ensemble.
        classes: rating classes.
        k: sharpness (``rating_k``).
        lr, batch_size: Adam learning rate and segments per step.
        rng: per-member permutations.
    """

    def __init__(self, model: RewardEnsemble, classes: int, k: float = 30.0, lr: float = 3e-4,
                 batch_size: int = 128, rng: np.random.Generator | None = None) -> None:
        super().__init__(model, lr, batch_size, rng)
        self.classes, self.k = classes, k

    def train_epoch(self, dataset: PreferenceDataset, rows: np.ndarray | None = None,
                    budget: StepBudget | None = None) -> tuple[float, float]:
        """One pass over the rated segments; returns (mean loss, mean accuracy) over members.

        Raises:
            ValueError: a ``budget`` (rating rounds are counted in epochs: no method counts
                them in steps).
        """
        if budget is not None:
            raise ValueError("rating feedback trains in epochs, not in a budget of steps")
        obs, act, ratings = dataset.tensors(self.model.device)
        picked = torch.arange(len(ratings), device=obs.device) if rows is None \
            else torch.as_tensor(rows, device=obs.device)
        n, ens = len(picked), self.model.ensemble_size
        if n < 2:  # one segment has no place among others
            return float("nan"), float("nan")
        perms = torch.from_numpy(np.stack([self.rng.permutation(n) for _ in range(ens)]))
        perms = picked[perms.to(obs.device)]
        total, correct = torch.zeros((), device=obs.device), torch.zeros((), device=obs.device)
        pixels = observation_kind(self.model.obs_shape) == "pixels"
        step = max(2, self.chunk_images // obs.shape[2]) if pixels and self.chunk_images \
            else self.batch_size  # segments per forward pass
        for lo in range(0, n, self.batch_size):
            idx = perms[:, lo:lo + self.batch_size]  # (E, b)
            if idx.shape[1] < 2 and lo:
                continue
            self.optimizer.zero_grad(set_to_none=True)
            if idx.shape[1] <= step:
                returns = self.model.segment_returns(obs[idx][:, :, 0], act[idx][:, :, 0])
                loss, predicted = rating_loss(returns, ratings[idx], self.classes, self.k)
                loss.sum().backward()
            else:
                loss, predicted = self.chunked_step(obs, act, ratings, idx, step)
            self.optimizer.step()
            with torch.no_grad():
                total += loss.detach().sum() * idx.shape[1]
                correct += (predicted == ratings[idx].long()).sum()
        return total.item() / (n * ens), correct.item() / (n * ens)

    def chunked_step(self, obs: torch.Tensor, act: torch.Tensor, ratings: torch.Tensor,
                     idx: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradients of one batch's rating loss, ``step`` segments per forward pass (pixel
        observations: a batch's images would not fit at once). The batch's min, max and class
        boundaries come from a first pass without gradients and are held fixed (the gradient
        through the min and max is left out). Returns ``(E,)`` losses and ``(E, b)`` predicted
        classes, as :func:`rating_loss`."""
        chunks = [idx[:, c:c + step] for c in range(0, idx.shape[1], step)]
        with torch.no_grad():
            returns = torch.cat([self.model.segment_returns(obs[i][:, :, 0], act[i][:, :, 0])
                                 for i in chunks], 1)
            lo = returns.min(-1, keepdim=True).values
            span = returns.max(-1, keepdim=True).values - lo
            bounds = class_boundaries(normalised_returns(returns), ratings[idx], self.classes)
            loss, predicted = rating_loss(returns, ratings[idx], self.classes, self.k)
        for i in chunks:
            r = self.model.segment_returns(obs[i][:, :, 0], act[i][:, :, 0])
            x = torch.where(span > 1e-8, (r - lo) / span.clamp_min(1e-8), torch.full_like(r, 0.5))
            logits = rating_logits(x, bounds, self.k)
            part = F.cross_entropy(logits.flatten(0, -2), ratings[i].long().flatten(),
                                   reduction="sum") / idx.shape[1]
            part.backward()
        return loss, predicted

    @torch.no_grad()
    def accuracy(self, observations: np.ndarray, actions: np.ndarray,
                 ratings: np.ndarray) -> float:
        """Ensemble-mean class accuracy on held-out rated segments, normalised among
        themselves. Shapes: ``(n, 1, H, obs_dim)``, ``(n, 1, H, action_dim)``, ``(n,)``;
        NaN for fewer than 2 segments."""
        if len(ratings) < 2:
            return float("nan")
        n, _, horizon = observations.shape[:3]
        per_step = self.model.predict(observations.reshape(n * horizon, -1),
                                      actions.reshape(n * horizon, -1))  # ensemble mean
        device = self.model.device
        returns = torch.as_tensor(per_step.reshape(n, horizon).sum(1), device=device)[None]
        y = torch.as_tensor(np.asarray(ratings), device=device).long()[None]
        _, predicted = rating_loss(returns, y, self.classes, self.k)
        return float((predicted == y).float().mean())
