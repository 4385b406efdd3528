"""One interface for every teacher: post a round's queries, gather the answers that exist.

The feedback round (:meth:`themis.workspace.Workspace.feedback_round`) does not know who
answers. It *posts* the queries it selected and *gathers* whatever answers exist:

- :class:`SyntheticChannel`: a B-Pref teacher answers at once (gather returns this round's);
- :class:`TerminalChannel`: a person answers in the terminal while the run waits;
- :class:`WebChannel`: queries go to the run's SQLite store and the labeling page; gather
  returns the answers that arrived since the last round (often for earlier rounds' queries).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from themis.buffers import SegmentPairs
from themis.teachers import SyntheticTeacher


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
    """

    pairs: SegmentPairs
    keep: np.ndarray
    labels: np.ndarray
    labelers: list[str] = field(default_factory=list)
    saved: bool = False


def _empty_like(pairs: SegmentPairs) -> Gathered:
    none = pairs.take(np.zeros(0, dtype=np.int64))
    return Gathered(none, np.zeros(0, bool), np.zeros(0, np.float32))


class Channel(Protocol):
    def post(self, queries: SegmentPairs) -> int:
        """Post queries; returns how many were asked (they count towards ``max_feedback``)."""

    def gather(self, template: SegmentPairs, at_least: int = 0) -> Gathered:
        """The answers available now (``at_least``: wait for that many labels while more can
        still come); ``template`` gives the shapes of an empty result."""


class _AnswersAtOnce:
    """A channel whose posted queries are answered before ``post`` returns."""

    _answered: Gathered | None = None

    def gather(self, template: SegmentPairs, at_least: int = 0) -> Gathered:
        answered, self._answered = self._answered, None
        return answered if answered is not None else _empty_like(template)


class SyntheticChannel(_AnswersAtOnce):
    """A B-Pref synthetic teacher: every posted query is answered at once."""

    def __init__(self, teacher: SyntheticTeacher, labeler: str) -> None:
        self.teacher, self.labeler = teacher, labeler

    def post(self, queries: SegmentPairs) -> int:
        keep, labels = self.teacher.label(queries.true_rewards[:, 0], queries.true_rewards[:, 1])
        self._answered = Gathered(queries, keep, labels, [self.labeler] * int(keep.sum()))
        return len(queries)


class TerminalChannel(_AnswersAtOnce):
    """A person in the terminal (``lib/human_interface.py``); answers are saved as given."""

    def __init__(self, workspace: Any) -> None:
        self.ws = workspace

    def post(self, queries: SegmentPairs) -> int:
        asked, keep, labels = self.ws.ask_person(queries)
        labeler = self.ws.teacher_description()
        self._answered = Gathered(asked, keep, labels, [labeler] * len(labels), saved=True)
        return len(asked)


class WebChannel:
    """People on the labeling page: posted queries wait in the run's label store."""

    def __init__(self, workspace: Any) -> None:
        self.ws = workspace

    def post(self, queries: SegmentPairs) -> int:
        self.ws.post_web_queries(queries)
        return len(queries)

    def gather(self, template: SegmentPairs, at_least: int = 0) -> Gathered:
        store, cfg, log = self.ws.label_store, self.ws.cfg, self.ws.logger
        parts: list[Gathered] = []
        count, last_note = 0, 0.0
        while True:
            _, pairs, labels, labelers, _ = store.gather(cfg.label_aggregate)
            if pairs is not None:
                parts.append(Gathered(pairs, np.ones(len(labels), bool), labels, labelers))
                count += len(labels)
            if count >= at_least or store.pending_count() == 0:
                break
            if time.time() - last_note > 30:  # min_labels_before_training: wait for people
                log.info(f"waiting for labels: {count} of {at_least} more "
                         "(min_labels_before_training)", "yellow")
                last_note = time.time()
            time.sleep(0.5)
        if not parts:
            return _empty_like(template)
        return Gathered(SegmentPairs(*(np.concatenate(f) for f in zip(*(p.pairs for p in parts),
                                                                       strict=True))),
                        np.concatenate([p.keep for p in parts]),
                        np.concatenate([p.labels for p in parts]),
                        [w for p in parts for w in p.labelers])
