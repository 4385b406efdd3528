"""A2C (``agent=a2c``, DRLHP's Atari agent): its n-step targets and losses against hand-computed
numbers, the choice of agent, DRLHP's 25-step segments cut across 5-step rollouts, the
checkpoint round-trip of a tiny run on 84 × 84 × 4 frames, and CartPole learned (slow)."""

from __future__ import annotations

import shutil

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch
from torch.distributions import Categorical

from tests.conftest import launch
from themis.agents import A2C, PPO, A2CConfig, PPOConfig, resolve_agent
from themis.agents.a2c import RMSpropTF
from themis.agents.ppo import Rollout
from themis.builder import make_workspace
from themis.run.checkpoint import load_checkpoint
from themis.run.closing import finish

GAMMA = 0.9


def toy_rollout(dones: list[float], next_value: float) -> Rollout:
    """A 3-step rollout of one env: rewards 1, 2, 3, values 0.5, 0.4, 0.3."""
    col = lambda xs: np.array(xs, np.float32).reshape(3, 1)  # noqa: E731
    obs = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32).reshape(3, 1, 2)
    return Rollout(obs, np.array([[0], [1], [1]]), col([0, 0, 0]), col([0.5, 0.4, 0.3]),
                   col([1, 2, 3]), col(dones), np.array([next_value], np.float32))


def agent() -> A2C:
    torch.manual_seed(0)
    return A2C((2,), 2, torch.device("cpu"), A2CConfig(gamma=GAMMA, anneal_lr=False))


@pytest.mark.parametrize(("dones", "returns"), [
    ([0, 0, 1], [1 + 0.9 * (2 + 0.9 * 3), 2 + 0.9 * 3, 3]),  # the episode ends at the last step
    ([0, 0, 0], [1 + 0.9 * (2 + 0.9 * (3 + 0.9 * 10)), 2 + 0.9 * (3 + 0.9 * 10),
                 3 + 0.9 * 10]),  # cut by the rollout: bootstrapped from V = 10
    ([1, 0, 0], [1, 2 + 0.9 * (3 + 0.9 * 10), 3 + 0.9 * 10]),  # a new episode from step 1
], ids=["terminal", "bootstrapped", "reset"])
def test_the_n_step_returns_and_advantages_of_a_3_step_episode(dones, returns):
    advantages, targets = agent().targets(toy_rollout(dones, next_value=10.0))
    np.testing.assert_allclose(targets[:, 0], returns, rtol=1e-6)
    np.testing.assert_allclose(advantages[:, 0], np.array(returns) - [0.5, 0.4, 0.3], rtol=1e-6)


def test_one_update_is_one_step_on_the_hand_computed_losses():
    a2c = agent()
    rollout = toy_rollout([0, 0, 1], next_value=0.0)
    returns = np.array([1 + 0.9 * (2 + 0.9 * 3), 2 + 0.9 * 3, 3], np.float32)
    advantages = returns - np.array([0.5, 0.4, 0.3], np.float32)
    with torch.no_grad():
        logits, values = a2c.net(torch.as_tensor(rollout.obs.reshape(3, 2)))
    dist = Categorical(logits=logits)
    logp = dist.log_prob(torch.tensor([0, 1, 1]))
    before = [p.detach().clone() for p in a2c.net.parameters()]
    metrics = a2c.update(rollout)
    assert metrics["policy_loss"] == pytest.approx(float(-(logp * torch.tensor(advantages))
                                                         .mean()), rel=1e-5)
    assert metrics["value_loss"] == pytest.approx(
        float(((torch.tensor(returns) - values) ** 2).mean()), rel=1e-5)
    assert metrics["entropy"] == pytest.approx(float(dist.entropy().mean()), rel=1e-5)
    assert a2c.num_updates == 1
    assert any(not torch.equal(b, p) for b, p in zip(before, a2c.net.parameters(), strict=True))
    assert isinstance(a2c.optimizer, RMSpropTF)


def test_the_learning_rate_decays_linearly_over_the_planned_updates():
    a2c = A2C((2,), 2, torch.device("cpu"), A2CConfig(learning_rate=1e-3), total_updates=4)
    for _ in range(3):
        a2c.update(toy_rollout([0, 0, 1], 0.0))
    assert a2c.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 2 / 4)


