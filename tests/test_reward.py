"""Reward ensemble and Bradley–Terry training."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from themis.agents.buffers import ReplayBuffer, SegmentPairs
from themis.feedback.teachers import SyntheticTeacher
from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer, bradley_terry_loss


def test_bradley_terry_loss_known_values():
    r1 = torch.tensor([0.0, 0.0, 5.0, 0.0])
    r2 = torch.tensor([0.0, 10.0, 0.0, 1.0])
    y = torch.tensor([1.0, 1.0, 1.0, 0.5])
    loss = bradley_terry_loss(r1[:, None], r2[:, None], y[:, None])
    expected = [
        math.log(2),  # indifferent model: -log 0.5
        -math.log(1 / (1 + math.exp(-10))),  # confident and right: ~0
        -math.log(1 / (1 + math.exp(5))),  # confident and wrong: ~5
        # soft label 0.5: cross-entropy of 0.5 against sigmoid(1)
        -(0.5 * math.log(1 / (1 + math.exp(-1))) + 0.5 * math.log(1 / (1 + math.exp(1)))),
    ]
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)


def test_segment_returns_sum_member_rewards():
    model = RewardEnsemble(obs_dim=3, action_dim=2, ensemble_size=4, hidden_dim=8)
    obs, act = torch.randn(5, 7, 3), torch.randn(5, 7, 2)
    returns = model.segment_returns(obs, act)
    assert returns.shape == (4, 5)
    per_step = model(obs.reshape(35, 3), act.reshape(35, 2)).reshape(4, 5, 7)
    torch.testing.assert_close(returns, per_step.sum(-1))
    # member-specific batches (E, n, H, d) give the same result when all members share data
    shared = model.segment_returns(obs.expand(4, 5, 7, 3), act.expand(4, 5, 7, 2))
    torch.testing.assert_close(shared, returns)
    mean = model.predict(obs.reshape(35, 3).numpy(), act.reshape(35, 2).numpy())
    np.testing.assert_allclose(mean, per_step.mean(0).reshape(-1).detach().numpy(), rtol=1e-5,
                               atol=1e-6)


def test_ensemble_size_must_be_positive():
    with pytest.raises(ValueError, match="ensemble_size"):
        RewardEnsemble(3, 2, ensemble_size=0)


def random_halfcheetah_pairs(n_pairs: int, seed: int) -> SegmentPairs:
    """Segments of random-policy HalfCheetah episodes, cut from a replay buffer."""
    env = gym.make("HalfCheetah-v5", max_episode_steps=200)
    buf = ReplayBuffer((17,), 6, capacity=8000, device=torch.device("cpu"))
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    episode = t = 0
    for _ in range(8000):
        action = env.action_space.sample()
        next_obs, reward, term, trunc, _ = env.step(action)
        buf.add(obs, action, reward, next_obs, term, episode, t)
        obs, t = next_obs, t + 1
        if term or trunc:
            obs, _ = env.reset()
            episode, t = episode + 1, 0
    return buf.sample_segment_pairs(n_pairs, segment=25, rng=rng)


def test_reward_model_learns_oracle_preferences_on_halfcheetah():
    """Held-out accuracy on oracle labels of random-policy segments rises above 0.8."""
    torch.manual_seed(0)
    pairs = random_halfcheetah_pairs(900, seed=0)
    teacher = SyntheticTeacher(rng=np.random.default_rng(0))
    keep, labels = teacher.label(pairs.true_rewards[:, 0], pairs.true_rewards[:, 1])
    assert keep.all()
    train, test = np.arange(600), np.arange(600, 900)
    dataset = PreferenceDataset(600, 25, 17, 6)
    dataset.add(pairs.take(train), labels[train])
    model = RewardEnsemble(17, 6, ensemble_size=3, hidden_dim=64, hidden_depth=2)
    trainer = RewardTrainer(model, lr=1e-3, batch_size=64, rng=np.random.default_rng(0))
    before = trainer.accuracy(pairs.observations[test], pairs.actions[test], labels[test])
    stats = trainer.train(dataset, max_epochs=40)
    after = trainer.accuracy(pairs.observations[test], pairs.actions[test], labels[test])
    assert stats.accuracy > 0.85
    assert after > 0.8, (before, after)
    assert after > before + 0.15


def test_trainer_early_stops_once_accurate():
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(256, 2, 5, 2)).astype(np.float32)
    gap = obs[:, 1, :, 0].sum(-1) - obs[:, 0, :, 0].sum(-1)
    # clear preferences only: with near-ties in the data the tanh-bounded reward reached 0.969
    # (not > 0.97) in 200 epochs for every torch seed, and the test passed only after others
    obs = obs[np.abs(gap) > 1.0][:64]
    act = np.zeros((64, 2, 5, 1), dtype=np.float32)
    true = obs[..., 0]  # reward = first observation feature
    labels = (true[:, 1].sum(-1) > true[:, 0].sum(-1)).astype(np.float32)
    data = PreferenceDataset(64, 5, 2, 1)
    data.add(SegmentPairs(obs, act, true, np.zeros((64, 2), dtype=np.int64)), labels)
    trainer = RewardTrainer(RewardEnsemble(2, 1, 2, hidden_dim=32, hidden_depth=1), lr=3e-3,
                            batch_size=16, rng=rng)
    stats = trainer.train(data, max_epochs=200)
    assert stats.accuracy > 0.97
    assert stats.epochs < 50  # 4–17 epochs over torch seeds 0–11


def test_dataset_rejects_bad_labels_and_overflow(tmp_path):
    data = PreferenceDataset(2, 3, 1, 1)
    pairs = SegmentPairs(np.zeros((1, 2, 3, 1)), np.zeros((1, 2, 3, 1)), np.zeros((1, 2, 3)),
                         np.zeros((1, 2), dtype=np.int64))
    with pytest.raises(ValueError, match=r"0, 0\.5 or 1"):
        data.add(pairs, np.array([0.3]))
    data.add(pairs, np.array([0.5]))
    data.add(pairs, np.array([1.0]))
    data.add(pairs, np.array([0.0]))  # past its capacity: it grows (answers keep coming)
    assert data.capacity == 4
    loaded = PreferenceDataset.load(data.save(tmp_path / "prefs"))
    assert len(loaded) == 3
    np.testing.assert_array_equal(loaded.labels[:3], [0.5, 1.0, 0.0])


def test_pixel_batches_in_chunks_give_the_same_step_as_one_pass():
    """Reward training on pixels runs a batch through the CNNs in chunks (memory, speed): the
    accumulated gradient, hence the step, equals the one-pass step."""
    import copy

    rng = np.random.default_rng(0)
    n, horizon, shape = 6, 4, (3, 36, 36)
    obs = rng.integers(0, 255, (n, 2, horizon, int(np.prod(shape)))).astype(np.uint8)
    pairs = SegmentPairs(obs, rng.uniform(-1, 1, (n, 2, horizon, 2)).astype(np.float32),
                         np.zeros((n, 2, horizon), np.float32), np.zeros((n, 2), np.int64))
    data = PreferenceDataset(n, horizon, int(np.prod(shape)), 2, obs_dtype=np.uint8)
    data.add(pairs, np.array([0, 1, 0.5, 1, 0, 1.0]))
    torch.manual_seed(0)
    model = RewardEnsemble(int(np.prod(shape)), 2, ensemble_size=2, hidden_dim=16,
                           obs_shape=shape)
    twin, initial = copy.deepcopy(model), copy.deepcopy(model)
    one = RewardTrainer(model, batch_size=6, rng=np.random.default_rng(1), chunk_images=None)
    chunked = RewardTrainer(twin, batch_size=6, rng=np.random.default_rng(1), chunk_images=4)
    loss_one, acc_one = one.train_epoch(data)
    loss_chunked, acc_chunked = chunked.train_epoch(data)  # one pair per forward pass
    assert loss_chunked == pytest.approx(loss_one, rel=1e-5) and acc_chunked == acc_one
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    assert any((p != p0).any() for p, p0 in zip(model.parameters(), initial.parameters(),
                                                strict=True))  # a step was taken


def test_scoring_in_chunks_gives_the_numbers_of_one_pass(monkeypatch):
    """A relabel (``predict_members``) and query scoring (``preference_probabilities``) run a
    few rows at a time (bounded memory); the numbers are those of one pass."""
    rng = np.random.default_rng(0)
    model = RewardEnsemble(5, 2, ensemble_size=2, hidden_dim=16, hidden_depth=1)
    obs, act = rng.normal(size=(7, 5)).astype(np.float32), rng.normal(size=(7, 2))
    pair_obs = rng.normal(size=(45, 2, 50, 5)).astype(np.float32)  # 20 pairs per chunk
    pair_act = rng.normal(size=(45, 2, 50, 2)).astype(np.float32)
    one_pass = model.predict_members(obs, act, chunk_size=7)
    np.testing.assert_allclose(model.predict_members(obs, act, chunk_size=3), one_pass,
                               rtol=1e-6, atol=1e-7)  # rows 0-2, 3-5, 6
    chunked = model.preference_probabilities(pair_obs, pair_act)  # pairs 0-19, 20-39, 40-44
    monkeypatch.setattr(RewardEnsemble, "chunk_rows", 2 * 50 * 45)  # all pairs at once
    np.testing.assert_allclose(model.preference_probabilities(pair_obs, pair_act), chunked,
                               rtol=1e-6, atol=1e-7)


def test_a_round_of_ties_reports_no_accuracy_and_stops():
    """Only ties (sparse rewards): no strict label to order, so the accuracy is NaN — not a
    perfect 1.0 next to a chance-level loss — and training stops after one epoch."""
    from themis.agents.buffers import SegmentPairs
    from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer

    rng = np.random.default_rng(0)
    data = PreferenceDataset(8, 4, 3, 2)
    data.add(SegmentPairs(rng.standard_normal((8, 2, 4, 3), dtype=np.float32),
                          rng.standard_normal((8, 2, 4, 2), dtype=np.float32),
                          np.zeros((8, 2, 4), np.float32), np.zeros((8, 2), np.int64)),
             np.full(8, 0.5, np.float32))
    trainer = RewardTrainer(RewardEnsemble(3, 2, ensemble_size=2, hidden_dim=8), 1e-3, 4,
                            np.random.default_rng(0))
    fit = trainer.train(data, max_epochs=20)
    assert np.isnan(fit.accuracy) and fit.epochs == 1


def test_one_preference_is_enough_to_train_and_none_is_an_error():
    from themis.agents.buffers import SegmentPairs
    from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer

    rng = np.random.default_rng(0)
    trainer = RewardTrainer(RewardEnsemble(3, 2, ensemble_size=2, hidden_dim=8), 1e-3, 4, rng)
    data = PreferenceDataset(4, 4, 3, 2)
    with pytest.raises(ValueError, match="empty preference dataset"):
        trainer.train(data, max_epochs=3)
    data.add(SegmentPairs(rng.standard_normal((1, 2, 4, 3), dtype=np.float32),
                          rng.standard_normal((1, 2, 4, 2), dtype=np.float32),
                          np.zeros((1, 2, 4), np.float32), np.zeros((1, 2), np.int64)),
             np.ones(1, np.float32))
    fit = trainer.train(data, max_epochs=3)  # the first round of a 1-query budget
    # the accuracy counts (member, pair) orders: each of the two members gets the pair right
    # or wrong (which, depends on the torch seed the earlier tests left)
    assert 1 <= fit.epochs <= 3 and np.isfinite(fit.loss) and fit.accuracy in (0.0, 0.5, 1.0)
