"""The online preference-learning wrapper: any agent (Stable-Baselines3 SAC and PPO, a plain
loop, vectorised envs) learns from preferences through the env, with a background learner
process that stops with the agent's, surfaces its crashes, and keeps every web answer."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import ROOT
from themis import PreferenceLearningVectorEnv, PreferenceLearningWrapper, load_reward_model
from themis.agents.buffers import EpisodeStore
from themis.online.online_reward import PreferenceLearnerError, observation_transform
from themis.online.segments import StepRecorder, add_run
from themis.reward import PreferenceDataset
from themis.utils import ConfigError

TINY = {"max_feedback": 20, "reward_batch": 10, "segment": 10, "num_seed_steps": 100,
        "num_interact": 150, "reward_hidden_dim": 16, "reward_hidden_depth": 2,
        "reward_update": 3, "ensemble_size": 2, "torch_threads": 1}


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_gone(pid: int, timeout: float = 45.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not running(pid):
            return True
        time.sleep(0.2)
    return False


class CounterEnv(gym.Env):
    """Observations ``(sub-env, episode, t)`` (the step's identity, to check the segments), one
    action in [-1, 1], reward −|a − sin(t)|; episodes of 12–30 steps, ended by termination or
    by a time limit in turn."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, index: int = 0) -> None:
        self.index, self.episode, self.t, self.length = index, -1, 0, 0
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        self.rng = np.random.default_rng(index)

    def obs(self) -> np.ndarray:
        return np.array([self.index, self.episode, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        self.length = int(self.rng.integers(12, 31))
        return self.obs(), {}

    def step(self, action):
        reward = -abs(float(np.asarray(action).reshape(-1)[0]) - np.sin(self.t))
        self.t += 1
        end = self.t >= self.length
        terminated, truncated = end and self.episode % 2 == 0, end and self.episode % 2 == 1
        return self.obs(), reward, terminated, truncated, {}


def segments_are_consecutive_steps(run: Path) -> int:
    """Every query segment saved in ``run/preferences`` is consecutive steps of one episode of
    one sub-env; returns how many labelled pairs there are."""
    data = PreferenceDataset.load(run / "preferences")
    obs = data.observations[: len(data)]  # (n, 2, H, 3): sub-env, episode, t
    assert len(data) > 0
    assert (obs[..., 0] == obs[..., :1, 0]).all() and (obs[..., 1] == obs[..., :1, 1]).all()
    assert (np.diff(obs[..., 2], axis=-1) == 1).all()
    return len(data)


# ---------------------------------------------------------------------- segment cutting
def test_every_segment_of_every_episode_is_stored_once_across_cuts_and_sub_envs():
    """Interleaved steps of three sub-envs, episodes of random length, cuts at random moments
    (and when a recorder is full): the store then holds each segment-long window of each
    episode exactly once, never one across an episode end or across sub-envs."""
    rng = np.random.default_rng(0)
    segment, n_envs = 5, 3
    recorder = StepRecorder(n_envs, segment, (3,), np.float32, 1, capacity=12)
    store = EpisodeStore((3,), 1, 100_000, torch.device("cpu"))
    lengths: dict[tuple[int, int], int] = {}  # (sub-env, episode) -> steps taken
    episode, t = [0] * n_envs, [0] * n_envs
    ends = [int(rng.integers(1, 25)) for _ in range(n_envs)]
    for _ in range(3000):
        i = int(rng.integers(n_envs))
        recorder.add(i, np.array([i, episode[i], t[i]], np.float32), np.zeros(1), 0.0, False)
        t[i] += 1
        lengths[(i, episode[i])] = t[i]
        if t[i] == ends[i]:
            recorder.end_episode(i)
            episode[i], t[i], ends[i] = episode[i] + 1, 0, int(rng.integers(1, 25))
        if rng.random() < 0.05:
            for run in recorder.take()[0]:
                add_run(store, run)
    for run in recorder.take()[0]:
        add_run(store, run)
    starts = store.segment_starts(segment)
    windows = store.obs[(starts[:, None] + np.arange(segment)) % store.capacity]
    assert (windows[..., :2] == windows[:, :1, :2]).all()  # one sub-env, one episode
    assert (np.diff(windows[..., 2], axis=1) == 1).all()  # consecutive steps
    found = [tuple(int(v) for v in w[0]) for w in windows]
    expected = [(i, e, s) for (i, e), n in lengths.items() for s in range(n - segment + 1)]
    assert len(found) == len(set(found)) and sorted(found) == sorted(expected)


def test_a_run_ends_at_its_episode_end_and_the_next_episode_gets_a_new_number():
    recorder = StepRecorder(2, 3, (1,), np.float32, 1, capacity=8)
    for t in range(4):
        recorder.add(0, np.array([t]), np.zeros(1), float(t), t == 3)
    recorder.end_episode(0)
    for t in range(3):
        recorder.add(0, np.array([10 + t]), np.zeros(1), 0.0, False)
        recorder.add(1, np.array([20 + t]), np.zeros(1), 0.0, False)
    runs, ended = recorder.take()
    assert [(r.episode, r.t0, r.obs[:, 0].tolist()) for r in runs] == [
        (0, 0, [0, 1, 2, 3]), (2, 0, [10, 11, 12]), (1, 0, [20, 21, 22])]
    assert runs[0].terminated.tolist() == [False, False, False, True]
    assert ended == [(6.0, 4)]
    recorder.add(0, np.array([13]), np.zeros(1), 0.0, False)  # the episode goes on
    runs, _ = recorder.take()
    assert [(r.episode, r.t0, r.obs[:, 0].tolist()) for r in runs] == [(2, 1, [11, 12, 13])]


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("keys, message", [
    ({"max_feedbak": 10}, "max_feedbak is not a Themis config key (did you mean max_feedback?)"),
    ({"core_turns": False}, "core_turns was removed from Themis"),
    ({"segment": "long"}, "segment:"),
    ({"max_feedback": -1}, "max_feedback=-1 must be >= 0"),
    ({"sac": {"hidden_dim": 64}}, "sac.hidden_dim configures Themis's own training loop"),
    ({"num_unsup_steps": 100}, "num_unsup_steps configures Themis's own training loop"),
    ({"pretrained_policy": "sac.zip"}, "pretrained_policy configures Themis's own training"),
    ({"query_schedule": "later"}, "query_schedule=later is unknown"),
    ({"train_reward_model": False}, "(did you mean train_reward?)"),
    ({"log_dir": "logs"}, "log_dir is DRLHP's key, not the wrapper's: use the run dir is the "
                          "wrapper's second argument"),
    ({"segment_length": 25}, "segment_length is DRLHP's key, not the wrapper's: use segment"),
    ({"learn_rewards": False}, "(did you mean train_reward?)"),  # not the refused learn_reward
    ({"logger": "wandb"}, "logger configures Themis's own training loop"),
    ({"method": "qpa"}, "method=qpa mixes recent episodes"),
    ({"method": ["surf", "mrn"]}, "method=mrn trains the reward model through"),
    ({"teacher": "lazy"}, "teacher=lazy is unknown"),
    ({"warmup_reward": "half"}, "warmup_reward=half is unknown"),
    ({"n_initial_training_steps": -2}, "n_initial_training_steps=-2 must be >= 0"),
    ({"segment": 500}, "segment=500 is longer than the episode limit (200 steps)"),
    ({"human_teacher": True}, "render_mode='rgb_array'"),
    ({"reward_model": "/nonexistent"}, "reward_model=/nonexistent: no reward-model checkpoint"),
])
def test_a_bad_key_is_one_line_before_any_process_starts(tmp_path, keys, message):
    before = len(multiprocessing.active_children())
    with pytest.raises(ConfigError) as error:
        PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path / "run", **keys)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert len(multiprocessing.active_children()) == before
    assert not (tmp_path / "run").exists()


def test_a_run_dir_holding_a_run_is_refused_unless_resumed(tmp_path):
    (tmp_path / "reward.csv").write_text("step\n")
    with pytest.raises(ConfigError, match=r"already holds a run \(reward.csv\); continue it with "
                                          r"resume=True"):
        PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path)
    with pytest.raises(ConfigError, match="no wrapper run"):
        PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path / "new", resume=True)


