"""All five domains, agent selection by action space, encoders, PPO and the on-policy loop."""

from __future__ import annotations

import copy
import json

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import launch
from themis.agents import PPO, PPOConfig, resolve_agent, select_agent
from themis.agents.buffers import EpisodeStore
from themis.agents.encoders import (
    FlattenEncoder,
    GridCNN,
    NatureCNN,
    make_encoder,
    observation_kind,
    random_encoder,
)
from themis.agents.ppo import Rollout, gae
from themis.environments.domains import episode_limit, get_domain, make_env
from themis.reward import PreferenceDataset, RewardEnsemble
from themis.utils import ConfigError

# (domain, short env name, full gymnasium id, observation shape, dtype, action space type)
DOMAIN_ENVS = [
    ("ALE", "Breakout-v5", "ALE/Breakout-v5", (4, 84, 84), np.uint8, gym.spaces.Discrete),
    ("Box2d", "LunarLander-v3", "LunarLander-v3", (8,), np.float32, gym.spaces.Discrete),
    ("Box2d", "BipedalWalker-v3", "BipedalWalker-v3", (24,), np.float32, gym.spaces.Box),
    ("Box2d", "CarRacing-v3", "CarRacing-v3", (3, 96, 96), np.uint8, gym.spaces.Box),
    ("Minigrid", "DistShift1-v0", "MiniGrid-DistShift1-v0", (4, 7, 7), np.uint8,
     gym.spaces.Discrete),
    ("BabyAI", "GoToRedBallGrey-v0", "BabyAI-GoToRedBallGrey-v0", (4 + 51, 7, 7), np.uint8,
     gym.spaces.Discrete),
    ("Control", "HalfCheetah-v5", "HalfCheetah-v5", (17,), np.float64, gym.spaces.Box),
    ("DMC", "walker_walk", "dm_control/walker-walk-v0", (24,), np.float32, gym.spaces.Box),
    ("DMC", "quadruped-walk", "dm_control/quadruped-walk-v0", (78,), np.float32,
     gym.spaces.Box),
    ("MetaWorld", "door-open-v3", "door-open-v3", (39,), np.float32, gym.spaces.Box),
]


@pytest.mark.parametrize("domain,short,full,shape,dtype,space", DOMAIN_ENVS,
                         ids=[d[1] for d in DOMAIN_ENVS])
def test_every_domain_makes_its_envs(domain, short, full, shape, dtype, space):
    dom = get_domain(domain)
    assert dom.resolve(short) == full and dom.resolve(full) == full
    env = make_env(domain, short, seed=0, render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    assert env.observation_space.shape == shape and obs.shape == shape
    assert obs.dtype == dtype
    assert isinstance(env.action_space, space)
    obs, *_ = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs.astype(env.observation_space.dtype))
    frame = env.render()
    assert frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8  # RGB for clips
    env.close()


def test_unknown_env_lists_close_matches_of_its_domain():
    with pytest.raises(ConfigError, match=r"env=Breakuot-v5 is not an environment of "
                                          r"domain=ALE; close matches: Breakout-v5"):
        make_env("ALE", "Breakuot-v5")
    with pytest.raises(ConfigError, match="close matches: DistShift2-v0, DistShift1-v0"):
        make_env("Minigrid", "DistShift-v0")
    with pytest.raises(ConfigError, match="not an environment of domain=Minigrid"):
        make_env("Minigrid", "GoToRedBallGrey-v0")  # a BabyAI level, not a MiniGrid task


def test_an_env_of_ones_own_package_is_pointed_to_domain_gym():
    """``env=module:EnvId`` (the README's "any gymnasium env") under the default domain: the
    line says domain=Gym, not a list of MuJoCo names (issue 85 item 15)."""
    with pytest.raises(ConfigError) as info:
        make_env("Control", "mypkg.envs:MyEnv-v0")
    assert str(info.value) == ("env=mypkg.envs:MyEnv-v0 names an env of your own package "
                               "(module:EnvId); add domain=Gym, which imports the module and "
                               "makes the env")


