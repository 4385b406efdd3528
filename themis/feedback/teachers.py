"""Synthetic teachers that answer preference queries (B-Pref, Lee et al. 2021, Sec. 3.1).

A teacher looks at the true rewards of two segments and says which is better. B-Pref's
"scripted teachers" model human irrationality with five knobs; the oracle teacher is the one with
all of them off (beta = -1, gamma = 1, every eps = 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from themis.reward.preference_models import rating_logits


@dataclass(frozen=True)
class TeacherPreset:
    """A named B-Pref teacher (its config-group file holds the same values)."""

    beta: float = -1.0
    gamma: float = 1.0
    eps_mistake: float = 0.0
    eps_skip: float = 0.0
    eps_equal: float = 0.0


PRESETS: Mapping[str, TeacherPreset] = {
    "oracle": TeacherPreset(),
    "mistake": TeacherPreset(eps_mistake=0.1),
    "noisy": TeacherPreset(beta=1.0),
    "skip": TeacherPreset(eps_skip=0.1),
    "myopic": TeacherPreset(gamma=0.9),
    "equal": TeacherPreset(eps_equal=0.1),
}


def validate_teacher_params(beta: float, gamma: float, eps_mistake: float, eps_skip: float,
                            eps_equal: float) -> None:
    """Check B-Pref teacher parameters.

    Raises:
        ValueError: an eps outside [0, 1], gamma outside (0, 1], or beta equal to 0 or < -1
            (beta must be -1 for a rational teacher or > 0 for Bradley–Terry rationality).
    """
    for name, eps in (("teacher_eps_mistake", eps_mistake), ("teacher_eps_skip", eps_skip),
                      ("teacher_eps_equal", eps_equal)):
        if not 0.0 <= eps <= 1.0:
            raise ValueError(f"{name}={eps} is outside [0, 1]")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"teacher_gamma={gamma} is outside (0, 1]")
    if not (beta == -1 or beta > 0):
        raise ValueError(f"teacher_beta={beta}: use -1 (perfectly rational) or a value > 0")


class SyntheticTeacher:
    """B-Pref's scripted teacher.

    Given true per-step rewards of segment 1 and 2 it:

    1. skips the pair when neither (undiscounted) return exceeds ``eps_skip * margin`` (only
       while that threshold is positive, as B-Pref);
    2. weights step ``t`` of an ``H``-step segment by ``gamma^(H-1-t)`` (myopia);
    3. answers 1.0 (segment 2 preferred) with probability sigmoid(beta (R₂ − R₁)) for
       ``beta > 0`` (Bradley–Terry), or deterministically by the larger return for ``beta = -1``;
    4. flips a non-equal answer with probability ``eps_mistake``;
    5. answers 0.5 when the returns differ by less than ``eps_equal * margin``.

    ``margin`` (:meth:`set_margin`) is the mean true return of recent episodes scaled to one
    segment. B-Pref's train_PEBBLE.py multiplies the thresholds by eps twice after the first
    round (``eps² * margin``); Themis uses ``eps * margin`` throughout unless
    :attr:`threshold_power` is set to 2 (``teacher_thres_schedule=bpref``).

    Args:
        beta: rationality (-1 = perfectly rational).
        gamma: myopia discount in (0, 1].
        eps_mistake, eps_skip, eps_equal: probabilities / fractions in [0, 1].
        rng: random generator (a fresh default one if omitted).

    Raises:
        ValueError: parameters out of range (see :func:`validate_teacher_params`).
    """

    def __init__(self, beta: float = -1, gamma: float = 1, eps_mistake: float = 0,
                 eps_skip: float = 0, eps_equal: float = 0,
                 rng: np.random.Generator | None = None) -> None:
        validate_teacher_params(beta, gamma, eps_mistake, eps_skip, eps_equal)
        self.beta = float(beta)
        self.gamma = float(gamma)
        self.eps_mistake = float(eps_mistake)
        self.eps_skip = float(eps_skip)
        self.eps_equal = float(eps_equal)
        self.rng = rng if rng is not None else np.random.default_rng()
        self.margin = 0.0
        self.threshold_power = 1  # thresholds eps ** power * margin (2: B-Pref's later rounds)

    @classmethod
    def from_preset(cls, name: str, rng: np.random.Generator | None = None) -> SyntheticTeacher:
        """Build one of :data:`PRESETS` by name.

        Raises:
            ValueError: unknown preset name.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown teacher preset {name!r}; choose from {sorted(PRESETS)}")
        p = PRESETS[name]
        return cls(p.beta, p.gamma, p.eps_mistake, p.eps_skip, p.eps_equal, rng=rng)

    def set_margin(self, margin: float) -> None:
        """Set the return scale the skip and equal thresholds are fractions of."""
        self.margin = float(margin)

    def returns(self, rewards: np.ndarray) -> np.ndarray:
        """Discounted returns ``(n, H) -> (n,)`` (step t weighted ``gamma^(H-1-t)``, myopia)."""
        r = np.asarray(rewards, dtype=np.float64)
        return r @ (self.gamma ** np.arange(r.shape[-1] - 1, -1, -1, dtype=np.float64))

    def label(self, rewards_1: np.ndarray, rewards_2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Answer a batch of queries.

        Args:
            rewards_1, rewards_2: true per-step rewards, shape ``(batch, segment)``.

        Returns:
            ``(keep, labels)``: ``keep (batch,)`` bool, False where the pair is skipped;
            ``labels (n_kept,)`` float32 in {0.0, 0.5, 1.0} for the kept pairs (1.0 = segment 2
            preferred).
        """
        r1 = np.asarray(rewards_1, dtype=np.float64)
        r2 = np.asarray(rewards_2, dtype=np.float64)
        if r1.shape != r2.shape or r1.ndim != 2:
            raise ValueError(f"rewards must both be (batch, segment), got {r1.shape}, {r2.shape}")
        sum1, sum2 = r1.sum(1), r2.sum(1)
        skip_threshold = self.eps_skip ** self.threshold_power * self.margin
        # B-Pref skips only while the threshold is positive: with a margin <= 0 (negative
        # returns, e.g. Pendulum or early HalfCheetah) every pair would be skipped
        keep = np.maximum(sum1, sum2) > skip_threshold if skip_threshold > 0 \
            else np.ones(len(r1), dtype=bool)
        r1, r2, sum1, sum2 = r1[keep], r2[keep], sum1[keep], sum2[keep]

        ret1, ret2 = self.returns(r1), self.returns(r2)
        if self.beta > 0:
            p2 = 1.0 / (1.0 + np.exp(-self.beta * (ret2 - ret1)))
            labels = (self.rng.random(len(p2)) < p2).astype(np.float32)
        else:
            labels = np.where(ret2 > ret1, 1.0, np.where(ret1 > ret2, 0.0, 0.5)).astype(np.float32)

        if self.eps_mistake > 0:
            flip = (self.rng.random(len(labels)) < self.eps_mistake) & (labels != 0.5)
            labels[flip] = 1.0 - labels[flip]
        if self.eps_equal > 0:
            equal_threshold = self.eps_equal ** self.threshold_power * self.margin
            labels[np.abs(sum1 - sum2) < equal_threshold] = 0.5
        return keep, labels


class SyntheticRatingTeacher(SyntheticTeacher):
    """A scripted teacher for rating feedback: puts one segment into one of ``classes`` ordered
    classes (0 = worst) by where its return falls among the returns of the segments rated so
    far and the ones rated now: class boundaries are their quantiles ``1/n … (n−1)/n``, so
    the classes are used about equally often, as a person who spreads ratings would.

    B-Pref's knobs where they make sense for one segment: ``gamma`` discounts the return as in
    :class:`SyntheticTeacher`; ``eps_skip`` skips a segment whose undiscounted return is below
    ``eps_skip × margin`` (while that threshold is positive); ``beta > 0`` draws the class from
    the rating model of :mod:`themis.reward.rating` with ``k = beta`` on the min–max normalised
    return (``beta = -1``: the class of the return); ``eps_mistake`` replaces the class by a
    uniformly random other one. ``eps_equal`` has no meaning for one segment (refused by the
    config check).

    Args:
        classes: rating classes ``n`` (≥ 2).
        beta, gamma, eps_mistake, eps_skip: as :class:`SyntheticTeacher`.
        rng: random generator.

    Raises:
        ValueError: ``classes`` < 2, or parameters out of range.
    """

    def __init__(self, classes: int, beta: float = -1, gamma: float = 1, eps_mistake: float = 0,
                 eps_skip: float = 0, rng: np.random.Generator | None = None) -> None:
        super().__init__(beta, gamma, eps_mistake, eps_skip, 0.0, rng)
        if classes < 2:
            raise ValueError(f"rating_classes={classes} must be at least 2")
        self.classes = int(classes)

    def rate(self, rewards: np.ndarray,
             rated: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rate a batch of segments.

        Args:
            rewards: ``(n, H)`` true per-step rewards of the segments to rate.
            rated: ``(m, H)`` true rewards of the segments rated before (the reference the
                quantiles also come from), or ``None``.

        Returns:
            ``(keep, ratings)``: ``keep (n,)`` bool (False = skipped), ``ratings (n_kept,)``
            float32 classes 0 … ``classes`` − 1.
        """
        r = np.asarray(rewards, dtype=np.float64)
        if r.ndim != 2:
            raise ValueError(f"rewards must be (batch, segment), got {r.shape}")
        if not len(r):
            return np.zeros(0, bool), np.zeros(0, np.float32)
        threshold = self.eps_skip ** self.threshold_power * self.margin
        keep = r.sum(1) > threshold if threshold > 0 else np.ones(len(r), dtype=bool)
        pool = self.returns(np.concatenate([r, np.asarray(rated, np.float64).reshape(-1,
                                                                                     r.shape[1])])
                            if rated is not None and len(rated) else r)
        mine = self.returns(r[keep])
        edges = np.quantile(pool, np.arange(1, self.classes) / self.classes)
        if self.beta > 0:
            lo, span = pool.min(), max(float(np.ptp(pool)), 1e-12)
            bounds = np.concatenate([[0.0], (edges - lo) / span, [1.0]])
            logits = rating_logits(torch.as_tensor((mine - lo) / span),
                                   torch.as_tensor(bounds), self.beta).numpy()
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            ratings = np.array([self.rng.choice(self.classes, p=row) for row in p], np.float64)
        else:
            ratings = np.searchsorted(edges, mine, side="right").astype(np.float64)
        if self.eps_mistake > 0:
            wrong = self.rng.random(len(ratings)) < self.eps_mistake
            shift = self.rng.integers(1, self.classes, size=len(ratings))
            ratings[wrong] = (ratings[wrong] + shift[wrong]) % self.classes
        return keep, ratings.astype(np.float32)


class TeacherStats:
    """Running counts of how a teacher answered: skips, ties and agreement with the oracle.

    ``total`` counts every query asked (skipped ones included, as B-Pref's ``total_feedback``).
    """

    def __init__(self) -> None:
        self.total = 0
        self.skipped = 0
        self.equal = 0
        self.agree = 0
        self.compared = 0

    def update(self, keep: np.ndarray, labels: np.ndarray, oracle_labels: np.ndarray) -> None:
        """Add one round: ``keep (batch,)``; ``labels`` and ``oracle_labels`` for kept pairs."""
        self.total += len(keep)
        self.skipped += int((~keep).sum())
        self.equal += int((labels == 0.5).sum())
        strict = (labels != 0.5) & (oracle_labels != 0.5)
        self.agree += int((labels == oracle_labels)[strict].sum())
        self.compared += int(strict.sum())

    def as_dict(self) -> dict[str, float]:
        """Fractions: skipped of asked, equal of answered, oracle agreement of strict answers."""
        answered = self.total - self.skipped
        return {
            "skip_fraction": self.skipped / self.total if self.total else float("nan"),
            "equal_fraction": self.equal / answered if answered else float("nan"),
            "oracle_agreement": self.agree / self.compared if self.compared else float("nan"),
        }
