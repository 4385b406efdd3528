"""seals (domain=seals): fixed-horizon MuJoCo for reward learning, end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import launch

from themis.environments.domains import episode_limit, make_env

# Hopper-v1 episodes last 1000 steps: the first feedback round comes after the first episode
TINY_HOPPER = [
    "domain=seals", "env=Hopper-v1", "num_train_steps=2200", "num_seed_steps=1000",
    "num_unsup_steps=200", "num_interact=400", "max_feedback=20", "reward_batch=10",
    "segment=25", "eval_frequency=1100", "num_eval_episodes=1", "log_frequency=1000",
    "sac.hidden_dim=32", "sac.batch_size=32", "reward_hidden_dim=32", "reward_update=5",
    "entropy_pool_size=256", "reset_update=5",
]


def episode_lengths(env, episodes: int, seed: int = 0) -> list[int]:
    lengths = []
    for e in range(episodes):
        env.reset(seed=seed + e)
        n, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            n, done = n + 1, terminated or truncated
        lengths.append(n)
    return lengths


def test_seals_hopper_has_a_fixed_horizon_where_gymnasiums_ends_when_it_falls():
    fixed = make_env("seals", "Hopper-v1", seed=0)
    early = make_env("Control", "Hopper-v4", seed=0)
    assert episode_limit(fixed) == 1000
    assert episode_lengths(fixed, 3) == [1000, 1000, 1000]  # random actions fall, and go on
    assert max(episode_lengths(early, 3)) < 200  # the same robot's episodes end at the fall
    # seals observes the position too (reward learning sees what the reward depends on)
    assert fixed.observation_space.shape[0] == early.observation_space.shape[0] + 1
    assert fixed.action_space.low.min() == -1.0 and fixed.action_space.high.max() == 1.0


@pytest.mark.parametrize("env", ["CartPole-v0", "seals/MountainCar-v0", "NoisyObs-v0"])
def test_seals_diagnostic_tasks_with_vector_observations_make_and_step(env):
    e = make_env("seals", env, seed=0)  # no render_mode=None for envs that render nothing
    obs, _ = e.reset(seed=0)
    assert obs.ndim == 1 and np.all(np.isfinite(obs))
    e.step(e.action_space.sample())


def test_an_unknown_seals_env_is_one_line_and_exit_2():
    proc = launch("themis_train.sh", "domain=seals", "env=Hoper-v1")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("themis: error: env=Hoper-v1 is not an environment "
                                          "of domain=seals; close matches: Hopper-v1")


def test_seals_hopper_end_to_end(tmp_path):
    run = tmp_path / "run"
    proc = launch("themis_train.sh", *TINY_HOPPER, f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Themis | seals/Hopper-v1 |" in proc.stdout
    train = pd.read_csv(run / "train.csv")
    assert (train["episode_length"] == 1000).all()  # no episode ended early
    assert pd.read_csv(run / "eval.csv")["step"].tolist() == [1100, 2200]
    rounds = pd.read_csv(run / "reward.csv")
    assert rounds["total_feedback"].iloc[-1] == 20
    assert (run / "checkpoints" / "reward_model.pt").is_file()


def _bench():
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("bench_fixed_horizon",
                                                  ROOT / "benchmarks" / "bench_fixed_horizon.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_fixed_horizon_variants_are_valid_command_lines(compose):
    bench = _bench()
    for variant in bench.VARIANTS:
        cfg = compose(bench.overrides(variant, 1, 100_000, 500, 10, 1, []))
        assert (cfg.max_feedback, cfg.reward_batch, cfg.seed) == (500, 50, 1)
    assert compose(bench.overrides("fixed", 0, 100_000, 500, 10, 1, [])).domain == "seals"
    assert compose(bench.overrides("no_term", 0, 100_000, 500, 10, 1, [])).env_kwargs == \
        {"terminate_when_unhealthy": False}


def test_bench_fixed_horizon_tables_the_finished_runs_and_runs_nothing(tmp_path, capsys):
    for variant, seed, steps, final, length in (("early", 0, [500, 1000], 300.0, 120),
                                                ("fixed", 0, [500, 1000], 900.0, 1000),
                                                ("fixed", 1, [500], 400.0, 1000)):
        run = tmp_path / variant / f"seed{seed}"
        run.mkdir(parents=True)
        pd.DataFrame({"step": steps, "episode_reward": [0.0] * (len(steps) - 1) + [final]}
                     ).to_csv(run / "eval.csv", index=False)
        pd.DataFrame({"episode_length": [length] * 12}).to_csv(run / "train.csv", index=False)
    code = _bench().main(["--steps", "1000", "--seeds", "0", "1", "--out", str(tmp_path),
                          "--reps", "50", "--table-only"])
    out = capsys.readouterr().out
    assert code == 0 and "4 runs, 2 already done, 2 to go" in out
    assert "| early | 1 | 300 [300, 300] | 300 | 120 |" in out
    assert "| fixed | 1 | 900 [900, 900] | 900 | 1000 |" in out  # seed 1 is unfinished
    assert not (tmp_path / "early" / "seed1").exists()  # nothing was started
