"""A received run folder is data (issue 65): resume, the label store, the label server, the store
tools and the Optuna sweeper take nothing dangerous from a folder someone sent. Every folder and
store here is crafted in the test; servers listen on 127.0.0.1 only."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, launch
from fastapi.testclient import TestClient

from lib.label_server import create_app
from themis.agents.buffers import SegmentPairs
from themis.crowd.label_store import LabelStore, UnsafeStoreError, hash_token
from themis.utils import ConfigError


@pytest.fixture(autouse=True)
def receiver(tmp_path, monkeypatch) -> Path:
    """This test's user: an owner key of their own (the sender has another one)."""
    key = tmp_path / "keys" / "receiver.key"
    monkeypatch.setenv("THEMIS_OWNER_KEY", str(key))
    return key


def as_sender(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("THEMIS_OWNER_KEY", str(tmp_path / "keys" / "sender.key"))


def as_receiver(monkeypatch, receiver) -> None:
    monkeypatch.setenv("THEMIS_OWNER_KEY", str(receiver))


def posted(run: Path, n: int = 3) -> tuple[LabelStore, list[int]]:
    store = LabelStore(run / "labels.sqlite", run / "web")
    rng = np.random.default_rng(0)
    pairs = SegmentPairs(rng.normal(size=(n, 2, 5, 3)).astype(np.float32),
                         rng.uniform(-1, 1, (n, 2, 5, 1)).astype(np.float32),
                         rng.normal(size=(n, 2, 5)).astype(np.float32),
                         np.zeros((n, 2), dtype=np.int64))
    clips = []
    for i in range(n):
        clip = run / "web" / "clips" / f"c{i}.mp4"
        clip.parent.mkdir(parents=True, exist_ok=True)
        clip.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes([i]))
        clips.append(clip)
    return store, store.post(1, pairs, clips)


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, \
        (proc.returncode, proc.stderr[-2000:])
    return lines[0]


# ------------------------------------------------------------------ item 1: tokens
def test_tokens_of_a_received_store_open_nothing_until_the_owner_issues_new_ones(
        tmp_path, monkeypatch, receiver):
    run = tmp_path / "run"
    as_sender(monkeypatch, tmp_path)  # the sender's web run: their labeler and owner tokens
    store, ids = posted(run)
    (_, token), = store.add_labelers(1)
    owner = store.owner_token()
    assert store.labeler_for_token(token) == "labeler1" and store.is_owner_token(owner)
    store.db.execute("INSERT INTO labelers (name, token, created) VALUES ('eve', ?, 0)",
                     (hash_token("planted"),))  # and a hash planted without any mark

    as_receiver(monkeypatch, receiver)  # the folder arrives; the receiver opens it
    received = LabelStore(run / "labels.sqlite", run / "web")
    for given in (token, "planted"):
        assert received.labeler_for_token(given) is None
    assert not received.is_owner_token(owner)
    client = TestClient(create_app(received, run), base_url="http://127.0.0.1")
    for given in (token, "planted", owner):
        assert client.get("/api/next", headers={"X-Themis-Token": given}).status_code == 401
        assert client.post("/api/answers", json={"query_id": ids[0], "label": "left"},
                           headers={"X-Themis-Token": given}).status_code == 401
        assert client.get("/api/status", params={"token": given}).status_code == 401
    assert received.db.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == 0
    # the receiver's run re-issues the labelers it asks for; the new links work
    (name, fresh), = received.add_labelers(1)
    assert fresh and fresh != token and received.labeler_for_token(fresh) == name
    new_owner = received.owner_token()
    assert new_owner and received.is_owner_token(new_owner)
    assert received.add_labelers(1) == [(name, None)]  # issued here now: kept on the next run
    assert client.get("/api/next", headers={"X-Themis-Token": fresh}).status_code == 200


def test_tokens_issued_in_another_folder_are_not_valid_in_a_copy(tmp_path):
    store, _ = posted(tmp_path / "run")
    (_, token), = store.add_labelers(1)
    import shutil

    copy = Path(shutil.copytree(tmp_path / "run", tmp_path / "copy"))  # with its -wal file
    copied = LabelStore(copy / "labels.sqlite")
    assert copied.has_labelers() and copied.labeler_for_token(token) is None
    assert LabelStore(tmp_path / "run" / "labels.sqlite").labeler_for_token(token) == "labeler1"


# ------------------------------------------------------------------ item 1 and 2: resume
def received_run(tmp_path: Path, **settings: str) -> Path:
    """A copied web run folder: its config.yaml (no mark of the receiver's) with ``settings``."""
    run = tmp_path / "received"
    run.mkdir(parents=True)
    lines = ["domain: Classic", "env: Pendulum-v1", "human_teacher: true", "teacher_ui: web",
             *(f"{k}: {v}" for k, v in settings.items())]
    (run / "config.yaml").write_text("\n".join(lines) + "\n")
    return run


