"""Crowd quality control: label aggregation (majority, Dawid–Skene with gold clamped)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from themis.agents.buffers import SegmentPairs
from themis.crowd import aggregation as crowd
from themis.crowd.label_store import LabelStore


def crowd_store(tmp_path: Path, n: int = 60, gold_every: int = 6,
                seed: int = 0) -> tuple[LabelStore, list[int], np.ndarray]:
    """``n`` queries answered by a careful labeler (10 % mistakes), an adversary (every answer
    flipped) and a random clicker; every ``gold_every``-th query is gold."""
    rng = np.random.default_rng(seed)
    true = rng.normal(size=(n, 2, 5)).astype(np.float32)
    oracle = (true[:, 1].sum(-1) > true[:, 0].sum(-1)).astype(np.float64)
    pairs = SegmentPairs(rng.normal(size=(n, 2, 5, 3)).astype(np.float32),
                         np.zeros((n, 2, 5, 1), np.float32), true, np.zeros((n, 2), np.int64))
    gold = np.where(np.arange(n) % gold_every == 0, oracle, np.nan)
    store = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    ids = store.post(1, pairs, [tmp_path / f"c{i}.mp4" for i in range(n)], labels_needed=3,
                     gold=gold)
    for qid, truth in zip(ids, oracle, strict=True):
        store.answer(qid, "careful", 1 - truth if rng.random() < 0.1 else truth)
        store.answer(qid, "adversary", 1 - truth)
        store.answer(qid, "random", float(rng.integers(2)))
    return store, ids, oracle


def test_majority_counts_left_and_right_and_ties_give_equal():
    assert crowd.majority([0.0, 0.0, 1.0]) == 0.0
    assert crowd.majority([1.0, 0.5, 1.0]) == 1.0
    assert crowd.majority([0.0, 1.0, 0.5]) == 0.5


def test_dawid_skene_reads_an_adversary_flipped_and_beats_the_majority(tmp_path):
    store, ids, oracle = crowd_store(tmp_path)
    truth = dict(zip(ids, oracle, strict=True))
    majority = store.gather("majority")
    model = store.gather("model")
    normal = [q for i, q in enumerate(ids) if i % 6]  # gold queries give no training label
    assert len(model.labels) == len(majority.labels) == len(normal)

    def agreement(got) -> float:
        return float(np.mean([label == truth[q] for q, label in zip(normal, got.labels,
                                                                    strict=True)]))

    # careful 90 % right, adversary 0 %, random 50 %: the majority follows the random
    # clicker's coin whenever careful and adversary disagree (always); Dawid–Skene learns the
    # adversary's confusion matrix and reads its answers flipped
    assert agreement(majority) < 0.7
    assert agreement(model) >= 0.95
    assert model.labelers[0] == "human:model:careful,adversary,random"
    assert model.answer_ids[0].count(";") == 2  # the three answers behind the label


def test_dawid_skene_keeps_gold_answers_clamped_and_checks_labels():
    answers = [(1, "a", 0.0), (1, "b", 0.0), (2, "a", 1.0), (2, "b", 1.0)]
    assert crowd.dawid_skene(answers, gold={1: 1.0})[1] == 1.0  # the known answer wins
    assert crowd.dawid_skene(answers)[2] == 1.0
    assert crowd.dawid_skene([]) == {}
    with pytest.raises(ValueError, match=r"0, 0\.5 or 1"):
        crowd.dawid_skene([(1, "a", 2.0)])


@pytest.mark.parametrize("overrides,message", [
    (["gold_fraction=0.1"], "gold_fraction=0.1 check people labeling on the web page"),
    (["label_quality=model", "labels_per_query=3"], "with a synthetic teacher they do nothing"),
    (["human_teacher=true", "human_piped=true", "gold_fraction=0.2", "label_quality=filter"],
     "gold_fraction=0.2 and label_quality=filter check people labeling on the web page "
     "(human_teacher=true teacher_ui=web); with a person in the terminal"),
])
def test_crowd_keys_without_people_on_the_web_are_refused(compose, overrides, message):
    from omegaconf import OmegaConf

    from themis.run.validation import validate
    from themis.utils import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(OmegaConf.to_object(compose(overrides)))
