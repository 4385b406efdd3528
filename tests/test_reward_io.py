"""Using a reward model outside Themis: saved datasets, checkpoints, the gymnasium wrapper,
TensorBoard logs and training a Stable-Baselines3 agent on a learned reward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ROOT, TINY_PENDULUM

import themis
from themis.agents.buffers import SegmentPairs
from themis.environments.domains import make_env
from themis.reward import PreferenceDataset, RewardEnsemble, load_reward_model, save_reward_model
from themis.reward.dataset import FORMAT_VERSION
from themis.reward.wrapper import LearnedRewardWrapper
from themis.run.closing import finish


def random_pairs(n: int, segment: int = 4, obs_dim: int = 3, action_dim: int = 1,
                 seed: int = 0) -> SegmentPairs:
    rng = np.random.default_rng(seed)
    return SegmentPairs(rng.normal(size=(n, 2, segment, obs_dim)).astype(np.float32),
                        rng.uniform(-1, 1, size=(n, 2, segment, action_dim)).astype(np.float32),
                        rng.normal(size=(n, 2, segment)).astype(np.float32),
                        np.zeros((n, 2), dtype=np.int64))


def filled_dataset(n: int = 6, seed: int = 0, labeler: str = "oracle") -> PreferenceDataset:
    data = PreferenceDataset(10, 4, 3, 1, metadata={"env": "Pendulum-v1"})
    labels = np.resize(np.array([0.0, 1.0, 0.5], dtype=np.float32), n)
    data.add(random_pairs(n, seed=seed), labels, labeler=labeler)
    return data


# ------------------------------------------------------------------ preference datasets
def test_dataset_save_load_round_trips_exactly(tmp_path):
    data = filled_dataset()
    data.save(tmp_path / "prefs", metadata={"teacher": "oracle"})
    assert sorted(p.name for p in (tmp_path / "prefs").iterdir()) == [
        "labels.csv", "meta.json", "segments.npz"]
    meta = json.loads((tmp_path / "prefs" / "meta.json").read_text())
    assert meta["format_version"] == 2 and meta["num_pairs"] == 6
    assert meta["env"] == "Pendulum-v1" and meta["teacher"] == "oracle"
    assert pd.read_csv(tmp_path / "prefs" / "labels.csv").columns.tolist() == [
        "pair", "label", "labeler", "timestamp"]

    loaded = PreferenceDataset.load(tmp_path / "prefs", capacity=20)
    assert len(loaded) == 6 and loaded.capacity == 20
    np.testing.assert_allclose(loaded.timestamps[:6], data.timestamps[:6], atol=1e-3)
    for name in ("observations", "actions", "true_rewards", "labels"):
        np.testing.assert_array_equal(getattr(loaded, name)[:6], getattr(data, name)[:6])
    assert loaded.labelers[:6].tolist() == ["oracle"] * 6
    assert loaded.metadata["teacher"] == "oracle"
    # labelling continues after a load
    loaded.add(random_pairs(2, seed=5), np.array([1.0, 0.0]), labeler="person")
    assert len(loaded) == 8


def test_dataset_load_reads_only_the_pairs_meta_promises(tmp_path):
    """A crash after segments.npz/labels.csv but before meta.json leaves a readable dataset."""
    data = filled_dataset(n=4)
    data.save(tmp_path / "prefs")
    meta = (tmp_path / "prefs" / "meta.json").read_text()
    data.add(random_pairs(2, seed=9), np.array([1.0, 1.0]))
    data.save(tmp_path / "prefs")
    (tmp_path / "prefs" / "meta.json").write_text(meta)  # the older meta.json survived
    assert len(PreferenceDataset.load(tmp_path / "prefs")) == 4


def test_dataset_of_a_newer_format_is_refused(tmp_path):
    filled_dataset().save(tmp_path / "prefs")
    meta_file = tmp_path / "prefs" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta["format_version"] = FORMAT_VERSION + 1
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="upgrade Themis"):
        PreferenceDataset.load(tmp_path / "prefs")
    with pytest.raises(FileNotFoundError, match="not a preference dataset"):
        PreferenceDataset.load(tmp_path)


def test_merge_prefs_script(tmp_path):
    filled_dataset(n=3, seed=1, labeler="alice").save(tmp_path / "a")
    filled_dataset(n=5, seed=2, labeler="").save(tmp_path / "b")
    script = ROOT / "scripts" / "merge_prefs.py"
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "m"), str(tmp_path / "a"),
                           str(tmp_path / "b")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    merged = PreferenceDataset.load(tmp_path / "m")
    assert len(merged) == 8
    assert merged.labelers[:8].tolist() == ["alice"] * 3 + [str(tmp_path / "b")] * 5
    np.testing.assert_array_equal(merged.observations[3:8],
                                  PreferenceDataset.load(tmp_path / "b").observations[:5])

    other = PreferenceDataset(4, 7, 3, 1)  # another segment length
    other.add(random_pairs(1, segment=7), np.array([1.0]))
    other.save(tmp_path / "c")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "m2"), str(tmp_path / "a"),
                           str(tmp_path / "c")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "cannot merge" in proc.stderr


def test_merge_prefs_refuses_to_overwrite_an_existing_out_without_force(tmp_path):
    filled_dataset(n=3, seed=1, labeler="alice").save(tmp_path / "a")
    filled_dataset(n=5, seed=2, labeler="bob").save(tmp_path / "b")
    script = ROOT / "scripts" / "merge_prefs.py"

    def merge(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                              text=True, cwd=ROOT)

    proc = merge(str(tmp_path / "a"), str(tmp_path / "b"))  # OUT = a: 3 pairs would become 5
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "holds a preference dataset" in proc.stderr and "--force" in proc.stderr
    assert len(PreferenceDataset.load(tmp_path / "a")) == 3  # untouched
    proc = merge(str(tmp_path / "a"), str(tmp_path / "a"), str(tmp_path / "b"), "--force")
    assert proc.returncode == 0, proc.stderr
    assert len(PreferenceDataset.load(tmp_path / "a")) == 8


# -------------------------------------------------------------- reward-model checkpoints
def test_reward_model_save_load_round_trip(tmp_path):
    model = RewardEnsemble(3, 1, ensemble_size=2, hidden_dim=16, hidden_depth=2)
    (tmp_path / "checkpoints").mkdir()
    save_reward_model(model, tmp_path / "checkpoints" / "reward_model.pt", env="Pendulum-v1")
    loaded = themis.load_reward_model(tmp_path)  # a run dir works, as does the file
    assert loaded.env_id == "Pendulum-v1" and not loaded.training
    obs, act = np.random.rand(5, 3).astype(np.float32), np.random.rand(5, 1).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, act), model.predict(obs, act))
    with pytest.raises(FileNotFoundError, match="no reward-model checkpoint"):
        load_reward_model(tmp_path / "nowhere")


# ------------------------------------------------------------------ the gym wrapper
class HalfSum(RewardEnsemble):
    """A reward model with a known answer: r̂(s, a) = sum(s) / 2 + a (for checking the wrapper)."""

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        r = obs.sum(-1) / 2 + action[..., 0]
        return r.expand(self.ensemble_size, *r.shape)


def test_wrapper_returns_model_reward_and_keeps_true_reward():
    model = HalfSum(3, 1, ensemble_size=2, hidden_dim=4)
    env = LearnedRewardWrapper(make_env("Classic", "Pendulum-v1"), model)
    reference = make_env("Classic", "Pendulum-v1")
    obs, _ = env.reset(seed=3)
    ref_obs, _ = reference.reset(seed=3)
    assert env.using_predicted_reward
    for t in range(6):
        action = np.array([0.5 - 0.2 * t], dtype=np.float32)
        expected = float(obs.sum() / 2 + action[0])
        obs, reward, *_, info = env.step(action)
        ref_obs, true_reward, *_ = reference.step(action)
        if t <= 2:
            assert reward == pytest.approx(expected, abs=1e-5)
        assert info["true_reward"] == pytest.approx(float(true_reward))
        np.testing.assert_array_equal(obs, ref_obs)
        if t == 2:
            env.switch_to_true_reward()
            assert not env.using_predicted_reward
        if t >= 3:  # pass-through; the prediction still goes to info
            assert reward == info["true_reward"]
            assert info["predicted_reward"] == pytest.approx(expected, abs=1e-5)
    env.switch_to_predicted_reward()
    obs_before = obs
    _, reward, *_ = env.step(np.array([0.0], dtype=np.float32))
    assert reward == pytest.approx(float(obs_before.sum() / 2), abs=1e-5)


def test_wrapper_normalizes_with_running_statistics():
    model = HalfSum(3, 1, ensemble_size=1, hidden_dim=4)
    env = LearnedRewardWrapper(make_env("Classic", "Pendulum-v1", seed=0), model, normalize=True)
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)
    raw, normalized = [], []
    for _ in range(300):
        action = env.action_space.sample()
        raw.append(env.predicted_reward(np.asarray(obs, dtype=np.float32), action))
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
        normalized.append(reward)
        # each reward is standardised by the running statistics of every raw reward so far
        if len(raw) > 1:  # (the first one meets the statistics' tiny prior count)
            expected = (raw[-1] - np.mean(raw)) / (np.std(raw) + 1e-8)
            assert reward == pytest.approx(expected, rel=1e-3, abs=1e-3)
        assert info["predicted_reward"] == reward
    assert env.reward_stats.count > 299
    assert env.reward_stats.mean == pytest.approx(np.mean(raw), rel=1e-4)
    assert env.reward_stats.std == pytest.approx(np.std(raw), rel=1e-3)


def test_wrapper_rejects_a_model_for_other_shapes():
    with pytest.raises(ValueError, match="obs_dim=17"):
        LearnedRewardWrapper(make_env("Classic", "Pendulum-v1"), RewardEnsemble(17, 6))


def test_sb3_sac_trains_on_a_wrapped_env_with_a_loaded_model(tmp_path):
    from stable_baselines3 import SAC

    save_reward_model(RewardEnsemble(3, 1, ensemble_size=2, hidden_dim=16), tmp_path / "r.pt")
    env = LearnedRewardWrapper(make_env("Classic", "Pendulum-v1", seed=0),
                               load_reward_model(tmp_path / "r.pt"))
    model = SAC("MlpPolicy", env, learning_starts=100, batch_size=32, seed=0, device="cpu",
                policy_kwargs={"net_arch": [32, 32]})
    model.learn(total_timesteps=300)
    assert model.num_timesteps == 300 and model._n_updates > 0
    # SB3 saw the learned reward: its replay buffer holds r̂(s, a), not Pendulum's reward
    n = model.replay_buffer.pos
    stored = model.replay_buffer.rewards[:n, 0]
    obs = model.replay_buffer.observations[:n, 0]
    actions = model.replay_buffer.actions[:n, 0]
    expected = env.reward_model.predict(obs, actions)
    np.testing.assert_allclose(stored, expected, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- logging
def test_tensorboard_scalars_beside_the_csvs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from themis.run.logger import Logger

    logger = Logger(tmp_path, backends=["csv", "tensorboard"])
    logger.eval.write({"step": 100, "episode_reward": -5.0, "total_feedback": 20})
    logger.eval.write({"step": 200, "episode_reward": 7.5, "total_feedback": 40})
    logger.close()
    assert pd.read_csv(tmp_path / "eval.csv")["episode_reward"].tolist() == [-5.0, 7.5]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("eval/episode_reward")
    assert [(s.step, s.value) for s in scalars] == [(100, -5.0), (200, 7.5)]
    with pytest.raises(ValueError, match="unknown backend 'wandb'"):
        Logger(tmp_path, backends=["csv", "wandb"])


# ---------------------------------------------------------------- prefs_path in a run
@pytest.mark.slow
def test_prefs_path_trains_the_reward_model_from_saved_labels(tmp_path, compose):
    from themis.builder import make_workspace

    first = make_workspace(compose(TINY_PENDULUM), tmp_path / "first")
    first.run()
    finish(first)
    saved = tmp_path / "first" / "preferences"
    assert len(PreferenceDataset.load(saved)) == 30
    rounds = pd.read_csv(tmp_path / "first" / "reward.csv")
    assert {"heldout_accuracy", "heldout_pearson", "heldout_spearman"} <= set(rounds.columns)
    assert rounds["heldout_spearman"].iloc[1:].notna().all()  # from round 2 on

    second = make_workspace(compose([*TINY_PENDULUM, f"prefs_path={saved}", "max_feedback=0",
                                "reward_update=200"]), tmp_path / "second")
    data = second.learner.dataset
    untrained = second.learner.trainer.accuracy(data.observations[:30], data.actions[:30],
                                               data.labels[:30])
    second.run()
    finish(second)
    assert second.total_feedback == 0 and len(second.learner.dataset) == 30
    trained = second.learner.trainer.accuracy(data.observations[:30], data.actions[:30],
                                             data.labels[:30])
    assert trained >= 0.9 and trained >= untrained + 0.2  # fitted to the saved labels
    reloaded = PreferenceDataset.load(tmp_path / "second" / "preferences")
    np.testing.assert_array_equal(reloaded.labels[:30], second.learner.dataset.labels[:30])


def test_saved_labels_alone_train_the_reward_model_once(tmp_path, compose):
    from themis.builder import make_workspace

    first = make_workspace(compose(TINY_PENDULUM), tmp_path / "first")
    first.run(until=first.cfg.pretrain_end + 1)  # one round: its labels are saved at once
    saved = tmp_path / "first" / "preferences"
    second = make_workspace(compose([*TINY_PENDULUM, f"prefs_path={saved}", "max_feedback=0"]),
                            tmp_path / "second")
    fits = []
    train = second.learner.trainer.train
    second.learner.trainer.train = lambda *a, **kw: (fits.append(len(a[0])), train(*a, **kw))[1]
    second.run(until=second.cfg.pretrain_end + 1)
    assert second.pretraining_done and fits == [10]  # not once more before the first round

@pytest.mark.parametrize("override,message", [
    ("prefs_path=/nonexistent/prefs", "not a preference dataset"),
    ("segment=10", "set segment=4"),
])
def test_prefs_path_errors(tmp_path, compose, override, message):
    from themis.builder import make_workspace
    from themis.utils import ConfigError

    dataset = PreferenceDataset(4, 4, 3, 1)
    dataset.add(random_pairs(2), np.array([1.0, 0.0]))
    dataset.save(tmp_path / "prefs")
    overrides = [*TINY_PENDULUM, f"prefs_path={tmp_path / 'prefs'}", override]
    with pytest.raises(ConfigError, match=message):
        make_workspace(compose(overrides), tmp_path / "run")


def test_themis_exports_the_public_api():
    assert themis.LearnedRewardWrapper is LearnedRewardWrapper
    assert themis.load_reward_model is load_reward_model
    assert Path(themis.__file__).parent.name == "themis"


def test_train_with_reward_script_reports_true_returns(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text("domain: Classic\nenv: Pendulum-v1\nseed: 0\n")
    save_reward_model(RewardEnsemble(3, 1, ensemble_size=2, hidden_dim=16),
                      tmp_path / "checkpoints" / "reward_model.pt", env="Pendulum-v1")
    script = ROOT / "scripts" / "train_with_reward.py"
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), "--steps", "300",
                           "--episodes", "1", "--normalize"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "THEMIS_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "[learned reward] 300/300 steps" in proc.stdout  # progress while SB3 trains
    assert lines[-2].startswith("| random policy")
    assert lines[-1].startswith("| SB3 SAC on learned reward")
    # a true Pendulum return (about -1000 per 200-step episode for a poor policy), not a sum
    # of 200 tanh-bounded learned rewards (>= -200)
    assert float(lines[-1].split("|")[2]) < -200
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "missing")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and "config.yaml not found" in proc.stderr


def test_incremental_saves_append_shards_and_compact(tmp_path):
    from themis.reward.dataset import MAX_SHARDS

    rng = np.random.default_rng(0)
    data = PreferenceDataset(100, 4, 3, 2)
    folder = tmp_path / "prefs"
    for i in range(MAX_SHARDS + 3):  # one answer at a time, as a person gives them
        pair = SegmentPairs(rng.standard_normal((1, 2, 4, 3), dtype=np.float32),
                            rng.standard_normal((1, 2, 4, 2), dtype=np.float32),
                            rng.standard_normal((1, 2, 4), dtype=np.float32),
                            np.zeros((1, 2), dtype=np.int64))
        data.add(pair, np.array([i % 2], dtype=np.float32), labeler="human:ann")
        data.save(folder)
        loaded = PreferenceDataset.load(folder)
        assert len(loaded) == i + 1
        np.testing.assert_array_equal(loaded.observations[: i + 1], data.observations[: i + 1])
        np.testing.assert_array_equal(loaded.labels[: i + 1], data.labels[: i + 1])
    meta = json.loads((folder / "meta.json").read_text())
    files = sorted(p.name for p in folder.glob("segments*.npz"))
    assert len(meta["shards"]) <= MAX_SHARDS
    assert files == sorted(name for name, _, _ in meta["shards"])  # compaction removed the rest
    assert meta["shards"][0][:2] == ["segments.npz", 0] and meta["shards"][0][2] > MAX_SHARDS // 2
    assert list(loaded.labelers[:3]) == ["human:ann"] * 3


def test_version_1_datasets_without_shards_or_timestamps_still_load(tmp_path):
    data = filled_dataset()
    folder = data.save(tmp_path / "prefs")
    meta = json.loads((folder / "meta.json").read_text())
    meta["format_version"] = 1
    del meta["shards"]
    (folder / "meta.json").write_text(json.dumps(meta))
    labels = pd.read_csv(folder / "labels.csv").drop(columns="timestamp")
    labels.to_csv(folder / "labels.csv", index=False)
    loaded = PreferenceDataset.load(folder)
    np.testing.assert_array_equal(loaded.observations[:6], data.observations[:6])
    np.testing.assert_array_equal(loaded.labels[:6], data.labels[:6])
    assert np.isnan(loaded.timestamps[:6]).all()


# ---------------------------------------------------------- datasets received from others
def _saved_dataset(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    data = PreferenceDataset(4, 4, 3, 2)
    data.add(SegmentPairs(rng.standard_normal((4, 2, 4, 3), dtype=np.float32),
                          rng.standard_normal((4, 2, 4, 2), dtype=np.float32),
                          rng.standard_normal((4, 2, 4), dtype=np.float32),
                          np.zeros((4, 2), np.int64)), np.array([0, 1, 0.5, 1], np.float32))
    return data.save(folder)


def _edit_meta(folder: Path, **changes) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    (folder / "meta.json").write_text(json.dumps(meta))


def _edit_label(folder: Path, value: str) -> None:
    labels = (folder / "labels.csv").read_text().splitlines()
    first = labels[1].split(",")
    labels[1] = ",".join([first[0], value, *first[2:]])
    (folder / "labels.csv").write_text("\n".join(labels) + "\n")


def _edit_labels_csv(folder: Path, drop: str) -> None:
    labels = pd.read_csv(folder / "labels.csv")
    labels.drop(columns=[drop]).to_csv(folder / "labels.csv", index=False)


def _announce_elements(npz: Path, count: int) -> None:
    """Rewrite the ``actions`` array's ``.npy`` header in ``npz`` to announce ``count`` rows
    (the data stays as it is)."""
    import io
    import zipfile

    with zipfile.ZipFile(npz) as z:
        members = {name: z.read(name) for name in z.namelist()}
    raw = io.BytesIO(members["actions.npy"])
    version = np.lib.format.read_magic(raw)
    header = np.lib.format.read_array_header_1_0(raw) if version == (1, 0) else \
        np.lib.format.read_array_header_2_0(raw)
    out = io.BytesIO()
    np.lib.format.write_array_header_2_0(out, {"descr": np.lib.format.dtype_to_descr(header[2]),
                                               "fortran_order": header[1],
                                               "shape": (count, *header[0][1:])})
    members["actions.npy"] = out.getvalue() + raw.read()
    with zipfile.ZipFile(npz, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


@pytest.mark.parametrize("tamper,message", [
    (lambda f: _edit_label(f, "nan"), r"label 'nan' in row 1; preference labels are 0, 0.5 or 1"),
    (lambda f: _edit_label(f, "7.0"), r"label '7.0' in row 1"),
    (lambda f: _edit_meta(f, shards=[["../../outside.npz", 0, 4]]), "is not a file name in"),
    (lambda f: _edit_meta(f, shards="segments.npz"), "shards must be a list"),
    (lambda f: _edit_meta(f, num_pairs=None), "field 'num_pairs' is missing"),
    (lambda f: _edit_meta(f, obs_dim=5), "meta.json says segment=4, obs_dim=5"),
    (lambda f: (f / "segments.npz").write_bytes((f / "segments.npz").read_bytes()[:200]),
     "not a readable segment shard"),
    (lambda f: (f / "segments.npz").write_bytes(b"not a zip at all" * 10),
     "not a readable segment shard"),
    (lambda f: (f / "meta.json").write_text("{truncated"), "is not JSON"),
    # issue 33 item 13: these were tracebacks
    (lambda f: _edit_meta(f, format_version=[2]), r"field .format_version. is \[2\], not an "
                                                  "integer >= 1"),
    (lambda f: (f / "meta.json").write_text((f / "meta.json").read_text().replace(
        '"format_version": 2', '"format_version": 1e999')), "field 'format_version' is inf"),
    (lambda f: (f / "meta.json").write_text("[" * 100_000 + "]" * 100_000), "is not JSON"),
    (lambda f: _edit_labels_csv(f, drop="label"), "column 'label' is missing"),
    (lambda f: _edit_labels_csv(f, drop="labeler"), "column 'labeler' is missing"),
    (lambda f: _edit_meta(f, shards=[["segments.npz", [0], 4]]), "shards must be a list of"),
    (lambda f: _edit_meta(f, shards=[["segments.npz", 0, 4], "segments.npz"]),
     "shards must be a list of"),
    (lambda f: _announce_elements(f / "segments.npz", 10**12), "refused before allocating"),
], ids=["nan-label", "label-7", "shard-outside", "shards-type", "no-num_pairs",
        "obs_dim", "truncated-zip", "not-a-zip", "bad-json", "version-list", "version-1e999",
        "deep-json", "no-label-column", "no-labeler-column", "shard-list-in-row",
        "shard-row-not-list", "npy-10**12"])
def test_a_tampered_dataset_is_refused_with_one_line(tmp_path, tamper, message):
    folder = _saved_dataset(tmp_path / "prefs")
    (tmp_path / "outside.npz").write_bytes((folder / "segments.npz").read_bytes())
    tamper(folder)
    with pytest.raises(ValueError, match=message):
        PreferenceDataset.load(folder)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "merge_prefs.py"),
                           str(tmp_path / "merged"), str(folder)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "merged").exists()
