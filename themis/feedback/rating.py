"""Rating feedback (``feedback=rating``): one segment per question, rated into ordered classes.

Rating-based RL (White et al., AAAI 2024): instead of "which of these two clips is better?"
the teacher says how good one clip is, on a scale of ``rating_classes`` (0 = worst). The round
is PEBBLE's (:class:`PreferenceLearner`) with three differences, each a method here:

- queries are single segments, cut uniformly from the query pool (:meth:`select_queries`);
- the oracle's answer, for the agreement statistics, is the class of the true return among the
  true returns of every segment rated so far (:meth:`oracle_labels`);
- the reward model is trained with RbRL's rating loss (:class:`themis.reward.rating.RatingTrainer`).

A query is one answer, pairwise or rating, so ``max_feedback`` compares the two at equal
labeling effort (answers, not clips watched).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from themis.agents.buffers import SegmentPairs
from themis.core.run_keys import RunKeys
from themis.feedback.channels import AnswersAtOnce, Gathered
from themis.feedback.learner import PreferenceLearner
from themis.feedback.teachers import SyntheticRatingTeacher
from themis.methods.registry import check_ratings, rating_method_on
from themis.utils import ConfigError


def single_segments(pairs: SegmentPairs, n: int) -> SegmentPairs:
    """The first ``n`` segments of ``pairs`` as rows of width 1: ``(m, 2, …) -> (n, 1, …)``."""
    return SegmentPairs(*(field.reshape(-1, 1, *field.shape[2:])[:n] for field in pairs))


def oracle_ratings(true_rewards: np.ndarray, rated: np.ndarray, classes: int) -> np.ndarray:
    """The class of each segment's true return among the true returns of ``rated`` and these
    segments (quantile boundaries, as :class:`SyntheticRatingTeacher` with no noise).

    Shapes: ``true_rewards (n, 1, H)``, ``rated (m, 1, H)`` -> ``(n,)`` float32.
    """
    oracle = SyntheticRatingTeacher(classes)
    return oracle.rate(true_rewards[:, 0], rated[:, 0])[1]


class RatingLearner(PreferenceLearner):
    """:class:`PreferenceLearner` for rating feedback (the dataset has ``rating_classes``, the
    trainer is a :class:`themis.reward.rating.RatingTrainer`)."""

    def select_queries(self, store: Any, n: int, first: bool, min_episode: int,
                       usable: Callable[[np.ndarray], np.ndarray] | None) -> SegmentPairs:
        """``n`` segments cut uniformly from the query pool (both halves of ⌈n/2⌉ pairs).

        Raises:
            themis.agents.buffers.NoSegmentsError: no episode in the pool holds a whole segment.
        """
        pairs = self.selector.select(store, (n + 1) // 2, self.model,
                                     self.dataset.observations[:0], True, min_episode, usable)
        return single_segments(pairs, n)

    def oracle_labels(self, true_rewards: np.ndarray) -> np.ndarray:
        """:func:`oracle_ratings` against every segment in the dataset."""
        d = self.dataset
        return oracle_ratings(true_rewards, d.true_rewards[: len(d)], d.rating_classes)


class SyntheticRatingChannel(AnswersAtOnce):
    """A :class:`SyntheticRatingTeacher` rates every posted segment at once.

    Args:
        teacher: the rating teacher.
        labeler: stored with each rating.
        rated: the true rewards ``(m, 1, H)`` of the segments rated so far (the teacher's
            quantiles come from them and the new ones).
        clips: optional ``lib.clips.ClipMaker``: the first ``clips_per_round`` segments of each
            round are saved as explained clips (``xplain_*``).
    """

    def __init__(self, teacher: SyntheticRatingTeacher, labeler: str,
                 rated: Callable[[], np.ndarray], clips: Any = None,
                 clips_per_round: int = 0) -> None:
        self.teacher, self.labeler, self.rated = teacher, labeler, rated
        self.clips, self.clips_per_round = clips, clips_per_round

    def post(self, queries: SegmentPairs) -> int:
        keep, ratings = self.teacher.rate(queries.true_rewards[:, 0], self.rated()[:, 0])
        self._answered = Gathered(queries, keep, ratings, [self.labeler] * int(keep.sum()))
        if self.clips is not None and self.clips_per_round:
            self.clips.save_explained(
                queries.take(np.arange(min(len(queries), self.clips_per_round))))
        return len(queries)


def check_rating(cfg: RunKeys) -> None:
    """``feedback`` and the rating keys of a run config, and what rating feedback cannot do.

    Raises:
        ConfigError: one line naming the key, the problem and the fix.
    """
    if cfg.feedback not in ("pairwise", "rating"):
        raise ConfigError(f"feedback={cfg.feedback} is unknown; use pairwise or rating")
    if cfg.feedback != "rating":
        return
    check_ratings(cfg)  # methods that work on pairwise labels
    # a method that takes ratings may set feed_type in its config file; ratings ignore it
    refused = [("feed_type", cfg.feed_type not in (0, "uniform") and not rating_method_on(cfg),
                "segments to rate are cut uniformly: the samplers score pairs"),
               ("teacher_eps_equal", cfg.teacher_eps_equal > 0,
                "'equally good' needs two segments"),
               ("gold_fraction", cfg.gold_fraction > 0 or bool(cfg.gold_path),
                "gold queries are pairs"),
               ("label_quality", cfg.label_quality != "none", "gold and crowd models are for "
                "pairwise answers"),
               ("label_aggregate", cfg.label_aggregate != "each", "every rating is a label")]
    for key, bad, why in refused:
        if bad:
            value = getattr(cfg, key)
            raise ConfigError(f"feedback=rating does not take {key}={value}: {why}")
