"""The background learner's query schedule as a stream: queries due by agent step ``t``.

The learner process of the wrappers and of ``reward_training=async``
(:mod:`themis.online.learner_process`) sees the agent's steps in bursts and runs a round
whenever it is free. Rounds "every ``num_interact`` steps" counted in the steps it has
received lose the rounds that fall due while it trains or waits for people, and a fast agent's
budget went partly unasked. Here the schedule is a target over the agent's steps instead:
:meth:`QueryTarget.due` says how many queries should have been asked by step ``t``; while some
are owed (``due - asked``) the learner runs the schedule's rounds back to back, each of its own
size and with its own training, so a late learner catches up (later, never lost).

Three shapes (``query_schedule``):

- ``constant``: ``reward_batch`` queries at ``first`` (``first_round_queries`` when set), then
  ``reward_batch`` more every ``num_interact`` steps (PEBBLE's rounds, as the sync loop spends
  them);
- ``decay``: DRLHP's labelling rate ``T₀ / (T + T₀)`` (Christiano et al. 2017, App. A). With a
  known horizon (Themis's own loop, ``num_train_steps``) the budget is spread over the run's
  rounds exactly as the sync loop's :class:`themis.feedback.selector.DecayingSchedule` plans it;
  without one (a wrapper: the user's library decides how long it trains) the rate starts at
  ``reward_batch`` per ``num_interact`` steps and decays from there, the budget capping it;
- ``continuous``: DRLHP's preference interface, which asks as fast as the teacher answers while
  segments wait: everything is due, a round of ``reward_batch`` comes whenever no posted query
  waits for an answer and new steps came since the last one (the learner decides when, see
  :meth:`themis.online.learner_process.LearnerProcessState.due`).
"""

from __future__ import annotations

import numpy as np

from themis.feedback.selector import DecayingSchedule


class QueryTarget:
    """Queries due by agent step ``t`` (see the module docstring); also the learner's
    ``schedule`` (``(step, remaining) -> queries of this round``).

    Args:
        budget: ``max_feedback``.
        batch: ``reward_batch`` (queries of the first round; a round of ``continuous``).
        first: the step of the first round (``num_seed_steps`` of the learner's config).
        every: ``num_interact``.
        mode: ``constant``, ``decay`` or ``continuous`` (``query_schedule``).
        decay: the sync loop's plan of ``query_schedule=decay`` when the run's horizon is
            known (``None``: no horizon, the horizon-free decaying rate).
        decay_steps: ``T₀`` (``query_decay_steps``) of the horizon-free decay.
        first_queries: the first round's queries when positive (``first_round_queries``,
            DRLHP's ``n_initial_prefs``); the later rounds keep their sizes (``constant``:
            ``batch``; ``decay``: the plan that spreads the rest of the budget, as the sync
            loop's, or the horizon-free rate relative to ``batch``).

    Raises:
        ValueError: a mode other than the three, or ``every``/``batch`` not positive.
    """

    def __init__(self, budget: int, batch: int, first: int, every: int, mode: str = "constant",
                 decay: DecayingSchedule | None = None, decay_steps: int = 2_000_000,
                 first_queries: int = 0) -> None:
        if mode not in ("constant", "decay", "continuous"):
            raise ValueError(f"query schedule {mode!r} is not constant, decay or continuous")
        if every <= 0 or batch <= 0:
            raise ValueError(f"every and batch must be positive, got {every}, {batch}")
        self.budget, self.batch, self.first, self.every = budget, batch, first, every
        self.mode, self.first_queries = mode, max(0, int(first_queries))
        self.planned: np.ndarray | None = None  # cumulative queries of the planned rounds
        if mode == "decay" and decay is not None:
            self.planned = np.cumsum(decay.plan(first, budget, self.first_queries)
                                     ).astype(np.int64)
        self.rate = DecayingSchedule(decay_steps, every, first)  # its rate() only
        self._cum = np.zeros(0)  # horizon-free decay: cumulative relative weights per round

    def rounds_due(self, step: int) -> int:
        """Rounds of the schedule whose step is ``<= step`` (0 before ``first``)."""
        return 0 if step < self.first else (step - self.first) // self.every + 1

    def after_rounds(self, k: int) -> int:
        """Queries due once the schedule's first ``k`` rounds have come (at most ``budget``)."""
        if k <= 0:
            return 0
        if self.mode == "continuous":
            return self.budget
        if self.planned is not None:
            return int(self.planned[min(k, len(self.planned)) - 1]) if len(self.planned) else 0
        opening = self.first_queries or self.batch  # the first round's queries
        if self.mode == "constant":
            return min(self.budget, opening + self.batch * (k - 1))
        if len(self._cum) < k:  # the weights w(T_j) / w(T_0) of rounds 0 .. k-1, grown once
            steps = self.first + self.every * np.arange(max(k, 2 * len(self._cum)))
            weights = self.rate.rate(steps) / self.rate.rate(self.first)
            self._cum = np.cumsum(weights)
        later = self.batch * float(self._cum[k - 1] - self._cum[0])  # rounds 1 .. k-1
        return min(self.budget, opening + round(later))

    def due(self, step: int) -> int:
        """Queries that should have been asked by agent step ``step`` (at most ``budget``)."""
        return self.after_rounds(self.rounds_due(step))

    def owed(self, step: int, asked: int) -> int:
        """Queries due by ``step`` and not asked yet (``asked`` so far)."""
        return max(0, self.due(step) - asked)

    def next_round(self, asked: int, rounds: int) -> int:
        """The queries of the schedule's next round not asked yet: the first of its first
        ``rounds`` rounds whose cumulative due exceeds ``asked``, less ``asked``."""
        lo, hi = 1, max(1, rounds)
        while lo < hi:  # the smallest k with after_rounds(k) > asked (non-decreasing in k)
            mid = (lo + hi) // 2
            if self.after_rounds(mid) > asked:
                hi = mid
            else:
                lo = mid + 1
        return max(0, self.after_rounds(lo) - asked)

    def __call__(self, step: int, remaining: int) -> int:
        """The learner's round at ``step`` with ``remaining`` queries of the budget left: the
        next round of the schedule that is owed (``continuous``: one ``reward_batch``). A
        learner behind the agent runs the owed rounds back to back, each its own training."""
        if remaining <= 0 or step < self.first:
            return 0
        if self.mode == "continuous":
            return min(self.batch, remaining)
        asked = self.budget - remaining
        if self.owed(step, asked) == 0:
            return 0
        return min(remaining, self.next_round(asked, self.rounds_due(step)))


__all__ = ["QueryTarget"]
