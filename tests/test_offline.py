"""Offline mode (issue 88): datasets from Minari, a run's replay buffer and rollouts; labels on
segment pairs inside episodes; Preference Transformer; IQL; a run end to end with resume."""

from __future__ import annotations

import json
import math
import pickle

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch

from themis.agents.iql import IQL, IQLConfig, advantage_weights, expectile_loss, return_range_scale
from themis.offline.datasets import (
    DatasetError,
    OfflineDataset,
    from_episodes,
    load_offline_dataset,
)
from themis.offline.labels import load_label_file
from themis.offline.main import main, train_offline
from themis.reward.preference_transformer import PreferenceTransformer, preference_transformer_loss
from themis.utils import ConfigError


def episodes(lengths=(30, 12, 25), obs_dim=3, act_dim=1, seed=0, terminal_last=False):
    rng = np.random.default_rng(seed)
    return [{"obs": rng.normal(size=(n + 1, obs_dim)), "actions": rng.uniform(-1, 1, (n, act_dim)),
             "rewards": rng.normal(size=n),
             "terminated": np.r_[np.zeros(n - 1, bool), [terminal_last]]} for n in lengths]


def small_dataset(**kwargs) -> OfflineDataset:
    return from_episodes(episodes(**kwargs), "test")


# ------------------------------------------------------------------------- datasets
def test_episodes_concatenate_with_their_bounds_and_timeouts():
    data = small_dataset()
    assert data.num_steps == 67 and data.num_episodes == 3
    assert data.starts.tolist() == [0, 30, 42] and data.lengths.tolist() == [30, 12, 25]
    assert np.flatnonzero(data.timeouts).tolist() == [29, 41, 66] and not data.terminals.any()
    np.testing.assert_array_equal(data.next_observations[:29], data.observations[1:30])
    assert data.episode_returns().shape == (3,)


@pytest.mark.parametrize("problem, words", [
    ("nan", "NaN"), ("lengths", "observations must be one more"), ("empty", "no episodes"),
])
def test_bad_datasets_are_refused_with_one_line(problem, words):
    eps = episodes()
    if problem == "nan":
        eps[1]["obs"][3, 0] = np.nan
    elif problem == "lengths":
        eps[0]["rewards"] = eps[0]["rewards"][:-2]
    else:
        eps = [{**e, "obs": e["obs"][:1], "actions": e["actions"][:0], "rewards": e["rewards"][:0],
                "terminated": e["terminated"][:0]} for e in eps]
    with pytest.raises(DatasetError, match=words) as info:
        from_episodes(eps, "bad.npz")
    assert "\n" not in str(info.value)


def test_a_minari_folder_is_read_with_actions_rescaled(tmp_path, monkeypatch):
    pytest.importorskip("h5py")
    pytest.importorskip("minari")
    from minari.data_collector.episode_buffer import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    folder = tmp_path / "datasets" / "test" / "pendulum" / "random-v0"
    folder.mkdir(parents=True)
    storage = MinariStorage.new(folder / "data", env_spec=gym.spec("Pendulum-v1"))
    rng = np.random.default_rng(0)
    storage.update_episodes([EpisodeBuffer(  # two time-limited episodes of 20 random steps
        observations=rng.normal(size=(21, 3)).astype(np.float32),
        actions=rng.uniform(-2, 2, (20, 1)).astype(np.float32),
        rewards=rng.normal(size=20), terminations=np.zeros(20, bool),
        truncations=np.r_[np.zeros(19, bool), [True]]) for _ in range(2)])
    assert (folder / "data" / "metadata.json").is_file()  # Minari's on-disk layout
    raw = next(iter(MinariStorage.read(folder / "data").get_episodes([0])))
    for where in (folder, "minari:test/pendulum/random-v0"):
        data = load_offline_dataset(where)
        assert data.num_episodes == 2 and data.lengths.tolist() == [20, 20]
        assert data.env_id == "Pendulum-v1" and data.obs_dim == 3
        assert data.timeouts.sum() == 2 and not data.terminals.any()
        np.testing.assert_allclose(data.actions[:20, 0], raw["actions"][:, 0] / 2, rtol=1e-6)
        np.testing.assert_allclose(data.rewards[:20], raw["rewards"], rtol=1e-6)
    with pytest.raises(DatasetError, match="not on this machine"):
        load_offline_dataset("minari:test/pendulum/other-v0")
    import h5py

    with h5py.File(folder / "data" / "main_data.hdf5", "a") as f:  # an episode announcing 12 TB
        f["episode_1"].create_dataset("huge", shape=(10**12, 3), dtype="f4", chunks=(1000, 3))
    with pytest.raises(DatasetError, match="announces"):
        load_offline_dataset(folder)
    (folder / "data" / "main_data.hdf5").write_bytes(b"not hdf5")
    with pytest.raises(DatasetError, match="not a readable Minari dataset"):
        load_offline_dataset(folder)