def test_grid_observation_holds_direction_and_mission_words():
    env = make_env("BabyAI", "GoToRedBallGrey-v0", seed=3)
    obs, _ = env.reset(seed=3)
    raw = env.unwrapped.gen_obs()
    np.testing.assert_array_equal(obs[:3], np.transpose(raw["image"], (2, 0, 1)))
    assert np.all(obs[3] == raw["direction"])
    words = {"go": 24, "to": 37, "the": 30, "red": 0, "ball": 12}  # minigrid's vocabulary
    assert raw["mission"] == "go to the red ball"
    for index in words.values():
        assert np.all(obs[4 + index] == 1)
    assert obs[4:].sum() == 5 * 49  # five words, one plane each


def test_episode_limits_of_minigrid_and_atari():
    assert episode_limit(make_env("Minigrid", "DistShift1-v0")) == 252
    assert episode_limit(make_env("Box2d", "LunarLander-v3")) == 1000


def test_env_kwargs_reach_gym_make():
    env = make_env("Box2d", "CarRacing-v3", continuous=False)
    assert isinstance(env.action_space, gym.spaces.Discrete) and env.action_space.n == 5
    with pytest.raises(ConfigError, match="rejected env_kwargs"):
        make_env("Box2d", "LunarLander-v3", colour="red")


def test_agent_is_chosen_from_the_action_space():
    assert select_agent(gym.spaces.Box(-1, 1, (3,))) == "sac"
    assert select_agent(gym.spaces.Discrete(4)) == "ppo"
    with pytest.raises(ValueError, match="MultiDiscrete"):
        select_agent(gym.spaces.MultiDiscrete([2, 3]))
    with pytest.raises(ValueError, match="Dict"):
        select_agent(gym.spaces.Dict({"a": gym.spaces.Discrete(2)}))
    assert resolve_agent("auto", gym.spaces.Discrete(4))[0] == "ppo"
    assert resolve_agent("ppo", gym.spaces.Discrete(4))[0] == "ppo"
    with pytest.raises(ValueError, match="agent=sac cannot act"):
        resolve_agent("sac", gym.spaces.Discrete(4))


@pytest.mark.parametrize("shape,kind,cls", [((8,), "vector", FlattenEncoder),
                                            ((4, 84, 84), "pixels", NatureCNN),
                                            ((3, 96, 96), "pixels", NatureCNN),
                                            ((4, 7, 7), "grid", GridCNN)])
def test_encoders_map_observations_to_features(shape, kind, cls):
    assert observation_kind(shape) == kind
    enc = make_encoder(shape)
    assert isinstance(enc, cls)
    obs = torch.randint(0, 255, (5, *shape), dtype=torch.uint8)
    out = enc(obs)
    assert out.shape == (5, enc.feature_dim) and out.dtype == torch.float32
    frozen = random_encoder(shape, seed=1)
    assert not any(p.requires_grad for p in frozen.parameters())
    torch.testing.assert_close(frozen(obs), random_encoder(shape, seed=1)(obs))  # fixed
    with pytest.raises(ValueError, match="not supported"):
        observation_kind((2, 3))


def test_gae_matches_a_hand_computation():
    gamma, lam = 0.9, 0.8
    rewards = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    values = np.array([[0.5], [1.0], [1.5]], dtype=np.float32)
    dones = np.array([[0.0], [1.0], [0.0]], dtype=np.float32)  # episode ends after step 1
    next_values = np.array([2.0], dtype=np.float32)
    adv, ret = gae(rewards, values, dones, next_values, gamma, lam)
    d2 = 3.0 + gamma * 2.0 - 1.5
    d1 = 2.0 - 1.0  # terminal: no bootstrap
    d0 = 1.0 + gamma * 1.0 - 0.5
    expected = [d0 + gamma * lam * d1, d1, d2]
    np.testing.assert_allclose(adv[:, 0], expected, rtol=1e-6)
    np.testing.assert_allclose(ret, adv + values)


