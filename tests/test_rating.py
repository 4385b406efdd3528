"""Rating feedback (feedback=rating): RbRL's rating model and loss, the synthetic rating teacher,
the dataset format, and a person rating in the terminal and on the web."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import threading
import time

import httpx
import numpy as np
import pandas as pd
import pytest
import torch
from fastapi.testclient import TestClient

from lib.human_interface import KeyReader, RatingTerminalTeacher
from lib.label_server import create_app
from tests.conftest import ROOT, TINY_PENDULUM
from themis.agents.buffers import SegmentPairs
from themis.crowd.label_store import LabelStore
from themis.feedback.teachers import SyntheticRatingTeacher
from themis.reward import PreferenceDataset, RewardEnsemble
from themis.reward.preference_models import (
    class_boundaries,
    normalised_returns,
    rating_logits,
    rating_loss,
)
from themis.reward.rating import RatingTrainer

RATING_RUN = [o for o in TINY_PENDULUM if not o.startswith("reward_batch")] + [
    "reward_batch=4", "feedback=rating", "rating_classes=3"]


def segments(n: int, seed: int = 0, horizon: int = 5) -> SegmentPairs:
    """``n`` single segments whose true reward is their first observation feature."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 1, horizon, 3)).astype(np.float32)
    return SegmentPairs(obs, rng.uniform(-1, 1, (n, 1, horizon, 1)).astype(np.float32),
                        obs[..., 0].copy(), np.zeros((n, 1), np.int64))


# ------------------------------------------------------------------ the rating model (RbRL)
def test_boundaries_give_each_class_as_many_segments_as_were_rated_into_it():
    x = torch.tensor([[0.0, 0.2, 0.6, 1.0]])
    bounds = class_boundaries(x, torch.tensor([[0, 0, 1, 1]]), 2)
    assert torch.allclose(bounds, torch.tensor([[0.0, 0.4, 1.0]]))  # halfway 0.2 … 0.6
    bounds = class_boundaries(x, torch.tensor([[0, 1, 1, 2]]), 3)
    assert torch.allclose(bounds, torch.tensor([[0.0, 0.1, 0.8, 1.0]]))
    # nobody rated class 1: its interval is empty, class 0 takes everything below
    empty = class_boundaries(x, torch.tensor([[0, 0, 0, 0]]), 2)
    assert torch.allclose(empty, torch.tensor([[0.0, 1.0, 1.0]]))


def test_rating_logits_by_hand_and_the_class_holding_the_return_wins():
    logits = rating_logits(torch.tensor([0.2]), torch.tensor([0.0, 0.4, 1.0]), k=10.0)
    # −k (x − R̄_i)(x − R̄_{i+1}): class 0: −10 (0.2)(−0.2) = 0.4; class 1: −10 (−0.2)(−0.8)
    assert torch.allclose(logits, torch.tensor([[0.4, -1.6]]))
    x = normalised_returns(torch.tensor([[3.0, 1.0, 2.0]]))
    assert torch.allclose(x, torch.tensor([[1.0, 0.0, 0.5]]))
    assert torch.allclose(normalised_returns(torch.ones(1, 3)), torch.full((1, 3), 0.5))
    loss, predicted = rating_loss(torch.tensor([[0.0, 1.0, 9.0, 10.0]]),
                                  torch.tensor([[0, 0, 1, 1]]), 2, k=30.0)
    assert predicted.tolist() == [[0, 0, 1, 1]] and loss.shape == (1,)
    worse, _ = rating_loss(torch.tensor([[10.0, 9.0, 1.0, 0.0]]),
                           torch.tensor([[0, 0, 1, 1]]), 2, k=30.0)
    assert worse.item() > loss.item()  # the ratings contradict the order


