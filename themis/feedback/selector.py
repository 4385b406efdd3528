"""Query selection: which segment pairs a feedback round asks about (B-Pref Sec. 3.2).

A round cuts candidate pairs from the query pool (the most recent ``query_pool_episodes``
episodes of the store, and only steps whose frames are kept when a person watches clips), then
the sampler of ``feed_type`` picks ``reward_batch`` of them: uniform sampling draws exactly
that many candidates, the uncertainty samplers score ``reward_batch × large_batch``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from themis.agents.buffers import SegmentPairs
from themis.feedback.sampling import (
    SAMPLERS,
    needs_large_batch,
    pair_features,
    uses_labelled_features,
)
from themis.methods.base import Method, overrides
from themis.reward import RewardEnsemble

FEEDBACK_ROUNDS = 10
"""Rounds that ``reward_batch=auto`` spreads ``max_feedback`` over (docs/guide/configuration.md)."""


def resolve_reward_batch(reward_batch: object, max_feedback: int,
                         rounds: int = FEEDBACK_ROUNDS) -> int:
    """Queries per feedback round: ``reward_batch`` itself, or for ``"auto"`` ceil(
    ``max_feedback`` / min(:data:`FEEDBACK_ROUNDS`, ``rounds``)), at least 1 — the whole
    budget in ten rounds, ``num_interact`` steps apart, whatever ``max_feedback`` a user sets;
    in fewer, larger rounds when the run's schedule holds fewer than ten (``rounds``, see
    :func:`feedback_rounds`), so that a short run still spends its budget.

    Raises:
        ValueError: ``reward_batch`` is neither ``"auto"`` nor an integer.
    """
    if reward_batch == "auto":
        return max(1, -(-max_feedback // max(1, min(FEEDBACK_ROUNDS, rounds))))
    if isinstance(reward_batch, bool) or not isinstance(reward_batch, int):
        raise ValueError(f"reward_batch={reward_batch} must be a positive integer or auto")
    return reward_batch


def feedback_rounds(num_train_steps: int, first_step: int, num_interact: int,
                    rollout: int = 1) -> int:
    """How many feedback rounds a run's schedule holds: the first when pretraining ends
    (``first_step`` = ``num_seed_steps + num_unsup_steps``), then one every ``num_interact``
    steps until ``num_train_steps``.

    Args:
        num_train_steps, first_step, num_interact: the schedule, in environment steps.
        rollout: 1 for the off-policy loop (a round is checked before each step ``<
            num_train_steps``); PPO's steps per rollout (``ppo.num_envs × ppo.num_steps``):
            rounds come after whole rollouts, so the first and the spacing round up to
            multiples of it, and the last rollout may end past ``num_train_steps``.

    Returns:
        the number of rounds (0 when pretraining does not end before the run does).
    """
    first, every, last = round_grid(num_train_steps, first_step, num_interact, rollout)
    return 0 if first > last else 1 + (last - first) // max(1, every)


def round_grid(num_train_steps: int, first_step: int, num_interact: int,
               rollout: int = 1) -> tuple[int, int, int]:
    """``(first, every, last)``: the step of the first feedback round, the steps between
    rounds and the last step a round may come at (arguments as :func:`feedback_rounds`)."""
    if rollout <= 1:
        return first_step, num_interact, num_train_steps - 1
    return (-(-first_step // rollout) * rollout, -(-num_interact // rollout) * rollout,
            -(-num_train_steps // rollout) * rollout)


class DecayingSchedule:
    """Queries per round for a labelling rate that decays as ``T₀ / (T + T₀)`` at step ``T``
    (Christiano et al. 2017, App. A: "our rate of labeling after T frames 2·10⁶ / (T + 2·10⁶)";
    Atari: 5·10⁶ frames), the budget spread over the rounds the run holds.

    A round at step ``T`` asks ``remaining × w(T) / Σ w`` queries (rounded, at least 1), the sum
    over this and the rounds still to come (every ``every`` steps up to ``last``); the last round
    asks what is left, so the budget is spent as the constant schedule spends it. Rounds that
    come late or are postponed spread what is left again.

    Args:
        decay_steps: ``T₀`` (``query_decay_steps``).
        every: steps between rounds (``num_interact``; PPO: rounded up to whole rollouts).
        last: the last step a round may come at.
    """

    def __init__(self, decay_steps: int, every: int, last: int) -> None:
        if decay_steps <= 0 or every <= 0:
            raise ValueError(f"decay_steps and every must be positive, got {decay_steps}, "
                             f"{every}")
        self.decay_steps, self.every, self.last = decay_steps, every, last

    def rate(self, step: int | np.ndarray) -> np.ndarray:
        """The relative labelling rate ``T₀ / (T + T₀)`` at ``step``."""
        return self.decay_steps / (np.asarray(step, dtype=np.float64) + self.decay_steps)

    def __call__(self, step: int, remaining: int) -> int:
        """Queries of the round at ``step`` with ``remaining`` queries of the budget left."""
        if remaining <= 0:
            return 0
        later = step + self.every * np.arange(max(1, (self.last - step) // self.every + 1))
        weights = self.rate(later)
        return int(min(remaining, max(1, round(remaining * weights[0] / weights.sum()))))

    def plan(self, first: int, budget: int, first_queries: int = 0) -> list[int]:
        """The queries of every round from ``first`` on when each is asked in full (the
        console line and the tests); ``first_queries`` > 0: the first round asks that many
        (``first_round_queries``)."""
        sizes, step = [], first
        while budget > 0 and step <= self.last:
            n = min(first_queries, budget) if first_queries and step == first else \
                self(step, budget)
            sizes.append(n)
            budget -= n
            step += self.every
        return sizes

class QuerySelector:
    """Cuts candidates from a store and picks queries with a named sampler.

    Args:
        sampler: the sampler of later rounds (a :data:`themis.feedback.sampling.SAMPLERS` name); the
            first round is uniform (PEBBLE).
        segment: steps per segment.
        large_batch: candidate multiplier of the uncertainty samplers.
        rng: the generator of candidate draws and uniform picks.
        encoder: for pixels and grids, the fixed random encoder whose features k-center
            compares (RE3); ``None`` for vectors (flattened observations, as B-Pref).
        obs_shape: the shape of one observation (labelled pairs may hold them flattened).

    Attributes:
        methods: the run's methods; one with its own ``select_queries`` picks the queries of
            later rounds among ``n × large_batch`` candidates instead of the sampler (the
            first round stays uniform).
    """

    def __init__(self, sampler: str, segment: int, large_batch: int,
                 rng: np.random.Generator, encoder: torch.nn.Module | None = None,
                 obs_shape: tuple[int, ...] = ()) -> None:
        self.sampler, self.segment, self.large_batch = sampler, segment, large_batch
        self.rng, self.encoder, self.obs_shape = rng, encoder, obs_shape
        self.methods: list[Method] = []

    def select(self, store: object, n_queries: int, reward_model: RewardEnsemble,
               labelled_observations: np.ndarray, first: bool, min_episode: int,
               usable: Callable[[np.ndarray], np.ndarray] | None = None) -> SegmentPairs:
        """``n_queries`` pairs chosen among candidates cut from episodes ``>= min_episode``.

        Args:
            store: a replay buffer or episode store (``sample_segment_pairs``).
            labelled_observations: ``(m, 2, H, *obs_shape)`` of the pairs already labelled
                (k-center keeps away from them).
            usable: optional mask of usable store slots (steps whose frames are kept).

        Raises:
            themis.agents.buffers.NoSegmentsError: no episode in the pool holds a whole segment.
        """
        sampler = "uniform" if first else self.sampler
        chooser = None if first else next(
            (m for m in self.methods if overrides(m, "select_queries")), None)
        n_candidates = n_queries * self.large_batch if chooser is not None \
            or needs_large_batch(sampler) else n_queries
        candidates = store.sample_segment_pairs(  # type: ignore[attr-defined]
            n_candidates, self.segment, self.rng, min_episode, usable)
        if chooser is not None:
            picks = chooser.select_queries(candidates, reward_model, n_queries, self.rng)
            if picks is not None:
                return candidates.take(picks)
        labelled = self.pair_features(labelled_observations) \
            if uses_labelled_features(sampler) else np.zeros((0, 0), dtype=np.float32)
        picks = SAMPLERS[sampler](candidates, reward_model, labelled, n_queries, self.rng,
                                  features=self.pair_features)
        return candidates.take(picks)

    def chooser_name(self, first: bool) -> str:
        """What picks this round's queries, for ``reward.csv``: ``uniform`` (the first round),
        a method's name (its own ``select_queries``) or the sampler's."""
        if first:
            return "uniform"
        chooser = next((m for m in self.methods if overrides(m, "select_queries")), None)
        return chooser.name if chooser is not None else self.sampler

    def pair_features(self, observations: np.ndarray) -> np.ndarray:
        """k-center features of query pairs ``(n, 2, H, ...) -> (n, d)``: the flattened
        observations for vectors (B-Pref); for pixels and grids each segment's mean feature of
        the fixed random encoder, ``d = 2 * feature_dim``."""
        if self.encoder is None:
            return pair_features(observations)
        n, _, horizon = observations.shape[:3]
        device = next(self.encoder.parameters()).device
        out = np.zeros((n, 2 * self.encoder.feature_dim), dtype=np.float32)  # type: ignore
        chunk = max(1, 2048 // (2 * horizon))  # pairs per encoder call: bounded memory
        for lo in range(0, n, chunk):
            part = observations[lo:lo + chunk]  # copied chunk by chunk (stacks may be views)
            m = len(part)
            frames = torch.as_tensor(part.reshape(m * 2 * horizon, *self.obs_shape),
                                     device=device)
            with torch.no_grad():
                feats = self.encoder(frames)
            out[lo:lo + m] = feats.reshape(m, 2, horizon, -1).mean(2).reshape(m, -1).cpu().numpy()
        return out