def test_check_received_settings_refuses_addresses_paths_and_trackers_of_a_received_config(
        tmp_path):
    from themis.run.received_config import (
        check_received_settings,
        load_received_config,
        mark_config,
    )

    secret = tmp_path / "receivers_notes.txt"
    secret.write_text("the receiver's private notes")
    cases = {
        "label_host": ("0.0.0.0", "label_host=0.0.0.0"),
        "label_port": ("9999", "label_port=9999"),
        "label_instructions": (str(secret), "label_instructions="),
        "logger": ("{mlflow: true, tracking_uri: 'http://127.0.0.1:9/'}", "logger.mlflow=True"),
        "prefs_path": ("/elsewhere/prefs", "prefs_path=/elsewhere/prefs"),
    }
    for key, (value, said) in cases.items():
        run = received_run(tmp_path / key, **{key: value})
        cfg = load_received_config(run / "config.yaml")
        with pytest.raises(ConfigError, match="not yours") as e:
            check_received_settings(cfg, run / "config.yaml")
        assert said in str(e.value) and "on the command line" in str(e.value)
        check_received_settings(cfg, run / "config.yaml", given=[key])  # your own choice
    tracking = received_run(tmp_path / "file_uri", logger=f"{{tracking_uri: 'file:{tmp_path}'}}")
    with pytest.raises(ConfigError, match=r"logger\.tracking_uri"):
        check_received_settings(load_received_config(tracking / "config.yaml"),
                                tracking / "config.yaml")
    # data, not settings: instructions as text, defaults, a path inside the run
    run = received_run(tmp_path / "data", label_instructions="'Prefer the upright one.'")
    (run / "gold").mkdir()
    (run / "config.yaml").write_text((run / "config.yaml").read_text() +
                                     f"gold_path: {run / 'gold'}\nlabel_host: 127.0.0.1\n")
    check_received_settings(load_received_config(run / "config.yaml"), run / "config.yaml")
    # the receiver's own run (marked when written) keeps its settings; an edit drops the mark
    own = received_run(tmp_path / "own", label_host="0.0.0.0")
    mark_config(own)
    check_received_settings(load_received_config(own / "config.yaml"), own / "config.yaml")
    (own / "config.yaml").write_text((own / "config.yaml").read_text() + "label_port: 1\n")
    with pytest.raises(ConfigError, match=r"label_host=0\.0\.0\.0"):
        check_received_settings(load_received_config(own / "config.yaml"), own / "config.yaml")


def test_resuming_a_received_web_run_does_not_listen_beyond_loopback_or_serve_a_local_file(
        tmp_path, monkeypatch, receiver):
    """The attack of issue 65 item 1: a copied run whose config says label_host 0.0.0.0 and
    label_instructions names a file of the receiver's, a token hash planted in its store."""
    secret = tmp_path / "receivers_notes.txt"
    secret.write_text("the receiver's private notes")
    run = received_run(tmp_path, label_host="0.0.0.0", label_port="0", labelers="1",
                       label_instructions=str(secret))
    as_sender(monkeypatch, tmp_path)
    store, _ = posted(run)
    store.add_labelers(1)
    as_receiver(monkeypatch, receiver)
    proc = launch("themis_train.sh", f"resume={run}", timeout=300)
    line = one_line(proc)
    assert "label_host=0.0.0.0" in line and "label_host=127.0.0.1" in line, line
    assert f"label_instructions={secret}" in line and "label_port=0" in line, line
    assert not (run / "web" / "server.json").exists()  # no server was started
    proc = launch("themis_train.sh", f"resume={run}", "label_host=127.0.0.1", timeout=300)
    line = one_line(proc)  # passed explicitly: no longer refused, the others still are
    assert "label_host" not in line and "label_instructions=" in line, line


def test_resuming_a_received_run_does_not_send_your_tracking_token_to_its_server(tmp_path):
    run = received_run(tmp_path, logger="{mlflow: true, tracking_uri: 'http://127.0.0.1:9/'}")
    line = one_line(launch("themis_train.sh", f"resume={run}", timeout=300))
    assert "logger.mlflow=True" in line and "logger.mlflow=false" in line, line


