"""State entropy: k-NN distances against brute force; running statistics against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from themis.agents.intrinsic import RunningMeanStd, StateEntropyReward, knn_distance


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


def _brute_knn(x: np.ndarray, pool: np.ndarray, k: int, exclude_self: bool = False):
    out = []
    for xi in x.astype(np.float64):
        d = np.sort(np.sqrt(((pool.astype(np.float64) - xi) ** 2).sum(1)))
        if exclude_self and d[0] == 0:
            d = d[1:]
        out.append(d[k - 1])
    return np.array(out)


def test_state_entropy_reward_is_knn_distance_over_its_std():
    rng = np.random.default_rng(0)
    replay = rng.normal(size=(50, 4)).astype(np.float32)
    reward = StateEntropyReward(k=3, pool_size=1000)  # pool larger than replay: all states
    x = rng.normal(size=(64, 4)).astype(np.float32)
    r = reward(torch.from_numpy(x), replay, rng).numpy()
    dist = _brute_knn(x, replay, 3)
    np.testing.assert_allclose(r, dist / dist.std(), rtol=1e-3)  # std of this first batch
    # states far from everything visited earn more than states in the crowd
    far = torch.full((1, 4), 10.0)
    assert reward(far, replay, rng).item() > r.max()


def test_rimes_centred_scale_is_clipped_standardised_distance_over_three():
    # agent/sac_RIME.py update_critic_state_ent: clip((d - mean) / (3 std), -1, 1)
    rng = np.random.default_rng(0)
    replay = rng.normal(size=(50, 4)).astype(np.float32)
    reward = StateEntropyReward(k=3, pool_size=1000, scale="centred")
    x = rng.normal(size=(64, 4)).astype(np.float32)
    r = reward(torch.from_numpy(x), replay, rng).numpy()
    dist = _brute_knn(x, replay, 3)
    mean, std = dist.mean(), dist.std()  # the statistics of this first batch (and 1e-4 prior)
    np.testing.assert_allclose(r, np.clip((dist - mean) / (3 * std), -1, 1), rtol=1e-3,
                               atol=1e-4)
    assert (r < 0).any() and (r > 0).any() and np.abs(r).max() <= 1
    assert reward(torch.full((1, 4), 10.0), replay, rng).item() == 1.0  # clipped
    # RIME's warm-start target: z = (d - mean) / std, bound = max |z| of the extremes seen
    z, bound = reward.standardise(torch.from_numpy(dist.astype(np.float32)))
    m, s = float(reward.stats.mean), float(reward.stats.std)
    np.testing.assert_allclose(z.numpy(), (dist - m) / s, rtol=1e-4, atol=1e-5)
    assert bound == pytest.approx(max(abs(reward.low - m), abs(reward.high - m)) / s)
    assert reward.high > dist.max() and reward.low == pytest.approx(dist.min())


@pytest.mark.parametrize("k", [1, 3])
def test_a_state_is_never_its_own_neighbour(k):
    rng = np.random.default_rng(k)
    pool = rng.normal(size=(300, 3)).astype(np.float32)
    x = pool[:40]  # states that are in the pool (PEBBLE rewards next_obs, stored as obs)
    ours = knn_distance(torch.from_numpy(x), torch.from_numpy(pool), k, exclude_self=True)
    np.testing.assert_allclose(ours.numpy(), _brute_knn(x, pool, k, exclude_self=True),
                               rtol=1e-5)
    assert (ours > 0).all()
    # the same distances when the pool is a sample that does not hold the states themselves
    others = torch.from_numpy(pool[40:])
    np.testing.assert_allclose(knn_distance(torch.from_numpy(x), others, k,
                                            exclude_self=True).numpy(),
                               _brute_knn(x, pool[40:], k), rtol=1e-5)


def test_state_entropy_reward_skips_the_state_itself_in_the_pool():
    rng = np.random.default_rng(0)
    replay = rng.normal(size=(100, 4)).astype(np.float32)
    reward = StateEntropyReward(k=2, pool_size=1000)
    r = reward(torch.from_numpy(replay[:30]), replay, rng).numpy()
    dist = _brute_knn(replay[:30], replay, 2, exclude_self=True)
    np.testing.assert_allclose(r / r[0], dist / dist[0], rtol=1e-4)


def _trajectory(rng: np.random.Generator, n: int, dim: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Stored states and next states of consecutive transitions (next_obs[j] == obs[j + 1]
    within an episode, as in a replay buffer), episodes of 25 steps."""
    states = rng.normal(size=(n + 1, dim)).astype(np.float32)
    obs, next_obs = states[:-1].copy(), states[1:].copy()
    ends = np.arange(24, n, 25)
    next_obs[ends] = rng.normal(size=(len(ends), dim)).astype(np.float32)  # last states
    obs[ends[ends + 1 < n] + 1] = rng.normal(size=(int((ends + 1 < n).sum()), dim))  # resets
    return obs, next_obs


