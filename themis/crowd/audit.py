"""Audit of people's labels: who answered how, how well, and what it did to the reward model.

For runs labelled through the web teacher (``teacher_ui=web``, the run's ``labels.sqlite``,
:mod:`themis.crowd.label_store`), the run report
(:func:`themis.interpret.inspection.inspect_run`) gains a
"Labels" section (:func:`themis.crowd.audit_report.labels_section`) from the tables built here:

- per labeler: answers, skips, gold accuracy, agreement with the oracle label (the segments'
  true returns), Cohen's κ with each other labeler (:func:`cohen_kappa_table`; Cohen 1960),
  median seconds per answer and whether the labeler is flagged (gold accuracy below
  ``min_gold_accuracy`` after ``min_gold_answers`` gold answers, as ``label_quality=filter``);
  Fleiss' κ over all labelers (:func:`fleiss_kappa`; Fleiss 1971);
- people's answers against the oracle label (:func:`oracle_confusion`);
- the queries people disagreed on most, by the entropy of their answers (:func:`most_disputed`);
- (in :mod:`themis.crowd.audit_report`) the reward model's held-out accuracy with and without the
  flagged labelers' answers.

Only pairwise queries are audited: a store whose ``queries`` table has a ``rating_classes``
column keeps its rating queries (one segment, a class per answer) out. The store is only read.

    from themis.crowd.audit import load_answers, labeler_table
    labeler_table(load_answers("runs/.../labels.sqlite"))
"""

from __future__ import annotations

import sqlite3
import warnings
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

CATEGORIES = ("left", "equal", "right")
"""Names of the pairwise labels 0, 0.5 and 1 (0 = segment 1, the left clip, better)."""


class PairwiseAnswers(NamedTuple):
    """The pairwise queries of a label store and the answers to them.

    Attributes:
        queries: one row per query: ``id``, ``round``, ``clip``, ``segments`` (paths as stored),
            ``gold`` (known answer, NaN for a normal query), ``oracle`` (label of the true
            returns, NaN where the store has none).
        answers: one row per answer: ``query_id``, ``labeler``, ``label`` (0, 0.5, 1; NaN =
            skipped), ``created`` (Unix seconds), ordered by ``created``.
    """

    queries: pd.DataFrame
    answers: pd.DataFrame


def category(label: float) -> str:
    return "skipped" if np.isnan(label) else CATEGORIES[round(2 * label)]


# ------------------------------------------------------------------------ reading the store
def load_answers(path: str | Path) -> PairwiseAnswers:
    """Read the pairwise queries and their answers from a label store (``labels.sqlite``).

    Rating queries (``rating_classes`` not NULL, where the column exists) are left out; stores
    without ``gold`` / ``oracle`` columns read as NaN there. Nothing is written.

    Raises:
        FileNotFoundError: no file at ``path``.
        themis.crowd.label_store.UnsafeStoreError: not Themis's schema (a view, a trigger).
    """
    from themis.crowd.label_store import check_schema

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no label store at {path}")
    db = sqlite3.connect(path, timeout=30.0)
    try:
        db.execute("PRAGMA trusted_schema=OFF")
        check_schema(db, path)  # a received store: no view stands in for a table
        columns = {row[1] for row in db.execute("PRAGMA table_info(queries)")}
        pairwise = "WHERE q.rating_classes IS NULL" if "rating_classes" in columns else ""
        gold = "q.gold" if "gold" in columns else "NULL"
        oracle = "q.oracle" if "oracle" in columns else "NULL"
        queries = pd.DataFrame(db.execute(
            f"SELECT q.id, q.round, q.clip, q.segments, {gold}, {oracle} FROM queries q "
            f"{pairwise} ORDER BY q.id").fetchall(),
            columns=["id", "round", "clip", "segments", "gold", "oracle"])
        answers = pd.DataFrame(db.execute(
            f"SELECT a.query_id, a.labeler, a.label, a.created FROM answers a JOIN queries q "
            f"ON q.id = a.query_id {pairwise} ORDER BY a.created, a.id").fetchall(),
            columns=["query_id", "labeler", "label", "created"])
    finally:
        db.close()
    for frame, floats in ((queries, ("gold", "oracle")), (answers, ("label", "created"))):
        for column in floats:
            frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    return PairwiseAnswers(queries, answers)


