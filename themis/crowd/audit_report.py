"""The run report's "Labels" section: the audit tables of :mod:`themis.crowd.audit` for a run with a
label store, and the reward model's held-out accuracy with and without the flagged labelers'
answers (:func:`held_out_accuracy`: a small ensemble trained twice on the same queries).

    from themis.crowd.audit_report import labels_section
    lines = labels_section("runs/...", "runs/.../report")   # markdown lines, CSVs written
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

import numpy as np
import torch

from themis.agents.buffers import SegmentPairs
from themis.crowd.audit import (
    PairwiseAnswers,
    category,
    crowd_fleiss_kappa,
    labeler_table,
    load_answers,
    most_disputed,
    oracle_confusion,
)
from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer
from themis.utils import ConfigError


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
    from themis.core.safe_loading import check_npz

    with np.load(path, allow_pickle=False) as data:
        check_npz(data, path)
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
    Hydra's ``.hydra/config.yaml``), else the defaults 5 and 0.7.

    Raises:
        themis.utils.ConfigError: the file calls resolvers (``${oc.env:...}``; a received run
            folder holds values only) or its values are not numbers.
    """
    from omegaconf import DictConfig, OmegaConf

    from themis.core.safe_loading import check_no_resolvers, check_yaml_file

    run = Path(run_dir)
    for path in (run / "config.yaml", run / ".hydra" / "config.yaml"):
        if path.is_file():
            try:
                check_yaml_file(path)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            cfg = OmegaConf.load(path)
            check_no_resolvers(cfg, path)
            if not isinstance(cfg, DictConfig):
                raise ConfigError(f"{path} is not a Themis config (no key: value mapping)")
            try:
                return int(cfg.get("min_gold_answers", 5)), \
                    float(cfg.get("min_gold_accuracy", 0.7))
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{path}: min_gold_answers or min_gold_accuracy is not a "
                                  f"number ({e})") from None
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
            oracle = "–" if np.isnan(r["oracle"]) else category(r["oracle"])
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
