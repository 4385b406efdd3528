"""Frame stacks stored once per frame: the episode store and the preference dataset give back
exactly the stacks the env produced, with 4× less memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from themis.agents.buffers import EpisodeStore, SegmentPairs
from themis.environments.domains import frame_stack_size, make_env
from themis.environments.framestack import stacked, stacked_tensor, unstack
from themis.reward import PreferenceDataset

CPU = torch.device("cpu")


def test_stacked_view_and_unstack_are_inverse():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, size=(3, 2, 9, 5, 6), dtype=np.uint8)
    stacks = stacked(frames, 4, frame_ndim=2)
    assert stacks.shape == (3, 2, 6, 4, 5, 6) and not stacks.flags.writeable
    for t in range(6):
        np.testing.assert_array_equal(stacks[:, :, t], frames[:, :, t:t + 4])
    np.testing.assert_array_equal(unstack(stacks, frame_ndim=2), frames)
    flat = stacked(frames.reshape(3, 2, 9, 30), 4, frame_ndim=1, flat=True)
    np.testing.assert_array_equal(flat, stacks.reshape(3, 2, 6, 120))
    tensor = stacked_tensor(torch.from_numpy(frames.reshape(3, 2, 9, 30)), 4, 1, flat=True)
    assert torch.equal(tensor, torch.from_numpy(np.ascontiguousarray(flat)))
    with pytest.raises(ValueError, match="too few"):
        stacked(frames[:, :, :3], 4, frame_ndim=2)


def _atari_steps(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[int]]:
    """Observations of ``n`` random-action steps of Breakout and each step's time index."""
    env = make_env("ALE", "Breakout-v5", seed=seed)
    assert frame_stack_size(env) == 4
    obs, _ = env.reset(seed=seed)
    observations, ts, t = [], [], 0
    for _ in range(n):
        observations.append(obs)
        ts.append(t)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        t += 1
        if terminated or truncated:
            obs, _ = env.reset()
            t = 0
    env.close()
    return observations, ts


def test_episode_store_gives_back_the_env_stacks_from_interleaved_pieces():
    # two envs' episodes flushed in alternating pieces of 25 steps, as PPO's rollouts do
    a, ta = _atari_steps(150, seed=0)
    b, tb = _atari_steps(150, seed=1)
    store = EpisodeStore((4, 84, 84), 1, 1000, CPU, obs_dtype=np.uint8,
                         frame_stack=4)
    assert store.frames.nbytes == 1000 * 84 * 84 and store.obs.nbytes == 0
    originals, episodes = [], []
    for lo in range(0, 150, 25):
        for steps, ts, base in ((a, ta, 0), (b, tb, 100)):
            for i in range(lo, lo + 25):
                episode = base + sum(1 for t in ts[1:i + 1] if t == 0)  # a new id at each reset
                store.add(steps[i], np.zeros(1), 0.0, None, False, episode, ts[i], 0.0)
                originals.append(steps[i])
                episodes.append(episode)
    np.testing.assert_array_equal(store.observations(np.arange(300)), np.stack(originals))
    pairs = store.sample_segment_pairs(40, 20, np.random.default_rng(0))
    assert pairs.observations.shape == (40, 2, 20, 4, 84, 84)
    expected = np.stack(originals)[(pairs.starts[..., None] + np.arange(20))]
    np.testing.assert_array_equal(pairs.observations, expected)
    # a checkpoint round trip keeps every stack
    clone = EpisodeStore((4, 84, 84), 1, 1000, CPU, obs_dtype=np.uint8,
                         frame_stack=4)
    clone.load_state_dict(store.state_dict())
    np.testing.assert_array_equal(clone.observations(np.arange(300)), np.stack(originals))


def test_overwritten_history_is_never_served():
    frames = np.arange(40, dtype=np.uint8)[:, None, None] * np.ones((1, 2, 2), np.uint8)

    def stack(t: int) -> np.ndarray:
        return frames[np.maximum(np.arange(t - 3, t + 1), 0)]

    store = EpisodeStore((4, 2, 2), 1, 10, CPU, obs_dtype=np.uint8,
                         frame_stack=4)
    for t in range(25):  # one episode of 25 steps in a store of 10: it wraps twice
        store.add(stack(t), np.zeros(1), 0.0, None, False, 0, t, 0.0)
    readable = store.readable(np.arange(10))
    # the 3 oldest stored steps (t = 15, 16, 17) lost earlier frames; the other 7 did not
    assert readable.sum() == 7
    for slot in np.flatnonzero(readable):
        np.testing.assert_array_equal(store.observations(np.array([slot]))[0],
                                      stack(int(store.t[slot])))
    assert set(store.t[store.segment_starts(4)]) == {18, 19, 20, 21}
    with pytest.raises(ValueError, match="lost earlier frames"):
        store.observations(np.arange(10))


def test_stacks_that_do_not_continue_are_refused():
    store = EpisodeStore((4, 2, 2), 1, 10, CPU, obs_dtype=np.uint8,
                         frame_stack=4)
    with pytest.raises(ValueError, match="reset padding"):  # t = 0 must repeat one frame
        store.add(np.arange(16, dtype=np.uint8).reshape(4, 2, 2), np.zeros(1), 0, None, False,
                  0, 0, 0.0)
    store.add(np.zeros((4, 2, 2), np.uint8), np.zeros(1), 0, None, False, 0, 0, 0.0)
    with pytest.raises(ValueError, match="does not continue"):
        store.add(np.ones((4, 2, 2), np.uint8), np.zeros(1), 0, None, False, 0, 1, 0.0)


