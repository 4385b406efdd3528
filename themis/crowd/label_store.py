"""Durable store of posted queries and people's answers: SQLite in the run dir.

The web teacher splits asking from gathering: each feedback round *posts* queries (a row per
query with an ID, its segments in ``web/queries/q_NNNNNN.npz`` and its clip), people answer them
whenever they like through the labeling server, and the next round *gathers* whatever answers
have arrived. SQLite in WAL mode lets the training process and the server (a thread, or a
separate ``scripts/label_server.py`` process) read and write at once.

What is promised (tests in ``tests/test_web_labeling.py``):

- an answer the server accepted (HTTP 201) is committed and synced before the reply, and
  reaches the preference dataset: :meth:`LabelStore.gather` does not mark anything used; the
  learner saves the labels to ``preferences/`` first and then calls :meth:`LabelStore.mark_used`;
  a crash in between is repaired on resume by :meth:`LabelStore.reconcile` (the dataset's
  ``answers`` column says which answers it holds);
- a query takes at most ``labels_needed`` answers: a later answer is refused
  (:class:`QueryFull`, HTTP 409) and nothing is stored;
- labeler tokens are stored as SHA-256 hashes, and the database file and the query segments
  are readable by their owner only (mode 0600; so is the preference dataset's ``labels.csv``).

Tables:

- ``queries(id, round, created, clip, segments, labels_needed, consumed, gold, oracle,
  rating_classes)``: ``clip`` and ``segments`` are paths relative to the run folder (the
  folder of ``labels.sqlite``; stores of earlier versions hold absolute paths, read by their
  place under ``web/``), so a moved or copied run keeps working; ``gold`` is the known
  answer of a gold query (NULL for a normal one), ``oracle`` the label of the segments' true
  returns (for labeler scores and the audit; never a training label), ``rating_classes``
  NULL for a pair, ``n`` for one segment to rate (``feedback=rating``);
- ``answers(id, query_id, labeler, label, created)``, unique per ``(query_id, labeler)``; label
  0 = left (segment 1) better, 1 = right, 0.5 = equal, NULL = can't tell (skipped); for a
  rating query the class 0 … n − 1;
- ``labelers(name, token, created, issuer)``: ``token`` is ``sha256:<hex digest of the
  token>``, ``issuer`` the mark of whoever issued it (:func:`themis.core.owner.owner_mark` of
  the store's real path, the name and the hash);
- ``owner(id, token, created, issuer)``: one row, the hash of the run owner's token (the status
  of every labeler; a labeler sees only their own).

A received store is data (docs: "A received run folder is data"):

- nothing in it executes: a store is opened only if its tables are Themis's own, word for word
  (:func:`check_schema`: no trigger, no view, no other table, index or column constraint), and
  every connection runs with ``PRAGMA trusted_schema=OFF``;
- its tokens are not valid: a token counts only with an ``issuer`` mark that verifies under this
  user's key for this store's path (:mod:`themis.core.owner`), so a hash planted by whoever
  sent the folder, or one issued in another folder, opens nothing; :meth:`LabelStore.add_labelers`
  and :meth:`LabelStore.owner_token` re-issue such tokens (new links are printed).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from themis.agents.buffers import SegmentPairs
from themis.core.owner import is_owned, owner_mark
from themis.core.safe_loading import check_npz
from themis.crowd import aggregation as crowd
from themis.reward.preference_models import true_preference
from themis.utils import fsync_dir, open_private

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
CREATE TABLE IF NOT EXISTS owner (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    token TEXT NOT NULL,
    created REAL NOT NULL
);
"""
MIGRATIONS = {"queries": (("gold", "REAL"), ("oracle", "REAL"), ("rating_classes", "INTEGER")),
              "labelers": (("issuer", "TEXT"),), "owner": (("issuer", "TEXT"),)}
"""Columns added to stores of earlier versions (``ALTER TABLE ... ADD COLUMN``), in order."""

