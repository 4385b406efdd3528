"""DRLHP's reward-training schedule in label-passes and its networks (Christiano et al. 2017,
App. A.2; mrahtz/learning-from-human-preferences): the schedule's counts, the pretraining epochs,
out-of-bag validation per member, the paper's network's shapes and parameter count, mrahtz's
MovingDot features, and a tiny MovingDot run with ``+recipe=drlhp`` end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from themis.agents.buffers import SegmentPairs
from themis.builder import make_workspace
from themis.core.safe_loading import safe_load
from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer
from themis.reward.networks import DRLHPCNN, FastDropout, MovingDotFeatures, dropout_mask
from themis.reward.recipe import AdaptiveL2, BootstrapCounts
from themis.reward.schedule import LabelPassSchedule
from themis.run.closing import finish


def pairs(n: int, rng: np.random.Generator) -> PreferenceDataset:
    """``n`` pairs of 4-step segments of 3-D observations labelled by the first feature."""
    data = PreferenceDataset(n, 4, 3, 1)
    obs = rng.normal(size=(n, 2, 4, 3)).astype(np.float32)
    labels = (obs[:, 1, :, 0].sum(-1) > obs[:, 0, :, 0].sum(-1)).astype(np.float32)
    data.add(SegmentPairs(obs, np.zeros((n, 2, 4, 1), np.float32), obs[..., 0],
                          np.zeros((n, 2), np.int64)), labels)
    return data


# ---------------------------------------------------------------- the schedule's counts
def test_label_passes_turn_agent_steps_into_minibatches_and_carry_the_rest():
    schedule = LabelPassSchedule(pretrain_epochs=200, passes_per_step=0.1, buffer_labels=3000,
                                 batch_size=32)
    assert schedule.due(319) == 0  # 31.9 label-passes owed: not one minibatch yet
    assert schedule.due(1) == 1 and schedule.credit == pytest.approx(0.0)
    assert schedule.due(2048) == 6 and schedule.credit == pytest.approx(12.8)  # 204.8 = 6×32 + 12.8
    assert schedule.label_passes == 7 * 32
    restored = LabelPassSchedule()
    restored.load_state_dict(schedule.state_dict())
    assert (restored.credit, restored.label_passes) == (schedule.credit, 224)


def test_the_buffer_holds_the_newest_labels():
    assert list(LabelPassSchedule(buffer_labels=3).rows(10)) == [7, 8, 9]
    assert list(LabelPassSchedule(buffer_labels=3).rows(2)) == [0, 1]
    assert len(LabelPassSchedule(buffer_labels=0).rows(5000)) == 5000  # 0: all
    with pytest.raises(ValueError):
        LabelPassSchedule(passes_per_step=-1)


def test_train_passes_takes_the_steps_owed_and_each_member_never_trains_on_its_out_of_bag():
    rng = np.random.default_rng(0)
    data = pairs(200, rng)
    boot = BootstrapCounts(3, seed=1)
    trainer = RewardTrainer(RewardEnsemble(3, 1, 3, 16, 1), batch_size=8, rng=rng,
                            bootstrap=boot)
    seen: list[np.ndarray] = []
    step = trainer.minibatch_step

    def spy(obs, act, labels, picked, batch, sums, *rest):
        seen.append(picked[batch].cpu().numpy())  # (E, b) dataset rows
        return step(obs, act, labels, picked, batch, sums, *rest)

    trainer.minibatch_step = spy  # type: ignore[method-assign]
    rows = np.arange(50, 200)  # the newest 150
    fit = trainer.train_passes(data, 5, rows)
    assert fit.epochs == 5 and len(seen) == 5 and all(s.shape == (3, 8) for s in seen)
    counts = boot.counts(200)
    for e in range(3):
        trained = np.concatenate([s[e] for s in seen])
        assert (trained >= 50).all()  # inside the buffer
        assert (counts[e, trained] > 0).all()  # in member e's bootstrap sample
    assert not np.array_equal(seen[0][0], seen[0][1])  # members draw their own minibatches


def adaptations(monkeypatch) -> list[int]:
    """Count :meth:`AdaptiveL2.adapt` calls made in this process from now on."""
    calls: list[int] = []
    adapt = AdaptiveL2.adapt
    monkeypatch.setattr(AdaptiveL2, "adapt",
                        lambda self, t, v: (calls.append(1), adapt(self, t, v))[1])
    return calls


def test_the_adaptive_l2_adapts_every_50_steps_of_the_run_however_the_calls_split_them(
        monkeypatch):
    """The loops train a few minibatches per call (a rollout's or 1000 agent steps' worth):
    the adaptation count is over the run's steps, not each call's (issue 84)."""
    calls = adaptations(monkeypatch)
    for split in ((1, 120), (120, 1), (8, 15)):
        rng = np.random.default_rng(0)
        data = pairs(60, rng)
        l2 = AdaptiveL2(2, 1e-4, adaptive=True)
        trainer = RewardTrainer(RewardEnsemble(3, 1, 2, 16, 1), batch_size=8, rng=rng,
                                bootstrap=BootstrapCounts(2, seed=1), l2=l2)
        before = len(calls)
        for _ in range(split[0]):
            trainer.train_passes(data, split[1], np.arange(60))
        assert (len(calls) - before, l2.pass_steps) == (2, 120), split
        restored = AdaptiveL2(2, adaptive=True)
        restored.load_state_dict(l2.state_dict())  # a resumed run goes on counting
        assert restored.pass_steps == 120


def test_out_of_bag_validation_reports_each_members_loss():
    rng = np.random.default_rng(0)
    data = pairs(120, rng)
    trainer = RewardTrainer(RewardEnsemble(3, 1, 2, 16, 1), batch_size=16, rng=rng,
                            bootstrap=BootstrapCounts(2, seed=0),
                            l2=AdaptiveL2(2, 1e-4, adaptive=True))
    trainer.train(data, max_epochs=3)
    stats = trainer.validation_stats
    out_bag = (BootstrapCounts(2, seed=0).counts(120) == 0).sum(1)
    assert stats["val_labels"] == pytest.approx(out_bag.mean())  # each member's 1/e share
    assert 0.2 * 120 < stats["val_labels"] < 0.55 * 120
    assert np.isfinite([stats["val_loss_m0"], stats["val_loss_m1"]]).all()
    assert stats["val_loss"] == pytest.approx((stats["val_loss_m0"] + stats["val_loss_m1"]) / 2)
    assert not np.allclose(trainer.l2.coef, 1e-4)  # adapted on the out-of-bag losses


# ---------------------------------------------------------------- the networks
def test_the_papers_reward_network_has_its_layers_and_about_65k_parameters_per_member():
    cnn = DRLHPCNN((4, 84, 84))
    assert cnn.feature_dim == 16 * 7 * 7  # 84 -> 26 -> 11 -> 9 -> 7
    convs = [m for m in cnn.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.kernel_size, c.stride, c.out_channels) for c in convs] == [
        ((7, 7), (3, 3), 16), ((5, 5), (2, 2), 16), ((3, 3), (1, 1), 16), ((3, 3), (1, 1), 16)]
    model = RewardEnsemble(4 * 84 * 84, 6, 3, obs_shape=(4, 84, 84), net="drlhp")
    per_member = sum(p.numel() for p in model.parameters()) // 3
    assert per_member == 14_208 + 784 * 64 + 64 + 64 + 1  # convs, FC 64, scalar
    out = model(torch.zeros(5, 4 * 84 * 84, dtype=torch.uint8), torch.zeros(5, 6))
    assert out.shape == (3, 5)


def test_dropout_and_batch_norm_sit_on_the_convolutions_only():
    model = RewardEnsemble(4 * 84 * 84, 6, 2, obs_shape=(4, 84, 84), net="drlhp",
                           dropout=0.5, batchnorm=True)
    head = list(model.net.modules())
    assert not any(isinstance(m, torch.nn.Dropout) for m in head)
    assert not any("BatchNorm" in type(m).__name__ for m in head)
    trunk = list(model.encoders[0].modules())
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in trunk) == 4
    assert sum(isinstance(m, FastDropout) for m in trunk) == 3  # after convs 1-3
    with pytest.raises(ValueError, match="pixel"):
        RewardEnsemble(3, 1, net="drlhp")


def test_the_moving_dot_features_find_the_dot_in_the_last_frame():
    frames = torch.zeros(2, 4, 84, 84, dtype=torch.uint8)
    frames[0, -1, 10:12, 40:42] = 255  # rows 10-11, columns 40-41
    frames[0, 0, 70, 70] = 255  # an older frame: ignored
    frames[1, -1, 83, 0] = 255
    xy = MovingDotFeatures((4, 84, 84))(frames)
    assert torch.allclose(xy, torch.tensor([[40 / 83, 10 / 83], [0.0, 1.0]]))
    model = RewardEnsemble(4 * 84 * 84, 5, 3, obs_shape=(4, 84, 84), net="drlhp_dot")
    assert sum(p.numel() for p in model.parameters()) == 3 * (3 * 64 + 64 + 2 * (64 * 64 + 64)
                                                              + 64 + 1)


def test_the_one_hot_dot_network_tells_every_action_apart_with_five_inputs():
    """drlhp_dot_onehot: the dot's (x, y) and the one-hot action (5) into the 64-64-64-1 MLP;
    the reward of the dot's position then depends on which action, not on its index's size."""
    torch.manual_seed(0)
    model = RewardEnsemble(4 * 84 * 84, 5, 2, obs_shape=(4, 84, 84), net="drlhp_dot_onehot")
    assert model.fixed_encoder and model.uses_action
    assert sum(p.numel() for p in model.parameters()) == 2 * (7 * 64 + 64 + 2 * (64 * 64 + 64)
                                                              + 64 + 1)
    frames = torch.zeros(5, 4 * 84 * 84, dtype=torch.uint8)
    frames.view(5, 4, 84, 84)[:, -1, 40, 40] = 255
    with torch.no_grad():
        rewards = model(frames, torch.eye(5))  # (E, 5): the same position, five actions
    assert rewards.shape == (2, 5)
    assert torch.unique(rewards[0]).numel() == 5  # every action its own reward
    encoded = model.encode(frames)  # (5, 2): the position, computed once
    with torch.no_grad():
        assert torch.allclose(model(encoded, torch.eye(5), encoded=True), rewards)


def test_a_shared_trunk_runs_shared_observations_through_one_cnn():
    torch.manual_seed(0)
    model = RewardEnsemble(4 * 48 * 48, 3, 3, obs_shape=(4, 48, 48), net="drlhp",
                           shared_trunk=True).eval()
    assert len(model.encoders) == 1
    obs = torch.randint(0, 255, (6, 4 * 48 * 48), dtype=torch.uint8)
    shared = model(obs, torch.zeros(6, 3))
    per_member = model(obs.expand(3, 6, -1), torch.zeros(3, 6, 3))
    assert torch.allclose(shared, per_member, atol=1e-5)
    assert not torch.allclose(shared[0], shared[1])  # heads differ


# ---------------------------------------------------------------- end to end
TINY_RECIPE = [
    "domain=MovingDot", "+recipe=drlhp", "reward_net=drlhp_dot",
    "+env_kwargs.max_episode_steps=80", "num_train_steps=768", "num_seed_steps=128",
    "num_unsup_steps=0", "num_interact=128", "max_feedback=30", "first_round_queries=12",
    "segment=8", "reward_pretrain_epochs=4", "reward_passes_per_step=0.25",
    "reward_train_batch=8", "query_decay_steps=256", "eval_frequency=768",
    "num_eval_episodes=1", "log_frequency=768", "ppo.num_envs=2", "ppo.num_steps=32",
    "ppo.update_epochs=1", "precision=fp32", "checkpoint_frequency=100000",
]


def test_a_tiny_moving_dot_run_with_the_drlhp_recipe_pretrains_then_trains_in_passes(
        compose, tmp_path):
    ws = make_workspace(compose(TINY_RECIPE), tmp_path)
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["total_feedback"].iloc[0] == 12  # the first round: first_round_queries
    assert rounds["epochs"].iloc[0] == 4 and (rounds["epochs"].iloc[1:] == 0).all()
    # 0.25 label-passes per step after pretraining: 8-pair minibatches every 32 steps
    after = ws.step - int(rounds["step"].iloc[0])
    assert rounds["label_passes"].iloc[-1] > 0
    assert ws.learner.passes.label_passes == pytest.approx(after * 0.25, abs=8)
    assert {"val_loss_m0", "val_loss_m1", "val_loss_m2"} <= set(rounds)
    assert ws.learner.normaliser is not None


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["ppo", "sac"])
def test_the_adaptive_l2_adapts_after_pretraining_in_both_loops(compose, tmp_path, monkeypatch,
                                                                loop):
    """PPO trains the passes owed after every rollout (64 steps: 32 minibatches), SAC every
    1000 steps (45): neither call reaches 50 minibatches, the run does (issue 84)."""
    overrides = [*TINY_RECIPE, "reward_passes_per_step=4"] if loop == "ppo" else [
        "domain=Classic", "env=Pendulum-v1", "num_train_steps=4000", "num_seed_steps=200",
        "num_unsup_steps=200", "num_interact=400", "max_feedback=40", "reward_batch=10",
        "segment=20", "eval_frequency=4000", "num_eval_episodes=1", "log_frequency=4000",
        "sac.hidden_dim=32", "sac.batch_size=32", "reward_hidden_dim=32",
        "entropy_pool_size=256", "reset_update=5", "reward_schedule=passes",
        "reward_pretrain_epochs=4", "reward_passes_per_step=0.36", "reward_train_batch=8",
        "reward_bootstrap=true", "reward_adaptive_l2=true", "reward_l2=1e-5",
        "precision=fp32", "checkpoint_frequency=100000"]
    calls = adaptations(monkeypatch)
    ws = make_workspace(compose(overrides), tmp_path)
    ws.run()
    finish(ws)
    l2 = ws.learner.trainer.l2
    assert l2.pass_steps >= 100  # two or more adaptations are owed after pretraining
    assert len(calls) == 4 + l2.pass_steps // 50  # the pretraining epochs, then every 50
    written = pd.read_csv(tmp_path / "reward.csv")["reward_l2"]
    assert (written > 0).all()  # six significant digits, not six decimals


def test_fast_dropout_zeroes_p_of_the_elements_scales_the_rest_and_passes_gradients_through():
    torch.manual_seed(0)
    drop = FastDropout(0.5)
    x = torch.ones(200_000, requires_grad=True)
    y = drop(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.5) < 0.01
    assert torch.all(y[kept] == 2.0)  # inverted dropout: 1 / (1 − p)
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # the gradient is the same mask × scale
    assert abs(dropout_mask((100_000,), 0.1).float().mean().item() - 0.9) < 0.01
    torch.manual_seed(1)
    first = dropout_mask((64,), 0.5)
    torch.manual_seed(1)
    assert torch.equal(first, dropout_mask((64,), 0.5))  # the run's seed decides the masks
    assert torch.equal(drop.eval()(x), x)  # identity in eval mode


def test_a_fixed_encoder_trains_on_features_encoded_once_with_the_same_result():
    """drlhp_dot's encoder has no parameters: the trainer encodes each labelled frame once and
    gets the same losses and gradient steps as from the frame stacks."""
    rng = np.random.default_rng(0)
    n, horizon, shape = 24, 5, (4, 44, 44)
    data = PreferenceDataset(n, horizon, int(np.prod(shape)), 5, obs_dtype=np.uint8)
    obs = np.zeros((n, 2, horizon, *shape), np.uint8)
    where = rng.integers(0, 44, (n, 2, horizon, 2))
    for i, j, t in np.ndindex(n, 2, horizon):
        obs[i, j, t, -1, where[i, j, t, 0], where[i, j, t, 1]] = 255
    true = -np.abs(where[..., 0] - 22).astype(np.float32)  # closer to the middle row: better
    data.add(SegmentPairs(obs.reshape(n, 2, horizon, -1),
                          np.eye(5, dtype=np.float32)[rng.integers(0, 5, (n, 2, horizon))],
                          true, np.zeros((n, 2), np.int64)),
             (true[:, 1].sum(-1) > true[:, 0].sum(-1)).astype(np.float32))
    results = []
    for encoded in (True, False):
        torch.manual_seed(0)
        model = RewardEnsemble(int(np.prod(shape)), 5, 2, obs_shape=shape, net="drlhp_dot")
        trainer = RewardTrainer(model, batch_size=8, rng=np.random.default_rng(1))
        if not encoded:  # the frame-stack path, as for a learned encoder
            trainer.inputs = lambda d: (*d.tensors("cpu"), False)  # type: ignore
        fit = trainer.train(data, max_epochs=3, target_accuracy=2.0)
        losses = trainer.pair_losses(data, np.arange(n))
        results.append((fit.loss, losses))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    assert np.allclose(results[0][1], results[1][1], atol=1e-5)
    assert trainer._encoded is None  # the frame-stack path kept no features


@pytest.mark.slow
@pytest.mark.parametrize("agent", [[], ["agent=a2c", "a2c.num_envs=2"]], ids=["ppo", "a2c"])
def test_the_label_pass_schedule_trains_continuously_in_the_async_learner_process(
        compose, tmp_path, agent):
    """reward_training=async: the learner process pretrains on the first round's labels, then
    trains the label-passes owed for the steps it receives and publishes new versions between
    the rounds (DRLHP's background training), under PPO's loop and under A2C's (5-step
    rollouts, DRLHP's own agent)."""
    # reward_max_lag: the agent waits for the passes it is owed, so that they are trained
    # however busy the machine is
    ws = make_workspace(compose([*TINY_RECIPE, "reward_training=async", "num_interact=512",
                                 "num_train_steps=1536", "reward_passes_per_step=1",
                                 "reward_max_lag=128", *agent]), tmp_path)
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["epochs"].iloc[0] == 4 and rounds["label_passes"].iloc[-1] > 0
    assert ws.learner.version > len(rounds)  # published between the rounds too (every 128)
    # the adaptive L2 goes on adapting in the learner process: a validation every 50
    # minibatches of the passes (8 per 64 steps received), counted over the run (issue 84:
    # the count restarted with each call of 1-8 minibatches, so only the pretraining epochs
    # moved it). Whether a validation moves a coefficient depends on the losses (inside the
    # band it stays), so the count is what is asserted: about 190 minibatches, 3 validations
    l2 = safe_load(tmp_path / "checkpoints" / "learner" / "state.pt")["reward_l2"]
    assert l2["pass_steps"] >= 150