@pytest.mark.parametrize("agent, config", [(A2C, A2CConfig), (PPO, PPOConfig)])
def test_heads_are_linear_on_pixels_and_an_mlp_on_vectors(agent, config):
    # baselines' cnn / CleanRL's ppo_atari.py on pixels, their 64-64 tanh MLP on vectors
    pixels = agent((4, 84, 84), 6, torch.device("cpu"), config())
    vectors = agent((4,), 2, torch.device("cpu"), config())
    assert len(pixels.net.actor) == 1 and len(vectors.net.actor) == 5  # 2 × (Linear, Tanh) + 1
    assert (pixels.cfg.hidden_depth, vectors.cfg.hidden_depth) == (0, 2)  # resolved, as SB3 reads
    deep = agent((4, 84, 84), 6, torch.device("cpu"), config(hidden_depth=1))
    assert len(deep.net.actor) == 3  # a depth given wins


def test_agent_a2c_needs_discrete_actions():
    assert resolve_agent("a2c", gym.spaces.Discrete(3))[0] == "a2c"
    assert resolve_agent("auto", gym.spaces.Discrete(3))[0] == "ppo"  # PPO stays the default
    with pytest.raises(ValueError, match="agent=a2c cannot act"):
        resolve_agent("a2c", gym.spaces.Box(-1, 1, (2,)))


# ---------------------------------------------------------------- in the on-policy loop
TINY_A2C = [
    "domain=MovingDot", "agent=a2c", "a2c.num_envs=2", "+recipe=drlhp",
    "reward_net=drlhp", "+env_kwargs.max_episode_steps=120", "num_train_steps=640",
    "num_seed_steps=160", "num_unsup_steps=0", "num_interact=160", "max_feedback=24",
    "first_round_queries=8", "segment=25", "reward_pretrain_epochs=1",
    "reward_passes_per_step=0.02", "reward_train_batch=4", "query_decay_steps=256",
    "eval_frequency=640", "num_eval_episodes=1", "log_frequency=640", "precision=fp32",
    "checkpoint_frequency=100", "reward_label_buffer=50",
]
"""A tiny PrefA2C run on MovingDot's 84 × 84 × 4 frames with DRLHP's recipe and CNN: 5-step
rollouts of 2 envs, 25-step segments (the Pong run's shapes, smaller)."""


def test_25_step_segments_are_cut_from_5_step_rollouts(compose, tmp_path):
    ws = make_workspace(compose(TINY_A2C), tmp_path)
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["total_feedback"].iloc[0] == 8 and rounds["total_feedback"].iloc[-1] > 8
    store = ws.buffer
    starts = store.segment_starts(25)
    assert len(starts) > 0
    for start in starts[:50]:  # each segment lies in one episode, its steps in order
        slots = (start + np.arange(25)) % store.capacity
        assert len(set(store.episode[slots])) == 1
        assert (np.diff(store.t[slots]) == 1).all()
    assert isinstance(ws.agent, A2C)