def test_obs_transform_takes_a_key_or_a_callable_and_images_become_channels_first():
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                             "image": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)})
    fn, inner = observation_transform("pos", space)
    assert inner.shape == (2,) and fn({"pos": [1, 2], "image": 0}).tolist() == [1, 2]
    fn, inner = observation_transform("image", space)  # channels-last: made channels-first
    image = space.sample()["image"]
    assert inner.shape == (3, 16, 16) and (fn({"image": image})[1] == image[..., 1]).all()
    fn, inner = observation_transform(lambda o: o["image"][..., 0], space)
    assert inner.shape == (1, 16, 16) and inner.dtype == np.uint8  # a 2-D frame gets a channel
    with pytest.raises(ConfigError, match=r"the observations are a dict \(keys image, pos\)"):
        observation_transform(None, space)
    with pytest.raises(ConfigError, match="obs_transform=speed: the observations have no key"):
        observation_transform("speed", space)
    with pytest.raises(ConfigError, match="failed on a sample observation"):
        observation_transform(lambda o: o["speed"], space)
    fn, inner = observation_transform("tests.obs_envs:position_and_bit",
                                      gym.spaces.Dict({"image": space["image"],
                                                       "position": space["pos"]}))
    assert inner.shape == (4,)


@pytest.mark.slow
@pytest.mark.parametrize("env_id, transform, stored", [
    ("ChannelsLast-v0", None, (3, 64, 64)), ("DictObs-v0", "image", (3, 16, 16))])
