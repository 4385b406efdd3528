#!/usr/bin/env python
"""A simulated crowd labels a real web-labeling run: careful people, random clickers and an
adversary answer through the HTTP API; gold queries flag the bad ones.

    python scripts/simulate_crowd.py                          # HalfCheetah-v5: none, filter, model
    python scripts/simulate_crowd.py --careful 6 --random 2 --adversaries 1 --labels-per-query 3
    python scripts/simulate_crowd.py --modes filter -- num_train_steps=20000

For each ``label_quality`` mode the script starts ``./themis_train.sh human_teacher=true
teacher_ui=web labelers=N gold_fraction=...`` and one bot thread per labeler token. A bot asks
``/api/next``, reads the query's segments (``web/queries/q_ID.npz``: the bots are simulated
people, so they may look at the true rewards) and answers:

- careful: the higher true return, flipped with probability ``--careful-mistakes`` (0.1);
- random clicker: left or right at random;
- adversary: the lower true return (every answer flipped).

Printed last, per mode: the labelers flagged (and after how many gold answers), the agreement
of the training labels with the true returns, the reward model's held-out accuracy against the
true returns (each round's new queries, before training on them; mean over rounds) and the final
true return. Overrides after ``--`` go to every run.

``--record [CSV]`` (default ``results/crowd.csv``) writes each mode's row as soon as its run
ends: the mode, the run's seed, the crowd (``crowd``: the labelers and the quality settings,
with the overrides), the printed row's numbers and the run's date, commit, machine, command and
wall time (``benchmarks/records.py``); the same mode, seed and crowd recorded again replaces its
row. ``python scripts/results_tables.py`` tables the record into ``docs/results/people.md`` and
the README.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
_sys.path.insert(0, str(_Path(__file__).resolve().parents[1] / "benchmarks"))  # records
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import records  # isort: skip
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RECORD_KEY = ["mode", "seed", "crowd"]
"""A recorded run's identity in ``--record``'s CSV."""


class Bot(threading.Thread):
    """One simulated labeler answering through the HTTP API until stopped."""

    def __init__(self, run: Path, token: str, kind: str, mistakes: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.token, self.kind, self.mistakes = run, token, kind, mistakes
        self.rng = np.random.default_rng(seed)
        self.stop = threading.Event()
        self.answered = 0

    def answer_for(self, qid: int) -> str:
        with np.load(self.run_dir / "web" / "queries" / f"q_{qid:06d}.npz") as data:
            left, right = data["true_rewards"].sum(-1)
        better = "right" if right > left else "left" if left > right else "equal"
        flip = {"left": "right", "right": "left", "equal": "equal"}
        if self.kind == "random":
            return str(self.rng.choice(["left", "right"]))
        if self.kind == "adversary":
            return flip[better]
        return flip[better] if self.rng.random() < self.mistakes else better

    def run(self) -> None:
        import httpx

        while not self.stop.is_set():
            try:
                url = json.loads((self.run_dir / "web" / "server.json").read_text())["url"]
                auth = {"X-Themis-Token": self.token}
                qid = httpx.get(url + "api/next", headers=auth, timeout=5).json()["query_id"]
                if qid is None:  # nothing to answer: look again in a second, as the page
                    time.sleep(1.0)  # does (polling faster takes the run's CPU: the server
                    continue         # is a thread of the training process)
                r = httpx.post(url + "api/answers", headers=auth, timeout=5,
                               json={"query_id": qid, "label": self.answer_for(int(qid))})
                self.answered += r.status_code == 201
            except (OSError, ValueError, KeyError, httpx.HTTPError):
                time.sleep(0.1)


def crowd_run(out: Path, mode: str, kinds: list[str], args: argparse.Namespace) -> dict:
    """One training run labelled by the bots; returns its row of the report."""
    from themis.crowd import aggregation as crowd
    from themis.crowd.label_store import LabelStore

    run = out / mode
    shutil.rmtree(run, ignore_errors=True)  # a simulation starts afresh (the bots' answers)
    store = LabelStore(run / "labels.sqlite", run / "web")
    tokens = store.add_labelers(len(kinds))
    cmd = [str(ROOT / "themis_train.sh"), "human_teacher=true", "teacher_ui=web",
           f"labelers={len(kinds)}", f"labels_per_query={args.labels_per_query}",
           f"gold_fraction={args.gold_fraction}", f"label_quality={mode}",
           f"min_gold_answers={args.min_gold_answers}", "label_port=0", "human_frame_size=48",
           f"hydra.run.dir={run}", *args.extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    bots = [Bot(run, str(token), kind, args.careful_mistakes, i)
            for i, ((_, token), kind) in enumerate(zip(tokens, kinds, strict=True))]
    for bot in bots:
        bot.start()
    output, _ = proc.communicate()
    for bot in bots:
        bot.stop.set()
    if proc.returncode != 0:
        raise RuntimeError(f"the {mode} run failed:\n{output[-3000:]}")
    names = {name: kind for (name, _), kind in zip(tokens, kinds, strict=True)}
    scores = crowd.labeler_scores(store, args.min_gold_answers, 0.7)
    flagged = sorted(s["labeler"] for s in scores if s["flagged"])
    labels = pd.read_csv(run / "preferences" / "labels.csv", dtype={"labeler": str})
    from themis.reward import PreferenceDataset
    from themis.reward.preference_models import true_preference

    data = PreferenceDataset.load(run / "preferences")
    oracle = true_preference(data.true_rewards[: len(data)])
    keep = np.ones(len(labels), bool)
    if mode == "filter":
        keep = ~labels["labeler"].str.removeprefix("human:").isin(flagged).to_numpy()
    rounds = pd.read_csv(run / "reward.csv")
    evals = pd.read_csv(run / "eval.csv")
    return {
        "mode": mode,
        "flagged": ", ".join(f"{n} ({names[n]})" for n in flagged) or "none",
        "gold answers when flagged": ", ".join(
            f"{n}: {gold_answers_to_flag(store, n, args.min_gold_answers)}" for n in flagged),
        "training labels": int(keep.sum()),
        "agreement with true returns": float((data.labels[: len(data)][keep] ==
                                              oracle[keep]).mean()) if keep.any() else np.nan,
        # the reward model on each round's new queries before training on them, against the
        # true returns (not the people's labels, which differ between modes)
        "held-out accuracy": float(rounds["heldout_oracle_accuracy"].dropna().mean())
        if rounds["heldout_oracle_accuracy"].notna().any() else np.nan,
        "final true return": float(evals["episode_reward"].iloc[-1]),
    }


def crowd_settings(args: argparse.Namespace) -> str:
    """The crowd a run was labelled by, as one string: labelers, mistakes and the quality
    settings, then the overrides after ``--``."""
    return " ".join([f"careful={args.careful}", f"random={args.random}",
                     f"adversaries={args.adversaries}",
                     f"careful_mistakes={args.careful_mistakes}",
                     f"labels_per_query={args.labels_per_query}",
                     f"gold_fraction={args.gold_fraction}",
                     f"min_gold_answers={args.min_gold_answers}", *args.extra])


def record_row(run: Path, row: dict, args: argparse.Namespace, wall_s: float,
               ran: str) -> dict:
    """The ``--record`` row of one mode's finished run: its seed (the run's ``config.yaml``),
    the crowd (:func:`crowd_settings`), the report's numbers and the provenance."""
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() \
        else {}
    names = {"flagged": "flagged", "gold answers when flagged": "gold_answers_when_flagged",
             "training labels": "training_labels",
             "agreement with true returns": "agreement", "held-out accuracy": "heldout_accuracy",
             "final true return": "final_return"}
    numbers = {names[k]: round(v, 4) if isinstance(v, float) else v for k, v in row.items()
               if k in names}
    return {"mode": row["mode"], "seed": int((cfg or {}).get("seed", 0)),
            "crowd": crowd_settings(args), **numbers, **records.provenance(wall_s, ran)}