# ------------------------------------------------------------------------ agreement
def fleiss_kappa(counts: np.ndarray) -> float:
    """Fleiss' κ of ``N`` subjects each rated by the same number ``n`` of raters.

    κ = (P̄ − P̄ₑ) / (1 − P̄ₑ), with P̄ the mean over subjects of the share of agreeing rater
    pairs, Pᵢ = (Σⱼ nᵢⱼ² − n) / (n (n − 1)), and P̄ₑ = Σⱼ pⱼ² for the overall category shares
    pⱼ (Fleiss 1971, "Measuring nominal scale agreement among many raters", Psychological
    Bulletin 76(5), Eqs. 1–9). 1 = perfect agreement, 0 = what chance gives, < 0 = less.

    Args:
        counts: ``(N, k)`` how many raters put subject ``i`` in category ``j``; every row sums
            to the same ``n >= 2``.

    Returns:
        κ, or NaN when every rating falls in one category (P̄ₑ = 1: κ is undefined).

    Raises:
        ValueError: not a 2-D array of non-negative counts, no subjects, rows with different
            sums, or fewer than 2 ratings per subject.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2 or len(counts) == 0 or (counts < 0).any():
        raise ValueError(f"counts must be a non-empty (subjects, categories) array of "
                         f"non-negative counts, got shape {counts.shape}")
    raters = counts.sum(1)
    if not np.all(raters == raters[0]) or raters[0] < 2:
        raise ValueError(f"every subject needs the same number (>= 2) of ratings, got "
                         f"{sorted(set(raters.astype(int).tolist()))}")
    n = raters[0]
    shares = counts.sum(0) / counts.sum()
    agreement = ((counts**2).sum(1) - n) / (n * (n - 1))
    chance = float((shares**2).sum())
    if chance >= 1.0 - 1e-12:
        return float("nan")
    return float((agreement.mean() - chance) / (1.0 - chance))


def crowd_fleiss_kappa(data: PairwiseAnswers) -> tuple[float, int, int]:
    """Fleiss' κ (:func:`fleiss_kappa`) over the three pairwise categories, skips excluded.

    Fleiss' κ needs the same number of ratings per subject, so only the queries with the most
    common number ``n >= 2`` of non-skip answers count (the larger ``n`` on a tie).

    Returns:
        ``(κ, queries used, n)``; ``(NaN, 0, 0)`` when no query has two non-skip answers.
    """
    given = data.answers.dropna(subset=["label"])
    per_query = given.groupby("query_id")["label"].apply(list)
    sizes = Counter(len(labels) for labels in per_query if len(labels) >= 2)
    if not sizes:
        return float("nan"), 0, 0
    n = max(sizes, key=lambda size: (sizes[size], size))
    counts = np.array([[sum(category(x) == c for x in labels) for c in CATEGORIES]
                       for labels in per_query if len(labels) == n])
    return fleiss_kappa(counts), len(counts), n


def cohen_kappa_table(data: PairwiseAnswers) -> pd.DataFrame:
    """Cohen's κ of every two labelers on the queries both answered, skips excluded
    (Cohen 1960, "A coefficient of agreement for nominal scales"; scikit-learn's
    ``cohen_kappa_score`` over the categories left / equal / right).

    Returns:
        a symmetric ``(L, L)`` frame indexed by labeler (sorted) both ways; NaN on the diagonal,
        for pairs with no shared query, and where κ is undefined (both gave one same answer
        throughout: chance agreement 1).
    """
    from sklearn.metrics import cohen_kappa_score

    given = data.answers.dropna(subset=["label"])
    wide = given.pivot_table(index="query_id", columns="labeler", values="label",
                             aggfunc="first")
    names = sorted(data.answers["labeler"].unique())
    table = pd.DataFrame(np.nan, index=names, columns=names)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if a not in wide or b not in wide:
                continue
            both = wide[[a, b]].dropna()
            if len(both) == 0:
                continue
            with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
                warnings.simplefilter("ignore")  # undefined κ warns and gives NaN
                kappa = cohen_kappa_score([category(x) for x in both[a]],
                                          [category(x) for x in both[b]],
                                          labels=list(CATEGORIES))
            table.loc[a, b] = table.loc[b, a] = float(kappa)
    return table


def labeler_table(data: PairwiseAnswers, min_gold_answers: int = 5,
                  min_gold_accuracy: float = 0.7) -> pd.DataFrame:
    """One row per labeler (sorted by name), with the same definitions as
    :func:`themis.crowd.aggregation.labeler_scores` on pairwise queries only.

    Columns: ``answers`` (skips included), ``skips``, ``gold_answers`` (non-skip answers to gold
    queries), ``gold_accuracy`` (share of those equal to the known answer), ``oracle_agreement``
    (share of non-skip answers equal to the oracle label, on queries that have one),
    ``median_seconds`` (between the labeler's consecutive answers), ``flagged`` (gold accuracy
    below ``min_gold_accuracy`` after ``min_gold_answers`` gold answers), then ``kappa_NAME``:
    Cohen's κ with each labeler (:func:`cohen_kappa_table`). Rates with no answer to count are
    NaN.
    """
    merged = data.answers.merge(data.queries[["id", "gold", "oracle"]], left_on="query_id",
                                right_on="id", how="left")
    rows = []
    for name, mine in merged.groupby("labeler", sort=True):
        given = mine.dropna(subset=["label"])
        gold = given.dropna(subset=["gold"])
        oracle = given.dropna(subset=["oracle"])
        gold_accuracy = float((gold["label"] == gold["gold"]).mean()) if len(gold) else np.nan
        times = np.diff(mine["created"].to_numpy())
        rows.append({
            "labeler": name, "answers": len(mine), "skips": len(mine) - len(given),
            "gold_answers": len(gold), "gold_accuracy": gold_accuracy,
            "oracle_agreement": float((oracle["label"] == oracle["oracle"]).mean())
            if len(oracle) else np.nan,
            "median_seconds": float(np.median(times)) if len(times) else np.nan,
            "flagged": bool(len(gold) >= min_gold_answers and gold_accuracy < min_gold_accuracy),
        })
    table = pd.DataFrame(rows, columns=["labeler", "answers", "skips", "gold_answers",
                                        "gold_accuracy", "oracle_agreement", "median_seconds",
                                        "flagged"]).set_index("labeler")
    kappas = cohen_kappa_table(data)
    for other in kappas.columns:
        table[f"kappa_{other}"] = kappas[other]
    return table


def oracle_confusion(data: PairwiseAnswers, include_gold: bool = True) -> pd.DataFrame:
    """Counts of people's answers against the oracle label of the same query.

    Args:
        include_gold: count the answers to gold queries too.

    Returns:
        a ``(4, 3)`` frame of ints: rows ``people left / equal / right / skipped``, columns
        ``oracle left / equal / right``. Queries without an oracle label are not counted.
    """
    queries = data.queries if include_gold else data.queries[data.queries["gold"].isna()]
    merged = data.answers.merge(queries[["id", "oracle"]].dropna(subset=["oracle"]),
                                left_on="query_id", right_on="id")
    table = pd.DataFrame(0, index=[f"people {c}" for c in (*CATEGORIES, "skipped")],
                         columns=[f"oracle {c}" for c in CATEGORIES])
    for label, oracle in zip(merged["label"], merged["oracle"], strict=True):
        table.loc[f"people {category(label)}", f"oracle {category(oracle)}"] += 1
    return table


def most_disputed(data: PairwiseAnswers, top: int = 10) -> pd.DataFrame:
    """The queries people disagreed on most: the Shannon entropy (bits) of their non-skip
    answers over left / equal / right, for queries with at least two of them; queries all
    answered alike are left out. Ties: more answers first, then the older query.

    Returns:
        up to ``top`` rows ``query_id``, ``clip``, ``gold``, ``oracle``, ``entropy``, ``answers``
        (``"NAME: left, NAME: skipped, ..."`` in the order given), most disputed first.
    """
    rows = []
    queries = data.queries.set_index("id")
    for qid, given in data.answers.groupby("query_id"):
        labels = [category(x) for x in given["label"] if not np.isnan(x)]
        if len(labels) < 2:
            continue
        shares = np.array(list(Counter(labels).values())) / len(labels)
        entropy = float(-(shares * np.log2(shares)).sum())
        if entropy <= 0:
            continue
        q = queries.loc[qid]
        rows.append({"query_id": int(qid), "clip": q["clip"], "gold": q["gold"],
                     "oracle": q["oracle"], "entropy": entropy, "given": len(labels),
                     "answers": ", ".join(f"{who}: {category(x)}" for who, x in
                                          zip(given["labeler"], given["label"], strict=True))})
    columns = ["query_id", "clip", "gold", "oracle", "entropy", "answers"]
    if not rows:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame(rows).sort_values(["entropy", "given", "query_id"],
                                           ascending=[False, False, True])
    return table[columns].head(top).reset_index(drop=True)
