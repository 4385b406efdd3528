"""Bradley–Terry training of the reward ensemble (Christiano et al. 2017, Eq. 1; PEBBLE Eq. 4).

P[σ¹ ≻ σ⁰] = exp Σ r̂(s¹_t, a¹_t) / (exp Σ r̂(s⁰_t, a⁰_t) + exp Σ r̂(s¹_t, a¹_t)) = sigmoid(R¹ − R⁰),
and the loss is the cross-entropy between this probability and the label y ∈ {0, 0.5, 1}
(y = 1: segment 2 preferred; 0.5 gives the soft target BPref uses for "equally preferred").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from themis.reward.dataset import PreferenceDataset
from themis.reward.ensemble import RewardEnsemble
from themis.utils import make_adam


def bradley_terry_loss(returns_1: torch.Tensor, returns_2: torch.Tensor,
                       labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the Bradley–Terry preference model, averaged over pairs.

    Args:
        returns_1, returns_2: predicted segment returns, any matching shape ``(..., n)``.
        labels: ``(..., n)`` probability that segment 2 is preferred (0, 0.5 or 1).

    Returns:
        ``(...)`` mean loss over the last axis.
    """
    return F.binary_cross_entropy_with_logits(returns_2 - returns_1, labels,
                                              reduction="none").mean(-1)


@dataclass
class RewardTrainStats:
    """Outcome of one call of :meth:`RewardTrainer.train`."""

    loss: float
    accuracy: float
    epochs: int


class RewardTrainer:
    """Fits a :class:`RewardEnsemble` to a :class:`PreferenceDataset`.

    Every member sees the dataset in its own random order each epoch (as in BPref).

    Args:
        model: the ensemble.
        lr: Adam learning rate (``reward_lr``).
        batch_size: pairs per gradient step (BPref: 128).
        rng: random generator for the per-member permutations.
    """

    def __init__(self, model: RewardEnsemble, lr: float = 3e-4, batch_size: int = 128,
                 rng: np.random.Generator | None = None) -> None:
        self.model = model
        self.batch_size = batch_size
        self.optimizer = make_adam(model.parameters(), lr)
        self.rng = rng if rng is not None else np.random.default_rng()

    def train_epoch(self, dataset: PreferenceDataset) -> tuple[float, float]:
        """One pass over the dataset; returns (mean loss, mean accuracy) over members.

        Accuracy counts pairs with a strict preference whose predicted order matches the label;
        NaN when every label is a tie (nothing was measured, so nothing reads as success).
        """
        obs, act, labels = dataset.tensors(self.model.device)
        n, ens = len(dataset), self.model.ensemble_size
        perms = torch.from_numpy(np.stack([self.rng.permutation(n) for _ in range(ens)]))
        perms = perms.to(self.model.device)
        total_loss = torch.zeros((), device=obs.device)
        correct = torch.zeros((), device=obs.device)
        counted = torch.zeros((), device=obs.device)
        for lo in range(0, n, self.batch_size):
            idx = perms[:, lo:lo + self.batch_size]  # (E, b)
            o, a, y = obs[idx], act[idx], labels[idx]  # (E, b, 2, H, d), (E, b)
            r1 = self.model.segment_returns(o[:, :, 0], a[:, :, 0])
            r2 = self.model.segment_returns(o[:, :, 1], a[:, :, 1])
            loss = bradley_terry_loss(r1, r2, y).sum()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            with torch.no_grad():  # accumulate on the device: no host sync per minibatch
                strict = y != 0.5
                correct += (((r2 > r1) == (y > 0.5)) & strict).sum()
                counted += strict.sum()
                total_loss += loss.detach() * idx.shape[1]
        accuracy = correct.item() / counted.item() if counted.item() else float("nan")
        return total_loss.item() / (n * ens), accuracy

    def train(self, dataset: PreferenceDataset, max_epochs: int,
              target_accuracy: float = 0.97) -> RewardTrainStats:
        """Train for up to ``max_epochs`` epochs, stopping once train accuracy > target (BPref),
        or after one epoch when every label is a tie (accuracy NaN: no order to fit).

        Raises:
            ValueError: the dataset is empty.
        """
        if len(dataset) == 0:
            raise ValueError("cannot train the reward model on an empty preference dataset")
        loss, acc, epochs = float("nan"), 0.0, 0
        self.model.train()
        while epochs < max_epochs:
            loss, acc = self.train_epoch(dataset)
            epochs += 1
            if acc > target_accuracy or np.isnan(acc):
                break
        return RewardTrainStats(loss=loss, accuracy=acc, epochs=epochs)

    @torch.no_grad()
    def accuracy(self, observations: np.ndarray, actions: np.ndarray,
                 labels: np.ndarray) -> float:
        """Ensemble-mean accuracy on held-out pairs with strict preferences.

        Shapes: ``observations (n, 2, H, obs_dim)``, ``actions (n, 2, H, action_dim)``,
        ``labels (n,)``.
        """
        p = self.model.preference_probabilities(observations, actions).mean(0)
        strict = labels != 0.5
        if not strict.any():
            return float("nan")
        return float(((p > 0.5) == (labels > 0.5))[strict].mean())