def test_rollouts_and_imitation_npz_are_read(tmp_path):
    from themis.environments.domains import make_env
    from themis.interpret.rollouts import (
        collect_rollouts,
        random_policy,
        save_imitation_npz,
        save_rollouts,
    )

    env = make_env("Classic", "Pendulum-v1", seed=0)
    rollouts = collect_rollouts(env, random_policy(env, 0), 2, seed=0, max_steps=15)
    save_rollouts(rollouts, tmp_path / "roll")
    data = load_offline_dataset(tmp_path / "roll")
    assert data.lengths.tolist() == [15, 15] and data.env_id == "Pendulum-v1"
    np.testing.assert_allclose(data.rewards, rollouts.rews)
    save_imitation_npz(rollouts, tmp_path / "imit.npz")
    assert load_offline_dataset(tmp_path / "imit.npz").num_steps == 30
    meta = json.loads((tmp_path / "roll" / "meta.json").read_text())
    meta["env"] = "os:Pendulum-v1"  # a received folder naming a module to import
    (tmp_path / "roll" / "meta.json").write_text(json.dumps(meta))
    assert load_offline_dataset(tmp_path / "roll").env_id is None
    (tmp_path / "pickled.npz").write_bytes(pickle.dumps({"obs": [1, 2]}))
    with pytest.raises(DatasetError):
        load_offline_dataset(tmp_path / "pickled.npz")


def test_a_d4rl_file_is_read_in_qlearning_dataset_order(tmp_path):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    n = 10
    obs, acts, rews = rng.normal(size=(n, 3)), rng.uniform(-1, 1, (n, 2)), rng.normal(size=n)
    terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
    timeouts[[3, 9]], terminals[6] = True, True  # episodes 0-3 (time-out), 4-6 (terminal), 7-9
    with h5py.File(tmp_path / "d4rl.hdf5", "w") as f:
        for key, value in (("observations", obs), ("actions", acts), ("rewards", rews),
                           ("terminals", terminals), ("timeouts", timeouts)):
            f[key] = value
    data = load_offline_dataset(tmp_path / "d4rl.hdf5", env_id="Pendulum-v1")
    # D4RL's qlearning_dataset: every step i < n - 1 that is not a time-out, next obs = row i + 1
    kept = [i for i in range(n - 1) if not timeouts[i]]
    np.testing.assert_allclose(data.observations, obs[kept], rtol=1e-6)
    np.testing.assert_allclose(data.next_observations, obs[[i + 1 for i in kept]], rtol=1e-6)
    np.testing.assert_allclose(data.rewards, rews[kept], rtol=1e-6)
    assert data.lengths.tolist() == [3, 3, 2] and np.flatnonzero(data.terminals).tolist() == [5]
    assert np.flatnonzero(data.timeouts).tolist() == [2, 7]
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["observations"] = obs
    with pytest.raises(DatasetError, match="not a D4RL dataset file"):
        load_offline_dataset(tmp_path / "other.h5")
    with h5py.File(tmp_path / "huge.hdf5", "w") as f:  # a small file announcing 12 TB
        f.create_dataset("observations", shape=(10**12, 3), dtype="f4", chunks=(1000, 3))
        for key in ("actions", "rewards", "terminals", "timeouts"):
            f[key] = np.zeros(3)
    with pytest.raises(DatasetError, match=r"huge\.hdf5"):
        load_offline_dataset(tmp_path / "huge.hdf5")


