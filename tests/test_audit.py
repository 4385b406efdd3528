"""Audit of people's labels: per-labeler scores, κ, confusion, disputes, the report section."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from themis.agents.buffers import SegmentPairs
from themis.crowd.audit import (
    cohen_kappa_table,
    crowd_fleiss_kappa,
    fleiss_kappa,
    labeler_table,
    load_answers,
    most_disputed,
    oracle_confusion,
)
from themis.crowd.audit_report import held_out_accuracy, labels_section
from themis.crowd.label_store import LabelStore
from themis.interpret import inspection

WEIGHTS = np.array([1.0, -2.0, 0.5], np.float32)
"""The true reward of the crowd's env: linear in the observation (easy to learn)."""


def pairs_with_returns(rng: np.random.Generator, n: int, horizon: int = 5) -> SegmentPairs:
    obs = rng.normal(size=(n, 2, horizon, 3)).astype(np.float32)
    return SegmentPairs(obs, rng.normal(size=(n, 2, horizon, 1)).astype(np.float32),
                        obs @ WEIGHTS, np.zeros((n, 2), np.int64))


def oracle_of(store: LabelStore, qid: int) -> float:
    return float(store.db.execute("SELECT oracle FROM queries WHERE id=?", (qid,)).fetchone()[0])


def post(store: LabelStore, tmp_path: Path, pairs: SegmentPairs, needed: int,
         gold: np.ndarray | None = None) -> list[int]:
    first = store.db.execute("SELECT COUNT(*) FROM queries").fetchone()[0]
    clips = [tmp_path / "web" / "clips" / f"round0001_{first + i:03d}.mp4"
             for i in range(len(pairs))]
    for clip in clips:
        clip.parent.mkdir(parents=True, exist_ok=True)
        clip.write_bytes(b"mp4")
    return store.post(1, pairs, clips, needed, gold)


def copy_store(run: Path, to: Path) -> None:
    """Copy a run's label store, its WAL included (SQLite's backup API)."""
    src, dst = sqlite3.connect(run / "labels.sqlite"), sqlite3.connect(to / "labels.sqlite")
    src.backup(dst)
    src.close()
    dst.close()


@pytest.fixture(scope="module")
def crowd(tmp_path_factory) -> tuple[Path, dict[str, list[int]]]:
    """A run dir with a store: two careful labelers (careful2 errs on two queries), an
    adversary who flips every answer, 10 gold queries answered by all three (the adversary is
    flagged), 60 queries answered by the adversary alone, 30 by the careful ones (10 by both)
    and one query whose three answers all differ."""
    run = tmp_path_factory.mktemp("run")
    store = LabelStore(run / "labels.sqlite", run / "web")
    rng = np.random.default_rng(0)
    gold_pairs = pairs_with_returns(rng, 10)
    gold = np.array([float(x) for x in
                     np.where(gold_pairs.true_rewards.sum(-1)[:, 1] >
                              gold_pairs.true_rewards.sum(-1)[:, 0], 1.0, 0.0)])
    ids = {"gold": post(store, run, gold_pairs, 3, gold),
           "adversary": post(store, run, pairs_with_returns(rng, 60), 1),
           "careful": post(store, run, pairs_with_returns(rng, 30), 2),
           "contested": post(store, run, pairs_with_returns(rng, 1), 3)}
    for qid in ids["gold"]:
        truth = oracle_of(store, qid)
        store.answer(qid, "careful1", truth)
        store.answer(qid, "careful2", truth)
        store.answer(qid, "adversary", 1.0 - truth)
    for qid in ids["adversary"]:
        store.answer(qid, "adversary", 1.0 - oracle_of(store, qid))
    for i, qid in enumerate(ids["careful"]):
        truth = oracle_of(store, qid)
        if i < 20:
            store.answer(qid, "careful1" if i % 2 else "careful2", truth)
        else:  # both: careful2 errs on two of them
            store.answer(qid, "careful1", truth)
            store.answer(qid, "careful2", 1.0 - truth if i < 22 else truth)
    (qid,) = ids["contested"]
    truth = oracle_of(store, qid)
    store.answer(qid, "careful1", truth)
    store.answer(qid, "careful2", 0.5)
    store.answer(qid, "adversary", 1.0 - truth)
    return run, ids