# ------------------------------------------------------------------ item 3: no SQL runs
ATTACKS = {
    "trigger deleting answers": "CREATE TRIGGER wipe AFTER INSERT ON answers "
                                "BEGIN DELETE FROM answers; END",
    "trigger flipping labels": "CREATE TRIGGER flip AFTER INSERT ON answers "
                               "BEGIN UPDATE answers SET label = 1 - label WHERE id = new.id; END",
    "view": "CREATE VIEW every_answer AS SELECT * FROM answers",
    "extra table": "CREATE TABLE notes (x TEXT)",
    "expression index": "CREATE INDEX flipped ON answers (1 - label)",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_store_with_sql_of_its_own_is_refused_by_the_run_the_server_and_the_tools(
        tmp_path, attack):
    run = tmp_path / "run"
    store, ids = posted(run)
    store.answer(ids[0], "local", 0.0)
    db = sqlite3.connect(run / "labels.sqlite")
    db.execute(ATTACKS[attack])
    db.commit()
    db.close()
    with pytest.raises(UnsafeStoreError, match="may not run SQL"):
        LabelStore(run / "labels.sqlite", run / "web")
    line = one_line(run_script("store_to_prefs.py", str(run), str(tmp_path / "out")))
    assert "may not run SQL" in line and not (tmp_path / "out" / "meta.json").exists()
    assert "may not run SQL" in one_line(run_script("label_server.py", str(run), "--port", "0"))
    from themis.crowd.audit import load_answers

    with pytest.raises(UnsafeStoreError):
        load_answers(run / "labels.sqlite")
    labels = sqlite3.connect(run / "labels.sqlite").execute("SELECT label FROM answers")
    assert [r[0] for r in labels] == [0.0]  # nothing ran on the stored answer


def test_a_table_redefined_to_replace_answers_on_conflict_is_refused(tmp_path):
    """``UNIQUE ... ON CONFLICT REPLACE`` would let a new answer delete an accepted one."""
    path = tmp_path / "labels.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""CREATE TABLE answers (id INTEGER PRIMARY KEY, query_id INTEGER NOT NULL,
        labeler TEXT NOT NULL, label REAL, created REAL NOT NULL,
        UNIQUE (query_id) ON CONFLICT REPLACE);""")
    db.close()
    with pytest.raises(UnsafeStoreError, match=r"table 'answers'.*not as Themis defines it"):
        LabelStore(path)


def test_a_web_run_on_a_store_with_a_trigger_ends_with_one_line(compose, tmp_path):
    from types import SimpleNamespace

    from themis.feedback.factory import make_label_store

    store, _ = posted(tmp_path)
    store.db.execute(ATTACKS["trigger deleting answers"])
    cfg = compose(["human_teacher=true", "teacher_ui=web"])
    with pytest.raises(ConfigError, match="trigger 'wipe'"):
        make_label_store(SimpleNamespace(cfg=cfg, run_dir=tmp_path))


def test_stores_of_every_earlier_schema_still_open(tmp_path):
    """A store of the first version (no gold, oracle, rating_classes, issuer columns) and one
    of the last: both are Themis's own and open (and get the new columns)."""
    from themis.crowd.label_store import SCHEMA

    old = tmp_path / "old.sqlite"
    db = sqlite3.connect(old)
    db.executescript(SCHEMA)
    db.close()
    store = LabelStore(old)
    columns = {r[1] for r in store.db.execute("PRAGMA table_info(queries)")}
    assert {"gold", "oracle", "rating_classes"} <= columns
    LabelStore(old)  # and again, migrated


# ------------------------------------------------------------------ item 9
def test_a_refused_run_removes_only_the_folders_it_created(tmp_path):
    mine = tmp_path / "mine"  # the user's folders, made beforehand and empty
    mine.mkdir()
    empty_run = tmp_path / "empty_run"
    empty_run.mkdir()
    bad = ["domain=Classic", "env=Pendulum-v1", "max_feedback=-1"]
    assert "max_feedback" in one_line(launch("themis_train.sh", *bad,
                                             f"hydra.run.dir={mine / 'run'}", timeout=300))
    assert mine.is_dir() and not (mine / "run").exists()  # the run's own folder went
    one_line(launch("themis_train.sh", *bad, f"hydra.run.dir={empty_run}", timeout=300))
    assert empty_run.is_dir() and not any(empty_run.iterdir())  # kept, without Hydra's files
    new = tmp_path / "new" / "deeper" / "run"
    one_line(launch("themis_train.sh", *bad, f"hydra.run.dir={new}", timeout=300))
    assert not (tmp_path / "new").exists()  # created by the run: removed


# ------------------------------------------------------------------ item 4: Optuna sweeps
class FakeLauncher:
    """Records the jobs a sweeper launches; each returns ``value``."""

    def __init__(self, value: float = 1.0) -> None:
        self.jobs: list[list[str]] = []
        self.value = value

    def launch(self, jobs, initial_job_idx):
        from types import SimpleNamespace

        self.jobs += [list(j) for j in jobs]
        return [SimpleNamespace(return_value=self.value) for _ in jobs]


def sweeper_in(sweep: Path, **kwargs):
    import optuna
    from omegaconf import OmegaConf

    optuna.logging.disable_default_handler()  # its stream would be an earlier test's stderr

    from hydra_plugins.themis_optuna_sweeper.optuna_sweeper import ThemisOptunaSweeper

    sweeper = ThemisOptunaSweeper(n_trials=kwargs.pop("n_trials", 2), n_jobs=1, **kwargs)
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    sweeper.launcher = FakeLauncher()
    return sweeper


SEARCH = ["reward_lr=interval(0.0001, 0.003)"]


def study_in(sweep: Path, direction: str = "maximize"):
    import optuna

    sweep.mkdir(parents=True, exist_ok=True)
    return optuna.create_study(study_name="themis", direction=direction,
                               storage=f"sqlite:///{sweep / 'optuna.db'}", load_if_exists=True)