def test_image_and_dict_observations_learn_through_the_wrapper(tmp_path, env_id, transform,
                                                                stored):
    """Channels-last images and a dict observation's image entry (Discrete actions): stored
    channels-first, r̂ from the reward model's CNN, the labels saved with those shapes."""
    import tests.obs_envs  # noqa: F401  (registers the envs)

    env = PreferenceLearningWrapper(gym.make(env_id), tmp_path, obs_transform=transform,
                                    **TINY)
    env.reset(seed=0)
    while env.model_version < 1:
        _, reward, *_, info = env.step(env.action_space.sample())
        time.sleep(0.001)
    _, reward, *_, info = env.step(1)
    env.close()
    assert env.core.ensemble.model.encoders is not None  # a CNN
    assert reward == pytest.approx(info["predicted_reward"]) and np.isfinite(reward)
    data = PreferenceDataset.load(tmp_path / "preferences")
    assert data.observations.shape[-1] == int(np.prod(stored)) and len(data) >= 10


# ---------------------------------------------------------------------- agents
@pytest.mark.slow
def test_sb3_sac_trains_through_the_wrapper_while_the_reward_model_changes(tmp_path):
    """SB3 SAC on Pendulum through the wrapper: the learner asks and trains in the background,
    the model the wrapper uses changes version after version, and what SAC is given is r̂ of
    the newest version (the final reward_model.pt's r̂, checked after the last round)."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path, normalize_reward=False,
                                    **{**TINY, "max_feedback": 30, "segment": 20})
    initial = torch.nn.utils.parameters_to_vector(env.core.ensemble.model.parameters()).clone()
    weights: dict[int, torch.Tensor] = {}

    class Versions(BaseCallback):
        def _on_step(self) -> bool:
            v = env.core.version  # the version this step used (model_version would refresh)
            if v not in weights:
                weights[v] = torch.nn.utils.parameters_to_vector(
                    env.core.ensemble.model.parameters()).clone()
            reward = float(self.locals["rewards"][0])
            info = self.locals["infos"][0]
            if v > 0:
                assert reward == pytest.approx(info["predicted_reward"], abs=1e-6)
            else:
                assert reward == 0.0 and np.isnan(info["predicted_reward"])
            return True

    agent = SAC("MlpPolicy", env, learning_starts=100, batch_size=32, seed=0, device="cpu",
                policy_kwargs={"net_arch": [32, 32]})
    agent.learn(600, callback=Versions())
    deadline = time.time() + 300  # under load the background learner may still be training
    while len(weights) < 2 and time.time() < deadline:
        agent.learn(100, callback=Versions(), reset_num_timesteps=False)
    obs, _ = env.reset()
    deadline = time.time() + 120
    while env.model_version < 3:  # the last round may still be training: step on
        assert time.time() < deadline, f"model version {env.model_version}"
        obs, *_ = env.step(env.action_space.sample())
        time.sleep(0.01)
    action = np.array([0.3], np.float32)
    _, reward, *_ = env.step(action)
    env.close()
    assert {1, 2} <= set(weights) or len(weights) >= 2
    versions = sorted(weights)
    assert not torch.equal(initial, weights[versions[-1]])
    assert all(not torch.equal(weights[a], weights[b]) for a, b in itertools.pairwise(versions))
    final = load_reward_model(tmp_path)
    expected = final.predict(obs[None].astype(np.float32), action[None])[0]
    assert reward == pytest.approx(float(expected), abs=1e-5)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["total_feedback"].tolist() == [10, 20, 30]
    assert len(PreferenceDataset.load(tmp_path / "preferences")) == 30


def test_relabel_callback_rewrites_sb3_sacs_buffer_with_each_new_version(tmp_path):
    """Without relabelling, SB3 SAC's buffer keeps the warm-up's zeros and stale versions' r̂;
    the callback rewrites every stored reward with the version in use (PEBBLE's relabel)."""
    from stable_baselines3 import SAC

    from themis.online import RelabelCallback

    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path,
                                    **{**TINY, "max_feedback": 30, "segment": 20})
    checked: list[int] = []

    class Checked(RelabelCallback):
        def relabel(self) -> None:
            super().relabel()
            buffer = self.model.replay_buffer
            n = buffer.pos
            low, high = env.action_space.low, env.action_space.high
            env_actions = low + (buffer.actions[:n, 0] + 1.0) * 0.5 * (high - low)
            want = self.core.relabel_rewards(buffer.observations[:n, 0], env_actions)
            np.testing.assert_allclose(buffer.rewards[:n, 0], want, rtol=1e-5, atol=1e-5)
            assert np.count_nonzero(buffer.rewards[:n, 0]) == n  # no warm-up zeros left
            checked.append(self.core.version)

    callback = Checked(env)
    agent = SAC("MlpPolicy", env, learning_starts=100, batch_size=32, seed=0, device="cpu",
                policy_kwargs={"net_arch": [32, 32]})
    agent.learn(600, callback=callback)
    deadline = time.time() + 300  # under load the background learner may still be training
    while not checked and time.time() < deadline:
        agent.learn(100, callback=callback, reset_num_timesteps=False)
    env.close()
    assert checked and checked == sorted(set(checked)) and callback.relabels == checked
    with pytest.raises(ConfigError, match="takes the Themis wrapper"):
        RelabelCallback(gym.make("Pendulum-v1"))


