"""Web labeling: the label store, the API (tokens, hostile input, fuzzing), many labelers at
once, a real run labelled over HTTP and in headless Chromium, and a kill mid-round."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from lib.label_server import LabelServer, create_app
from tests.conftest import ROOT, TINY_PENDULUM
from themis.agents.buffers import SegmentPairs
from themis.crowd import aggregation as crowd
from themis.crowd.label_store import (
    DuplicateAnswer,
    LabelStore,
    QueryFull,
    UnknownQuery,
)
from themis.reward import PreferenceDataset
from themis.run.closing import finish
from themis.run.hints import resume_problem


def server_url(run: Path, proc: subprocess.Popen | None = None, timeout: float = 300,
               after: float = 0.0) -> str:
    """The URL a run's labeling server (started with label_port=0) wrote to web/server.json."""
    info = run / "web" / "server.json"
    deadline = time.time() + timeout
    while not (info.is_file() and info.stat().st_mtime >= after):
        assert proc is None or proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.time() < deadline, "the labeling server did not start"
        time.sleep(0.1)
    return json.loads(info.read_text())["url"]


def posted_store(tmp_path: Path, n: int = 4, labels_needed: int = 1) -> tuple[LabelStore, list]:
    store = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    rng = np.random.default_rng(0)
    pairs = SegmentPairs(rng.normal(size=(n, 2, 5, 3)).astype(np.float32),
                         rng.uniform(-1, 1, (n, 2, 5, 1)).astype(np.float32),
                         rng.normal(size=(n, 2, 5)).astype(np.float32),
                         np.zeros((n, 2), dtype=np.int64))
    clips = []
    for i in range(n):
        clip = tmp_path / "web" / "clips" / f"c{i}.mp4"
        clip.parent.mkdir(parents=True, exist_ok=True)
        clip.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes([i]))
        clips.append(clip)
    ids = store.post(1, pairs, clips, labels_needed)
    return store, ids


# ------------------------------------------------------------------------------ the store
def test_store_serves_each_query_until_answered_and_gathers_once(tmp_path):
    store, ids = posted_store(tmp_path, n=3)
    assert store.next_query("ann") == ids[0] and store.pending_count() == 3
    store.answer(ids[0], "ann", 0.0)
    store.answer(ids[1], "ann", None)  # can't tell
    with pytest.raises(DuplicateAnswer):
        store.answer(ids[0], "ann", 1.0)
    with pytest.raises(UnknownQuery):
        store.answer(999, "ann", 1.0)
    with pytest.raises(ValueError):
        store.answer(ids[2], "ann", 0.3)
    assert store.next_query("ann") == ids[2] and store.pending_count() == 1
    got = store.gather()
    assert got.query_ids == ids[:2] and store.ungathered_count() == 2
    assert got.labels.tolist() == [0.0] and got.labelers == ["human:ann"]  # the skip: no label
    assert got.pairs is not None and got.pairs.observations.shape == (1, 2, 5, 3)
    assert store.gather().query_ids == ids[:2]  # not used until the labels are saved
    store.mark_used(got.query_ids)
    assert store.gather().query_ids == [] and store.ungathered_count() == 0  # nothing twice
    with pytest.raises(QueryFull):  # a used query takes no more answers
        store.answer(ids[1], "bob", 1.0)


def test_reconcile_repairs_a_crash_between_saving_labels_and_marking_them_used(tmp_path):
    from themis.reward import PreferenceDataset

    store, ids = posted_store(tmp_path, n=3)
    for qid, label in zip(ids, (0.0, 1.0, None), strict=True):
        store.answer(qid, "ann", label)
    got = store.gather()
    data = PreferenceDataset(1, 5, 3, 1)  # grows: room for one pair, two come
    data.add(got.pairs, got.labels, "human:ann", answers=got.answer_ids)
    data.save(tmp_path / "preferences")
    # crash here: saved, not marked used. The resumed run reconciles store and dataset.
    saved = PreferenceDataset.load(tmp_path / "preferences").answer_ids()
    assert saved == {1, 2} and store.reconcile(saved) == 2
    assert store.gather().query_ids == [ids[2]]  # only the skipped one, which has no label
    # the other way round (marked, then the labels were lost): gathered again
    store.db.execute("UPDATE queries SET consumed=1")
    assert store.reconcile({1}) == 1 and store.gather().query_ids == [ids[1]]