def test_a_run_folders_replay_buffer_is_unrolled_into_episodes(tmp_path):
    from themis.run.checkpoint import save_checkpoint

    # a wrapped buffer of capacity 10, newest write at slot 3: oldest step is slot 3
    episode = np.array([7, 7, 7, 4, 4, 5, 5, 5, 6, 6])
    t = np.array([3, 4, 5, 1, 2, 0, 1, 2, 0, 1])
    obs = np.arange(10, dtype=np.float32)[:, None].repeat(2, 1)
    not_dones = np.ones(10, np.float32)
    not_dones[7] = 0  # episode 5 ends in a terminal state
    buffer = {"capacity": 10, "ptr": 3, "size": 10, "obs": obs, "next_obs": obs + 0.5,
              "actions": np.zeros((10, 1), np.float32), "rewards": np.zeros(10, np.float32),
              "true_rewards": np.arange(10, dtype=np.float32), "not_dones": not_dones,
              "episode": episode, "t": t}
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    save_checkpoint({"buffer": buffer, "step": 10}, run / "checkpoints")
    (run / "config.yaml").write_text("env: Pendulum-v1\n")
    data = load_offline_dataset(run)
    assert data.observations[:, 0].tolist() == [3, 4, 5, 6, 7, 8, 9, 0, 1, 2]
    assert data.lengths.tolist() == [2, 3, 2, 3] and data.env_id == "Pendulum-v1"
    assert np.flatnonzero(data.terminals).tolist() == [4]
    assert np.flatnonzero(data.timeouts).tolist() == [1, 6, 9]


# --------------------------------------------------------------------------- labels
def test_query_segments_stay_inside_their_episodes():
    data = small_dataset()
    episode_of = np.repeat(np.arange(3), data.lengths)
    pairs = data.sample_segment_pairs(400, 12, np.random.default_rng(0))
    ends = pairs.starts + 11
    assert np.all(episode_of[pairs.starts] == episode_of[ends])
    assert set(np.unique(episode_of[pairs.starts])) == {0, 1, 2}  # the 12-step episode too
    np.testing.assert_array_equal(pairs.true_rewards[5, 1],
                                  data.rewards[pairs.starts[5, 1]:pairs.starts[5, 1] + 12])
    with pytest.raises(DatasetError, match="no episode"):
        data.sample_segment_pairs(1, 31, np.random.default_rng(0))
    from themis.feedback.selector import QuerySelector
    from themis.reward.ensemble import RewardEnsemble

    model = RewardEnsemble(3, 1, ensemble_size=2, hidden_dim=8, hidden_depth=1)
    selector = QuerySelector("disagreement", 10, 5, np.random.default_rng(1), obs_shape=(3,))
    chosen = selector.select(data, 4, model, np.zeros((0, 2, 10, 3)), first=False,
                             min_episode=0)  # the dataset stands where the replay buffer does
    assert len(chosen) == 4 and np.all(episode_of[chosen.starts] == episode_of[chosen.starts + 9])


def test_uni_rlhf_label_files_are_imported_as_plain_arrays(tmp_path):
    data = small_dataset()
    np.savez(tmp_path / "labels.npz", indices_1=[0, 30, 42], indices_2=[5, 31, 50],
             labels=[0, 1, -1], segment=10)
    pairs, labels = load_label_file(tmp_path / "labels.npz", data, segment=50)
    assert labels.tolist() == [0.0, 1.0, 0.5] and pairs.observations.shape == (3, 2, 10, 3)
    (tmp_path / "bad.json").write_text(json.dumps(
        {"indices_1": [25], "indices_2": [0], "labels": [1]}))
    with pytest.raises(DatasetError, match="crosses an episode"):
        load_label_file(tmp_path / "bad.json", data, segment=10)
    np.savez(tmp_path / "codes.npz", indices_1=[0], indices_2=[1], labels=[2])
    with pytest.raises(DatasetError, match="answers must be"):
        load_label_file(tmp_path / "codes.npz", data, segment=10)


