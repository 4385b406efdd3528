"""Bradley–Terry training of the reward ensemble (Christiano et al. 2017, Eq. 1; PEBBLE Eq. 4).

P[σ¹ ≻ σ⁰] = exp Σ r̂(s¹_t, a¹_t) / (exp Σ r̂(s⁰_t, a⁰_t) + exp Σ r̂(s¹_t, a¹_t)) = sigmoid(R¹ − R⁰),
and the loss is the cross-entropy between this probability and the label y ∈ {0, 0.5, 1}
(y = 1: segment 2 preferred; 0.5 gives the soft target BPref uses for "equally preferred").

DRLHP's recipe (Sec. 2.2.3, App. A; :mod:`themis.reward.recipe`), each off by default: the
random-response model P = (1 − ε) · sigmoid(R¹ − R⁰) + ε / 2 (ε = 0.1), a held-out validation
split, a bootstrap sample per member and an L2 coefficient adapted to the validation loss.
"""

from __future__ import annotations

import math
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


OOB_PAIRS = 512
"""Newest trained pairs whose out-of-bag labels validate each member (``reward_bootstrap``
without a shared hold-out), after every training call."""


def newest_mean(values: np.ndarray, mask: np.ndarray, most: int) -> np.ndarray:
    """Per row of ``(E, m)`` ``values``, the mean over the last ``most`` entries where
    ``mask`` is true (NaN where none): ``(E,)``."""
    out = np.full(len(values), np.nan)
    for e in range(len(values)):
        chosen = values[e][mask[e]][-most:]
        if len(chosen):
            out[e] = chosen.mean()
    return out


@dataclass
class RewardTrainStats:
    """Outcome of one call of :meth:`RewardTrainer.train` (``epochs``: passes begun over the
    labels; ``steps``: gradient steps taken)."""

    loss: float
    accuracy: float
    epochs: int
    steps: int = 0


