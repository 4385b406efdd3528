"""DRLHP's recipe (Christiano et al. 2017, Sec. 2.2 and App. A) and MovingDot: the random-response
loss against a hand computation, the adaptive L2 on over- and under-fitting, bootstrap samples
per member, the decaying query schedule's counts, MovingDot's dynamics and reward, and a tiny
end-to-end pixel run per new key."""

from __future__ import annotations

import itertools
import math

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch

import themis.environments  # noqa: F401  (registers MovingDot)
from tests.conftest import TINY_PENDULUM
from themis.agents.buffers import SegmentPairs
from themis.builder import make_workspace
from themis.environments.domains import episode_limit, frame_stack_size, make_env
from themis.environments.moving_dot import MovingDotEnv
from themis.feedback.selector import DecayingSchedule
from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer, bradley_terry_loss
from themis.reward.recipe import (
    AdaptiveL2,
    BootstrapCounts,
    RewardNormaliser,
    ValidationSplit,
    member_weight_norms,
)
from themis.run.closing import finish
from themis.run.validation import validate
from themis.utils import ConfigError


# ---------------------------------------------------------------- random response
def test_random_response_loss_matches_a_hand_computation():
    r1 = torch.tensor([0.0, 0.0, 0.0])
    r2 = torch.tensor([2.0, -1.0, -50.0])
    y = torch.tensor([1.0, 0.5, 1.0])

    def by_hand(d: float, label: float, eps: float) -> float:
        p = (1 - eps) / (1 + math.exp(-d)) + eps / 2  # P[segment 2 preferred]
        return -(label * math.log(p) + (1 - label) * math.log(1 - p))

    want = np.mean([by_hand(2.0, 1.0, 0.1), by_hand(-1.0, 0.5, 0.1), by_hand(-50.0, 1.0, 0.1)])
    got = bradley_terry_loss(r1, r2, y, random_response=0.1)
    assert got.item() == pytest.approx(want, rel=1e-5)
    # a confident wrong answer costs at most -log(0.05) instead of growing with the margin
    worst = bradley_terry_loss(r1[2:], r2[2:], y[2:], random_response=0.1).item()
    assert worst == pytest.approx(-math.log(0.9 / (1 + math.exp(50)) + 0.05), rel=1e-5)
    assert worst < 3.0 < bradley_terry_loss(r1[2:], r2[2:], y[2:]).item()
    # ε = 0 is the plain Bradley–Terry cross-entropy
    plain = np.mean([by_hand(2.0, 1.0, 0.0), by_hand(-1.0, 0.5, 0.0), 50.0])
    assert bradley_terry_loss(r1, r2, y).item() == pytest.approx(plain, rel=1e-5)


# ---------------------------------------------------------------- adaptive L2
def test_adaptive_l2_moves_each_coefficient_by_its_own_validation_gap():
    l2 = AdaptiveL2(4, initial=1e-3, adaptive=True)
    # val / train = 2 (over-fitting), 1.0 (under-fitting), 1.3 (inside the band), NaN
    l2.adapt(np.array([0.2, 0.5, 0.5, np.nan]), np.array([0.4, 0.5, 0.65, 0.3]))
    assert l2.coef[0] > 1e-3 and l2.coef[1] < 1e-3
    assert l2.coef[2] == 1e-3 and l2.coef[3] == 1e-3
    zero = AdaptiveL2(1, initial=0.0, adaptive=True)
    zero.adapt(np.array([0.1]), np.array([1.0]))
    assert zero.coef[0] > 0  # growing starts from the floor
    fixed = AdaptiveL2(1, initial=1e-3)
    fixed.adapt(np.array([0.1]), np.array([1.0]))
    assert fixed.coef[0] == 1e-3


