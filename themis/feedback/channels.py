"""One interface for every teacher: post a round's queries, gather the answers that exist.

The feedback round (:meth:`themis.feedback.PreferenceLearner.round`) does not know who
answers. It *posts* the queries it selected and *gathers* whatever answers exist:

- :class:`SyntheticChannel`: a B-Pref teacher answers at once (gather returns this round's);
- :class:`TerminalChannel`: a person answers in the terminal while the run waits;
- :class:`WebChannel`: queries go to the run's SQLite store and the labeling page; gather
  returns the answers that arrived since the last round (often for earlier rounds' queries);
- :class:`VLMChannel`: a vision-language model answers at once (:mod:`themis.feedback.vlm`);
  :class:`CrowdVLMChannel`: the same model as one labeler of the web crowd, beside people.
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
from themis.feedback.vlm import VLMStats, VLMTeacher
from themis.reward.preference_models import true_preference


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

    def columns(self) -> dict[str, float]:
        """The channel's own ``reward.csv`` columns for the round just posted (a VLM's
        requests, tokens, cost; empty for most channels)."""

    def state_dict(self) -> dict[str, Any]:
        """What the channel keeps across a resume, in the learner's checkpoint (a VLM's gold
        score; empty for most channels)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""


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

    def columns(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


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
        ids = self.store.post(number, queries, paths, needed, gold=gold,
                              rating_classes=self.rating_classes)
        self.last_posted = (ids, queries)
        return int(np.isnan(gold).sum())

    last_posted: tuple[list[int], SegmentPairs] | None = None
    """The store IDs and pairs (gold ones mixed in) of the last :meth:`post`."""

    def columns(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}  # the label store is the web channel's state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

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


class VLMGold:
    """``vlm_gold_from=oracle``: a few queries of each round answered by the env's reward (the
    trusted labels of PRIMT and PrefVLM, here from the oracle; the clearest pairs of the round,
    :meth:`pick`) score the VLM, and its labels are left out of training while its accuracy on
    them is below ``min_accuracy`` (after ``min_answers`` gold answers; a *can't tell* is not
    counted): the crowd's ``label_quality=filter`` rule applied to one labeler.

    Args:
        fraction: gold queries per query asked (``gold_fraction``; at least one a round).
        min_answers, min_accuracy: ``min_gold_answers``, ``min_gold_accuracy``.
        rng: picks the round's gold queries among its queries.
    """

    def __init__(self, fraction: float, min_answers: int, min_accuracy: float,
                 rng: np.random.Generator) -> None:
        self.fraction, self.min_answers, self.min_accuracy = fraction, min_answers, min_accuracy
        self.rng = rng
        self.answers = 0
        self.agreed = 0

    def pick(self, true_rewards: np.ndarray) -> np.ndarray:
        """``(n,)`` bool: which of a round's ``n`` queries (true rewards ``(n, 2, H)``) are
        gold: the ``fraction`` (at least one) whose true returns differ most, as the crowd's
        gold queries (:meth:`~themis.feedback.learner.PreferenceLearner.gold_queries`); never
        a pair of equal returns, whose answer is not known; ties broken at random."""
        n = len(true_rewards)
        gold = np.zeros(n, bool)
        if n:
            true = np.asarray(true_rewards, np.float64).sum(-1)
            gap = np.abs(true[:, 1] - true[:, 0])
            order = np.lexsort((self.rng.random(n), -gap))
            chosen = order[:min(n, max(1, round(self.fraction * n)))]
            gold[chosen[gap[chosen] > 0]] = True
        return gold

    def score(self, vlm: np.ndarray, known: np.ndarray) -> None:
        """Add the VLM's labels ``(k,)`` (NaN: can't tell, not counted) of gold queries with
        ``known`` answers ``(k,)``."""
        told = ~np.isnan(vlm)
        self.answers += int(told.sum())
        self.agreed += int((vlm[told] == known[told]).sum())

    @property
    def accuracy(self) -> float:
        """Share of the VLM's gold answers that match (NaN before any)."""
        return self.agreed / self.answers if self.answers else float("nan")

    @property
    def failed(self) -> bool:
        """The VLM's labels are left out of training."""
        return self.answers >= self.min_answers and self.accuracy < self.min_accuracy

    def state_dict(self) -> dict[str, int]:
        """The gold counts (for the learner's checkpoint)."""
        return {"answers": self.answers, "agreed": self.agreed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        self.answers, self.agreed = int(state["answers"]), int(state["agreed"])


GOLD_LABELER = "synthetic(gold:oracle)"
"""Who answers a ``vlm_gold_from=oracle`` gold query (its training label is the oracle's)."""


def vlm_labels(answers: list[Any]) -> np.ndarray:
    """``(n,)`` float64 labels of VLM answers, NaN for *can't tell*."""
    return np.array([np.nan if a.label is None else a.label for a in answers], np.float64)


def oracle_agreement(labels: np.ndarray, true_rewards: np.ndarray) -> float:
    """Share of the strict labels ``(n,)`` (NaN and 0.5 left out) that match the oracle's
    (the true returns ``(n, 2, H)``; pairs of equal returns left out); NaN when none."""
    oracle = true_preference(true_rewards)
    strict = ~np.isnan(labels) & (labels != 0.5) & (oracle != 0.5)
    return float((labels[strict] == oracle[strict]).mean()) if strict.any() else float("nan")


class VLMChannel(AnswersAtOnce):
    """A vision-language model answers every posted query at once (RL-VLM-F): its two
    segments' frames go to the endpoint (:class:`themis.feedback.vlm.VLMTeacher`); a *can't
    tell* is a skipped query, as a B-Pref skip. Each label is recorded in the dataset the
    moment its answer arrives (as a person's in the terminal), so a run stopped mid-round
    keeps the answers it paid for: a resumed run counts them as asked and asks the others.

    Args:
        teacher: the VLM teacher.
        labeler: stored with each label (``vlm:MODEL``).
        frames: ``queries -> (n, 2, H, h, w, 3)`` uint8 frames (``lib.clips.ClipMaker.frames``).
        gold: ``vlm_gold_from=oracle`` (:class:`VLMGold`), or ``None``.
        record: writes one labelled pair to the dataset at once (the learner's
            :meth:`~themis.feedback.learner.PreferenceLearner.record`); ``None``: the round
            records the labels when it gathers them.
    """

    def __init__(self, teacher: VLMTeacher, labeler: str,
                 frames: Callable[[SegmentPairs], np.ndarray],
                 gold: VLMGold | None = None, record: Record | None = None) -> None:
        self.teacher, self.labeler, self.frames, self.vlm_gold = teacher, labeler, frames, gold
        self.record = record
        self.round_columns: dict[str, float] = {}

    def post(self, queries: SegmentPairs) -> int:
        stats = VLMStats()
        gold = self.vlm_gold.pick(queries.true_rewards) if self.vlm_gold is not None \
            else np.zeros(len(queries), bool)
        known = true_preference(queries.true_rewards)  # the training label of a gold query
        labelers = [GOLD_LABELER if g else self.labeler for g in gold]

        def answered(i: int, answer: Any) -> None:
            label = known[i] if gold[i] else answer.label
            if self.record is not None and label is not None:
                self.record(queries.take(np.array([i])), np.array([label], np.float32),
                            labelers[i])

        answers = self.teacher.ask(self.frames(queries), stats, answered)
        said = vlm_labels(answers)
        labels = np.where(gold, known, said)
        gold_columns: dict[str, float] = {}
        if self.vlm_gold is not None:
            self.vlm_gold.score(said[gold], known[gold])
            gold_columns = {"vlm_gold_accuracy": self.vlm_gold.accuracy,
                            "vlm_filtered": int(self.vlm_gold.failed)}
        keep = ~np.isnan(labels)
        self.round_columns = {**stats.columns(), "vlm_oracle_agreement":
                              oracle_agreement(said, queries.true_rewards), **gold_columns}
        self._answered = Gathered(queries, keep, labels[keep].astype(np.float32),
                                  [w for w, k in zip(labelers, keep, strict=True) if k],
                                  saved=self.record is not None)
        return len(queries)

    def state_dict(self) -> dict[str, Any]:
        """The gold score (``vlm_gold_from=oracle``) and the generator that picks gold."""
        if self.vlm_gold is None:
            return {}
        return {"vlm_gold": self.vlm_gold.state_dict(),
                "vlm_gold_rng": self.vlm_gold.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.vlm_gold is not None and "vlm_gold" in state:
            self.vlm_gold.load_state_dict(state["vlm_gold"])
            self.vlm_gold.rng.bit_generator.state = state["vlm_gold_rng"]

    def flagged(self) -> set[str]:
        """The VLM (by the name :func:`themis.feedback.learner.flagged_rows` reads) while its
        gold accuracy is too low (``vlm_gold_from=oracle``)."""
        if self.vlm_gold is None or not self.vlm_gold.failed:
            return set()
        return {self.labeler.split(":")[-1]}

    def columns(self) -> dict[str, float]:
        columns, self.round_columns = self.round_columns, {}
        return columns


class CrowdVLMChannel(WebChannel):
    """People on the labeling page and a VLM as one more labeler of the crowd: every query
    posted (gold ones included) is answered by the VLM into the label store at once, under
    its labeler name, where gold queries score it, Dawid–Skene weighs it
    (``label_quality=model``), the filter can flag it and the audit shows it — as a person.
    Each answer is in the store the moment it arrives. The VLM answers at posting time only:
    the queries of a round that was stopped while the VLM answered it are left to people.

    Args:
        teacher: the VLM teacher.
        vlm_labeler: its name in the store (``vlm:MODEL``).
        *args, **kwargs: :class:`WebChannel`'s.
    """

    def __init__(self, teacher: VLMTeacher, vlm_labeler: str, *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.teacher, self.vlm_labeler = teacher, vlm_labeler
        self.round_columns: dict[str, float] = {}

    def post(self, queries: SegmentPairs) -> int:
        asked = super().post(queries)
        assert self.last_posted is not None
        ids, posted = self.last_posted
        stats = VLMStats()

        def answered(i: int, answer: Any) -> None:  # in the store the moment it comes
            self.store.answer(ids[i], self.vlm_labeler, answer.label)

        answers = self.teacher.ask(self.clips.frames(posted), stats, answered)
        said = vlm_labels(answers)
        self.round_columns = {**stats.columns(), "vlm_oracle_agreement":
                              oracle_agreement(said, posted.true_rewards)}
        return asked

    def columns(self) -> dict[str, float]:
        columns, self.round_columns = self.round_columns, {}
        return columns
