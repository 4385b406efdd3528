"""The Python API of Themis's own loop (issue 67 item 2): ``themis.train`` with the launcher's
keys, validation and one-line errors; ``themis.load_run`` reads a run folder back."""

from __future__ import annotations

import math

import pytest
import torch

import themis
from themis.cli.api import to_overrides
from themis.run.received_config import written_here
from themis.utils import ConfigError

TINY = dict(domain="Classic", env="Pendulum-v1", num_train_steps=600, num_seed_steps=100,
            num_unsup_steps=100, num_interact=200, max_feedback=20, reward_batch=10, segment=20,
            eval_frequency=300, num_eval_episodes=1, log_frequency=300, reward_hidden_dim=32,
            reward_update=5, entropy_pool_size=128, reset_update=5,
            sac={"hidden_dim": 32, "batch_size": 32})


def test_keyword_arguments_become_the_launchers_overrides():
    assert to_overrides({"env": "HalfCheetah-v5", "learn_reward": False, "gold_path": None,
                         "sac": {"hidden_dim": 64}, "env_kwargs": {"continuous": False},
                         "logger": ["csv", "mlflow"], "label_instructions": "a b"}) == [
        "env=HalfCheetah-v5", "learn_reward=false", "gold_path=null", "sac.hidden_dim=64",
        "+env_kwargs.continuous=false", "logger=[csv,mlflow]", "label_instructions='a b'"]


def test_a_bad_key_or_value_is_the_launchers_one_line_raised(tmp_path):
    with pytest.raises(themis.TrainConfigError) as info:
        themis.train(env="Pendulum-v1", num_train_step=5, run_dir=tmp_path / "run")
    assert str(info.value) == ("num_train_step is not a Themis config key (did you mean "
                               "num_train_steps?); ./themis_train.sh --help lists them")
    assert isinstance(info.value, ConfigError)
    with pytest.raises(themis.TrainConfigError, match="num_train_steps=0 must be positive"):
        themis.train(domain="Classic", env="Pendulum-v1", num_train_steps=0,
                     run_dir=tmp_path / "run")
    with pytest.raises(themis.TrainConfigError, match="add domain=Classic"):
        themis.train(env="Pendulum-v1", run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written for a refused run


@pytest.mark.slow
def test_a_tiny_run_returns_its_folder_and_metrics_and_load_run_reads_it_back(tmp_path):
    run = themis.train(max_feedback=20, seed=1, run_dir=tmp_path / "run",
                       **{k: v for k, v in TINY.items() if k != "max_feedback"})
    assert run.run_dir == tmp_path / "run" and (run.run_dir / "config.yaml").is_file()
    # marked yours, as the launcher marks its runs: resume= trusts its own path settings
    assert written_here(run.run_dir / "config.yaml")
    assert run.metrics["step"] == 600 and math.isfinite(run.metrics["episode_reward"])
    assert run.eval_return == pytest.approx(run.metrics["episode_reward"])
    assert run.metrics["total_feedback"] == 20

    back = themis.load_run(run.run_dir)
    assert back.config["seed"] == 1 and back.config["sac"]["hidden_dim"] == 32
    assert back.eval["step"].tolist() == [300, 600]
    assert back.rewards["round"].tolist() == [1, 2]  # reward rounds from reward.csv
    assert back.rewards["total_feedback"].iloc[-1] == 20
    model = back.reward_model
    assert (model.obs_dim, model.action_dim) == (3, 1)
    assert model(torch.zeros(4, 3), torch.zeros(4, 1)).shape == (3, 4)  # (members, batch)
    assert back.agent_step == 600
    assert back.agent_state and all(isinstance(k, str) for k in back.agent_state)
    with pytest.raises(themis.TrainConfigError, match="already holds a run"):
        themis.train(run_dir=run.run_dir, **TINY)
    with pytest.raises(FileNotFoundError, match="not a Themis run folder"):
        themis.load_run(tmp_path)