def refused(sweeper, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        sweeper.sweep(SEARCH)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("themis: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err  # (and Optuna's own log lines)
    return lines[0]


def test_an_enqueued_trial_outside_the_search_space_is_refused_before_any_job(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    study_in(sweep).enqueue_trial({"reward_lr": 1e6})  # planted in the received optuna.db
    sweeper = sweeper_in(sweep)
    line = refused(sweeper, capsys)
    assert "enqueued trial #0" in line and "reward_lr=1000000.0" in line, line
    assert sweeper.launcher.jobs == []
    ok = tmp_path / "ok"
    study_in(ok).enqueue_trial({"reward_lr": 0.001})  # inside: the user's own enqueued trial
    sweeper = sweeper_in(ok)
    sweeper.sweep(SEARCH)
    assert sweeper.launcher.jobs[0] == ["reward_lr=0.001"] and len(sweeper.launcher.jobs) == 2


def test_a_stored_trial_outside_the_space_or_another_direction_is_refused(tmp_path, capsys):
    import optuna

    sweep = tmp_path / "sweep"
    study = study_in(sweep)
    study.add_trial(optuna.trial.create_trial(  # a fake "best" trial far outside the space
        params={"reward_lr": 5.0}, distributions={
            "reward_lr": optuna.distributions.FloatDistribution(1.0, 10.0)}, value=1e9))
    assert "stored trial #0" in refused(sweeper_in(sweep), capsys)
    minimize = tmp_path / "minimize"
    study_in(minimize, "minimize")
    line = refused(sweeper_in(minimize), capsys)
    assert "stored to minimize, not to maximize" in line, line
    sweeper = sweeper_in(minimize, direction="minimize")  # said explicitly: continued
    sweeper.sweep(SEARCH)
    assert len(sweeper.launcher.jobs) == 2


def test_a_stored_trial_of_infinite_value_is_refused(tmp_path, capsys):
    """Issue 85 item 11: a trial stored with +inf was reported as the best one."""
    import optuna

    sweep = tmp_path / "sweep"
    study = study_in(sweep)
    study.add_trial(optuna.trial.create_trial(
        params={"reward_lr": 0.001}, distributions={
            "reward_lr": optuna.distributions.FloatDistribution(1e-4, 3e-3)},
        value=float("inf")))
    line = refused(sweeper_in(sweep), capsys)
    assert "stored trial #0" in line and "inf" in line, line


def test_a_symlinked_job_folder_is_refused(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (sweep / "0").symlink_to(outside)
    sweeper = sweeper_in(sweep)
    assert "0 is a symlink" in refused(sweeper, capsys)
    assert sweeper.launcher.jobs == [] and not any(outside.iterdir())


def test_an_optuna_db_that_is_not_sqlite_is_one_line(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "optuna.db").write_bytes(b"not a database at all" * 100)
    assert "not an Optuna study" in refused(sweeper_in(sweep), capsys)


# ------------------------------------------------------------------ items 6-8: received files
def reannounce(npz: Path, member: str, shape: tuple[int, ...]) -> None:
    """Rewrite ``member``'s ``.npy`` header in ``npz`` to announce ``shape`` (data unchanged)."""
    import io
    import zipfile

    with zipfile.ZipFile(npz) as z:
        members = {name: z.read(name) for name in z.namelist()}
    raw = io.BytesIO(members[member])
    version = np.lib.format.read_magic(raw)
    header = np.lib.format.read_array_header_1_0(raw) if version == (1, 0) else \
        np.lib.format.read_array_header_2_0(raw)
    out = io.BytesIO()
    np.lib.format.write_array_header_2_0(out, {"descr": np.lib.format.dtype_to_descr(header[2]),
                                               "fortran_order": header[1], "shape": shape})
    members[member] = out.getvalue() + raw.read()
    with zipfile.ZipFile(npz, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def sb3_zip(path: Path, state: dict, data: bytes = b"{}", compression: int = 0) -> Path:
    import io
    import zipfile

    import torch

    blob = io.BytesIO()
    torch.save(state, blob)
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr("data", data)
        z.writestr("policy.pth", blob.getvalue())
    return path


def sac_state(**override) -> dict:
    import torch

    state = {"actor.latent_pi.0.weight": torch.zeros(8, 3), "actor.latent_pi.0.bias":
             torch.zeros(8), "actor.mu.weight": torch.zeros(1, 8), "actor.mu.bias": torch.zeros(1),
             "critic.qf0.0.weight": torch.zeros(8, 4)}
    return {**state, **override}


def patch_zip(path: Path, name: bytes, offset_local: int, offset_central: int,
              value: bytes) -> None:
    """Overwrite a field of ``name``'s local header and central-directory entry."""
    raw = bytearray(path.read_bytes())
    for signature, offset in ((b"PK\x03\x04", offset_local), (b"PK\x01\x02", offset_central)):
        at = 0
        while (at := raw.find(signature, at)) >= 0:
            name_at = at + (30 if signature == b"PK\x03\x04" else 46)
            if raw[name_at:name_at + len(name)] == name:
                raw[at + offset:at + offset + len(value)] = value
            at += 4
    path.write_bytes(bytes(raw))


def test_crafted_sb3_zips_are_one_line_errors(tmp_path):
    import torch

    from themis.agents.sb3 import read_sb3_zip

    assert read_sb3_zip(sb3_zip(tmp_path / "ok.zip", sac_state())).algorithm == "TD3/DDPG"
    encrypted = sb3_zip(tmp_path / "encrypted.zip", sac_state())
    patch_zip(encrypted, b"policy.pth", 6, 8, b"\x01\x00")  # general-purpose flag: encrypted
    method99 = sb3_zip(tmp_path / "method99.zip", sac_state())
    patch_zip(method99, b"policy.pth", 8, 10, b"\x63\x00")  # compression method 99 (AES)
    corrupt = sb3_zip(tmp_path / "corrupt.zip", sac_state(), compression=8)
    raw = bytearray(corrupt.read_bytes())
    start = raw.find(b"policy.pth") + len(b"policy.pth") + 40
    raw[start:start + 64] = bytes(64)  # the deflate stream, zeroed in the middle
    corrupt.write_bytes(bytes(raw))
    nan = sb3_zip(tmp_path / "nan.zip", sac_state(**{"actor.mu.weight":
                                                      torch.full((1, 8), float("nan"))}))
    stride0 = sb3_zip(tmp_path / "stride0.zip", sac_state(**{
        "actor.latent_pi.0.weight": torch.zeros(1).expand(30000, 30000)}))
    assert stride0.stat().st_size < 10_000  # a small file announcing 3.6 GB of weights
    for path, words in ((encrypted, "encrypted"), (method99, "compression"),
                        (corrupt, "Stable-Baselines3"), (nan, "NaN"), (stride0, "stride 0")):
        with pytest.raises(ValueError, match=words) as e:
            read_sb3_zip(path)
        assert "\n" not in str(e.value)
    deep = sb3_zip(tmp_path / "deep.zip", sac_state(), data=b"[" * 200_000 + b"]" * 200_000)
    assert read_sb3_zip(deep).data == {}  # JSON nested too deep: plain data ignored


def test_a_small_reward_model_file_with_stride_0_weights_is_refused_before_expanding(tmp_path):
    import torch

    from themis.core.safe_loading import UnsafeFileError, safe_load
    from themis.reward import load_reward_model

    path = tmp_path / "reward_model.pt"
    torch.save({"config": {"obs_dim": 3}, "state_dict": {
        "0.weight": torch.zeros(1).expand(40000, 40000)}}, path)
    assert path.stat().st_size < 10_000
    with pytest.raises(UnsafeFileError, match="stride 0"):
        safe_load(path)
    with pytest.raises(ValueError, match="stride 0"):
        load_reward_model(str(path))


def tiny_rollouts(folder: Path, obs: np.ndarray | None = None) -> Path:
    from themis.interpret.rollouts import Rollouts, save_rollouts

    rng = np.random.default_rng(0)
    lengths = np.array([5, 5])
    rollouts = Rollouts(rng.normal(size=(12, 3)).astype(np.float32) if obs is None else obs,
                        rng.normal(size=(10, 1)).astype(np.float32),
                        rng.normal(size=10).astype(np.float32), np.zeros(10, bool),
                        np.zeros(10, bool), lengths, np.zeros(2, np.int64),
                        np.zeros(2, np.int64), {}, {"env": "Pendulum-v1",
                                                    "action_space": {"type": "Box",
                                                                     "shape": [1]}})
    save_rollouts(rollouts, folder)
    return folder


def test_crafted_rollouts_are_one_line_errors(tmp_path):
    import json
    import zipfile

    from themis.interpret.rollouts import RolloutFormatError, load_rollouts, save_rollouts

    bomb = tiny_rollouts(tmp_path / "bomb")
    reannounce(bomb / "rollouts.npz", "obs.npy", (10**12, 3))
    zero_d = tiny_rollouts(tmp_path / "zero_d")
    with zipfile.ZipFile(zero_d / "rollouts.npz") as z:
        arrays = {n[:-4]: np.load(z.open(n)) for n in z.namelist()}
    np.savez(zero_d / "rollouts.npz", **{**arrays, "rews": np.float32(1.0)})
    deep = tiny_rollouts(tmp_path / "deep")
    (deep / "meta.json").write_text("[" * 200_000 + "]" * 200_000)
    space = tiny_rollouts(tmp_path / "space")
    meta = json.loads((space / "meta.json").read_text())
    (space / "meta.json").write_text(json.dumps({**meta, "action_space": "Discrete(3)"}))
    single = tmp_path / "single.npy"
    np.save(single, np.zeros(4, np.float32))
    raw = bytearray(single.read_bytes())
    single.write_bytes(bytes(raw).replace(b"(4,)", b"(1000000000000,)", 1))
    for folder, words in ((bomb, "refused before allocating"), (zero_d, "0-d"),
                          (deep, "nested too deeply"), (space, "action_space"),
                          (single, "refused before allocating")):
        with pytest.raises(RolloutFormatError, match=words) as e:
            load_rollouts(folder)
        assert "\n" not in str(e.value)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        save_rollouts(load_rollouts(tiny_rollouts(tmp_path / "fine")), tmp_path / "a_file")
    nan_obs = np.random.default_rng(0).normal(size=(12, 3)).astype(np.float32)
    nan_obs[3, 1] = np.nan
    line = one_line(run_script("supervised_reward.py", str(tiny_rollouts(tmp_path / "nan",
                                                                         nan_obs)),
                               str(tmp_path / "out"), "--epochs", "1"))
    assert "NaN" in line and not (tmp_path / "out").exists()
    assert "action_space" in one_line(run_script("supervised_reward.py", str(space),
                                                 str(tmp_path / "out2")))


def test_store_to_prefs_refuses_an_npy_header_bomb_and_nan_segments(tmp_path):
    run = tmp_path / "run"
    store, ids = posted(run, n=2)
    for qid in ids:
        store.answer(qid, "local", 1.0)
    segments = run / "web" / "queries" / f"q_{ids[0]:06d}.npz"
    reannounce(segments, "observations.npy", (10**12, 5, 3))
    assert "refused before allocating" in one_line(run_script("store_to_prefs.py", str(run),
                                                              str(tmp_path / "out")))
    with np.load(run / "web" / "queries" / f"q_{ids[1]:06d}.npz") as data:
        arrays = dict(data)
    arrays["observations"][0, 0, 0] = np.nan
    np.savez(segments, **arrays)  # the first query now holds NaN observations
    assert "NaN" in one_line(run_script("store_to_prefs.py", str(run), str(tmp_path / "out")))
    assert not (tmp_path / "out" / "meta.json").exists()


def saved_prefs(folder: Path, **meta) -> Path:
    import json

    from themis.reward import PreferenceDataset

    rng = np.random.default_rng(0)
    data = PreferenceDataset(4, 5, 3, 1)
    data.add(SegmentPairs(rng.normal(size=(4, 2, 5, 3)).astype(np.float32),
                          rng.normal(size=(4, 2, 5, 1)).astype(np.float32),
                          rng.normal(size=(4, 2, 5)).astype(np.float32),
                          np.zeros((4, 2), np.int64)), np.array([0, 1, 0, 1], np.float32))
    data.save(folder)
    if meta:
        saved = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(json.dumps({**saved, **meta}))
    return folder


def test_train_reward_refuses_a_bad_obs_shape_and_a_file_as_output_in_one_line(tmp_path):
    from themis.online.offline import train_reward_model

    for shape in ("abc", 3, [2, 2]):
        prefs = saved_prefs(tmp_path / f"prefs_{shape}", obs_shape=shape)
        with pytest.raises(ConfigError, match="obs_shape"):
            train_reward_model(prefs, tmp_path / "out")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ConfigError, match="cannot be the output folder"):
        train_reward_model(saved_prefs(tmp_path / "prefs"), tmp_path / "a_file")
    strings = saved_prefs(tmp_path / "strings")
    with np.load(strings / "segments.npz") as data:
        arrays = dict(data)
    arrays["observations"] = np.full(arrays["observations"].shape, "a")
    np.savez(strings / "segments.npz", **arrays)
    with pytest.raises(ConfigError, match="not numbers"):
        train_reward_model(strings, tmp_path / "out")


def test_a_shard_list_that_reads_one_file_many_times_is_refused(tmp_path):
    from themis.reward import PreferenceDataset

    prefs = saved_prefs(tmp_path / "prefs", num_pairs=4000,
                        shards=[["segments.npz", 4 * i, 4 * i + 4] for i in range(1000)])
    with pytest.raises(ValueError, match="cover the pairs once"):
        PreferenceDataset.load(prefs)


def test_summarize_refuses_a_yaml_tag_in_one_line(tmp_path):
    import pandas as pd

    run = tmp_path / "sweep" / "0"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- !!python/object/apply:os.system ['true']\n")
    pd.DataFrame({"step": [1], "episode_reward": [0.0], "total_feedback": [0]}).to_csv(
        run / "eval.csv", index=False)
    assert "not plain YAML" in one_line(run_script("summarize.py", str(tmp_path / "sweep")))


def test_the_wrapper_refuses_a_received_run_s_settings_a_yaml_tag_and_an_unwritable_run_dir(
        tmp_path, monkeypatch):
    import gymnasium as gym

    from themis import PreferenceLearningWrapper

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("segment: 20\nlabel_host: 0.0.0.0\n")
    (run / "online.yaml").write_text("warmup_reward: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="not readable as plain YAML"):
        PreferenceLearningWrapper(gym.make("Pendulum-v1"), run, resume=True)
    (run / "online.yaml").write_text("warmup_reward: zero\n")
    with pytest.raises(ConfigError, match=r"label_host=0\.0\.0\.0.*not yours"):
        PreferenceLearningWrapper(gym.make("Pendulum-v1"), run, resume=True)

    def unwritable(self):
        raise PermissionError(13, "Permission denied")

    from themis.online.online_reward import OnlineReward

    monkeypatch.setattr(OnlineReward, "write_config", unwritable)
    with pytest.raises(ConfigError, match="cannot be written"):
        PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path / "new")


def test_a_full_disk_mid_run_ends_with_one_line_not_a_traceback(compose, tmp_path, monkeypatch,
                                                                capsys):
    """Issue 65, item 6: ENOSPC while the run writes its checkpoints is one line and exit 1,
    naming the step and how to continue (checkpoints and labels are written atomically)."""
    import errno

    from tests.conftest import TINY_PENDULUM
    from themis.builder import make_workspace
    from themis.cli.train import run_or_stop
    from themis.run.workspace import Workspace

    ws = make_workspace(compose([*TINY_PENDULUM, "torch_threads=1"]), tmp_path / "run")

    def full(self: Workspace) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.run_dir / "eval.csv"))

    monkeypatch.setattr(Workspace, "save_checkpoints", full)
    with pytest.raises(SystemExit) as stop:
        run_or_stop(ws, "./themis_train.sh")
    assert stop.value.code == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "disk is full" in err and "resume=" in err
    assert "Traceback" not in err


def alias_bomb(levels: int = 8) -> str:
    """A config.yaml of nested YAML aliases: a few hundred bytes, 10⁸ nodes expanded."""
    lines = ["seed: 0", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for n in range(1, levels + 1):
        lines.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def test_a_config_of_nested_yaml_aliases_is_refused_at_once_by_every_reader(tmp_path):
    """Issue 85 item 1: ``resume=`` and ``themis.load_run`` hung expanding them."""
    import time

    import themis
    from themis.core.safe_loading import UnsafeFileError, check_yaml_file

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(alias_bomb())
    assert len(alias_bomb()) < 1000
    with pytest.raises(UnsafeFileError, match="YAML aliases"):
        check_yaml_file(run / "config.yaml")
    start = time.monotonic()
    with pytest.raises(ValueError, match="YAML aliases"):
        themis.load_run(run)
    assert time.monotonic() - start < 5
    resumed = launch("themis_train.sh", f"resume={run}", timeout=60)
    assert resumed.returncode == 2
    assert "YAML aliases" in resumed.stderr and resumed.stderr.strip().count("\n") == 0
    fifo = tmp_path / "fifo.yaml"
    import os

    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="not a regular file"):
        check_yaml_file(fifo)  # a FIFO would block the reader


@pytest.mark.parametrize("text", ["!!python/object:os.system {}\n", "- a\n- b\n", "a: [\n"],
                         ids=["tag", "list", "broken"])
def test_load_run_of_a_config_that_is_no_mapping_is_a_value_error(tmp_path, text):
    """Issue 85 item 6: ConstructorError or AssertionError, where ValueError is promised."""
    import themis

    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ValueError, match="config"):
        themis.load_run(tmp_path)


# ---------------------------------------------------------------- issue 85 items 2 and 10
def nan_reward_model(folder: Path) -> Path:
    import torch

    from themis.reward import RewardEnsemble
    from themis.reward.ensemble import save_reward_model

    model = RewardEnsemble(3, 1, 2, hidden_dim=8, hidden_depth=1)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    (folder / "checkpoints").mkdir(parents=True)
    return save_reward_model(model, folder / "checkpoints" / "reward_model.pt")


def test_a_reward_model_with_nan_weights_is_refused_by_every_loader(tmp_path):
    """Issue 85 item 2: through the DRLHP wrapper 400 of 400 rewards were NaN."""
    import gymnasium as gym

    from themis.online.drlhp import HumanPreferencesEnvWrapper
    from themis.reward import load_reward_model

    path = nan_reward_model(tmp_path / "run")
    with pytest.raises(ValueError, match="NaN") as e:
        load_reward_model(path)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="NaN"):
        HumanPreferencesEnvWrapper(gym.make("Pendulum-v1"), synthetic_prefs=True,
                                   pretrained_reward_predictor_dir=str(tmp_path / "run"),
                                   collect_prefs=False, train_reward=False,
                                   log_dir=str(tmp_path / "wrapped"))


