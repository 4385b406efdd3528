"""Experiment trackers (logger=wandb, logger=mlflow): each against its real local backend, read
back through the tracker's own API; a tracker that fails costs one warning, never the run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, TINY_PENDULUM, launch

from themis.tracking import RunFiles, RunInfo, TrackingHub, pick_clips
from themis.tracking.hub import metrics_of, read_state

# clips of explained queries (xplain_action) so that the run has some to upload
CLIPS = ["xplain_action=true", "xplain_clips_per_round=2", "human_frame_size=64"]


def finished_rows(csv: Path) -> list[tuple[int, float]]:
    frame = pd.read_csv(csv)
    return list(zip(frame["step"].astype(int), frame["episode_reward"], strict=True))


# ------------------------------------------------------------------ the hub, without a tracker
class FakeTracker:
    NAME = "fake"

    def __init__(self, fail_after: int | None = None, slow: float = 0.0) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.fail_after, self.slow, self.status = fail_after, slow, None

    def start(self, info, previous):
        self.previous = previous
        return {"run_id": "r1"}

    def log_metrics(self, rows):
        time.sleep(self.slow)
        if self.fail_after is not None and len(self.rows) >= self.fail_after:
            raise ConnectionError("Connection refused\nmore lines")
        self.rows += rows

    def log_files(self, files, step):
        self.files = files

    def finish(self, status):
        self.status = status

    def describe(self):
        return "fake run r1"


def test_a_row_becomes_its_finite_numbers_at_its_step():
    step, metrics = metrics_of("train", {"step": 400, "phase": "unsup", "episode_reward": -3.5,
                                         "actor_loss": float("nan"), "episode": 2})
    assert step == 400 and metrics == {"train/episode_reward": -3.5, "train/episode": 2.0}
    assert metrics_of("train", {"episode": 1}) is None


@pytest.mark.xdist_group("busy")  # times the close
def test_a_tracker_that_fails_mid_run_costs_one_warning_and_nothing_else(tmp_path):
    warnings: list[str] = []
    tracker = FakeTracker(fail_after=2)
    hub = TrackingHub([tracker], RunInfo(tmp_path, {}, "run"), warnings.append, 10)
    for step in range(0, 1000, 100):
        hub.log_row("eval", {"step": step, "episode_reward": float(step)})
        time.sleep(0.01)
    start = time.monotonic()
    hub.close("FINISHED", RunFiles())
    assert time.monotonic() - start < 5  # a failed tracker is not waited for
    failures = [w for w in warnings if "failed" in w]
    assert len(failures) == 1 and "fake failed (ConnectionError: Connection refused)" in \
        failures[0] and "the run goes on without it" in failures[0]
    assert tracker.status is None and not hub.active  # nothing sent after the failure
    assert read_state(tmp_path) == {"fake": {"run_id": "r1"}}


@pytest.mark.xdist_group("busy")  # times the close
def test_a_slow_tracker_is_left_behind_after_the_finish_timeout(tmp_path):
    warnings: list[str] = []
    hub = TrackingHub([FakeTracker(slow=3.0)], RunInfo(tmp_path, {}, "run"), warnings.append,
                      finish_timeout=0.5)
    hub.log_row("eval", {"step": 1, "episode_reward": 1.0})
    start = time.monotonic()
    hub.close("FINISHED")
    assert time.monotonic() - start < 2
    assert any("did not finish within 0 s" in w or "did not finish within 1 s" in w
               for w in warnings)


def test_rows_reach_the_tracker_in_order_and_resume_reads_the_stored_id(tmp_path):
    tracker = FakeTracker()
    hub = TrackingHub([tracker], RunInfo(tmp_path, {}, "run"), lambda _: None)
    for step in (1, 2, 3):
        hub.log_row("train", {"step": step, "x": step})
    hub.close("FINISHED", RunFiles(curve=tmp_path / "c.png"))
    assert [s for s, _ in tracker.rows] == [1, 2, 3] and tracker.status == "FINISHED"
    again = FakeTracker()
    TrackingHub([again], RunInfo(tmp_path, {}, "run", resume=True), lambda _: None).close()
    assert again.previous == {"run_id": "r1"}
    (tmp_path / "tracking.json").write_text('{"fake": {"run_id": ["not", "text"]}, "x": 3}')
    assert read_state(tmp_path) == {"fake": {}}  # a received run folder is not trusted


def test_a_few_clips_spread_over_the_run(tmp_path):
    (tmp_path / "queries").mkdir()
    for i in range(10):
        (tmp_path / "queries" / f"query_{i:06d}.mp4").write_bytes(b"x")
    assert [p.name for p in pick_clips(tmp_path, 3)] == \
        ["query_000000.mp4", "query_000004.mp4", "query_000009.mp4"]
    assert pick_clips(tmp_path, 0) == [] and len(pick_clips(tmp_path, 20)) == 10


def test_logger_group_keeps_csv_and_tensorboard_and_old_run_configs_still_load(compose, tmp_path):
    from themis.run.received_config import load_received_config

    cfg = compose(["logger=[wandb,mlflow]", "logger.project=p"])
    assert (cfg.logger.tensorboard, cfg.logger.wandb, cfg.logger.mlflow) == (True, True, True)
    assert compose(["logger=[csv,tensorboard]"]).logger.tensorboard
    assert not compose().logger.tensorboard and not compose().logger.wandb
    old = tmp_path / "config.yaml"  # a run saved before the logger group: logger: [...]
    old.write_text("seed: 3\nlogger:\n- csv\n- tensorboard\n")
    loaded = load_received_config(old)
    assert loaded.logger.tensorboard and not loaded.logger.mlflow and loaded.seed == 3


def test_an_unknown_logger_is_one_line_and_exit_2():
    proc = launch("themis_train.sh", "logger=neptune")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("themis: error: logger=neptune is unknown; available: csv, "
                                   "mlflow, tensorboard, wandb")


# ------------------------------------------------------------------ MLflow
def mlflow_client(uri: str):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def check_mlflow_run(client, run_dir: Path) -> str:
    """The tracked run has the config, every CSV row at its step, the tags and the files."""
    run_id = json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["env"] == "Pendulum-v1" and run.data.params["sac.hidden_dim"] == "32"
    assert run.data.tags["themis.run_dir"] == str(run_dir.resolve())
    assert run.data.tags["themis.hydra_job_id"]
    for stream in ("train", "eval", "reward"):
        rows = pd.read_csv(run_dir / f"{stream}.csv")
        history = client.get_metric_history(run_id, f"{stream}/total_feedback")
        assert [m.step for m in history] == rows["step"].tolist(), stream
    history = client.get_metric_history(run_id, "eval/episode_reward")
    assert [(m.step, pytest.approx(m.value, abs=1e-5)) for m in history] == \
        finished_rows(run_dir / "eval.csv")
    return run_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 (SQLite store, proxied artifacts) in its own
    process group; :meth:`stop` ends the group."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.log = (folder / "server.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
             str(self.port), "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
             "--artifacts-destination", str(folder / "artifacts"), "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        import urllib.request

        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mlflow server did not start: {self.log.name}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture
def mlflow_server(tmp_path, isolated_home):
    server = MlflowServer(tmp_path)
    yield server
    server.stop()


@pytest.mark.slow
def test_mlflow_server_gets_the_run_and_a_server_gone_mid_run_costs_one_warning(
        tmp_path, mlflow_server):
    run_dir = tmp_path / "run"
    proc = launch("themis_train.sh", *TINY_PENDULUM, "logger=mlflow",
                  f"logger.tracking_uri={mlflow_server.uri}", "logger.report=false",
                  f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    client = mlflow_client(mlflow_server.uri)
    run_id = check_mlflow_run(client, run_dir)
    assert [a.path for a in client.list_artifacts(run_id)] == ["learning_curve.png"]

    # a longer run; the server goes away after the first evaluation reached it
    second = tmp_path / "second"
    cmd = [str(ROOT / "themis_train.sh"), *TINY_PENDULUM, "num_train_steps=4000",
           "logger=mlflow", f"logger.tracking_uri={mlflow_server.uri}",
           f"hydra.run.dir={second}"]
    out = (tmp_path / "second.log").open("w")
    training = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "THEMIS_THREADS": "1"})
    try:
        deadline = time.monotonic() + 300
        while True:
            state = read_state(second).get("mlflow", {})
            if state.get("run_id") and client.get_metric_history(state["run_id"],
                                                                 "eval/episode_reward"):
                break
            assert training.poll() is None, (tmp_path / "second.log").read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        mlflow_server.stop()
        assert training.wait(timeout=300) == 0
    finally:
        if training.poll() is None:
            training.kill()
        out.close()
    lines = (tmp_path / "second.log").read_text().splitlines()
    assert len([line for line in lines if line.startswith("tracking: mlflow failed")]) == 1
    assert not [line for line in lines if "Traceback" in line]
    assert pd.read_csv(second / "eval.csv")["step"].iloc[-1] == 4000  # the run went on


# ------------------------------------------------------------------ W&B
def wandb_records(offline_dir: Path) -> list[dict]:
    """The records of an offline run's transaction log, read by W&B's own reader."""
    proc = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect",
                           "--json", str(offline_dir)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def history(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(int(r["history"]["step"].get("num", 0)), r["history"]["item"][key])
            for r in records if r["type"] == "history" and key in r["history"]["item"]]


@pytest.mark.slow
def test_mlflow_and_wandb_get_config_rows_files_and_resume_continues_the_runs(
        tmp_path, isolated_home):
    """``logger=[mlflow,wandb]``: a local MLflow store and an offline W&B run, each read back
    through the tracker's own API, get the config, every CSV row at its step, the tags, the
    learning curve, the report and three clips; a resume continues the same tracked runs."""
    uri = f"file:{tmp_path / 'mlruns'}"
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "THEMIS_THREADS": "1",
           "WANDB_CACHE_DIR": str(tmp_path / "cache"), "WANDB_DATA_DIR": str(tmp_path / "data"),
           "WANDB_CONFIG_DIR": str(tmp_path / "config")}
    cmd = [str(ROOT / "themis_train.sh"), *TINY_PENDULUM, *CLIPS, "logger=[mlflow,wandb]",
           f"logger.tracking_uri={uri}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "tracking: MLflow run" in proc.stdout and "failed" not in proc.stdout
    assert (run_dir / "tensorboard").is_dir()  # TensorBoard stays on
    # MLflow
    client = mlflow_client(uri)
    mlflow_id = check_mlflow_run(client, run_dir)
    files = {a.path for a in client.list_artifacts(mlflow_id)}
    assert {"learning_curve.png", "report", "clips"} <= files
    assert "report/report.md" in {a.path for a in client.list_artifacts(mlflow_id, "report")}
    clips = [a.path for a in client.list_artifacts(mlflow_id, "clips")]
    assert len(clips) == 3 and all(c.endswith(".mp4") for c in clips)
    # W&B
    run_id = json.loads((run_dir / "tracking.json").read_text())["wandb"]["run_id"]
    assert f"tracking: W&B run {run_id} offline" in proc.stdout
    (first,) = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    records = wandb_records(first)
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["run_id"] == run_id and run["project"] == "themis"
    config = run["config"]["update"]
    assert config["env"] == "Pendulum-v1" and config["sac"]["hidden_dim"] == 32
    assert run_dir.name in run["tags"] and any(t.startswith("job:") for t in run["tags"])
    assert history(records, "eval/episode_reward") == [
        (s, pytest.approx(r, abs=1e-5)) for s, r in finished_rows(run_dir / "eval.csv")]
    for stream in ("train", "reward"):
        steps = [s for s, _ in history(records, f"{stream}/total_feedback")]
        assert steps == pd.read_csv(run_dir / f"{stream}.csv")["step"].tolist(), stream
    media = first / "files" / "media"
    assert list(media.rglob("learning_curve_*.png")) and len(list(media.rglob("*.mp4"))) == 3
    artifact = next(r["artifact"] for r in records if r["type"] == "artifact")
    paths = {c["path"] for c in artifact["manifest"]["contents"]}
    assert artifact["type"] == "run-report" and {"learning_curve.png",
                                                 "report/report.md"} <= paths
    assert next(r for r in records if r["type"] == "exit")["exit"]["exit_code"] == 0

    proc = subprocess.run([str(ROOT / "themis_train.sh"), f"resume={run_dir}",
                           "num_train_steps=1800", "logger.report=false"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # MLflow: the same tracked run, continued
    assert check_mlflow_run(client, run_dir) == mlflow_id
    steps = [m.step for m in client.get_metric_history(mlflow_id, "eval/episode_reward")]
    assert steps == [600, 1200, 1800]
    tracked = client.get_run(mlflow_id)
    assert tracked.data.params["num_train_steps"] == "1200"  # MLflow parameters do not change
    assert tracked.data.tags["themis.resumed_with.num_train_steps"] == "1800"  # ... tags say so
    assert len(client.search_runs([tracked.info.experiment_id])) == 1
    # W&B: the same run id; wandb sync appends the second offline folder to the first
    assert json.loads((run_dir / "tracking.json").read_text())["wandb"]["run_id"] == run_id
    offline = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(offline) == 2
    resumed = wandb_records(offline[-1])
    assert [s for s, _ in history(resumed, "eval/episode_reward")] == [1800]


def test_mlflow_defaults_to_an_sqlite_store_in_the_run_dir_and_says_how_to_open_it(
        tmp_path, isolated_home):
    """No logger.tracking_uri and no MLFLOW_TRACKING_URI: the run's own SQLite store (MLflow's
    recommended store; the file store is deprecated), and the console says how to open it."""
    from themis.tracking.hub import RunInfo
    from themis.tracking.mlflow_backend import MlflowTracker
    from themis.tracking.settings import LoggerConfig

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tracker = MlflowTracker(LoggerConfig(mlflow=True))
    state = tracker.start(RunInfo(run_dir, {"env": "Pendulum-v1"}, "run"), None)
    uri = f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"
    assert state["tracking_uri"] == uri and (run_dir / "mlflow.db").is_file()
    assert f"mlflow ui --backend-store-uri {uri}" in tracker.describe()
    assert not (tmp_path / "mlruns").exists() and not (isolated_home / "mlruns").exists()
    assert mlflow_client(uri).get_run(state["run_id"]).data.params["env"] == "Pendulum-v1"
