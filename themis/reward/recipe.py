"""The reward model's recipe of Deep RL from Human Preferences (Christiano et al. 2017, Sec.
2.2.3 and App. A), as pieces :class:`themis.reward.RewardTrainer` uses when their keys are set:

- :class:`ValidationSplit`: a share of the labels held out of training (the paper: 1/e) to
  measure the validation loss and accuracy (``reward_val_fraction``);
- :class:`BootstrapCounts`: each member trained on its own bootstrap sample of the labels, "|D|
  triples sampled from D with replacement" (``reward_bootstrap``);
- :class:`AdaptiveL2`: an L2 coefficient per member, adjusted "to keep the validation loss between
  1.1 and 1.5 times the training loss" (``reward_adaptive_l2``, starting at ``reward_l2``);
- the 10 % random response of the preference model, ``P = 0.9 · softmax + 0.05``
  (``reward_random_response``), in :func:`themis.reward.trainer.bradley_terry_loss`.

Which row is held out, and how often a row is in a member's bootstrap sample, are fixed draws per
row (from blocks of rows seeded by the run's seed), so they do not change when the dataset grows
or a run resumes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from themis.agents.intrinsic import RunningMeanStd
from themis.agents.networks import EnsembleLinear
from themis.core.run_keys import RunKeys
from themis.utils import eval_mode

BLOCK = 1024
"""Rows per seeded block of draws."""


class _RowDraws:
    """Per-row draws from seeded blocks: row ``i``'s values depend on ``(seed, tag, i //
    BLOCK)`` only, not on how many rows were asked for before."""

    def __init__(self, seed: int, tag: int, draw: str, width: int = 1) -> None:
        self.seed, self.tag, self.draw, self.width = seed, tag, draw, width
        self.values = np.zeros((width, 0))

    def first(self, n: int) -> np.ndarray:
        """Draws of rows ``0 … n-1``, ``(width, n)``."""
        while self.values.shape[1] < n:
            block = self.values.shape[1] // BLOCK
            rng = np.random.default_rng([self.seed, self.tag, block])
            new = rng.random((BLOCK, self.width)) if self.draw == "uniform" else \
                rng.poisson(1.0, (BLOCK, self.width)).astype(np.float64)
            self.values = np.concatenate([self.values, new.T], axis=1)
        return self.values[:, :n]


class ValidationSplit:
    """Which labels are held out of training to validate the reward model.

    Args:
        fraction: share of labels held out (``reward_val_fraction``; DRLHP: 1/e ≈ 0.368).
        seed: the run's seed.

    Row ``i`` is held out when its uniform draw is below ``fraction``: about ``fraction`` of any
    number of labels, the same rows every time.
    """

    def __init__(self, fraction: float, seed: int) -> None:
        if not 0 <= fraction < 1:
            raise ValueError(f"a validation fraction must be in [0, 1), got {fraction}")
        self.fraction = fraction
        self._draws = _RowDraws(seed, 37, "uniform")

    def held_out(self, n: int) -> np.ndarray:
        """``(n,)`` bool: whether each of the first ``n`` rows is a validation label."""
        return self._draws.first(n)[0] < self.fraction


class BootstrapCounts:
    """How often each label is in each member's bootstrap sample: Poisson(1) counts per (row,
    member), the online form of drawing ``|D|`` labels from ``D`` with replacement (Oza & Russell
    2001); about 1/e of the labels are out of each member's sample.

    Args:
        ensemble_size: members ``E``.
        seed: the run's seed.
    """

    def __init__(self, ensemble_size: int, seed: int) -> None:
        self.ensemble_size = ensemble_size
        self._draws = _RowDraws(seed, 38, "poisson", ensemble_size)

    def counts(self, n: int) -> np.ndarray:
        """``(E, n)`` int64 counts of the first ``n`` rows."""
        return self._draws.first(n).astype(np.int64)

    def orders(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One epoch's visiting order per member, ``(E, len(rows))`` positions into ``rows``:
        each member's bootstrap sample (row ``i`` repeated ``count`` times) shuffled, cut to
        ``len(rows)`` or topped up with draws from itself (a sample of any size trains every
        member for the same number of steps). A member whose sample is empty draws uniformly.

        Args:
            rows: the dataset rows trained on (``(m,)`` ints).
            rng: the trainer's generator.
        """
        m = len(rows)
        counts = self.counts(int(rows.max()) + 1 if m else 0)[:, rows] if m else \
            np.zeros((self.ensemble_size, 0), np.int64)
        out = np.zeros((self.ensemble_size, m), np.int64)
        for e in range(self.ensemble_size):
            sample = np.repeat(np.arange(m), counts[e])
            if len(sample) == 0:
                sample = np.arange(m)
            order = rng.permutation(sample)
            if len(order) < m:
                order = np.concatenate([order, rng.choice(order, m - len(order))])
            out[e] = order[:m]
        return out