def test_inspection_refuses_an_agent_with_nan_weights(tmp_path):
    """``inspect_reward.py`` played the saved agent and exited 0 on NaN weights."""
    import torch

    from themis.interpret.inspection import load_run

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("domain: Classic\nenv: Pendulum-v1\n")
    torch.save({"agent": nan_agent(), "step": 5}, run / "checkpoints" / "agent.pt")
    with pytest.raises(ValueError, match="NaN"):
        load_run(run, out_dir=tmp_path / "out")


def nan_agent() -> dict:
    import torch

    return {"actor": {"w": torch.tensor([0.5, float("nan")])}, "log_alpha": torch.zeros(())}


def test_an_agent_with_nan_weights_is_refused_by_load_run_resume_and_snapshots(
        compose, tmp_path):
    import hashlib

    import torch

    import themis
    from tests.conftest import TINY_PENDULUM
    from themis.builder import make_workspace

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("domain: Classic\nenv: Pendulum-v1\n")
    torch.save({"agent": nan_agent(), "step": 5}, run / "checkpoints" / "agent.pt")
    with pytest.raises(ValueError, match=r"agent\.actor\.w holds NaN"):
        themis.load_run(run)
    with pytest.raises(ConfigError, match=r"pretrained_snapshot: .*NaN"):
        make_workspace(compose([*TINY_PENDULUM, "pretrained_snapshot="
                                f"{run / 'checkpoints' / 'agent.pt'}"]), tmp_path / "new")
    ckpt = tmp_path / "resumed" / "checkpoints"
    ckpt.mkdir(parents=True)
    torch.save({"env": "Pendulum-v1", "step": 0, "agent": nan_agent()}, ckpt / "state.pt")
    digest = hashlib.sha256((ckpt / "state.pt").read_bytes()).hexdigest()
    (ckpt / "state.pt.sha256").write_text(f"{digest}  state.pt\n")
    with pytest.raises(ConfigError, match=r"resume: .*NaN"):
        make_workspace(compose([*TINY_PENDULUM, "resume=true"]), tmp_path / "resumed")


