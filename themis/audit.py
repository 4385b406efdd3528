"""Audit of people's labels: who answered how, how well, and what it did to the reward model.

For runs labelled through the web teacher (``teacher_ui=web``, the run's ``labels.sqlite``,
:mod:`themis.label_store`), the run report (:func:`themis.inspection.inspect_run`) gains a
"Labels" section built here (:func:`labels_section`):

- per labeler: answers, skips, gold accuracy, agreement with the oracle label (the segments'
  true returns), Cohen's κ with each other labeler (:func:`cohen_kappa_table`; Cohen 1960),
  median seconds per answer and whether the labeler is flagged (gold accuracy below
  ``min_gold_accuracy`` after ``min_gold_answers`` gold answers, as ``label_quality=filter``);
  Fleiss' κ over all labelers (:func:`fleiss_kappa`; Fleiss 1971);
- people's answers against the oracle label (:func:`oracle_confusion`);
- the queries people disagreed on most, by the entropy of their answers (:func:`most_disputed`);
- the reward model's held-out accuracy with and without the flagged labelers' answers
  (:func:`held_out_accuracy`): a small ensemble trained twice on the same queries.

Only pairwise queries are audited: a store whose ``queries`` table has a ``rating_classes``
column keeps its rating queries (one segment, a class per answer) out. The store is only read.

    from themis.audit import load_answers, labeler_table
    labeler_table(load_answers("runs/.../labels.sqlite"))
"""

from __future__ import annotations

import math
import os
import sqlite3
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

import numpy as np
import pandas as pd
import torch

from themis.buffers import SegmentPairs
from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer

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


def _category(label: float) -> str:
    return "skipped" if np.isnan(label) else CATEGORIES[round(2 * label)]


# ------------------------------------------------------------------------ reading the store
def load_answers(path: str | Path) -> PairwiseAnswers:
    """Read the pairwise queries and their answers from a label store (``labels.sqlite``).

    Rating queries (``rating_classes`` not NULL, where the column exists) are left out; stores
    without ``gold`` / ``oracle`` columns read as NaN there. Nothing is written.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no label store at {path}")
    db = sqlite3.connect(path, timeout=30.0)
    try:
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
    counts = np.array([[sum(_category(x) == c for x in labels) for c in CATEGORIES]
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
                kappa = cohen_kappa_score([_category(x) for x in both[a]],
                                          [_category(x) for x in both[b]],
                                          labels=list(CATEGORIES))
            table.loc[a, b] = table.loc[b, a] = float(kappa)
    return table


def labeler_table(data: PairwiseAnswers, min_gold_answers: int = 5,
                  min_gold_accuracy: float = 0.7) -> pd.DataFrame:
    """One row per labeler (sorted by name), with the same definitions as
    :func:`themis.crowd.labeler_scores` on pairwise queries only.

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
        table.loc[f"people {_category(label)}", f"oracle {_category(oracle)}"] += 1
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
        labels = [_category(x) for x in given["label"] if not np.isnan(x)]
        if len(labels) < 2:
            continue
        shares = np.array(list(Counter(labels).values())) / len(labels)
        entropy = float(-(shares * np.log2(shares)).sum())
        if entropy <= 0:
            continue
        q = queries.loc[qid]
        rows.append({"query_id": int(qid), "clip": q["clip"], "gold": q["gold"],
                     "oracle": q["oracle"], "entropy": entropy, "given": len(labels),
                     "answers": ", ".join(f"{who}: {_category(x)}" for who, x in
                                          zip(given["labeler"], given["label"], strict=True))})
    columns = ["query_id", "clip", "gold", "oracle", "entropy", "answers"]
    if not rows:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame(rows).sort_values(["entropy", "given", "query_id"],
                                           ascending=[False, False, True])
    return table[columns].head(top).reset_index(drop=True)