def member_weight_norms(model: nn.Module, ensemble_size: int) -> torch.Tensor:
    """Squared L2 norm of each member's weights (not biases, not batch-norm parameters),
    ``(E,)``: the batched layers' member slices and each member's own encoder.

    Args:
        model: a :class:`themis.reward.RewardEnsemble` (``net`` of :class:`EnsembleLinear`
            layers, optional ``encoders``, one per member).
        ensemble_size: ``E``.
    """
    device = next(model.parameters()).device
    norms = torch.zeros(ensemble_size, device=device)
    for module in model.modules():
        if isinstance(module, EnsembleLinear):
            norms = norms + module.weight.float().pow(2).sum((1, 2))
    encoders = getattr(model, "encoders", None)
    if encoders is not None:
        parts = []
        for encoder in encoders:
            total = torch.zeros((), device=device)
            for module in encoder.modules():
                if isinstance(module, nn.Conv2d | nn.Linear):
                    total = total + module.weight.float().pow(2).sum()
            parts.append(total)
        norms = norms + torch.stack(parts)
    return norms


class AdaptiveL2:
    """One L2 coefficient per member, adjusted so that the validation loss stays between
    ``low`` and ``high`` times the training loss (Christiano et al. 2017, Sec. 2.2.3: "We use l2
    regularization and adjust the regularization coefficient to keep the validation loss
    between 1.1 and 1.5 times the training loss").

    After each epoch :meth:`adapt` compares a member's validation loss with its training loss
    (both measured in eval mode): above ``high`` times it (over-fitting) the coefficient is
    multiplied by ``factor``, below ``low`` times it (under-fitting) divided by it; a
    coefficient of 0 that must grow starts at ``floor``.

    Args:
        ensemble_size: members ``E``.
        initial: the starting coefficient (``reward_l2``).
        adaptive: adjust it (``reward_adaptive_l2``); ``False``: a fixed coefficient.
        low, high: the band of the ratio validation / training loss (DRLHP: 1.1 and 1.5).
        factor: multiplicative step per epoch.
        floor: smallest coefficient that growing starts from.

    Attributes:
        pass_steps: minibatch steps of continuous training (``reward_schedule=passes``) counted
            over the whole run, across every call that trains (:meth:`count_pass_step`).
    """

    def __init__(self, ensemble_size: int, initial: float = 0.0, adaptive: bool = False,
                 low: float = 1.1, high: float = 1.5, factor: float = 1.5,
                 floor: float = 1e-6) -> None:
        if not 0 < low <= high or factor <= 1:
            raise ValueError(f"need 0 < low <= high and factor > 1, got {low}, {high}, {factor}")
        self.coef = np.full(ensemble_size, float(initial))
        self.adaptive, self.low, self.high = adaptive, low, high
        self.factor, self.floor = factor, floor
        self.pass_steps = 0

    def count_pass_step(self, every: int) -> bool:
        """Count one minibatch step of continuous training; ``True`` on every ``every``-th of
        the run (mrahtz's DRLHP validates every 50 steps of its training loop). The loops train
        in small calls (a PPO rollout's or a batch of agent steps' worth), so the count carries
        over from call to call, and over a resume (:meth:`state_dict`)."""
        self.pass_steps += 1
        return self.pass_steps % every == 0

    def penalty(self, norms: torch.Tensor) -> torch.Tensor:
        """``Σ_e λ_e ‖θ_e‖²`` for the members' squared weight norms ``(E,)``."""
        return (torch.as_tensor(self.coef, dtype=norms.dtype, device=norms.device) * norms).sum()

    def adapt(self, train_loss: np.ndarray, val_loss: np.ndarray) -> None:
        """Move each member's coefficient from its ``(E,)`` training and validation losses
        (NaN: that member's coefficient stays)."""
        if not self.adaptive:
            return
        for e, (train, val) in enumerate(zip(train_loss, val_loss, strict=True)):
            if not (np.isfinite(train) and np.isfinite(val)):
                continue
            if val > self.high * train:
                self.coef[e] = max(self.coef[e] * self.factor, self.floor)
            elif val < self.low * train:
                self.coef[e] = self.coef[e] / self.factor

    def state_dict(self) -> dict[str, object]:
        return {"coef": self.coef.copy(), "pass_steps": self.pass_steps}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.coef = np.asarray(state["coef"], dtype=np.float64).copy()
        self.pass_steps = int(state.get("pass_steps", 0))  # type: ignore[call-overload]