# ------------------------------------------------------------------------ agreement
def test_fleiss_kappa_matches_the_textbook_example():
    # Fleiss' κ article on Wikipedia: 10 subjects, 14 raters, 5 categories; P̄ = 0.378,
    # P̄e = 0.213, κ = 0.210
    counts = np.array([[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0],
                       [2, 2, 8, 1, 1], [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2],
                       [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]])
    assert fleiss_kappa(counts) == pytest.approx(0.2099, abs=1e-4)


def test_fleiss_kappa_by_hand_and_its_edge_cases():
    # 2 raters, 4 subjects: agree on 3 (P_i = 1), split on 1 (P_i = 0) -> P̄ = 3/4;
    # shares (5/8, 3/8) -> P̄e = 34/64; κ = (48/64 - 34/64) / (30/64) = 7/15
    assert fleiss_kappa(np.array([[2, 0], [0, 2], [2, 0], [1, 1]])) == pytest.approx(7 / 15)
    # agree on half, shares (1/2, 1/2): P̄ = P̄e = 1/2, κ = 0 (chance)
    assert fleiss_kappa(np.array([[2, 0], [0, 2], [1, 1], [1, 1]])) == pytest.approx(0.0)
    assert fleiss_kappa(np.array([[3, 0, 0], [0, 0, 3]])) == pytest.approx(1.0)
    assert np.isnan(fleiss_kappa(np.array([[2, 0], [2, 0]])))  # one category: undefined
    with pytest.raises(ValueError, match="same number"):
        fleiss_kappa(np.array([[2, 0], [1, 2]]))
    with pytest.raises(ValueError, match="same number"):
        fleiss_kappa(np.array([[1, 0], [0, 1]]))
    with pytest.raises(ValueError, match="non-empty"):
        fleiss_kappa(np.zeros((0, 3)))


def test_the_adversary_disagrees_with_the_oracle_and_is_flagged(crowd):
    run, _ = crowd
    table = labeler_table(load_answers(run / "labels.sqlite"), 5, 0.7)
    assert list(table.index) == ["adversary", "careful1", "careful2"]
    adv, c1, c2 = (table.loc[n] for n in table.index)
    assert adv["oracle_agreement"] == 0.0 and adv["gold_accuracy"] == 0.0 and adv["flagged"]
    assert adv["answers"] == 71 and adv["gold_answers"] == 10
    assert c1["oracle_agreement"] == 1.0 and not c1["flagged"]
    assert c2["oracle_agreement"] == pytest.approx(28 / 31)  # 2 flips, 1 'equal', 31 answers
    assert not c2["flagged"] and c2["gold_accuracy"] == 1.0
    # κ on the shared queries: the adversary against a careful labeler is below chance
    assert adv["kappa_careful1"] < 0 and table.loc["careful1", "kappa_adversary"] < 0
    assert c1["kappa_careful2"] > 0.5
    assert np.isnan(c1["kappa_careful1"])
    # fewer gold answers than min_gold_answers: nobody can be flagged yet
    assert not labeler_table(load_answers(run / "labels.sqlite"), 11, 0.7)["flagged"].any()


def test_cohen_kappa_by_hand():
    # a and b on 4 queries: left/left, right/right, left/right, right/right. p_o = 3/4;
    # a: 2 left, 2 right; b: 1 left, 3 right -> p_e = (2·1 + 2·3)/16 = 1/2; κ = 1/2
    answers = pd.DataFrame({"query_id": [1, 1, 2, 2, 3, 3, 4, 4],
                            "labeler": ["a", "b"] * 4,
                            "label": [0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0],
                            "created": np.arange(8.0)})
    queries = pd.DataFrame({"id": [1, 2, 3, 4], "round": 1, "clip": "", "segments": "",
                            "gold": np.nan, "oracle": np.nan})
    from themis.crowd.audit import PairwiseAnswers

    kappa = cohen_kappa_table(PairwiseAnswers(queries, answers))
    assert kappa.loc["a", "b"] == pytest.approx(0.5) and kappa.loc["b", "a"] == kappa.loc["a", "b"]