# ------------------------------------------------------------------------ reward model
class HeldOutAccuracy(NamedTuple):
    """Outcome of :func:`held_out_accuracy`.

    Attributes:
        train_queries, heldout_queries: query IDs of each split.
        scored: held-out queries with a strict oracle label (what the accuracies count).
        labels_all, labels_without: training labels with all answers / without the flagged
            labelers'.
        accuracy_all, accuracy_without: held-out accuracy of each model against the oracle
            label (``accuracy_without`` NaN when nobody is flagged or nothing is left to train
            on).
    """

    train_queries: list[int]
    heldout_queries: list[int]
    scored: int
    labels_all: int
    labels_without: int
    accuracy_all: float
    accuracy_without: float


def _resolve(stored: str, run_dir: Path | None, folder: str) -> Path:
    """A file of the store: ``RUN_DIR/web/FOLDER/NAME`` when it is there (the run may have been
    moved), else the stored path (a relative one read against the run dir)."""
    path = Path(stored)
    if run_dir is not None:
        moved = run_dir / "web" / folder / path.name
        if moved.is_file():
            return moved
        if not path.is_absolute():
            return run_dir / path
    return path


def _load_segments(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(observations (2, H, obs_dim) float32, actions (2, H, action_dim))`` of a query;
    uint8 observations (pixels, grids) are scaled to [0, 1]."""
    with np.load(path, allow_pickle=False) as data:
        obs, act = data["observations"], data["actions"]
    flat = obs.reshape(*obs.shape[:2], -1).astype(np.float32)
    if obs.dtype == np.uint8:
        flat /= 255.0
    return flat, act.reshape(*act.shape[:2], -1).astype(np.float32)


def held_out_accuracy(data: PairwiseAnswers, flagged: set[str] | frozenset[str],
                      run_dir: str | Path | None = None, heldout_fraction: float = 0.2,
                      seed: int = 0, epochs: int = 30, ensemble_size: int = 3,
                      hidden_dim: int = 32, hidden_depth: int = 2, lr: float = 3e-3,
                      batch_size: int = 64) -> HeldOutAccuracy:
    """The reward model's held-out accuracy with and without the flagged labelers' answers.

    The answered (a non-skip answer) non-gold queries are split by query ID, with
    ``np.random.default_rng(seed)``, into training (``1 − heldout_fraction``) and held-out
    queries. A small :class:`~themis.reward.RewardEnsemble` (an MLP on flattened observations,
    whatever the env) is fit by :class:`~themis.reward.RewardTrainer` (Bradley–Terry) to every
    non-skip answer to the training queries (one label per answer, as ``label_aggregate=each``),
    once with all answers and once without those of ``flagged``, from the same initial weights
    (``torch`` seeded with ``seed`` in a forked RNG: the global state is untouched). Each
    model's ensemble-mean accuracy is measured on the held-out queries against their oracle
    label, ties excluded. Runs on the CPU, on one PyTorch thread (restored after), in a few
    seconds for a few hundred queries.

    Args:
        data: :func:`load_answers`.
        flagged: labelers whose answers the second model leaves out (empty: one model).
        run_dir: where the store's ``web/queries/`` segments are looked for first.
        heldout_fraction: share of the queries held out, in (0, 1).
        epochs: most training epochs (fewer when train accuracy passes 0.97, as in BPref).

    Raises:
        ValueError: ``heldout_fraction`` outside (0, 1), or fewer than 2 answered non-gold
            queries.
        FileNotFoundError: a query's segments file is missing.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    given = data.answers.dropna(subset=["label"])
    normal = data.queries[data.queries["gold"].isna()]
    ids = sorted(set(normal["id"].astype(int)) & set(given["query_id"].astype(int)))
    if len(ids) < 2:
        raise ValueError(f"{len(ids)} answered non-gold pairwise queries: at least 2 are needed "
                         "to train and hold out")
    order = np.random.default_rng(seed).permutation(len(ids))
    n_held = min(len(ids) - 1, max(1, round(heldout_fraction * len(ids))))
    held = sorted(ids[i] for i in order[:n_held])
    train = sorted(ids[i] for i in order[n_held:])
    base = Path(run_dir) if run_dir is not None else None
    paths = normal.set_index("id")["segments"]
    segments = {qid: _load_segments(_resolve(paths[qid], base, "queries")) for qid in ids}

    oracle = normal.set_index("id")["oracle"]
    scored = [q for q in held if not np.isnan(oracle[q]) and oracle[q] != 0.5]
    held_obs = np.stack([segments[q][0] for q in scored]) if scored else None
    held_act = np.stack([segments[q][1] for q in scored]) if scored else None
    held_labels = np.array([oracle[q] for q in scored], dtype=np.float32)
    horizon, obs_dim = segments[ids[0]][0].shape[1:]
    action_dim = segments[ids[0]][1].shape[-1]

    def fit(exclude: set[str] | frozenset[str]) -> tuple[int, float]:
        rows = given[given["query_id"].isin(train) & ~given["labeler"].isin(exclude)]
        if len(rows) == 0:
            return 0, float("nan")
        dataset = PreferenceDataset(len(rows), horizon, obs_dim, action_dim)
        pairs = [segments[int(q)] for q in rows["query_id"]]
        dataset.add(SegmentPairs(np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs]),
                                 np.zeros((len(rows), 2, horizon), np.float32),
                                 np.zeros((len(rows), 2), np.int64)),
                    rows["label"].to_numpy(np.float32))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # nets this small: one thread is faster (and busy cores
        try:  # slow several down by 10x and more)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = RewardEnsemble(obs_dim, action_dim, ensemble_size, hidden_dim,
                                       hidden_depth)
                trainer = RewardTrainer(model, lr, batch_size, np.random.default_rng(seed))
                trainer.train(dataset, epochs)
            model.eval()
            accuracy = trainer.accuracy(held_obs, held_act, held_labels) \
                if held_obs is not None and held_act is not None else float("nan")
        finally:
            torch.set_num_threads(threads)
        return len(rows), accuracy

    labels_all, accuracy_all = fit(frozenset())
    labels_without, accuracy_without = fit(flagged) if flagged else (labels_all, float("nan"))
    return HeldOutAccuracy(train, held, len(scored), labels_all, labels_without, accuracy_all,
                           accuracy_without)