def test_ppo_update_raises_the_probability_of_rewarded_actions():
    torch.manual_seed(0)
    cfg = PPOConfig(num_envs=4, num_steps=16, update_epochs=4, num_minibatches=2,
                    anneal_lr=False, learning_rate=3e-3, ent_coef=0.0)
    agent = PPO((3,), 2, torch.device("cpu"), cfg)
    obs = np.ones((16, 4, 3), dtype=np.float32)
    for _ in range(10):
        actions, logprobs, values = zip(*(agent.step(obs[t]) for t in range(16)), strict=True)
        a = np.stack(actions)
        rewards = (a == 1).astype(np.float32)  # action 1 pays 1, action 0 pays nothing
        agent.update(Rollout(obs, a, np.stack(logprobs), np.stack(values), rewards,
                             np.ones((16, 4), dtype=np.float32), np.zeros(4, dtype=np.float32)))
    logits, _ = agent.net(torch.ones(1, 3))
    assert torch.softmax(logits, -1)[0, 1] > 0.9
    clone = PPO((3,), 2, torch.device("cpu"), cfg)
    clone.load_state_dict(agent.state_dict())
    assert clone.act(np.ones(3, dtype=np.float32)) == 1


def test_pixel_reward_model_and_uint8_storage():
    shape = (4, 84, 84)
    buffer = EpisodeStore(shape, 3, 100, torch.device("cpu"), obs_dtype=np.uint8)
    assert buffer.obs.dtype == np.uint8 and buffer.obs.nbytes == 100 * 4 * 84 * 84
    assert buffer.next_obs.nbytes == 0
    for t in range(30):
        buffer.add(np.full(shape, t, np.uint8), np.eye(3)[t % 3], 0.0, None, t == 29, 0, t,
                   float(t))
    assert not hasattr(buffer, "sample")  # an episode store only feeds queries
    pairs = buffer.sample_segment_pairs(3, 10, np.random.default_rng(0))
    assert pairs.observations.shape == (3, 2, 10, *shape) and pairs.observations.dtype == np.uint8
    model = RewardEnsemble(int(np.prod(shape)), 3, ensemble_size=2, hidden_dim=16,
                           obs_shape=shape)
    assert model.encoders is not None and len(model.encoders) == 2
    assert model.preference_probabilities(pairs.observations, pairs.actions).shape == (2, 3)
    data = PreferenceDataset(5, 10, int(np.prod(shape)), 3, obs_dtype=np.uint8)
    data.add(pairs, np.array([0.0, 1.0, 0.5]))
    assert data.observations.dtype == np.uint8
    members = model.predict_members(data.observations[:3, 0].reshape(30, -1),
                                    data.actions[:3, 0].reshape(30, -1))
    assert members.shape == (2, 30) and np.all(np.abs(members) <= 1)


TINY_PPO = ["num_train_steps=1536", "num_seed_steps=128", "num_unsup_steps=384",
            "num_interact=256", "max_feedback=20", "reward_batch=10", "segment=8",
            "eval_frequency=768", "num_eval_episodes=1", "log_frequency=512",
            "ppo.num_envs=4", "ppo.num_steps=64", "reward_hidden_dim=32", "reward_update=3",
            "sac.hidden_dim=32", "sac.batch_size=32", "entropy_pool_size=256", "reset_update=2"]


def test_dmc_names_its_features_and_meta_world_keeps_one_goal_per_seed():
    from lib.explain import feature_names

    walker = make_env("DMC", "walker-walk", seed=0)
    names = feature_names(walker, 24)
    assert names[:2] == ["height", "orientations[0]"] and names[-1] == "velocity[8]"
    walker.close()
    goals = []
    for seed in (0, 0, 1):
        env = make_env("MetaWorld", "door-open", seed=seed + 10_000, task_seed=seed)
        first = env.reset()[0][-3:]
        again = env.reset()[0][-3:]
        np.testing.assert_array_equal(first, again)  # one goal for the whole run
        goals.append(first)
        assert feature_names(env, 39)[-1] == "goal_z"
        env.close()
    np.testing.assert_array_equal(goals[0], goals[1])  # the task seed decides it ...
    assert not np.array_equal(goals[0], goals[2])  # ... and seeds differ


