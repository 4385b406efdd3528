"""Replay buffer: shapes, wrap-around, relabeling, segments that never cross episodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from themis.agents.buffers import ReplayBuffer


def fill(buf: ReplayBuffer, n: int, episode_len: int, start: int = 0) -> None:
    """Add ``n`` transitions whose observation encodes their global index."""
    for i in range(start, start + n):
        obs = np.full(buf.obs.shape[1:], i, dtype=np.float32)
        buf.add(obs, np.full(buf.actions.shape[1], -i), float(i), obs + 1,
                terminated=(i % episode_len == episode_len - 1), episode=i // episode_len,
                t=i % episode_len, true_reward=float(10 * i))


def test_add_and_sample_shapes():
    buf = ReplayBuffer((3,), 2, capacity=100, device=torch.device("cpu"))
    fill(buf, 40, episode_len=10)
    batch = buf.sample(16, np.random.default_rng(0))
    assert batch.observations.shape == (16, 3)
    assert batch.actions.shape == (16, 2)
    assert batch.next_observations.shape == (16, 3)
    assert batch.rewards.shape == (16,)
    assert batch.not_dones.shape == (16,)
    assert batch.observations.dtype == torch.float32
    # every sampled transition is a stored one: next_obs = obs + 1, reward = obs
    assert torch.equal(batch.next_observations, batch.observations + 1)
    assert torch.equal(batch.rewards, batch.observations[:, 0])
    # terminal transitions (last step of each episode) have not_done = 0
    idx = batch.observations[:, 0].long()
    assert torch.equal(batch.not_dones == 0, idx % 10 == 9)


def test_wrap_around_keeps_the_newest():
    buf = ReplayBuffer((1,), 1, capacity=10, device=torch.device("cpu"))
    fill(buf, 25, episode_len=100)
    assert len(buf) == 10 and buf.ptr == 5
    assert sorted(buf.obs[:, 0].tolist()) == list(range(15, 25))
    batch = buf.sample(500, np.random.default_rng(1))
    assert set(batch.observations[:, 0].long().tolist()) == set(range(15, 25))


@pytest.mark.parametrize("n", [7, 10, 23])
def test_relabel_covers_every_stored_transition(n):
    buf = ReplayBuffer((2,), 1, capacity=10, device=torch.device("cpu"))
    fill(buf, n, episode_len=5)
    calls = []

    def reward_fn(obs, act):
        calls.append(len(obs))
        return obs[:, 0] * 2 + act[:, 0]  # = 2i - i = i

    buf.relabel(reward_fn, chunk_size=3)
    stored = buf.obs[: len(buf), 0]
    np.testing.assert_array_equal(buf.rewards[: len(buf)], stored)
    assert sum(calls) == len(buf) == min(n, 10)


def test_segments_stay_inside_one_episode_across_wrap():
    buf = ReplayBuffer((1,), 1, capacity=50, device=torch.device("cpu"))
    fill(buf, 137, episode_len=20)  # wraps more than twice; episodes straddle the end
    starts = buf.segment_starts(segment=8)
    assert len(starts) > 0
    for s in starts:
        idx = (s + np.arange(8)) % buf.capacity
        values = buf.obs[idx, 0]
        np.testing.assert_array_equal(np.diff(values), np.ones(7))  # consecutive steps
        assert len(set((values // 20).tolist())) == 1  # one episode
    # brute force: every slot whose next 7 slots continue the same episode is a start
    expected = [s for s in range(buf.capacity)
                if all(buf.obs[(s + k) % 50, 0] == buf.obs[s, 0] + k for k in range(8))
                and buf.obs[s, 0] // 20 == (buf.obs[s, 0] + 7) // 20]
    assert sorted(starts.tolist()) == expected


def test_sample_segment_pairs_returns_true_rewards():
    buf = ReplayBuffer((1,), 1, capacity=100, device=torch.device("cpu"))
    fill(buf, 100, episode_len=25)
    pairs = buf.sample_segment_pairs(12, segment=5, rng=np.random.default_rng(2))
    assert pairs.observations.shape == (12, 2, 5, 1)
    assert pairs.actions.shape == (12, 2, 5, 1)
    assert pairs.true_rewards.shape == (12, 2, 5)
    np.testing.assert_array_equal(pairs.true_rewards, 10 * pairs.observations[..., 0])
    with pytest.raises(ValueError, match="consecutive steps"):
        buf.sample_segment_pairs(1, segment=26, rng=np.random.default_rng(0))


def test_min_episode_restricts_the_query_pool():
    buf = ReplayBuffer((1,), 1, capacity=100, device=torch.device("cpu"))
    fill(buf, 100, episode_len=10)
    starts = buf.segment_starts(segment=3, min_episode=8)
    assert buf.episode[starts].min() == 8


def test_state_dict_round_trip_of_a_wrapped_buffer():
    buf = ReplayBuffer((2,), 1, capacity=8, device=torch.device("cpu"))
    fill(buf, 13, episode_len=4)
    other = ReplayBuffer((2,), 1, capacity=20, device=torch.device("cpu"))
    other.load_state_dict(buf.state_dict())
    assert len(other) == 8
    np.testing.assert_array_equal(other.obs[:8, 0], np.arange(5, 13))  # oldest first
    fill(other, 3, episode_len=4, start=13)
    assert other.obs[10, 0] == 15
    with pytest.raises(ValueError, match="observations"):
        ReplayBuffer((3,), 1, 20, torch.device("cpu")).load_state_dict(buf.state_dict())


def test_new_transitions_are_labelled_before_they_can_be_sampled():
    buf = ReplayBuffer((1,), 1, capacity=128, device=torch.device("cpu"))
    fill(buf, 100, episode_len=10)

    calls = []

    def reward_fn(obs, act):
        calls.append(len(obs))
        return -obs[:, 0]

    buf.relabel(reward_fn)
    rng = np.random.default_rng(0)
    for i in range(100, 400):  # wraps around; the reward passed to add() is ignored
        fill(buf, 1, episode_len=10, start=i)
        batch = buf.sample(8, rng)
        torch.testing.assert_close(batch.rewards, -batch.observations[:, 0])
    stored = buf.obs[: len(buf), 0]
    buf._label_pending()
    np.testing.assert_array_equal(buf.rewards[: len(buf)], -stored)
    assert len(calls) < 150  # batched: far fewer calls than the 300 added transitions