def trainer_kwargs(cfg: RunKeys) -> dict[str, Any]:
    """The :class:`themis.reward.RewardTrainer` arguments of a run's DRLHP keys
    (``reward_random_response``, ``reward_val_fraction``, ``reward_bootstrap``, ``reward_l2``,
    ``reward_adaptive_l2``); empty when none is set (the trainer as before)."""
    out: dict[str, Any] = {}
    if cfg.reward_random_response:
        out["random_response"] = float(cfg.reward_random_response)
    if cfg.reward_val_fraction:
        out["validation"] = ValidationSplit(float(cfg.reward_val_fraction), int(cfg.seed))
    if cfg.reward_bootstrap:
        out["bootstrap"] = BootstrapCounts(int(cfg.ensemble_size), int(cfg.seed))
    if cfg.reward_l2 or cfg.reward_adaptive_l2:
        out["l2"] = AdaptiveL2(int(cfg.ensemble_size), float(cfg.reward_l2),
                               adaptive=bool(cfg.reward_adaptive_l2))
    return out


class RewardNormaliser:
    """The policy's reward: each member's r̂ normalised to zero mean and standard deviation
    ``std``, then averaged over the members (Christiano et al. 2017, Sec. 2.2.3: "The estimate r̂
    is defined by independently normalizing each of these predictors and then averaging the
    results"; App. A: std 1 for MuJoCo, 0.05 for Atari).

    Two ways to hold the statistics: running (:meth:`__call__` merges every batch it sees, as
    mrahtz's reproduction does for its A2C rollouts; PPO) or fitted once (:meth:`fit` on the
    replay buffer, then frozen, so that every relabelled transition of PEBBLE's buffer shares
    one affine map). :meth:`reset` forgets them (the reward model changed).

    Args:
        ensemble_size: members ``E``.
        std: the standard deviation the policy's reward gets (``reward_norm_std``).
    """

    def __init__(self, ensemble_size: int, std: float) -> None:
        if std <= 0:
            raise ValueError(f"the normalised reward's std must be > 0, got {std}")
        self.ensemble_size, self.std = ensemble_size, std
        self.reset()

    def reset(self) -> None:
        """Forget the statistics (running again)."""
        self.stats = RunningMeanStd((self.ensemble_size,))
        self.frozen = False

    def fit(self, members: np.ndarray) -> None:
        """Statistics of ``(E, n)`` member rewards, then frozen until :meth:`reset`."""
        self.reset()
        self.stats.update(np.asarray(members).T)
        self.frozen = True

    def fit_store(self, model: Any, store: Any, most: int = 10_000) -> None:
        """:meth:`fit` on the member rewards of up to ``most`` transitions of ``store`` (evenly
        spaced over it; only readable slots where the store says which are), so every label of
        PEBBLE's relabelled buffer shares one normalisation until the model changes; nothing
        for an empty store.

        Args:
            model: a :class:`themis.reward.RewardEnsemble` (``predict_members``).
            store: a replay buffer or episode store (``observations(idx)``, ``actions``).
        """
        if len(store) == 0:
            return
        idx = np.unique(np.linspace(0, len(store) - 1, min(len(store), most)).astype(np.int64))
        if hasattr(store, "readable"):
            idx = idx[store.readable(idx)]
        with eval_mode(model):
            members = model.predict_members(store.observations(idx).reshape(len(idx), -1),
                                            store.actions[idx])
        self.fit(members)

    def __call__(self, members: np.ndarray) -> np.ndarray:
        """``(E, n)`` member rewards -> ``(E, n)`` float32 normalised ones (the statistics
        updated first unless frozen)."""
        if not self.frozen:
            self.stats.update(np.asarray(members).T)
        mean, scale = self.stats.mean[:, None], self.stats.std[:, None] + 1e-8
        return ((members - mean) / scale * self.std).astype(np.float32)

    def state_dict(self) -> dict[str, object]:
        return {**self.stats.state_dict(), "frozen": self.frozen}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.stats.load_state_dict(state)
        self.frozen = bool(state.get("frozen", False))