# ----------------------------------------------------------- Preference Transformer
def test_preference_transformer_shapes_and_weights():
    torch.manual_seed(0)
    model = PreferenceTransformer(3, 2, max_len=8, embed_dim=16, layers=1, heads=2,
                                  pref_attn_dim=8).eval()
    obs, act = torch.randn(5, 8, 3), torch.randn(5, 8, 2)
    reward, weight = model(obs, act)
    assert reward.shape == weight.shape == (5, 8)
    torch.testing.assert_close(weight.sum(-1), torch.ones(5))
    torch.testing.assert_close(model.segment_scores(obs, act), (reward * weight).sum(-1))
    # causal: the per-step reward at t does not read later steps
    later = obs.clone()
    later[:, 5:] += 1.0
    torch.testing.assert_close(model(later, act)[0][:, :5], reward[:, :5])
    # relabelling: the last position of the window that ends at each step
    flat_obs, flat_act = obs[0].numpy().repeat(2, 0)[:12], act[0].numpy().repeat(2, 0)[:12]
    out = model.step_rewards(flat_obs, flat_act, np.array([0]), np.array([12]), window=8)
    with torch.no_grad():
        first = model(torch.as_tensor(flat_obs[None, :8]), torch.as_tensor(flat_act[None, :8]))
        last = model(torch.as_tensor(flat_obs[None, 4:]), torch.as_tensor(flat_act[None, 4:]))
    np.testing.assert_allclose(out[:8], first[0][0].numpy(), rtol=1e-5, atol=1e-6)
    assert out[11] == pytest.approx(float(last[0][0, -1]), abs=1e-5)


def test_preference_transformer_loss_is_the_bradley_terry_cross_entropy():
    s1, s2 = torch.tensor([0.2, 1.0, -0.5]), torch.tensor([0.7, -1.0, -0.5])
    y = torch.tensor([1.0, 0.0, 0.5])
    p = [1 / (1 + math.exp(-(b - a)))
         for a, b in zip([0.2, 1.0, -0.5], [0.7, -1.0, -0.5], strict=True)]
    hand = -(math.log(p[0]) + math.log(1 - p[1]) + 0.5 * math.log(p[2])
             + 0.5 * math.log(1 - p[2])) / 3
    assert float(preference_transformer_loss(s1, s2, y)) == pytest.approx(hand, rel=1e-6)


def test_preference_transformer_learns_preferences_it_was_not_shown():
    """Labels from a Markovian reward (obs[0] - a²): after 20 epochs on 300 pairs the model
    orders fresh pairs far better than chance."""
    from themis.agents.buffers import SegmentPairs
    from themis.reward.dataset import PreferenceDataset
    from themis.reward.preference_models import true_preference
    from themis.reward.preference_transformer import PreferenceTransformerTrainer

    torch.manual_seed(0)
    rng = np.random.default_rng(0)

    def pairs(n):
        obs = rng.normal(size=(n, 2, 6, 3)).astype(np.float32)
        act = rng.uniform(-1, 1, (n, 2, 6, 1)).astype(np.float32)
        return SegmentPairs(obs, act, obs[..., 0] - act[..., 0] ** 2, np.zeros((n, 2), np.int64))

    train, fresh = pairs(300), pairs(300)
    prefs = PreferenceDataset(300, 6, 3, 1)
    prefs.add(train, true_preference(train.true_rewards))
    model = PreferenceTransformer(3, 1, 6, embed_dim=32, layers=1, heads=2, pref_attn_dim=16)
    trainer = PreferenceTransformerTrainer(model, lr=1e-3, batch_size=64, total_steps=100,
                                           rng=rng)
    assert trainer.train(prefs, 20).steps == 100
    assert trainer.accuracy(fresh.observations, fresh.actions,
                            true_preference(fresh.true_rewards)) > 0.75


# ---------------------------------------------------------------------------- IQL
def test_expectile_loss_and_advantage_weights_by_hand():
    diff = torch.tensor([2.0, -1.0, 0.5, -3.0])
    hand = (0.7 * 4 + 0.3 * 1 + 0.7 * 0.25 + 0.3 * 9) / 4
    assert float(expectile_loss(diff, 0.7)) == pytest.approx(hand)
    assert float(expectile_loss(diff, 0.5)) == pytest.approx(float((diff ** 2).mean()) / 2)
    adv = torch.tensor([0.0, 0.5, -1.0, 2.0])
    torch.testing.assert_close(advantage_weights(adv, 3.0, 100.0),
                               torch.tensor([1.0, math.exp(1.5), math.exp(-3.0), 100.0]))
    assert return_range_scale(np.array([-100.0, 400.0])) == pytest.approx(2.0)