@dataclass
class StepBudget:
    """A round counted in gradient steps (a method's ``round_steps``): the steps left and the
    predictions of the round so far, which stop it once ``correct / counted`` reaches
    ``stop_accuracy`` (the rule a method's official ``reward_model.py`` follows: the method's
    module names it)."""

    left: int
    stop_accuracy: float
    correct: float = 0.0
    counted: float = 0.0

    def reached(self, correct: float, counted: float) -> bool:
        """Whether the round's accuracy, with ``correct`` of ``counted`` more predictions,
        reaches :attr:`stop_accuracy`."""
        total = self.counted + counted
        return total > 0 and (self.correct + correct) / total >= self.stop_accuracy


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
        bootstrap: each member's epochs visit its own bootstrap sample (``reward_bootstrap``);
            without ``validation`` each member is validated on its out-of-bag labels (the
            paper's 1/e per predictor; ``val_loss_m<e>`` in :attr:`validation_stats`).
        l2: L2 coefficients per member (``reward_l2``), adapted after each epoch to the
            validation loss when ``reward_adaptive_l2`` (needs ``validation`` or
            ``bootstrap``).
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
        if l2 is not None and l2.adaptive and validation is None and bootstrap is None:
            raise ValueError("an adaptive L2 coefficient needs held-out labels (validation, or "
                             "each member's out-of-bag labels with bootstrap)")
        self.model = model
        self.random_response, self.validation = random_response, validation
        self.bootstrap, self.l2, self.check_pairs = bootstrap, l2, check_pairs
        self.validation_stats: dict[str, float] = {} if validation is None and \
            bootstrap is None else dict.fromkeys(("val_labels", "val_loss", "val_accuracy"),
                                                 float("nan"))
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
        self.steps_taken = 0
        self._encoded: tuple[PreferenceDataset, torch.Tensor] | None = None  # see inputs
        """Gradient steps taken by this trainer so far (every :meth:`train_epoch`)."""

    def train_epoch(self, dataset: PreferenceDataset, rows: np.ndarray | None = None,
                    budget: StepBudget | None = None) -> tuple[float, float]:
        """One pass over the dataset; returns (mean loss, mean accuracy) over members.

        Accuracy counts pairs with a strict preference whose predicted order matches the label;
        NaN when every label is a tie (nothing was measured, so nothing reads as success).
        With ``budget`` the pass ends early once its steps are spent or the round's
        accumulated accuracy reaches its stop (the budget is updated; loss and accuracy are
        then those of the batches taken).
        """
        obs, act, labels, encoded = self.inputs(dataset)
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
        sums = torch.zeros(3, device=obs.device)  # loss × pairs, correct, counted
        seen = 0  # pairs of the batches taken
        for lo in range(0, n, self.batch_size):
            if budget is not None and budget.left <= 0:
                break
            batch = perms[:, lo:lo + self.batch_size]  # (E, b)
            seen += batch.shape[1]
            self.minibatch_step(obs, act, labels, picked, batch, sums, encoded)
            if budget is not None:  # a method's rule: the round's accuracy after every step
                budget.left -= 1
                if budget.reached(sums[1].item(), sums[2].item()):
                    budget.left = 0
        for method in self.methods:
            method.end_epoch()
        total_loss, correct, counted = sums.tolist()
        if budget is not None:
            budget.correct += correct
            budget.counted += counted
        accuracy = correct / counted if counted else float("nan")
        return total_loss / (max(seen, 1) * ens), accuracy

    def minibatch_step(self, obs: torch.Tensor, act: torch.Tensor, labels: torch.Tensor,
                       picked: torch.Tensor | None, batch: torch.Tensor,
                       sums: torch.Tensor, encoded: bool = False) -> None:
        """One Adam step of every member on its own minibatch.

        Args:
            obs, act: the dataset's tensors, ``(N, 2, H, obs_dim)`` and ``(N, 2, H, a)``
                (``encoded``: the fixed encoder's features in place of ``obs_dim``,
                :meth:`inputs`).
            labels: ``(n,)`` the labels trained on (rows ``picked`` of the dataset, or all).
            picked: ``(n,)`` dataset rows of ``labels`` (``None``: row ``i`` is label ``i``).
            batch: ``(E, b)`` positions into ``labels``, one row per member.
            sums: ``(3,)`` accumulators, added to in place: loss × pairs, correctly ordered
                strict labels, strict labels (kept on the device: no host sync per step).
        """
        ens = self.model.ensemble_size
        step = self.pairs_per_pass(obs.shape[2], encoded)
        self.optimizer.zero_grad(set_to_none=True)
        for c in range(0, batch.shape[1], step):  # gradients add up to the batch's
            idx = batch[:, c:c + step]
            rows_idx = idx if picked is None else picked[idx]
            o, a, y = obs[rows_idx], act[rows_idx], labels[idx]  # (E, b', 2, H, d), (E, b')
            r1, r2, y = self.pair_returns(o, a, y, encoded=encoded)
            loss = bradley_terry_loss(r1, r2, y, self.random_response).sum() * (
                idx.shape[1] / batch.shape[1])
            loss.backward()
            with torch.no_grad():
                strict = y != 0.5
                sums[0] += loss.detach() * batch.shape[1]
                sums[1] += (((r2 > r1) == (y > 0.5)) & strict).sum()
                sums[2] += strict.sum()
        if self.l2 is not None and self.l2.coef.any():  # DRLHP: Σ_e λ_e ‖θ_e‖²
            self.l2.penalty(member_weight_norms(self.model, ens)).backward()
        for method in self.methods:  # e.g. pseudo-labelled unlabelled pairs
            extra = method.batch_loss(self.model, self.batch_size, self.rng,
                                      self.pair_returns)
            if extra is not None:
                extra.backward()
        self.optimizer.step()
        self.steps_taken += 1

    def inputs(self, dataset: PreferenceDataset,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """The dataset's observations, actions and labels on the model's device, and whether
        the observations are encoded: with a parameter-free encoder
        (:attr:`RewardEnsemble.fixed_encoder`, ``reward_net=drlhp_dot``) and no method hooks,
        each labelled frame is encoded once and kept (``(N, 2, H, F)``; new labels are
        encoded as they arrive), so training gathers a few features per frame instead of the
        whole frame stack."""
        obs, act, labels = dataset.tensors(self.model.device)
        if not getattr(self.model, "fixed_encoder", False) or self.methods:  # any ensemble
            return obs, act, labels, False
        cached = self._encoded
        if cached is None or cached[0] is not dataset or len(cached[1]) > len(obs):
            cached = (dataset, self.model.encode(obs[:0]))
        if len(cached[1]) < len(obs):
            cached = (dataset, torch.cat([cached[1], self.model.encode(obs[len(cached[1]):])]))
        self._encoded = cached
        return cached[1], act, labels, True

    def segment_rewards(self, obs: torch.Tensor, act: torch.Tensor,
                        encoded: bool = False) -> torch.Tensor:
        """The model's per-step rewards of segments (:meth:`RewardEnsemble.segment_rewards`),
        ``encoded`` passed only when set (any model with ``segment_rewards(obs, act)`` trains
        here)."""
        if encoded:
            return self.model.segment_rewards(obs, act, encoded=True)
        return self.model.segment_rewards(obs, act)

    def pairs_per_pass(self, horizon: int, encoded: bool = False) -> int:
        """Pairs per forward pass: :attr:`chunk_images` // ``horizon`` for pixels (frame stacks
        are large), the whole minibatch otherwise (vectors, encoded features)."""
        pixels = observation_kind(self.model.obs_shape) == "pixels" and not encoded
        return max(1, self.chunk_images // horizon) if pixels and self.chunk_images \
            else self.batch_size

    def pair_returns(self, obs: torch.Tensor, act: torch.Tensor, labels: torch.Tensor,
                     steps: tuple[torch.Tensor, torch.Tensor] | None = None,
                     encoded: bool = False,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Predicted returns of both segments of member-specific pairs, cropped with
        :attr:`crop` (then tiled ``copies`` times, labels too).

        Shapes: ``obs (E, n, 2, H, d)``, ``act (E, n, 2, H, a)``, ``labels (E, n)`` ->
        ``(E, m)`` twice and ``(E, m)``, ``m = n`` (``n × copies`` with a crop). ``steps``:
        the per-step rewards ``(E, n, H)`` of both segments when a caller has them already
        (:meth:`RewardEnsemble.segment_rewards`); ``obs`` and ``act`` are then not read.
        ``encoded``: ``obs`` holds the fixed encoder's features (:meth:`inputs`).
        """
        first, second = steps if steps is not None else (
            self.segment_rewards(obs[:, :, 0], act[:, :, 0], encoded),
            self.segment_rewards(obs[:, :, 1], act[:, :, 1], encoded))
        if self.crop is None:
            return first.sum(-1), second.sum(-1), labels
        return self.crop.returns(first, second, labels, self.rng)

    def train(self, dataset: PreferenceDataset, max_epochs: int,
              target_accuracy: float | None = None,
              rows: np.ndarray | None = None) -> RewardTrainStats:
        """Train for up to ``max_epochs`` epochs, stopping once train accuracy >
        ``target_accuracy`` (default :attr:`target_accuracy`; BPref) after more than
        :attr:`min_epochs` epochs (a method's stop rule), or after one epoch when every label is
        a tie (accuracy NaN: no order to fit). ``target_accuracy > 1``: every epoch is run
        (DRLHP's pretraining, :class:`themis.reward.schedule.LabelPassSchedule`). A method's
        ``round_epochs`` sets the epochs; its ``round_steps`` counts the round in gradient
        steps instead, stopped only by the accuracy accumulated over them (:class:`StepBudget`).

        ``rows``: the dataset rows to train on (default: all).

        Raises:
            ValueError: the dataset is empty.
        """
        if len(dataset) == 0:
            raise ValueError("cannot train the reward model on an empty preference dataset")
        target = self.target_accuracy if target_accuracy is None else target_accuracy
        loss, acc, epochs = float("nan"), 0.0, 0
        rows, val_rows = self.split(dataset, rows)
        labelled = len(dataset) if rows is None else len(rows)
        budget = None
        for method in self.methods:  # a method's own length of a round (the first one's)
            in_steps = method.round_steps(labelled, max_epochs, self.batch_size)
            if in_steps is not None:  # gradient steps, stopped on the round's accuracy only
                budget = StepBudget(int(in_steps[0]), float(in_steps[1]))
                max_epochs, target = budget.left, math.inf  # every pass takes a step or more
                break
            planned = method.round_epochs(labelled, max_epochs, self.batch_size)
            if planned is not None:
                max_epochs = planned
                break
        first_step = self.steps_taken
        self.model.train()
        while epochs < max_epochs and (rows is None or len(rows)):
            loss, acc = self.train_epoch(dataset, rows, budget)
            epochs += 1
            self.adapt_l2(dataset, rows, val_rows)
            if np.isnan(acc) or (acc > target and epochs - 1 > self.min_epochs) or (
                    budget is not None and budget.left <= 0):
                break
        if epochs == 0:  # every label held out: nothing trained, nothing measured
            acc = float("nan")
        self.model.eval()  # queries, relabelling and the agent see the model in eval mode
        self.measure_validation(dataset, rows, val_rows)
        return RewardTrainStats(loss=loss, accuracy=acc, epochs=epochs,
                                steps=self.steps_taken - first_step)

    def split(self, dataset: PreferenceDataset, rows: np.ndarray | None,
              ) -> tuple[np.ndarray | None, np.ndarray]:
        """The rows to train on and the shared validation rows (``reward_val_fraction``; empty
        without it): ``rows`` (``None``: all) less the held-out ones."""
        if self.validation is None:
            return rows, np.zeros(0, np.int64)
        base = np.arange(len(dataset)) if rows is None else np.asarray(rows, np.int64)
        held = self.validation.held_out(len(dataset))[base]
        return base[~held], base[held]

    def adapt_l2(self, dataset: PreferenceDataset, rows: np.ndarray | None,
                 val_rows: np.ndarray) -> None:
        """DRLHP's adaptive L2 after an epoch (or a stretch of label-passes): each member's loss
        on its newest :attr:`check_pairs` validation labels against its newest training ones,
        both in eval mode — the shared hold-out, or with ``reward_bootstrap`` alone each
        member's out-of-bag labels (the 1/e of the labels its sample left out, as the paper's
        "a fraction of 1/e of the data is held out to be used as a validation set" for each
        predictor). Nothing without an adaptive L2 or validation labels."""
        if self.l2 is None or not self.l2.adaptive:
            return
        if len(val_rows):
            train_rows = np.arange(len(dataset)) if rows is None else rows
            self.l2.adapt(self.member_losses(dataset, train_rows[-self.check_pairs:])[0],
                          self.member_losses(dataset, val_rows[-self.check_pairs:])[0])
        elif self.bootstrap is not None:
            train_rows = np.arange(len(dataset)) if rows is None else rows
            recent = train_rows[-4 * self.check_pairs:]
            in_bag = self.bootstrap.counts(len(dataset))[:, recent] > 0  # (E, m)
            losses = self.pair_losses(dataset, recent)  # (E, m)
            self.l2.adapt(newest_mean(losses, in_bag, self.check_pairs),
                          newest_mean(losses, ~in_bag, self.check_pairs))
        else:
            return
        self.model.train()

    def measure_validation(self, dataset: PreferenceDataset, rows: np.ndarray | None,
                           val_rows: np.ndarray) -> None:
        """:attr:`validation_stats` after training: the shared hold-out's loss and ensemble
        accuracy; with ``reward_bootstrap`` (and no shared hold-out) each member's loss and
        accuracy on its out-of-bag labels among the newest :data:`OOB_PAIRS` trained on
        (``val_loss_m0`` … per member, their mean as ``val_loss``)."""
        if self.validation is not None:
            val_loss, val_acc = self.member_losses(dataset, val_rows)
            self.validation_stats = {"val_labels": float(len(val_rows)),
                                     "val_loss": float(np.mean(val_loss)),
                                     "val_accuracy": val_acc}
        elif self.bootstrap is not None:
            self.validation_stats = self.out_of_bag(
                dataset, np.arange(len(dataset)) if rows is None else rows)

    def out_of_bag(self, dataset: PreferenceDataset, rows: np.ndarray) -> dict[str, float]:
        """Each member's mean loss and accuracy on its out-of-bag labels among the newest
        :data:`OOB_PAIRS` of ``rows`` (``val_labels``: their mean count)."""
        recent = np.asarray(rows, np.int64)[-OOB_PAIRS:]
        ens = self.model.ensemble_size
        if len(recent) == 0:
            return {"val_labels": 0.0, "val_loss": float("nan"), "val_accuracy": float("nan"),
                    **{f"val_loss_m{e}": float("nan") for e in range(ens)}}
        out_bag = self.bootstrap.counts(len(dataset))[:, recent] == 0  # type: ignore[union-attr]
        losses, right, strict = self.pair_losses(dataset, recent, with_accuracy=True)
        per_member = [float(losses[e, out_bag[e]].mean()) if out_bag[e].any() else float("nan")
                      for e in range(ens)]
        scored = out_bag & strict[None]
        accuracy = float(right[scored].mean()) if scored.any() else float("nan")
        return {"val_labels": float(out_bag.sum(1).mean()),
                "val_loss": float(np.nanmean(per_member)) if np.isfinite(per_member).any()
                else float("nan"), "val_accuracy": accuracy,
                **{f"val_loss_m{e}": v for e, v in enumerate(per_member)}}

    @torch.no_grad()
    def pair_losses(self, dataset: PreferenceDataset, rows: np.ndarray,
                    with_accuracy: bool = False) -> Any:
        """Every member's loss on each labelled pair ``rows``, ``(E, m)``, in eval mode (the
        model is left in eval mode); ``with_accuracy``: also ``(E, m)`` whether each member
        orders the pair as its label, and ``(m,)`` whether the label is strict."""
        self.model.eval()
        obs, act, labels, encoded = self.inputs(dataset)
        step = self.pairs_per_pass(obs.shape[2], encoded)
        losses, right = [], []
        for lo in range(0, len(rows), step):
            idx = torch.as_tensor(rows[lo:lo + step], device=obs.device)
            o, a, y = obs[idx], act[idx], labels[idx]
            r1 = self.segment_rewards(o[:, 0], a[:, 0], encoded).sum(-1)  # (E, b)
            r2 = self.segment_rewards(o[:, 1], a[:, 1], encoded).sum(-1)
            ys = y.expand(self.model.ensemble_size, -1)
            losses.append(bradley_terry_loss(r1[..., None], r2[..., None], ys[..., None],
                                             self.random_response))
            right.append((r2 > r1) == (ys > 0.5))
        loss = torch.cat(losses, 1).float().cpu().numpy()
        if not with_accuracy:
            return loss
        strict = labels[torch.as_tensor(rows, device=obs.device)].cpu().numpy() != 0.5
        return loss, torch.cat(right, 1).cpu().numpy(), strict

    def train_passes(self, dataset: PreferenceDataset, steps: int, rows: np.ndarray,
                     adapt_every: int = 50) -> RewardTrainStats:
        """``steps`` minibatch steps over the labelled pairs ``rows`` (DRLHP's continuous
        training, :class:`themis.reward.schedule.LabelPassSchedule`): each member's minibatch
        of :attr:`batch_size` pairs is drawn from ``rows`` — with ``reward_bootstrap`` from its
        own bootstrap sample (probability ∝ the pair's count, so its out-of-bag pairs never),
        else uniformly — with replacement across steps, as mrahtz's shuffled passes over the
        buffer. The adaptive L2 is adapted every ``adapt_every`` steps of the run (mrahtz
        validates every 50), counted across calls (:meth:`AdaptiveL2.count_pass_step`): the
        loops call this with a few steps at a time. ``epochs`` of the result counts the steps.

        Raises:
            ValueError: no rows to train on.
        """
        trained, val_rows = self.split(dataset, np.asarray(rows, np.int64))
        rows = np.arange(len(dataset)) if trained is None else trained
        if len(rows) == 0:
            raise ValueError("cannot train the reward model without labelled pairs")
        obs, act, labels, encoded = self.inputs(dataset)
        picked = torch.as_tensor(rows, device=obs.device)
        labels = labels[picked]
        ens, b = self.model.ensemble_size, self.batch_size
        weights = None
        if self.bootstrap is not None:
            counts = self.bootstrap.counts(len(dataset))[:, rows].astype(np.float64)
            weights = [c / c.sum() if c.sum() > 0 else None for c in counts]
        self.model.train()
        sums = torch.zeros(3, device=obs.device)
        for _ in range(steps):
            batch = np.stack([  # a bootstrap sample: with replacement, by its counts
                self.rng.choice(len(rows), size=b, replace=len(rows) < b, p=None)
                if weights is None or weights[e] is None else
                self.rng.choice(len(rows), size=b, p=weights[e]) for e in range(ens)])
            self.minibatch_step(obs, act, labels, picked,
                                torch.as_tensor(batch, device=obs.device), sums, encoded)
            if self.l2 is not None and self.l2.count_pass_step(adapt_every):
                self.adapt_l2(dataset, rows, val_rows)
        self.model.eval()
        total_loss, correct, counted = sums.tolist()
        return RewardTrainStats(loss=total_loss / max(1, steps * b * ens),
                                accuracy=correct / counted if counted else float("nan"),
                                epochs=steps)

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
        obs, act, labels, encoded = self.inputs(dataset)
        step = self.pairs_per_pass(obs.shape[2], encoded)
        total = torch.zeros(ens, device=obs.device)
        correct = counted = 0
        for lo in range(0, len(rows), step):
            idx = torch.as_tensor(rows[lo:lo + step], device=obs.device)
            o, a, y = obs[idx], act[idx], labels[idx]
            r1 = self.segment_rewards(o[:, 0], a[:, 0], encoded).sum(-1)  # (E, b)
            r2 = self.segment_rewards(o[:, 1], a[:, 1], encoded).sum(-1)
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
