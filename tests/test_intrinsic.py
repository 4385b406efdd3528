"""State entropy: k-NN distances against brute force; running statistics against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from themis.intrinsic import RunningMeanStd, StateEntropyReward, knn_distance


@pytest.mark.parametrize("k", [1, 3, 7])
def test_knn_distance_matches_brute_force(k):
    rng = np.random.default_rng(k)
    x = rng.normal(size=(31, 5)).astype(np.float32)
    pool = rng.normal(size=(200, 5)).astype(np.float32)
    ours = knn_distance(torch.from_numpy(x), torch.from_numpy(pool), k).numpy()
    brute = np.array([np.sort(np.sqrt(((pool - xi) ** 2).sum(1)))[k - 1] for xi in x])
    np.testing.assert_allclose(ours, brute, rtol=1e-5, atol=1e-5)


def test_knn_distance_is_exact_far_from_the_origin():
    rng = np.random.default_rng(0)
    offset = np.float32(5000.0)  # |p|² ~ 1e8: float32 rounding would reorder neighbours
    x = rng.normal(size=(64, 6)).astype(np.float32) + offset
    pool = rng.normal(size=(3000, 6)).astype(np.float32) + offset
    ours = knn_distance(torch.from_numpy(x), torch.from_numpy(pool), 5).numpy()
    xd, pd_ = x.astype(np.float64), pool.astype(np.float64)
    brute = np.array([np.sort(np.sqrt(((pd_ - xi) ** 2).sum(1)))[4] for xi in xd])
    np.testing.assert_allclose(ours, brute, rtol=1e-4, atol=1e-3)


def test_knn_needs_k_points():
    with pytest.raises(ValueError, match="at least 4"):
        knn_distance(torch.zeros(2, 3), torch.zeros(3, 3), 4)


def test_running_mean_std_matches_numpy_on_uneven_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 2)) for n in (1, 7, 100, 3, 250)]
    stats = RunningMeanStd(shape=(2,), epsilon=0.0 + 1e-12)
    for b in batches:
        stats.update(b)
    data = np.concatenate(batches)
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-6)
    assert stats.count == pytest.approx(len(data))


def test_state_entropy_reward_is_normalised_knn_distance():
    rng = np.random.default_rng(0)
    replay = rng.normal(size=(50, 4)).astype(np.float32)
    reward = StateEntropyReward(k=3, pool_size=1000)  # pool larger than replay: all states
    x = torch.from_numpy(rng.normal(size=(64, 4)).astype(np.float32))
    r = reward(x, replay, rng)
    dist = knn_distance(x, torch.from_numpy(replay), 3)
    np.testing.assert_allclose(r.numpy(), (dist / float(reward.stats.std)).numpy(), rtol=1e-5)
    # states far from everything visited earn more than states in the crowd
    far = torch.full((1, 4), 10.0)
    assert reward(far, replay, rng).item() > r.max().item()