def test_the_rating_trainer_learns_a_reward_that_orders_segments_like_the_ratings():
    torch.manual_seed(0)
    data = PreferenceDataset(200, 5, 3, 1, rating_classes=4)
    train = segments(200)
    teacher = SyntheticRatingTeacher(4)
    _, ratings = teacher.rate(train.true_rewards[:, 0])
    data.add(train, ratings)
    model = RewardEnsemble(3, 1, ensemble_size=2, hidden_dim=32, hidden_depth=2)
    trainer = RatingTrainer(model, 4, k=30.0, lr=3e-3, batch_size=64,
                            rng=np.random.default_rng(0))
    fit = trainer.train(data, 60)
    assert fit.accuracy > 0.6  # 4 classes: chance is 0.25
    test = segments(100, seed=1)
    predicted = model.predict(test.observations.reshape(-1, 3),
                              test.actions.reshape(-1, 1)).reshape(100, 5).sum(1)
    true = test.true_rewards[:, 0].sum(1)
    assert np.corrcoef(predicted, true)[0, 1] > 0.9
    _, held_out = teacher.rate(test.true_rewards[:, 0])
    assert trainer.accuracy(test.observations, test.actions, held_out) > 0.5


# ------------------------------------------------------------------ the synthetic teacher
def test_the_rating_teacher_uses_return_quantiles_and_b_pref_noise():
    rewards = np.arange(8, dtype=np.float64)[:, None] * np.ones((8, 5))  # returns 0, 5, …, 35
    keep, ratings = SyntheticRatingTeacher(4).rate(rewards)
    assert keep.all() and ratings.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # equal-sized classes
    # among as many earlier, better segments the same ones fill the lower two classes only
    _, lower = SyntheticRatingTeacher(4).rate(rewards, rated=rewards + 100)
    assert lower.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    skip = SyntheticRatingTeacher(4, eps_skip=0.5)
    skip.set_margin(38.0)  # threshold 19: returns 0, 5, 10, 15 are skipped
    keep, ratings = skip.rate(rewards)
    assert keep.tolist() == [False] * 4 + [True] * 4 and len(ratings) == 4
    many = np.repeat(rewards, 500, axis=0)
    exact = SyntheticRatingTeacher(4).rate(many)[1]
    wrong = SyntheticRatingTeacher(4, eps_mistake=0.3, rng=np.random.default_rng(0)).rate(many)[1]
    assert 0.27 < (wrong != exact).mean() < 0.33  # a mistake is always another class
    noisy = SyntheticRatingTeacher(4, beta=5.0, rng=np.random.default_rng(0)).rate(many)[1]
    assert 0.2 < (noisy != exact).mean() < 0.9  # β: draws from the rating model
    assert (np.abs(noisy - exact) <= 3).all()
    with pytest.raises(ValueError, match="rating_classes=1"):
        SyntheticRatingTeacher(1)


# ------------------------------------------------------------------ the dataset format
def test_ratings_round_trip_as_format_version_4_and_are_checked(tmp_path):
    data = PreferenceDataset(4, 5, 3, 1, rating_classes=3)
    data.add(segments(3), np.array([0, 2, 1]), labeler="human:ann")
    data.save(tmp_path / "prefs")
    meta = json.loads((tmp_path / "prefs" / "meta.json").read_text())
    assert meta["format_version"] == 4 and meta["rating_classes"] == 3
    back = PreferenceDataset.load(tmp_path / "prefs")
    assert back.rating_classes == 3 and back.labels[:3].tolist() == [0, 2, 1]
    assert back.observations.shape[1:] == (1, 5, 3)
    with pytest.raises(ValueError, match="ratings must be 0 … 2"):
        back.add(segments(1), np.array([3]))
    pairs = PreferenceDataset(4, 5, 3, 1)
    with pytest.raises(ValueError, match="rating_classes"):
        pairs.extend(back)
    labels = tmp_path / "prefs" / "labels.csv"
    labels.write_text(labels.read_text().replace("human:ann", "x", 1).replace(",2.0,", ",7,"))
    with pytest.raises(ValueError, match="ratings are 0 … 2"):
        PreferenceDataset.load(tmp_path / "prefs")