def test_fleiss_kappa_of_the_crowd_counts_the_queries_with_the_most_common_answer_count(crowd):
    run, _ = crowd
    kappa, used, raters = crowd_fleiss_kappa(load_answers(run / "labels.sqlite"))
    # 10 gold queries and the contested one have 3 answers; 10 careful ones have 2
    assert (used, raters) == (11, 3)
    assert kappa < 0.2  # the adversary against the other two on every one of them


# ------------------------------------------------------------------------ confusion, disputes
def test_confusion_matrix_counts_answers_against_the_oracle_label(tmp_path):
    store = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    true = np.array([[[1.0], [0.0]], [[0.0], [1.0]], [[1.0], [1.0]], [[2.0], [0.0]],
                     [[0.0], [3.0]]], np.float32)  # oracle: left, right, equal, left, right
    n = len(true)
    pairs = SegmentPairs(np.zeros((n, 2, 1, 2), np.float32), np.zeros((n, 2, 1, 1), np.float32),
                         true, np.zeros((n, 2), np.int64))
    ids = post(store, tmp_path, pairs, 2, gold=np.array([np.nan] * 4 + [1.0]))
    for qid, label in zip(ids, (0.0, 0.0, None, 0.5, 1.0), strict=True):
        store.answer(qid, "a", label)
    store.answer(ids[0], "b", 1.0)
    data = load_answers(tmp_path / "labels.sqlite")
    table = oracle_confusion(data, include_gold=True)
    assert list(table.index) == ["people left", "people equal", "people right",
                                 "people skipped"]
    assert list(table.columns) == ["oracle left", "oracle equal", "oracle right"]
    expected = [[1, 0, 1], [1, 0, 0], [1, 0, 1], [0, 1, 0]]
    np.testing.assert_array_equal(table.to_numpy(), expected)
    without_gold = oracle_confusion(data, include_gold=False).to_numpy()
    np.testing.assert_array_equal(without_gold, [[1, 0, 1], [1, 0, 0], [1, 0, 0], [0, 1, 0]])


def test_rating_queries_are_left_out_of_the_audit(tmp_path):
    store = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    ids = post(store, tmp_path, pairs_with_returns(np.random.default_rng(1), 2), 1)
    store.answer(ids[0], "a", 0.0)
    store.answer(ids[1], "a", 1.0)
    rng = np.random.default_rng(2)
    (rated,) = store.post(2, SegmentPairs(rng.normal(size=(1, 1, 5, 3)).astype(np.float32),
                                          np.zeros((1, 1, 5, 1), np.float32),
                                          np.zeros((1, 1, 5)), np.zeros((1, 1), np.int64)),
                          [tmp_path / "r.mp4"], 1, rating_classes=5)
    store.answer(rated, "a", 4.0)
    data = load_answers(tmp_path / "labels.sqlite")
    assert list(data.queries["id"]) == ids and list(data.answers["query_id"]) == ids
    with sqlite3.connect(tmp_path / "labels.sqlite") as db:  # a store of an older version
        db.execute("DELETE FROM answers WHERE query_id=?", (rated,))
        db.execute("DELETE FROM queries WHERE id=?", (rated,))
        db.execute("ALTER TABLE queries DROP COLUMN rating_classes")
    assert len(load_answers(tmp_path / "labels.sqlite").queries) == 2  # no column: all pairwise


def test_most_disputed_puts_the_contested_query_first_and_links_its_clip(crowd):
    run, ids = crowd
    disputed = most_disputed(load_answers(run / "labels.sqlite"), top=10)
    (contested,) = ids["contested"]
    first = disputed.iloc[0]
    assert first["query_id"] == contested
    assert first["entropy"] == pytest.approx(np.log2(3))
    assert "careful2: equal" in first["answers"] and "adversary: " in first["answers"]
    assert len(disputed) == 10  # 10 gold + 2 careful splits + contested, top 10 kept
    assert (np.diff(disputed["entropy"].to_numpy()) <= 0).all()
    assert (run / first["clip"]).parent == run / "web" / "clips"  # stored relative to the run


