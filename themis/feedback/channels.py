"""One interface for every teacher: post a round's queries, gather the answers that exist.

The feedback round (:meth:`themis.feedback.PreferenceLearner.round`) does not know who
answers. It *posts* the queries it selected and *gathers* whatever answers exist:

- :class:`SyntheticChannel`: a B-Pref teacher answers at once (gather returns this round's);
- :class:`TerminalChannel`: a person answers in the terminal while the run waits;
- :class:`WebChannel`: queries go to the run's SQLite store and the labeling page; gather
  returns the answers that arrived since the last round (often for earlier rounds' queries).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from themis.agents.buffers import SegmentPairs
from themis.core.console import progress_bars_paused
from themis.crowd import aggregation as crowd
from themis.feedback.teachers import SyntheticTeacher


@dataclass
class Gathered:
    """Answers gathered in one round.

    Attributes:
        pairs: the answered queries, ``n`` pairs (a query answered by k people appears k times).
        keep: ``(n,)`` bool, whether each got a label (False = skipped).
        labels: ``(keep.sum(),)`` labels of the kept ones (0, 0.5, 1; B-Pref convention).
        labelers: who gave each label.
        saved: the labels are already in the preference dataset on disk (a person's answers
            are saved the moment they are given).
        answer_ids: web: the label-store answers behind each label (``"3;7"``), kept in the
            dataset so a resumed run knows which answers it holds.
        commit: web: called once the labels are saved (marks the queries used in the store).
        timestamps: web: ``(keep.sum(),)`` when each label was given (Unix seconds), kept in
            the dataset instead of the time it was gathered.
        skipped: web: "can't tell" answers gathered besides ``pairs`` (they have no label and
            no pair here; the round's ``skipped`` counts them with the ``keep`` False ones).
    """

    pairs: SegmentPairs
    keep: np.ndarray
    labels: np.ndarray
    labelers: list[str] = field(default_factory=list)
    saved: bool = False
    answer_ids: list[str] | None = None
    commit: Callable[[], None] | None = None
    timestamps: np.ndarray | None = None
    skipped: int = 0


def _empty_like(pairs: SegmentPairs) -> Gathered:
    none = pairs.take(np.zeros(0, dtype=np.int64))
    return Gathered(none, np.zeros(0, bool), np.zeros(0, np.float32))


class Channel(Protocol):
    """What a feedback round asks of a teacher channel (:class:`AnswersAtOnce` gives the
    channels whose answers come at once the no-op defaults; :class:`WebChannel` people who
    answer later)."""

    gold: tuple[SegmentPairs, np.ndarray] | None
    """Gold queries with their known answers, mixed into the next post (:meth:`gold_count`)."""

    def post(self, queries: SegmentPairs) -> int:
        """Post queries; returns how many were asked (they count towards ``max_feedback``)."""

    def gather(self, template: SegmentPairs, at_least: int = 0,
               partial: bool = False) -> Gathered:
        """The answers available now (``at_least``: wait for that many labels while more can
        still come; ``partial``: the run ends, take queries with fewer answers than asked
        for); ``template`` gives the shapes of an empty result."""

    def posted(self) -> int:
        """Queries the coming round posted before the run stopped (a resumed run)."""

    def pending(self) -> int:
        """Posted queries whose answers have not been gathered yet."""

    def unsaved(self) -> bool:
        """Some answer exists that is not in the preference dataset yet."""

    def flagged(self) -> set[str]:
        """Labelers whose labels are left out of training (``label_quality=filter``)."""

    def gold_count(self, n_queries: int) -> int:
        """Gold queries to mix into a round of ``n_queries`` (set in :attr:`gold`)."""

    def reconcile(self, saved_answers: set[int]) -> int:
        """After a resume: agree with the dataset on which answers were used; how many
        queries changed."""


class AnswersAtOnce:
    """A channel whose posted queries are answered before ``post`` returns: nothing pending,
    nothing posted earlier, no gold queries, no flagged labelers (the :class:`Channel`
    protocol's no-op defaults)."""

    _answered: Gathered | None = None
    gold: tuple[SegmentPairs, np.ndarray] | None = None

    def gather(self, template: SegmentPairs, at_least: int = 0,
               partial: bool = False) -> Gathered:
        answered, self._answered = self._answered, None
        return answered if answered is not None else _empty_like(template)

    def posted(self) -> int:
        return 0

    def pending(self) -> int:
        return 0

    def unsaved(self) -> bool:
        return False

    def flagged(self) -> set[str]:
        return set()

    def gold_count(self, n_queries: int) -> int:
        return 0

    def reconcile(self, saved_answers: set[int]) -> int:
        return 0


class SyntheticChannel(AnswersAtOnce):
    """A B-Pref synthetic teacher: every posted query is answered at once.

    Args:
        teacher: the B-Pref teacher.
        labeler: stored with each label (``synthetic(...)``).
        clips: optional ``lib.clips.ClipMaker``: the first ``clips_per_round`` queries of each
            round are saved as explained clips (``xplain_*`` with a synthetic teacher).
    """

    def __init__(self, teacher: SyntheticTeacher, labeler: str, clips: Any = None,
                 clips_per_round: int = 0) -> None:
        self.teacher, self.labeler = teacher, labeler
        self.clips, self.clips_per_round = clips, clips_per_round

    def post(self, queries: SegmentPairs) -> int:
        keep, labels = self.teacher.label(queries.true_rewards[:, 0], queries.true_rewards[:, 1])
        self._answered = Gathered(queries, keep, labels, [self.labeler] * int(keep.sum()))
        if self.clips is not None and self.clips_per_round:
            self.clips.save_explained(
                queries.take(np.arange(min(len(queries), self.clips_per_round))))
        return len(queries)


Record = Callable[[SegmentPairs, np.ndarray, str], None]
"""Writes labelled pairs to the preference dataset (and disk): the learner's one writer."""


class TerminalChannel(AnswersAtOnce):
    """A person in the terminal (``lib/human_interface.py``); each answer is recorded the
    moment it is given.

    Args:
        teacher: a ``lib.human_interface.TerminalTeacher`` (shows clips, reads keys).
        clips: a ``lib.clips.ClipMaker`` (frames and explanation panels of queries).
        labeler: stored with each label (``human:NAME``).
        record: writes one answered pair to the dataset at once.
        header: the totals shown in the prompt (round, queries so far), a function of the
            queries asked so far in the round (the prompt of each query calls it).
    """

    def __init__(self, teacher: Any, clips: Any, labeler: str, record: Record,
                 header: Callable[[int], str]) -> None:
        self.teacher, self.clips, self.labeler = teacher, clips, labeler
        self.record, self.header = record, header

    def post(self, queries: SegmentPairs) -> int:
        frames = self.clips.frames(queries)  # (n, 2, H, h, w, 3)
        panels = self.clips.panels(queries, frames)

        def answered(i: int, label: float | None) -> None:
            if label is not None:
                self.record(queries.take(np.array([i])), np.array([label], np.float32),
                            self.labeler)

        with progress_bars_paused():  # no progress bar drawn over the question
            result = self.teacher.ask(frames, answered, self.header, panels)
        keep = np.array(result.keep, dtype=bool)
        labels = np.array(result.labels, dtype=np.float32)[keep]
        self._answered = Gathered(queries.take(np.arange(result.asked)), keep, labels,
                                  [self.labeler] * len(labels), saved=True)
        return int(result.asked)


class WebChannel:
    """People on the labeling page: posted queries wait in the run's label store.

    Args:
        store: the run's :class:`themis.crowd.label_store.LabelStore`.
        clips: a ``lib.clips.ClipMaker``; posted queries get a side-by-side clip each.
        labels_per_query: different labelers asked per query.
        aggregate: ``each`` (every answer a label), ``majority`` or ``model`` (Dawid–Skene,
            :mod:`themis.crowd.aggregation`).
        info: console line writer ``(message, colour)``.
        round_number: the number of the feedback round that posts (names the clips).
        rating_classes: ``feedback=rating``: posted queries are single segments people rate
            into this many classes (0: pairs).
    """

    def __init__(self, store: Any, clips: Any, labels_per_query: int, aggregate: str,
                 info: Callable[[str, str], None], round_number: Callable[[], int],
                 gold_fraction: float = 0.0, label_quality: str = "none",
                 min_gold_answers: int = 5, min_gold_accuracy: float = 0.7,
                 gold_answers: int = 1, rng: np.random.Generator | None = None,
                 rating_classes: int = 0) -> None:
        self.store, self.clips = store, clips
        self.labels_per_query, self.aggregate, self.info = labels_per_query, aggregate, info
        self.round_number = round_number
        self.gold_fraction, self.label_quality = gold_fraction, label_quality
        self.min_gold_answers, self.min_gold_accuracy = min_gold_answers, min_gold_accuracy
        self.gold_answers = max(gold_answers, labels_per_query)  # every labeler, when tokens
        self.rng = rng if rng is not None else np.random.default_rng()
        self.gold: tuple[SegmentPairs, np.ndarray] | None = None  # the next round's gold
        self.rating_classes = rating_classes  # > 0: queries are single segments to rate

    def post(self, queries: SegmentPairs) -> int:
        """Post the queries, and the gold queries set in :attr:`gold` mixed in at random
        places (they look like every other query; they do not count as queries asked)."""
        number = self.round_number()
        gold = np.full(len(queries), np.nan)
        needed = np.full(len(queries), self.labels_per_query)
        if self.gold is not None and len(self.gold[0]):
            pairs, known = self.gold
            queries = SegmentPairs(*(np.concatenate([a, b]) for a, b in zip(queries, pairs,
                                                                           strict=True)))
            gold = np.concatenate([gold, known])
            needed = np.concatenate([needed, np.full(len(known), self.gold_answers)])
            order = self.rng.permutation(len(gold))
            queries, gold, needed = queries.take(order), gold[order], needed[order]
        self.gold = None
        paths = self.clips.write_web_clips(queries, number)
        self.store.post(number, queries, paths, needed, gold=gold,
                        rating_classes=self.rating_classes)
        return int(np.isnan(gold).sum())

    def flagged(self) -> set[str]:
        """Labelers flagged by their gold accuracy (empty unless ``label_quality=filter``)."""
        if self.label_quality != "filter":
            return set()
        return crowd.flagged(self.store, self.min_gold_answers, self.min_gold_accuracy)

    def pending(self) -> int:
        """Posted queries still waiting for answers, or answered and not gathered yet."""
        return int(self.store.pending_count()) + int(self.store.ungathered_count())

    def unsaved(self) -> bool:
        """Some answer in the store is not in the dataset yet (a query complete and not
        gathered, or one with part of its answers)."""
        return self.store.ungathered_count(partial=True) > 0

    def gold_count(self, n_queries: int) -> int:
        """``gold_fraction`` of a round's queries, at least one (0 without gold queries)."""
        return max(1, round(self.gold_fraction * n_queries)) if self.gold_fraction > 0 else 0

    def posted(self) -> int:
        """The queries (not gold) the coming round posted already: a run that crashed after
        posting them and before its next checkpoint (0: none; the round posts its own)."""
        return int(self.store.asked_in_round(self.round_number()))

    def reconcile(self, saved_answers: set[int]) -> int:
        """After a resume: mark used exactly the queries whose answers the dataset holds."""
        return int(self.store.reconcile(saved_answers))

    def gather(self, template: SegmentPairs, at_least: int = 0,
               partial: bool = False) -> Gathered:
        """Every complete query's answers not used yet (``partial``: also those of queries
        with fewer answers than ``labels_per_query``, at the end of a run). The store marks
        them used only when :attr:`Gathered.commit` is called, after the labels are saved: a
        crash in between loses nothing (the store is reconciled with the dataset on
        resume)."""
        last_note, flagged = 0.0, self.flagged()  # scored once per round, not per poll
        while True:
            got = self.store.gather(self.aggregate, exclude=flagged, partial=partial)
            if len(got.labels) >= at_least or self.store.pending_count() == 0:
                break
            if time.time() - last_note > 30:  # min_labels_before_training: wait for people
                self.info(f"waiting for labels: {len(got.labels)} of {at_least} more "
                          "(min_labels_before_training)", "yellow")
                last_note = time.time()
            time.sleep(0.5)

        def commit() -> None:
            self.store.mark_used(got.query_ids)

        if got.pairs is None:
            return replace(_empty_like(template), commit=commit, skipped=got.skipped)
        return Gathered(got.pairs, np.ones(len(got.labels), bool), got.labels, got.labelers,
                        answer_ids=got.answer_ids, commit=commit, timestamps=got.timestamps,
                        skipped=got.skipped)
