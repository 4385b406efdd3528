"""Warm starts: ``pretrained_policy=`` (a Stable-Baselines3 .zip) and ``pretrained_snapshot=``
pointing at a run's ``checkpoints/agent.pt``.

The SB3 models are real ones (tiny networks, weights randomised so that nothing matches by
chance), saved with ``model.save()``; after loading, Themis's actor must act as SB3's does.
"""

from __future__ import annotations

import io
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.conftest import TINY_PENDULUM, launch
from themis.agents import PPO, SAC, PPOConfig, SACConfig
from themis.agents.sb3 import load_sb3_policy, read_sb3_zip
from themis.builder import make_workspace
from themis.utils import ConfigError, save_durably

sb3 = pytest.importorskip("stable_baselines3")
CPU = torch.device("cpu")


def randomised(model: object, seed: int = 0) -> object:
    """The SB3 model with every policy parameter drawn anew (init values could match)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.policy.parameters():  # type: ignore[attr-defined]
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def sb3_sac(tmp_path, net_arch=(16, 16), env="Pendulum-v1", **kwargs):
    model = randomised(sb3.SAC("MlpPolicy", env, policy_kwargs={"net_arch": list(net_arch)},
                               device="cpu", **kwargs))
    model.save(tmp_path / "sac.zip")
    return model, tmp_path / "sac.zip"


def sb3_ppo(tmp_path, net_arch=(16, 16), env="CartPole-v1", policy="MlpPolicy", **kwargs):
    arch = {"net_arch": {"pi": list(net_arch), "vf": list(net_arch)}} if net_arch is not None \
        else {}
    model = randomised(sb3.PPO(policy, env, n_steps=32, batch_size=32, device="cpu",
                               policy_kwargs={**arch, **kwargs}))
    model.save(tmp_path / "ppo.zip")
    return model, tmp_path / "ppo.zip"


# ---------------------------------------------------------------- the same actions as SB3's
def test_sac_loaded_from_sb3_acts_and_values_as_sb3(tmp_path):
    model, path = sb3_sac(tmp_path)
    agent = SAC(3, 1, CPU, SACConfig(hidden_dim=16, hidden_depth=2))
    assert load_sb3_policy(path, agent).startswith("SB3 SAC")
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 3)).astype(np.float32)
    obs_t = torch.as_tensor(obs)
    with torch.no_grad():
        expected = model.policy.actor(obs_t, deterministic=True).numpy()  # in [-1, 1]
        q_sb3 = torch.stack(model.policy.critic(obs_t, torch.as_tensor(expected))).squeeze(-1)
        q_sb3_target = torch.stack(model.policy.critic_target(
            obs_t, torch.as_tensor(expected))).squeeze(-1)
        q_themis = agent.critic(obs_t, torch.as_tensor(expected))
        q_target = agent.critic_target(obs_t, torch.as_tensor(expected))
    np.testing.assert_allclose(agent.act(obs, sample=False), expected, atol=1e-5)
    # SB3's predict() acts in the env's bounds ([-2, 2]); Themis's env rescales [-1, 1] to them
    np.testing.assert_allclose(2 * agent.act(obs, sample=False),
                               model.predict(obs, deterministic=True)[0], atol=1e-5)
    torch.testing.assert_close(q_themis, q_sb3, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(q_target, q_sb3_target, atol=1e-5, rtol=1e-5)
    assert float(agent.log_alpha.detach()) == pytest.approx(float(model.log_ent_coef.detach()))


def test_ppo_loaded_from_sb3_has_its_action_probabilities_and_values(tmp_path):
    model, path = sb3_ppo(tmp_path)
    agent = PPO((4,), 2, CPU, PPOConfig(hidden_dim=16, hidden_depth=2))
    load_sb3_policy(path, agent)
    obs = np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)
    obs_t = torch.as_tensor(obs)
    with torch.no_grad():
        probs = model.policy.get_distribution(obs_t).distribution.probs
        values = model.policy.predict_values(obs_t).squeeze(-1)
        logits, themis_values = agent.net(obs_t)
    torch.testing.assert_close(torch.softmax(logits, -1), probs, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(themis_values, values, atol=1e-5, rtol=1e-5)
    actions = model.predict(obs, deterministic=True)[0]
    assert [agent.act(o) for o in obs] == actions.tolist()
    assert len(set(actions.tolist())) == 2  # both actions occur: the test can tell them apart


class TinyImages(gym.Env):
    """Channels-first uint8 images (3, 40, 40) and 3 discrete actions."""

    observation_space = gym.spaces.Box(0, 255, (3, 40, 40), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def test_ppo_cnn_policy_loads_into_the_nature_cnn_encoder(tmp_path):
    """SB3's CnnPolicy (Nature CNN, no hidden layers) onto Themis's encoder and heads."""
    model, path = sb3_ppo(tmp_path, net_arch=None, env=TinyImages(), policy="CnnPolicy")
    agent = PPO((3, 40, 40), 3, CPU, PPOConfig(hidden_depth=0))
    assert "CNN encoder" in load_sb3_policy(path, agent)
    obs = np.random.default_rng(2).integers(0, 256, (16, 3, 40, 40), dtype=np.uint8)
    with torch.no_grad():
        probs = model.policy.get_distribution(torch.as_tensor(obs)).distribution.probs
        logits, _ = agent.net(torch.as_tensor(obs))
    torch.testing.assert_close(torch.softmax(logits, -1), probs, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- one line when they differ
@pytest.mark.parametrize("build,agent,message", [
    (lambda p: sb3_sac(p, net_arch=(32, 32)), lambda: SAC(3, 1, CPU, SACConfig(hidden_dim=16)),
     "SB3 SAC with hidden layers [32, 32], 3-d observations and 1-d actions; this run's SAC "
     "expects hidden layers [16, 16], 3-d observations and 1-d actions; set sac.hidden_dim=32 "
     "sac.hidden_depth=2"),
    (lambda p: sb3_sac(p, net_arch=(16, 8)), lambda: SAC(3, 1, CPU, SACConfig(hidden_dim=16)),
     "hidden layers [16, 8] cannot be loaded"),
    (lambda p: sb3_sac(p, env="MountainCarContinuous-v0"),
     lambda: SAC(3, 1, CPU, SACConfig(hidden_dim=16)),
     "2-d observations and 1-d actions; this run's SAC expects hidden layers [16, 16], 3-d "
     "observations and 1-d actions (a model of another env)"),
    (lambda p: sb3_sac(p, use_sde=True), lambda: SAC(3, 1, CPU, SACConfig(hidden_dim=16)),
     "uses gSDE (use_sde=True)"),
    (lambda p: sb3_ppo(p), lambda: SAC(4, 2, CPU, SACConfig(hidden_dim=16)),
     "it holds an SB3 PPO policy (Discrete actions); this run's agent is SAC (Box actions), "
     "which loads SB3 SAC models"),
    (lambda p: sb3_sac(p), lambda: PPO((4,), 2, CPU, PPOConfig(hidden_dim=16)),
     "it holds an SB3 SAC policy (Box actions); this run's agent is PPO"),
    (lambda p: sb3_ppo(p, net_arch=(64, 64)), lambda: PPO((4,), 2, CPU, PPOConfig(hidden_dim=16)),
     "SB3 PPO with policy layers [64, 64], value layers [64, 64], 4 input features and 2 "
     "actions; this run's PPO expects policy and value layers [16, 16], 4 input features and 2 "
     "actions; set ppo.hidden_dim=64 ppo.hidden_depth=2"),
    (lambda p: sb3_ppo(p, activation_fn=torch.nn.ReLU),
     lambda: PPO((4,), 2, CPU, PPOConfig(hidden_dim=16)),
     "its policy uses activation_fn=ReLU; Themis's PPO uses Tanh"),
    (lambda p: sb3_ppo(p), lambda: PPO((8,), 4, CPU, PPOConfig(hidden_dim=16)),
     "(a model of another env)"),
])
def test_networks_that_differ_are_refused_with_what_was_expected(tmp_path, build, agent,
                                                                  message):
    _, path = build(tmp_path)
    themis_agent = agent()
    before = [p.detach().clone() for p in (themis_agent.actor if isinstance(
        themis_agent, SAC) else themis_agent.net).parameters()]
    with pytest.raises(ValueError) as err:
        load_sb3_policy(path, themis_agent)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    after = (themis_agent.actor if isinstance(themis_agent, SAC) else themis_agent.net)
    assert all(torch.equal(a, b) for a, b in zip(before, after.parameters(), strict=True))


def test_a_policy_pth_that_needs_code_is_refused_unread(tmp_path):
    """A crafted .zip whose policy.pth pickles an object: refused, nothing is executed."""
    buf = io.BytesIO()
    torch.save({"actor.mu.weight": torch.zeros(1, 2), "x": zipfile.ZipInfo("a")}, buf)
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as z:
        z.writestr("policy.pth", buf.getvalue())
        z.writestr("data", "{}")
    with pytest.raises(ValueError, match="needs more than plain tensors"):
        read_sb3_zip(tmp_path / "evil.zip")
    (tmp_path / "text.zip").write_text("not a zip")
    with pytest.raises(ValueError, match=r"not a Stable-Baselines3 \.zip"):
        read_sb3_zip(tmp_path / "text.zip")


# ---------------------------------------------------------------- through the entry point
def test_run_starts_from_the_sb3_policy(compose, tmp_path):
    model, path = sb3_sac(tmp_path, net_arch=(32, 32))
    ws = make_workspace(compose([*TINY_PENDULUM, f"pretrained_policy={path}"]), tmp_path / "r")
    obs = np.random.default_rng(3).uniform(-1, 1, (8, 3)).astype(np.float32)
    with torch.no_grad():
        expected = model.policy.actor(torch.as_tensor(obs), deterministic=True).numpy()
    np.testing.assert_allclose(ws.agent.act(obs, sample=False), expected, atol=1e-5)
    ws.logger.close()


def test_launcher_refuses_a_policy_of_other_shapes_with_one_line(tmp_path):
    _, path = sb3_sac(tmp_path, net_arch=(8, 8))
    proc = launch("themis_train.sh", *TINY_PENDULUM, f"pretrained_policy={path}",
                  f"hydra.run.dir={tmp_path / 'r'}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"themis: error: pretrained_policy={path}: SB3 SAC with hidden layers [8, 8], 3-d "
        "observations and 1-d actions; this run's SAC expects hidden layers [32, 32], 3-d "
        "observations and 1-d actions; set sac.hidden_dim=8 sac.hidden_depth=2"]
    assert not (tmp_path / "r").exists()


def test_policy_and_snapshot_together_are_refused(compose, tmp_path):
    agent_checkpoint(tmp_path / "agent.pt")
    with pytest.raises(ConfigError, match="pretrained_policy and pretrained_snapshot are both"):
        make_workspace(compose([*TINY_PENDULUM, "pretrained_policy=a.zip",
                                f"pretrained_snapshot={tmp_path / 'agent.pt'}"]), tmp_path)


# ---------------------------------------------------------------- a run's agent.pt
def agent_checkpoint(path, hidden_dim: int = 32, env: str = "Pendulum-v1"):
    """``checkpoints/agent.pt`` as :meth:`Workspace.save_checkpoints` writes it."""
    torch.manual_seed(5)
    agent = SAC(3, 1, CPU, SACConfig(hidden_dim=hidden_dim))
    save_durably({"agent": agent.state_dict(), "step": 1200, "env": env}, path)
    return agent


def test_agent_checkpoint_as_snapshot_loads_the_agent_only(compose, tmp_path):
    """It failed with "'buffer' is missing" (a KeyError) before; now the agent is loaded and the
    run keeps its own schedule from step 0 (the checkpoint's step 1200 would have ended it)."""
    saved = agent_checkpoint(tmp_path / "agent.pt")
    ws = make_workspace(compose([*TINY_PENDULUM, f"pretrained_snapshot={tmp_path / 'agent.pt'}"]),
                        tmp_path / "r")
    for mine, theirs in zip(ws.agent.actor.parameters(), saved.actor.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert ws.step == 0 and len(ws.buffer) == 0
    assert (ws.cfg.num_seed_steps, ws.cfg.num_unsup_steps) == (200, 200)
    ws.run(until=250)  # it trains on from there
    assert ws.step == 250
    ws.logger.close()


def test_agent_checkpoint_of_other_shapes_is_refused_with_one_line(tmp_path):
    agent_checkpoint(tmp_path / "agent.pt", hidden_dim=16)
    proc = launch("themis_train.sh", *TINY_PENDULUM, f"pretrained_snapshot={tmp_path}/agent.pt",
                  f"hydra.run.dir={tmp_path / 'r'}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"themis: error: pretrained_snapshot={tmp_path}/agent.pt: the agent "
                           "does not fit this run")