def test_a_zip_bomb_policy_is_refused_from_the_zip_directory_before_inflating(tmp_path):
    """Issue 85 item 10: a 1 MB zip holding a 1 GiB policy.pth cost 2.3 GB and 30 s."""
    import time
    import zipfile

    from themis.agents.sb3 import read_sb3_zip

    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("data", b"{}")
        z.writestr("policy.pth", bytes(64 << 20))  # 64 MiB of zeros: ~64 KB deflated
    assert path.stat().st_size < 1 << 20
    start = time.monotonic()
    with pytest.raises(ValueError, match="zip bomb") as e:
        read_sb3_zip(path)
    assert time.monotonic() - start < 1.0 and "\n" not in str(e.value)


# ---------------------------------------------------------------- issue 85: hidden cases
YAML_ATOMS = ["a", "1", "-2.5e3", "null", "~", "true", "'q'", '"d"', "&x a", "*x", "*nope",
              "!!python/object:os.system {}", "!!binary aGk=", "!custom 1", "[", "]", "{", "}",
              "'", "- ", "? ", ": ", "<<: *x", "${oc.env:HOME}", "%YAML 1.1", "---", "...",
              "@", "`", "\t", "\x00", "é"]


def _yaml_documents():
    from hypothesis import strategies as st

    atoms = st.one_of(st.sampled_from(YAML_ATOMS), st.text(max_size=8))
    nested = st.recursive(
        atoms, lambda children: st.one_of(
            st.lists(children, max_size=5).map(lambda xs: "[" + ", ".join(xs) + "]"),
            st.dictionaries(st.from_regex(r"[a-z_]{1,6}", fullmatch=True), children,
                            max_size=5).map(
                lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}")),
        max_leaves=40)
    deep = st.integers(1, 20_000).map(lambda n: "a: " + "[" * n + "]" * n)
    bombs = st.tuples(st.integers(1, 12), st.integers(2, 12)).map(
        lambda dw: "a0: &a0 [x]\n" + "".join(
            f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * dw[1])}]\n" for i in range(1, dw[0])))
    return st.one_of(nested.map(lambda v: f"env: {v}\nseed: {v}\n"), deep, bombs,
                     st.lists(nested, max_size=6).map("\n".join))