def pairs_dataset(n: int, rng: np.random.Generator, noise_labels: bool) -> PreferenceDataset:
    """``n`` pairs of 4-step segments of 3-D observations; labels from the true returns (sum of
    the first feature) or, with ``noise_labels``, coin flips (only memorisation fits them)."""
    data = PreferenceDataset(n, 4, 3, 1)
    obs = rng.normal(size=(n, 2, 4, 3)).astype(np.float32)
    true = obs[..., 0]
    labels = rng.integers(0, 2, n).astype(np.float32) if noise_labels else \
        (true[:, 1].sum(-1) > true[:, 0].sum(-1)).astype(np.float32)
    data.add(SegmentPairs(obs, np.zeros((n, 2, 4, 1), np.float32), true,
                          np.zeros((n, 2), np.int64)), labels)
    return data


def test_adaptive_l2_grows_on_an_overfitting_model_and_shrinks_on_an_underfitting_one():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    # over-fitting: a wide model memorises 40 coin-flip labels; the held-out ones stay at chance
    over = RewardEnsemble(3, 1, ensemble_size=2, hidden_dim=128, hidden_depth=2)
    l2 = AdaptiveL2(2, initial=1e-5, adaptive=True)
    trainer = RewardTrainer(over, lr=3e-3, batch_size=16, rng=rng, l2=l2,
                            validation=ValidationSplit(0.3, seed=0), target_accuracy=1.1)
    trainer.train(pairs_dataset(60, rng, noise_labels=True), max_epochs=40)
    assert (l2.coef > 1e-5).all(), l2.coef
    assert trainer.validation_stats["val_loss"] > 0.6
    # under-fitting: a coefficient so large the weights stay near 0, train and val loss alike
    under = RewardEnsemble(3, 1, ensemble_size=2, hidden_dim=16, hidden_depth=1)
    l2 = AdaptiveL2(2, initial=10.0, adaptive=True)
    trainer = RewardTrainer(under, lr=3e-3, batch_size=16, rng=rng, l2=l2,
                            validation=ValidationSplit(0.3, seed=0), target_accuracy=1.1)
    trainer.train(pairs_dataset(60, rng, noise_labels=False), max_epochs=5)
    assert (l2.coef < 10.0).all(), l2.coef


def test_the_l2_penalty_counts_each_members_own_weights():
    model = RewardEnsemble(3, 1, ensemble_size=2, hidden_dim=4, hidden_depth=1,
                           obs_shape=(3,))
    with torch.no_grad():
        for layer in model.net.net:
            if hasattr(layer, "weight"):
                layer.weight.zero_()
                layer.weight[1] = 1.0  # member 1 only
    norms = member_weight_norms(model, 2)
    assert norms[0].item() == 0.0
    assert norms[1].item() == 4 * 4 + 4 * 1  # (3 + 1) × 4 hidden weights, 4 × 1 output ones


def test_the_trainer_never_trains_on_held_out_labels():
    rng = np.random.default_rng(0)
    data = pairs_dataset(50, rng, noise_labels=False)
    split = ValidationSplit(0.368, seed=3)
    held = split.held_out(50)
    assert 8 < held.sum() < 30
    assert (split.held_out(80)[:50] == held).all()  # the same rows as the dataset grows
    trainer = RewardTrainer(RewardEnsemble(3, 1, 2, 8, 1), rng=rng, validation=split)
    seen: list[np.ndarray] = []
    epoch = trainer.train_epoch
    trainer.train_epoch = lambda d, rows=None, budget=None: (  # type: ignore[method-assign]
        seen.append(rows), epoch(d, rows, budget))[1]
    trainer.train(data, max_epochs=2)
    assert seen and all(not held[rows].any() for rows in seen)
    assert trainer.validation_stats["val_labels"] == held.sum()
    assert 0 <= trainer.validation_stats["val_accuracy"] <= 1


# ---------------------------------------------------------------- bootstrap
def test_bootstrap_samples_differ_per_member_and_stay_fixed_per_row():
    boot = BootstrapCounts(3, seed=0)
    counts = boot.counts(500)
    assert counts.shape == (3, 500)
    assert not (counts[0] == counts[1]).all() and not (counts[1] == counts[2]).all()
    out_of_bag = (counts == 0).mean(1)
    assert np.allclose(out_of_bag, 1 / math.e, atol=0.06)  # about 1/e of labels left out
    assert (boot.counts(2000)[:, :500] == counts).all()
    assert (BootstrapCounts(3, seed=0).counts(500) == counts).all()
    orders = boot.orders(np.arange(500), np.random.default_rng(1))
    assert orders.shape == (3, 500)
    for e in range(3):  # a member visits its own sample: never a row it left out
        assert not np.isin(orders[e], np.flatnonzero(counts[e] == 0)).any()
    assert not (np.sort(orders[0]) == np.sort(orders[1])).all()


