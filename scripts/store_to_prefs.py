#!/usr/bin/env python
"""Turn a run's web label store (``labels.sqlite``) into a preference dataset.

    python scripts/store_to_prefs.py RUN_DIR OUT/                      # every answer a label
    python scripts/store_to_prefs.py RUN_DIR OUT/ --aggregate majority  # one label per query
    ./themis_train.sh prefs_path=OUT/ ...                               # train on them

Every answer people gave is kept: of queries used by the run or not (a run that died before it
gathered them), answered by all the labelers they asked or by some (``labels_per_query`` ≥ 2).
Skipped answers ("can't tell") and gold queries give no label, as in a run. The dataset is
written with the project's writer (:meth:`themis.reward.PreferenceDataset.save`), labels as
``human:NAME`` (``human:majority:A,B``) with their label-store answer IDs, and the run's env
from its ``config.yaml``. The store's queries and answers are left as they are (nothing is
marked used): a resumed run still gathers them.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import argparse
import sqlite3
import sys
from pathlib import Path

import numpy as np
import yaml

from themis.core.safe_loading import check_yaml_file
from themis.crowd.label_store import LabelStore
from themis.reward.dataset import PreferenceDataset

AGGREGATES = ("each", "majority", "model")


def store_to_prefs(store_path: Path, out: Path, aggregate: str = "each") -> PreferenceDataset:
    """Every labelled answer in the label store at ``store_path`` (a run dir or its
    ``labels.sqlite``) as a preference dataset saved at ``out``.

    Args:
        aggregate: ``each`` (every answer a label), ``majority`` or ``model`` (one label per
            query, see :meth:`LabelStore.gather`).

    Returns:
        the dataset (``n`` pairs ``(n, 2, H, obs_dim)``, or ratings ``(n, 1, H, obs_dim)``).

    Raises:
        FileNotFoundError: no label store at ``store_path``.
        ValueError: the store holds no labelled answer, is not a label store, or a query's
            segments are unreadable.
    """
    db = store_path / "labels.sqlite" if store_path.is_dir() else store_path
    if not db.is_file():
        raise FileNotFoundError(f"{db} not found (a web-labelled run dir holds labels.sqlite)")
    if aggregate not in AGGREGATES:
        raise ValueError(f"--aggregate {aggregate} is unknown; use one of "
                         f"{', '.join(AGGREGATES)}")
    try:
        store = LabelStore(db, db.parent / "web")
        got = store.gather(aggregate, partial=True, used=True)
        classes = {int(r[0] or 0) for r in store.db.execute(
            "SELECT DISTINCT rating_classes FROM queries WHERE gold IS NULL")}
    except (sqlite3.Error, OSError, KeyError, ValueError) as e:
        raise ValueError(f"{db}: not a readable label store ({e})") from None
    if got.pairs is None or not len(got.labels):
        raise ValueError(f"{db} holds no labelled answer (skips and gold queries give none)")
    if len(classes) != 1:
        raise ValueError(f"{db} mixes pairs and ratings; this tool writes one kind")
    pairs = got.pairs
    for field in ("observations", "actions", "true_rewards"):  # prefs_path= would refuse it
        array = getattr(pairs, field)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            row = int(np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(1))[0])
            raise ValueError(f"{db}: the {field} of label {row} (answer {got.answer_ids[row]}) "
                             "hold NaN or infinite values; nothing written")
    n, width, horizon = pairs.true_rewards.shape
    obs = pairs.observations.reshape(n, width, horizon, -1)
    data = PreferenceDataset(n, horizon, obs.shape[-1], pairs.actions.shape[-1],
                             metadata={**run_facts(db.parent), "teacher": "human (web)",
                                       "source": str(db), "aggregate": aggregate},
                             obs_dtype=obs.dtype, rating_classes=classes.pop())
    for i in range(n):  # one labeler per row: add() stores one labeler per call
        data.add(pairs.take(np.array([i])), got.labels[i:i + 1], labeler=got.labelers[i],
                 answers=[got.answer_ids[i]])
    data.save(out)
    return data


def run_facts(run_dir: Path) -> dict[str, str]:
    """``env`` and ``domain`` from the run's ``config.yaml`` (plain strings only; nothing in
    the file is interpolated or run), or nothing."""
    try:
        check_yaml_file(run_dir / "config.yaml")
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    return {k: cfg[k] for k in ("env", "domain") if isinstance(cfg.get(k), str)
            and "${" not in cfg[k]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run dir (or its labels.sqlite)")
    parser.add_argument("out", type=Path, help="folder of the preference dataset to write")
    parser.add_argument("--aggregate", default="each", choices=AGGREGATES,
                        help="each answer a label (default), or one label per query")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        print(f"store_to_prefs: error: {args.out} is a file, not a folder", file=sys.stderr)
        return 2
    if (args.out / "meta.json").exists():
        print(f"store_to_prefs: error: {args.out} holds a dataset already; choose another "
              "folder (scripts/merge_prefs.py merges datasets)", file=sys.stderr)
        return 2
    try:
        data = store_to_prefs(args.run_dir, args.out, args.aggregate)
    except (FileNotFoundError, ValueError) as e:
        print(f"store_to_prefs: error: {e}", file=sys.stderr)
        return 2
    people = sorted({str(w) for w in data.labelers[: len(data)]})
    print(f"wrote {len(data)} labels ({', '.join(people)}) to {args.out}; train on them with "
          f"prefs_path={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