def store_to_prefs(*args: str) -> subprocess.CompletedProcess:
    """``scripts/store_to_prefs.py args`` run in this process: exit code and stderr."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location("store_to_prefs",
                                                  ROOT / "scripts" / "store_to_prefs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = script.main(list(args))
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def test_store_to_prefs_turns_every_answer_in_a_store_into_a_dataset_that_trains(compose,
                                                                                  tmp_path):
    """Used and unused queries, complete and partly answered ones: every labelled answer
    becomes a label (or one per query, majority); skips and gold give none; a run loads it."""
    from themis.builder import make_workspace

    run = tmp_path / "run"
    store, ids = posted_store(run, n=4, labels_needed=2)
    (gold,) = store.post(2, SegmentPairs(*(a[:1] for a in _pairs(1, horizon=5))),
                         [run / "g.mp4"], 2, gold=np.array([1.0]))
    store.answer(ids[0], "ann", 1.0)
    store.answer(ids[0], "bob", 1.0)
    store.mark_used([ids[0]])  # a round used it
    store.answer(ids[1], "ann", 0.0)  # partly answered, never gathered
    store.answer(ids[2], "bob", None)  # a skip: no label
    store.answer(gold, "ann", 1.0)  # gold: scores ann, no label
    (run / "config.yaml").write_text("env: Pendulum-v1\ndomain: Classic\n")
    pending = store.pending_count()
    each = store_to_prefs(str(run), str(tmp_path / "each"))
    assert each.returncode == 0, each.stderr
    data = PreferenceDataset.load(tmp_path / "each")
    assert data.labels[:3].tolist() == [1.0, 1.0, 0.0]
    assert data.labelers[:3].tolist() == ["human:ann", "human:bob", "human:ann"]
    answers = {who: aid for aid, who in store.db.execute("SELECT id, labeler || query_id "
                                                          "FROM answers")}
    assert data.answers[:3].tolist() == [str(answers[f"ann{ids[0]}"]),
                                         str(answers[f"bob{ids[0]}"]),
                                         str(answers[f"ann{ids[1]}"])]
    assert data.metadata["env"] == "Pendulum-v1"
    majority = store_to_prefs(str(run / "labels.sqlite"), str(tmp_path / "maj"),
                              "--aggregate", "majority")
    assert majority.returncode == 0, majority.stderr
    assert PreferenceDataset.load(tmp_path / "maj").labels.tolist() == [1.0, 0.0]
    assert store.pending_count() == pending == 4  # the store is left as it was

    ws = make_workspace(compose([*TINY_PENDULUM, "segment=5", f"prefs_path={tmp_path / 'each'}"]),
                        tmp_path / "new")
    assert len(ws.learner.dataset) == 3
    ws.logger.close()
    for args, message in (((str(tmp_path / "nothing"), str(tmp_path / "o")), "not found"),
                          ((str(run), str(tmp_path / "each")), "holds a dataset already"),
                          ((str(run), str(run / "config.yaml")), "is a file")):
        bad = store_to_prefs(*args)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    empty = tmp_path / "empty"
    posted_store(empty)
    bad = store_to_prefs(str(empty), str(tmp_path / "o"))
    assert bad.returncode == 2 and "no labelled answer" in bad.stderr
    (tmp_path / "junk.sqlite").write_bytes(b"not a database" * 100)
    bad = store_to_prefs(str(tmp_path / "junk.sqlite"), str(tmp_path / "o"))
    assert bad.returncode == 2 and "not a readable label store" in bad.stderr, bad.stderr


def test_a_moved_run_gathers_its_answers_and_serves_its_clips(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    store, ids = posted_store(old)
    store.answer(ids[0], "ann", 1.0)
    assert store.db.execute("SELECT clip, segments FROM queries WHERE id=?", (ids[0],)
                            ).fetchone() == ("web/clips/c0.mp4", "web/queries/q_000001.npz")
    shutil.copytree(old, new)  # a colleague's run, copied
    shutil.rmtree(old)
    moved = LabelStore(new / "labels.sqlite")
    got = moved.gather()
    assert got.labels.tolist() == [1.0] and got.pairs is not None
    client = TestClient(create_app(moved, new), base_url="http://127.0.0.1")
    clip = client.get(f"/api/clips/{ids[1]}")
    assert clip.status_code == 200 and clip.content == (new / "web/clips/c1.mp4").read_bytes()
    # stores of earlier versions hold absolute paths: found at their place under web/
    moved.db.execute("UPDATE queries SET clip=?, segments=? WHERE id=?",
                     (str(old / "web/clips/c2.mp4"), str(old / "web/queries/q_000003.npz"),
                      ids[2]))
    assert client.get(f"/api/clips/{ids[2]}").content == (new / "web/clips/c2.mp4").read_bytes()
    moved.answer(ids[2], "ann", 0.0)
    assert moved.gather().labels.tolist() == [1.0, 0.0]


def test_majority_aggregation_and_agreement(tmp_path):
    store, ids = posted_store(tmp_path, n=2, labels_needed=3)
    for who, label in (("a", 1.0), ("b", 1.0), ("c", 0.0)):
        store.answer(ids[0], who, label)
    for who, label in (("a", 0.0), ("b", 1.0), ("c", None)):
        store.answer(ids[1], who, label)
    assert store.status()["agreement"] == pytest.approx(1 / 4)  # 1 of 4 pairs agrees
    got = store.gather("majority")
    assert got.labels.tolist() == [1.0, 0.5] and got.labelers[0] == "human:majority:a,b,c"
    assert got.answer_ids == ["1;2;3", "4;5"]  # the skip is not behind the second label
    with pytest.raises(QueryFull):  # three answers asked, three given
        store.answer(ids[0], "d", 1.0)


# ------------------------------------------------------------------------------ the API
def test_api_answers_with_tokens_and_rejects_hostile_requests(tmp_path):
    store, ids = posted_store(tmp_path)
    (name, token), (_, other) = store.add_labelers(2)
    client = TestClient(create_app(store, tmp_path), base_url="http://127.0.0.1")
    auth = {"X-Themis-Token": token}
    assert client.get("/api/next").status_code == 401  # no token
    assert client.get("/api/next", headers={"X-Themis-Token": "nope"}).status_code == 401
    nxt = client.get("/api/next", headers=auth).json()
    assert nxt["query_id"] == ids[0] and nxt["labeler"] == name and nxt["pending"] == 4
    assert client.get(f"/api/clips/{ids[0]}?token={token}").content.startswith(b"\x00\x00")
    r = client.post("/api/answers", json={"query_id": ids[0], "label": "left"}, headers=auth)
    assert r.status_code == 201 and r.json()["answered"] == 1
    bad = [
        client.post("/api/answers", json={"query_id": ids[0], "label": "left"}, headers=auth),
        client.post("/api/answers", json={"query_id": 12345, "label": "left"}, headers=auth),
        client.post("/api/answers", json={"query_id": -1, "label": "left"}, headers=auth),
        client.post("/api/answers", json={"query_id": ids[1], "label": "up"}, headers=auth),
        client.post("/api/answers", json={"query_id": ids[1], "label": "left", "x": 1},
                    headers=auth),
        client.post("/api/answers", content=b"{" + b" " * 100_000 + b"}", headers={
            **auth, "Content-Type": "application/json"}),
        client.post("/api/answers", content="not json", headers=auth),
        client.get("/api/clips/..%2F..%2Fetc%2Fpasswd", headers=auth),
        client.get("/api/clips/0", headers=auth),
        client.get(f"/api/clips/{2**70}", headers=auth),
    ]
    assert [r.status_code for r in bad] == [409, 404, 404, 422, 422, 413, 422, 404, 422, 422]
    # one answer per query was asked: another labeler is told so (409) and nothing is stored
    late = client.post("/api/answers", json={"query_id": ids[0], "label": "right"},
                       headers={"X-Themis-Token": other})
    assert late.status_code == 409 and "already has its 1 answer" in late.json()["detail"]
    assert client.get("/api/next", headers={"X-Themis-Token": other}).json()["query_id"] == ids[1]
    assert client.post("/api/answers", json={"query_id": ids[1], "label": "right"},
                       headers={"X-Themis-Token": other}).status_code == 201
    status = client.get("/api/status", headers=auth).json()
    assert status["answers"] == 2 and status["answers_per_labeler"] == {"labeler1": 1}
    page = client.get(f"/?token={token}")
    assert "Which clip is better?" in page.text
    # hardening: no framing, no referrer (tokens are in URLs), the spec needs a token, no /docs
    assert page.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["Referrer-Policy"] == "no-referrer"
    assert client.get("/openapi.json").status_code == 401
    assert "/api/answers" in client.get("/openapi.json", headers=auth).json()["paths"]
    assert client.get("/docs", headers=auth).status_code == 404


def test_a_received_store_cannot_make_the_server_serve_files_other_than_clips(tmp_path):
    """A run folder received from someone: its labels.sqlite names whatever path it likes
    (and may plant a token hash); only clips inside the run's web/clips/ are ever served."""
    store, ids = posted_store(tmp_path, n=4)
    secret = tmp_path.parent / f"{tmp_path.name}-secret.mp4"
    secret.write_bytes(b"the receiver's private file")
    (tmp_path / "web" / "clips" / "link.mp4").symlink_to(secret)
    (tmp_path / "web" / "clips" / "inside.mp4").symlink_to(tmp_path / "web" / "clips" / "c3.mp4")
    planted = {"token": store.add_labelers(1)[0][1]}  # (a planted hash opens nothing at all)
    client = TestClient(create_app(store, tmp_path), base_url="http://127.0.0.1")

    def served(clip: str) -> int:
        store.db.execute("UPDATE queries SET clip=? WHERE id=?", (clip, ids[0]))
        return client.get(f"/api/clips/{ids[0]}", params=planted).status_code

    assert [served(c) for c in (
        "/etc/passwd", str(secret), "../" + "../" * len(tmp_path.parts) + "etc/passwd",
        f"web/clips/../../{secret.name}", "web/clips/link.mp4",  # a symlink out of web/clips
        "web/queries/q_000001.npz",  # inside web/, not a clip (segments, true rewards)
        "labels.sqlite", "web/clips")] == [404] * 8
    assert served("web/clips/inside.mp4") == 200  # a symlink that stays inside is a clip
    ok = client.get(f"/api/clips/{ids[1]}", params=planted)
    assert ok.status_code == 200 and ok.content.startswith(b"\x00\x00")
    shutil.move(tmp_path / "web" / "clips", tmp_path / "elsewhere")  # web/clips a symlink
    (tmp_path / "web" / "clips").symlink_to(tmp_path / "elsewhere")
    assert client.get(f"/api/clips/{ids[1]}", params=planted).status_code == 404


def server_lines(output: str) -> list[str]:
    """The lines of captured output that this process's labeling server could have written
    (its log, a traceback through its frames, a request echoed): a thread left running by an
    earlier test in the same pytest process may write to the same file descriptors, and its
    unrelated lines are not the server's."""
    marks = ("label_server", "labeling server", "uvicorn", "starlette", "fastapi", "api/",
             "disk I/O error", "NaN", "Infinity", " 422", " 500")
    return [line for line in output.splitlines() if any(m in line for m in marks)]


def test_a_server_started_under_a_captured_stream_leaves_no_handler_on_it(tmp_path, capfd):
    """The quick tests died without a summary (I/O operation on closed file): uvicorn's own
    logging config bound handlers to the sys.stderr of the moment (this test's captured
    stream, closed when it ends) and reset the process's handlers. The server configures no
    logging, its records go to the root logger, and stop() joins its thread."""
    import logging

    before = {name: list(logging.getLogger(name).handlers)
              for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access")}
    store, _ = posted_store(tmp_path)
    server = LabelServer(store, "127.0.0.1", 0, tmp_path).start()
    try:
        assert httpx.get(server.url + "api/next", timeout=10).status_code == 200
        after = {name: list(logging.getLogger(name).handlers) for name in before}
        # no handler added (uvicorn may drop uvicorn.access's, e.g. another test's caplog)
        assert all(h in before[name] for name in before for h in after[name]), after
        assert logging.getLogger("uvicorn").propagate
    finally:
        server.stop()
    assert not server.thread.is_alive()
    from lib.label_server import live_servers

    assert server not in live_servers()


def test_nan_and_infinity_in_a_body_get_422_and_no_traceback(tmp_path, capfd, caplog):
    store, _ = posted_store(tmp_path)
    server = LabelServer(store, "127.0.0.1", 0, tmp_path).start()
    capfd.readouterr()
    try:
        codes = [httpx.post(server.url + "api/answers", content=body, timeout=10, headers={
            "Content-Type": "application/json"}).status_code for body in (
            b'{"query_id": NaN, "label": "left"}', b'{"query_id": Infinity, "label": "left"}',
            b'{"query_id": 1, "rating": -Infinity}', b'{"query_id": 1, "label": NaN}',
            b'[NaN]', b"NaN")]
        out, err = capfd.readouterr()
        assert codes == [422] * 6 and not server_lines(out + err), out + err
        assert store.db.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == 0

        def broken() -> int:
            raise sqlite3.OperationalError("disk I/O error\nsecond line")

        store.pending_count = broken  # an error the server did not foresee: one line, a 500
        caplog.clear()
        assert httpx.get(server.url + "api/next", timeout=10).status_code == 500
        deadline = time.time() + 10  # the line is written once the 500 is sent
        def logged() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.name.startswith(("themis.label_server", "uvicorn"))]

        while not logged() and time.time() < deadline:
            time.sleep(0.05)
        out, err = capfd.readouterr()
        # no traceback: one log line (the console's in a run)
        assert not server_lines(out + err), out + err
        (line,) = logged()
        assert line == "labeling server: GET /api/next failed: OperationalError: disk I/O error"
    finally:
        server.stop()