@pytest.mark.slow
def test_sb3_ppo_with_subproc_vec_env_learns_through_the_vec_wrapper(tmp_path):
    """SB3 PPO on two LunarLander sub-envs in their own processes through the vectorised
    wrapper: PPO gets the wrapper's rewards (0 before the first model, r̂ after), and every
    episode the sub-envs ended reaches the learner's train.csv."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from themis.online.sb3 import PreferenceLearningVecEnv

    venv = PreferenceLearningVecEnv(make_vec_env("LunarLander-v3", 2, seed=0,
                                                 vec_env_cls=SubprocVecEnv), tmp_path, **TINY)
    seen = {"episodes": 0, "model": 0}

    class Check(BaseCallback):
        def _on_step(self) -> bool:
            rewards, infos = self.locals["rewards"], self.locals["infos"]
            for r, info in zip(rewards, infos, strict=True):
                if np.isnan(info["predicted_reward"]):
                    assert r == 0.0
                else:
                    seen["model"] += 1
                    assert r == pytest.approx(info["predicted_reward"], abs=1e-5)
            seen["episodes"] += int(np.sum(self.locals["dones"]))
            return True

    agent = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=0,
                device="cpu", policy_kwargs={"net_arch": [16]})
    agent.learn(1536, callback=Check())
    deadline = time.time() + 300  # under load the background learner may still be training
    while seen["model"] == 0 and time.time() < deadline:
        agent.learn(128, callback=Check(), reset_num_timesteps=False)
    venv.close()
    assert seen["model"] > 0 and venv.model_version >= 1
    assert len(pd.read_csv(tmp_path / "train.csv")) == seen["episodes"] > 2
    assert len(PreferenceDataset.load(tmp_path / "preferences")) >= 10


@pytest.mark.slow
def test_surf_rune_and_rime_learn_through_the_wrapper_and_rune_adds_its_bonus(tmp_path):
    """method=[surf,rune,rime]: SURF's pseudo-labels and RIME's filter train the model in the
    learner (their reward.csv columns), and the returned reward is r̂ + β_t · std (RUNE)."""
    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path,
                                    method=["surf", "rune", "rime"], normalize_reward=False,
                                    **{**TINY, "segment": 20, "surf.inv_label_ratio": 2})
    obs, _ = env.reset(seed=0)
    while env.model_version < 2:
        obs, *_ = env.step(env.action_space.sample())
        time.sleep(0.001)
    action = np.array([0.5], np.float32)
    _, reward, *_ = env.step(action)
    members = env.core.ensemble.members(obs[None].astype(np.float32), action[None])[:, 0]
    beta = env.core.bonus_methods[0].uncertainty.beta()
    env.close()
    assert beta > 0 and members.std() > 0
    assert reward == pytest.approx(members.mean() + beta * members.std(), abs=1e-5)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["pseudo_labels"].iloc[-1] > 0 and rounds["rime_kept"].iloc[-1] > 0


def counter_vec(kind: str, n: int) -> tuple[object, type]:
    if kind == "gymnasium":
        return gym.vector.SyncVectorEnv([lambda i=i: CounterEnv(i) for i in range(n)]), \
            PreferenceLearningVectorEnv
    from stable_baselines3.common.vec_env import DummyVecEnv

    from themis.online.sb3 import PreferenceLearningVecEnv

    return DummyVecEnv([lambda i=i: gym.wrappers.TimeLimit(CounterEnv(i), 1000)
                        for i in range(n)]), PreferenceLearningVecEnv


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gymnasium", "sb3"])
def test_vectorised_sub_envs_give_queries_of_consecutive_steps_of_one_episode(tmp_path, kind):
    """Three sub-envs whose observations name their step: every segment the teacher was asked
    about is consecutive steps of one episode of one sub-env (gymnasium's next-step autoreset
    step is not recorded; SB3's same-step reset starts the next episode)."""
    venv, wrapper = counter_vec(kind, 3)
    env = wrapper(venv, tmp_path, **TINY)
    env.reset()
    actions = np.zeros((3, 1), np.float32)
    deadline = time.time() + 120
    while env.model_version < 2:  # two rounds
        assert time.time() < deadline
        time.sleep(0.001)
        if kind == "gymnasium":
            _, _, *_, info = env.step(actions)
            assert info["true_reward"].shape == (3,)
        else:
            env.step_async(actions)
            _, _, _, infos = env.step_wait()
            assert "true_reward" in infos[0]
    env.close()
    assert segments_are_consecutive_steps(tmp_path) == 20


# ---------------------------------------------------------------------- the process
STEP_FOREVER = """
import sys, time
import gymnasium as gym
from themis import PreferenceLearningWrapper
if __name__ == "__main__":
    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), sys.argv[1], max_feedback=20,
                                    reward_batch=10, segment=10, num_seed_steps=100,
                                    num_interact=150, reward_hidden_dim=16, torch_threads=1)
    print("learner", env.core.process.pid, flush=True)
    env.reset(seed=0)
    while True:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
        time.sleep(0.001)
"""


def start_script(code: str, *args: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "THEMIS_THREADS": "1"})
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("learner "):
            return proc, int(line.split()[1])
    raise AssertionError(proc.communicate()[0])