# ---------------------------------------------------------------- query schedule
def test_the_decaying_schedule_spends_the_budget_at_a_rate_proportional_to_t0_over_t_plus_t0():
    schedule = DecayingSchedule(decay_steps=1000, every=500, last=4999)
    plan = schedule.plan(first=1000, budget=100)
    # rounds at 1000, 1500, ..., 4500: w = 1000 / (T + 1000)
    w = 1000 / (np.arange(1000, 5000, 500) + 1000)
    assert len(plan) == 8 and sum(plan) == 100
    assert plan[0] == round(100 * w[0] / w.sum())
    assert plan[0] == 21  # by hand: 100 × 0.5 / (0.5 + 0.4 + 0.333 + ... + 0.182 = 2.373)
    assert all(a >= b for a, b in itertools.pairwise(plan))
    assert plan[0] / plan[-1] == pytest.approx(w[0] / w[-1], rel=0.25)
    assert schedule(4500, 7) == 7  # the last round asks what is left
    assert schedule(1000, 0) == 0


def test_a_run_with_the_decaying_schedule_asks_the_planned_counts(compose, tmp_path):
    cfg = compose([*TINY_PENDULUM, "query_schedule=decay", "query_decay_steps=300"])
    ws = make_workspace(cfg, tmp_path)
    ws.run()
    finish(ws)
    asked = np.diff(pd.read_csv(tmp_path / "reward.csv")["total_feedback"], prepend=0)
    # rounds at steps 400, 700, 1000 of 30 queries; w = 300/700, 300/1000, 300/1300
    assert asked.tolist() == [13, 10, 7]


# ---------------------------------------------------------------- MovingDot
def test_moving_dot_moves_one_pixel_per_frame_and_rewards_getting_closer_to_the_middle():
    env = gym.make("MovingDotNoFrameskip-v0", random_start=False)
    obs, info = env.reset(seed=0)
    assert obs.shape == (210, 160, 3) and obs.dtype == np.uint8
    dot = MovingDotEnv
    assert env.unwrapped.pos == (2, 2)  # top-left corner, the whole dot inside
    assert (obs[0:4, 0:4] == 255).all() and obs.sum() == 16 * 3 * 255
    steps = [(2, 1.0, (3, 2)), (1, 1.0, (3, 3)), (4, -1.0, (2, 3)), (4, 0.0, (2, 3)),
             (3, -1.0, (2, 2)), (0, 0.0, (2, 2))]  # right, down, left, left (wall), up, noop
    for action, reward, pos in steps:
        obs, r, terminated, truncated, info = env.step(action)
        assert (r, env.unwrapped.pos) == (reward, pos)
        assert not terminated and not truncated
        assert info["distance"] == pytest.approx(math.hypot(pos[0] - 80, pos[1] - 105))
    x, y = env.unwrapped.pos
    assert (obs[y - 2:y + 2, x - 2:x + 2] == 255).all() and obs.sum() == 16 * 3 * 255
    with pytest.raises(ValueError):
        env.step(5)
    # the far corner: the dot stays inside; 1000 frames per episode
    env.unwrapped.pos = (157, 207)
    env.step(2)
    assert env.unwrapped.pos == (157, 207)
    n = 7
    while not env.step(0)[3]:
        n += 1
    assert n + 1 == 1000
    assert dot.clip(-5, 999) == (2, 207)


