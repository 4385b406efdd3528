"""SURF: semi-supervised reward learning with pseudo-labels and temporal cropping.

Park, Seo, Shin, Lee, Abbeel & Lee, "SURF: Semi-supervised Reward Learning with Data
Augmentation for Feedback-efficient Preference-based Reinforcement Learning", ICLR 2022;
official code alinlab/SURF ``reward_model_semi_dataaug.py`` (``semi_train_reward``,
``put_unlabeled_queries``) and ``config/train_PEBBLE_semi_dataaug.yaml``.

Each feedback round also draws ``inv_label_ratio`` × (queries asked) uniform, unlabelled
segment pairs from the same query pool and keeps them. Every reward-training step on a batch of
labelled pairs is joined by ``mu × B`` unlabelled pairs per ensemble member, ``B`` the training
batch size (``reward_train_batch``, 128), whatever the number of labels (all of them while
fewer are kept; drawn without replacement, as the official ``semi_train_reward`` walks a
permutation: ``u_last_index = u_start_index + train_batch_size * mu``); for each member (its own
labels, not the ensemble's): p = P[σ¹ ≻ σ⁰] = sigmoid(R¹ − R⁰) on the uncropped pair, and where
max(p, 1 − p) ≥ ``threshold_u`` the hard label 1[p > 0.5] is a pseudo-label. The loss adds
``lambda_u`` × mean over the unlabelled batch of the cross-entropy of the (cropped) pair with
its pseudo-label, masked (divided by the batch size, not by the number of confident pairs, as
the official code does). Label and loss come from one forward pass over the whole segments (the
official code's too): the pseudo-label from their sums, the loss from the cropped sums.

**Training length** (``train_PEBBLE_semi_dataaug.py`` ``learn_reward``): each round takes
``ceil(reward_update × labels / 128)`` training steps of ``reward_train_batch`` labelled pairs
(the labels walked in a permutation) and never stops early; B-Pref's 97 % stop is commented out
there. In Themis's epochs (one pass over the labels in batches of 128) that is
``ceil(steps / ceil(labels / 128))`` epochs: 79 at 10 labels and ``reward_update=1000`` (SURF's
walker_walk command), 782 at 100; on Meta-World ``reward_update=20`` (the hammer command,
``config/method_domain/surf/MetaWorld.yaml``): 2 steps at 10 labels, 63 at 400 (16 epochs
of 4 steps here: 64). ``surf.early_stop=true`` trains as B-Pref does instead (up to
``reward_update`` epochs, stopped at 97 % train accuracy: far fewer steps, what Themis did
before issue 41; docs/guide/methods/index.md, History).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from themis.agents.buffers import SegmentPairs
from themis.core.ranges import NON_NEGATIVE, POSITIVE, Range
from themis.core.run_keys import RunKeys
from themis.methods.base import Method, MethodContext
from themis.methods.crop import TemporalCrop
from themis.utils import ConfigError

if TYPE_CHECKING:
    from themis.reward.ensemble import RewardEnsemble

class Returns(Protocol):
    """The trainer's pair returns: ``(obs, act, labels, steps=(r⁰, r¹)) -> (R⁰, R¹, labels)``
    (crops included; ``steps``: per-step rewards already computed, :meth:`RewardTrainer.
    pair_returns`)."""

    def __call__(self, obs: torch.Tensor, act: torch.Tensor, labels: torch.Tensor,
                 steps: tuple[torch.Tensor, torch.Tensor] | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...



@dataclass
class SURFConfig:
    """``surf.*`` keys (``method=surf`` sets ``enabled``); defaults: the published runs
    (alinlab/SURF README, walker_walk: ``threshold_u`` 0.99, ``mu`` 4, ``inv_label_ratio``
    100; ``method=surf domain=MetaWorld``: ``inv_label_ratio`` 10 and ``reward_update=20``, as
    its hammer run)."""

    enabled: bool = False
    """Switch SURF on (``method=surf``)."""
    threshold_u: float = 0.99
    """Confidence max(p, 1 − p) an unlabelled pair needs to get a pseudo-label (τ)."""
    lambda_u: float = 1.0
    """Weight of the pseudo-label loss."""
    mu: int = 4
    """Unlabelled pairs per training step: ``mu × reward_train_batch`` for each member."""
    inv_label_ratio: int = 100
    """Unlabelled pairs drawn per query asked, each round (100 on DMC and MuJoCo, 10 on
    Meta-World)."""
    crop_range: int = 5
    """Temporal cropping: crop lengths in [segment − 2·crop_range, segment] (0: no cropping)."""
    early_stop: bool = False
    """Reward training as B-Pref's (up to ``reward_update`` epochs, stopped at 97 % train
    accuracy) instead of the official count, ``ceil(reward_update × labels / 128)`` steps a
    round with no early stop (module docstring)."""
    max_unlabelled: int = 100_000
    """Most unlabelled pairs kept (the oldest go first; the official code keeps 500k). Memory:
    about max_unlabelled × 2 × segment × (obs_dim + action_dim + 1) × 4 bytes once full
    (0.9 GB for HalfCheetah at segment 50)."""


class PseudoLabeler:
    """Keeps unlabelled segment pairs and gives the pseudo-label loss of a training batch.

    Args:
        cfg: the ``surf.*`` keys.
        segment, obs_dim, action_dim: shapes of the stored pairs (observations flattened).
        obs_dtype: float32, or uint8 for pixels.
    """

    def __init__(self, cfg: SURFConfig, segment: int, obs_dim: int, action_dim: int,
                 obs_dtype: np.dtype | type = np.float32) -> None:
        self.cfg = cfg
        cap = cfg.max_unlabelled
        self.observations = np.zeros((cap, 2, segment, obs_dim), dtype=obs_dtype)
        self.actions = np.zeros((cap, 2, segment, action_dim), dtype=np.float32)
        self.true_rewards = np.zeros((cap, 2, segment), dtype=np.float32)
        self.size, self.ptr = 0, 0
        self.used = 0  # confident pseudo-labels in the last batch
        self.agreement = float("nan")  # their agreement with the true returns (oracle)
        self._used_total = self._agree_total = 0

    def __len__(self) -> int:
        return self.size

    def stats(self) -> dict[str, float]:
        """``reward.csv`` columns: unlabelled pairs kept, pseudo-labels used in the last epoch
        and their agreement with the true returns."""
        return {"unlabelled": self.size, "pseudo_labels": self.used,
                "pseudo_agreement": self.agreement}

    def add(self, pairs: SegmentPairs) -> None:
        """Keep unlabelled pairs (a ring: the oldest are overwritten past ``max_unlabelled``)."""
        n, cap = len(pairs), len(self.observations)
        idx = (self.ptr + np.arange(n)) % cap
        self.observations[idx] = pairs.observations.reshape(n, *self.observations.shape[1:])
        self.actions[idx] = pairs.actions
        self.true_rewards[idx] = pairs.true_rewards
        self.ptr, self.size = int((self.ptr + n) % cap), min(cap, self.size + n)

    def state_dict(self) -> dict[str, object]:
        """The unlabelled pairs in ring order (oldest first) for checkpoints."""
        order = (self.ptr - self.size + np.arange(self.size)) % len(self.observations)
        return {"observations": self.observations[order], "actions": self.actions[order],
                "true_rewards": self.true_rewards[order]}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.size = self.ptr = 0
        n = len(state["observations"])
        self.add(SegmentPairs(state["observations"], state["actions"], state["true_rewards"],
                              np.zeros((n, 2), np.int64)))

    def start_epoch(self) -> None:
        self._used_total = self._agree_total = 0

    def end_epoch(self) -> None:
        """Statistics of the epoch: pseudo-labels used and their oracle agreement."""
        self.used = self._used_total
        self.agreement = self._agree_total / self._used_total if self._used_total else float(
            "nan")

    def loss(self, model: RewardEnsemble, train_batch: int, rng: np.random.Generator,
             returns: Returns) -> torch.Tensor | None:
        """The pseudo-label loss of one training step, or ``None`` without unlabelled pairs.

        Args:
            model: the reward ensemble (``segment_returns``, ``forward``).
            train_batch: the reward trainer's batch size ``B`` (``reward_train_batch``, not the
                number of labelled pairs in this batch): ``min(mu × B, kept)`` unlabelled pairs
                are drawn for each member, without replacement.
            returns: ``(obs (E, n, 2, H, d), act, labels (E, n)) -> (R¹, R², labels)`` of the
                trainer (cropping included) for the loss; the pseudo-labels themselves come
                from uncropped pairs.
        """
        if self.size == 0:
            return None
        ens, n = model.ensemble_size, min(self.cfg.mu * train_batch, self.size)
        idx = np.stack([rng.choice(self.size, n, replace=False) for _ in range(ens)])
        device = next(model.parameters()).device
        obs = torch.as_tensor(self.observations[idx], device=device)  # (E, n, 2, H, d)
        act = torch.as_tensor(self.actions[idx], device=device)
        steps = (model.segment_rewards(obs[:, :, 0], act[:, :, 0]),  # (E, n, H) each, one
                 model.segment_rewards(obs[:, :, 1], act[:, :, 1]))  # pass for label and loss
        with torch.no_grad():
            p = torch.sigmoid(steps[1].sum(-1) - steps[0].sum(-1))
            confident = torch.maximum(p, 1 - p) >= self.cfg.threshold_u
            pseudo = (p > 0.5).float()
        true = self.true_rewards[idx].sum(-1)  # (E, n, 2)
        oracle = torch.as_tensor(true[..., 1] > true[..., 0], device=device)
        strict = torch.as_tensor(true[..., 1] != true[..., 0], device=device)
        self._used_total += int(confident.sum())
        self._agree_total += int(((pseudo > 0.5) == oracle)[confident & strict].sum()
                                 + (confident & ~strict).sum())
        c0, c1, y = returns(obs, act, pseudo, steps=steps)
        copies = c0.shape[1] // n
        mask = confident.repeat_interleave(copies, dim=1).float() if copies > 1 \
            else confident.float()
        ce = F.binary_cross_entropy_with_logits(c1 - c0, y, reduction="none")
        return self.cfg.lambda_u * (ce * mask).mean(-1).sum()


class SURF(Method[SURFConfig]):
    """SURF as a method (module docstring): unlabelled pairs after each round's queries, a
    pseudo-label loss per training batch, one temporal crop of every pair."""

    name, title, published = "surf", "SURF", "2022-03"
    Config = SURFConfig
    RANGES: ClassVar[Mapping[str, Range]] = {
        "threshold_u": Range(0.5, 1), "lambda_u": NON_NEGATIVE, "mu": POSITIVE,
        "inv_label_ratio": POSITIVE, "crop_range": NON_NEGATIVE, "max_unlabelled": POSITIVE}

    def __init__(self, cfg: SURFConfig, context: MethodContext) -> None:
        super().__init__(cfg, context)
        self.unlabelled = PseudoLabeler(cfg, context.segment, context.obs_dim,
                                        context.action_dim, context.obs_dtype)
        self.augmentation = TemporalCrop(context.segment - 2 * cfg.crop_range,
                                         context.segment) if cfg.crop_range else None

    @classmethod
    def check(cls, run_cfg: RunKeys, agent: str | None, where: str) -> None:
        """Crops must leave segments of at least one step."""
        crop = cls.own_keys(run_cfg).crop_range
        if crop < 0 or 2 * crop >= run_cfg.segment:
            raise ConfigError(f"surf.crop_range={crop} must be >= 0 and leave segments of at "
                              f"least one step (segment={run_cfg.segment})")

    def stop_rule(self) -> tuple[float, int] | None:
        """No early stop (the official count of steps), unless ``surf.early_stop``."""
        return None if self.cfg.early_stop else (math.inf, 0)

    def round_epochs(self, labels: int, reward_update: int, batch_size: int) -> int | None:
        """``ceil(reward_update × labels / batch_size)`` training steps as epochs of
        ``ceil(labels / batch_size)`` steps (``train_PEBBLE_semi_dataaug.py``: ``num_iters``);
        ``None`` (up to ``reward_update``) with ``surf.early_stop``."""
        if self.cfg.early_stop or labels < 1:
            return None
        steps = math.ceil(reward_update * labels / batch_size)
        return max(1, math.ceil(steps / math.ceil(labels / batch_size)))

    def after_queries(self, pick: Callable[[int], Any], n: int) -> None:
        """``inv_label_ratio × n`` uniform unlabelled pairs from the query pool."""
        self.unlabelled.add(pick(n * self.cfg.inv_label_ratio))

    def start_epoch(self) -> None:
        self.unlabelled.start_epoch()

    def end_epoch(self) -> None:
        self.unlabelled.end_epoch()

    def batch_loss(self, model: Any, batch_size: int, rng: np.random.Generator,
                   pair_returns: Callable[..., tuple[torch.Tensor, ...]],
                   ) -> torch.Tensor | None:
        """The pseudo-label loss (:meth:`PseudoLabeler.loss`)."""
        return self.unlabelled.loss(model, batch_size, rng, pair_returns)  # type: ignore

    def stats(self) -> dict[str, float]:
        return self.unlabelled.stats()

    def state_dict(self) -> dict[str, Any]:
        return {"surf_unlabelled": self.unlabelled.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "surf_unlabelled" in state:
            self.unlabelled.load_state_dict(state["surf_unlabelled"])


__all__ = ["SURF", "PseudoLabeler", "SURFConfig"]