def test_close_stops_the_learner_process(tmp_path):
    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path, **TINY)
    pid = env.core.process.pid
    assert running(pid)
    env.reset(seed=0)
    for _ in range(50):
        env.step(env.action_space.sample())
    env.close()
    assert not running(pid)
    assert env.core.closed_info is not None  # it said it closed after saving


@pytest.mark.slow
def test_sigterm_of_the_agents_process_leaves_no_learner_process(tmp_path):
    """The agent's process ended by SIGTERM (no Python cleanup runs): the learner process ends
    too, it watches its agent's process (SIGKILL: the web test below; Ctrl-C closes it through
    atexit)."""
    proc, learner = start_script(STEP_FOREVER, str(tmp_path / "run"))
    time.sleep(1.0)
    assert running(learner)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    assert wait_gone(learner), "the learner outlived its agent's process"
    assert (tmp_path / "run" / "checkpoints" / "state.pt").is_file()  # it saved on its way out


@pytest.mark.xdist_group("busy")  # times the close
def test_a_crash_of_the_learner_is_one_clear_error_at_the_agents_next_step(tmp_path):
    """The learner cannot write preferences/ (a file is in the way): the agent's next step
    raises one PreferenceLearnerError naming the cause and the traceback's file, every step
    after it too, and close() returns at once. A killed learner is reported the same way."""
    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path / "run", **TINY)
    (tmp_path / "run" / "preferences").write_text("in the way")
    env.reset(seed=0)
    with pytest.raises(PreferenceLearnerError) as error:
        for _ in range(100_000):
            env.step(env.action_space.sample())
            time.sleep(0.001)
    text = str(error.value)
    assert text.startswith("the preference learner crashed: ") and "\n" not in text
    assert "learner_error.log" in text
    assert "Traceback" in (tmp_path / "run" / "learner_error.log").read_text()
    with pytest.raises(PreferenceLearnerError):
        env.step(env.action_space.sample())
    start = time.time()
    env.close()
    assert time.time() - start < 10

    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path / "killed", **TINY)
    env.reset(seed=0)
    os.kill(env.core.process.pid, signal.SIGKILL)
    with pytest.raises(PreferenceLearnerError, match=r"process ended \(exit code -9\)"):
        for _ in range(100_000):
            env.step(env.action_space.sample())
            time.sleep(0.001)
    env.close()


