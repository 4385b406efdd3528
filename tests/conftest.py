"""Shared fixtures: repository paths and a helper to compose Themis configs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

# before PyTorch loads libgomp: pytest-xdist's workers share the cores, so OpenMP threads sleep at
# once instead of spinning for a core another worker holds (scripts/test.sh sets it too)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch

from themis.environments.mujoco import choose_gl_backend

choose_gl_backend()
# Runs built inside the tests get one thread whatever the config says (a test's torch_threads=N
# does not oversubscribe the cores that pytest-xdist's workers share); tests/test_threads.py
# removes it to test torch_threads itself.
os.environ.setdefault("THEMIS_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]


def load_file(relative: str):
    """A script or benchmark of the repository (``scripts/x.py``) as a module, for its
    functions (they are files, not package modules)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
# One folder for the test session's own state, removed when the process that made it ends
# (pytest-xdist's workers inherit the controller's): the owner key that marks a run's config
# and tokens as this user's (themis/core/owner.py), so that tests and the runs they start never
# write ~/.config/themis, and Stable-Baselines3's logger folder (SB3 makes an empty
# $TMPDIR/SB3-<time> for every model otherwise)
if not os.environ.get("THEMIS_OWNER_KEY"):
    import atexit
    import shutil
    import tempfile

    SESSION_DIR = Path(tempfile.mkdtemp(prefix="themis-tests-"))
    atexit.register(shutil.rmtree, SESSION_DIR, ignore_errors=True)
    os.environ["THEMIS_OWNER_KEY"] = str(SESSION_DIR / "owner.key")
    os.environ["SB3_LOGDIR"] = str(SESSION_DIR / "sb3")
# pytest-xdist runs one worker per core (scripts/test.sh): one thread each, as runs have, so
# that the workers' threads do not spin-wait for each other's cores
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else
                      min(2, torch.get_num_threads()))


@pytest.fixture
def compose():
    """Compose ``config/<name>.yaml`` with overrides, as the launchers would."""
    from themis.run.config import compose as themis_compose

    return themis_compose


SERVICE_STATE = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS",
                 "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_NAME",
                 "WANDB_API_KEY", "WANDB_DIR", "WANDB_CONFIG_DIR")
"""Environment variables through which a real service reads state of this account."""


@pytest.fixture
def isolated_home(tmp_path_factory, monkeypatch):
    """A fresh ``HOME`` (and XDG folders) for a test that starts a real service (a Ray
    cluster, MLflow, W&B), also for the processes it launches: what an earlier session of the
    account left (``~/.ray/auth_token``, ``~/.netrc``, ``MLFLOW_TRACKING_URI``) does not reach
    the test. Returns the new home."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    for name, sub in (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"),
                      ("XDG_DATA_HOME", ".local/share")):
        monkeypatch.setenv(name, str(home / sub))
    for name in SERVICE_STATE:
        monkeypatch.delenv(name, raising=False)
    return home


# Tiny settings for end-to-end runs on Pendulum (200-step episodes).
TINY_PENDULUM = [
    "domain=Classic", "env=Pendulum-v1", "num_train_steps=1200", "num_seed_steps=200",
    "num_unsup_steps=200", "num_interact=300", "max_feedback=30", "reward_batch=10",
    "segment=20", "eval_frequency=600", "num_eval_episodes=1", "log_frequency=400",
    "sac.hidden_dim=32", "sac.batch_size=32", "reward_hidden_dim=32",
    "reward_update=5", "entropy_pool_size=256", "reset_update=5",
]


def launch(script: str, *overrides: str, timeout: int = 600,
           threads: str | None = "1") -> subprocess.CompletedProcess:
    """Run ``./<script> overrides...`` from the repository root, as a user would."""
    env = dict(os.environ)
    if threads is not None:
        env["THEMIS_THREADS"] = threads
    return subprocess.run([str(ROOT / script), *overrides], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(autouse=True)
def _subnormals_as_pytorch_starts():
    """A run flushes subnormal floats to zero for its process (flush_denormals), as it sets the
    threads; tests share a worker process, and Hypothesis (the web API's fuzzing) refuses to
    draw floats while subnormals are flushed. Each test starts with them kept."""
    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(False)


# ---------------------------------------------------------------- a failure is always named
@pytest.fixture(autouse=True)
def _no_label_server_left_running():
    """A labeling server a test started (a workspace's, or its own) is stopped and its thread
    joined when the test ends, passed or failed: nothing of it writes into the next test's
    (or a closed) captured stream."""
    yield
    import sys

    module = sys.modules.get("lib.label_server")
    if module is not None:
        for server in module.live_servers():
            server.stop()


def _usable(stream) -> bool:
    return stream is not None and not getattr(stream, "closed", False)


def _reopen_std_streams() -> None:
    """``sys.stdout`` / ``sys.stderr`` closed or gone (a captured stream kept by a thread or a
    handler): open the process's own descriptors again, so that what pytest writes next (the
    failures' names, the summary) is seen."""
    import sys

    for name, fd in (("stdout", 1), ("stderr", 2)):
        if not _usable(getattr(sys, name, None)):
            setattr(sys, name, open(os.dup(fd), "w", buffering=1, closefd=True))


def pytest_runtest_logreport(report):
    """A failed test is named on the terminal when it fails (``FAILED node id``), not only in
    the summary at the end: a session that cannot write its summary still names it."""
    if not report.failed:
        return
    _reopen_std_streams()
    line = f"\nFAILED {report.nodeid} ({report.when})\n"
    try:
        os.write(2, line.encode(errors="replace"))
    except OSError:
        pass


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """The summary reaches the terminal even when the stream pytest writes to was closed."""
    _reopen_std_streams()
    writer = terminalreporter._tw
    if not _usable(getattr(writer, "_file", None)):
        import sys

        writer._file = sys.stdout