# ------------------------------------------------------------------ a person: terminal, web
def test_a_person_rates_clips_with_number_keys(tmp_path):
    out = io.StringIO()
    teacher = RatingTerminalTeacher(tmp_path, KeyReader(io.StringIO("3\nx\n1\nL\n\nq\n"),
                                                        piped=True), classes=3, viewer="none",
                                    fps=5, out=out)
    given: list[tuple[int, float | None]] = []
    result = teacher.ask(np.zeros((5, 1, 3, 16, 16, 3), np.uint8),
                         lambda i, label: given.append((i, label)))
    # 3 = best (class 2); x and L (a pairwise key) only show the help; 1 = worst; Enter skips
    assert given == [(0, 2.0), (1, 0.0), (2, None)] and result.stopped
    assert out.getvalue().count("1 … 3 rate the clip") == 2
    assert "how good is it?" in out.getvalue()


def test_the_api_takes_ratings_for_rating_queries_only_and_stores_nothing_wrong(tmp_path):
    store = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    rated = store.post(1, segments(2), [tmp_path / "a.mp4", tmp_path / "b.mp4"], 1,
                       rating_classes=4)
    rng = np.random.default_rng(0)
    pair = SegmentPairs(rng.normal(size=(1, 2, 5, 3)).astype(np.float32),
                        np.zeros((1, 2, 5, 1), np.float32), rng.normal(size=(1, 2, 5)),
                        np.zeros((1, 2), np.int64))
    (paired,) = store.post(1, pair, [tmp_path / "c.mp4"], 1, gold=np.array([1.0]))
    client = TestClient(create_app(store, tmp_path), base_url="http://127.0.0.1")
    assert client.get("/api/next").json()["rating_classes"] == 4

    def post(body: dict) -> int:
        return client.post("/api/answers", json=body).status_code

    assert post({"query_id": rated[0], "rating": 5}) == 422  # out of range for 4 classes
    assert post({"query_id": rated[0], "rating": 0}) == 422
    assert post({"query_id": rated[0], "label": "left"}) == 422  # a pair's answer
    assert post({"query_id": rated[0], "label": "left", "rating": 1}) == 422
    assert post({"query_id": rated[0]}) == 422
    assert post({"query_id": paired, "rating": 1}) == 422  # a rating on a pairwise query
    assert store.db.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == 0
    assert post({"query_id": rated[0], "rating": 4}) == 201
    assert post({"query_id": rated[1], "label": "skip"}) == 201
    assert post({"query_id": paired, "label": "right"}) == 201  # the gold query
    assert post({"query_id": paired, "label": "right"}) == 409  # gold answer replayed
    assert store.db.execute("SELECT label FROM answers ORDER BY id").fetchall() == [
        (3.0,), (None,), (1.0,)]
    got = store.gather()
    assert got.labels.tolist() == [3.0] and got.pairs.observations.shape == (1, 1, 5, 3)