def test_iql_learns_the_expectile_and_round_trips_its_state():
    from themis.agents.buffers import ReplayBufferSamples

    torch.manual_seed(0)
    cfg = IQLConfig(hidden_dim=16, batch_size=32, discount=0.0, critic_lr=3e-3)
    agent = IQL(2, 1, torch.device("cpu"), cfg, total_steps=300)
    obs = torch.zeros(32, 2)
    batch = ReplayBufferSamples(obs, torch.rand(32, 1) * 2 - 1, obs, torch.ones(32),
                                torch.ones(32))
    for step in range(200):
        metrics = agent.update(batch, step)
    assert set(metrics) == set(IQL.METRICS)
    assert float(metrics["q_mean"]) == pytest.approx(1.0, abs=0.1)  # r = 1, no bootstrap
    clone = IQL(2, 1, torch.device("cpu"), cfg, total_steps=300)
    clone.load_state_dict(agent.state_dict())
    np.testing.assert_array_equal(clone.act(np.zeros(2)), agent.act(np.zeros(2)))


def test_iql_moves_its_policy_towards_the_better_actions_of_the_data():
    """A one-step task (reward -10 (a - 0.5)², uniform actions in the data): behaviour cloning
    would act near 0; IQL's advantage weights pull the policy's mean towards 0.5."""
    from themis.agents.buffers import ReplayBufferSamples

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    obs = torch.zeros(2048, 2)
    actions = torch.as_tensor(rng.uniform(-1, 1, (2048, 1)), dtype=torch.float32)
    rewards = -10 * (actions[:, 0] - 0.5) ** 2
    agent = IQL(2, 1, torch.device("cpu"), IQLConfig(hidden_dim=32, batch_size=128, discount=0,
                                                     actor_lr=3e-3, critic_lr=3e-3,
                                                     value_lr=3e-3), total_steps=300)
    for step in range(300):
        idx = torch.as_tensor(rng.integers(0, 2048, 128))
        agent.update(ReplayBufferSamples(obs[idx], actions[idx], obs[idx], rewards[idx],
                                         torch.ones(128)), step)
    assert abs(float(actions.mean())) < 0.05 and 0.3 < agent.act(np.zeros(2))[0] < 0.8


# ---------------------------------------------------------------------- end to end
TINY = dict(env="Pendulum-v1", segment=10, max_feedback=40, reward_batch=20,
            heldout_queries=50, reward_epochs=5, ensemble_size=2, reward_hidden_dim=16,
            pt_embed_dim=16, pt_heads=2, pt_pref_attn_dim=8, pt_epochs=3, eval_frequency=100,
            num_eval_episodes=1, log_frequency=50, checkpoint_frequency=100,
            iql={"hidden_dim": 32, "batch_size": 64})