@pytest.mark.parametrize("k", [1, 5])
def test_replay_knn_grown_step_by_step_matches_knn_distance(k):
    from themis.agents.intrinsic import ReplayKNN

    rng = np.random.default_rng(k)
    obs, next_obs = _trajectory(rng, 300)
    cache = ReplayKNN(k)
    for n in [*range(1, 12), 40, 41, 42, 150, *range(151, 170), 300]:  # steps and bulk syncs
        cache.sync(obs[:n], next_obs[:n])
        idx = np.arange(n)
        expect = knn_distance(torch.from_numpy(next_obs[:n]), torch.from_numpy(obs[:n]),
                              min(k, n), exclude_self=True) if n >= k else None
        got = cache.distances(idx)
        if expect is not None:
            np.testing.assert_allclose(got.numpy(), expect.numpy(), rtol=1e-5, atol=1e-6)
        assert torch.isfinite(got).all()
    # the state itself (next_obs[j] stored as obs[j + 1]) is never its own neighbour
    assert (cache.distances(np.arange(300)) > 0).all()
    with pytest.raises(IndexError, match="not synced"):
        cache.distances(np.array([300]))


def test_replay_knn_starts_over_when_the_buffer_is_replaced():
    from themis.agents.intrinsic import ReplayKNN

    rng = np.random.default_rng(0)
    obs, next_obs = _trajectory(rng, 200)
    other_obs, other_next = _trajectory(rng, 200)
    cache = ReplayKNN(3)
    cache.sync(obs[:150], next_obs[:150])
    for o, x, n in ((other_obs, other_next, 160), (other_obs, other_next, 100)):  # new, shorter
        cache.sync(o[:n], x[:n])
        expect = knn_distance(torch.from_numpy(x[:n]), torch.from_numpy(o[:n]), 3,
                              exclude_self=True)
        np.testing.assert_allclose(cache.distances(np.arange(n)).numpy(), expect.numpy(),
                                   rtol=1e-5)


@pytest.mark.parametrize("case", ["cached", "pool sample", "wrapped"])
def test_replay_reward_is_the_state_entropy_reward_of_the_batch(case):
    from themis.agents.buffers import ReplayBuffer

    rng = np.random.default_rng(1)
    capacity = 120 if case == "wrapped" else 1000
    buffer = ReplayBuffer((3,), 2, capacity, torch.device("cpu"))
    obs, next_obs = _trajectory(rng, 400 if case == "wrapped" else 200)
    cached = StateEntropyReward(k=3, pool_size=100 if case == "pool sample" else 1000)
    plain = StateEntropyReward(k=3, pool_size=cached.pool_size)
    for j in range(len(obs)):
        buffer.add(obs[j], np.zeros(2), 0.0, next_obs[j], False, j // 25, j % 25)
        if j >= 10 and j % 7 == 0:
            idx = buffer.sample_indices(32, rng)
            batch = buffer.samples(idx)
            seed = int(rng.integers(1 << 30))
            ours = cached.replay_reward(batch.next_observations, idx, buffer,
                                        np.random.default_rng(seed))
            theirs = plain(batch.next_observations, buffer.obs[: len(buffer)],
                           np.random.default_rng(seed))
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5)
    np.testing.assert_allclose(cached.stats.var, plain.stats.var, rtol=1e-5)
    assert (cached.replay_knn.synced > 0) == (case == "cached")