def test_a_labeler_sees_their_own_scores_and_the_runs_owner_everyones(tmp_path):
    store, ids = posted_store(tmp_path, n=2, labels_needed=2)
    (_, ann), (_, bob) = store.add_labelers(2)
    owner = store.owner_token()
    assert owner and store.owner_token() is None  # only its hash is kept
    client = TestClient(create_app(store, tmp_path), base_url="http://127.0.0.1")
    for token, label in ((ann, "left"), (bob, "right")):
        assert client.post("/api/answers", json={"query_id": ids[0], "label": label},
                           headers={"X-Themis-Token": token}).status_code == 201
    mine = client.get("/api/status", headers={"X-Themis-Token": ann}).json()
    assert [s["labeler"] for s in mine["labelers"]] == ["labeler1"] and not mine["owner"]
    assert mine["answers_per_labeler"] == {"labeler1": 1} and mine["answers"] == 2
    everyone = client.get(f"/api/status?token={owner}").json()
    assert [s["labeler"] for s in everyone["labelers"]] == ["labeler1", "labeler2"]
    assert everyone["owner"] and everyone["answers_per_labeler"] == {"labeler1": 1,
                                                                     "labeler2": 1}
    assert client.get("/api/status?token=nope").status_code == 401
    renewed = store.owner_token(renew=True)
    assert client.get(f"/api/status?token={owner}").status_code == 401
    assert client.get(f"/api/status?token={renewed}").json()["owner"]
    # a loopback server without tokens: whoever is on this machine is the run's owner
    alone, _ = posted_store(tmp_path / "alone")
    alone.answer(1, "local", 0.0)
    local = TestClient(create_app(alone, tmp_path / "alone"), base_url="http://127.0.0.1")
    assert local.get("/api/status").json()["owner"]


def test_labels_sqlite_keeps_token_hashes_only_readable_by_its_owner(tmp_path):
    store, _ = posted_store(tmp_path)
    (name, token), = store.add_labelers(1)
    assert (tmp_path / "labels.sqlite").stat().st_mode & 0o777 == 0o600
    stored = store.db.execute("SELECT token FROM labelers").fetchone()[0]
    assert token not in stored and stored.startswith("sha256:")
    assert store.labeler_for_token(token) == name and store.labeler_for_token(stored) is None
    assert store.add_labelers(1) == [(name, None)]  # kept: its link was printed once
    (_, renewed), = store.add_labelers(1, renew=True)
    assert renewed and store.labeler_for_token(token) is None
    assert store.labeler_for_token(renewed) == name
    # a store of an earlier version, tokens in clear, is migrated when opened; such a token
    # has no issuer mark (anyone holding the file knows it): it opens nothing until re-issued
    store.db.execute("UPDATE labelers SET token='old-clear-token', issuer=NULL")
    again = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    assert again.labeler_for_token("old-clear-token") is None
    assert again.db.execute("SELECT token FROM labelers").fetchone()[0].startswith("sha256:")
    (_, reissued), = again.add_labelers(1)
    assert reissued and again.labeler_for_token(reissued) == name


def test_labels_csv_and_query_segments_are_readable_by_their_owner_only(tmp_path):
    from themis.reward import PreferenceDataset

    umask = os.umask(0o022)  # the usual one: new files 0644 unless made private
    try:
        store, ids = posted_store(tmp_path, n=2)
        store.answer(ids[0], "ann", 1.0)
        got = store.gather()
        data = PreferenceDataset(4, 5, 3, 1)
        data.add(got.pairs, got.labels, "human:ann", answers=got.answer_ids)
        folder = tmp_path / "preferences"
        folder.mkdir()
        (folder / "labels.csv").write_text("pair,label\n")  # a run of an earlier version
        data.save(folder)
        data.add(got.pairs, got.labels, "human:ann", answers=got.answer_ids)
        data.save(folder)  # an appended shard
    finally:
        os.umask(umask)
    private = [*sorted((tmp_path / "web" / "queries").iterdir()), *sorted(folder.iterdir()),
               tmp_path / "labels.sqlite"]
    assert len(private) == 2 + 4 + 1
    assert {p.name: p.stat().st_mode & 0o777 for p in private} == {p.name: 0o600 for p in private}


def test_uvicorn_still_has_what_the_connection_guard_uses():
    """lib/http_guard.py's guarded_h11 subclasses uvicorn's H11Protocol, which is not public
    API (pyproject pins uvicorn's minor version): a release that moves what it overrides or
    reads fails here by name, not as a labeling page that silently stops limiting clients."""
    import asyncio

    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.server import ServerState

    for method in ("connection_made", "connection_lost", "on_response_complete",
                   "timeout_keep_alive_handler"):
        assert callable(getattr(H11Protocol, method, None)), \
            f"uvicorn {uvicorn.__version__}: H11Protocol.{method} is gone (lib/http_guard.py)"

    async def made() -> H11Protocol:
        async def app(scope: object, receive: object, send: object) -> None: ...

        config = uvicorn.Config(app, lifespan="off", log_config=None)
        config.load()
        return H11Protocol(config, ServerState(), app_state={})

    protocol = asyncio.run(made())
    for attribute in ("connections", "loop", "timeout_keep_alive", "timeout_keep_alive_task",
                      "cycle", "transport"):
        assert hasattr(protocol, attribute), \
            f"uvicorn {uvicorn.__version__}: H11Protocol().{attribute} is gone (lib/http_guard.py)"
    # the response cycle's flag the guard reads to tell an idle connection from an answered one
    from uvicorn.protocols.http.h11_impl import RequestResponseCycle
    assert "response_complete" in RequestResponseCycle.__init__.__code__.co_names, \
        f"uvicorn {uvicorn.__version__}: RequestResponseCycle.response_complete is gone"


def test_the_pages_are_package_files_served_as_they_are(tmp_path):
    """The labeling and status pages live in lib/pages/ (not Python strings) and are served
    byte for byte."""
    from lib.label_server import LABEL_PAGE, STATUS_PAGE

    store = LabelStore(tmp_path / "labels.sqlite")
    with TestClient(create_app(store), base_url="http://127.0.0.1") as client:
        for url, page in (("/", LABEL_PAGE), ("/status", STATUS_PAGE)):
            response = client.get(url)
            assert response.status_code == 200
            assert response.text == page.read_text(encoding="utf-8")
            assert "<!doctype html>" in response.text.lower()


