"""Web labeling: the label store, the API (tokens, hostile input, fuzzing), many labelers at
once, a real run labelled over HTTP and in headless Chromium, and a kill mid-round."""

from __future__ import annotations

import json
import os
import shutil
import signal
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
from themis.buffers import SegmentPairs
from themis.label_store import DuplicateAnswer, LabelStore, UnknownQuery


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
    taken, pairs, labels, labelers, n = store.gather()
    assert taken == ids[:2] and n == 2
    assert labels.tolist() == [0.0] and labelers == ["human:ann"]  # the skip gives no label
    assert pairs is not None and pairs.observations.shape == (1, 2, 5, 3)
    assert store.gather()[4] == 0  # nothing twice


def test_majority_aggregation_and_agreement(tmp_path):
    store, ids = posted_store(tmp_path, n=2, labels_needed=3)
    for who, label in (("a", 1.0), ("b", 1.0), ("c", 0.0)):
        store.answer(ids[0], who, label)
    for who, label in (("a", 0.0), ("b", 1.0), ("c", None)):
        store.answer(ids[1], who, label)
    assert store.status()["agreement"] == pytest.approx(1 / 4)  # 1 of 4 pairs agrees
    _, _, labels, labelers, _ = store.gather("majority")
    assert labels.tolist() == [1.0, 0.5] and labelers[0] == "human:majority:a,b,c"


# ------------------------------------------------------------------------------ the API
def test_api_answers_with_tokens_and_rejects_hostile_requests(tmp_path):
    store, ids = posted_store(tmp_path)
    (name, token), (_, other) = store.add_labelers(2)
    client = TestClient(create_app(store, tmp_path))
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
    # another labeler may answer the same query; the first one cannot
    assert client.post("/api/answers", json={"query_id": ids[0], "label": "right"},
                       headers={"X-Themis-Token": other}).status_code == 201
    status = client.get("/api/status", headers=auth).json()
    assert status["answers"] == 2 and status["answers_per_labeler"] == {"labeler1": 1,
                                                                         "labeler2": 1}
    assert "Which clip is better?" in client.get(f"/?token={token}").text


def test_openapi_fuzzing_never_gets_a_server_error(tmp_path):
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    store, _ = posted_store(tmp_path)
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(store, tmp_path))
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


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed "
                    "(.ci/run installs it)")
def test_labeling_in_headless_chromium_trains_the_reward_model(tmp_path):
    from playwright.sync_api import sync_playwright

    run = tmp_path / "run"
    proc = start_run(run, "min_labels_before_training=3")
    url = server_url(run, proc)
    wait_for_query(url)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True,
                                    args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(url)
        page.wait_for_selector("body[data-query]")
        first = page.evaluate("document.body.dataset.query")
        page.click("#left")  # by clicking
        page.wait_for_function(f"document.body.dataset.query !== '{first}'")
        second = page.evaluate("document.body.dataset.query")
        page.keyboard.press("2")  # by keyboard
        page.wait_for_function(f"document.body.dataset.query !== '{second}'")
        page.click("#equal")
        page.wait_for_function("document.getElementById('answered').textContent === '3'")
        status = browser.new_page()
        status.goto(url + "status")
        status.wait_for_function("document.getElementById('answers').textContent === '3'")
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
def test_killed_run_keeps_every_answer_and_resume_serves_pending_queries(tmp_path):
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

    started = time.time()
    resumed = subprocess.Popen([str(ROOT / "themis_train.sh"), f"resume={run}"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "THEMIS_THREADS": "1"})
    url = server_url(run, resumed, after=started - 1)  # a new free port
    served = wait_for_query(url)
    assert served in pending  # the still-pending queries are served again
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
    from themis.train import make_workspace

    ws = make_workspace(compose([*WEB_RUN, "xplain_state=true", "label_port=0"]),
                        tmp_path)
    ws.run()
    ws.finish()
    clips = sorted((tmp_path / "web" / "clips").glob("*.mp4"))
    assert len(clips) == 3 * 4  # 3 rounds of 4 queries posted, nobody answered, training went on
    reader = imageio_ffmpeg.read_frames(str(clips[0]))
    assert next(reader)["size"][1] == BANNER + 2 * 48  # frame + reward panel
    reader.close()
    assert len(ws.learner.dataset) == 0
    assert LabelStore(tmp_path / "labels.sqlite").pending_count() > 0


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
        urls = [proc.stdout.readline().split(": ", 1)[1].strip() for _ in range(2)]
        assert all("?token=" in u for u in urls)
        port = int(urls[0].split(":")[2].split("/")[0])
        assert port > 0
        token = urls[0].split("token=")[1]
        nxt = httpx.get(f"http://127.0.0.1:{port}/api/next?token={token}", timeout=10).json()
        assert nxt["query_id"] == 1 and nxt["labeler"] == "labeler1"
        assert httpx.get(f"http://127.0.0.1:{port}/api/next", timeout=10).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)