def gold_answers_to_flag(store, labeler: str, min_answers: int, threshold: float = 0.7) -> int:
    """How many gold answers it took until the labeler's gold accuracy stayed flagged."""
    rows = store.db.execute(
        "SELECT a.label = q.gold FROM answers a JOIN queries q ON q.id = a.query_id WHERE "
        "a.labeler = ? AND q.gold IS NOT NULL AND a.label IS NOT NULL ORDER BY a.id",
        (labeler,)).fetchall()
    right = 0
    for n, (ok,) in enumerate(rows, 1):
        right += int(ok)
        if n >= min_answers and right / n < threshold:
            return n
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--careful", type=int, default=6)
    parser.add_argument("--random", type=int, default=2)
    parser.add_argument("--adversaries", type=int, default=1)
    parser.add_argument("--careful-mistakes", type=float, default=0.1)
    parser.add_argument("--labels-per-query", type=int, default=3)
    parser.add_argument("--gold-fraction", type=float, default=0.1)
    parser.add_argument("--min-gold-answers", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["none", "filter", "model"],
                        choices=["none", "filter", "model"])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "simulated_crowd")
    parser.add_argument("--record", type=Path, nargs="?", metavar="CSV",
                        const=ROOT / "results" / "crowd.csv",
                        help="write each mode's row (default results/crowd.csv)")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args(argv)
    ran = records.command(__file__, argv)
    kinds = ["careful"] * args.careful + ["random"] * args.random + \
        ["adversary"] * args.adversaries
    if args.labels_per_query > len(kinds):
        print("simulate_crowd: error: --labels-per-query exceeds the number of labelers",
              file=sys.stderr)
        return 2
    os.environ.setdefault("THEMIS_THREADS", "1")
    rows = []
    for mode in args.modes:
        print(f"label_quality={mode}: training with {len(kinds)} bot labelers ...", flush=True)
        start = time.time()
        rows.append(crowd_run(args.out, mode, kinds, args))
        if args.record is not None:
            records.merge_rows(args.record, [record_row(args.out / mode, rows[-1], args,
                                                        time.time() - start, ran)], RECORD_KEY)
    table = pd.DataFrame(rows)
    print(f"\n{args.careful} careful (mistakes {args.careful_mistakes}), {args.random} random, "
          f"{args.adversaries} adversarial labelers; labels_per_query={args.labels_per_query}, "
          f"gold_fraction={args.gold_fraction}, min_gold_answers={args.min_gold_answers}\n")
    print("| " + " | ".join(table.columns) + " |")
    print("|" + "---|" * len(table.columns))
    for row in table.itertuples(index=False):
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row)
              + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