def test_any_received_config_yaml_is_read_or_refused_in_one_line_within_5_s():
    """Random YAML nesting, aliases, tags, resolvers and bytes as a received run's config.yaml:
    ``themis.load_run`` reads it or raises one ValueError line, always within 5 s."""
    import tempfile
    import time

    from hypothesis import HealthCheck, example, given, settings

    import themis

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_yaml_documents())
    @example("0\n").via("a lone scalar: OmegaConf raised OSError")
    @example("x\n").via("a lone word: read as {x: None}")
    def check(text: str) -> None:
        with tempfile.TemporaryDirectory() as folder:
            run = Path(folder)
            (run / "config.yaml").write_text(text, errors="surrogateescape")
            start = time.monotonic()
            try:
                themis.load_run(run)
            except ValueError as e:
                assert str(e) and "\n" not in str(e).strip(), repr(e)
            assert time.monotonic() - start < 5.0

    check()


def test_a_received_alias_bomb_of_any_size_ends_resume_with_one_line_and_exit_2(tmp_path):
    """The launcher's side of the property above, once per kind (a launch takes seconds)."""
    import time

    for name, text in (("bomb", "a0: &a0 [x]\n" + "".join(
            f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))),
            ("deep", "env: " + "[" * 50_000 + "]" * 50_000 + "\n")):
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text(text)
        start = time.monotonic()
        proc = launch("themis_train.sh", f"resume={run}", timeout=60)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
        assert proc.stderr.startswith("themis: error: ")
        assert time.monotonic() - start < 30  # a launch, not a hang (the reader: < 5 s above)