OWNER = "owner"
"""The run's owner, as the label server names them (their token sees every labeler's scores)."""


_GATHERABLE = ("(q.consumed=0 OR :used) AND ((SELECT COUNT(*) FROM answers a WHERE "
               "a.query_id=q.id) >= q.labels_needed OR (:partial AND q.gold IS NULL AND EXISTS "
               "(SELECT 1 FROM answers a WHERE a.query_id=q.id)))")
"""Queries a round takes (SQL; ``:partial`` 1: the partly answered ones too, ``:used`` 1: the
used ones too)."""


class DuplicateAnswer(Exception):
    """The labeler has already answered this query."""


class UnknownQuery(Exception):
    """No query with this ID."""


class QueryFull(Exception):
    """The query already has all the answers it asked for (or was used): nothing stored."""


class Answers(NamedTuple):
    """Answers gathered from the store (:meth:`LabelStore.gather`).

    Attributes:
        query_ids: the queries with all their answers in, not yet used.
        pairs: the segment pairs of the labels (``None`` when there is no label), ``n`` pairs.
        labels: ``(n,)`` float32 labels (0, 0.5, 1).
        labelers: ``human:NAME`` (or ``human:majority:A,B``) per label.
        answer_ids: the answer IDs behind each label, ``;``-separated.
        timestamps: ``(n,)`` float64, when each label was given (Unix seconds; a label that
            aggregates several answers: the last of them).
        skipped: "can't tell" answers among the gathered queries (gold ones not counted):
            each skip under ``each``; a query answered only with skips under ``majority``
            and ``model``. They give no label; ``reward.csv`` counts them (``skipped``).
    """

    query_ids: list[int]
    pairs: SegmentPairs | None
    labels: np.ndarray
    labelers: list[str]
    answer_ids: list[str]
    timestamps: np.ndarray
    skipped: int = 0


class UnsafeStoreError(ValueError):
    """A file that is not a Themis label store as Themis writes it (a trigger, a view, another
    table or column definition): opening it could run SQL someone else wrote on your answers."""


def _normal(sql: str) -> str:
    return " ".join(sql.split())


def _schema_texts() -> dict[str, set[str]]:
    """Every ``CREATE TABLE`` text (whitespace collapsed) a Themis store may hold per table:
    :data:`SCHEMA` with any first columns of :data:`MIGRATIONS` added, as SQLite writes them."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(SCHEMA)
        texts: dict[str, set[str]] = {}
        sql = "SELECT sql FROM sqlite_master WHERE type='table' AND name=?"
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'"
                                   ).fetchall():
            texts[table] = {_normal(db.execute(sql, (table,)).fetchone()[0])}
            for column, kind in MIGRATIONS.get(table, ()):
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
                texts[table].add(_normal(db.execute(sql, (table,)).fetchone()[0]))
        return texts
    finally:
        db.close()


_SCHEMA_TEXTS = _schema_texts()


def check_schema(db: sqlite3.Connection, where: str | Path) -> None:
    """Refuse a store whose schema is not Themis's own (a received ``labels.sqlite`` could
    carry triggers that rewrite or delete answers as they are stored, views that stand in for a
    table, ``ON CONFLICT REPLACE`` clauses or generated columns): the tables are compared with
    :data:`SCHEMA` (and its :data:`MIGRATIONS`) text for text; the only indexes allowed are
    SQLite's own for the ``UNIQUE`` / ``PRIMARY KEY`` constraints. Reading ``sqlite_master``
    runs nothing.

    Raises:
        UnsafeStoreError: the first object that differs, and how to look at it.
        sqlite3.DatabaseError: not an SQLite file.
    """
    for kind, name, table, sql in db.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid").fetchall():
        if kind == "index" and sql is None and str(name).startswith("sqlite_autoindex_") \
                and table in _SCHEMA_TEXTS:
            continue
        if kind == "table" and name in _SCHEMA_TEXTS and _normal(str(sql)) in _SCHEMA_TEXTS[name]:
            continue
        what = f"a {kind} {name!r}" + ("" if kind == "table" or name == table else
                                       f" on {table!r}")
        why = "Themis's stores hold none" if kind in ("trigger", "view") or \
            (kind == "table" and name not in _SCHEMA_TEXTS) else "not as Themis defines it"
        raise UnsafeStoreError(
            f"{where} holds {what} ({why}); a received label store may not run SQL on your "
            "answers, so it is not opened: look with sqlite3 FILE .schema, and export the "
            "answers with scripts/store_to_prefs.py after removing it if you trust the rest")


def hash_token(token: str) -> str:
    """How a labeler token is stored: ``sha256:`` + hex digest (the token itself is not)."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