# ------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_a_rating_run_with_the_synthetic_teacher_learns_and_resumes(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([str(ROOT / "themis_train.sh"), *RATING_RUN, "max_feedback=12",
                           "xplain_state=true", "xplain_clips_per_round=1",
                           f"hydra.run.dir={run}"], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env={**os.environ, "THEMIS_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # one explained one-segment clip per round, with its attribution summary
    assert len(list((run / "queries").glob("query_*_reward.png"))) == 3
    rounds = pd.read_csv(run / "reward.csv")
    assert rounds["total_feedback"].tolist() == [4, 8, 12]
    assert (rounds["oracle_agreement"] == 1.0).all()  # the oracle rating teacher
    assert rounds["epochs"].min() >= 1 and rounds["train_loss"].notna().all()
    data = PreferenceDataset.load(run / "preferences")
    assert len(data) == 12 and data.rating_classes == 3
    assert set(data.labels[:12].tolist()) <= {0.0, 1.0, 2.0}
    # resume with a longer budget: the ratings are read back and the rounds go on
    longer = [o for o in RATING_RUN if not o.startswith("num_train_steps=")]
    proc = subprocess.run([str(ROOT / "themis_train.sh"), *longer, "max_feedback=16",
                           "num_train_steps=1800", "resume=true", f"hydra.run.dir={run}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "THEMIS_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from" in proc.stdout
    # frames are not checkpointed and queries come from finished episodes only: at step 1300
    # the only episode with frames is still running, so that round is postponed to 1600
    rounds = pd.read_csv(run / "reward.csv")
    assert rounds["total_feedback"].tolist() == [4, 8, 12, 12, 16]
    assert rounds["postponed"].tolist()[-2:] == [1, 0]
    assert len(PreferenceDataset.load(run / "preferences")) == 16


@pytest.mark.slow
def test_people_rate_clips_on_the_web_and_the_run_trains_on_their_ratings(tmp_path):
    from tests.test_web_labeling import server_url, start_run

    run = tmp_path / "run"
    proc = start_run(run, "feedback=rating", "rating_classes=3", "max_feedback=8")
    url = server_url(run, proc)
    stop, given = threading.Event(), []

    def person() -> None:  # rates every clip by its true return, through the API
        while not stop.is_set():
            try:
                nxt = httpx.get(url + "api/next", timeout=5).json()
                if nxt["query_id"] is None:
                    time.sleep(0.2)
                    continue
                assert nxt["rating_classes"] == 3
                rating = 1 + len(given) % 3
                r = httpx.post(url + "api/answers", json={"query_id": nxt["query_id"],
                                                          "rating": rating}, timeout=5)
                if r.status_code == 201:
                    given.append(rating - 1)
            except httpx.HTTPError:
                time.sleep(0.2)

    bot = threading.Thread(target=person, daemon=True)
    bot.start()
    output, _ = proc.communicate(timeout=600)
    stop.set()
    assert proc.returncode == 0, output[-3000:]
    data = PreferenceDataset.load(run / "preferences")
    assert data.rating_classes == 3 and sorted(data.labels[: len(data)].tolist()) == \
        sorted(float(g) for g in given) and len(data) == 8
    assert pd.read_csv(run / "reward.csv")["epochs"].max() >= 1


@pytest.mark.slow
def test_a_person_rates_clips_in_the_terminal_and_the_run_trains_on_the_ratings(tmp_path):
    import imageio_ffmpeg

    from lib.human_interface import BANNER

    run = tmp_path / "run"
    proc = subprocess.run(
        [str(ROOT / "themis_train.sh"), *RATING_RUN, "max_feedback=8", "segment=20",
         "human_teacher=true", "human_piped=true", "human_frame_size=48",
         f"hydra.run.dir={run}"],
        input="3\n1\n2\n\n2\nL\n3\n1\n1\n", capture_output=True, text=True, cwd=ROOT,
        timeout=600, env={**os.environ, "THEMIS_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    labels = pd.read_csv(run / "preferences" / "labels.csv")
    # keys 3, 1, 2 → classes 2, 0, 1; Enter skips; L (a pairwise key) only shows the help
    assert labels["label"].tolist() == [2.0, 0.0, 1.0, 1.0, 2.0, 0.0, 0.0]
    assert "how good is it?" in proc.stdout
    reward = pd.read_csv(run / "reward.csv")
    assert reward["total_feedback"].iloc[-1] == 8 and reward["skipped"].sum() == 1
    clip = run / "queries" / "query_000000.mp4"
    assert imageio_ffmpeg.count_frames_and_secs(str(clip))[0] == 20
    reader = imageio_ffmpeg.read_frames(str(clip))
    assert next(reader)["size"] == (48, 48 + BANNER)  # one clip, not two side by side
    reader.close()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed "
                    "(.ci/run installs it)")
def test_rating_buttons_and_keys_in_headless_chromium(tmp_path):
    from playwright.sync_api import sync_playwright

    from tests.test_web_labeling import (
        open_labeling_page,
        server_url,
        start_run,
        wait_for_query,
        wait_until,
    )

    run = tmp_path / "run"
    proc = start_run(run, "feedback=rating", "rating_classes=3", "max_feedback=8",
                     "min_labels_before_training=2")
    url = server_url(run, proc)
    wait_for_query(url)
    with sync_playwright() as p:
        browser, page = open_labeling_page(p, url)
        assert page.inner_text("#question") == "How good is this clip?"
        assert page.is_hidden("#pairwise") and page.inner_text("#ratings") == "123"
        first = page.evaluate("document.body.dataset.query")
        page.click("#rate3")  # by clicking: the best class
        wait_until(page, f"document.body.dataset.query !== '{first}'")
        page.keyboard.press("1")  # by keyboard: the worst
        wait_until(page, "document.getElementById('answered').textContent === '2'")
        browser.close()
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    rows = LabelStore(run / "labels.sqlite").db.execute(
        "SELECT query_id, label FROM answers ORDER BY id").fetchall()
    assert [r[1] for r in rows] == [2.0, 0.0] and rows[0][0] == int(first)
    assert sorted(pd.read_csv(run / "preferences" / "labels.csv")["label"]) == [0.0, 2.0]


@pytest.mark.slow
def test_ratings_train_a_grid_reward_for_ppo_with_rune(tmp_path):
    from tests.test_domains import TINY_PPO

    run = tmp_path / "run"
    proc = subprocess.run([str(ROOT / "themis_train.sh"), *TINY_PPO, "domain=Minigrid",
                           "env=DistShift1-v0", "feedback=rating", "method=rune",
                           f"hydra.run.dir={run}"], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env={**os.environ, "THEMIS_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "agent ppo" in proc.stdout
    rounds = pd.read_csv(run / "reward.csv")
    assert rounds["total_feedback"].iloc[-1] == 20 and rounds["rune_beta"].notna().all()
    assert rounds["heldout_accuracy"].notna().any()  # ratings of a grid's 7×7 views


def test_chunked_rating_gradients_equal_the_whole_batch_with_fixed_min_max_and_boundaries():
    torch.manual_seed(0)
    data = PreferenceDataset(12, 5, 3, 1, rating_classes=3)
    data.add(segments(12), np.array([0, 1, 2] * 4))
    model = RewardEnsemble(3, 1, ensemble_size=2, hidden_dim=16, hidden_depth=1)
    trainer = RatingTrainer(model, 3, k=30.0, batch_size=12, rng=np.random.default_rng(0))
    obs, act, ratings = data.tensors(model.device)
    idx = torch.stack([torch.randperm(12), torch.randperm(12)])
    trainer.optimizer.zero_grad()
    loss, _ = trainer.chunked_step(obs, act, ratings, idx, step=5)  # chunks of 5, 5, 2
    chunked = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    returns = model.segment_returns(obs[idx][:, :, 0], act[idx][:, :, 0])
    lo = returns.detach().min(-1, keepdim=True).values
    span = returns.detach().max(-1, keepdim=True).values - lo
    x = (returns - lo) / span
    bounds = class_boundaries(x.detach(), ratings[idx], 3)
    logits = rating_logits(x, bounds, 30.0)
    whole = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ratings[idx].long().flatten(),
                                              reduction="none").view(2, 12).mean(-1)
    whole.sum().backward()
    for a, b in zip(chunked, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert torch.allclose(loss, whole.detach(), atol=1e-5)


def test_saved_labels_of_the_other_kind_are_refused_with_one_line(compose, tmp_path):
    from themis.builder import make_workspace
    from themis.utils import ConfigError

    pairs = PreferenceDataset(2, 20, 3, 1)
    rng = np.random.default_rng(0)
    pairs.add(SegmentPairs(rng.normal(size=(2, 2, 20, 3)).astype(np.float32),
                           np.zeros((2, 2, 20, 1), np.float32), np.zeros((2, 2, 20)),
                           np.zeros((2, 2), np.int64)), np.array([0.0, 1.0]))
    pairs.save(tmp_path / "pairs")
    with pytest.raises(ConfigError, match="holds pairwise preferences; this run asks for "
                                          "feedback=rating with rating_classes=3"):
        make_workspace(compose([*RATING_RUN, f"prefs_path={tmp_path / 'pairs'}"]),
                       tmp_path / "run")
    ratings = PreferenceDataset(2, 20, 3, 1, rating_classes=3)
    ratings.add(segments(2, horizon=20), np.array([0, 2]))
    ratings.save(tmp_path / "ratings")
    with pytest.raises(ConfigError, match="holds ratings in 3 classes; this run asks for "
                                          "feedback=pairwise"):
        make_workspace(compose([*TINY_PENDULUM, f"prefs_path={tmp_path / 'ratings'}"]),
                       tmp_path / "run2")


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed "
                    "(.ci/run installs it)")
def test_the_rating_page_at_1366x768_shows_instructions_clip_and_buttons_in_view(tmp_path):
    from playwright.sync_api import sync_playwright

    from lib.human_interface import single_clip, write_clip
    from lib.label_server import LabelServer

    clip = write_clip(single_clip(np.random.default_rng(0).integers(
        0, 255, (20, 256, 256, 3), dtype=np.uint8)), tmp_path / "web" / "clips" / "r.mp4", 20)
    store = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    (qid,) = store.post(1, segments(1), [clip], 1, rating_classes=5)
    told = "Better = the hopper moves forward without falling.\nIgnore the camera."
    (tmp_path / "web" / "instructions.md").write_text(told)  # written by the run
    server = LabelServer(store, "127.0.0.1", 0, tmp_path).start()
    try:
        error = httpx.post(server.url + "api/answers", json={"query_id": qid, "rating": 7})
        assert error.status_code == 422  # says what is allowed, not "not 6.0"
        assert "integer rating from 1 (worst) to 5 (best)" in error.json()["detail"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                        headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1366, "height": 768})
            page.goto(server.url)
            page.wait_for_selector("body[data-query]")
            deadline = time.time() + 30
            while not page.evaluate("document.getElementById('clip').readyState >= 1"):
                assert time.time() < deadline, "the clip did not load"
                time.sleep(0.1)
            assert page.inner_text("#instructions") == told  # shown as text
            for element in ["#clip", "#skip", *(f"#rate{c}" for c in range(1, 6))]:
                box = page.locator(element).bounding_box()
                assert box is not None and box["height"] > 20, element
                assert box["x"] >= 0 and box["x"] + box["width"] <= 1366, element
                assert box["y"] >= 0 and box["y"] + box["height"] <= 768, element
            # /status before the first evaluation: a sentence, no empty chart
            status = browser.new_page(viewport={"width": 1366, "height": 768})
            status.goto(server.url + "status")
            status.wait_for_selector("#answers:not(:empty)")
            assert status.is_visible("#no-curve") and not status.is_visible("#curve")
            assert status.inner_text("#no-curve").startswith("No evaluation yet")
            (tmp_path / "eval.csv").write_text("step,episode_reward\n600,-900\n")
            status.reload()
            status.wait_for_selector("#answers:not(:empty)")
            assert status.inner_text("#no-curve") == (  # one evaluation: said, not "none yet"
                "One evaluation so far: true return -900.0 at step 600; the curve appears "
                "after the second.")
            (tmp_path / "eval.csv").write_text("step,episode_reward\n600,-900\n1200,-300\n")
            status.reload()
            status.wait_for_selector("#curve polyline")
            assert status.is_visible("#curve") and not status.is_visible("#no-curve")
            browser.close()
    finally:
        server.stop()