def test_stacked_preference_dataset_round_trip(tmp_path):
    steps, _ = _atari_steps(120)
    store = EpisodeStore((4, 84, 84), 1, 200, CPU, obs_dtype=np.uint8,
                         frame_stack=4)
    for t, obs in enumerate(steps):
        store.add(obs, np.eye(1)[0], 0.0, None, False, 0, t, float(t))
    pairs = store.sample_segment_pairs(6, 10, np.random.default_rng(1))
    data = PreferenceDataset(10, 10, 4 * 84 * 84, 1, obs_dtype=np.uint8, frame_stack=4)
    data.add(pairs, np.array([0, 1, 0.5, 0, 1, 1]))
    assert data.frames.nbytes == 10 * 2 * 13 * 84 * 84
    flat = pairs.observations.reshape(6, 2, 10, -1)
    np.testing.assert_array_equal(data.observations[:6], flat)
    small = PreferenceDataset(4, 10, 4 * 84 * 84, 1, obs_dtype=np.uint8, frame_stack=4)
    small.add(pairs.take(np.arange(3)), np.zeros(3))
    small.add(pairs.take(np.arange(3, 6)), np.ones(3))  # grows past its 4 pairs
    assert small.capacity == 8 and small.frames.shape[0] == 8
    np.testing.assert_array_equal(small.observations[:6], flat)  # the view follows the frames
    obs_t, _, labels = data.tensors(CPU)
    assert labels.tolist() == [0, 1, 0.5, 0, 1, 1]
    assert torch.equal(obs_t[torch.tensor([[4, 1]])], torch.from_numpy(flat[[4, 1]])[None])
    data.save(tmp_path / "prefs")
    meta = json.loads((tmp_path / "prefs" / "meta.json").read_text())
    assert meta["format_version"] == 3 and meta["frame_stack"] == 4
    loaded = PreferenceDataset.load(tmp_path / "prefs", capacity=20)
    np.testing.assert_array_equal(loaded.observations[:6], flat)
    np.testing.assert_array_equal(loaded.labels[:6], [0, 1, 0.5, 0, 1, 1])
    # a dataset of whole stacks (no frame_stack) merges into a stacked one, and back
    whole = PreferenceDataset(6, 10, 4 * 84 * 84, 1, obs_dtype=np.uint8)
    whole.extend(loaded)
    np.testing.assert_array_equal(whole.observations[:6], flat)
    whole.save(tmp_path / "whole")
    assert json.loads((tmp_path / "whole" / "meta.json").read_text())["format_version"] == 2
    loaded.extend(PreferenceDataset.load(tmp_path / "whole"))
    np.testing.assert_array_equal(loaded.observations[6:12], flat)
    # merge_prefs keeps the frames (and uint8)
    script = Path(__file__).resolve().parents[1] / "scripts" / "merge_prefs.py"
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "merged"),
                           str(tmp_path / "prefs"), str(tmp_path / "whole")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    merged = PreferenceDataset.load(tmp_path / "merged")
    assert merged.frame_stack == 4 and merged.frames.dtype == np.uint8 and len(merged) == 12
    np.testing.assert_array_equal(merged.observations[6:12], flat)


def test_snapshot_of_whole_stacks_loads_into_a_frame_stacked_store():
    """Checkpoints written before frame stacks were de-duplicated still resume."""
    a, ta = _atari_steps(60, seed=2)
    assert ta == list(range(60))  # one episode
    whole = EpisodeStore((4, 84, 84), 1, 50, CPU, obs_dtype=np.uint8)
    for obs, t in zip(a, ta, strict=True):  # wraps: the 10 oldest steps are overwritten
        whole.add(obs, np.zeros(1), 0.0, None, False, 0, t, 0.0)
    store = EpisodeStore((4, 84, 84), 1, 50, CPU, obs_dtype=np.uint8,
                         frame_stack=4)
    store.load_state_dict(whole.state_dict())
    readable = store.readable(np.arange(50))
    assert readable.sum() == 47  # the oldest three lost earlier frames
    np.testing.assert_array_equal(store.observations(np.flatnonzero(readable)),
                                  np.stack(a[13:]))
    # not frame stacks at all: refused with a message
    whole.obs[:50] = np.random.default_rng(0).integers(0, 255, (50, 4, 84, 84), np.uint8)
    with pytest.raises(ValueError, match="not frame stacks"):
        store.load_state_dict(whole.state_dict())


def test_dataset_refuses_observations_that_are_not_frame_stacks():
    data = PreferenceDataset(2, 5, 4 * 4, 1, obs_dtype=np.uint8, frame_stack=4)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 255, (1, 2, 5, 16), np.uint8)
    pairs = SegmentPairs(obs, np.zeros((1, 2, 5, 1), np.float32), np.zeros((1, 2, 5)),
                         np.zeros((1, 2), np.int64))
    with pytest.raises(ValueError, match="not stacks of 4 consecutive frames"):
        data.add(pairs, np.array([1.0]))
    assert len(data) == 0
