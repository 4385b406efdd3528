"""teacher=vlm: a vision-language model labels pairs through an OpenAI-compatible endpoint.

The endpoint is a real HTTP server started on 127.0.0.1 by the tests and stopped by them
(tests/fake_openai_server.py: the brighter segment wins), spoken to by the official ``openai``
client as a run does.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY_PENDULUM, launch
from tests.fake_openai_server import FakeOpenAIServer, decode_image
from themis.agents.buffers import SegmentPairs
from themis.feedback.channels import CrowdVLMChannel, VLMChannel, VLMGold
from themis.feedback.vlm import VLMStats, VLMTeacher, make_client
from themis.feedback.vlm_cache import CACHE_FILE, AnswerCache
from themis.feedback.vlm_prompt import load_prompt, parse_label, task_description
from themis.utils import ConfigError

KEY = "sk-test-do-not-write-me-0123456789"
MODEL = "fake-vlm"


@pytest.fixture
def server():
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture(autouse=True)
def _api_key(monkeypatch):
    monkeypatch.setenv("THEMIS_VLM_API_KEY", KEY)


def frames_of(brightness: list[tuple[int, int]], horizon: int = 5, size: int = 8) -> np.ndarray:
    """Frames ``(n, 2, H, size, size, 3)``: each segment's frames grey at its brightness (the
    last frame of segment 1 a little darker, so ``last`` and ``key`` see them alike)."""
    out = np.zeros((len(brightness), 2, horizon, size, size, 3), np.uint8)
    for i, (a, b) in enumerate(brightness):
        out[i, 0], out[i, 1] = a, b
    return out


def pairs_of(n: int, true: list[tuple[float, float]] | None = None,
             horizon: int = 5) -> SegmentPairs:
    rewards = np.zeros((n, 2, horizon), np.float32)
    for i, (a, b) in enumerate(true or []):
        rewards[i, 0], rewards[i, 1] = a, b
    return SegmentPairs(np.zeros((n, 2, horizon, 3), np.float32),
                        np.zeros((n, 2, horizon, 1), np.float32), rewards,
                        np.arange(2 * n, dtype=np.int64).reshape(n, 2) * horizon)


def teacher(server: FakeOpenAIServer, run: Path, *, timeout: float = 10.0, retries: int = 2,
            frames: str = "last", concurrency: int = 4) -> VLMTeacher:
    return VLMTeacher(make_client(server.base_url, timeout, retries), MODEL, load_prompt(),
                      task_description("", "HalfCheetah-v5"), AnswerCache(run / CACHE_FILE),
                      frames, 3, concurrency)


# ---------------------------------------------------------------- the request and the labels
def test_the_model_gets_both_segments_images_the_task_and_the_two_stage_prompt(server, tmp_path):
    vlm = teacher(server, tmp_path, frames="key")
    answers = vlm.ask(frames_of([(200, 10)]))
    assert [a.label for a in answers] == [0.0]  # the first segment is brighter
    first, second = server.requests
    assert first["model"] == second["model"] == MODEL
    assert first["authorization"] == f"Bearer {KEY}"
    parts = first["messages"][0]["content"]
    kinds = [p["type"] for p in parts]
    assert kinds == ["text", "image_url", "image_url", "image_url", "text", "image_url",
                     "image_url", "image_url", "text"]  # Image 1: 3 key frames, Image 2: 3
    images = [decode_image(p["image_url"]["url"]) for p in parts if p["type"] == "image_url"]
    assert images[0].shape == (8, 8, 3) and images[0].mean() == 200 and images[3].mean() == 10
    assert "Image 1" in parts[0]["text"] and "Image 2" in parts[4]["text"]
    assert "The goal is to make the two-legged cheetah robot run forward" in parts[-1]["text"]
    label_prompt = second["messages"][0]["content"]
    assert isinstance(label_prompt, str) and "VERDICT: 0" in label_prompt  # quotes stage 1
    assert "-1 if the analysis is unsure" in label_prompt


def test_labels_follow_the_rule_and_ties_are_cant_tell(server, tmp_path):
    stats = VLMStats()
    answers = teacher(server, tmp_path).ask(frames_of([(9, 200), (200, 9), (50, 50)]), stats)
    assert [a.label for a in answers] == [1.0, 0.0, None]
    assert answers[2].reason == "unsure"
    assert stats.requests == 6 and stats.cant_tell == 1 and stats.cache_hits == 0
    assert stats.prompt_tokens > 0 and stats.completion_tokens > 0
    assert stats.cost == pytest.approx(0.006)  # the endpoint reported 0.001 a request


@pytest.mark.parametrize("text,label,reason", [
    ("analysis...\n0", 0.0, ""), ("**1**", 1.0, ""), ("Answer: -1", None, "unsure"),
    ("equal", 0.5, ""), ("I think image 1.", None, "malformed"), ("", None, "malformed"),
])
def test_parse_label_reads_the_last_label_line(text, label, reason):
    got, why = parse_label(text)
    assert got == label and why.startswith(reason)


def test_a_malformed_answer_is_cant_tell_with_its_reason_kept(server, tmp_path):
    server.malformed = True
    answers = teacher(server, tmp_path).ask(frames_of([(200, 10)]))
    assert answers[0].label is None and answers[0].reason.startswith("malformed")
    row = json.loads((tmp_path / CACHE_FILE).read_text().splitlines()[0])
    assert row["label"] is None and row["reason"].startswith("malformed")
    assert "I am not sure" in row["texts"][1]


# ---------------------------------------------------------------- paid once, kept across crashes
def test_a_repeated_run_sends_no_request_twice(server, tmp_path):
    frames = frames_of([(200, 10), (10, 200)])
    first = teacher(server, tmp_path).ask(frames)
    assert len(server.requests) == 4
    stats = VLMStats()
    again = teacher(server, tmp_path).ask(frames, stats)  # a new process: the cache on disk
    assert len(server.requests) == 4 and stats.cache_hits == 2 and stats.requests == 0
    assert [a.label for a in again] == [a.label for a in first] == [0.0, 1.0]


def test_a_crash_mid_round_loses_no_answer(server, tmp_path):
    server.refuse_after = 4  # two queries answered (two requests each), then the run stops
    frames = frames_of([(200, 10), (10, 200), (30, 20), (20, 30)])
    with pytest.raises(ConfigError, match="refused the request with HTTP 400"):
        teacher(server, tmp_path, concurrency=1).ask(frames)
    assert len((tmp_path / CACHE_FILE).read_text().splitlines()) == 2  # on disk already
    with (tmp_path / CACHE_FILE).open("a") as f:
        f.write('{"key": "torn')  # a crash while writing a line: skipped on reading
    server.refuse_after, sent = None, len(server.requests)
    answers = teacher(server, tmp_path).ask(frames)  # resumed: only the two others are asked
    assert len(server.requests) - sent == 4
    assert [a.label for a in answers] == [0.0, 1.0, 0.0, 1.0]
    assert [a.cached for a in answers] == [True, True, False, False]


def test_requests_run_in_parallel_up_to_the_limit_and_are_told_in_order(server, tmp_path):
    server.delay = lambda arrival: 0.6 if arrival == 0 else 0.1  # the first query comes last
    frames = frames_of([(10 * i, 200 - 10 * i) for i in range(6)])
    told: list[int] = []
    teacher(server, tmp_path, concurrency=3).ask(frames, on_answer=lambda i, a: told.append(i))
    assert server.most_in_flight == 3 and len(server.requests) == 12
    assert told == list(range(6))  # the dataset's order does not depend on the network


def test_429_is_retried_with_the_clients_backoff(server, tmp_path):
    server.rate_limited = 2
    answers = teacher(server, tmp_path, retries=3).ask(frames_of([(200, 10)]))
    assert answers[0].label == 0.0 and len(server.requests) == 4  # 2 refused, 2 answered


def test_a_timeout_is_cant_tell_and_is_asked_again_next_time(server, tmp_path):
    server.delay = 1.0
    stats = VLMStats()
    answers = teacher(server, tmp_path, timeout=0.2, retries=0).ask(frames_of([(200, 10)]),
                                                                     stats)
    assert answers[0].label is None and "Timeout" in answers[0].reason
    assert stats.errors == 1 and not (tmp_path / CACHE_FILE).exists()  # nothing cached
    server.delay = 0.0
    assert teacher(server, tmp_path).ask(frames_of([(200, 10)]))[0].label == 0.0


def test_the_key_is_read_from_the_environment_and_never_written(server, tmp_path):
    vlm = teacher(server, tmp_path)
    vlm.ask(frames_of([(200, 10), (5, 6)]))
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path


# ---------------------------------------------------------------- the channels
def test_vlm_channel_labels_and_reports_agreement_tokens_and_cost(server, tmp_path):
    frames = frames_of([(200, 10), (10, 200), (50, 50), (10, 200)])
    # the oracle: pair 4's true returns disagree with its brightness
    pairs = pairs_of(4, [(1, 0), (0, 1), (0, 1), (1, 0)])
    channel = VLMChannel(teacher(server, tmp_path), "vlm:fake-vlm", lambda q: frames)
    assert channel.post(pairs) == 4
    got = channel.gather(pairs)
    assert got.keep.tolist() == [True, True, False, True]  # the tie is a skip
    assert got.labels.tolist() == [0.0, 1.0, 1.0] and got.labelers == ["vlm:fake-vlm"] * 3
    columns = channel.columns()
    assert columns["vlm_oracle_agreement"] == pytest.approx(2 / 3)
    assert columns["vlm_requests"] == 6 and columns["vlm_cost"] == pytest.approx(0.006)
    assert columns["vlm_cache_hits"] == 1  # pairs 2 and 4 look alike: asked once
    assert columns["vlm_cant_tell"] == 1 and columns["vlm_latency_s"] > 0
    assert channel.columns() == {}  # one round's numbers once


def test_vlm_gold_from_oracle_scores_the_vlm_and_filters_a_bad_one(server, tmp_path):
    frames = frames_of([(200, 10)] * 6)  # the VLM says "first" every time ...
    pairs = pairs_of(6, [(0, 1)] * 6)  # ... and the oracle "second": a wrong VLM
    gold = VLMGold(0.5, min_answers=2, min_accuracy=0.7, rng=np.random.default_rng(0))
    channel = VLMChannel(teacher(server, tmp_path), "vlm:fake-vlm", lambda q: frames, gold)
    channel.post(pairs)
    got = channel.gather(pairs)
    assert got.labelers.count("synthetic(gold:oracle)") == 3  # half of them gold
    assert all(label == 1.0 for label, who in zip(got.labels, got.labelers, strict=True)
               if who.startswith("synthetic"))  # the gold queries' labels are the oracle's
    columns = channel.columns()
    assert columns["vlm_gold_accuracy"] == 0.0 and columns["vlm_filtered"] == 1
    assert channel.flagged() == {"fake-vlm"}
    from themis.feedback.learner import flagged_rows

    assert flagged_rows(got.labelers, channel.flagged()).tolist() == \
        [w.startswith("vlm") for w in got.labelers]  # its labels leave training
    resumed = VLMChannel(channel.teacher, "vlm:fake-vlm", lambda q: frames,
                         VLMGold(0.5, 2, 0.7, np.random.default_rng(0)))
    resumed.load_state_dict(channel.state_dict())  # the learner's checkpoint keeps the score
    assert resumed.flagged() == {"fake-vlm"} and resumed.vlm_gold.answers == 3


class FakeClips:
    """What the web channel asks of ``lib.clips.ClipMaker``: frames by segment start, clip
    files."""

    def __init__(self, run: Path, frames: dict[int, np.ndarray]) -> None:
        self.run, self.by_start = run, frames

    def frames(self, queries: SegmentPairs) -> np.ndarray:
        return np.stack([self.by_start[int(s)] for s in queries.starts[:, 0]])

    def write_web_clips(self, queries: SegmentPairs, round_number: int) -> list[Path]:
        clips = self.run / "web" / "clips"
        clips.mkdir(parents=True, exist_ok=True)
        paths = [clips / f"round{round_number:04d}_{i:03d}.mp4" for i in range(len(queries))]
        for p in paths:
            p.write_bytes(b"clip")
        return paths


def test_a_vlm_labeler_in_a_crowd_has_a_gold_score_beside_people(server, tmp_path):
    from themis.crowd.aggregation import labeler_scores
    from themis.crowd.label_store import LabelStore

    store = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    store.add_labelers(1)
    pairs = pairs_of(4, [(1, 0), (0, 1), (1, 0), (0, 1)])
    brightness = [(200, 10), (10, 200), (11, 201), (12, 202)]  # wrong on the third
    frames = frames_of(brightness)
    clips = FakeClips(tmp_path, {int(s): f for s, f in zip(pairs.starts[:, 0], frames,
                                                            strict=True)})
    gold_pairs = pairs_of(2, [(1, 0), (0, 1)])
    gold_pairs = SegmentPairs(*gold_pairs[:3], gold_pairs.starts + 1000)
    for s, f in zip(gold_pairs.starts[:, 0], frames_of([(200, 10), (10, 200)]), strict=True):
        clips.by_start[int(s)] = f
    channel = CrowdVLMChannel(teacher(server, tmp_path), "vlm:fake-vlm", store, clips, 2,
                              "model", lambda *a: None, lambda: 1, gold_fraction=0.5,
                              gold_answers=2, rng=np.random.default_rng(0))
    channel.gold = (gold_pairs, np.array([0.0, 1.0]))
    assert channel.post(pairs) == 4
    for qid, oracle in store.db.execute("SELECT id, oracle FROM queries").fetchall():
        store.answer(qid, "labeler1", oracle)  # a careful person
    scores = {s["labeler"]: s for s in labeler_scores(store, min_gold_answers=1)}
    assert scores["vlm:fake-vlm"]["gold_answers"] == 2
    assert scores["vlm:fake-vlm"]["gold_accuracy"] == 1.0
    assert scores["vlm:fake-vlm"]["oracle_agreement"] == pytest.approx(5 / 6)
    assert scores["labeler1"]["oracle_agreement"] == 1.0
    from themis.crowd.audit import labeler_table, load_answers

    audit = labeler_table(load_answers(tmp_path / "labels.sqlite"), min_gold_answers=1)
    assert audit.loc["vlm:fake-vlm", "gold_answers"] == 2  # the audit shows it as a person
    assert "kappa_labeler1" in audit.columns
    got = channel.gather(pairs)  # Dawid–Skene over the person and the VLM
    assert len(got.labels) == 4
    columns = channel.columns()  # 6 queries (2 gold) whose 2 gold ones look like 2 others:
    assert (columns["vlm_queries"], columns["vlm_cache_hits"], columns["vlm_requests"]) == \
        (6, 2, 8)  # the same images are not paid twice


def test_a_web_run_with_teacher_vlm_has_the_vlm_in_its_crowd(compose, server, tmp_path):
    from themis.builder import make_workspace
    from themis.feedback.factory import teacher_name

    cfg = compose([*TINY_PENDULUM, "human_teacher=true", "teacher_ui=web", "label_port=0",
                   "labelers=2", "labels_per_query=3", "teacher=vlm", "human_frame_size=32",
                   f"vlm_base_url={server.base_url}", f"vlm_model={MODEL}"])
    ws = make_workspace(cfg, tmp_path)
    try:
        channel = ws.learner.channel
        assert isinstance(channel, CrowdVLMChannel) and channel.vlm_labeler == "vlm:fake-vlm"
        assert channel.gold_answers == 3  # a gold query waits for both people and the VLM
        assert teacher_name(ws.cfg) == "human:labeler1…labeler2 and vlm:fake-vlm (web links)"
    finally:
        ws.logger.close()


# ---------------------------------------------------------------- config and received runs
@pytest.mark.parametrize("overrides,message", [
    (["teacher=vlm"], "teacher=vlm needs vlm_base_url"),
    (["teacher=vlm", "vlm_base_url=http://127.0.0.1:1/v1"], "teacher=vlm needs vlm_model"),
    (["teacher=vlm", "vlm_base_url=ftp://x", "vlm_model=m"], "is not an http"),
    (["teacher=vlm", "vlm_base_url=http://x/v1", "vlm_model=m", "vlm_frames=bogus"],
     "vlm_frames=bogus is unknown; use last or key"),
    (["teacher=vlm", "vlm_base_url=http://x/v1", "vlm_model=m", "vlm_prompt=/no/such.txt"],
     "vlm_prompt=/no/such.txt: cannot read it"),
    (["teacher=vlm", "vlm_base_url=http://x/v1", "vlm_model=m", "domain=MovingDot",
      "env=MovingDot"], "no task description for env=MovingDot"),
    (["vlm_model=m"], "vlm_model=m is read by a VLM teacher only"),
    (["teacher=vlm", "vlm_base_url=http://x/v1", "vlm_model=m", "vlm_cache=/no/such/a.jsonl"],
     "vlm_cache=/no/such/a.jsonl is not a file in an existing folder"),
    (["teacher=vlm", "vlm_base_url=http://x/v1", "vlm_model=m", "vlm_gold_from=oracle"],
     "set gold_fraction"),
    (["teacher=vlm", "vlm_base_url=http://x/v1", "vlm_model=m", "reward_training=async"],
     "use reward_training=sync"),
    (["teacher=vlm", "vlm_base_url=http://x/v1", "vlm_model=m", "vlm_max_concurrency=0"],
     "vlm_max_concurrency=0"),
])
def test_bad_vlm_settings_are_refused_in_one_line(compose, overrides, message):
    from themis.run.validation import validate

    with pytest.raises(ConfigError, match=None) as caught:
        validate(compose(overrides))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_wrapper_refuses_teacher_vlm_in_one_line(tmp_path):
    import gymnasium as gym

    from themis.online.wrapper import PreferenceLearningWrapper

    with pytest.raises(ConfigError, match="teacher=vlm runs in Themis's own loops"):
        PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path, teacher="vlm",
                                  vlm_base_url="http://127.0.0.1:9/v1", vlm_model=MODEL)


def test_a_prompt_file_without_its_placeholders_is_refused(tmp_path):
    bad = tmp_path / "prompt.txt"
    bad.write_text("### analysis\nWhich is better?\n")
    with pytest.raises(ConfigError, match="has no \\{images_1\\}"):
        load_prompt(bad)
    good = tmp_path / "one_stage.txt"
    good.write_text("### analysis\n{images_1} vs {images_2}: goal {task}. Reply 0 or 1.\n")
    assert load_prompt(good).label == ""


def test_a_received_runs_endpoint_and_model_are_refused(compose, tmp_path):
    from omegaconf import OmegaConf

    from themis.run.received_config import check_received_settings

    cfg = compose(["teacher=vlm", "vlm_base_url=http://evil.example/v1", "vlm_model=m",
                   f"vlm_cache={tmp_path / 'inside.jsonl'}"])
    where = tmp_path / "config.yaml"
    where.write_text(OmegaConf.to_yaml(cfg))  # no owner mark: a received folder
    with pytest.raises(ConfigError) as caught:
        check_received_settings(cfg, where)
    line = str(caught.value)
    assert "vlm_base_url=http://evil.example/v1" in line and "vlm_model=m" in line
    assert "vlm_cache" not in line  # a path inside the run folder is the run's own
    outside = compose(["teacher=vlm", "vlm_base_url=http://x/v1", "vlm_model=m",
                       "vlm_cache=/tmp/elsewhere.jsonl"])
    with pytest.raises(ConfigError, match=r"vlm_cache=/tmp/elsewhere\.jsonl"):
        check_received_settings(outside, where, given={"vlm_base_url", "vlm_model"})
    check_received_settings(cfg, where, given={"vlm_base_url", "vlm_model"})  # user's own


def test_bad_vlm_input_exits_2_before_training(tmp_path):
    proc = launch("themis_train.sh", "teacher=vlm", "vlm_base_url=http://127.0.0.1:9/v1",
                  f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("themis: error: teacher=vlm needs vlm_model"), proc.stderr


# ---------------------------------------------------------------- a whole run
@pytest.mark.slow
def test_a_tiny_vlm_run_killed_mid_round_resumes_without_paying_an_answer_twice(server,
                                                                                tmp_path):
    """A teacher=vlm run on Pendulum (2 rounds of 10 queries) is killed (SIGKILL) three answers
    into its second round, then resumed: those answers are kept, the rest asked once, and
    reward.csv has the VLM's columns; the key is nowhere in the run folder."""
    import signal
    import subprocess
    import time

    from tests.conftest import ROOT
    from themis.reward.dataset import PreferenceDataset

    run = tmp_path / "run"
    args = [*TINY_PENDULUM, "teacher=vlm", f"vlm_base_url={server.base_url}",
            f"vlm_model={MODEL}", "human_frame_size=32", "num_train_steps=800",
            "max_feedback=20", "vlm_max_concurrency=1", f"hydra.run.dir={run}"]
    server.delay = 0.2
    proc = subprocess.Popen([str(ROOT / "themis_train.sh"), *args], cwd=ROOT,
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "THEMIS_THREADS": "1"})
    cache, deadline = run / CACHE_FILE, time.time() + 300
    try:
        while not (cache.is_file() and len(cache.read_text().splitlines()) >= 13):
            assert proc.poll() is None and time.time() < deadline, "no second round came"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    paid = {json.loads(line)["key"] for line in cache.read_text().splitlines()}
    kept = len(PreferenceDataset.load(run / "preferences"))  # recorded before cached
    assert len(paid) <= kept <= len(paid) + 1
    sent_before, server.delay = len(server.requests), 0.0
    resumed = launch("themis_train.sh", *args, "resume=true")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert KEY not in resumed.stdout + resumed.stderr  # nor in the logs

    labels = PreferenceDataset.load(run / "preferences")
    assert len(labels) == 20 and set(labels.labelers[:20]) == {"vlm:fake-vlm"}
    # every query asked once: two requests each, and at most the one in flight at the kill again
    assert len(server.requests) <= 2 * 20 + 2
    assert len(server.requests) - sent_before == 2 * (20 - kept)
    with (run / "reward.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {"vlm_requests", "vlm_prompt_tokens", "vlm_completion_tokens", "vlm_cost",
            "vlm_latency_s", "vlm_oracle_agreement", "oracle_agreement"} <= set(rows[0])
    assert [int(r["vlm_queries"]) for r in rows] == [10, 20 - kept]
    assert float(rows[0]["vlm_cost"]) == pytest.approx(0.02)  # 0.001 a request
    assert 0 <= float(rows[0]["vlm_oracle_agreement"]) <= 1
    for path in run.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            assert KEY.encode() not in path.read_bytes(), path


# ---------------------------------------------------------------- the benchmark
def test_bench_vlm_records_agreement_with_the_oracle_and_its_provenance(server, tmp_path):
    from tests.conftest import load_file

    bench = load_file("benchmarks/bench_vlm.py")
    record = tmp_path / "vlm_agreement.csv"
    args = ["--base-url", server.base_url, "--model", MODEL, "--pairs", "4", "--segment", "5",
            "--episodes", "2", "--episode-steps", "12", "--size", "16", "--out",
            str(tmp_path / "out"), "--record", str(record)]
    assert bench.main(args) == 0
    with record.open() as f:
        (row,) = list(csv.DictReader(f))
    assert {"date", "commit", "machine", "command", "wall_s", "model"} <= set(row)
    assert row["model"] == MODEL and row["pairs"] == "4" and 0 <= float(row["agreement"]) <= 1
    assert int(row["requests"]) + 2 * int(row["cache_hits"]) == 8  # two stages a pair
    assert bench.main(args) == 0  # again: every answer from the cache
    with record.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and rows[1]["requests"] == "0"
    assert rows[1]["agreement"] == rows[0]["agreement"]