# ------------------------------------------------------------------------ reward model
def test_held_out_accuracy_is_higher_without_the_flagged_adversary(crowd):
    run, ids = crowd
    data = load_answers(run / "labels.sqlite")
    result = held_out_accuracy(data, {"adversary"}, run, seed=0)
    answered = set(ids["adversary"]) | set(ids["careful"]) | set(ids["contested"])
    assert set(result.train_queries) | set(result.heldout_queries) == answered
    assert not set(result.train_queries) & set(result.heldout_queries)
    assert len(result.heldout_queries) == round(0.2 * len(answered))
    assert result.labels_without < result.labels_all
    assert result.accuracy_without >= 0.7
    assert result.accuracy_without > result.accuracy_all + 0.2
    nobody = held_out_accuracy(data, set(), run, seed=0)  # same seed, same model
    assert np.isnan(nobody.accuracy_without) and nobody.accuracy_all == result.accuracy_all
    with pytest.raises(ValueError, match="heldout_fraction"):
        held_out_accuracy(data, set(), run, heldout_fraction=1.0)


# ------------------------------------------------------------------------ the report
def test_labels_section_writes_tables_and_csvs(crowd):
    run, ids = crowd
    out = run / "report"
    text = "\n".join(labels_section(run, out))
    assert text.startswith("## Labels")
    for heading in ("### Labelers", "### People vs oracle", "### Most disputed queries",
                    "### Reward model with and without flagged labelers"):
        assert heading in text
    assert "| adversary | 71 | 0 | 10 | 0.00 | 0.00 |" in text and "| **yes** |" in text
    assert "Fleiss' κ (Fleiss 1971) over all labelers: **" in text
    assert "| without adversary |" in text
    (contested,) = ids["contested"]  # the most disputed query first, its clip linked
    clip = f"round0001_{contested - 1:03d}.mp4"
    assert f"| {contested} | [{clip}](../web/clips/{clip}) | " in text
    assert text.index(f"| {contested} | [") < text.index("(gold) | [")
    labelers = pd.read_csv(out / "labelers.csv", index_col="labeler")
    assert labelers.loc["adversary", "flagged"] and labelers.loc["adversary",
                                                                 "kappa_careful1"] < 0
    confusion = pd.read_csv(out / "label_confusion.csv", index_col=0)
    assert confusion.to_numpy().sum() == 71 + 31 + 31  # every answer has an oracle label
    assert confusion.loc["people right", "oracle left"] > 0  # the adversary's flips


def test_gold_thresholds_come_from_the_run_config(crowd, tmp_path):
    run, _ = crowd
    copy_store(run, tmp_path)
    shutil.copytree(run / "web", tmp_path / "web")  # a copied run: its queries' segments too
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("min_gold_answers: 20\n")
    text = "\n".join(labels_section(tmp_path, tmp_path / "report"))
    assert "gold accuracy below 0.7 after 20 gold answers" in text
    assert "No labeler is flagged" in text  # 10 gold answers < 20


def test_a_run_without_a_label_store_gets_no_labels_section(tmp_path):
    assert labels_section(tmp_path, tmp_path / "report") == []
    assert not (tmp_path / "report").exists()
    LabelStore(tmp_path / "labels.sqlite")  # a store nobody answered in yet
    assert labels_section(tmp_path, tmp_path / "report") == [
        "## Labels", "", "No answers to pairwise queries in `labels.sqlite` yet.", ""]


@pytest.mark.parametrize("with_store", [True, False])
def test_inspect_run_adds_the_labels_section_for_web_runs(crowd, tmp_path, monkeypatch,
                                                         with_store):
    run, _ = crowd
    if with_store:
        copy_store(run, tmp_path)
        (tmp_path / "web").symlink_to(run / "web")
    (tmp_path / "config.yaml").write_text("env: Pendulum-v1\nteacher_ui: web\n")
    closed = []
    fake = SimpleNamespace(facts=SimpleNamespace(env_id="Pendulum-v1"), reward_model=None,
                           driver=SimpleNamespace(NAME="sac"),
                           logger=SimpleNamespace(close=lambda: closed.append(True)))
    monkeypatch.setattr(inspection, "load_run", lambda *args, **kwargs: fake)
    text = inspection.inspect_run(tmp_path).read_text()
    assert closed and "## Teacher" in text and "## Configuration" in text
    assert ("## Labels" in text) == with_store
    assert (tmp_path / "report" / "labelers.csv").is_file() == with_store
    if with_store:
        assert text.index("## Labels") < text.index("## Labelled clips")
