"""Durable store of posted queries and people's answers: SQLite in the run dir.

The web teacher splits asking from gathering: each feedback round *posts* queries (a row per
query with an ID, its segments in ``web/queries/q_NNNNNN.npz`` and its clip), people answer them
whenever they like through the labeling server, and the next round *gathers* whatever answers
have arrived. SQLite in WAL mode lets the training process and the server (a thread, or a
separate ``scripts/label_server.py`` process) read and write at once; every answer is one
transaction, committed before the server replies, so no answer given is ever lost.

Tables:

- ``queries(id, round, created, clip, segments, labels_needed, consumed)``
- ``answers(id, query_id, labeler, label, created)``, unique per ``(query_id, labeler)``; label
  0 = left (segment 1) better, 1 = right, 0.5 = equal, NULL = can't tell (skipped);
- ``labelers(name, token, created)``.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from themis.buffers import SegmentPairs

SCHEMA = """
CREATE TABLE IF NOT EXISTS queries (
    id INTEGER PRIMARY KEY,
    round INTEGER NOT NULL,
    created REAL NOT NULL,
    clip TEXT NOT NULL,
    segments TEXT NOT NULL,
    labels_needed INTEGER NOT NULL DEFAULT 1,
    consumed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS answers (
    id INTEGER PRIMARY KEY,
    query_id INTEGER NOT NULL REFERENCES queries(id),
    labeler TEXT NOT NULL,
    label REAL,
    created REAL NOT NULL,
    UNIQUE (query_id, labeler)
);
CREATE TABLE IF NOT EXISTS labelers (
    name TEXT PRIMARY KEY,
    token TEXT UNIQUE NOT NULL,
    created REAL NOT NULL
);
"""


class DuplicateAnswer(Exception):
    """The labeler has already answered this query."""


class UnknownQuery(Exception):
    """No query with this ID."""


class LabelStore:
    """The run's query/answer database (``RUN_DIR/labels.sqlite``).

    Args:
        path: the SQLite file (created with its tables if missing).
        web_dir: where query segments (``queries/``) and clips (``clips/``) are kept.

    Thread-safe: one connection per thread.
    """

    def __init__(self, path: str | Path, web_dir: str | Path | None = None) -> None:
        self.path = Path(path)
        self.web_dir = Path(web_dir) if web_dir else self.path.parent / "web"
        self._local = threading.local()
        self.db.executescript(SCHEMA)  # executescript commits by itself

    # ------------------------------------------------------------------ plumbing
    @property
    def db(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # an answer is on disk when we reply
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # ------------------------------------------------------------------ labelers
    def add_labelers(self, n: int, prefix: str = "labeler") -> list[tuple[str, str]]:
        """Create ``n`` labelers with random tokens; returns ``[(name, token)]`` (existing
        labelers of the same names keep their tokens)."""
        out = []
        with self.transaction() as db:
            for i in range(n):
                name = f"{prefix}{i + 1}"
                row = db.execute("SELECT token FROM labelers WHERE name=?", (name,)).fetchone()
                token = row[0] if row else secrets.token_urlsafe(16)
                if not row:
                    db.execute("INSERT INTO labelers VALUES (?, ?, ?)", (name, token, time.time()))
                out.append((name, token))
        return out

    def labeler_for_token(self, token: str) -> str | None:
        row = self.db.execute("SELECT name FROM labelers WHERE token=?", (token,)).fetchone()
        return row[0] if row else None

    def has_labelers(self) -> bool:
        return self.db.execute("SELECT COUNT(*) FROM labelers").fetchone()[0] > 0

    # ------------------------------------------------------------------ queries
    def post(self, round_: int, pairs: SegmentPairs, clips: list[Path],
             labels_needed: int = 1) -> list[int]:
        """Store a round's queries (segments to ``web/queries/q_ID.npz``) and return their IDs.

        Shapes: ``pairs`` holds ``n`` pairs; ``clips`` ``n`` clip files already written.
        """
        ids = []
        queries = self.web_dir / "queries"
        queries.mkdir(parents=True, exist_ok=True)
        with self.transaction() as db:
            for i, clip in enumerate(clips):
                cur = db.execute(
                    "INSERT INTO queries (round, created, clip, segments, labels_needed) "
                    "VALUES (?, ?, ?, '', ?)", (round_, time.time(), str(clip), labels_needed))
                qid = int(cur.lastrowid or 0)
                segments = queries / f"q_{qid:06d}.npz"
                np.savez(segments, observations=pairs.observations[i],
                         actions=pairs.actions[i], true_rewards=pairs.true_rewards[i])
                db.execute("UPDATE queries SET segments=? WHERE id=?", (str(segments), qid))
                ids.append(qid)
        return ids

    def clip_path(self, query_id: int) -> Path:
        """The clip of a query (looked up by ID only).

        Raises:
            UnknownQuery: no such query.
        """
        row = self.db.execute("SELECT clip FROM queries WHERE id=?", (query_id,)).fetchone()
        if row is None:
            raise UnknownQuery(query_id)
        return Path(row[0])

    def next_query(self, labeler: str) -> int | None:
        """The oldest query that still needs answers and that ``labeler`` has not answered."""
        row = self.db.execute(
            "SELECT q.id FROM queries q WHERE q.consumed=0 "
            "AND (SELECT COUNT(*) FROM answers a WHERE a.query_id=q.id) < q.labels_needed "
            "AND NOT EXISTS (SELECT 1 FROM answers a WHERE a.query_id=q.id AND a.labeler=?) "
            "ORDER BY q.id LIMIT 1", (labeler,)).fetchone()
        return int(row[0]) if row else None

    def pending_count(self) -> int:
        """Queries still waiting for answers."""
        return int(self.db.execute(
            "SELECT COUNT(*) FROM queries q WHERE q.consumed=0 AND "
            "(SELECT COUNT(*) FROM answers a WHERE a.query_id=q.id) < q.labels_needed"
        ).fetchone()[0])

    # ------------------------------------------------------------------ answers
    def answer(self, query_id: int, labeler: str, label: float | None) -> None:
        """Record one answer in its own transaction (committed and synced on return).

        Raises:
            UnknownQuery: no such query.
            DuplicateAnswer: ``labeler`` already answered ``query_id``.
            ValueError: a label other than 0, 0.5, 1 or None.
        """
        if label not in (0.0, 0.5, 1.0, None):
            raise ValueError(f"label must be 0, 0.5, 1 or None, got {label}")
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM queries WHERE id=?", (query_id,)).fetchone() is None:
                raise UnknownQuery(query_id)
            try:
                db.execute("INSERT INTO answers (query_id, labeler, label, created) "
                           "VALUES (?, ?, ?, ?)", (query_id, labeler, label, time.time()))
            except sqlite3.IntegrityError:
                raise DuplicateAnswer(f"{labeler} already answered query {query_id}") from None

    def answered_by(self, labeler: str) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM answers WHERE labeler=?",
                                   (labeler,)).fetchone()[0])

    def gather(self, aggregate: str = "each") -> tuple[list[int], SegmentPairs | None,
                                                        np.ndarray, list[str], int]:
        """Take every query with all its answers in and not yet used, and mark it used.

        Args:
            aggregate: ``each`` (every answer is a training label) or ``majority`` (one label
                per query: the most common non-skip answer; ties between left and right give
                0.5).

        Returns:
            ``(query ids, pairs of the labels, labels, labelers, queries taken)``: one pair per
            label (a query answered by 3 people gives 3 pairs under ``each``), skips dropped.
        """
        with self.transaction() as db:
            rows = db.execute(
                "SELECT q.id, q.segments FROM queries q WHERE q.consumed=0 AND "
                "(SELECT COUNT(*) FROM answers a WHERE a.query_id=q.id) >= q.labels_needed "
                "ORDER BY q.id").fetchall()
            ids = [int(r[0]) for r in rows]
            for qid in ids:
                db.execute("UPDATE queries SET consumed=1 WHERE id=?", (qid,))
            answers = {qid: db.execute("SELECT labeler, label FROM answers WHERE query_id=? "
                                       "ORDER BY id", (qid,)).fetchall() for qid in ids}
        obs, act, true, labels, labelers = [], [], [], [], []
        for (qid, segments) in rows:
            given = [(who, lab) for who, lab in answers[int(qid)] if lab is not None]
            if aggregate == "majority" and given:
                values = np.array([lab for _, lab in given])
                left, right = (values == 0.0).sum(), (values == 1.0).sum()
                label = 0.0 if left > right else 1.0 if right > left else 0.5
                given = [("majority:" + ",".join(w for w, _ in given), label)]
            if not given:
                continue
            with np.load(segments, allow_pickle=False) as data:
                for who, lab in given:
                    obs.append(data["observations"])
                    act.append(data["actions"])
                    true.append(data["true_rewards"])
                    labels.append(float(lab))
                    labelers.append(f"human:{who}")
        if not labels:
            return ids, None, np.zeros(0, np.float32), [], len(ids)
        pairs = SegmentPairs(np.stack(obs), np.stack(act), np.stack(true),
                             np.zeros((len(labels), 2), dtype=np.int64))
        return ids, pairs, np.array(labels, np.float32), labelers, len(ids)

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        """Counts for the status page: queries, pending, answers per labeler, and agreement
        (fraction of pairs of answers to the same query, by different labelers, that agree)."""
        db = self.db
        per = dict(db.execute("SELECT labeler, COUNT(*) FROM answers GROUP BY labeler"))
        rows = db.execute("SELECT query_id, label FROM answers WHERE label IS NOT NULL "
                          "ORDER BY query_id").fetchall()
        by_query: dict[int, list[float]] = {}
        for qid, lab in rows:
            by_query.setdefault(int(qid), []).append(float(lab))
        agree = pairs = 0
        for labels in by_query.values():
            for i in range(len(labels)):
                for j in range(i + 1, len(labels)):
                    pairs += 1
                    agree += labels[i] == labels[j]
        return {
            "queries": int(db.execute("SELECT COUNT(*) FROM queries").fetchone()[0]),
            "pending": self.pending_count(),
            "answers": int(db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]),
            "answers_per_labeler": per,
            "agreement": agree / pairs if pairs else None,
        }