# ---------------------------------------------------------------------- workflows
@pytest.mark.slow
def test_collect_then_train_from_the_folder_then_use_the_pretrained_model(tmp_path, capsys):
    """DRLHP's workflows: (1) collect preferences only (the agent gets the env's reward),
    (2) train a reward model from the preferences folder with the command, no RL run,
    (3) an agent on the pretrained model, frozen (max_feedback=0): r̂ from the first step."""
    collect = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path / "collect",
                                        collect_prefs_only=True, **TINY)
    collect.reset(seed=0)
    while collect.model_version < 2:  # two rounds
        _, reward, *_, info = collect.step(collect.action_space.sample())
        assert reward == info["true_reward"]
        time.sleep(0.001)
    collect.close()
    assert len(PreferenceDataset.load(tmp_path / "collect" / "preferences")) == 20

    def command(*args: str) -> int:
        sys.argv = ["train_reward.py", *args]
        try:
            runpy.run_path(str(ROOT / "scripts" / "train_reward.py"), run_name="__main__")
        except SystemExit as e:
            return int(e.code or 0)
        return 0

    argv = sys.argv
    try:
        assert command(str(tmp_path / "collect" / "preferences"), str(tmp_path / "reward"),
                       "reward_update=20", "reward_hidden_dim=16") == 0
        assert command(str(tmp_path / "nothing"), str(tmp_path / "x")) == 2
    finally:
        sys.argv = argv
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == [f"train_reward.py: error: {tmp_path / 'nothing'} is not a preference "
                      "dataset (no meta.json)"]
    model = load_reward_model(tmp_path / "reward")

    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path / "agent",
                                    reward_model=str(tmp_path / "reward"), max_feedback=0,
                                    normalize_reward=False)
    obs, _ = env.reset(seed=0)
    for _ in range(30):
        action = env.action_space.sample()
        next_obs, reward, *_ = env.step(action)
        assert reward == pytest.approx(float(model.predict(obs[None], action[None])[0]),
                                       abs=1e-5)
        obs = next_obs
    env.close()
    assert not (tmp_path / "agent" / "reward.csv").exists()  # frozen: no round