# ------------------------------------------------------------------------ the report section
def gold_thresholds(run_dir: str | Path) -> tuple[int, float]:
    """``(min_gold_answers, min_gold_accuracy)`` of a run: from its ``config.yaml`` (or
    Hydra's ``.hydra/config.yaml``), else the defaults 5 and 0.7."""
    from omegaconf import OmegaConf

    run = Path(run_dir)
    for path in (run / "config.yaml", run / ".hydra" / "config.yaml"):
        if path.is_file():
            cfg: Any = OmegaConf.load(path)
            return int(cfg.get("min_gold_answers", 5)), float(cfg.get("min_gold_accuracy", 0.7))
    return 5, 0.7


def _fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, bool | np.bool_):
        return "**yes**" if value else "no"
    if isinstance(value, float | np.floating):
        return "–" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def _link(path: Path, out_dir: Path) -> str:
    """A markdown link to ``path`` relative to the report folder."""
    relative = os.path.relpath(path.resolve(), out_dir.resolve())
    return f"[{path.name}]({quote(Path(relative).as_posix())})"


def labels_section(run_dir: str | Path, out_dir: str | Path, top: int = 10,
                   seed: int = 0) -> list[str]:
    """The report's "Labels" section (markdown lines) for a run with a label store; writes
    ``labelers.csv`` and ``label_confusion.csv`` into ``out_dir``.

    Args:
        run_dir: the run dir; without ``labels.sqlite`` the section is empty (``[]``).
        out_dir: the report folder (clip links are relative to it).
        top: most-disputed queries listed.
        seed: of the held-out split and the reward models (:func:`held_out_accuracy`).
    """
    run, out = Path(run_dir), Path(out_dir)
    store = run / "labels.sqlite"
    if not store.is_file():
        return []
    data = load_answers(store)
    lines = ["## Labels", ""]
    if data.answers.empty:
        return [*lines, "No answers to pairwise queries in `labels.sqlite` yet.", ""]
    min_answers, min_accuracy = gold_thresholds(run)
    table = labeler_table(data, min_answers, min_accuracy)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "labelers.csv")
    n_gold = int(data.queries["gold"].notna().sum())
    lines += [f"Audit of people's answers to the web teacher's pairwise queries "
              f"(`labels.sqlite`): {len(data.queries)} queries ({n_gold} gold), "
              f"{len(data.answers)} answers by {len(table)} labelers. Rates leave skips out; "
              "the oracle label is the one of the segments' true returns (never a training "
              "label).", "", "### Labelers", "",
              "| labeler | answers | skips | gold answers | gold accuracy | oracle agreement "
              "| median s / answer | flagged |", "|---|---|---|---|---|---|---|---|"]
    for name, r in table.iterrows():
        lines.append(f"| {name} | {int(r['answers'])} | {int(r['skips'])} | "
                     f"{int(r['gold_answers'])} | "
                     f"{_fmt(r['gold_accuracy'])} | {_fmt(r['oracle_agreement'])} | "
                     f"{_fmt(r['median_seconds'], 1)} | {_fmt(bool(r['flagged']))} |")
    kappa, used, raters = crowd_fleiss_kappa(data)
    names = list(table.index)
    lines += ["", f"Flagged: gold accuracy below {min_accuracy:g} after {min_answers} gold "
              "answers (`min_gold_accuracy`, `min_gold_answers`). Table: `labelers.csv`.", "",
              "Cohen's κ (Cohen 1960) of each two labelers on the queries both answered, skips "
              "excluded (1 = always agree, 0 = as by chance, < 0 = less than by chance):", "",
              "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for a in names:
        lines.append(f"| {a} | " + " | ".join(
            "" if a == b else _fmt(table.loc[a, f"kappa_{b}"]) for b in names) + " |")
    lines += ["", f"Fleiss' κ (Fleiss 1971) over all labelers: **{_fmt(kappa)}** on {used} "
              f"queries with {raters} non-skip answers each." if used else
              "Fleiss' κ: no query has two non-skip answers.", ""]

    confusion = oracle_confusion(data, include_gold=True)
    confusion.to_csv(out / "label_confusion.csv")
    lines += ["### People vs oracle", "",
              "People's answers (rows) against the oracle label of the same query (columns), "
              "gold queries included; queries without an oracle label are not counted. Table: "
              "`label_confusion.csv`.", "", "| | " + " | ".join(confusion.columns) + " |",
              "|---|---|---|---|"]
    lines += [f"| {row} | " + " | ".join(str(int(v)) for v in confusion.loc[row]) + " |"
              for row in confusion.index]

    disputed = most_disputed(data, top)
    lines += ["", "### Most disputed queries", ""]
    if disputed.empty:
        lines.append("People agreed on every query answered by two or more of them.")
    else:
        lines += ["Ranked by the entropy (bits) of the non-skip answers.", "",
                  "| query | clip | oracle | entropy | answers |", "|---|---|---|---|---|"]
        for _, r in disputed.iterrows():
            clip = _link(_resolve(r["clip"], run, "clips"), out)
            oracle = "–" if np.isnan(r["oracle"]) else _category(r["oracle"])
            gold = " (gold)" if not np.isnan(r["gold"]) else ""
            lines.append(f"| {r['query_id']}{gold} | {clip} | {oracle} | {r['entropy']:.2f} | "
                         f"{r['answers']} |")

    flagged = {str(n) for n in table.index[table["flagged"].astype(bool)]}
    lines += ["", "### Reward model with and without flagged labelers", ""]
    try:
        result = held_out_accuracy(data, flagged, run, seed=seed)
    except (ValueError, FileNotFoundError) as err:
        return [*lines, f"Not measured: {err}.", ""]
    lines.append(f"A small reward ensemble trained on {len(result.train_queries)} answered "
                 f"non-gold queries (every answer a label), scored on {result.scored} held-out "
                 f"queries (20 %, seed {seed}) against the oracle label, ties excluded.")
    lines.append("")
    if flagged:
        lines += ["| answers used | labels | held-out accuracy |", "|---|---|---|",
                  f"| all | {result.labels_all} | {_fmt(result.accuracy_all, 3)} |",
                  f"| without {', '.join(sorted(flagged))} | {result.labels_without} | "
                  f"{_fmt(result.accuracy_without, 3)} |", ""]
    else:
        lines += [f"No labeler is flagged: held-out accuracy with all {result.labels_all} "
                  f"labels **{_fmt(result.accuracy_all, 3)}**.", ""]
    return lines
