"""DRLHP's env wrapper API on Themis, queries as a stream, async runs that never wait for
people, and the last episode beside the pair (issue 63; issue 61 item 5).

The four workflows of the DRLHP refactor's README (HumanCompatibleAI/learning-from-human-
preferences, "Workflows") run through :class:`themis.HumanPreferencesEnvWrapper` as written
there, on a tiny env, with Themis keys beside them only to keep them small (and, for a person,
``teacher_ui="web"`` with a bot answering over HTTP on 127.0.0.1).
"""

from __future__ import annotations

import gzip
import itertools
import json
import multiprocessing
import os
import pickle
import threading
import time
from pathlib import Path

import gymnasium as gym
import httpx
import numpy as np
import pandas as pd
import pytest

from themis import HumanPreferencesEnvWrapper
from themis.online.stream import QueryTarget
from themis.reward import PreferenceDataset
from themis.run.closing import finish
from themis.utils import ConfigError

SMALL = {"num_seed_steps": 100, "num_interact": 100, "reward_hidden_dim": 16,
         "reward_hidden_depth": 2, "reward_update": 3, "ensemble_size": 2, "torch_threads": 1}
"""Themis keys that keep a DRLHP workflow small (given beside DRLHP's)."""


class Dot(gym.Env):
    """A dot moved towards the centre of a 32-pixel frame (cheap to render), 50-step episodes."""

    metadata = {"render_modes": ["rgb_array"]}  # noqa: RUF012

    def __init__(self) -> None:
        self.render_mode = "rgb_array"
        self.observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.pos.copy(), {}

    def step(self, action):
        self.pos = np.clip(self.pos + 0.1 * np.asarray(action, np.float32), -1, 1)
        return self.pos.copy(), -float(np.linalg.norm(self.pos)), False, False, {}

    def render(self):
        frame = np.zeros((32, 32, 3), np.uint8)
        x, y = ((self.pos + 1) * 15.5).astype(int)
        frame[y, x] = 255
        return frame


def dot() -> gym.Env:
    return gym.wrappers.TimeLimit(Dot(), 50)


WEB = {"teacher_ui": "web", "label_port": 0, "human_frame_size": 32}
"""A person answers on the labeling page (here: a bot over HTTP)."""