def test_meta_world_as_the_bpref_lineage_draws_a_goal_every_reset_and_hides_it(compose):
    # B-Pref / SURF / RUNE / QPA utils.make_metaworld_env: env._freeze_rand_vec = False on
    # the v2 env class (goal hidden): a new window position at every reset
    def positions(env, seeds):
        return [env.reset(seed=s)[0] for s in seeds]

    kwargs = {"freeze_rand_vec": False, "partially_observable": True}
    env = make_env("MetaWorld", "window-open", seed=0, **kwargs)
    first = positions(env, (1, 2, 3))
    assert len({tuple(o[4:7].round(4)) for o in first}) == 3  # the window moves each reset
    assert all((o[-3:] == 0).all() for o in first)  # the goal is not observed
    again = positions(make_env("MetaWorld", "window-open", seed=0, **kwargs), (1, 2, 3))
    np.testing.assert_array_equal(np.stack(first), np.stack(again))  # seeded resets repeat
    fixed = positions(make_env("MetaWorld", "window-open", seed=0), (1, 2, 3))
    assert len({tuple(o[4:7].round(4)) for o in fixed}) == 1 and (fixed[0][-3:] != 0).any()
    cfg = compose(["domain=MetaWorld", "env=window-open-v3", "+env_kwargs.freeze_rand_vec=false",
                   "+env_kwargs.partially_observable=true"])
    assert dict(cfg.env_kwargs) == kwargs


@pytest.mark.parametrize("domain,env_id", [("DMC", "walker_walk"), ("DMC", "cheetah_run")])
def test_dmc_clips_follow_the_agent(domain, env_id):
    """Clips of DMC come from the suite's tracking camera: moved 3 m and 10 m along x, the
    agent stays in the frame's centre."""
    env = make_env(domain, env_id, seed=0, render_mode="rgb_array", render_size=128)
    physics = env.unwrapped._env.physics
    centre = []
    for x in (0.0, 3.0, 10.0):
        with physics.reset_context():
            physics.data.qpos[0] = x
        centre.append(env.render()[40:88, 40:88].astype(float))
    env.close()
    for moved in centre[1:]:
        assert np.abs(moved - centre[0]).mean() < 10.0


@pytest.mark.parametrize("domain,env_id", [("MetaWorld", "button-press-v3"),
                                            ("Control", "HalfCheetah-v5")])