def test_any_bytes_in_the_quick_check_cache_are_ignored_within_5_s(monkeypatch):
    """Random bytes and random JSON in ``keys-*.json`` / ``envs-*.json``: the quick check
    reads nothing it cannot trust, never raises, answers 0 or 2 at once."""
    import json
    import os
    import tempfile
    import time

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from themis.cli import key_check

    values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6)),
                          lambda c: st.one_of(st.lists(c, max_size=4),
                                              st.dictionaries(st.text(max_size=6), c,
                                                              max_size=4)), max_leaves=20)
    keys = st.sampled_from([*key_check.INDEX_KEYS, "x"])
    documents = st.one_of(
        st.binary(max_size=3000),
        st.dictionaries(keys, values, max_size=8).map(lambda d: json.dumps(d).encode()))

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(documents, st.sampled_from([["seed=1"], ["domain=DMC", "env=walker_wlak"],
                                       ["sac.hiden_dim=8"], ["teacher=nosy"]]))
    def check(data: bytes, argv: list[str]) -> None:
        with tempfile.TemporaryDirectory() as folder:
            index, envs = Path(folder) / "keys.json", Path(folder) / "envs.json"
            for path in (index, envs):
                path.write_bytes(data)
                os.chmod(path, 0o644)
            monkeypatch.setattr(key_check, "index_path", lambda: index)
            monkeypatch.setattr(key_check, "env_lists_path", lambda: envs)
            start = time.monotonic()
            assert key_check.main(["themis.cli.train", *argv]) in (0, 2)
            assert time.monotonic() - start < 5.0

    check()
