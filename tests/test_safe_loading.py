"""Files people exchange load without running code: a crafted pickle is refused, with one line,
at every entry point (snapshot, resume checkpoint, a run's agent.pt, reward model, dataset)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TINY_PENDULUM
from themis.builder import make_workspace
from themis.core.safe_loading import UnsafeFileError, safe_load
from themis.utils import ConfigError


class Payload:
    """Pickles as a call of ``Path.touch(marker)``: loading it with pickle creates the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def crafted(path: Path, marker: Path, **fields) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"env": "Pendulum-v1", "step": 0, "agent": Payload(marker), **fields}, path)
    return path


def test_a_crafted_pickle_would_run_code_and_safe_load_refuses_it(tmp_path):
    marker = tmp_path / "ran"
    path = crafted(tmp_path / "x.pt", marker)
    torch.load(path, weights_only=False)  # the danger is real: plain pickle runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(UnsafeFileError, match="refused: it needs "):
        safe_load(path)
    assert not marker.exists()
    (tmp_path / "random.pt").write_bytes(np.random.default_rng(0).bytes(1000))
    with pytest.raises(UnsafeFileError, match="not a readable PyTorch file"):
        safe_load(tmp_path / "random.pt")


def test_plain_data_with_numpy_arrays_loads(tmp_path):
    state = {"w": torch.ones(3), "a": np.arange(4, dtype=np.float32), "n": np.float64(2.5),
             "rng": np.random.get_state(), "g": np.random.default_rng(0).bit_generator.state,
             "flags": np.zeros(2, bool), "list": [1, "two", 3.0],
             "empty": np.zeros((0, 3), np.uint8)}
    torch.save(state, tmp_path / "ok.pt")
    back = safe_load(tmp_path / "ok.pt")
    np.testing.assert_array_equal(back["a"], state["a"])
    assert back["n"] == 2.5 and back["list"] == [1, "two", 3.0]


def test_a_crafted_snapshot_is_refused_before_training(compose, tmp_path):
    marker = tmp_path / "ran"
    snap = crafted(tmp_path / "snapshot.pt", marker)
    with pytest.raises(ConfigError, match=r"pretrained_snapshot: .* was refused"):
        make_workspace(compose([*TINY_PENDULUM, f"pretrained_snapshot={snap}"]),
                       tmp_path / "run")
    assert not marker.exists()


def test_a_crafted_checkpoint_with_its_checksum_is_refused(compose, tmp_path):
    marker = tmp_path / "ran"
    ckpt = tmp_path / "run" / "checkpoints"
    state = crafted(ckpt / "state.pt", marker)
    digest = hashlib.sha256(state.read_bytes()).hexdigest()
    (ckpt / "state.pt.sha256").write_text(f"{digest}  state.pt\n")  # whoever sent it, sent this
    with pytest.raises(ConfigError, match=r"resume: .* was refused"):
        make_workspace(compose([*TINY_PENDULUM, "resume=true"]), tmp_path / "run")
    assert not marker.exists()


def test_a_run_folder_with_a_crafted_agent_is_refused_by_inspection(tmp_path):
    from themis.interpret.inspection import load_run

    marker = tmp_path / "ran"
    run = tmp_path / "run"
    crafted(run / "checkpoints" / "agent.pt", marker)
    (run / "config.yaml").write_text("domain: Classic\nenv: Pendulum-v1\n")
    with pytest.raises(UnsafeFileError, match="was refused"):
        load_run(run, out_dir=tmp_path / "out")
    assert not marker.exists()


def test_reward_models_and_datasets_refuse_pickles(tmp_path):
    from themis.reward import PreferenceDataset, load_reward_model

    marker = tmp_path / "ran"
    path = crafted(tmp_path / "reward_model.pt", marker)
    with pytest.raises(Exception):  # noqa: B017 - torch's own refusal
        load_reward_model(path)
    assert not marker.exists()
    data = PreferenceDataset(2, 3, 2, 1)
    folder = data.save(tmp_path / "prefs")
    (folder / "segments.npz").unlink()
    np.savez(folder / "segments.npz", observations=np.array([Payload(marker)], dtype=object))
    with pytest.raises(ValueError):
        PreferenceDataset.load(folder)
    assert not marker.exists()


def test_renamed_files_are_synced_with_their_directory(tmp_path, monkeypatch):
    """A rename survives a power loss only once the directory is synced: checkpoints, datasets
    and query segments sync theirs."""
    import themis.utils
    from themis.crowd.label_store import LabelStore
    from themis.reward import PreferenceDataset
    from themis.run.checkpoint import save_checkpoint

    synced: list[Path] = []
    real = themis.utils.fsync_dir
    monkeypatch.setattr(themis.utils, "fsync_dir", lambda p: (synced.append(Path(p)), real(p)))
    import themis.crowd.label_store
    monkeypatch.setattr(themis.crowd.label_store, "fsync_dir", themis.utils.fsync_dir)

    save_checkpoint({"step": 1}, tmp_path / "checkpoints")
    assert tmp_path / "checkpoints" in synced
    data = PreferenceDataset(2, 3, 2, 1)
    rng = np.random.default_rng(0)
    from themis.agents.buffers import SegmentPairs
    pairs = SegmentPairs(rng.normal(size=(1, 2, 3, 2)).astype(np.float32),
                         np.zeros((1, 2, 3, 1), np.float32), np.zeros((1, 2, 3), np.float32),
                         np.zeros((1, 2), np.int64))
    data.add(pairs, np.array([1.0]))
    data.save(tmp_path / "prefs")
    assert tmp_path / "prefs" in synced
    store = LabelStore(tmp_path / "labels.sqlite", tmp_path / "web")
    store.post(1, pairs, [tmp_path / "clip.mp4"])
    assert tmp_path / "web" / "queries" in synced