def _equal(a: object, b: object) -> bool:
    """Nested dicts/lists of tensors, arrays and numbers, equal bit for bit."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return bool(a == b)


def test_a_checkpoint_of_a_pixel_a2c_run_round_trips_and_resumes_the_same_twice(compose,
                                                                               tmp_path):
    """The checkpoint holds everything (agent, RMSprop, episode store, labels, reward model
    and its optimiser, generators): loaded into a fresh workspace it gives the same state
    back, and two resumes from one checkpoint write the same rows and the same model."""
    first = tmp_path / "first"
    done = launch("themis_train.sh", *TINY_A2C, "num_train_steps=400", f"hydra.run.dir={first}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    state, _ = load_checkpoint(first / "checkpoints", "cpu")
    assert state["step"] == 400 and len(state["buffer"]) > 0

    shutil.copytree(first / "preferences", tmp_path / "fresh" / "preferences")  # the labels
    fresh = make_workspace(compose([*TINY_A2C, "num_train_steps=400"]), tmp_path / "fresh")
    fresh.load_state_dict(state)
    again = fresh.state_dict()
    # the run's own time goes on from the checkpoint's; everything else is the same
    assert again.pop("run_time")["cpu_s"] >= state.pop("run_time")["cpu_s"] > 0
    assert _equal(again, state)

    runs = []
    for name in ("a", "b"):
        run = tmp_path / name
        shutil.copytree(first, run)
        resumed = launch("themis_train.sh", f"resume={run}", "num_train_steps=640")
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        assert "resumed from" in resumed.stdout
        runs.append(run)
    a, b = runs
    wall = ["duration", "fps", "round_seconds"]  # wall-clock columns differ, nothing else
    for name in ("train.csv", "eval.csv", "reward.csv"):
        rows_a, rows_b = (pd.read_csv(run / name) for run in (a, b))
        pd.testing.assert_frame_equal(rows_a.drop(columns=wall, errors="ignore"),
                                      rows_b.drop(columns=wall, errors="ignore"))
    assert pd.read_csv(a / "train.csv")["step"].max() > 400
    model_a, _ = load_checkpoint(a / "checkpoints", "cpu")
    model_b, _ = load_checkpoint(b / "checkpoints", "cpu")
    for model in (model_a, model_b):  # the run's own time differs, as the wall-clock columns
        assert model.pop("run_time")["wall_s"] > 0
    assert model_a["step"] >= 640 and _equal(model_a, model_b)


@pytest.mark.slow
def test_a2c_learns_cartpole(tmp_path):
    run = tmp_path / "run"
    done = launch("themis_train.sh", "domain=Classic", "env=CartPole-v1", "agent=a2c",
                  "a2c.num_envs=8", "a2c.ent_coef=0.0",  # rl-zoo's CartPole settings
                  "learn_reward=false", "num_unsup_steps=0", "num_seed_steps=0",
                  "num_train_steps=100000", "eval_frequency=20000", "num_eval_episodes=5",
                  f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    evals = pd.read_csv(run / "eval.csv")
    assert evals["episode_reward"].max() >= 100  # random play: about 22


@pytest.mark.slow
def test_a_compiled_reward_model_keeps_its_state_dict_and_its_outputs(compose):
    """``reward_compile=true``: the CNN encoders are compiled in place; the state dict (what
    checkpoints and published versions hold) keeps its keys, and r̂ is the eager model's."""
    from themis.reward.ensemble import reward_model_from

    cfg = compose(["domain=MovingDot", "+recipe=drlhp", "reward_compile=true"])
    torch.manual_seed(0)
    compiled = reward_model_from(cfg, 4 * 84 * 84, 5, (4, 84, 84))
    eager = reward_model_from(compose(["domain=MovingDot", "+recipe=drlhp"]), 4 * 84 * 84, 5,
                              (4, 84, 84))
    eager.load_state_dict(compiled.state_dict())
    assert list(compiled.state_dict()) == list(eager.state_dict())
    obs = torch.randint(0, 255, (6, 4 * 84 * 84), dtype=torch.uint8)
    act = torch.eye(5)[torch.randint(0, 5, (6,))]
    compiled.eval()
    eager.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(obs, act), eager(obs, act), rtol=1e-4, atol=1e-5)


def test_rmsprop_as_tensorflow_starts_from_one_with_epsilon_inside_the_root():
    """Baselines' A2C optimiser: ms₀ = 1, θ ← θ − lr g / sqrt(ms + ε)."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = RMSpropTF([p], lr=0.1, alpha=0.9, eps=0.01)
    p.grad = torch.tensor([2.0, 0.5])
    opt.step()
    ms = 0.9 * 1.0 + 0.1 * torch.tensor([4.0, 0.25])
    torch.testing.assert_close(p.detach(), torch.tensor([1.0, -2.0]) - 0.1 * torch.tensor(
        [2.0, 0.5]) / (ms + 0.01).sqrt())


def test_the_pixel_actor_critic_starts_orthogonal_so_its_features_see_the_frames():
    """CleanRL's and baselines' Atari initialisation (gain √2): the features of different
    frames differ (PyTorch's default left them 35× flatter, issue 83)."""
    from themis.agents.ppo import ActorCritic

    torch.manual_seed(0)
    net = ActorCritic((4, 84, 84), 6, A2CConfig(hidden_depth=0))
    conv = net.encoder.convs[0]
    w = conv.weight.detach().reshape(conv.weight.shape[0], -1)
    torch.testing.assert_close(w @ w.T, 2 * torch.eye(w.shape[0]), atol=1e-4, rtol=1e-4)
    assert torch.count_nonzero(conv.bias) == 0
    frames = torch.randint(0, 255, (32, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        assert net.encoder(frames).std(0).mean() > 0.01