def test_the_moving_dot_domain_gives_stacked_84_pixel_frames_and_four_frames_per_step():
    env = make_env("MovingDot", "MovingDotNoFrameskip-v0", seed=0, random_start=False)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert episode_limit(env) == 250 and frame_stack_size(env) == 4
    _, reward, *_ = env.step(2)  # right, four frames, each closer to the middle
    assert reward == 4.0 and env.unwrapped.pos == (6, 2)
    frame = env.step(1)[0][-1]  # down: the dot is a bright blob near the top-left
    ys, xs = np.nonzero(frame > 64)
    assert len(ys) and ys.max() < 6 and xs.max() < 6
    seen = np.nonzero(frame > 64)
    env.step(2)
    assert not np.array_equal(np.nonzero(env.step(2)[0][-1] > 64)[1], seen[1])  # it moved


def test_the_drlhp_preset_and_recipe_keys_are_checked(compose):
    cfg = compose(["domain=MovingDot", "+recipe=drlhp"])
    assert (cfg.segment, cfg.reward_val_fraction, cfg.reward_random_response) == (25, 0.0, 0.1)
    assert cfg.reward_adaptive_l2 and cfg.reward_bootstrap and cfg.query_schedule == "decay"
    # the paper's schedule, network and rates (App. A.2; mrahtz's params.py)
    assert (cfg.reward_net, cfg.reward_schedule, cfg.reward_pretrain_epochs,
            cfg.reward_passes_per_step, cfg.reward_label_buffer, cfg.first_round_queries,
            cfg.reward_train_batch, cfg.reward_lr) == ("drlhp", "passes", 200, 0.1, 3000, 500,
                                                       32, 2e-4)
    assert cfg.query_decay_steps == 5_000_000 // 4  # 5·10⁶ frames at frame skip 4
    assert cfg.num_unsup_steps == 0  # the first labels from the random policy, not after
    # PEBBLE's state-entropy pretraining (issue 84: an undocumented difference)
    validate(cfg)
    bad = [(["reward_adaptive_l2=true"], "reward_bootstrap"),
           (["reward_net=alexnet"], "reward_net=alexnet"),
           (["reward_schedule=sometimes"], "reward_schedule=sometimes"),
           (["reward_passes_per_step=-1"], "reward_passes_per_step"),
           (["query_schedule=hyperbolic"], "query_schedule"),
           (["reward_val_fraction=1"], "reward_val_fraction=1"),
           (["reward_random_response=-0.1"], "reward_random_response"),
           (["feedback=rating", "reward_bootstrap=true"], "pairwise")]
    for overrides, words in bad:
        with pytest.raises(ConfigError, match=words):
            validate(compose(overrides))


def test_the_normaliser_gives_each_member_zero_mean_and_the_chosen_std():
    rng = np.random.default_rng(0)
    members = np.stack([rng.normal(3, 2, 1000), rng.normal(-1, 0.1, 1000)])
    norm = RewardNormaliser(2, std=0.05)
    out = norm(members)
    assert np.allclose(out.mean(1), 0, atol=1e-3) and np.allclose(out.std(1), 0.05, rtol=1e-2)
    norm.fit(members[:, :500])  # frozen: later batches do not move it
    first = norm(members[:, 500:])
    assert np.array_equal(norm(members[:, 500:]), first)
    norm.reset()
    assert not norm.frozen


# ---------------------------------------------------------------- a tiny pixel run per key
TINY_DOT = [
    "domain=MovingDot", "+env_kwargs.max_episode_steps=80", "num_train_steps=512",
    "num_seed_steps=0", "num_unsup_steps=128", "num_interact=128", "max_feedback=18",
    "reward_batch=6", "segment=8", "reward_update=2", "eval_frequency=512",
    "num_eval_episodes=1", "log_frequency=512", "ppo.num_envs=2", "ppo.num_steps=32",
    "ppo.update_epochs=1", "ensemble_size=2", "reward_hidden_dim=16", "reward_hidden_depth=1",
    "precision=fp32", "checkpoint_frequency=100000",
]


def check_val(ws, rounds):
    assert rounds["val_labels"].iloc[-1] > 0 and np.isfinite(rounds["val_loss"].iloc[-1])