class Bot:
    """A person on the labeling page of a run without tokens (loopback): answers "left" to
    every query, from ``start`` on (an Event)."""

    def __init__(self, run: Path, start: threading.Event | None = None) -> None:
        self.run, self.answered, self.stop = run, 0, threading.Event()
        self.start = start or threading.Event()
        if start is None:
            self.start.set()
        self.thread = threading.Thread(target=self.answer, daemon=True)
        self.thread.start()

    def url(self) -> str:
        return json.loads((self.run / "web" / "server.json").read_text())["url"]

    def answer(self) -> None:
        while not self.stop.is_set():
            if not self.start.wait(0.1):
                continue
            try:
                url = self.url()
                qid = httpx.get(url + "api/next", timeout=5).json()["query_id"]
                if qid is None:
                    time.sleep(0.05)
                    continue
                r = httpx.post(url + "api/answers", json={"query_id": qid, "label": "left"},
                               timeout=5)
                self.answered += r.status_code == 201
            except (OSError, httpx.HTTPError, ValueError, KeyError):
                time.sleep(0.05)

    def join(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def step_until(env: gym.Env, done, seconds: float = 300, pause: float = 0.001):
    """Step ``env`` with random actions until ``done()`` (for at most ``seconds`` of wall
    clock, ``pause`` seconds a step: the bot and the learner process answer in time, not in
    steps, so a busy machine needs more steps, not a different test); the last step's
    ``(reward, info)``."""
    env.reset(seed=0)
    out = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        out = (reward, info)
        if terminated or truncated:
            env.reset()
        if done():
            return out
        time.sleep(pause)
    raise AssertionError("the condition was not reached")


# ---------------------------------------------------------------------- DRLHP's workflows
@pytest.mark.slow
def test_default_workflow_people_label_and_the_reward_switches_after_n_training_steps(
        tmp_path):
    """README "Default - Collecting human preferences & training reward": a person labels (a
    bot on the web page), r̂ is returned after n_initial_training_steps trainings. The page
    also serves the agent's last full episode (a third clip) by integer ID."""
    bot = Bot(tmp_path)
    wrapped_env = HumanPreferencesEnvWrapper(dot(),
                                             segment_length=10,
                                             synthetic_preferences=False,
                                             n_initial_training_steps=2,
                                             log_dir=str(tmp_path), max_prefs_in_db=12,
                                             reward_batch=4, **WEB, **SMALL)
    try:
        assert not wrapped_env.using_reward_from_predictor
        reward, info = step_until(wrapped_env, lambda: wrapped_env.using_reward_from_predictor)
        assert wrapped_env.core.epochs >= 2  # passes over the labels, as DRLHP counts them
        reward, info = step_until(wrapped_env, lambda: True)
        assert reward == info["predicted_reward"] != info["true_reward"]
        # the last full episode, beside the pair: its clip is served by integer ID
        url = bot.url()
        newest = httpx.get(url + "api/episode", timeout=30).json()["episode_id"]
        assert isinstance(newest, int) and newest >= 1
        clip = httpx.get(url + f"api/episodes/{newest}", timeout=30)
        assert clip.status_code == 200 and clip.headers["content-type"] in ("video/mp4",
                                                                             "image/gif")
        assert len(clip.content) > 100
        assert httpx.get(url + "api/episodes/999999", timeout=30).status_code == 404
        assert httpx.get(url + "api/episodes/..%2Fclips", timeout=30).status_code in (404, 422)
        assert 'id="episode"' in httpx.get(url, timeout=30).text
    finally:
        bot.join()
        wrapped_env.close()
    # r̂ trains on people's answers alone, so the first round's 4 were accepted before the
    # switch; how many more the bot gave by then depends on timing (7 or 8 seen in CI)
    assert bot.answered >= 4


@pytest.mark.slow
def test_collect_then_train_from_prefs_dir_then_use_the_pretrained_predictor(tmp_path):
    """README workflows 2–4 in a row: collect preferences without training and save_prefs()
    (train_prefs/, val_prefs/ in log_dir); train from prefs_dir with checkpoints in
    log_dir/reward_predictor_checkpoints/; use that checkpoint without training, switching to
    the true reward and back."""
    collect_dir, train_dir, use_dir = (str(tmp_path / n) for n in ("collect", "train", "use"))
    bot = Bot(Path(collect_dir))
    wrapped_env = HumanPreferencesEnvWrapper(dot(),
                                             synthetic_preferences=False,
                                             collect_prefs=True,
                                             train_reward=False,
                                             log_dir=collect_dir,
                                             segment_length=10, max_prefs_in_db=12,
                                             reward_batch=4, **WEB, **SMALL)
    try:
        reward, info = step_until(wrapped_env,
                                  lambda: wrapped_env.core.shared.counts()["labels"] >= 10)
        assert reward == info["true_reward"]  # no reward model: the env's reward
        counts = wrapped_env.save_prefs()
    finally:
        bot.join()
        wrapped_env.close()
    assert wrapped_env.model_version == 0  # nothing was trained
    assert not (Path(collect_dir) / "reward_predictor_checkpoints").exists()
    train = PreferenceDataset.load(Path(collect_dir) / "train_prefs")
    val = PreferenceDataset.load(Path(collect_dir) / "val_prefs")
    assert (len(train), len(val)) == (counts["train"], counts["val"])
    assert len(val) >= 1 and len(train) + len(val) >= 10
    assert not list(Path(collect_dir).glob("*.pkl*"))  # Themis's format, no pickle

    wrapped_env = HumanPreferencesEnvWrapper(dot(),
                                             prefs_dir=collect_dir,
                                             collect_prefs=False,
                                             train_reward=True,
                                             reward_predictor_ckpt_interval=10,
                                             log_dir=train_dir, segment_length=10, **SMALL)
    step_until(wrapped_env, lambda: wrapped_env.using_reward_from_predictor)
    wrapped_env.close()
    checkpoint = Path(train_dir) / "reward_predictor_checkpoints" / "reward_model.pt"
    assert checkpoint.is_file()

    wrapped_env = HumanPreferencesEnvWrapper(
        dot(), pretrained_reward_predictor_dir=f"{train_dir}/reward_predictor_checkpoints/",
        collect_prefs=False, train_reward=False, log_dir=use_dir, segment_length=10)
    try:
        assert wrapped_env.using_reward_from_predictor
        reward, info = step_until(wrapped_env, lambda: True)
        assert reward == info["predicted_reward"] != info["true_reward"]
        wrapped_env.switch_to_true_reward()
        assert not wrapped_env.using_reward_from_predictor
        reward, info = step_until(wrapped_env, lambda: True)
        assert reward == info["true_reward"]
        wrapped_env.switch_to_predicted_reward()
        reward, info = step_until(wrapped_env, lambda: True)
        assert reward == info["predicted_reward"]
    finally:
        wrapped_env.close()
    assert not (Path(use_dir) / "reward.csv").exists()  # no round: nothing asked or trained


@pytest.mark.slow
def test_reward_predictor_checkpoints_come_every_interval_training_steps(tmp_path):
    """reward_predictor_ckpt_interval=2 with a synthetic teacher: the checkpoint in
    log_dir/reward_predictor_checkpoints/ holds version 2, then 4, ... (and the last at the
    end)."""
    import torch

    env = HumanPreferencesEnvWrapper(gym.make("Pendulum-v1"), segment_length=10,
                                     log_dir=str(tmp_path), reward_predictor_ckpt_interval=2,
                                     max_prefs_in_db=1000, reward_batch=10, **SMALL)
    path = tmp_path / "reward_predictor_checkpoints" / "reward_model.pt"
    versions = set()

    def saved() -> bool:
        if path.exists():
            versions.add(int(torch.load(path, weights_only=True)["version"]))
        return len(versions) >= 2

    step_until(env, saved)
    assert sorted(versions)[:2] == [2, 4]  # every second training
    env.close()
    assert torch.load(path, weights_only=True)["version"] == env.model_version


def test_the_readme_s_first_workflow_switches_to_r_hat_soon_after_the_first_labels(tmp_path):
    """Issue 85 item 21: ``segment_length=25, synthetic_preferences=True,
    n_initial_training_steps=10`` (the README's first example) returned the env's reward for
    50k+ steps, one "training step" per round. Counted as DRLHP counts them, passes over the
    labels, the ten come right after the first round's labels, before the second round."""
    env = HumanPreferencesEnvWrapper(dot(), segment_length=25, synthetic_preferences=True,
                                     n_initial_training_steps=10, log_dir=str(tmp_path),
                                     reward_batch=10, **{**SMALL, "num_interact": 5000})
    try:
        assert not env.using_reward_from_predictor
        reward, info = step_until(env, lambda: env.using_reward_from_predictor, seconds=120)
        assert env.core.epochs >= 10 and env.model_version >= 2
        assert env.core.shared.counts()["total_feedback"] == 10  # still the first round's
        reward, info = step_until(env, lambda: True)
        assert reward == info["predicted_reward"] != info["true_reward"]
    finally:
        env.close()


# ---------------------------------------------------------------------- refusals
def crafted_pickle(path: Path, sentinel: Path) -> None:
    """A ``train.pkl.gz`` whose unpickling runs ``os.system`` (a file someone sent)."""

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {sentinel}",)

    with gzip.open(path, "wb") as f:
        pickle.dump(Evil(), f)


def test_drlhps_pickled_preferences_are_refused_in_one_line_and_never_opened(tmp_path):
    prefs = tmp_path / "drlhp_logs"
    prefs.mkdir()
    sentinel = tmp_path / "code_ran"
    crafted_pickle(prefs / "train.pkl.gz", sentinel)
    crafted_pickle(prefs / "val.pkl.gz", sentinel)
    before = len(multiprocessing.active_children())
    with pytest.raises(ConfigError) as error:
        HumanPreferencesEnvWrapper(gym.make("Pendulum-v1"), prefs_dir=str(prefs),
                                   collect_prefs=False, log_dir=str(tmp_path / "run"))
    text = str(error.value)
    assert "train.pkl.gz and val.pkl.gz" in text and "never opens them" in text
    assert "\n" not in text and not sentinel.exists()
    assert len(multiprocessing.active_children()) == before


@pytest.mark.parametrize("keys, message", [
    ({"reward_predictor_network": object()}, "reward_predictor_network (DRLHP) has no Themis "
                                             "equivalent"),
    ({"mp_context": "fork"}, "mp_context (DRLHP) has no Themis equivalent"),
    ({"collect_prefs": False, "train_reward": False}, "without pretrained_reward_predictor_dir"),
    ({"collect_prefs": False}, "needs prefs_dir"),
    ({"segment_lenght": 10}, "segment_lenght is not a Themis config key"),
])
def test_a_drlhp_key_without_a_themis_equivalent_is_one_line(tmp_path, keys, message):
    with pytest.raises(ConfigError) as error:
        HumanPreferencesEnvWrapper(gym.make("Pendulum-v1"), log_dir=str(tmp_path / "run"),
                                   **keys)
    assert message in str(error.value) and "\n" not in str(error.value)


# ---------------------------------------------------------------------- queries as a stream
def test_the_stream_target_counts_queries_due_by_agent_step():
    constant = QueryTarget(40, 10, first=100, every=50)
    assert [constant.due(t) for t in (0, 99, 100, 149, 150, 1000)] == [0, 0, 10, 10, 20, 40]
    assert constant.owed(400, 0) == 40  # nothing asked by step 400: everything due is owed
    assert constant(400, 40) == 10  # ... asked round by round (each its own training)
    assert constant(400, 10) == 10 and constant(120, 30) == 0  # 30 asked: the 10 left; none
    decay = QueryTarget(1000, 10, first=0, every=100, mode="decay", decay_steps=200)
    sizes = np.diff([0] + [decay.due(100 * k) for k in range(8)])
    assert sizes[0] == 10 and sizes[-1] < sizes[0] / 2  # the rate decays as T0 / (T + T0)
    assert all(a >= b - 1 for a, b in itertools.pairwise(sizes))  # up to rounding
    continuous = QueryTarget(40, 10, first=100, every=50, mode="continuous")
    assert continuous.due(100) == 40 and continuous(100, 40) == 10 and continuous(99, 40) == 0
    assert decay(700, 1000) == 10 and decay(700, 990) == decay.after_rounds(2) - 10


def test_the_stream_target_counts_the_first_rounds_own_queries():
    """``first_round_queries`` (DRLHP's ``n_initial_prefs``): the first round asks that many and
    the later rounds keep their sizes, in all three shapes of the schedule. (The target counted
    the first round as ``reward_batch`` or as the plan's first round: after 500 first-round
    labels the Pong recipe's async learner owed nothing until step ~380k, where the sync loop
    asks 24, 23, 22, ... every 20k steps from step 70k.)"""
    from themis.feedback.selector import DecayingSchedule

    plan = DecayingSchedule(500_000, 20_480, 2_000_000)
    decay = QueryTarget(1500, 150, first=50_176, every=20_480, mode="decay", decay=plan,
                        decay_steps=500_000, first_queries=500)
    expected = np.cumsum(plan.plan(50_176, 1500, 500))
    assert expected[0] == 500 and expected[1] == 524
    assert [decay.due(50_176 + 20_480 * k) for k in range(5)] == expected[:5].tolist()
    assert decay.owed(135_168, 500) == expected[4] - 500 > 0  # rounds 2-5 due by step 135k
    assert decay.due(2_000_000) == 1500
    constant = QueryTarget(40, 10, first=100, every=50, first_queries=25)
    assert [constant.due(t) for t in (99, 100, 150, 200, 1000)] == [0, 25, 35, 40, 40]
    free = QueryTarget(1000, 10, first=0, every=100, mode="decay", decay_steps=200,
                       first_queries=100)
    plain = QueryTarget(1000, 10, first=0, every=100, mode="decay", decay_steps=200)
    assert free.due(0) == 100  # the first round, then the horizon-free rate from reward_batch
    assert [free.due(100 * k) - 90 for k in range(1, 6)] == [plain.due(100 * k)
                                                             for k in range(1, 6)]


def test_the_whole_budget_is_asked_when_the_agent_is_ten_times_faster_than_the_learner(
        tmp_path):
    """The learner is free only every 10 × num_interact agent steps: in each free moment it
    runs every round due by then, back to back, so the budget is spent (old rule: one round
    per free moment, 15 of 40 queries asked in three)."""
    import torch

    from themis.online.keys import online_config
    from themis.online.learner_process import EnvSpec, LearnerProcessState
    from themis.online.segments import StepRecorder
    from themis.online.weights import SharedWeights, flat_size
    from themis.reward import RewardEnsemble

    cfg, _ = online_config({"max_feedback": 40, "reward_batch": 5, "segment": 10,
                            "num_seed_steps": 100, "num_interact": 100, **SMALL}, False)
    model = RewardEnsemble(3, 1, cfg.ensemble_size, cfg.reward_hidden_dim,
                           cfg.reward_hidden_depth)
    shared = SharedWeights(torch.multiprocessing.get_context("spawn"), flat_size(model))
    spec = EnvSpec("Toy-v0", (3,), "float32", 1, False, 50, 10_000)
    learner = LearnerProcessState(cfg, {"resume": False, "reward_model": None}, spec, tmp_path,
                                  shared)
    recorder = StepRecorder(1, cfg.segment, (3,), np.float32, 1, 5000)
    rng = np.random.default_rng(0)
    total, turns = 0, 0
    while learner.learner.total_feedback < 40:
        turns += 1
        assert turns <= 3, learner.learner.total_feedback
        for _ in range(10 * cfg.num_interact):  # the agent: ten intervals per learner turn
            recorder.add(0, rng.normal(size=3), rng.normal(size=1), float(rng.normal()),
                         False)
            total += 1
            if total % 50 == 0:
                recorder.end_episode(0)
        runs, ended = recorder.take()
        learner.take(("steps", runs, ended, total))
        while learner.due():  # the learner's free moment
            learner.feedback_round()
    learner.logger.close()
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["queries_asked"].iloc[-1] == 40 == rounds["queries_due"].iloc[-1]
    assert (rounds["queries_asked"] <= rounds["queries_due"]).all()


# ---------------------------------------------------------------------- issue 61 item 5
def test_make_learner_builds_the_decay_schedule_and_the_normaliser(compose, tmp_path):
    from tests.conftest import TINY_PENDULUM
    from themis.builder import make_workspace
    from themis.feedback.selector import DecayingSchedule

    ws = make_workspace(compose([*TINY_PENDULUM, "query_schedule=decay",
                                 "reward_norm_std=0.05"]), tmp_path)
    assert isinstance(ws.learner.schedule, DecayingSchedule)
    assert ws.learner.normaliser is not None and ws.learner.normaliser.std == 0.05


@pytest.mark.slow
def test_decay_and_reward_norm_std_work_through_the_wrapper(tmp_path):
    """query_schedule=decay: rounds ask fewer queries as the rate decays; reward_norm_std:
    each member normalised (running statistics), so r̂ has about that std."""
    from themis import PreferenceLearningWrapper

    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path, max_feedback=200,
                                    reward_batch=10, segment=10, query_schedule="decay",
                                    query_decay_steps=150, reward_norm_std=0.05, **SMALL)
    seen: list[float] = []

    def enough() -> bool:
        return env.model_version >= 4 and len(seen) > 600

    env.reset(seed=0)
    while not enough():
        _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        if env.using_predicted_reward:
            seen.append(float(reward))
        if terminated or truncated:
            env.reset()
        time.sleep(0.003)
    env.close()
    rounds = pd.read_csv(tmp_path / "reward.csv")
    # owed rounds run back to back: asked never runs ahead of due, and catches up
    assert (rounds["queries_asked"] <= rounds["queries_due"]).all()
    last = rounds.iloc[-1]  # the run stops at any time: at most one round still owed
    assert 0 <= last["queries_due"] - last["queries_asked"] <= 10
    # decaying: fewer queries due by a step than the constant schedule would ask
    assert last["queries_due"] < 10 * ((last["step"] - 100) // 100 + 1)
    assert 0.005 < float(np.std(seen[-300:])) <= 0.06


@pytest.mark.slow
def test_decay_and_reward_norm_std_work_with_async(compose, tmp_path):
    from tests.test_async_training import ASYNC
    from themis.builder import make_workspace
    from themis.loops import pebble

    ws = make_workspace(compose([*ASYNC, "num_train_steps=3000", "max_feedback=60",
                                 "query_schedule=decay", "query_decay_steps=300",
                                 "reward_norm_std=0.05"]), tmp_path)
    assert ws.learner.normaliser is not None
    ws.run()
    buffer = pebble.replay(ws)
    buffer._label_pending()
    rewards = buffer.rewards[: len(buffer)].reshape(-1)
    finish(ws)
    assert abs(float(rewards.mean())) < 0.02 and 0.005 < float(rewards.std()) <= 0.051
    rounds = pd.read_csv(tmp_path / "reward.csv")
    last = rounds.iloc[-1]  # decaying: fewer due than the constant schedule's rounds
    assert len(rounds) >= 2 and last["queries_due"] < 10 * ((last["step"] - 400) // 300 + 1)


# ---------------------------------------------------------------------- async never waits
@pytest.mark.slow
def test_an_async_web_run_with_nobody_answering_keeps_stepping_and_switches_later(
        compose, tmp_path):
    """reward_training=async, teacher_ui=web: nobody answers at first, the loop goes on past
    the end of pretraining on the pretraining reward (a console line says so); a bot answers
    later over HTTP on 127.0.0.1 and the loop switches to the first reward model."""
    from tests.conftest import TINY_PENDULUM
    from themis.builder import make_workspace

    ws = make_workspace(compose([
        *[o for o in TINY_PENDULUM if not o.startswith(("reward_batch", "num_train_steps"))],
        "num_train_steps=1800", "reward_batch=4", "human_teacher=true", "teacher_ui=web",
        "human_frame_size=32", "label_port=0", "reward_training=async", "torch_threads=1",
        "precision=fp32"]), tmp_path)
    lines: list[str] = []
    info = ws.logger_info

    def logger_info(message: str, colour: str = "") -> None:
        lines.append(message)
        info(message, colour)

    ws.logger_info = logger_info  # type: ignore[method-assign]
    start = threading.Event()
    without_model: list[int] = []

    def watch() -> None:  # nobody answers until the loop is well past pretraining
        while ws.step < ws.cfg.pretrain_end + 400:
            time.sleep(0.01)
        without_model.append(ws.learner.version)
        start.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    bot = Bot(tmp_path, start)
    try:
        ws.run()
    finally:
        bot.join()
        finish(ws)
    assert without_model == [0]  # it kept stepping with no model at all
    assert any("no reward model yet" in line and "pretraining reward" in line
               for line in lines)
    assert ws.learner.version >= 1 and ws.pretraining_done  # switched when answers came
    assert bot.answered >= 4


def test_prefppo_writes_the_last_full_episode_when_it_ends_across_rollouts(tmp_path):
    """PPO's synchronous loop stages each env's steps and flushes them at the end of a rollout
    and of an episode: the episode's clip (DRLHP's second window) is written once, when the
    episode ends, from all its frames, downscaled to the ring's height and halved."""
    import imageio_ffmpeg
    import torch

    from lib.clips import EpisodeClips, newest_episode_clip
    from themis.agents.buffers import EpisodeStore
    from themis.environments.frames import FrameStore
    from themis.loops.prefppo import _EpisodeStaging

    store = EpisodeStore((3,), 2, 100, torch.device("cpu"))
    frames = FrameStore(100, 100, 32)
    clips = EpisodeClips(tmp_path / "episodes", fps=10)
    stage = _EpisodeStaging(4)
    rng = np.random.default_rng(0)
    for steps, ends in ((6, False), (5, True)):  # one episode over two rollouts
        for _ in range(steps):
            stage.append(np.zeros(3, np.float32), np.eye(2, dtype=np.float32)[0], 0.0,
                         rng.integers(0, 255, (64, 48, 3), dtype=np.uint8))
        stage.flush(store, terminated=ends, frames=frames, episode_clips=clips, ends=ends)
        assert newest_episode_clip(tmp_path / "episodes") == (5 if ends else None)
    reader = imageio_ffmpeg.read_frames(str(next((tmp_path / "episodes").glob("*.mp4"))))
    assert next(reader)["size"] == (12, 16)  # 64×48 -> 32×24 (the ring) -> 16×12 (halved)
    assert sum(1 for _ in reader) == 11


def test_episode_clips_keep_the_newest_and_drop_older_ones_only_after_the_grace(tmp_path):
    """The newest ``keep`` episode clips stay; an older one stays until it is ``grace`` seconds
    old, so that a page told the newest ID a moment ago still finds its clip while short
    episodes keep ending (it was dropped at once, and a request could lose its file)."""
    import os
    import time

    from lib.clips import EpisodeClips, newest_episode_clip

    folder = tmp_path / "episodes"
    clips = EpisodeClips(folder, fps=10, keep=3, grace=10.0)
    frames = np.zeros((4, 8, 8, 3), np.uint8)
    for clip_id in range(1, 6):
        clips.write(clip_id, frames)
    assert sorted(p.name for p in folder.glob("episode_*")) == [
        f"episode_{i:08d}.mp4" for i in range(1, 6)]  # all younger than the grace
    old = time.time() - 60
    for clip_id in range(1, 5):
        os.utime(folder / f"episode_{clip_id:08d}.mp4", (old, old))
    clips.write(6, frames)
    # 1-3 are old and beyond the newest three; 4 is old but among the newest three
    assert sorted(int(p.stem[-8:]) for p in folder.glob("episode_*")) == [4, 5, 6]
    assert newest_episode_clip(folder) == 6
