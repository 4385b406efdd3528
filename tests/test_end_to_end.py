"""End to end through the real launchers, with tiny budgets."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from conftest import ROOT, TINY_PENDULUM, launch

TINY_CHEETAH = [
    "num_train_steps=2500", "num_seed_steps=300", "num_unsup_steps=300", "num_interact=500",
    "max_feedback=40", "reward_batch=10", "segment=20", "eval_frequency=1250",
    "num_eval_episodes=1", "log_frequency=500", "sac.hidden_dim=32", "sac.batch_size=32",
    "reward_hidden_dim=32", "reward_update=5", "entropy_pool_size=256", "reset_update=5",
]


@pytest.mark.slow
def test_train_launcher_writes_logs_checkpoints_and_plot(tmp_path):
    run = tmp_path / "run"
    proc = launch("themis_train.sh", *TINY_CHEETAH, "logger=csv,tensorboard",
                  f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("train.csv", "eval.csv", "reward.csv", "learning_curve.png", "config.yaml",
                 "checkpoints/agent.pt", "checkpoints/reward_model.pt",
                 "preferences/meta.json", "preferences/segments.npz", "preferences/labels.csv"):
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    evals = pd.read_csv(run / "eval.csv")
    assert {"step", "episode_reward", "total_feedback"} <= set(evals.columns)
    assert evals["step"].tolist() == [1250, 2500]
    # rounds at steps 600, 1100, 1600, 2100; the first is postponed: no 1000-step episode has
    # ended yet, and queries come from finished episodes only (B-Pref get_queries)
    assert evals["total_feedback"].iloc[-1] == 30
    rounds = pd.read_csv(run / "reward.csv")
    assert rounds["step"].tolist() == [600, 1100, 1600, 2100]
    assert rounds["postponed"].tolist() == [1, 0, 0, 0]
    train = pd.read_csv(run / "train.csv")
    assert train["episode_length"].eq(1000).all()
    # SAC metrics have fixed columns (updates start at step 300, before the first episode ends)
    assert train[["critic_loss", "actor_loss", "alpha"]].notna().all().all()
    assert train["phase"].tolist()[-1] == "reward"
    assert "step 2500" in proc.stdout  # periodic console line


@pytest.mark.slow
@pytest.mark.parametrize("feed_type,teacher", [("4", "mistake"), ("5", "skip")])
def test_samplers_and_teachers_run_end_to_end(tmp_path, feed_type, teacher):
    proc = launch("themis_train.sh", *TINY_PENDULUM, f"feed_type={feed_type}",
                  f"teacher={teacher}", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["sampler"].tolist()[0] == "uniform"  # the first round is always uniform
    assert set(rounds["sampler"].tolist()[1:]) == {
        {"4": "kcenter_disagreement", "5": "kcenter_entropy"}[feed_type]}
    assert rounds["total_feedback"].iloc[-1] == 30
    evals = pd.read_csv(tmp_path / "eval.csv")
    assert {"skip_fraction", "equal_fraction", "oracle_agreement"} <= set(evals.columns)


@pytest.mark.slow
def test_pretrain_snapshot_then_train(tmp_path):
    pre = tmp_path / "pre"
    proc = launch("themis_pretrain.sh", *TINY_PENDULUM, f"hydra.run.dir={pre}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    snapshot = pre / "snapshot.pt"
    assert snapshot.is_file()
    assert "continue with: ./themis_train.sh pretrained_snapshot=" in proc.stdout

    run = tmp_path / "run"
    proc = launch("themis_train.sh", *TINY_PENDULUM, f"pretrained_snapshot={snapshot}",
                  f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"loaded snapshot {snapshot} at step 400" in proc.stdout
    rounds = pd.read_csv(run / "reward.csv")
    assert rounds["step"].iloc[0] == 400  # the first query round comes right away
    train = pd.read_csv(run / "train.csv")
    assert train["step"].min() > 400  # no pretraining steps were repeated
    assert pd.read_csv(run / "eval.csv")["step"].iloc[-1] == 1200


@pytest.mark.slow
def test_snapshot_for_another_env_is_refused(tmp_path):
    pre = tmp_path / "pre"
    assert launch("themis_pretrain.sh", *TINY_PENDULUM, f"hydra.run.dir={pre}").returncode == 0
    proc = launch("themis_train.sh", *TINY_PENDULUM, "env=MountainCarContinuous-v0",
                  f"pretrained_snapshot={pre / 'snapshot.pt'}", f"hydra.run.dir={tmp_path / 'r'}")
    assert proc.returncode == 2
    assert "was made for env=Pendulum-v1" in proc.stderr


@pytest.mark.parametrize("override,message", [
    ("feed_type=7", "feed_type=7 is unknown"),
    ("env=HalfCheeta-v5", "close matches: HalfCheetah-v5"),
    ("pretrained_snapshot=/nonexistent/snapshot.pt", "does not exist"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, override, message):
    proc = launch("themis_train.sh", override, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_python_module_entry_point_shows_help():
    proc = subprocess.run([sys.executable, "-m", "themis.cli.train", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0
    assert "max_feedback" in proc.stdout
