"""Turning several people's answers to one query into one training label.

The label store (:mod:`themis.crowd.label_store`) gathers each complete query's answers; this module
decides what they become (``label_aggregate`` and ``label_quality``):

- ``each``: every answer is its own training label;
- ``majority``: the most common non-skip answer (a left/right tie gives 0.5);
- ``model`` (``label_quality=model``): Dawid–Skene (Dawid & Skene 1979, "Maximum likelihood
  estimation of observer error-rates using the EM algorithm", Applied Statistics 28(1)) fitted
  by Toloka's ``crowd-kit`` (``crowdkit.aggregation.DawidSkene``) on every pairwise answer in the
  store, with the known answers of gold queries clamped (its ``true_labels``). Each labeler gets
  a full confusion matrix over {left, equal, right}, so a random clicker's answers count little
  and an adversary's are read flipped; the label is the class with the highest posterior.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from themis.core.run_keys import RunKeys
from themis.utils import ConfigError

CLASSES = {0.0: "left", 0.5: "equal", 1.0: "right"}
"""crowd-kit works on label names; ours are B-Pref's 0 / 0.5 / 1."""
_VALUES = {name: value for value, name in CLASSES.items()}

Answer = tuple[int, str, float]
"""``(query ID, labeler, label)`` with label 0, 0.5 or 1 (skips left out)."""


def majority(labels: Sequence[float]) -> float:
    """The most common of ``labels`` (0, 0.5, 1): left or right by count, 0.5 on a tie."""
    values = np.asarray(labels, dtype=np.float64)
    left, right = (values == 0.0).sum(), (values == 1.0).sum()
    return 0.0 if left > right else 1.0 if right > left else 0.5


def dawid_skene(answers: Sequence[Answer], gold: dict[int, float] | None = None,
                n_iter: int = 100) -> dict[int, float]:
    """Dawid–Skene labels of every query in ``answers`` (crowd-kit's EM).

    Args:
        answers: every pairwise answer known (the more, the better the labelers' confusion
            matrices), skips left out.
        gold: known answers of gold queries, clamped during EM (``true_labels``).
        n_iter: EM iterations at most.

    Returns:
        ``{query ID: label}`` (0, 0.5 or 1) for each query with an answer; gold queries keep
        their known answer.

    Raises:
        ValueError: a label other than 0, 0.5 or 1.
    """
    import pandas as pd
    from crowdkit.aggregation import DawidSkene  # imported on use: ~1 s

    if not answers:
        return {}
    bad = {label for _, _, label in answers if label not in CLASSES}
    if bad:
        raise ValueError(f"labels must be 0, 0.5 or 1, got {sorted(bad)}")
    data = pd.DataFrame([(q, w, CLASSES[float(lab)]) for q, w, lab in answers],
                        columns=["task", "worker", "label"])
    tasks, seen = set(data["task"]), set(data["label"])
    # crowd-kit needs every class it clamps to appear among the answers
    known = {q: CLASSES[float(lab)] for q, lab in (gold or {}).items()
             if q in tasks and CLASSES[float(lab)] in seen}
    model = DawidSkene(n_iter=n_iter)
    with warnings.catch_warnings():  # crowd-kit 1.4 on pandas 3: deprecation notices only
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        predicted = model.fit_predict(data, true_labels=pd.Series(known) if known else None)
    out = {int(q): _VALUES[str(lab)] for q, lab in predicted.items()}
    out.update({q: _VALUES[lab] for q, lab in known.items()})
    return out


