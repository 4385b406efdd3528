"""Bradley–Terry training of the reward ensemble (Christiano et al. 2017, Eq. 1; PEBBLE Eq. 4).

P[σ¹ ≻ σ⁰] = exp Σ r̂(s¹_t, a¹_t) / (exp Σ r̂(s⁰_t, a⁰_t) + exp Σ r̂(s¹_t, a¹_t)) = sigmoid(R¹ − R⁰),
and the loss is the cross-entropy between this probability and the label y ∈ {0, 0.5, 1}
(y = 1: segment 2 preferred; 0.5 gives the soft target BPref uses for "equally preferred").

DRLHP's recipe (Sec. 2.2.3, App. A; :mod:`themis.reward.recipe`), each off by default: the
random-response model P = (1 − ε) · sigmoid(R¹ − R⁰) + ε / 2 (ε = 0.1), a held-out validation
split, a bootstrap sample per member and an L2 coefficient adapted to the validation loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from themis.agents.encoders import observation_kind
from themis.reward.dataset import PreferenceDataset
from themis.reward.ensemble import RewardEnsemble
from themis.reward.preference_models import true_preference
from themis.reward.recipe import AdaptiveL2, BootstrapCounts, ValidationSplit, member_weight_norms
from themis.utils import make_adam


def bradley_terry_loss(returns_1: torch.Tensor, returns_2: torch.Tensor,
                       labels: torch.Tensor, random_response: float = 0.0) -> torch.Tensor:
    """Cross-entropy of the Bradley–Terry preference model, averaged over pairs.

    Args:
        returns_1, returns_2: predicted segment returns, any matching shape ``(..., n)``.
        labels: ``(..., n)`` probability that segment 2 is preferred (0, 0.5 or 1).
        random_response: ε, the probability that the teacher answers uniformly at random
            (DRLHP: 0.1, "we assume there is a 10% chance that the human responds uniformly at
            random", Sec. 2.2.3): P = (1 − ε) · sigmoid(R² − R¹) + ε / 2, so a confident wrong
            prediction costs at most −log(ε / 2). 0: the plain model.

    Returns:
        ``(...)`` mean loss over the last axis.
    """
    logits = returns_2 - returns_1
    if not random_response:
        return F.binary_cross_entropy_with_logits(logits, labels, reduction="none").mean(-1)
    # log P and log (1 − P) from log-sigmoids: exact where sigmoid saturates in float32
    keep, half = 1.0 - random_response, random_response / 2
    log_p = torch.logaddexp(np.log(keep) + F.logsigmoid(logits), torch.full_like(logits,
                                                                                np.log(half)))
    log_q = torch.logaddexp(np.log(keep) + F.logsigmoid(-logits), torch.full_like(logits,
                                                                                 np.log(half)))
    return -(labels * log_p + (1 - labels) * log_q).mean(-1)


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
        rng: random generator for the per-member permutations (and crops, pseudo-label
            batches).
        crop: a temporal crop of every pair (:class:`themis.methods.crop.TemporalCrop`);
            (the run's factory passes the methods' chosen one).
        methods: the run's methods, whose reward-training hooks run here
            (:class:`themis.methods.base.Method`, read here by its hooks only, so that the
            reward floor imports no method: ``select_labels`` before each epoch,
            ``start_epoch`` / ``end_epoch``, ``batch_loss`` each batch, ``stop_rule``).
        target_accuracy: :meth:`train` stops once train accuracy exceeds it (BPref: 0.97; a
            method's ``stop_rule`` replaces it).
        min_epochs: :meth:`train` stops early only after epoch ``min_epochs + 1`` (0-based
            index above ``min_epochs``; 0: any epoch, as BPref; a method's ``stop_rule``
            replaces it).
        chunk_images: pixel observations per member and forward pass: a batch of pairs is
            run through the CNNs in chunks whose gradients add up to the batch's (the same
            step; a 128-pair batch of 50-step segments is 12,800 images per member, whose
            activations would not fit in a CPU cache, nor in a few GB). ``None``: one pass.
        random_response: ε of the random-response preference model (``reward_random_response``;
            :func:`bradley_terry_loss`).
        validation: labels held out of training (``reward_val_fraction``); their loss and
            accuracy are measured after every :meth:`train` (:attr:`validation_stats`).
        bootstrap: each member's epochs visit its own bootstrap sample (``reward_bootstrap``).
        l2: L2 coefficients per member (``reward_l2``), adapted after each epoch to the
            validation loss when ``reward_adaptive_l2`` (needs ``validation``).
        check_pairs: labels of each kind (training, validation) the adaptive L2 measures after
            an epoch (the most recent ones).
    """

    def __init__(self, model: RewardEnsemble, lr: float = 3e-4, batch_size: int = 128,
                 rng: np.random.Generator | None = None, chunk_images: int | None = 256,
                 crop: Any = None, methods: Sequence[Any] = (),
                 target_accuracy: float = 0.97,
                 min_epochs: int = 0, random_response: float = 0.0,
                 validation: ValidationSplit | None = None,
                 bootstrap: BootstrapCounts | None = None, l2: AdaptiveL2 | None = None,
                 check_pairs: int = 128) -> None:
        if l2 is not None and l2.adaptive and validation is None:
            raise ValueError("an adaptive L2 coefficient needs held-out labels (validation)")
        self.model = model
        self.random_response, self.validation = random_response, validation
        self.bootstrap, self.l2, self.check_pairs = bootstrap, l2, check_pairs
        self.validation_stats: dict[str, float] = {} if validation is None else dict.fromkeys(
            ("val_labels", "val_loss", "val_accuracy"), float("nan"))
        """The last :meth:`train`'s validation numbers (empty without ``validation``; NaN
        before the first)."""
        self.methods = list(methods)
        rules = [rule for rule in (m.stop_rule() for m in self.methods) if rule is not None]
        if rules:  # a method's own stop (the first, in registry order)
            target_accuracy, min_epochs = rules[0]
        self.target_accuracy, self.min_epochs = target_accuracy, min_epochs
        self.batch_size = batch_size
        self.chunk_images = chunk_images
        self.crop = crop
        self.optimizer = make_adam(model.parameters(), lr)
        self.rng = rng if rng is not None else np.random.default_rng()

    def train_epoch(self, dataset: PreferenceDataset,
                    rows: np.ndarray | None = None) -> tuple[float, float]:
        """One pass over the dataset; returns (mean loss, mean accuracy) over members.

        Accuracy counts pairs with a strict preference whose predicted order matches the label;
        NaN when every label is a tie (nothing was measured, so nothing reads as success).
        """
        obs, act, labels = dataset.tensors(self.model.device)
        picked = None if rows is None else torch.as_tensor(rows, device=obs.device)
        if picked is not None:  # e.g. without the labels of flagged labelers
            labels = labels[picked]
        truth = true_preference(dataset.true_rewards[: len(dataset)]).astype(np.float32) \
            if self.methods else None  # once per epoch, for the methods' label statistics
        for method in self.methods:  # e.g. this epoch's trusted and flipped labels
            assert truth is not None
            oracle = truth if picked is None else truth[picked.cpu().numpy()]
            chosen = method.select_labels(
                self.model, obs if picked is None else obs[picked],
                act if picked is None else act[picked], labels, oracle)
            if chosen is not None:
                sel, labels = chosen
                picked = sel if picked is None else picked[sel]
        n, ens = len(labels), self.model.ensemble_size
        if n == 0:
            return float("nan"), float("nan")
        if self.bootstrap is not None:  # each member its own sample (dataset rows' counts)
            row_ids = np.arange(n) if picked is None else picked.cpu().numpy()
            perms = torch.from_numpy(self.bootstrap.orders(row_ids, self.rng))
        else:
            perms = torch.from_numpy(np.stack([self.rng.permutation(n) for _ in range(ens)]))
        perms = perms.to(self.model.device)
        for method in self.methods:
            method.start_epoch()
        total_loss = torch.zeros((), device=obs.device)
        correct = torch.zeros((), device=obs.device)
        counted = torch.zeros((), device=obs.device)
        horizon = obs.shape[2]
        pixels = observation_kind(self.model.obs_shape) == "pixels"
        step = max(1, self.chunk_images // horizon) if pixels and self.chunk_images \
            else self.batch_size  # pairs per forward pass
        for lo in range(0, n, self.batch_size):
            batch = perms[:, lo:lo + self.batch_size]  # (E, b)
            self.optimizer.zero_grad(set_to_none=True)
            for c in range(0, batch.shape[1], step):  # gradients add up to the batch's
                idx = batch[:, c:c + step]
                rows_idx = idx if picked is None else picked[idx]
                o, a, y = obs[rows_idx], act[rows_idx], labels[idx]  # (E, b', 2, H, d), (E, b')
                r1, r2, y = self.pair_returns(o, a, y)
                loss = bradley_terry_loss(r1, r2, y, self.random_response).sum() * (
                    idx.shape[1] / batch.shape[1])
                loss.backward()
                with torch.no_grad():  # accumulate on the device: no host sync per minibatch
                    strict = y != 0.5
                    correct += (((r2 > r1) == (y > 0.5)) & strict).sum()
                    counted += strict.sum()
                    total_loss += loss.detach() * batch.shape[1]
            if self.l2 is not None and self.l2.coef.any():  # DRLHP: Σ_e λ_e ‖θ_e‖²
                self.l2.penalty(member_weight_norms(self.model, ens)).backward()
            for method in self.methods:  # e.g. pseudo-labelled unlabelled pairs
                extra = method.batch_loss(self.model, self.batch_size, self.rng,
                                          self.pair_returns)
                if extra is not None:
                    extra.backward()
            self.optimizer.step()
        for method in self.methods:
            method.end_epoch()
        accuracy = correct.item() / counted.item() if counted.item() else float("nan")
        return total_loss.item() / (n * ens), accuracy

    def pair_returns(self, obs: torch.Tensor, act: torch.Tensor, labels: torch.Tensor,
                     steps: tuple[torch.Tensor, torch.Tensor] | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Predicted returns of both segments of member-specific pairs, cropped with
        :attr:`crop` (then tiled ``copies`` times, labels too).

        Shapes: ``obs (E, n, 2, H, d)``, ``act (E, n, 2, H, a)``, ``labels (E, n)`` ->
        ``(E, m)`` twice and ``(E, m)``, ``m = n`` (``n × copies`` with a crop). ``steps``:
        the per-step rewards ``(E, n, H)`` of both segments when a caller has them already
        (:meth:`RewardEnsemble.segment_rewards`); ``obs`` and ``act`` are then not read.
        """
        first, second = steps if steps is not None else (
            self.model.segment_rewards(obs[:, :, 0], act[:, :, 0]),
            self.model.segment_rewards(obs[:, :, 1], act[:, :, 1]))
        if self.crop is None:
            return first.sum(-1), second.sum(-1), labels
        return self.crop.returns(first, second, labels, self.rng)

    def train(self, dataset: PreferenceDataset, max_epochs: int,
              target_accuracy: float | None = None,
              rows: np.ndarray | None = None) -> RewardTrainStats:
        """Train for up to ``max_epochs`` epochs, stopping once train accuracy >
        ``target_accuracy`` (default :attr:`target_accuracy`; BPref) after more than
        :attr:`min_epochs` epochs (a method's stop rule), or after one epoch when every label is
        a tie (accuracy NaN: no order to fit).

        ``rows``: the dataset rows to train on (default: all).

        Raises:
            ValueError: the dataset is empty.
        """
        if len(dataset) == 0:
            raise ValueError("cannot train the reward model on an empty preference dataset")
        target = self.target_accuracy if target_accuracy is None else target_accuracy
        loss, acc, epochs = float("nan"), 0.0, 0
        val_rows = np.zeros(0, np.int64)
        if self.validation is not None:  # DRLHP: held-out labels, never trained on
            base = np.arange(len(dataset)) if rows is None else np.asarray(rows, np.int64)
            held = self.validation.held_out(len(dataset))[base]
            rows, val_rows = base[~held], base[held]
        labelled = len(dataset) if rows is None else len(rows)
        for method in self.methods:  # a method's own length of a round (the first one's)
            planned = method.round_epochs(labelled, max_epochs, self.batch_size)
            if planned is not None:
                max_epochs = planned
                break
        self.model.train()
        while epochs < max_epochs and (rows is None or len(rows)):
            loss, acc = self.train_epoch(dataset, rows)
            epochs += 1
            if self.l2 is not None and self.l2.adaptive and len(val_rows) and rows is not None:
                self.l2.adapt(self.member_losses(dataset, rows[-self.check_pairs:])[0],
                              self.member_losses(dataset, val_rows[-self.check_pairs:])[0])
                self.model.train()
            if np.isnan(acc) or (acc > target and epochs - 1 > self.min_epochs):
                break
        if epochs == 0:  # every label held out: nothing trained, nothing measured
            acc = float("nan")
        self.model.eval()  # queries, relabelling and the agent see the model in eval mode
        if self.validation is not None:
            val_loss, val_acc = self.member_losses(dataset, val_rows)
            self.validation_stats = {"val_labels": float(len(val_rows)),
                                     "val_loss": float(np.mean(val_loss)),
                                     "val_accuracy": val_acc}
        return RewardTrainStats(loss=loss, accuracy=acc, epochs=epochs)

    @torch.no_grad()
    def member_losses(self, dataset: PreferenceDataset,
                      rows: np.ndarray) -> tuple[np.ndarray, float]:
        """Each member's loss on the labelled pairs ``rows`` and the ensemble's accuracy (mean
        probability, strict labels only), in eval mode (no dropout, running batch-norm
        statistics); the model is left in eval mode.

        Returns:
            ``(E,)`` mean losses (NaN without rows) and the accuracy (NaN without a strict
            label).
        """
        ens = self.model.ensemble_size
        if len(rows) == 0:
            return np.full(ens, np.nan), float("nan")
        self.model.eval()
        obs, act, labels = dataset.tensors(self.model.device)
        horizon = obs.shape[2]
        pixels = observation_kind(self.model.obs_shape) == "pixels"
        step = max(1, self.chunk_images // horizon) if pixels and self.chunk_images \
            else self.batch_size
        total = torch.zeros(ens, device=obs.device)
        correct = counted = 0
        for lo in range(0, len(rows), step):
            idx = torch.as_tensor(rows[lo:lo + step], device=obs.device)
            o, a, y = obs[idx], act[idx], labels[idx]
            r1 = self.model.segment_returns(o[:, 0], a[:, 0])  # (E, b)
            r2 = self.model.segment_returns(o[:, 1], a[:, 1])
            total += bradley_terry_loss(r1, r2, y.expand(ens, -1), self.random_response) \
                * len(idx)
            strict = y != 0.5
            p = torch.sigmoid(r2 - r1).mean(0)
            correct += int((((p > 0.5) == (y > 0.5)) & strict).sum())
            counted += int(strict.sum())
        return (total / len(rows)).cpu().numpy(), correct / counted if counted else float("nan")

    def recipe_stats(self) -> dict[str, float]:
        """DRLHP's numbers for ``reward.csv``: validation labels, loss and accuracy
        (``reward_val_fraction``) and the mean L2 coefficient (``reward_l2``); empty when
        neither is on."""
        stats = dict(self.validation_stats)
        if self.l2 is not None:
            stats["reward_l2"] = float(np.mean(self.l2.coef))
        return stats

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
