"""The preference learner: one feedback round is one call.

:meth:`PreferenceLearner.round` follows PEBBLE's Algorithm 1 (Lee, Smith & Abbeel 2021, lines
9–13) with B-Pref's teachers: select queries from the store (:class:`QuerySelector`), post them to
the channel (synthetic, terminal or web) and gather the answers that exist, write the labels to
the preference dataset (the one place that writes it, :meth:`record`), measure the current
reward model on the fresh labels before training on them, and train the ensemble on every label
so far. What the agent sees is :meth:`reward`, the ensemble mean r̂(s, a).

The shape of a round follows imitation's ``PreferenceComparisons.train`` (fragmenter →
gatherer → dataset → reward trainer), the method pieces B-Pref's ``reward_model.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from themis.agents.buffers import NoSegmentsError, SegmentPairs
from themis.agents.intrinsic import NoveltySample
from themis.feedback.channels import Channel, Gathered
from themis.feedback.selector import QuerySelector
from themis.feedback.teachers import SyntheticTeacher, TeacherStats
from themis.methods.base import Method, overrides, reward_with_bonus
from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer
from themis.reward.recipe import RewardNormaliser
from themis.reward.schedule import LabelPassSchedule
from themis.reward.trainer import RewardTrainStats
from themis.utils import ConfigError, eval_mode

ORACLE = SyntheticTeacher()  # the reference the teacher's labels are compared with

Info = Callable[[str, str], None]
Quality = tuple[float, float, float, float]
"""Held-out quality of r̂ on a round's fresh labels: accuracy against the labels and against
the oracle, Pearson and Spearman correlation of predicted and true segment returns."""


def flagged_rows(labelers: Sequence[str] | np.ndarray, flagged: set[str]) -> np.ndarray:
    """``(n,)`` bool: whether each label (``human:NAME``, ``human:majority:A,B``) comes from a
    flagged labeler, alone or among those aggregated."""
    if not flagged:
        return np.zeros(len(labelers), bool)
    names = [set(str(w).removeprefix("human:").split(":")[-1].split(",")) for w in labelers]
    return np.array([bool(n & flagged) for n in names], bool)


class RoundReport(NamedTuple):
    """One feedback round: the ``reward.csv`` row."""

    step: int
    round: int
    sampler: str
    total_feedback: int
    labeled_feedback: int
    skipped: int
    equal: int
    oracle_agreement: float
    heldout_accuracy: float
    heldout_oracle_accuracy: float
    heldout_pearson: float
    heldout_spearman: float
    train_accuracy: float
    train_loss: float
    epochs: int
    postponed: int
    new_labels: int
    method_stats: dict[str, float] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)


@dataclasses.dataclass(frozen=True)
class QueryPool:
    """Where a feedback round's queries come from, as the run sees it (the arguments of
    :meth:`PreferenceLearner.round` the run gives every round).

    Attributes:
        store: the replay buffer or episode store segments are cut from.
        step: the environment step (for the report).
        min_episode: the oldest episode of the query pool (``query_pool_episodes``).
        recent_returns, recent_lengths: the last training episodes (the teacher's margin).
        usable: ``steps -> bool mask`` of the store slots a query may use, or ``None``.
    """

    store: Any
    step: int
    min_episode: int
    recent_returns: Sequence[float]
    recent_lengths: Sequence[int]
    usable: Callable[[np.ndarray], np.ndarray] | None = None


PRETRAIN_CHUNK_EPOCHS = 5
"""``reward_schedule=passes``: pretraining epochs run between two pauses
(:attr:`PreferenceLearner.pretraining_pause`)."""


class PreferenceLearner:
    """Reward learning from preferences: dataset, ensemble trainer, teacher channel, statistics.

    Args:
        model: the reward ensemble the agent's reward comes from.
        trainer: its Bradley–Terry trainer.
        dataset: the labels so far (empty, or loaded from ``prefs_path``).
        teacher: the synthetic teacher whose margin is set each round (also when a person
            labels: it is then unused).
        selector: cuts and picks the queries.
        folder: the run's ``preferences/`` folder, written after every new label.
        max_feedback, reward_batch, reward_update: B-Pref's budget, queries per round and
            maximum epochs per round.
        segment: steps per segment (scales the teacher's margin).
        max_episode_steps: the env's time limit (``None``: the recent mean length is used).
        min_labels: web only: labels to wait for before the first training.
        info: console line writer ``(message, colour)``.
        bpref_thresholds: B-Pref's threshold schedule: ``eps² * margin`` after the first round
            (``teacher_thres_schedule=bpref``).

    The channel is attached after construction (:attr:`channel`): a terminal channel records
    through :meth:`record`.
    """

    checkpoint_after_round = True
    """The loop checkpoints after each round (:class:`themis.run.protocols.RunLearner`)."""

    def __init__(self, model: RewardEnsemble, trainer: RewardTrainer,
                 dataset: PreferenceDataset, teacher: SyntheticTeacher,
                 selector: QuerySelector, folder: Path, max_feedback: int, reward_batch: int,
                 reward_update: int, segment: int, max_episode_steps: int | None,
                 min_labels: int = 0, info: Info = lambda message, colour: None,
                 bpref_thresholds: bool = False) -> None:
        self.model, self.trainer, self.dataset = model, trainer, dataset
        self.teacher, self.selector, self.folder = teacher, selector, folder
        self.max_feedback, self.reward_batch = max_feedback, reward_batch
        self.reward_update, self.segment = reward_update, segment
        self.max_episode_steps, self.min_labels, self.info = max_episode_steps, min_labels, info
        self.bpref_thresholds = bpref_thresholds
        self.channel: Channel | None = None
        # PEBBLE's successors (themis/methods): the run's methods, whose hooks run here
        self.methods = list(getattr(trainer, "methods", ()))
        self.gold_dataset: PreferenceDataset | None = None  # gold_path: known answers
        # DRLHP's recipe, set by the workspace when its keys are on
        self.normaliser: RewardNormaliser | None = None  # reward_norm_std
        self.schedule: Callable[[int, int], int] | None = None  # query_schedule=decay
        self.passes: LabelPassSchedule | None = None  # reward_schedule=passes
        self.first_round_queries = 0  # DRLHP: 500 labels from the random policy first
        self.total_feedback = 0  # queries asked, skipped ones included (B-Pref)
        self.labeled_feedback = 0
        self.rounds = 0
        self.postponed_rounds = 0  # rounds without a segment to cut (episodes too short)
        self.reward_accuracy = float("nan")
        self.epochs_trained = 0.0  # passes over the labels so far (DRLHP's training steps)
        self.pretraining_pause: Callable[[], None] | None = None
        """Called between chunks of :data:`PRETRAIN_CHUNK_EPOCHS` pretraining epochs (the
        learner process checkpoints there: DRLHP's pretraining takes hours on a CPU)."""
        self.unreported: dict[str, Any] | None = None
        """The round whose reward training is under way: its ``reward.csv`` row without the
        training's columns (plain values, kept in checkpoints), so that a run stopped inside
        DRLHP's pretraining writes the first round's row when the resumed training ends."""
        self.stats = TeacherStats()
        self.on_round: Callable[[RoundReport], None] | None = None
        """Called with each round's report by :meth:`feedback_round` (the run's
        ``reward.csv`` row and console line)."""

    @property
    def methods(self) -> list[Method]:
        """The run's methods (their hooks run here)."""
        return self._methods

    @methods.setter
    def methods(self, methods: list[Method]) -> None:
        self._methods = list(methods)
        # the hooks called every agent step, found once (not on each call)
        self._bonus_methods = [m for m in self._methods if overrides(m, "reward_bonus")]
        self._between_methods = [m for m in self._methods if overrides(m, "between_rounds")]

    # ------------------------------------------------------------------ the agent's view
    def reward(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Ensemble-mean r̂(s, a), plus the methods' ``reward_bonus`` (e.g. β_t × the
        ensemble's std); with ``reward_norm_std`` of the members normalised by
        :attr:`normaliser`: ``(n, *obs_shape), (n, action_dim) -> (n,)`` float32."""
        bonus_methods = self._bonus_methods
        with eval_mode(self.model):
            if self.normaliser is not None:
                members = self.normaliser(self.model.predict_members(obs, action))
            elif bonus_methods:
                members = self.model.predict_members(obs, action)
            else:
                return self.model.predict(obs, action)
            rewarded = reward_with_bonus(bonus_methods, members)
            return members.mean(0) if rewarded is None else rewarded

    def fit_normaliser(self, store: Any, most: int = 10_000) -> None:
        """``reward_norm_std``: fit the normaliser on up to ``most`` stored transitions (evenly
        spaced over the store) and freeze it, so every label of PEBBLE's relabelled buffer
        shares one normalisation until the model changes; nothing without a normaliser."""
        if self.normaliser is not None:
            self.normaliser.fit_store(self.model, store, most)

    def model_changed(self) -> None:
        """The reward model was trained: the normaliser's statistics start again."""
        if self.normaliser is not None:
            self.normaliser.reset()

    def warm_start(self, draw: Callable[[], NoveltySample]) -> None:
        """Pretraining, after an agent update: the methods' ``pretraining_step`` (e.g. a warm
        start of the reward model on the novelty of fresh batches from ``draw()``,
        :class:`themis.agents.intrinsic.NoveltySample`); nothing without one."""
        for method in self.methods:
            method.pretraining_step(draw)

    def method_stats(self) -> dict[str, float]:
        """The methods' own numbers for ``reward.csv`` (empty for PEBBLE), DRLHP's
        validation numbers when its keys are set (:meth:`RewardTrainer.recipe_stats`) and the
        channel's own for the round (a VLM's requests, tokens, cost: ``Channel.columns``)."""
        passes = {} if self.passes is None else {"label_passes": self.passes.label_passes}
        channel = self.channel.columns() if self.channel is not None else {}
        return {**{k: v for method in self.methods for k, v in method.stats().items()},
                **self.trainer.recipe_stats(), **passes, **channel}

    def replay(self, buffer: Any) -> Any:
        """Where the off-policy agent's batches come from: a method's ``replay`` (while
        feedback is open), or ``buffer`` itself."""
        for method in self.methods:
            sampler = method.replay(buffer, self.is_open)
            if sampler is not None:
                return sampler
        return buffer

    def update_between_rounds(self, agent: Any, step: int, sample: Callable[[], Any]) -> bool:
        """The methods' ``between_rounds`` change of r̂ (e.g. a bilevel update through
        ``agent``'s critic on the batch ``sample()`` and the last ``reward_batch`` labels),
        while feedback is open and labels exist. Returns whether r̂ changed (the caller
        relabels)."""
        hooks = self._between_methods
        if not hooks or not (self.is_open() and len(self.dataset)):
            return False
        changed = False
        for method in hooks:
            changed |= method.between_rounds(agent, step, sample, self.dataset,
                                             self.reward_batch)
        if changed:
            self.model_changed()
        return changed

    # ------------------------------------------------------------------ the run's view
    # (themis.run.protocols.RunLearner: what the loops call; the learner process's end,
    # themis.online.loop.AsyncLearner, answers the same calls)
    def observe(self, i: int, obs: np.ndarray, action: np.ndarray, true_reward: float,
                terminated: bool, ended: bool, frame: np.ndarray | None = None) -> None:
        """Nothing: in the loop's process the learner cuts segments from the loop's store."""

    def stepped(self, n: int) -> None:
        """Nothing (the steps are in the loop's store)."""

    def first_model_pending(self) -> bool:
        """``False``: the first round is held when pretraining ends, and waited for."""
        return False

    def start(self) -> None:
        """Nothing to start (the label server is the run's)."""

    def checkpoint(self) -> None:
        """Nothing: :meth:`state_dict` is part of the run's checkpoint."""

    def close(self) -> None:
        """Nothing to stop."""

    def round_due(self, steps_since_round: int, every: int) -> bool:
        """A round is due every ``every`` (``num_interact``) agent steps while feedback is
        open (:meth:`is_open`)."""
        return steps_since_round >= every and self.is_open()

    def feedback_round(self, pool: QueryPool, first: bool = False, ask: bool = True,
                       final: bool = False) -> bool:
        """:meth:`round` on the run's query pool, its report passed to :attr:`on_round`.

        Returns:
            whether a round was held (r̂ may have changed: the caller relabels).
        """
        report = self.round(pool.store, pool.step, first, pool.min_episode,
                            pool.recent_returns, pool.recent_lengths, pool.usable, ask=ask,
                            final=final)
        if report is not None and self.on_round is not None:
            self.on_round(report)
        return report is not None

    # ------------------------------------------------------------------ rounds
    def is_open(self) -> bool:
        """Whether feedback rounds go on: queries left to ask, or (web) answers still to come."""
        return self.total_feedback < self.max_feedback or self.pending() > 0

    def pending(self) -> int:
        """Posted queries still waiting for answers (web; 0 for channels that answer at once)."""
        return self.channel.pending() if self.channel is not None else 0

    def unsaved_answers(self) -> bool:
        """Some answer exists that is not in the dataset yet (web; ``False`` otherwise)."""
        return self.channel is not None and self.channel.unsaved()

    def fit_saved_labels(self, source: str) -> None:
        """Train on the labels loaded from ``prefs_path`` before any query is asked."""
        if len(self.dataset):
            fit = self.trainer.train(self.dataset, self.reward_update)
            self.epochs_trained += fit.epochs
            self.model_changed()
            self.reward_accuracy = fit.accuracy
            self.info(f"reward model trained on {len(self.dataset)} preferences from "
                      f"{source} (train accuracy {fit.accuracy:.3f})", "cyan")

    def round(self, store: Any, step: int, first: bool, min_episode: int,
              recent_returns: Sequence[float], recent_lengths: Sequence[int],
              usable: Callable[[np.ndarray], np.ndarray] | None = None,
              ask: bool = True, final: bool = False) -> RoundReport | None:
        """One feedback round — select, post, gather, record, train, report — or ``None``
        when there was nothing to ask or gather.

        Args:
            store: replay buffer or episode store the segments are cut from.
            step: environment step (for the report).
            first: the first round (uniform sampling, PEBBLE).
            min_episode: the oldest episode of the query pool.
            recent_returns, recent_lengths: the last training episodes (teacher margin).
            usable: mask of store slots whose frames are kept (when a person watches).
            ask: post new queries (``False``: only gather, e.g. when the run ends).
            final: the run ends (web): no waiting, and the answers of queries with fewer
                answers than ``labels_per_query`` are taken as they are.
        """
        assert self.channel is not None
        n_queries, posted = self.queries_due(step, first, ask)
        if n_queries <= 0 and not posted and self.pending() == 0:
            if first and len(self.dataset):  # prefs_path alone: learn from the saved labels
                self.fit_saved_labels("prefs_path")
            return None
        sampler = self.selector.chooser_name(first)
        queries = self.select(store, step, n_queries, first, min_episode, usable)
        if queries is not None:
            self.post(queries, store, min_episode, usable, recent_returns, recent_lengths)
        got = self.channel.gather(self.empty_pairs(), partial=final, at_least=0 if final
                                  else max(0, self.min_labels - len(self.dataset)))
        round_stats, quality = self.record_answers(got, step)
        self.rounds += 1
        self.unreported = {
            "step": int(step), "round": self.rounds, "sampler": sampler,
            "skipped": int(round_stats.skipped), "equal": int(round_stats.equal),
            "oracle_agreement": float(round_stats.as_dict()["oracle_agreement"]),
            "quality": [float(q) for q in quality],
            "postponed": int(n_queries > 0 and queries is None), "new_labels": len(got.labels)}
        fit = self.train_after_round()
        if fit is not None:
            self.model_changed()
            self.reward_accuracy = fit.accuracy
        return self.report(fit)

    def report(self, fit: RewardTrainStats | None) -> RoundReport:
        """The ``reward.csv`` row of the round in :attr:`unreported` with its training ``fit``
        (``None``: nothing trained); the round is then reported."""
        assert self.unreported is not None
        row, self.unreported = self.unreported, None
        nan = float("nan")
        accuracy, oracle_accuracy, pearson, spearman = row["quality"]
        return RoundReport(
            row["step"], row["round"], row["sampler"], self.total_feedback,
            self.labeled_feedback, row["skipped"], row["equal"], row["oracle_agreement"],
            accuracy, oracle_accuracy, pearson, spearman, fit.accuracy if fit else nan,
            fit.loss if fit else nan, fit.epochs if fit else 0, row["postponed"],
            row["new_labels"], self.method_stats())

    def queries_due(self, step: int, first: bool, ask: bool) -> tuple[int, int]:
        """How many queries this round asks (the query schedule, B-Pref's ``reward_batch``,
        DRLHP's first round; 0 without ``ask``), and how many it had posted before a resumed
        run stopped (then it posts none again)."""
        assert self.channel is not None
        left = self.max_feedback - self.total_feedback
        n_queries = (self.schedule(step, left) if self.schedule is not None and left > 0
                     else min(self.reward_batch, left)) if ask else 0
        if ask and first and self.first_round_queries:  # DRLHP: n_initial_prefs
            n_queries = min(self.first_round_queries, left)
        posted = self.channel.posted()
        if posted:  # a resumed run: this round's queries were posted before the crash
            self.total_feedback += posted
            n_queries = 0
            self.info(f"step {step}: round {self.rounds + 1} posted its {posted} queries before "
                      "the run stopped: they are not posted again", "cyan")
        return n_queries, posted

    def select(self, store: Any, step: int, n: int, first: bool, min_episode: int,
               usable: Callable[[np.ndarray], np.ndarray] | None) -> SegmentPairs | None:
        """This round's ``n`` queries (:meth:`select_queries`), and the methods' unlabelled
        pairs (``after_queries``); ``None`` when there are none to ask, or no episode holds
        a whole segment yet (the round is postponed: asked again next round)."""
        if n <= 0:
            return None
        try:
            queries = self.select_queries(store, n, first, min_episode, usable)
        except NoSegmentsError as e:  # e.g. Hopper falling early: ask again next round
            self.postponed_rounds += 1
            self.info(f"step {step}: feedback round postponed: {e}", "yellow")
            return None
        for method in self.methods:  # e.g. a method's uniform unlabelled pairs
            method.after_queries(lambda k: self.selector.select(
                store, k, self.model, self.dataset.observations[:0], True, min_episode,
                usable), n)
        return queries

    def post(self, queries: SegmentPairs, store: Any, min_episode: int,
             usable: Callable[[np.ndarray], np.ndarray] | None,
             recent_returns: Sequence[float], recent_lengths: Sequence[int]) -> None:
        """Set the teacher's margin and thresholds, mix in the channel's gold queries and post
        the queries; asked queries count towards ``max_feedback`` (skipped ones too, B-Pref)."""
        assert self.channel is not None
        self.set_margin(recent_returns, recent_lengths)
        self.teacher.threshold_power = 2 if self.bpref_thresholds and self.rounds > 0 else 1
        if gold := self.channel.gold_count(len(queries)):
            self.channel.gold = self.gold_queries(store, gold, min_episode, usable)
        self.total_feedback += self.channel.post(queries)

    def record_answers(self, got: Gathered, step: int) -> tuple[TeacherStats, Quality]:
        """Count the gathered answers, measure the current model on them (held out: not
        trained on yet; labels of flagged labelers left out), write them to the dataset
        (:meth:`record`) and let the channel commit them. Returns the round's teacher
        statistics and the held-out quality (accuracy, oracle accuracy, Pearson, Spearman)."""
        answered, labels = got.pairs.take(got.keep), got.labels
        self.labeled_feedback += int(got.keep.sum())
        oracle_labels = self.oracle_labels(got.pairs.true_rewards[got.keep])
        round_stats = TeacherStats()
        asked = np.r_[got.keep, np.zeros(got.skipped, bool)]  # web skips: no pair, no label
        for stats in (round_stats, self.stats):
            stats.update(asked, labels, oracle_labels)
        if len(labels) and (labels == 0.5).all():
            self.info(f"step {step}: the teacher answered only ties this round ({len(labels)} "
                      "equal): no preference to learn from (a sparse reward gives equal "
                      "segment returns; see docs/guide/teachers.md)", "yellow")
        quality: Quality = (float("nan"),) * 4
        flagged = self.flagged()  # label_quality=filter: flagged labelers' labels left out
        trusted = np.flatnonzero(~flagged_rows(got.labelers, flagged)) if flagged \
            else np.arange(len(labels))
        if self.rounds > 0 and len(trusted):
            quality = self.quality(answered.take(trusted), labels[trusted])
        if len(answered) and not got.saved:  # a person's terminal answers are saved as given
            runs = np.flatnonzero(np.r_[True, np.array(got.labelers[1:]) !=
                                        np.array(got.labelers[:-1])])
            for lo, hi in zip(runs, [*runs[1:], len(answered)], strict=True):
                self.record(answered.take(np.arange(lo, hi)), labels[lo:hi], got.labelers[lo],
                            save=False,
                            answers=got.answer_ids[lo:hi] if got.answer_ids else None,
                            timestamps=None if got.timestamps is None else got.timestamps[lo:hi])
            self.dataset.save(self.folder)  # labels are on disk at once
        if got.commit is not None:  # web: only now are the answers marked used in the store
            got.commit()
        return round_stats, quality

    def train_after_round(self) -> RewardTrainStats | None:
        """A round's reward training: up to ``reward_update`` epochs over every label
        (B-Pref), or with ``reward_schedule=passes`` the pretraining epochs over the first
        labels, once, and nothing in later rounds (the loops' :meth:`keep_training` trains
        between them). ``None`` when nothing was trained."""
        rows = self.training_rows()
        if not len(self.dataset) or (rows is not None and not len(rows)):
            return None
        if self.passes is None:
            fit = self.trainer.train(self.dataset, self.reward_update, rows=rows)
            self.epochs_trained += fit.epochs
            return fit
        if self.passes.pretrained:  # trained between the rounds: measure it on the newest
            trained, held = self.trainer.split(self.dataset, self.passes_rows(rows))
            self.trainer.measure_validation(self.dataset, trained, held)
            return None
        passes, done, steps = self.passes, 0, 0
        last: RewardTrainStats | None = None
        while passes.pretrained_epochs < passes.pretrain_epochs:  # in chunks: a pause between
            chunk = min(PRETRAIN_CHUNK_EPOCHS, passes.pretrain_epochs - passes.pretrained_epochs)
            last = self.trainer.train(self.dataset, chunk, target_accuracy=np.inf,
                                      rows=self.passes_rows(rows))
            passes.pretrained_epochs += last.epochs
            self.epochs_trained += last.epochs
            done, steps = done + last.epochs, steps + last.steps
            if self.pretraining_pause is not None and \
                    passes.pretrained_epochs < passes.pretrain_epochs:
                self.pretraining_pause()  # e.g. a checkpoint of the learner process
        passes.pretrained = True
        return dataclasses.replace(last, epochs=done, steps=steps) if last is not None else None

    def pretraining_left(self) -> bool:
        """``reward_schedule=passes``: pretraining began (a checkpoint taken during it) and
        has epochs left to run."""
        return self.passes is not None and not self.passes.pretrained \
            and 0 < self.passes.pretrained_epochs < self.passes.pretrain_epochs \
            and len(self.dataset) > 0

    def train_epoch(self) -> bool:
        """One more pass over the labels (those :meth:`train_after_round` trains on), as
        DRLHP's reward predictor trains continuously between its rounds (``train()``: one epoch
        per training step). Returns whether it trained (``False`` without labels)."""
        rows = self.training_rows()
        if self.passes is not None:
            rows = self.passes_rows(rows)
        if not len(self.dataset) or (rows is not None and not len(rows)):
            return False
        fit = self.trainer.train(self.dataset, 1, target_accuracy=np.inf, rows=rows)
        self.epochs_trained += fit.epochs
        self.reward_accuracy = fit.accuracy
        self.model_changed()
        return True

    def passes_rows(self, rows: np.ndarray | None) -> np.ndarray:
        """The newest ``reward_label_buffer`` labels, less those ``rows`` leaves out."""
        assert self.passes is not None
        newest = self.passes.rows(len(self.dataset))
        return newest if rows is None else np.intersect1d(newest, rows)

    def keep_training(self, steps: int) -> bool:
        """``reward_schedule=passes``: the label-passes owed for ``steps`` more agent steps,
        as minibatch steps over the newest labels (:meth:`RewardTrainer.train_passes`), once
        pretraining has run. Returns whether r̂ changed (the caller relabels); ``False``
        without the schedule."""
        if self.passes is None or not self.passes.pretrained or not len(self.dataset):
            return False
        due = self.passes.due(steps)
        rows = self.passes_rows(self.training_rows())
        if due == 0 or not len(rows):
            return False
        fit = self.trainer.train_passes(self.dataset, due, rows)
        self.epochs_trained += due * self.passes.batch_size / len(rows)  # label-passes
        self.reward_accuracy = fit.accuracy
        self.model_changed()
        return True

    def select_queries(self, store: Any, n: int, first: bool, min_episode: int,
                       usable: Callable[[np.ndarray], np.ndarray] | None) -> SegmentPairs:
        """This round's ``n`` queries (:class:`QuerySelector`; uniform in the first round).

        Raises:
            themis.agents.buffers.NoSegmentsError: no episode in the pool holds a whole segment.
        """
        return self.selector.select(store, n, self.model,
                                    self.dataset.observations[: len(self.dataset)], first,
                                    min_episode, usable)

    def oracle_labels(self, true_rewards: np.ndarray) -> np.ndarray:
        """The oracle teacher's labels of answered queries, ``(n, 2, H) -> (n,)`` (for the
        teacher's and the people's agreement with the oracle)."""
        return ORACLE.label(true_rewards[:, 0], true_rewards[:, 1])[1]

    def gold_queries(self, store: Any, n: int, min_episode: int,
                     usable: Callable[[np.ndarray], np.ndarray] | None,
                     ) -> tuple[SegmentPairs, np.ndarray] | None:
        """``n`` gold queries with their known answers: rows of the ``gold_path`` dataset, or
        uniform pairs from the query pool whose true returns differ most (the larger half of
        4·n candidates' return gaps; the answer is the higher return)."""
        if self.gold_dataset is not None and len(self.gold_dataset):
            d = self.gold_dataset
            rows = self.selector.rng.choice(len(d), size=min(n, len(d)), replace=False)
            pairs = SegmentPairs(d.observations[rows], d.actions[rows], d.true_rewards[rows],
                                 np.zeros((len(rows), 2), np.int64))
            return pairs, d.labels[rows].astype(np.float64)
        try:
            candidates = self.selector.select(store, 4 * n, self.model,
                                              self.dataset.observations[:0], True, min_episode,
                                              usable)
        except NoSegmentsError:
            return None
        true = candidates.true_rewards.sum(-1)
        gap = np.abs(true[:, 1] - true[:, 0])
        order = np.argsort(-gap, kind="stable")[:n]
        order = order[gap[order] > 0]
        return candidates.take(order), (true[order, 1] > true[order, 0]).astype(np.float64)

    def training_rows(self) -> np.ndarray | None:
        """Dataset rows to train on: all (``None``), or without the labels of flagged labelers
        (``label_quality=filter``: their earlier answers too; the labels stay on disk)."""
        flagged = self.flagged()
        if not flagged:
            return None
        return np.flatnonzero(~flagged_rows(self.dataset.labelers[: len(self.dataset)],
                                            flagged))

    def flagged(self) -> set[str]:
        """Web, ``label_quality=filter``: the flagged labelers (empty otherwise)."""
        return self.channel.flagged() if self.channel is not None else set()

    def record(self, pairs: SegmentPairs, labels: np.ndarray, labeler: str,
               save: bool = True, answers: list[str] | None = None,
               timestamps: np.ndarray | None = None) -> None:
        """Add labelled pairs to the dataset and (``save``) write it to ``preferences/``: the
        one place labels are written (a person's answer is recorded the moment it is given;
        ``answers``: the label-store answer IDs of web labels; ``timestamps``: when each was
        given, default now)."""
        self.dataset.add(pairs, labels, labeler=labeler, answers=answers, timestamps=timestamps)
        if save:
            self.dataset.save(self.folder)

    def set_margin(self, recent_returns: Sequence[float], recent_lengths: Sequence[int]) -> None:
        """B-Pref's margin: the mean return of the recent episodes scaled to one segment
        (``× segment / episode length``), with the env's time limit as the episode length
        (Atari: its frame limit in agent steps) or, without one, the recent mean length."""
        length = self.max_episode_steps or (float(np.mean(recent_lengths))
                                            if len(recent_lengths) else None)
        if len(recent_returns) and length:
            self.teacher.set_margin(float(np.mean(recent_returns)) * self.segment / length)
            self.warn_thresholds_off()
        elif self.teacher.margin == 0.0 and (self.teacher.eps_skip > 0
                                             or self.teacher.eps_equal > 0):
            self.info("no episode has ended yet, so the teacher has no margin: "
                      "teacher_eps_skip/teacher_eps_equal have no effect this round", "yellow")

    thresholds_off = False
    """The last margin made the skip/equal thresholds ≤ 0 (warned once until it changes)."""

    def warn_thresholds_off(self) -> None:
        """Say so when ``teacher_eps_skip`` / ``teacher_eps_equal`` > 0 but the margin is ≤ 0
        (recent returns ≤ 0: Pendulum, early HalfCheetah): thresholds ε × margin ≤ 0 skip
        nothing and make nothing equal (B-Pref's rule), so the teacher answers as the oracle
        would on those knobs. Once per stretch of such rounds."""
        effects = [effect for eps, effect in (
            (self.teacher.eps_skip, "teacher_eps_skip skips nothing"),
            (self.teacher.eps_equal, "teacher_eps_equal makes no pair equal")) if eps > 0]
        synthetic = getattr(self.channel, "teacher", None) is self.teacher  # not a person
        off = bool(effects) and synthetic and self.teacher.margin <= 0
        if off and not self.thresholds_off:
            self.info(f"teacher margin {self.teacher.margin:.3g} ≤ 0 (recent returns ≤ 0), so "
                      f"the thresholds ε × margin are ≤ 0: {' and '.join(effects)} while it "
                      "stays so, answering as the oracle there (B-Pref's rule; "
                      "docs/guide/teachers.md)", "yellow")
        self.thresholds_off = off

    def quality(self, pairs: SegmentPairs,
                labels: np.ndarray) -> Quality:
        """Held-out quality of the reward model on labelled pairs it was not trained on:
        accuracy against the labels and against the true returns' labels (ties excluded; the
        two differ when the teacher errs, e.g. a crowd), and Pearson / Spearman correlation of
        predicted (the ensemble mean r̂, without a method's bonus) and true returns of the ``2 n``
        segments."""
        accuracy = self.trainer.accuracy(pairs.observations, pairs.actions, labels)
        oracle = self.trainer.accuracy(pairs.observations, pairs.actions,
                                       self.oracle_labels(pairs.true_rewards))
        n, width, horizon = pairs.true_rewards.shape
        with eval_mode(self.model):  # r̂ itself: the agent's reward may add a method's bonus
            predicted = self.model.predict(pairs.observations.reshape(n * width * horizon, -1),
                                           pairs.actions.reshape(n * width * horizon, -1))
        predicted = predicted.reshape(n * width, horizon).sum(1)
        true = pairs.true_rewards.reshape(n * width, horizon).sum(1)
        pearson = spearman = float("nan")
        if len(true) > 2 and np.ptp(true) > 0 and np.ptp(predicted) > 0:
            # pandas' own correlations (Spearman on average ranks, as scipy.stats.spearmanr):
            # pandas is loaded by the run's label store anyway, scipy.stats would add ~1 s to
            # every run's start
            import pandas as pd

            both = pd.DataFrame({"predicted": predicted, "true": true})
            pearson = float(both.corr(method="pearson").iloc[0, 1])
            spearman = float(both.corr(method="spearman").iloc[0, 1])
        return accuracy, oracle, pearson, spearman

    def empty_pairs(self) -> SegmentPairs:
        """No segment pairs, with this dataset's shapes."""
        d = self.dataset
        obs = d.observations[:0]
        return SegmentPairs(np.zeros((0, *obs.shape[1:]), dtype=obs.dtype),
                            np.zeros((0, *d.actions.shape[1:]), dtype=np.float32),
                            np.zeros((0, d.width, d.segment), dtype=np.float32),
                            np.zeros((0, d.width), np.int64))

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Counters, ensemble, optimiser, generators and margin (the checkpoint's flat keys of
        earlier versions, so their checkpoints still load). Labels live in ``preferences/``."""
        return {
            "total_feedback": self.total_feedback, "labeled_feedback": self.labeled_feedback,
            "feedback_rounds": self.rounds, "reward_accuracy": self.reward_accuracy,
            "postponed_rounds": self.postponed_rounds,
            "epochs_trained": self.epochs_trained,
            "teacher_stats": vars(self.stats).copy(),
            "channel_state": self.channel.state_dict() if self.channel is not None else {},
            "reward_model": self.model.state_dict(),
            "reward_optimizer": self.trainer.optimizer.state_dict(),
            "reward_trainer_rng": self.trainer.rng.bit_generator.state,
            "teacher_rng": self.teacher.rng.bit_generator.state,
            "teacher_margin": self.teacher.margin,
            "dataset_size": len(self.dataset),
            "unreported_round": self.unreported,
            **{key: piece.state_dict() for key, piece in self.method_pieces().items()},
            **{key: value for method in self.methods
               for key, value in method.state_dict().items()},
        }

    def method_pieces(self) -> dict[str, Any]:
        """DRLHP's recipe pieces with a state of their own, by checkpoint key (the methods'
        states come from their own ``state_dict``)."""
        pieces = (("reward_l2", self.trainer.l2), ("reward_normaliser", self.normaliser),
                  ("reward_passes", self.passes))
        return {key: piece for key, piece in pieces if piece is not None}

    def load_state_dict(self, state: dict[str, Any], human_labels_kept: bool = True) -> None:
        """Continue from :meth:`state_dict`; the labels are read back from ``preferences/``
        (:meth:`resumed_dataset`).

        Raises:
            ConfigError: fewer labelled pairs on disk than the checkpoint counted.
        """
        self.total_feedback = int(state["total_feedback"])
        self.labeled_feedback = int(state["labeled_feedback"])
        self.rounds = int(state["feedback_rounds"])
        self.reward_accuracy = float(state["reward_accuracy"])
        self.postponed_rounds = int(state.get("postponed_rounds", 0))
        self.epochs_trained = float(state.get("epochs_trained", 0.0))  # older: none counted
        self.unreported = state.get("unreported_round")  # older checkpoints: none kept
        vars(self.stats).update(state["teacher_stats"])
        if self.channel is not None:  # e.g. a VLM's gold score (older checkpoints: none)
            self.channel.load_state_dict(state.get("channel_state", {}))
        if "reward_model" not in state:
            return
        self.model.load_state_dict(state["reward_model"])
        self.trainer.optimizer.load_state_dict(state["reward_optimizer"])
        self.trainer.rng.bit_generator.state = state["reward_trainer_rng"]
        self.teacher.rng.bit_generator.state = state["teacher_rng"]
        self.teacher.set_margin(state["teacher_margin"])
        for key, piece in self.method_pieces().items():
            if key in state:
                piece.load_state_dict(state[key])
        for method in self.methods:
            method.load_state_dict(state)
        self.dataset = self.resumed_dataset(int(state["dataset_size"]))
        self.reconcile_web_answers()

    def reconcile_web_answers(self) -> None:
        """Web: make the label store agree with the dataset on which answers were used (a
        crash between saving labels and marking them used). Skipped for datasets written
        before answer IDs were stored, whose people's labels carry none."""
        if self.channel is None:
            return
        saved = self.dataset.answer_ids()
        people = any(str(w).startswith("human:") for w in self.dataset.labelers[:len(self.dataset)])
        if saved or not people:
            changed = self.channel.reconcile(saved)
            if changed:
                self.info(f"label store reconciled with preferences/: {changed} queries "
                          "updated (answers saved or not saved before the crash)", "yellow")

    def resumed_dataset(self, size: int) -> PreferenceDataset:
        """The labels on disk: the ``size`` pairs the checkpoint counted, plus any later pair a
        person labelled (a labeler that is not ``synthetic(...)``), which is kept and counted —
        a synthetic teacher's later labels are dropped, it asks those queries again. (A web
        label's query counts as asked already: when it was posted before the checkpoint, or
        when the resumed round finds it posted, :meth:`round`.)

        A checkpoint that counted no pair (written before the first round) still keeps the
        people's labels given after it: they are read back, not overwritten by the next save.

        Raises:
            ConfigError: fewer pairs on disk than the checkpoint counted, or an unreadable
                ``preferences/`` folder.
        """
        d = self.dataset
        data = PreferenceDataset(d.capacity, d.segment, d.obs_dim, d.action_dim,
                                 metadata=d.metadata, obs_dtype=d.observations.dtype,
                                 frame_stack=d.frame_stack, rating_classes=d.rating_classes)
        try:
            saved = PreferenceDataset.load(self.folder)
        except FileNotFoundError as e:
            if size == 0:  # nothing labelled yet, nothing saved
                return data
            raise ConfigError(f"resume: {e}") from None
        except ValueError as e:
            raise ConfigError(f"resume: {e}") from None
        if len(saved) < size:
            raise ConfigError(f"resume: {self.folder} holds {len(saved)} labelled pairs, the "
                              f"checkpoint counted {size}")
        later = [i for i in range(size, len(saved))
                 if not str(saved.labelers[i]).startswith("synthetic")]
        asked = [not saved.answers[i] for i in later]  # web answers' queries: counted already
        saved.size = size
        data.extend(saved)
        for i, counted in zip(later, asked, strict=True):
            pair = SegmentPairs(saved.observations[i:i + 1], saved.actions[i:i + 1],
                                saved.true_rewards[i:i + 1], np.zeros((1, saved.width), np.int64))
            data.add(pair, saved.labels[i:i + 1], labeler=str(saved.labelers[i]),
                     answers=[str(saved.answers[i])])
            data.timestamps[len(data) - 1] = saved.timestamps[i]
            self.total_feedback += int(counted)
            self.labeled_feedback += 1
        return data
