"""Shared fixtures: repository paths and a helper to compose Themis configs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from themis.environments.mujoco import choose_gl_backend

choose_gl_backend()
# Runs built inside the tests get one thread whatever the config says (a test's torch_threads=N
# does not oversubscribe the cores that pytest-xdist's workers share); tests/test_threads.py
# removes it to test torch_threads itself.
os.environ.setdefault("THEMIS_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
# pytest-xdist runs one worker per core (scripts/test.sh): one thread each, as runs have, so
# that the workers' threads do not spin-wait for each other's cores
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else
                      min(2, torch.get_num_threads()))


@pytest.fixture
def compose():
    """Compose ``config/<name>.yaml`` with overrides, as the launchers would."""
    from themis.run.config import compose as themis_compose

    return themis_compose


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