@pytest.fixture(scope="module")
def pendulum_rollouts(tmp_path_factory):
    from themis.environments.domains import make_env
    from themis.interpret.rollouts import collect_rollouts, random_policy, save_rollouts

    env = make_env("Classic", "Pendulum-v1", seed=0)
    folder = tmp_path_factory.mktemp("data") / "pendulum"
    save_rollouts(collect_rollouts(env, random_policy(env, 0), 4, seed=0, max_steps=100), folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("reward_net", ["bpref", "pt"])
def test_an_offline_run_end_to_end_and_resumed(tmp_path, pendulum_rollouts, reward_net):
    run = tmp_path / "run"
    sampler = {"feed_type": 1, "teacher": "noisy"} if reward_net == "bpref" else {}
    result = train_offline(run, dataset=str(pendulum_rollouts), reward_net=reward_net,
                           num_train_steps=200, **TINY, **sampler)
    assert result.metrics["step"] == 200 and math.isfinite(result.metrics["episode_reward"])
    model_file = "reward_model.pt" if reward_net == "bpref" else "preference_transformer.pt"
    for name in ("config.yaml", "reward.csv", "train.csv", "eval.csv", "checkpoints/state.pt",
                 f"checkpoints/{model_file}", "checkpoints/rewards.npy",
                 "preferences/labels.csv"):
        assert (run / name).is_file(), name
    import themis
    from themis.core.safe_loading import safe_load
    from themis.reward.preference_transformer import model_from_state

    loaded = themis.load_run(run)  # read back as online runs are
    assert loaded.agent_step == 200 and set(loaded.agent_state) >= {"actor", "critic", "value"}
    assert len(loaded.eval) == 2 and (loaded.reward_model is None) == (reward_net == "pt")
    if reward_net == "pt":
        model = model_from_state(safe_load(run / "checkpoints" / model_file))
        assert model.max_len == 10
    rows = (run / "reward.csv").read_text().splitlines()
    assert "heldout_accuracy" in rows[0] and len(rows) == (3 if reward_net == "bpref" else 2)
    rewards = np.load(run / "checkpoints" / "rewards.npy")
    resumed = train_offline(resume=str(run), num_train_steps=300)
    assert resumed.run_dir == run and resumed.metrics["step"] == 300
    np.testing.assert_array_equal(np.load(run / "checkpoints" / "rewards.npy"), rewards)
    steps = [line.split(",")[0] for line in (run / "eval.csv").read_text().splitlines()[1:]]
    assert steps == ["100", "200", "300"]


@pytest.mark.slow
def test_a_resumed_run_continues_exactly_where_the_straight_run_goes(tmp_path,
                                                                     pendulum_rollouts):
    from themis.offline.loop import OfflineRun
    from themis.offline.main import prepare, write_config

    keys = {**TINY, "dataset": str(pendulum_rollouts), "reward": "true", "eval_frequency": 150,
            "num_train_steps": 300}
    train_offline(tmp_path / "straight", **keys)
    cfg, out = prepare([f"{k}={v}" for k, v in keys.items() if k != "iql"]
                       + [f"iql.{k}={v}" for k, v in TINY["iql"].items()], tmp_path / "stopped")
    run = OfflineRun(cfg, out)
    write_config(cfg, out)
    run.run(until=200)  # stopped at step 200, as Ctrl-C after a checkpoint leaves it
    train_offline(resume=str(tmp_path / "stopped"))
    for name in ("train.csv", "eval.csv"):
        straight, resumed = (pd.read_csv(tmp_path / run / name).drop(
            columns=["wall_seconds"], errors="ignore") for run in ("straight", "stopped"))
        pd.testing.assert_frame_equal(straight, resumed)
    a, b = (torch.load(tmp_path / run / "checkpoints" / "agent.pt", weights_only=True)["agent"]
            for run in ("straight", "stopped"))
    for key, value in a["actor"].items():
        torch.testing.assert_close(value, b["actor"][key], rtol=0, atol=0)


def test_a_label_file_replaces_the_teacher(tmp_path, pendulum_rollouts):
    data = load_offline_dataset(pendulum_rollouts)
    first, second = np.arange(0, 300, 10), np.arange(5, 305, 10)
    first = first[(first % 100) <= 90]
    second = second[: len(first)]
    second = np.where(second % 100 > 90, second - 10, second)
    returns = [data.rewards[i:i + 10].sum() for i in np.r_[first, second]]
    codes = (np.array(returns[len(first):]) > np.array(returns[:len(first)])).astype(int)
    np.savez(tmp_path / "labels.npz", indices_1=first, indices_2=second, labels=codes,
             segment=10)  # the file's segment length wins over the run's segment=30
    result = train_offline(tmp_path / "run", dataset=str(pendulum_rollouts),
                           labels=str(tmp_path / "labels.npz"), num_train_steps=20,
                           **{**TINY, "eval_frequency": 20, "segment": 30, "reward_net": "pt"})
    rows = pd.read_csv(tmp_path / "run" / "reward.csv")
    assert rows["labels"].tolist() == [len(first)] and result.metrics["step"] == 20
    labelled = (tmp_path / "run" / "preferences" / "labels.csv").read_text().splitlines()
    assert len(labelled) == len(first) + 1 and "labels.npz" in labelled[1]


def test_a_preferences_folder_gives_the_labels(tmp_path, pendulum_rollouts):
    from themis.reward.dataset import PreferenceDataset

    data = load_offline_dataset(pendulum_rollouts)
    pairs = data.sample_segment_pairs(30, 10, np.random.default_rng(0))
    prefs = PreferenceDataset(30, 10, 3, 1)  # as a web-labelled online run saves them
    prefs.add(pairs, np.where(pairs.true_rewards.sum(-1)[:, 1] > pairs.true_rewards.sum(-1)[:, 0],
                              1.0, 0.0), labeler="alice")
    prefs.save(tmp_path / "preferences")
    result = train_offline(tmp_path / "run", dataset=str(pendulum_rollouts),
                           labels=str(tmp_path / "preferences"), num_train_steps=20,
                           **{**TINY, "eval_frequency": 20})
    assert pd.read_csv(tmp_path / "run" / "reward.csv")["labels"].tolist() == [30]
    assert 0 <= result.metrics["heldout_accuracy"] <= 1
    small = PreferenceDataset(1, 10, 2, 1)
    small.add(type(pairs)(pairs.observations[:1, :, :, :2], *(f[:1] for f in pairs[1:])),
              np.zeros(1))
    small.save(tmp_path / "other")
    with pytest.raises(DatasetError, match="observations 2 and actions 1"):
        load_label_file(tmp_path / "other", data, segment=10)


@pytest.mark.parametrize("args, words", [
    (["dataset=DATA", "rewrd=true"], "rewrd is not a key of offline runs (did you mean reward?)"),
    (["dataset=DATA", "reward_net=lstm"], "reward_net=lstm is not one of bpref, pt"),
    (["dataset=DATA", "reward_net=pt", "feed_type=1"], "reward_net=pt picks its queries"),
    (["dataset=/no/such/folder"], "no such file or folder"),
    (["dataset=BAD_nan.npz"], "NaN"),
    (["dataset=BAD_lengths.npz"], "obs has 7 rows; 1 episodes of 2 steps need 3"),
    (["dataset=DATA", "segment=101"], "segment=101: no episode"),
    (["dataset=BAD_empty.npz"], "no episodes"),
    (["dataset=DATA", "labels=BAD_labels.npz"], "crosses an episode"),
])
def test_bad_input_ends_with_one_line_and_exit_code_2(tmp_path, capsys, pendulum_rollouts,
                                                      args, words):
    def imitation(name, obs, acts, rews, terminal):  # imitation's npz layout
        np.savez(tmp_path / f"BAD_{name}.npz", obs=obs, acts=acts, rews=rews,
                 indices=np.zeros(0, np.int64), terminal=np.asarray(terminal))

    imitation("nan", np.full((3, 3), np.nan), np.zeros((2, 1)), np.zeros(2), [True])
    imitation("lengths", np.zeros((7, 3)), np.zeros((2, 1)), np.zeros(2), [True])
    imitation("empty", np.zeros((1, 3)), np.zeros((0, 1)), np.zeros(0), [True])
    np.savez(tmp_path / "BAD_labels.npz", indices_1=[95], indices_2=[0], labels=[1])
    args = [a.replace("DATA", str(pendulum_rollouts)).replace("BAD", str(tmp_path / "BAD"))
            for a in args]
    code = main(["mode=offline", *args, "env=Pendulum-v1", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "r").exists()  # a refused run leaves no folder


def test_the_launcher_hands_mode_offline_and_offline_resumes_to_the_offline_entry_point(
        tmp_path, pendulum_rollouts):
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([str(root / "themis_train.sh"), "mode=offline", "dataset=/no/where",
                           f"hydra.run.dir={tmp_path / 'r'}"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "themis: error: dataset=/no/where: no such file or folder"
    train_offline(tmp_path / "done", dataset=str(pendulum_rollouts), reward="true",
                  num_train_steps=10, **{**TINY, "eval_frequency": 10})
    proc = subprocess.run([str(root / "themis_train.sh"), f"resume={tmp_path / 'done'}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "resuming IQL at step 10" in proc.stdout


def test_a_received_run_folder_is_resumed_only_with_its_dataset_given_again(
        tmp_path, pendulum_rollouts):
    from themis.run.received_config import MARK_FILE

    run = tmp_path / "run"
    train_offline(run, dataset=str(pendulum_rollouts), reward="true", num_train_steps=10,
                  **{**TINY, "eval_frequency": 10})
    with pytest.raises(ConfigError, match="reward_net=pt changes the reward the run learned"):
        train_offline(resume=str(run), reward_net="pt")
    (run / MARK_FILE).unlink()  # as a folder copied from someone else
    with pytest.raises(ConfigError, match="give dataset= again"):
        train_offline(resume=str(run), num_train_steps=20)
    assert train_offline(resume=str(run), dataset=str(pendulum_rollouts),
                         num_train_steps=20).metrics["step"] == 20


@pytest.mark.slow
def test_the_offline_benchmark_records_each_variant_at_a_tiny_size(tmp_path):
    from tests.conftest import load_file

    bench = load_file("benchmarks/bench_offline.py")
    record = tmp_path / "offline.csv"
    assert bench.main(["--quick", "--out", str(tmp_path / "runs"), "--record", str(record)]) == 0
    rows = pd.read_csv(record)
    assert sorted(rows["variant"]) == ["bpref", "pt", "true"]
    assert rows["normalised_return"].notna().all() and rows["commit"].notna().all()
    assert rows[rows["variant"] != "true"]["heldout_accuracy"].between(0, 1).all()
    assert rows["machine"].str.contains("cores").all() and (rows["wall_s"] > 0).all()
    assert rows["command"].str.startswith("python benchmarks/bench_offline.py --quick").all()


def test_help_lists_every_key_with_its_description(capsys):
    assert main(["mode=offline", "--help"]) == 0
    out = capsys.readouterr().out
    assert "reward_net=bpref  # ``bpref``: Themis's Markovian ensemble" in out
    assert "iql.expectile=0.7  # tau of the value's expectile loss" in out


def test_a_sweep_checks_every_job_first_then_runs_each(tmp_path, capsys, pendulum_rollouts):
    common = ["mode=offline", "-m", f"dataset={pendulum_rollouts}", "env=Pendulum-v1",
              "reward=true", "num_train_steps=20", "eval_frequency=20", "num_eval_episodes=1",
              "iql.hidden_dim=16", "iql.batch_size=16"]
    assert main([*common, "seed=0,1", "reward_net=bpref,lstm",
                 f"hydra.run.dir={tmp_path / 'bad'}"]) == 2
    assert "reward_net=lstm is not one of" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # nothing trained, nothing written
    assert main([*common, "seed=0,1", f"hydra.run.dir={tmp_path / 'sweep'}"]) == 0
    seeds = [pd.read_csv(tmp_path / "sweep" / str(n) / "eval.csv") for n in (0, 1)]
    assert [len(s) for s in seeds] == [1, 1]
    assert "seed: 1" in (tmp_path / "sweep" / "1" / "config.yaml").read_text()


def test_a_mujoco_state_is_put_back_from_its_observation():
    from themis.environments.domains import make_env
    from themis.offline.render import left_out_positions, states

    env = make_env("Control", "HalfCheetah-v5", seed=0)
    obs = [env.reset(seed=0)[0]]
    for _ in range(4):
        obs.append(env.step(env.action_space.sample())[0])
    qpos, qvel = states(env, np.array(obs))
    assert left_out_positions(env) == 1 and qpos[0, 0] == 0 and qpos[1, 0] > -1
    for position, velocity, seen in zip(qpos, qvel, obs, strict=True):
        env.unwrapped.set_state(position, velocity)  # the observation it describes, exactly
        np.testing.assert_allclose(env.unwrapped._get_obs(), seen, atol=1e-9)
    with pytest.raises(ConfigError, match="MuJoCo locomotion envs"):
        left_out_positions(make_env("Classic", "Pendulum-v1"))


@pytest.mark.slow
def test_people_label_a_datasets_segments_through_the_label_store(tmp_path):
    """scripts/offline_queries.py posts rendered pairs to a label store; the answers (as the web
    page stores them) become a preference dataset that labels= reads."""
    from tests.conftest import load_file
    from themis.crowd.label_store import LabelStore
    from themis.environments.domains import make_env
    from themis.interpret.rollouts import collect_rollouts, random_policy, save_rollouts

    env = make_env("Control", "HalfCheetah-v5", seed=0)
    save_rollouts(collect_rollouts(env, random_policy(env, 0), 2, seed=0, max_steps=12),
                  tmp_path / "cheetah")
    queries = load_file("scripts/offline_queries.py")
    out = tmp_path / "people"
    assert queries.main([str(tmp_path / "cheetah"), str(out), "--queries", "2", "--segment",
                         "4", "--size", "32", "--domain", "Control"]) == 0
    assert len(list((out / "web" / "clips").glob("offline0000_*.mp4"))) == 2
    store = LabelStore(out / "labels.sqlite", out / "web")
    for query, label in ((1, 1.0), (2, 0.0)):  # what the server does with an accepted answer
        store.answer(query, "alice", label)
    load_file("scripts/store_to_prefs.py").store_to_prefs(out, out / "preferences")
    pairs, labels = load_label_file(out / "preferences", load_offline_dataset(
        tmp_path / "cheetah"), segment=4)
    assert labels.tolist() == [1.0, 0.0] and pairs.observations.shape == (2, 2, 4, 17)
    assert queries.main([str(tmp_path / "cheetah"), str(out), "--queries", "1", "--segment",
                         "4", "--size", "32", "--domain", "Control"]) == 0  # a second round
    assert len(list((out / "web" / "clips").glob("offline0001_*.mp4"))) == 1