def test_mujoco_clips_render_without_shadows_and_reflections(domain, env_id):
    """Clip frames of gymnasium's MuJoCo envs and of Meta-World skip shadows and reflections
    (on OSMesa a 48-pixel Meta-World frame takes 15 ms instead of 62: three lights, each a
    4096-pixel shadow map): the scene's flags are off after the first frame."""
    import mujoco

    env = make_env(domain, env_id, seed=0, render_mode="rgb_array", render_size=48)
    frame = env.render()
    scene = env.unwrapped.mujoco_renderer.viewer.scn
    env.close()
    assert frame.shape == (48, 48, 3) and frame.std() > 0
    assert scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] == 0
    assert scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] == 0


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    ["domain=DMC", "env=walker_walk", "num_train_steps=1500", "num_seed_steps=100",
     "num_unsup_steps=200", "eval_frequency=1500", "segment=20"],
    # one round (step 556, after the first 500-step episode): clips render every step here
    ["domain=MetaWorld", "env=button-press-v3", "num_train_steps=600", "num_seed_steps=100",
     "num_unsup_steps=200", "eval_frequency=600", "xplain_state=true",
     "xplain_clips_per_round=1", "human_frame_size=48"],
], ids=["DMC", "MetaWorld"])
def test_dmc_and_meta_world_train_end_to_end(tmp_path, overrides):
    proc = launch("themis_train.sh", *TINY_PPO, *overrides, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "agent sac (auto" in proc.stdout and "Traceback" not in proc.stderr
    evals = pd.read_csv(tmp_path / "eval.csv")
    assert evals["episode_reward"].notna().all()
    if "domain=MetaWorld" in overrides:  # the success rate beside the return
        assert evals["success_rate"].between(0, 1).all()
        assert list((tmp_path / "queries").glob("*.mp4"))  # explained clips render
    else:
        assert "success_rate" not in evals


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    ["domain=ALE", "env=Breakout-v5", "num_eval_episodes=1"],
    ["domain=Box2d", "env=LunarLander-v3", "feed_type=3"],
    ["domain=Box2d", "env=BipedalWalker-v3", "num_train_steps=900", "num_seed_steps=100",
     "num_unsup_steps=200", "eval_frequency=900"],
    ["domain=Minigrid", "env=DistShift1-v0", "feed_type=5"],
    ["domain=BabyAI", "env=GoToRedBallGrey-v0", "feed_type=4"],
], ids=["ALE", "Box2d-discrete", "Box2d-continuous", "Minigrid", "BabyAI"])
def test_every_domain_trains_end_to_end(tmp_path, overrides):
    proc = launch("themis_train.sh", *TINY_PPO, *overrides, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    discrete = "BipedalWalker" not in overrides[1]
    assert f"agent {'ppo' if discrete else 'sac'} (auto" in proc.stdout
    evals = pd.read_csv(tmp_path / "eval.csv")
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert len(evals) >= 1 and evals["episode_reward"].notna().all()
    assert rounds["total_feedback"].iloc[-1] == 20
    assert (tmp_path / "checkpoints" / "reward_model.pt").is_file()
    meta = json.loads((tmp_path / "preferences" / "meta.json").read_text())
    assert meta.get("frame_stack", 1) == (4 if "domain=ALE" in overrides else 1)


def test_wrong_agent_for_the_action_space_fails_before_training(tmp_path):
    proc = launch("themis_train.sh", "domain=Box2d", "env=LunarLander-v3", "agent=sac",
                  f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert "agent=sac cannot act in the action space Discrete(4)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ppo_episode_store_keeps_whole_episodes_in_order(compose, tmp_path):
    from themis.builder import make_workspace

    cfg = compose(["domain=Classic", "env=CartPole-v1", "learn_reward=false",
                   "num_train_steps=1024", "num_seed_steps=128", "num_unsup_steps=128",
                   "ppo.num_envs=4", "ppo.num_steps=32", "segment=8", "eval_frequency=1024",
                   "num_eval_episodes=1", "log_frequency=1024"])
    ws = make_workspace(cfg, tmp_path)
    assert ws.driver.NAME == "ppo"
    ws.run()
    ws.logger.close()
    n = len(ws.buffer)
    assert n == 1024  # every step is stored, finished episodes or not
    episodes, t = ws.buffer.episode[:n], ws.buffer.t[:n]
    not_dones = ws.buffer.not_dones[:n]
    finished_lengths = []
    for e in np.unique(episodes):
        mine = episodes == e
        np.testing.assert_array_equal(np.sort(t[mine]), np.arange(mine.sum()))  # no gap/dup
        if (not_dones[mine] == 0).any():  # terminated: CartPole has no truncation this early
            finished_lengths.append(int(mine.sum()))
    train = pd.read_csv(tmp_path / "train.csv")
    assert len(train) == ws.episode == len(finished_lengths) > 10
    assert sorted(train["episode_length"]) == sorted(finished_lengths)
    assert (train["episode_reward"] == train["episode_length"]).all()  # CartPole pays 1/step
    pairs = ws.buffer.sample_segment_pairs(20, 8, np.random.default_rng(0))
    assert (pairs.true_rewards == 1).all()
    starts = pairs.starts.reshape(-1)
    for s in starts:  # every segment lies inside one episode, in time order
        idx = (s + np.arange(8)) % ws.buffer.capacity
        assert len(set(episodes[idx])) == 1 and np.all(np.diff(t[idx]) == 1)


def test_ppo_bootstraps_time_limit_truncations(compose, tmp_path, monkeypatch):
    """CartPole cut at 5 steps: every episode ends by truncation, whose reward gets γ V(s_T)."""
    from themis.builder import make_workspace

    cfg = compose(["domain=Classic", "env=CartPole-v1", "learn_reward=false",
                   "+env_kwargs.max_episode_steps=5", "num_train_steps=256",
                   "num_seed_steps=0", "num_unsup_steps=64", "ppo.num_envs=2",
                   "ppo.num_steps=32", "segment=5", "eval_frequency=256",
                   "num_eval_episodes=1", "log_frequency=256"])
    ws = make_workspace(cfg, tmp_path)
    rollouts = []
    monkeypatch.setattr(ws.agent, "value", lambda obs: np.full(len(obs), 10.0, np.float32))
    # the workspace reuses its rollout arrays: keep copies
    monkeypatch.setattr(ws.agent, "update", lambda r: rollouts.append(copy.deepcopy(r)) or {})
    ws.run()
    ws.logger.close()
    later = rollouts[1:]  # the first rollout is the unsupervised phase
    assert later
    for r in later:
        ends = r.dones == 1
        assert ends.sum() >= 2 * 32 // 5 - 2
        np.testing.assert_allclose(r.rewards[ends], 1.0 + 0.99 * 10.0, rtol=1e-6)
        np.testing.assert_allclose(r.rewards[~ends], 1.0)
        np.testing.assert_allclose(r.next_values, 10.0)


def test_egl_is_chosen_only_where_libegl_is_found(monkeypatch):
    """On a GPU container without libEGL, MUJOCO_GL=egl made ``import mujoco`` fail with a
    traceback (seen on a bare H100 machine): fall back to OSMesa there, and where OSMesa is
    missing too (an H200 machine's image) to ``disable``, with which dm_control imports."""
    import ctypes.util

    from themis.environments.mujoco import choose_gl_backend

    cases = ((True, {"EGL", "OSMesa"}, "egl"), (True, {"OSMesa"}, "osmesa"),
             (True, set(), "disable"), (False, {"EGL", "OSMesa"}, "osmesa"),
             (False, {"EGL"}, "disable"))
    for nvidia, libraries, expected in cases:
        monkeypatch.delenv("MUJOCO_GL", raising=False)
        monkeypatch.setattr("os.path.exists", lambda path, nvidia=nvidia:
                            nvidia and path == "/dev/nvidia0")
        monkeypatch.setattr(ctypes.util, "find_library", lambda name, libraries=libraries:
                            f"lib{name}.so.1" if name in libraries else None)
        assert choose_gl_backend() == expected, (nvidia, libraries)
    monkeypatch.setenv("MUJOCO_GL", "glfw")  # a user's choice stays
    assert choose_gl_backend() == "glfw"


@pytest.mark.parametrize("libraries, expected", [("libOSMesa.so.8 (libc6,x86-64) => /lib/x\n",
                                                   "osmesa"), ("", "disable")])
def test_launchers_gl_rule_matches_choose_gl_backend(tmp_path, libraries, expected):
    """The launchers' shell rule (scripts/gl_backend.sh) falls back as choose_gl_backend does:
    OSMesa where ldconfig lists it, else ``disable`` (this machine has no /dev/nvidia0)."""
    import subprocess
    from pathlib import Path

    if Path("/dev/nvidia0").exists():
        pytest.skip("an NVIDIA machine takes the EGL branch")
    (tmp_path / "ldconfig").write_text(f"#!/bin/sh\nprintf '{libraries}'\n")
    (tmp_path / "ldconfig").chmod(0o755)
    rule = Path(__file__).resolve().parents[1] / "scripts" / "gl_backend.sh"

    def chosen(**env: str) -> str:
        return subprocess.run(["bash", "-c", f"source {rule}; echo $MUJOCO_GL"],
                              env={"PATH": f"{tmp_path}:/usr/bin:/bin", **env},
                              capture_output=True, text=True, check=True).stdout.strip()

    assert chosen() == expected
    assert chosen(MUJOCO_GL="egl") == "egl"  # a user's choice stays


@pytest.mark.parametrize("domain, env", [("DMC", "walker_walk"), ("Control", "Hopper-v5")])
def test_clips_without_an_opengl_backend_are_one_clear_error(monkeypatch, domain, env):
    """With MUJOCO_GL=disable (what the launchers choose without libEGL and libOSMesa) training
    runs, but a run that renders MuJoCo clips stops with one line naming the fix, not with
    dm_control's 'No OpenGL rendering backend' from deep inside the first clip."""
    monkeypatch.setenv("MUJOCO_GL", "disable")
    with pytest.raises(ConfigError, match="MUJOCO_GL=disable: no libEGL"):
        make_env(domain, env, seed=0, render_mode="rgb_array")


def test_dmc_and_meta_world_print_no_backend_or_version_lines_but_keep_warnings():
    """dm_control's absl INFO lines ("MUJOCO_GL=osmesa, attempting to import specified OpenGL
    backend.", "MuJoCo library version is: ...") reached the launchers' console (Hydra's
    handler prints INFO) on every DMC and Meta-World launch; its warnings still do."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import logging, sys\n"
            "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
            "from themis.environments.domains import make_env\n"
            "make_env('DMC', 'walker_walk', seed=0).close()\n"
            "make_env('MetaWorld', 'door-open-v3', seed=0).close()\n"
            "logging.getLogger('absl').warning('a real warning')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**__import__("os").environ,
                                                      "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "MUJOCO_GL=" not in out and "MuJoCo library version" not in out, out
    assert "a real warning" in out
