"""Domain registry and agent selection."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from themis.agents import SAC
from themis.environments.domains import get_domain, make_env
from themis.utils import ConfigError, get_device


def test_control_domain_makes_halfcheetah():
    env = make_env("Control", "HalfCheetah-v5", seed=0)
    assert env.spec.id == "HalfCheetah-v5"
    assert env.observation_space.shape == (17,)
    assert np.all(env.action_space.low == -1) and np.all(env.action_space.high == 1)


def test_actions_are_rescaled_to_unit_box():
    import gymnasium as gym

    env = make_env("Classic", "Pendulum-v1", seed=0)
    raw = gym.make("Pendulum-v1")
    assert np.all(env.action_space.high == 1.0)
    for ours, theirs in ((1.0, 2.0), (-0.5, -1.0), (0.25, 0.5)):  # Pendulum torque in [-2, 2]
        obs, _ = env.reset(seed=3)
        raw_obs, _ = raw.reset(seed=3)
        np.testing.assert_allclose(obs, raw_obs)
        obs, reward, *_ = env.step(np.array([ours], dtype=np.float32))
        raw_obs, raw_reward, *_ = raw.step(np.array([theirs], dtype=np.float32))
        np.testing.assert_allclose(obs, raw_obs, rtol=1e-6)
        assert reward == pytest.approx(raw_reward)


def test_unknown_env_lists_close_matches():
    with pytest.raises(ConfigError, match="close matches: HalfCheetah-v5"):
        get_domain("Control").resolve("HalfCheeta-v5")
    with pytest.raises(ConfigError, match="not an environment of domain=Control"):
        make_env("Control", "CartPole-v1")


def test_unknown_domain():
    with pytest.raises(ConfigError, match=r"domain=Contrl is unknown .did you mean Control"):
        make_env("Contrl", "HalfCheetah-v5")


def test_device_fallback():
    assert get_device("cpu").type == "cpu"
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert get_device("auto").type == want
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            get_device("cuda")


def test_sac_actions_in_bounds_and_state_dict_round_trip():
    agent = SAC(4, 2, torch.device("cpu"))
    obs = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    actions = agent.act(obs, sample=True)
    assert actions.shape == (10, 2) and np.all(np.abs(actions) <= 1)
    other = SAC(4, 2, torch.device("cpu"))
    other.load_state_dict(agent.state_dict())
    np.testing.assert_allclose(other.act(obs, sample=False), agent.act(obs, sample=False))
    with pytest.raises(ValueError, match="obs_dim=4"):
        SAC(5, 2, torch.device("cpu")).load_state_dict(agent.state_dict())


def test_acting_draws_the_same_action_as_sampling_and_skips_eval_mode_only_where_it_is_moot():
    from torch import nn

    from themis.utils import mode_dependent

    agent = SAC(5, 2, torch.device("cpu"))
    obs = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    torch.manual_seed(7)
    acted = agent.act(obs, sample=True)
    torch.manual_seed(7)
    sampled, _ = agent.actor.sample(torch.as_tensor(obs))
    assert np.array_equal(acted, sampled.detach().numpy())  # the same draw, no log-prob
    assert not mode_dependent(agent.actor)
    assert mode_dependent(nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.1)))
    assert mode_dependent(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))
    assert not mode_dependent(nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3)))


def test_squashed_gaussian_log_prob_matches_change_of_variables():
    torch.manual_seed(0)
    agent = SAC(3, 2, torch.device("cpu"))
    obs = torch.randn(4096, 3)
    action, log_prob = agent.actor.sample(obs)
    mu, log_std = agent.actor(obs)
    u = torch.atanh(action.clamp(-1 + 1e-6, 1 - 1e-6))
    normal = torch.distributions.Normal(mu, log_std.exp())
    reference = (normal.log_prob(u) - torch.log(1 - action.pow(2) + 1e-6)).sum(-1)
    ok = action.abs().max(-1).values < 0.99  # away from the saturation where clamping bites
    torch.testing.assert_close(log_prob[ok], reference[ok], rtol=1e-3, atol=1e-3)


def test_mujoco_warnings_are_logged_once_not_written_to_cwd(tmp_path, monkeypatch, caplog):
    import logging

    from themis.environments import mujoco as themis_mujoco

    monkeypatch.chdir(tmp_path)
    themis_mujoco._seen_mujoco_warnings.clear()
    caplog.set_level(logging.DEBUG, logger="themis.environments.mujoco")
    for _ in range(2):
        make_env("Control", "HalfCheetah-v5", seed=0).close()
    messages = [r.getMessage() for r in caplog.records if r.name == "themis.environments.mujoco"]
    assert len(messages) == len(set(messages))
    import mujoco

    if int(mujoco.__version__.split(".")[0]) >= 4:  # gymnasium's model uses a deprecated attribute
        assert any("settotalmass" in m for m in messages)
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Hopper-v5"])
def test_mujoco_clips_follow_the_agent(env_id):
    """Frames come from the model's tracking camera: with the torso moved 3 m and 10 m along x,
    the centre of the frame still shows the agent (it barely changes), where gymnasium's
    default free camera shows empty floor there."""
    env = make_env("Control", env_id, seed=0, render_mode="rgb_array", render_size=128)
    sim = env.unwrapped
    centre = []
    for x in (0.0, 3.0, 10.0):
        qpos = sim.data.qpos.copy()
        qpos[0] = x
        sim.set_state(qpos, np.zeros_like(sim.data.qvel))
        centre.append(env.render()[40:88, 40:88].astype(float))
    env.close()
    for moved in centre[1:]:
        assert np.abs(moved - centre[0]).mean() < 10.0  # HalfCheetah free camera: 20 (gone)


def test_sac_steps_actor_and_temperature_with_one_optimizer_as_two_did():
    """One backward pass and one Adam step for the actor and the temperature give the same
    parameters as the two separate steps did; checkpoints of the two-optimiser layout load."""
    import copy

    from themis.agents.buffers import ReplayBufferSamples
    from themis.agents.sac import SAC, SACConfig
    from themis.utils import make_adam

    torch.manual_seed(0)
    agent = SAC(5, 2, torch.device("cpu"), SACConfig(hidden_dim=32, batch_size=16))
    obs = torch.randn(16, 5)
    # the layout before: actor and temperature each with their own Adam
    actor, log_alpha = copy.deepcopy(agent.actor), agent.log_alpha.detach().clone()
    log_alpha.requires_grad_(True)
    opt_actor, opt_alpha = make_adam(actor.parameters(), 3e-4), make_adam([log_alpha], 3e-4)
    torch.manual_seed(1)
    agent.update_actor_and_alpha(obs)
    torch.manual_seed(1)
    agent.critic.requires_grad_(False)
    action, log_prob = actor.sample(obs)
    loss = (log_alpha.exp().detach() * log_prob - agent.critic(obs, action).min(0).values).mean()
    opt_actor.zero_grad()
    loss.backward()
    opt_actor.step()
    alpha_loss = (log_alpha.exp() * (-log_prob.detach() - agent.target_entropy)).mean()
    opt_alpha.zero_grad()
    alpha_loss.backward()
    opt_alpha.step()
    for a, b in zip(agent.actor.parameters(), actor.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(agent.log_alpha, log_alpha)

    old = agent.state_dict()  # as an earlier version saved it: two optimisers
    old["actor_optimizer"] = opt_actor.state_dict()
    old["alpha_optimizer"] = opt_alpha.state_dict()
    fresh = SAC(5, 2, torch.device("cpu"), SACConfig(hidden_dim=32, batch_size=16))
    fresh.load_state_dict(old)
    groups = fresh.actor_optimizer.state_dict()
    assert len(groups["param_groups"]) == 2
    n = len(groups["param_groups"][0]["params"])
    torch.testing.assert_close(groups["state"][n]["exp_avg"],
                               opt_alpha.state_dict()["state"][0]["exp_avg"])
    batch = ReplayBufferSamples(obs, torch.rand(16, 2) * 2 - 1, torch.randn(16, 5),
                                torch.randn(16), torch.ones(16))
    fresh.update(batch, 1)  # and it trains on


def test_sac_update_steps_the_critic_after_a_reset_and_leaves_it_trainable():
    """The update keeps its parameter lists (no module walk per update): after
    ``reset_critic`` it steps the new critic and moves the new target towards it; the actor's
    step leaves the critic trainable and without gradients of its own."""
    from themis.agents.buffers import ReplayBufferSamples
    from themis.agents.sac import SAC, SACConfig

    torch.manual_seed(0)
    agent = SAC(5, 2, torch.device("cpu"), SACConfig(hidden_dim=32, batch_size=16))
    batch = ReplayBufferSamples(torch.randn(16, 5), torch.rand(16, 2) * 2 - 1, torch.randn(16, 5),
                                torch.randn(16), torch.ones(16))
    agent.update(batch, 1)
    agent.reset_critic()
    critic = [p.detach().clone() for p in agent.critic.parameters()]
    target = [p.detach().clone() for p in agent.critic_target.parameters()]
    agent.update(batch, 2)
    assert all(not torch.equal(a, b) for a, b in zip(agent.critic.parameters(), critic,
                                                                     strict=True))
    for new, old, online in zip(agent.critic_target.parameters(), target,
                                agent.critic.parameters(), strict=True):
        torch.testing.assert_close(new, old + agent.cfg.critic_tau * (online.detach() - old))
    assert all(p.requires_grad for p in agent.critic.parameters())
    grads = [p.grad.clone() for p in agent.critic.parameters()]  # the critic loss's own
    agent.update_actor_and_alpha(batch.observations)
    for p, g in zip(agent.critic.parameters(), grads, strict=True):
        assert p.requires_grad and torch.equal(p.grad, g)