@pytest.mark.slow
def test_the_model_is_used_after_n_initial_training_steps_and_a_resume_continues(tmp_path):
    """n_initial_training_steps=6 passes over the labels (DRLHP's training steps): the warm-up
    reward (here the true one) until then; a round trains at most reward_update=3, so the
    learner trains the rest in its idle time, one published pass each.
    Then the learner is resumed: labels, queries and versions go on."""
    env = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path, warmup_reward="true",
                                    n_initial_training_steps=6, **TINY)
    env.reset(seed=0)
    seen = set()
    while True:
        _, reward, *_, info = env.step(env.action_space.sample())
        if reward != info["true_reward"]:  # the first step that returns r̂
            break
        assert env.core.epochs < 6  # the true reward until the sixth pass
        seen.add(env.model_version)
        time.sleep(0.001)
    assert reward == info["predicted_reward"] and env.using_predicted_reward
    assert env.core.epochs >= 6 and env.model_version >= 2 and 1 in seen
    while env.core.shared.counts()["total_feedback"] < 20:
        env.step(env.action_space.sample())
        time.sleep(0.001)
    time.sleep(0.5)
    version = env.model_version
    env.close()

    resumed = PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path, resume=True,
                                        **{**TINY, "max_feedback": 40})
    assert resumed.model_version >= version and resumed.using_predicted_reward  # at once
    resumed.reset(seed=1)
    start = resumed.model_version
    while resumed.model_version < start + 2:  # two more rounds
        resumed.step(resumed.action_space.sample())
        time.sleep(0.001)
    resumed.close()
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["total_feedback"].tolist() == [10, 20, 30, 40]
    assert len(PreferenceDataset.load(tmp_path / "preferences")) == 40


# ---------------------------------------------------------------------- people on the web
WEB_AGENT = """
import sys, time
import gymnasium as gym
import numpy as np
from themis import PreferenceLearningWrapper


class Dot(gym.Env):
    \"\"\"A dot moved towards the centre of a 32-pixel frame (cheap to render).\"\"\"

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self):
        self.render_mode = "rgb_array"
        self.observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
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


if __name__ == "__main__":
    run, resume, steps = sys.argv[1], sys.argv[2] == "resume", int(sys.argv[3])
    env = PreferenceLearningWrapper(
        gym.wrappers.TimeLimit(Dot(), 50), run, resume=resume, human_teacher=True,
        teacher_ui="web", labelers=3, label_port=0, human_frame_size=32, max_feedback=12,
        reward_batch=4, segment=10, num_seed_steps=100, num_interact=100,
        reward_hidden_dim=16, reward_update=3, ensemble_size=2, torch_threads=1)
    print("learner", env.core.process.pid, flush=True)
    env.reset(seed=0)
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
        time.sleep(0.002)
    env.close()
    print("closed", env.core.closed_info, flush=True)
"""


@pytest.mark.slow
def test_every_web_answer_reaches_preferences_once_across_a_kill_9_and_a_resume(tmp_path):
    """Three bot labelers answer through the web server of the wrapper's learner; the agent's
    process is killed with SIGKILL (the learner then saves and ends, no orphan), and resumed:
    every answer that got HTTP 201 is in preferences/ exactly once, with its label."""
    from tests.test_web_labeling import Bots, _every_answer_once_in_preferences
    from themis.crowd.label_store import LabelStore

    run = tmp_path / "run"
    store = LabelStore(run / "labels.sqlite", run / "web")
    tokens = [t for _, t in store.add_labelers(3)]
    proc, learner = start_script(WEB_AGENT, str(run), "new", "1000000")
    bots = Bots(run, tokens)
    deadline = time.time() + 300
    while len(bots.accepted) < 6:
        assert time.time() < deadline and proc.poll() is None, bots.codes
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert wait_gone(learner), "the learner outlived the killed agent"
    resumed = subprocess.run([sys.executable, "-c", WEB_AGENT, str(run), "resume", "800"],
                             cwd=ROOT, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    bots.join()
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed the preference learner" in resumed.stdout
    _every_answer_once_in_preferences(run, store, bots)
    assert len(bots.accepted) >= 6