class LabelStore:
    """The run's query/answer database (``RUN_DIR/labels.sqlite``).

    Args:
        path: the SQLite file (created with its tables if missing).
        web_dir: where query segments (``queries/``) and clips (``clips/``) are kept.

    Thread-safe: one connection per thread.
    """

    def __init__(self, path: str | Path, web_dir: str | Path | None = None) -> None:
        self.path = Path(path)
        self.root = self.path.parent  # the run folder: stored paths are relative to it
        self.web_dir = Path(web_dir) if web_dir else self.root / "web"
        self._local = threading.local()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))  # owner only
        os.chmod(self.path, 0o600)
        try:  # a received store: nothing in it may run (before anything is written)
            check_schema(self.db, self.path)
        except sqlite3.DatabaseError as e:
            raise UnsafeStoreError(f"{self.path} is not an SQLite label store ({e})") from None
        self.db.executescript(SCHEMA)  # executescript commits by itself
        for table, added in MIGRATIONS.items():  # stores of earlier versions lack them
            columns = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
            for column, kind in added:
                if column not in columns:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        with self.transaction() as db:  # stores of earlier versions kept tokens in clear
            for name, token in db.execute("SELECT name, token FROM labelers WHERE token NOT "
                                          "LIKE 'sha256:%'").fetchall():
                db.execute("UPDATE labelers SET token=? WHERE name=?", (hash_token(token), name))

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
            conn.execute("PRAGMA trusted_schema=OFF")  # no side effects from schema SQL
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
    def add_labelers(self, n: int, prefix: str = "labeler",
                     renew: bool = False) -> list[tuple[str, str | None]]:
        """Create ``n`` labelers with random tokens; returns ``[(name, token)]``.

        Only a hash of each token is stored, so a labeler that exists already keeps its token
        and gets ``None`` here (its link was printed when it was created), unless ``renew``
        gives it a new token (the old one stops working), or its token was not issued by this
        user for this store (:meth:`issued_here`: a received or moved run folder): then it
        gets a new one too.
        """
        out: list[tuple[str, str | None]] = []
        with self.transaction() as db:
            for i in range(n):
                name = f"{prefix}{i + 1}"
                row = db.execute("SELECT token, issuer FROM labelers WHERE name=?",
                                 (name,)).fetchone()
                if row and not renew and self.issued_here(name, row[0], row[1]):
                    out.append((name, None))
                    continue
                token = secrets.token_urlsafe(16)
                hashed = hash_token(token)
                db.execute("INSERT OR REPLACE INTO labelers (name, token, created, issuer) "
                           "VALUES (?, ?, ?, ?)", (name, hashed, time.time(),
                                                   self._issuer(name, hashed)))
                out.append((name, token))
        return out

    def _issuer(self, name: str, hashed: str) -> str:
        return owner_mark("themis-label-token", os.path.realpath(self.path), name, hashed)

    def issued_here(self, name: str, hashed: str, issuer: str | None) -> bool:
        """Whether the token hash ``hashed`` of ``name`` was issued by this user for this
        store, here (its ``issuer`` mark verifies, :func:`themis.core.owner.is_owned`). Tokens
        of a received store (planted by whoever sent it) or of a moved one are not."""
        return is_owned(issuer, "themis-label-token", os.path.realpath(self.path), name, hashed)

    def labeler_for_token(self, token: str) -> str | None:
        """The labeler whose token this is, if it was issued here (:meth:`issued_here`)."""
        hashed = hash_token(token)
        row = self.db.execute("SELECT name, issuer FROM labelers WHERE token=?",
                              (hashed,)).fetchone()
        return row[0] if row and self.issued_here(row[0], hashed, row[1]) else None

    def owner_token(self, renew: bool = False) -> str | None:
        """The run owner's token (the status page with every labeler's scores), created on
        the first call; only its hash is stored, so later calls return ``None`` unless
        ``renew`` gives a new one (the old one stops working), or the stored one was not
        issued here (:meth:`issued_here`)."""
        with self.transaction() as db:
            row = db.execute("SELECT token, issuer FROM owner").fetchone()
            if row and not renew and self.issued_here(OWNER, row[0], row[1]):
                return None
            token = secrets.token_urlsafe(16)
            hashed = hash_token(token)
            db.execute("INSERT OR REPLACE INTO owner (id, token, created, issuer) "
                       "VALUES (1, ?, ?, ?)", (hashed, time.time(), self._issuer(OWNER, hashed)))
        return token

    def is_owner_token(self, token: str) -> bool:
        """Whether ``token`` is the run owner's (compared by hash, issued here)."""
        hashed = hash_token(token)
        row = self.db.execute("SELECT issuer FROM owner WHERE token=?", (hashed,)).fetchone()
        return row is not None and self.issued_here(OWNER, hashed, row[0])

    def has_labelers(self) -> bool:
        return self.db.execute("SELECT COUNT(*) FROM labelers").fetchone()[0] > 0

    # ------------------------------------------------------------------ queries
    def post(self, round_: int, pairs: SegmentPairs, clips: list[Path],
             labels_needed: int | np.ndarray = 1, gold: np.ndarray | None = None,
             rating_classes: int = 0) -> list[int]:
        """Store a round's queries (segments to ``web/queries/q_ID.npz``) and return their IDs.

        Shapes: ``pairs`` holds ``n`` pairs (``rating_classes > 0``: ``n`` single segments,
        axis 1 of size 1, to rate); ``clips`` ``n`` clip files already written;
        ``labels_needed`` one number or ``(n,)``; ``gold`` ``(n,)`` known answers of gold
        queries (0, 0.5, 1; NaN for the others), or ``None``.
        """
        needed = np.broadcast_to(np.asarray(labels_needed), (len(clips),))
        ids = []
        queries = self.web_dir / "queries"
        queries.mkdir(parents=True, exist_ok=True)
        oracle = np.full(len(clips), np.nan) if rating_classes else \
            true_preference(pairs.true_rewards)
        with self.transaction() as db:
            for i, clip in enumerate(clips):
                cur = db.execute(
                    "INSERT INTO queries (round, created, clip, segments, labels_needed, gold, "
                    "oracle, rating_classes) VALUES (?, ?, ?, '', ?, ?, ?, ?)",
                    (round_, time.time(), self._relative(clip), int(needed[i]),
                     None if gold is None or np.isnan(gold[i]) else float(gold[i]),
                     None if np.isnan(oracle[i]) else float(oracle[i]),
                     int(rating_classes) or None))
                qid = int(cur.lastrowid or 0)
                segments = self.segments_path(qid)
                with open_private(segments) as f:  # on disk before the row is committed
                    np.savez(f, observations=pairs.observations[i],
                             actions=pairs.actions[i], true_rewards=pairs.true_rewards[i])
                    f.flush()
                    os.fsync(f.fileno())
                db.execute("UPDATE queries SET segments=? WHERE id=?",
                           (self._relative(segments), qid))
                ids.append(qid)
            fsync_dir(queries)
        return ids

    def _relative(self, path: str | Path) -> str:
        """How a path is stored: relative to the run folder when inside it (a moved run keeps
        working), else absolute."""
        path = Path(os.path.abspath(path))
        root = Path(os.path.abspath(self.root))
        return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)

    def segments_path(self, query_id: int) -> Path:
        """Where a query's segments are: ``web/queries/q_ID.npz`` (named by the ID alone, so
        neither a moved run nor a store's contents can point elsewhere)."""
        return self.web_dir / "queries" / f"q_{query_id:06d}.npz"

    def clip_path(self, query_id: int) -> Path:
        """The clip of a query (looked up by ID only), as stored: a relative path is taken from
        the run folder; an absolute one (stores of earlier versions) that no longer exists is
        looked for at its place under this run's ``web/`` (the run was moved or copied).

        Raises:
            UnknownQuery: no such query.
        """
        row = self.db.execute("SELECT clip FROM queries WHERE id=?", (query_id,)).fetchone()
        if row is None:
            raise UnknownQuery(query_id)
        stored = Path(row[0])
        if not stored.is_absolute():
            return self.root / stored
        parts = stored.parts
        if not stored.exists() and self.web_dir.name in parts[:-1]:
            below = parts[len(parts) - parts[::-1].index(self.web_dir.name):]
            return self.web_dir.joinpath(*below)
        return stored

    def servable_clip(self, query_id: int) -> Path:
        """The clip file of a query, only if it may be served: a regular ``.mp4`` or ``.gif``
        file inside this run's ``web/clips/`` once every symlink is resolved (neither
        ``web/`` nor ``web/clips/`` may be a symlink). A received run folder's store can name
        any path; nothing outside the clips is ever served.

        Raises:
            UnknownQuery: no such query.
            FileNotFoundError: the clip is missing, or not a clip of this run (outside
                ``web/clips/``, a symlink out of it, another kind of file).
        """
        path = self.clip_path(query_id)
        clips = self.web_dir / "clips"
        real = Path(os.path.realpath(path))
        if (os.path.islink(self.web_dir) or os.path.islink(clips)
                or not real.is_relative_to(os.path.realpath(clips))
                or real.suffix not in (".mp4", ".gif") or not real.is_file()):
            raise FileNotFoundError(f"the clip of query {query_id} is missing")
        return real

    def servable_poster(self, query_id: int) -> Path:
        """The poster frame of a query's clip (its first frame, the ``.png`` beside the clip),
        under the rules of :meth:`servable_clip`: a regular file inside ``web/clips/``.

        Raises:
            UnknownQuery: no such query.
            FileNotFoundError: no poster (clips of earlier versions have none), or not one of
                this run's.
        """
        path = self.clip_path(query_id).with_suffix(".png")
        clips = self.web_dir / "clips"
        real = Path(os.path.realpath(path))
        if (os.path.islink(self.web_dir) or os.path.islink(clips)
                or not real.is_relative_to(os.path.realpath(clips))
                or real.suffix != ".png" or not real.is_file()):
            raise FileNotFoundError(f"the clip of query {query_id} has no poster frame")
        return real

    def rating_classes(self, query_id: int) -> int:
        """0 for a pairwise query, ``n`` for a rating query.

        Raises:
            UnknownQuery: no such query.
        """
        row = self.db.execute("SELECT rating_classes FROM queries WHERE id=?",
                              (query_id,)).fetchone()
        if row is None:
            raise UnknownQuery(query_id)
        return int(row[0] or 0)

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

    def ungathered_count(self, partial: bool = False) -> int:
        """Queries with all their answers in that no round has used yet (``partial``: also
        the queries that are not gold with some of their answers, see :meth:`gather`)."""
        return int(self.db.execute(
            f"SELECT COUNT(*) FROM queries q WHERE {_GATHERABLE}",
            {"partial": int(partial), "used": 0}).fetchone()[0])

    def asked_in_round(self, round_: int) -> int:
        """Queries (not gold) posted by feedback round ``round_`` (0: none posted yet)."""
        return int(self.db.execute("SELECT COUNT(*) FROM queries WHERE round=? AND gold IS NULL",
                                   (round_,)).fetchone()[0])

    # ------------------------------------------------------------------ answers
    def answer(self, query_id: int, labeler: str, label: float | None) -> int:
        """Record one answer in its own transaction (committed and synced on return).

        Returns:
            the answer's ID.

        Raises:
            UnknownQuery: no such query.
            DuplicateAnswer: ``labeler`` already answered ``query_id``.
            QueryFull: the query has its ``labels_needed`` answers already, or was used.
            ValueError: a label other than 0, 0.5, 1 or None for a pair, or other than a class
                0 … n − 1 or None for a rating query (nothing stored).
        """
        with self.transaction() as db:
            row = db.execute("SELECT labels_needed, consumed, (SELECT COUNT(*) FROM answers a "
                             "WHERE a.query_id=q.id), rating_classes FROM queries q WHERE id=?",
                             (query_id,)).fetchone()
            if row is None:
                raise UnknownQuery(query_id)
            classes = int(row[3] or 0)
            allowed = [float(c) for c in range(classes)] if classes else [0.0, 0.5, 1.0]
            if label is not None and label not in allowed:
                raise ValueError(f"query {query_id} takes " + (
                    f"a rating 1 … {classes}" if classes else "left, right, equal or skip")
                    + f", not {label!r}")
            if db.execute("SELECT 1 FROM answers WHERE query_id=? AND labeler=?",
                          (query_id, labeler)).fetchone():
                raise DuplicateAnswer(f"{labeler} already answered query {query_id}")
            needed, consumed, given, _ = row
            if consumed or given >= needed:
                raise QueryFull(f"query {query_id} already has its {needed} answer"
                                f"{'s' if needed > 1 else ''}; take the next one")
            cur = db.execute("INSERT INTO answers (query_id, labeler, label, created) "
                             "VALUES (?, ?, ?, ?)", (query_id, labeler, label, time.time()))
            return int(cur.lastrowid or 0)

    def answered_by(self, labeler: str) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM answers WHERE labeler=?",
                                   (labeler,)).fetchone()[0])

    def gather(self, aggregate: str = "each", exclude: frozenset[str] | set[str] = frozenset(),
               partial: bool = False, used: bool = False) -> Answers:
        """Every query with all its answers in and not yet used, as labels; marks nothing
        (:meth:`mark_used` once the labels are saved).

        Args:
            aggregate: ``each`` (every answer is a training label), ``majority`` (one label
                per query: the most common non-skip answer; ties between left and right give
                0.5) or ``model`` (Dawid–Skene over every answer in the store, gold clamped;
                :mod:`themis.crowd.aggregation`).
            exclude: flagged labelers (``label_quality=filter``): their answers are never
                aggregated with the others' but each given as a label of its own, to keep in
                ``preferences/`` (the learner leaves them out of training).
            partial: also take the queries (not gold) that have fewer answers than they asked
                for, but at least one: their answers as they are, aggregated over what came
                (the run ends and its last answers go to ``preferences/``). :meth:`mark_used`
                closes them: no later answer is accepted.
            used: also the queries used already (with ``partial``: every answer in the store,
                for ``scripts/store_to_prefs.py``).

        Returns:
            one pair per label (a query answered by 3 people gives 3 pairs under ``each``),
            skips dropped; ``query_ids`` lists every query taken, skipped ones included. Gold
            queries give no training label (they score the labelers).
        """
        with self.transaction() as db:  # one consistent snapshot
            rows = db.execute(
                f"SELECT q.id, q.gold FROM queries q WHERE {_GATHERABLE} "
                "ORDER BY q.id", {"partial": int(partial), "used": int(used)}).fetchall()
            ids = [int(r[0]) for r in rows]
            rows = [int(qid) for qid, gold in rows if gold is None]
            answers = {qid: db.execute("SELECT id, labeler, label, created FROM answers "
                                       "WHERE query_id=? ORDER BY id", (qid,)).fetchall()
                       for qid in ids}
            every = db.execute("SELECT query_id, labeler, label FROM answers WHERE label IS "
                               "NOT NULL").fetchall() if aggregate == "model" and rows else []
            gold = dict(db.execute("SELECT id, gold FROM queries WHERE gold IS NOT NULL"))
        model = crowd.dawid_skene(every, gold) if every else {}  # EM outside the write lock
        obs, act, true, labels, labelers, answer_ids, times = [], [], [], [], [], [], []
        skipped = 0
        for qid in rows:
            given = [(str(aid), who, lab, when) for aid, who, lab, when in answers[int(qid)]
                     if lab is not None and who not in exclude]
            skips = sum(1 for _, who, lab, _ in answers[int(qid)]
                        if lab is None and who not in exclude)
            skipped += skips if aggregate not in ("majority", "model") else int(
                bool(skips) and not given)
            alone = [(str(aid), who, lab, when) for aid, who, lab, when in answers[int(qid)]
                     if lab is not None and who in exclude]
            if aggregate in ("majority", "model") and given:
                label = model[int(qid)] if aggregate == "model" else \
                    crowd.majority([lab for _, _, lab, _ in given])
                given = [(";".join(a for a, _, _, _ in given),
                          f"{aggregate}:" + ",".join(w for _, w, _, _ in given), label,
                          max(when for _, _, _, when in given))]
            given += alone
            if not given:
                continue
            with np.load(self.segments_path(qid), allow_pickle=False) as data:
                check_npz(data, self.segments_path(qid))  # a received run's file: no bomb
                for aid, who, lab, when in given:
                    obs.append(data["observations"])
                    act.append(data["actions"])
                    true.append(data["true_rewards"])
                    labels.append(float(lab))
                    labelers.append(f"human:{who}")
                    answer_ids.append(aid)
                    times.append(float(when))
        if not labels:
            return Answers(ids, None, np.zeros(0, np.float32), [], [], np.zeros(0), skipped)
        pairs = SegmentPairs(np.stack(obs), np.stack(act), np.stack(true),
                             np.zeros((len(labels), len(obs[0])), dtype=np.int64))
        return Answers(ids, pairs, np.array(labels, np.float32), labelers, answer_ids,
                       np.array(times, np.float64), skipped)

    def mark_used(self, query_ids: list[int]) -> None:
        """Mark gathered queries used (call once their labels are saved)."""
        with self.transaction() as db:
            db.executemany("UPDATE queries SET consumed=1 WHERE id=?",
                           [(q,) for q in query_ids])

    def reconcile(self, saved: set[int]) -> int:
        """Repair after a crash between saving labels and :meth:`mark_used`: a query whose
        answers are in the dataset (``saved`` answer IDs) is used; a used query with a labelled
        answer that is not in the dataset is gathered again (one round saves all of a query's
        labels at once, so a query is either in the dataset or not). Returns how many queries
        changed."""
        changed = 0
        with self.transaction() as db:
            labelled: dict[int, set[int]] = {}
            for aid, qid in db.execute("SELECT id, query_id FROM answers "
                                       "WHERE label IS NOT NULL"):
                labelled.setdefault(int(qid), set()).add(int(aid))
            for qid, consumed in db.execute("SELECT id, consumed FROM queries").fetchall():
                mine = labelled.get(int(qid), set())
                used = consumed if not mine else int(bool(mine & saved))
                if used != consumed:
                    db.execute("UPDATE queries SET consumed=? WHERE id=?", (used, qid))
                    changed += 1
        return changed

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