def check_random_response(ws, rounds):
    assert ws.learner.trainer.random_response == 0.1
    assert (rounds["train_loss"] < -math.log(0.05)).all()  # bounded per pair


def check_bootstrap(ws, rounds):
    assert ws.learner.trainer.bootstrap is not None and rounds["epochs"].iloc[-1] > 0


def check_dropout(ws, rounds):
    drops = [m for m in ws.learner.model.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and all(m.p == 0.5 for m in drops) and not ws.learner.model.training


def check_batchnorm(ws, rounds):
    norms = [m for m in ws.learner.model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(m.num_batches_tracked > 0 and m.running_mean.abs().sum() > 0
                         for m in norms)


def check_adaptive_l2(ws, rounds):
    assert "reward_l2" in rounds and not np.allclose(ws.learner.trainer.l2.coef, 1e-4)


def check_l2(ws, rounds):
    assert (rounds["reward_l2"] == 1e-3).all()


def check_norm(ws, rounds):
    norm = ws.learner.normaliser
    assert norm is not None and not norm.frozen and norm.stats.count > 1  # PPO: running
    store = ws.buffer
    idx = np.arange(min(len(store), 256))
    r = ws.learner.reward(store.observations(idx).reshape(len(idx), -1), store.actions[idx])
    assert 0.01 < r.std() < 0.2  # members at std 0.05, then averaged


def check_decay(ws, rounds):
    asked = np.diff(rounds["total_feedback"], prepend=0)
    assert asked.sum() == 18 and asked[0] > asked[-1]


def check_passes(ws, rounds):
    passes = ws.learner.passes
    assert passes is not None and passes.pretrained
    assert rounds["epochs"].iloc[0] == 3 and (rounds["epochs"].iloc[1:] == 0).all()
    assert passes.label_passes > 0 and rounds["label_passes"].iloc[-1] > 0


def check_drlhp_net(ws, rounds):
    convs = [m for m in ws.learner.model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.kernel_size[0] for c in convs] == [7, 5, 3, 3] * 2  # two members


def check_dot_net(ws, rounds):
    assert not [m for m in ws.learner.model.modules() if isinstance(m, torch.nn.Conv2d)]


def check_shared_trunk(ws, rounds):
    assert len(ws.learner.model.encoders) == 1


def check_oob(ws, rounds):
    assert {"val_loss_m0", "val_loss_m1"} <= set(rounds)
    assert np.isfinite(rounds["val_loss_m0"].iloc[-1]) and rounds["val_labels"].iloc[-1] > 0


KEYS = {
    "reward_schedule=passes": (["reward_pretrain_epochs=3", "reward_passes_per_step=0.5",
                                "reward_train_batch=4"], check_passes),
    "reward_net=drlhp": ([], check_drlhp_net),
    "reward_net=drlhp_dot": ([], check_dot_net),
    "reward_shared_trunk=true": ([], check_shared_trunk),
    "reward_bootstrap=true reward_adaptive_l2=true": ([], check_oob),
    "reward_val_fraction=0.368": ([], check_val),
    "reward_random_response=0.1": ([], check_random_response),
    "reward_bootstrap=true": ([], check_bootstrap),
    "reward_dropout=0.5": ([], check_dropout),
    "reward_batchnorm=true": ([], check_batchnorm),
    "reward_adaptive_l2=true": (["reward_val_fraction=0.368", "reward_l2=0.0001"],
                                check_adaptive_l2),
    "reward_l2=0.001": ([], check_l2),
    "reward_norm_std=0.05": ([], check_norm),
    "query_schedule=decay": (["query_decay_steps=200"], check_decay),
}


@pytest.mark.slow
@pytest.mark.parametrize("key", list(KEYS))
def test_a_tiny_moving_dot_run_trains_with_each_recipe_key(compose, tmp_path, key):
    extra, check = KEYS[key]
    ws = make_workspace(compose([*TINY_DOT, *key.split(), *extra]), tmp_path)
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert len(rounds) >= 3 and np.isfinite(pd.read_csv(tmp_path / "eval.csv")
                                            ["episode_reward"]).all()
    check(ws, rounds)