def labeler_scores(store: Any, min_gold_answers: int = 5,
                   min_gold_accuracy: float = 0.7) -> list[dict[str, Any]]:
    """Each labeler's live scores in a :class:`themis.crowd.label_store.LabelStore` (skips excluded
    from the rates).

    Returns:
        one dict per labeler: ``labeler``, ``answers``, ``gold_answers``, ``gold_accuracy``
        (share of gold queries answered with the known answer; NaN before any), ``agreement``
        (share of the other labelers' answers to the same queries that match), ``oracle_
        agreement`` (with the true returns: for the audit, never used to aggregate),
        ``median_seconds`` (between consecutive answers), ``flagged`` (gold accuracy below
        ``min_gold_accuracy`` after ``min_gold_answers`` gold answers).
    """
    rows = store.db.execute(
        "SELECT a.labeler, a.query_id, a.label, a.created, q.gold, q.oracle FROM answers a "
        "JOIN queries q ON q.id = a.query_id ORDER BY a.created").fetchall()
    by_query: dict[int, list[tuple[str, float]]] = {}
    for who, qid, label, *_ in rows:
        if label is not None:
            by_query.setdefault(int(qid), []).append((who, float(label)))
    out = []
    for name in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == name]
        labelled = [r for r in mine if r[2] is not None]
        gold = [r for r in labelled if r[4] is not None]
        gold_acc = float(np.mean([r[2] == r[4] for r in gold])) if gold else float("nan")
        agree = [label == other for _, qid, label, *_ in labelled
                 for who, other in by_query[int(qid)] if who != name]
        oracle = [r[2] == r[5] for r in labelled if r[5] is not None]
        times = np.diff([r[3] for r in mine])
        out.append({
            "labeler": name, "answers": len(mine), "gold_answers": len(gold),
            "gold_accuracy": gold_acc,
            "agreement": float(np.mean(agree)) if agree else float("nan"),
            "oracle_agreement": float(np.mean(oracle)) if oracle else float("nan"),
            "median_seconds": float(np.median(times)) if len(times) else float("nan"),
            "flagged": bool(len(gold) >= min_gold_answers and gold_acc < min_gold_accuracy),
        })
    return out


def flagged(store: Any, min_gold_answers: int = 5, min_gold_accuracy: float = 0.7) -> set[str]:
    """Labelers whose gold accuracy is below ``min_gold_accuracy`` after
    ``min_gold_answers`` gold answers."""
    return {s["labeler"] for s in labeler_scores(store, min_gold_answers, min_gold_accuracy)
            if s["flagged"]}


def check_crowd(cfg: RunKeys) -> None:
    """The crowd keys (``label_quality``, gold, aggregation) of a run config.

    Raises:
        ConfigError: one line naming the key, the problem and the fix.
    """
    if cfg.label_quality not in ("none", "filter", "model"):
        raise ConfigError(f"label_quality={cfg.label_quality} is unknown; use none, filter or "
                          "model")
    crowd_keys = [f"{key}={getattr(cfg, key)}" for key, unset in (
        ("gold_fraction", 0), ("gold_path", None), ("label_quality", "none"))
        if getattr(cfg, key) not in (unset, "")]
    vlm_gold = getattr(cfg, "vlm_gold_from", "none") == "oracle"  # a VLM scored on gold
    if vlm_gold:
        crowd_keys = [key for key in crowd_keys if not key.startswith("gold_fraction=")]
    if crowd_keys and not (cfg.human_teacher and cfg.teacher_ui == "web"):
        teacher = "a person in the terminal" if cfg.human_teacher else "a synthetic teacher"
        raise ConfigError(f"{' and '.join(crowd_keys)} check people labeling on the web page "
                          f"(human_teacher=true teacher_ui=web); with {teacher} they do "
                          "nothing: drop them (scripts/simulate_crowd.py simulates a crowd)")
    if cfg.label_quality == "filter" and cfg.gold_fraction == 0 and not cfg.gold_path:
        raise ConfigError("label_quality=filter scores labelers on gold queries: set "
                          "gold_fraction (e.g. 0.1)")
    if cfg.label_quality == "model" and cfg.labels_per_query < 2 and cfg.gold_fraction == 0 \
            and not cfg.gold_path:
        raise ConfigError("label_quality=model learns how reliable each labeler is from queries "
                          "several people answered or from gold: set labels_per_query=3 or "
                          "gold_fraction=0.1")
    if cfg.label_aggregate not in ("each", "majority"):
        raise ConfigError(f"label_aggregate={cfg.label_aggregate} is unknown; use each or "
                          "majority")