def test_loopback_server_refuses_other_host_names(tmp_path):
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends Host: evil.example."""
    store, _ = posted_store(tmp_path)  # anonymous loopback mode: no tokens
    server = LabelServer(store, "127.0.0.1", 0, tmp_path).start()
    try:
        port = server.port
        ok = httpx.get(f"http://127.0.0.1:{port}/api/next", timeout=10)
        named = httpx.get(f"http://127.0.0.1:{port}/api/next", timeout=10,
                          headers={"Host": f"localhost:{port}"})
        rebound = httpx.get(f"http://127.0.0.1:{port}/api/next", timeout=10,
                            headers={"Host": f"evil.example:{port}"})
        assert ok.status_code == 200 and named.status_code == 200
        assert rebound.status_code == 400
    finally:
        server.stop()


def test_an_ipv6_loopback_server_prints_a_bracketed_url_and_answers_it(tmp_path):
    import socket

    store, ids = posted_store(tmp_path)
    assert LabelServer(store, "::1", 8765).url == "http://[::1]:8765/"
    try:
        socket.socket(socket.AF_INET6).close()
        server = LabelServer(store, "::1", 0, tmp_path).start()
    except (OSError, RuntimeError):
        pytest.skip("no IPv6 loopback here")
    try:
        assert server.url == f"http://[::1]:{server.port}/"
        assert httpx.get(server.url + "api/next", timeout=10).json()["query_id"] == ids[0]
        assert httpx.post(server.url + "api/answers", json={"query_id": ids[0], "label": "left"},
                          timeout=10).status_code == 201
        rebound = httpx.get(server.url + "api/next", headers={"Host": "evil.example"}, timeout=10)
        assert rebound.status_code == 400
    finally:
        server.stop()


def test_ids_and_ratings_must_be_json_integers(tmp_path):
    store, ids = posted_store(tmp_path)
    rng = np.random.default_rng(1)
    (rated,) = store.post(2, SegmentPairs(rng.normal(size=(1, 1, 5, 3)).astype(np.float32),
                                         np.zeros((1, 1, 5, 1), np.float32), np.zeros((1, 1, 5)),
                                         np.zeros((1, 1), np.int64)),
                          [tmp_path / "web" / "clips" / "r.mp4"], 1, rating_classes=4)
    client = TestClient(create_app(store, tmp_path), base_url="http://127.0.0.1")
    loose = [{"query_id": v, "label": "left"} for v in (True, str(ids[0]), float(ids[0]))] + [
        {"query_id": rated, "rating": v} for v in (True, "2", 2.0)]
    assert [client.post("/api/answers", json=b).status_code for b in loose] == [422] * 6
    assert store.db.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == 0
    assert client.post("/api/answers", json={"query_id": ids[0], "label": "left"}
                       ).status_code == 201
    assert client.post("/api/answers", json={"query_id": rated, "rating": 2}).status_code == 201


def test_refused_requests_carry_the_security_headers_too(tmp_path):
    store, _ = posted_store(tmp_path)
    client = TestClient(create_app(store, tmp_path), base_url="http://127.0.0.1")
    refused = [client.get("/api/next", headers={"Host": "evil.example"}),  # DNS rebinding
               client.get("/api/next", headers={"Host": "::1"}),  # IPv6 needs brackets
               client.post("/api/answers", content=b"x" * 5000),  # 4 KiB at most
               client.get("/nothing-here"), client.delete("/api/answers")]
    assert [r.status_code for r in refused] == [400, 400, 413, 404, 405]
    for r in refused:
        assert r.headers["X-Frame-Options"] == "DENY" and r.headers["Cache-Control"] == "no-store"
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
        assert r.headers["Referrer-Policy"] == "no-referrer"
        assert r.headers["X-Content-Type-Options"] == "nosniff"


def test_openapi_fuzzing_never_gets_a_server_error(tmp_path):
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    store, _ = posted_store(tmp_path)
    rng = np.random.default_rng(1)  # and queries to rate (feedback=rating): 1 … 4
    store.post(2, SegmentPairs(rng.normal(size=(3, 1, 5, 3)).astype(np.float32),
                               np.zeros((3, 1, 5, 1), np.float32), np.zeros((3, 1, 5)),
                               np.zeros((3, 1), np.int64)),
               [tmp_path / f"r{i}.mp4" for i in range(3)], 1, rating_classes=4)
    app = create_app(store, tmp_path, hosts=["testserver"])  # schemathesis's Host name
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/api/answers", "/api/clips/{query_id}"}
    codes: list[int] = []

    def fuzz(op):
        @settings(max_examples=30, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(op.as_strategy())
        def check(case):
            response = case.call()
            codes.append(response.status_code)
            case.validate_response(response, checks=[not_a_server_error])
        return check

    for op in operations:
        fuzz(op)()
    assert codes and max(codes) < 500


def test_eight_labelers_answering_at_once_lose_and_duplicate_nothing(tmp_path):
    store, ids = posted_store(tmp_path, n=50, labels_needed=8)
    tokens = [t for _, t in store.add_labelers(8)]
    server = LabelServer(store, "127.0.0.1", 0, tmp_path).start()
    assert server.port > 0 and server_url(tmp_path) == server.url
    codes: list[int] = []
    lock = threading.Lock()

    def labeler(token: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with httpx.Client(base_url=server.url, headers={"X-Themis-Token": token},
                          timeout=30) as c:
            for qid in rng.permutation(ids):
                r = c.post("/api/answers", json={"query_id": int(qid),
                                                 "label": ["left", "right"][int(qid) % 2]})
                with lock:
                    codes.append(r.status_code)

    threads = [threading.Thread(target=labeler, args=(t, i)) for i, t in enumerate(tokens)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.stop()
    assert codes == [201] * 400
    db = store.db
    assert db.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == 400
    assert db.execute("SELECT COUNT(DISTINCT query_id || '/' || labeler) FROM answers"
                      ).fetchone()[0] == 400
    assert store.pending_count() == 0


@pytest.mark.xdist_group("busy")  # times a labeler's answers
def test_a_thousand_idle_connections_do_not_stop_a_real_labeler(tmp_path):
    """1000 sockets opened and left idle (100 of them sending half a request, slowloris) at a
    server whose process may hold 512 files: it keeps serving a real labeler, and never holds
    more files than its connection cap leaves room for (a training run shares them)."""
    import resource
    import socket
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1500:  # this test's own 1000 sockets
        if hard != resource.RLIM_INFINITY and hard < 1500:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 1500")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1500, hard))
    store, ids = posted_store(tmp_path)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))

    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "label_server.py"),
                             str(tmp_path), "--port", "0"], stdout=subprocess.PIPE, text=True,
                            preexec_fn=limited, env={**os.environ, "PYTHONPATH": str(ROOT)})
    idle: list[socket.socket] = []
    try:
        url = proc.stdout.readline().split(": ", 1)[1].split()[0]
        port = int(url.rsplit(":", 1)[1].strip("/"))
        for i in range(1000):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 10 == 0:
                sock.sendall(b"GET /api/next HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends
            idle.append(sock)
        started = time.time()
        with httpx.Client(base_url=url, timeout=10) as labeler:
            nxt = labeler.get("/api/next")
            assert nxt.status_code == 200 and nxt.json()["query_id"] == ids[0]
            assert labeler.get(f"/api/clips/{ids[0]}").status_code == 200
            assert labeler.post("/api/answers", json={"query_id": ids[0], "label": "left"}
                                ).status_code == 201
        assert time.time() - started < 10
        files = len(os.listdir(f"/proc/{proc.pid}/fd"))
        assert proc.poll() is None and files < 512 // 4 + 64, files
    finally:
        for sock in idle:
            sock.close()
        proc.terminate()
        proc.wait(timeout=30)
    assert store.answered_by("local") == 1


def test_a_public_address_needs_tokens(tmp_path):
    store, _ = posted_store(tmp_path)
    with pytest.raises(ValueError, match="labelers=N"):
        LabelServer(store, "0.0.0.0", 0)


# ------------------------------------------------------------------ real runs over HTTP
WEB_RUN = [o for o in TINY_PENDULUM if not o.startswith("reward_batch")] + [
    "reward_batch=4", "human_teacher=true", "teacher_ui=web", "human_frame_size=48"]


def start_run(run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([str(ROOT / "themis_train.sh"), *WEB_RUN, "label_port=0",
                             f"hydra.run.dir={run}", *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "THEMIS_THREADS": "1"})


def wait_for_query(url: str, timeout: float = 300) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            qid = httpx.get(url + "api/next", timeout=5).json()["query_id"]
            if qid is not None:
                return int(qid)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError("no query was posted")


def open_labeling_page(playwright, url: str) -> tuple:
    """Headless Chromium (Debian's) on the labeling page, once a query is shown:
    ``(browser, page)``."""
    browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True,
                                         args=["--no-sandbox"])
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector("body[data-query]")
    return browser, page


def wait_until(page, expression: str, timeout: float = 60) -> None:
    """Poll a JavaScript expression (the page's CSP forbids the eval behind
    ``page.wait_for_function``; ``page.evaluate`` runs outside it)."""
    deadline = time.time() + timeout
    while not page.evaluate(expression):
        assert time.time() < deadline, f"timed out waiting for {expression}"
        time.sleep(0.1)


def posters_store(run: Path) -> tuple[LabelStore, list[int]]:
    """A store with two queries whose clips (and posters) ClipMaker wrote from colourful
    frames, as a web round writes them."""
    from lib.clips import ClipMaker
    from themis.environments.frames import FrameStore

    rng = np.random.default_rng(0)
    ring = FrameStore(capacity=40, buffer_capacity=40, height=48)
    for slot in range(40):  # a bright square moving over a dark background
        frame = np.full((48, 48, 3), 30, np.uint8)
        frame[10:30, slot % 28:slot % 28 + 20] = rng.integers(150, 255, 3, dtype=np.uint8)
        ring.add(slot, frame)
    n, horizon = 2, 10
    queries = SegmentPairs(np.zeros((n, 2, horizon, 3), np.float32),
                           np.zeros((n, 2, horizon, 1), np.float32),
                           np.zeros((n, 2, horizon), np.float32),
                           np.array([[0, 10], [20, 30]], np.int64))
    paths = ClipMaker(ring, 40, run, fps=5).write_web_clips(queries, 1)
    store = LabelStore(run / "labels.sqlite", run / "web")
    return store, store.post(1, queries, paths, 1)


def test_each_web_clip_has_its_first_frame_as_a_poster_served_by_id(tmp_path):
    from PIL import Image

    store, ids = posters_store(tmp_path)
    client = TestClient(create_app(store, tmp_path), base_url="http://127.0.0.1")
    got = client.get(f"/api/posters/{ids[0]}")
    assert got.status_code == 200 and got.headers["content-type"] == "image/png"
    import io

    poster = np.asarray(Image.open(io.BytesIO(got.content)))
    assert poster.ndim == 3 and poster.std() > 10  # the clip's first frame, not a blank
    assert client.get("/api/posters/999").status_code == 404
    assert client.get("/api/posters/..%2Flabels.sqlite").status_code in (404, 422)
    (tmp_path / "web" / "clips" / "round0001_001.png").unlink()  # an earlier run's clips
    assert client.get(f"/api/posters/{ids[1]}").status_code == 404


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed "
                    "(.ci/run installs it)")
def test_the_clip_area_shows_the_poster_frame_in_headless_chromium(tmp_path):
    """Headless Chromium paints no video into a screenshot (and a browser shows a grey box
    until the video paints): the poster frame fills the clip area."""
    import io

    from PIL import Image
    from playwright.sync_api import sync_playwright

    store, _ = posters_store(tmp_path)
    for clip in (tmp_path / "web" / "clips").glob("*.mp4"):  # a video that has not painted
        clip.write_bytes(b"\x00\x00\x00\x18ftypmp42")  # yet (still loading): poster only
    server = LabelServer(store, "127.0.0.1", 0, tmp_path).start()
    try:
        with sync_playwright() as p:
            browser, page = open_labeling_page(p, server.url)
            wait_until(page, "document.getElementById('clip').src !== ''")
            time.sleep(1.0)  # the poster image loads and paints
            shot = np.asarray(Image.open(io.BytesIO(page.locator("#clip").screenshot()))
                              .convert("RGB")).astype(float)
            browser.close()
    finally:
        server.stop()
    assert shot.shape[0] > 20 and shot.shape[1] > 20
    assert shot.std() > 20, shot.std()  # not one grey: the frames' squares are in it


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed "
                    "(.ci/run installs it)")
def test_labeling_in_headless_chromium_trains_the_reward_model(tmp_path):
    from playwright.sync_api import sync_playwright

    from lib.human_interface import BANNER, GAP

    run = tmp_path / "run"
    proc = start_run(run, "min_labels_before_training=3")
    url = server_url(run, proc)
    wait_for_query(url)
    with sync_playwright() as p:
        browser, page = open_labeling_page(p, url)
        # what the labeler sees: the clip's own frame, drawn from the paused <video> into a
        # canvas (headless Chromium paints no video into screenshots)
        wait_until(page, "document.getElementById('clip').readyState >= 2")
        page.evaluate("document.getElementById('clip').pause()")
        size, spread = page.evaluate("""(() => {
            const v = document.getElementById('clip'), c = document.createElement('canvas');
            c.width = v.videoWidth; c.height = v.videoHeight;
            const g = c.getContext('2d'); g.drawImage(v, 0, 0);
            const d = g.getImageData(0, BANNER, c.width, c.height - BANNER).data;
            let lo = 255, hi = 0;
            for (let i = 0; i < d.length; i += 4) {
                lo = Math.min(lo, d[i]); hi = Math.max(hi, d[i]);
            }
            return [[v.videoWidth, v.videoHeight], hi - lo]; })()""".replace("BANNER", str(BANNER)))
        assert size == [2 * 48 + GAP, BANNER + 48] and spread > 100  # two frames, not blank
        first = page.evaluate("document.body.dataset.query")
        page.click("#left")  # by clicking
        wait_until(page, f"document.body.dataset.query !== '{first}'")
        second = page.evaluate("document.body.dataset.query")
        page.keyboard.press("2")  # by keyboard
        wait_until(page, f"document.body.dataset.query !== '{second}'")
        page.click("#equal")
        wait_until(page, "document.getElementById('answered').textContent === '3'")
        status = browser.new_page()
        status.goto(url + "status")
        wait_until(status, "document.getElementById('answers').textContent === '3'")
        browser.close()
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    store = LabelStore(run / "labels.sqlite")
    rows = store.db.execute("SELECT query_id, label FROM answers ORDER BY id").fetchall()
    assert [r[1] for r in rows] == [0.0, 1.0, 0.5] and rows[0][0] == int(first)
    labels = pd.read_csv(run / "preferences" / "labels.csv")
    assert labels["label"].tolist() == [0.0, 1.0, 0.5]
    rounds = pd.read_csv(run / "reward.csv")
    assert rounds["epochs"].iloc[0] > 0  # trained on the three answers before going on


@pytest.mark.slow
def test_killed_run_keeps_every_answer_and_resume_serves_pending_queries_after_a_move(
        tmp_path):
    run = tmp_path / "run"
    proc = start_run(run, "max_feedback=12")
    url = server_url(run, proc)
    answered = []
    while len(answered) < 6:  # answer the first rounds over HTTP as queries appear
        qid = wait_for_query(url)
        httpx.post(url + "api/answers", json={"query_id": qid, "label": "right"}, timeout=10)
        answered.append(qid)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    store = LabelStore(run / "labels.sqlite")
    stored = [r[0] for r in store.db.execute("SELECT query_id FROM answers ORDER BY id")]
    assert stored == answered  # every answer given is on disk
    pending = {r[0] for r in store.db.execute(
        "SELECT id FROM queries WHERE id NOT IN (SELECT query_id FROM answers)")}
    assert pending
    run = Path(shutil.move(run, tmp_path / "moved"))  # the run folder moved before the resume

    started = time.time()
    resumed = subprocess.Popen([str(ROOT / "themis_train.sh"), f"resume={run}"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "THEMIS_THREADS": "1"})
    url = server_url(run, resumed, after=started - 1)  # a new free port
    served = wait_for_query(url)
    assert served in pending  # the still-pending queries are served again, with their clip
    assert httpx.get(url + f"api/clips/{served}", timeout=10).status_code == 200
    httpx.post(url + "api/answers", json={"query_id": served, "label": "left"}, timeout=10)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out[-3000:]
    labels = pd.read_csv(run / "preferences" / "labels.csv")
    assert len(labels) >= 6 and set(labels["labeler"]) == {"human:local"}


@pytest.mark.slow
def test_web_clips_carry_explanation_panels_and_rounds_go_on_without_answers(compose,
                                                                               tmp_path):
    import imageio_ffmpeg

    from lib.human_interface import BANNER
    from themis.builder import make_workspace

    ws = make_workspace(compose([*WEB_RUN, "xplain_state=true", "label_port=0"]),
                        tmp_path)
    ws.run()
    finish(ws)
    clips = sorted((tmp_path / "web" / "clips").glob("*.mp4"))
    assert len(clips) == 3 * 4  # 3 rounds of 4 queries posted, nobody answered, training went on
    reader = imageio_ffmpeg.read_frames(str(clips[0]))
    assert next(reader)["size"][1] == BANNER + 2 * 48  # frame + reward panel
    reader.close()
    assert len(ws.learner.dataset) == 0
    assert LabelStore(tmp_path / "labels.sqlite").pending_count() > 0
    # the synchronous loop writes the last full episode too (DRLHP's second window): at half
    # the frame size, the newest the last episode that ended (1200 steps of 200-step episodes:
    # episode IDs 1-6; older ones are dropped once 10 s old, test_episode_clips_drop_rule)
    from lib.clips import newest_episode_clip

    episodes = sorted((tmp_path / "web" / "episodes").glob("episode_*.mp4"))
    assert 3 <= len(episodes) <= 6 and newest_episode_clip(tmp_path / "web" / "episodes") == 6
    reader = imageio_ffmpeg.read_frames(str(episodes[-1]))
    assert next(reader)["size"][1] == 48 // 2
    reader.close()


def test_standalone_label_server_serves_an_existing_run(tmp_path):
    import sys

    posted_store(tmp_path)
    missing = subprocess.run([sys.executable, str(ROOT / "scripts" / "label_server.py"),
                              str(tmp_path / "nothing")], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "labels.sqlite not found" in missing.stderr
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "label_server.py"),
                             str(tmp_path), "--port", "0", "--labelers", "2"],
                            stdout=subprocess.PIPE, text=True)
    try:
        urls = [proc.stdout.readline().split(": ", 1)[1].strip() for _ in range(3)]
        assert all("?token=" in u for u in urls) and "/status?token=" in urls[2]  # the owner's
        port = int(urls[0].split(":")[2].split("/")[0])
        assert port > 0
        token = urls[0].split("token=")[1]
        nxt = httpx.get(f"http://127.0.0.1:{port}/api/next?token={token}", timeout=10).json()
        assert nxt["query_id"] == 1 and nxt["labeler"] == "labeler1"
        assert httpx.get(f"http://127.0.0.1:{port}/api/next", timeout=10).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# A run that SIGKILLs itself when a round has gathered people's answers and is about to save
# them: the worst moment (gathered, in memory, not on disk).
KILL_BEFORE_SAVE = """
import os, runpy, signal, sys
from themis.reward import dataset
save = dataset.PreferenceDataset.save
def dying_save(self, *args, **kwargs):
    if len(self) > 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return save(self, *args, **kwargs)
dataset.PreferenceDataset.save = dying_save
sys.argv = ["themis.cli.train", *sys.argv[1:]]
runpy.run_module("themis.cli.train", run_name="__main__", alter_sys=True)
"""


class Bots:
    """Labelers answering through the HTTP API, each in its own thread, whichever server
    (killed and restarted) is up; records every answer that got HTTP 201."""

    def __init__(self, run: Path, tokens: list[str], pause: float = 0.0) -> None:
        self.run, self.accepted, self.codes = run, [], []
        self.pause, self.given = pause, []  # given: (query, bot, label) of each 201
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self.answer, args=(t, i), daemon=True)
                        for i, t in enumerate(tokens)]
        for t in self.threads:
            t.start()

    def answer(self, token: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not self.stop.is_set():
            try:
                url = json.loads((self.run / "web" / "server.json").read_text())["url"]
                auth = {"X-Themis-Token": token}
                qid = httpx.get(url + "api/next", headers=auth, timeout=5).json()["query_id"]
                if qid is None:
                    time.sleep(0.05)
                    continue
                label = ["left", "right", "equal", "skip"][int(rng.integers(4))]
                r = httpx.post(url + "api/answers", json={"query_id": qid, "label": label},
                               headers=auth, timeout=5)
                with self.lock:
                    self.codes.append(r.status_code)
                    if r.status_code == 201:
                        self.accepted.append((qid, label))
                        self.given.append((qid, seed, label))
                time.sleep(self.pause)
            except (OSError, httpx.HTTPError, ValueError, KeyError):
                time.sleep(0.05)  # no server right now (killed, restarting)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


@pytest.mark.slow
def test_every_accepted_answer_reaches_preferences_across_a_sigkill_and_resume(tmp_path):
    """Three labelers at once, one answer asked per query, a SIGKILL after a round gathered
    answers and before it saved them, resume, a last round answered fast: every answer that
    got HTTP 201 is in preferences/ exactly once, and the server said 409 to late ones."""
    import sys

    run = tmp_path / "run"
    store = LabelStore(run / "labels.sqlite", run / "web")
    tokens = [t for _, t in store.add_labelers(3)]
    args = [*WEB_RUN, "labelers=3", "label_port=0", "max_feedback=12", "num_train_steps=1300",
            f"hydra.run.dir={run}"]
    env = {**os.environ, "THEMIS_THREADS": "1", "PYTHONPATH": str(ROOT)}
    dying = subprocess.Popen([sys.executable, "-c", KILL_BEFORE_SAVE, *args], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    bots = Bots(run, tokens)
    out, _ = dying.communicate(timeout=600)
    assert dying.returncode == -signal.SIGKILL, out[-3000:]
    accepted_before = len(bots.accepted)
    assert accepted_before >= 4  # the first round's queries were answered, then it died
    (run / "web" / "server.json").unlink(missing_ok=True)  # the dead server's address

    resumed = subprocess.run([str(ROOT / "themis_train.sh"), f"resume={run}"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=600)
    bots.join()
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "keeps the link printed when it was created" in resumed.stdout  # hashes only
    answers = store.db.execute("SELECT id, label FROM answers WHERE label IS NOT NULL "
                               "ORDER BY id").fetchall()
    labels = pd.read_csv(run / "preferences" / "labels.csv", dtype={"answers": str},
                         keep_default_na=False)
    in_dataset = [int(a) for joined in labels["answers"] for a in joined.split(";")]
    assert sorted(in_dataset) == [a for a, _ in answers]  # every labelled answer, once
    assert len(bots.accepted) == store.db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
    by_label = dict(answers)
    expected = {"left": 0.0, "right": 1.0, "equal": 0.5}
    assert [by_label[int(a)] for a in labels["answers"]] == labels["label"].tolist()
    assert sorted(expected[lab] for _, lab in bots.accepted if lab != "skip") == \
        sorted(by_label.values())
    assert 409 in bots.codes or len(bots.accepted) == 12  # three labelers raced for queries
    # nothing was lost to a full dataset: the run asked 12 queries, people answered them all
    assert store.pending_count() == 0 and store.ungathered_count() == 0


# ------------------------------------------------------------------ crowd quality: gold
def test_gold_queries_score_labelers_and_give_no_training_label(tmp_path):
    store = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    rng = np.random.default_rng(0)
    n = 6
    true = np.zeros((n, 2, 5), np.float32)
    true[:, 1] = 1.0  # segment 2 is better in every pair: the oracle says 1
    pairs = SegmentPairs(rng.normal(size=(n, 2, 5, 3)).astype(np.float32),
                         np.zeros((n, 2, 5, 1), np.float32), true, np.zeros((n, 2), np.int64))
    gold = np.array([np.nan, np.nan, 1.0, np.nan, 1.0, 1.0])
    ids = store.post(1, pairs, [tmp_path / f"c{i}.mp4" for i in range(n)], labels_needed=2,
                     gold=gold)
    for qid in ids:  # ann answers like the oracle; bob the opposite; carl only some
        store.answer(qid, "ann", 1.0)
        store.answer(qid, "bob", 0.0)
    scores = {s["labeler"]: s for s in crowd.labeler_scores(store, min_gold_answers=2,
                                                            min_gold_accuracy=0.7)}
    assert scores["ann"]["gold_answers"] == 3 and scores["ann"]["gold_accuracy"] == 1.0
    assert scores["bob"]["gold_accuracy"] == 0.0 and scores["bob"]["flagged"]
    assert not scores["ann"]["flagged"]
    assert scores["ann"]["agreement"] == 0.0 and scores["ann"]["oracle_agreement"] == 1.0
    assert crowd.flagged(store, 2, 0.7) == {"bob"}
    got = store.gather()  # gold queries are taken (marked used later) but give no label
    assert got.query_ids == ids and len(got.labels) == 2 * 3
    filtered = store.gather("majority", exclude={"bob"})  # bob's answers: never aggregated,
    assert filtered.labels.tolist() == [1.0, 0.0] * 3  # each a label of its own (kept on disk)
    assert filtered.labelers == ["human:majority:ann", "human:bob"] * 3


def test_web_channel_mixes_gold_queries_in_and_counts_only_the_others(tmp_path):
    from themis.feedback.channels import WebChannel

    class Clips:
        def write_web_clips(self, queries, number):
            return [tmp_path / f"r{number}_{i}.mp4" for i in range(len(queries))]

    store = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    channel = WebChannel(store, Clips(), 1, "each", lambda *a: None, lambda: 1,
                         gold_fraction=0.5, gold_answers=3, rng=np.random.default_rng(0))
    rng = np.random.default_rng(1)

    def pairs(n, mark):
        obs = np.full((n, 2, 4, 2), mark, np.float32)
        return SegmentPairs(obs, np.zeros((n, 2, 4, 1), np.float32),
                            rng.normal(size=(n, 2, 4)).astype(np.float32),
                            np.zeros((n, 2), np.int64))

    channel.gold = (pairs(3, 7.0), np.array([1.0, 0.0, 1.0]))
    assert channel.post(pairs(6, 0.0)) == 6  # gold queries are not queries asked
    rows = store.db.execute("SELECT id, gold, labels_needed FROM queries ORDER BY id").fetchall()
    assert len(rows) == 9 and sum(g is not None for _, g, _ in rows) == 3
    assert {need for _, g, need in rows if g is not None} == {3}  # every labeler answers gold
    positions = [i for i, (_, g, _) in enumerate(rows) if g is not None]
    assert positions != [6, 7, 8]  # mixed in, not appended
    for qid, g, _ in rows:  # the gold rows hold the gold pairs
        with np.load(tmp_path / "web" / "queries" / f"q_{qid:06d}.npz") as data:
            assert (data["observations"] == 7.0).all() == (g is not None)
    assert channel.gold is None


def test_training_leaves_out_flagged_labelers_earlier_labels_too(compose, tmp_path):
    from themis.builder import make_workspace

    ws = make_workspace(compose([*WEB_RUN, "labelers=2", "gold_fraction=0.5",
                                 "label_quality=filter", "min_gold_answers=1"]), tmp_path)
    learner = ws.learner
    rng = np.random.default_rng(0)
    n = 4
    pairs = SegmentPairs(rng.normal(size=(n, 2, 20, 3)).astype(np.float32),
                         rng.uniform(-1, 1, (n, 2, 20, 1)).astype(np.float32),
                         np.zeros((n, 2, 20), np.float32), np.zeros((n, 2), np.int64))
    learner.record(pairs.take(np.arange(2)), np.array([0.0, 1.0]), "human:labeler1")
    learner.record(pairs.take(np.arange(2, 4)), np.array([1.0, 1.0]), "human:labeler2")
    assert learner.training_rows() is None  # nobody flagged yet
    true = np.zeros((1, 2, 20), np.float32)
    true[:, 1] = 1.0
    gold = SegmentPairs(pairs.observations[:1], pairs.actions[:1], true,
                        np.zeros((1, 2), np.int64))
    (qid,) = ws.label_store.post(1, gold, [tmp_path / "g.mp4"], 2, gold=np.array([1.0]))
    ws.label_store.answer(qid, "labeler1", 1.0)
    ws.label_store.answer(qid, "labeler2", 0.0)  # wrong on gold: flagged
    assert learner.training_rows().tolist() == [0, 1]
    fit = learner.trainer.train(learner.dataset, 2, rows=learner.training_rows())
    assert fit.epochs >= 1
    ws.logger.close()


def test_web_skips_reach_reward_csvs_skipped_column(compose, tmp_path):
    """A "can't tell" on the page counts as a skipped query in the round (reward.csv
    ``skipped``, the eval rows' skip_fraction), as a terminal skip does."""
    from themis.builder import make_workspace

    ws = make_workspace(compose(WEB_RUN), tmp_path)
    rng = np.random.default_rng(0)
    n = 3
    pairs = SegmentPairs(rng.normal(size=(n, 2, 20, 3)).astype(np.float32),
                         rng.uniform(-1, 1, (n, 2, 20, 1)).astype(np.float32),
                         rng.normal(size=(n, 2, 20)).astype(np.float32), np.zeros((n, 2), np.int64))
    ids = ws.label_store.post(1, pairs, [tmp_path / f"c{i}.mp4" for i in range(n)], 1)
    ws.label_store.answer(ids[0], "local", 1.0)
    ws.label_store.answer(ids[1], "local", None)  # can't tell
    ws.label_store.answer(ids[2], "local", None)
    report = ws.learner.round(None, 0, False, 0, [], [], ask=False)
    assert (report.labeled_feedback, report.skipped) == (1, 2)
    assert len(ws.learner.dataset) == 1
    assert ws.learner.stats.as_dict()["skip_fraction"] == pytest.approx(2 / 3)
    ws.logger.close()


def test_web_labels_keep_the_time_the_person_answered(compose, tmp_path):
    from themis.builder import make_workspace
    from themis.reward import PreferenceDataset

    ws = make_workspace(compose([*WEB_RUN, "label_aggregate=majority", "labels_per_query=2",
                                 "labelers=2"]),
                        tmp_path)
    rng = np.random.default_rng(0)
    n = 3
    pairs = SegmentPairs(rng.normal(size=(n, 2, 20, 3)).astype(np.float32),
                         rng.uniform(-1, 1, (n, 2, 20, 1)).astype(np.float32),
                         rng.normal(size=(n, 2, 20)).astype(np.float32), np.zeros((n, 2), np.int64))
    ids = ws.label_store.post(1, pairs, [tmp_path / f"c{i}.mp4" for i in range(n)], 2)
    given = {}  # answered an hour ago, one answer a minute
    for i, (qid, who) in enumerate((q, w) for q in ids[:2] for w in ("ann", "bob")):
        aid = ws.label_store.answer(qid, who, 1.0)
        given[qid] = time.time() - 3600 + 60 * i
        ws.label_store.db.execute("UPDATE answers SET created=? WHERE id=?", (given[qid], aid))
    ws.learner.round(None, 0, False, 0, [], [], ask=False)  # gathers, saves, trains
    assert len(ws.learner.dataset) == 2
    expected = [given[ids[0]], given[ids[1]]]  # a majority label: its last answer's time
    assert ws.learner.dataset.timestamps[:2].tolist() == pytest.approx(expected, abs=1e-3)
    saved = PreferenceDataset.load(tmp_path / "preferences")
    assert saved.timestamps[:2].tolist() == pytest.approx(expected, abs=1e-3)
    ws.logger.close()


@pytest.mark.slow
def test_a_simulated_crowd_gets_its_adversary_flagged_by_gold_queries(tmp_path):
    import sys

    tiny = [o for o in TINY_PENDULUM if not o.startswith(("reward_batch", "max_feedback"))]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "simulate_crowd.py"), "--careful", "2",
         "--careful-mistakes", "0", "--random", "0", "--adversaries", "1",
         "--labels-per-query", "1", "--gold-fraction", "0.5", "--min-gold-answers", "2",
         "--modes", "filter", "model", "--out", str(tmp_path), "--", *tiny, "reward_batch=4",
         "max_feedback=16", "num_train_steps=1500"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
        env={**os.environ, "THEMIS_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| filter"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "labeler3 (adversary)"  # the adversary, and only it
    assert cells[2].startswith("labeler3: ") and int(cells[2].split(": ")[1]) >= 2
    assert float(cells[4]) == 1.0  # the training labels left agree with the true returns
    status = crowd.labeler_scores(LabelStore(tmp_path / "filter" / "labels.sqlite"), 2, 0.7)
    assert [s["flagged"] for s in status] == [False, False, True]
    # Dawid–Skene learns from the gold queries that the adversary flips every answer and
    # reads its answers flipped, and drops no label. A query the adversary answered in a round
    # before it had answered any gold can still be read its way (bot timing decides; measured
    # 16 of 16 and 15 of 16 right), the adversary alone would be 0 of 16
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| model"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[4]) >= 0.85 and int(cells[3]) > 0


def _pairs(n: int, seed: int = 0, horizon: int = 20) -> SegmentPairs:
    rng = np.random.default_rng(seed)
    return SegmentPairs(rng.normal(size=(n, 2, horizon, 3)).astype(np.float32),
                        rng.uniform(-1, 1, (n, 2, horizon, 1)).astype(np.float32),
                        rng.normal(size=(n, 2, horizon)).astype(np.float32),
                        np.zeros((n, 2), np.int64))


@pytest.mark.parametrize("aggregate", ["each", "majority"])
def test_run_end_keeps_the_answers_of_partly_answered_queries(compose, tmp_path, aggregate):
    """labels_per_query=3, the run ends with queries answered by 1 or 2 people: their answers
    reach preferences/ (each a label, or their majority), and the queries are closed."""
    from themis.builder import make_workspace

    ws = make_workspace(compose([*WEB_RUN, "labelers=3", "labels_per_query=3",
                                 f"label_aggregate={aggregate}"]), tmp_path)
    store = ws.label_store
    ids = store.post(1, _pairs(4), [tmp_path / f"c{i}.mp4" for i in range(4)], 3)
    store.answer(ids[0], "labeler1", 0.0)
    store.answer(ids[0], "labeler2", 0.0)
    store.answer(ids[1], "labeler3", 1.0)
    store.answer(ids[2], "labeler1", None)  # a skip: no label, nothing to keep
    finish(ws)
    labels = pd.read_csv(tmp_path / "preferences" / "labels.csv", dtype={"answers": str},
                         keep_default_na=False)
    answers = dict(store.db.execute("SELECT id, label FROM answers"))
    if aggregate == "each":
        assert labels["label"].tolist() == [0.0, 0.0, 1.0]
        assert sorted(int(a) for a in labels["answers"]) == sorted(
            a for a, lab in answers.items() if lab is not None)
    else:
        assert labels["label"].tolist() == [0.0, 1.0]
        assert [len(a.split(";")) for a in labels["answers"]] == [2, 1]
    assert store.ungathered_count(partial=True) == 0
    with pytest.raises(QueryFull):  # closed: a late answer is refused, not lost
        store.answer(ids[0], "labeler3", 1.0)
    assert store.next_query("labeler2") == ids[3]  # a query nobody answered is still served


def test_a_flagged_labelers_later_answers_stay_in_preferences_out_of_training(compose, tmp_path):
    """label_quality=filter: answers given after a labeler was flagged are saved (and their
    queries used) but not trained on."""
    from themis.builder import make_workspace

    ws = make_workspace(compose([*WEB_RUN, "labelers=2", "gold_fraction=0.5",
                                 "label_quality=filter", "min_gold_answers=1"]), tmp_path)
    store = ws.label_store
    true = np.zeros((1, 2, 20), np.float32)
    true[:, 1] = 1.0
    one = _pairs(1)
    gold = SegmentPairs(one.observations, one.actions, true, one.starts)
    (gid,) = store.post(1, gold, [tmp_path / "g.mp4"], 2, gold=np.array([1.0]))
    store.answer(gid, "labeler1", 1.0)
    store.answer(gid, "labeler2", 0.0)  # wrong on gold: flagged
    ids = store.post(1, _pairs(3, seed=1), [tmp_path / f"c{i}.mp4" for i in range(3)], 1)
    store.answer(ids[0], "labeler2", 0.0)
    store.answer(ids[1], "labeler1", 1.0)
    store.answer(ids[2], "labeler2", 1.0)
    before = len(ws.learner.dataset)
    assert ws.feedback_round(ask=False)  # a round was held: r̂ may have changed
    assert len(ws.learner.dataset) - before == 3
    assert pd.read_csv(tmp_path / "reward.csv")["new_labels"].tolist()[-1] == 3  # its row
    labels = pd.read_csv(tmp_path / "preferences" / "labels.csv", dtype={"answers": str})
    assert labels["labeler"].tolist() == ["human:labeler2", "human:labeler1", "human:labeler2"]
    assert ws.learner.training_rows().tolist() == [1]  # only labeler1's label is trained on
    assert store.ungathered_count(partial=True) == 0
    ws.logger.close()


# ------------------------------------------------------------------ a crash in the first round
def test_a_crash_while_people_answer_the_first_round_resumes_with_every_answer(compose,
                                                                               tmp_path):
    """People's first round is preceded by a checkpoint: a crash after its queries were posted
    resumes from it, the resumed round posts nothing again and gathers every answer."""
    from themis.builder import make_workspace
    from themis.run.checkpoint import load_checkpoint

    ws = make_workspace(compose([*WEB_RUN, "label_port=0"]), tmp_path)
    ws.run(until=401)  # pretraining to step 400, then the first round posts 4 queries
    ws.label_server.stop()
    ws.logger.close()
    store = ws.label_store
    ids = [r[0] for r in store.db.execute("SELECT id FROM queries ORDER BY id")]
    assert len(ids) == 4
    # the crash: the run died after posting, before the checkpoint that follows the round
    (tmp_path / "checkpoints" / "state.pt").unlink()
    state, _ = load_checkpoint(tmp_path / "checkpoints")
    assert state["step"] == 400 and state["feedback_rounds"] == 0 and state["dataset_size"] == 0
    first = store.answer(ids[0], "local", 1.0)
    second = store.answer(ids[2], "local", 0.0)

    resumed = make_workspace(compose([*WEB_RUN, "label_port=0", "resume=true",
                                      "min_labels_before_training=2"]), tmp_path)
    resumed.run(until=402)
    resumed.label_server.stop()
    assert store.db.execute("SELECT COUNT(*) FROM queries").fetchone()[0] == 4  # not again
    assert resumed.total_feedback == 4 and resumed.learner.rounds == 1
    data = resumed.learner.dataset
    assert len(data) == 2 and sorted(data.answer_ids()) == [first, second]
    saved = pd.read_csv(tmp_path / "preferences" / "labels.csv", dtype={"answers": str})
    assert sorted(saved["answers"].astype(int)) == [first, second]
    resumed.logger.close()


def _every_answer_once_in_preferences(run: Path, store: LabelStore, bots: Bots) -> None:
    """Every answer that got HTTP 201 is in the store, every labelled answer in the store is in
    ``preferences/`` exactly once, with its label."""
    stored = store.db.execute("SELECT id, query_id, labeler, label FROM answers").fetchall()
    given = {(q, f"labeler{bot + 1}", lab) for q, bot, lab in bots.given}
    value = {"left": 0.0, "right": 1.0, "equal": 0.5, "skip": None}
    assert {(q, who, value[lab]) for q, who, lab in given} <= \
        {(q, who, lab) for _, q, who, lab in stored}  # nothing accepted was lost
    labels = pd.read_csv(run / "preferences" / "labels.csv", dtype={"answers": str},
                         keep_default_na=False)
    in_dataset = [int(a) for joined in labels["answers"] for a in joined.split(";")]
    assert sorted(in_dataset) == sorted(a for a, _, _, lab in stored if lab is not None)
    by_id = {a: lab for a, _, _, lab in stored}
    assert [by_id[int(a)] for a in labels["answers"]] == labels["label"].tolist()


@pytest.mark.slow
def test_a_sigkill_while_the_first_round_waits_for_people_loses_no_answer(tmp_path):
    """min_labels_before_training=3: the first round waits for people; two answers are in and
    the run is killed before it could checkpoint after the round. Resume keeps both, posts
    the round's queries only once, and the run ends with every answer in preferences/."""
    run = tmp_path / "run"
    proc = start_run(run, "max_feedback=8", "min_labels_before_training=3",
                     "num_train_steps=800")
    url = server_url(run, proc)
    for label in ("left", "right"):
        qid = wait_for_query(url)
        assert httpx.post(url + "api/answers", json={"query_id": qid, "label": label},
                          timeout=10).status_code == 201
    time.sleep(1.0)  # still waiting for a third label
    assert proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not (run / "reward.csv").exists()  # killed inside the first round
    (run / "web" / "server.json").unlink()

    resumed = subprocess.Popen([str(ROOT / "themis_train.sh"), f"resume={run}"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "THEMIS_THREADS": "1"})
    url = server_url(run, resumed)
    qid = wait_for_query(url)
    httpx.post(url + "api/answers", json={"query_id": qid, "label": "equal"}, timeout=10)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out[-3000:]
    assert "posted its 4 queries before the run stopped" in out
    store = LabelStore(run / "labels.sqlite")
    assert store.db.execute("SELECT COUNT(*) FROM queries WHERE round=1").fetchone()[0] == 4
    labels = pd.read_csv(run / "preferences" / "labels.csv")
    assert labels["label"].tolist()[:3] == [0.0, 1.0, 0.5]
    assert pd.read_csv(run / "reward.csv")["total_feedback"].tolist() == [4, 8]


@pytest.mark.xdist_group("busy")  # a run, bots and kills on a clock
@pytest.mark.slow
def test_random_sigkills_during_a_web_run_with_bot_labelers_lose_and_duplicate_nothing(
        tmp_path):
    """Property: three bot labelers answer over HTTP (two answers asked per query, the first
    round waits for six labels) while the run is killed with SIGKILL at random points and
    resumed, three times: a random moment after the server is up, or a random moment after
    a random number of accepted answers (the first kill while the first round waits). At the
    end every accepted answer is in preferences/ exactly once, and each round's queries were
    posted once."""
    import random

    rng = random.Random(int(os.environ.get("THEMIS_KILL_SEED", "33")))  # other kill points
    run = tmp_path / "run"
    store = LabelStore(run / "labels.sqlite", run / "web")
    tokens = [t for _, t in store.add_labelers(3)]
    first = [*WEB_RUN, "labelers=3", "labels_per_query=2", "min_labels_before_training=6",
             "label_port=0", "max_feedback=12", "num_train_steps=1300", f"hydra.run.dir={run}"]
    env = {**os.environ, "THEMIS_THREADS": "1"}
    bots = Bots(run, tokens, pause=0.5)
    args, kills, answers, ended = first, [], 0, False
    for k in range(3):
        started = time.time()
        proc = subprocess.Popen([str(ROOT / "themis_train.sh"), *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out: list[str] = []
        reader = threading.Thread(target=lambda p=proc, o=out: o.append(p.stdout.read()),
                                  daemon=True)
        reader.start()
        if k > 0 and rng.random() < 0.5:  # a random moment after the server is up
            server_url(run, proc, after=started - 1)
            later = rng.uniform(0, 6)
            point = f"{later:.1f} s after the server was up"
        else:  # a random moment after a random number of answers
            answers = rng.randint(1, 5) if k == 0 else rng.randint(answers + 1, answers + 8)
            deadline = time.time() + 180
            while proc.poll() is None and len(bots.given) < answers and time.time() < deadline:
                time.sleep(0.02)
            later = rng.uniform(0, 1.5)
            point = f"{later:.1f} s after {answers} answers"
        time.sleep(later)
        if proc.poll() is not None:
            reader.join(timeout=30)
            break  # it finished before this kill point
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills.append(f"{point} (given {len(bots.given)})")
        (run / "web" / "server.json").unlink(missing_ok=True)
        if resume_problem(run, []) is not None:  # killed after the run's end: it had finished
            ended = True
            break
        ckpt = run / "checkpoints"
        if (ckpt / "state.pt.sha256").exists() or (ckpt / "state.prev.pt.sha256").exists():
            args = [f"resume={run}"]
        else:  # killed before the first checkpoint: then nobody could have answered yet
            assert store.db.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == 0, kills
            for path in run.iterdir():
                if not path.name.startswith("labels.sqlite"):
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            args = first
    else:
        proc = subprocess.Popen([str(ROOT / "themis_train.sh"), *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = [proc.communicate(timeout=400)[0]]
    proc.wait(timeout=400)
    bots.join()
    assert proc.returncode == 0 or ended, (kills, out[-1][-3000:] if out else "")
    assert len(kills) >= 2, kills  # the kill points fell inside the runs
    _every_answer_once_in_preferences(run, store, bots)
    assert store.ungathered_count(partial=True) == 0  # the run's end took partial queries too
    rounds = store.db.execute("SELECT round, COUNT(*) FROM queries GROUP BY round").fetchall()
    assert rounds == [(1, 4), (2, 4), (3, 4)], (kills, rounds)  # each round posted once
    assert pd.read_csv(run / "reward.csv")["total_feedback"].iloc[-1] == 12


@pytest.mark.slow
def test_random_sigkills_of_an_async_web_run_lose_no_answer_the_named_tool_recovers(tmp_path):
    """Property, reward_training=async: three bot labelers answer over HTTP while the run is
    killed with SIGKILL at a random moment after a random number of accepted answers
    (THEMIS_KILL_SEED picks other kill points). An async run cannot be resumed; the line that
    says so names scripts/store_to_prefs.py, and that tool's dataset holds every accepted
    answer exactly once (preferences/, written by the learner at its rounds, may hold
    fewer)."""
    import random

    rng = random.Random(int(os.environ.get("THEMIS_KILL_SEED", "65")))
    env = {**os.environ, "THEMIS_THREADS": "1"}
    for k in range(1):
        run = tmp_path / f"run{k}"
        store = LabelStore(run / "labels.sqlite", run / "web")
        tokens = [t for _, t in store.add_labelers(3)]
        bots = Bots(run, tokens, pause=0.2)
        proc = subprocess.Popen([str(ROOT / "themis_train.sh"), *WEB_RUN, "labelers=3",
                                 "reward_training=async", "label_port=0", "max_feedback=16",
                                 "num_train_steps=100000", f"hydra.run.dir={run}"], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        answers = rng.randint(2, 7)
        deadline = time.time() + 240
        while proc.poll() is None and len(bots.given) < answers and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 1.5))
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        bots.join()
        assert bots.given, "nobody could answer before the kill"
        resumed = subprocess.run([str(ROOT / "themis_train.sh"), f"resume={run}"], cwd=ROOT,
                                 env=env, capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 2, resumed.stderr[-2000:]
        assert "scripts/store_to_prefs.py RUN_DIR DIR" in resumed.stderr  # the named path
        recovered = store_to_prefs(str(run), str(tmp_path / f"recovered{k}"))
        assert recovered.returncode == 0, recovered.stderr
        stored = store.db.execute("SELECT id, query_id, labeler, label FROM answers").fetchall()
        value = {"left": 0.0, "right": 1.0, "equal": 0.5, "skip": None}
        assert {(q, f"labeler{bot + 1}", value[lab]) for q, bot, lab in bots.given} <= \
            {(q, who, lab) for _, q, who, lab in stored}  # nothing accepted was lost
        labels = pd.read_csv(tmp_path / f"recovered{k}" / "labels.csv", dtype={"answers": str},
                             keep_default_na=False)
        in_dataset = [int(a) for joined in labels["answers"] for a in joined.split(";")]
        assert sorted(in_dataset) == sorted(a for a, _, _, lab in stored if lab is not None)
        by_id = {a: lab for a, _, _, lab in stored}
        assert [by_id[int(a)] for a in labels["answers"]] == labels["label"].tolist()


def test_resume_of_an_async_web_run_names_the_tool_that_has_every_answer(compose, tmp_path):
    from themis.builder import make_workspace
    from themis.utils import ConfigError

    with pytest.raises(ConfigError, match=r"scripts/store_to_prefs\.py RUN_DIR DIR"):
        make_workspace(compose([*WEB_RUN, "reward_training=async", "resume=true"]), tmp_path)


def test_resume_without_a_checkpoint_names_the_tool_that_keeps_the_answers(compose, tmp_path):
    from themis.builder import make_workspace
    from themis.utils import ConfigError

    store, ids = posted_store(tmp_path)  # a store of an earlier version's run, no checkpoint
    store.answer(ids[0], "local", 1.0)
    with pytest.raises(ConfigError, match=r"scripts/store_to_prefs\.py"):
        make_workspace(compose([*WEB_RUN, "resume=true"]), tmp_path)
