"""SAC learns Pendulum-v1 on the true reward (the learn_reward=false code path)."""

from __future__ import annotations

import pandas as pd
import pytest

from themis.workspace import Workspace


@pytest.mark.slow
def test_sac_learns_pendulum_on_true_reward(compose, tmp_path):
    cfg = compose([
        "domain=Classic", "env=Pendulum-v1", "learn_reward=false", "seed=1",
        "num_train_steps=6000", "num_seed_steps=1000", "num_unsup_steps=0",
        "eval_frequency=2000", "num_eval_episodes=5", "log_frequency=2000",
        "sac.hidden_dim=64", "sac.batch_size=128", "sac.init_temperature=0.2",
        "sac.actor_lr=0.001", "sac.critic_lr=0.001", "reset_update=0",
    ])
    ws = Workspace(cfg, tmp_path)
    ws.run()
    ws.finish()
    evals = pd.read_csv(tmp_path / "eval.csv")
    assert evals["step"].tolist() == [2000, 4000, 6000]
    assert evals["total_feedback"].eq(0).all()
    # random policy: about -1200; solved: about -150
    assert evals["episode_reward"].iloc[-1] > -400, evals
