"""``benchmarks/bench_drlhp.py``: the MovingDot table's standard errors and recorded CSV, the
Pong variants and the Pong record's provenance."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("bench_drlhp",
                                                  ROOT / "benchmarks" / "bench_drlhp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_gives_the_standard_error_over_seeds_and_none_for_one_seed():
    bench = _bench()
    values = pd.Series([1.0, 2.0, 6.0])
    assert bench.mean_std(values) == f"3.0 ± {np.std([1, 2, 6], ddof=1) / np.sqrt(3):.1f}"
    assert bench.mean_std(pd.Series([4.0])) == "4.0 ± -"


def test_recorded_rows_add_up_across_sessions_and_a_rerun_replaces_its_row(tmp_path):
    bench = _bench()
    path = tmp_path / "results" / "dot.csv"
    runs = pd.DataFrame({"seed": [0, 1], "final_distance": [3.0, 5.0], "true_return": [60.0, 50.0],
                         "val_accuracy": [0.8, 0.7], "wall_s": [1200.0, 1300.0],
                         "cpu_s": [1100.0, 1250.0]})
    bench.record_dot(path, "drlhp", runs, 150_000)
    later = runs.iloc[[1]].assign(seed=2, true_return=40.0)
    bench.record_dot(path, "drlhp", later, 150_000)
    bench.record_dot(path, "drlhp", runs.iloc[[0]].assign(true_return=61.0), 150_000)
    table = pd.read_csv(path)
    assert list(table["seed"]) == [0, 1, 2]
    assert list(table["true_return"]) == [61.0, 50.0, 40.0]
    assert {"date", "commit", "machine", "command"} <= set(table.columns)


def test_a_dot_record_has_each_run_s_own_provenance(tmp_path):
    """A run's row names the date, commits, machine and command the run itself had (its
    ``provenance.json``), not the tabling invocation's (issue 84, provenance)."""
    bench = _bench()
    path = tmp_path / "dot.csv"
    ran = {"date": "2026-12-03", "commits": ["4d54841", "5224cd4"], "machine": "AMD EPYC, 2 cores",
           "command": "python benchmarks/bench_drlhp.py dot --seeds 0"}
    runs = pd.DataFrame({"seed": [0, 1], "final_distance": [3.0, 5.0], "true_return": [60.0, 50.0],
                         "val_accuracy": [0.8, 0.7], "wall_s": [1200.0, 1300.0],
                         "cpu_s": [1100.0, 1250.0], "provenance": [ran, None]})
    bench.record_dot(path, "drlhp", runs, 150_000)
    table = pd.read_csv(path)
    first, second = table.iloc[0], table.iloc[1]
    assert (first["date"], first["commit"], first["machine"], first["command"]) == (
        "2026-12-03", "4d54841 5224cd4", "AMD EPYC, 2 cores", ran["command"])
    assert second["date"] != "2026-12-03" and second["command"].startswith(
        "python benchmarks/bench_drlhp.py")


def test_the_paper_scale_pong_command_keeps_the_papers_decay_time(compose):
    """T₀ is 5·10⁶ frames in the paper (Sec. 2.2.4: labels "roughly proportional to
    5·10⁶/(T + 5·10⁶)"): 1.25·10⁶ agent steps at Atari's frame skip of 4 (issue 84 item 2)."""
    command = _bench().COMMANDS.split("Paper scale")[1].split("./themis_train.sh")[1]
    overrides = [word for word in command.replace("\\\n", " ").split()
                 if "=" in word]
    assert overrides[0] == "domain=ALE" and "+recipe=drlhp" in overrides
    cfg = compose(overrides)
    assert cfg.query_schedule == "decay"
    assert cfg.query_decay_steps * 4 == 5_000_000


@pytest.mark.parametrize("variant", ["a2c_oracle", "ppo_oracle", "a2c_true", "ppo_true"])
def test_each_pong_variant_composes_with_its_agent(compose, variant):
    cfg = compose(_bench().pong_overrides(variant, 3_000_000, 0, 1500, quick=False))
    agent, kind = variant.split("_")
    # mrahtz's A2C (16 envs) or CleanRL's Atari PPO (8 envs, clip 0.1, linear heads)
    assert cfg.agent == agent and getattr(cfg, agent).num_envs == (16 if agent == "a2c" else 8)
    if agent == "ppo":
        assert cfg.ppo.clip_coef == 0.1 and cfg.ppo.hidden_depth is None
    assert cfg.learn_reward == (kind == "oracle")
    assert cfg.checkpoint_frequency <= 100_000  # a checkpoint at least every 100k steps
    if kind == "oracle":
        assert cfg.reward_schedule == "passes" and cfg.reward_net == "drlhp"
        assert cfg.reward_training == "async" and cfg.reward_max_lag > 0  # its own core
        assert cfg.num_unsup_steps == 0 and cfg.first_round_queries == 500


def test_the_agents_cost_is_measured_on_the_launchers_own_pong_config():
    """``bench_drlhp.py pong`` measures each agent's CPU per 10k steps before the long run; its
    config is the launcher's (a hand-made one lacked a key added later and crashed the run)."""
    seconds = _bench().agent_cost("a2c", 80)  # one warm-up rollout of 16 × 5, then one timed
    assert 0 < seconds < 10_000


def test_a_pong_record_has_the_runs_own_provenance_and_the_learners_cpu(tmp_path):
    bench = _bench()
    run = tmp_path / "pong" / "a2c_oracle" / "seed0"
    run.mkdir(parents=True)
    returns = [-21.0] * 5 + [-3.0, 1.0, 2.0, 0.0, -1.0, 4.0, 3.0, 1.0, 2.0, 1.0]
    pd.DataFrame({"step": np.arange(1, 16) * 1000, "episode": np.arange(15),
                  "episode_reward": returns}).to_csv(run / "train.csv", index=False)
    pd.DataFrame({"step": [8000, 16000], "episode_reward": [-5.0, 2.5]}).to_csv(
        run / "eval.csv", index=False)
    pd.DataFrame({"step": [4000, 12000], "heldout_accuracy": [0.7, 0.9],
                  "heldout_pearson": [0.5, 0.8]}).to_csv(run / "reward.csv", index=False)
    (run / "timing.json").write_text(json.dumps({"wall_s": 100.0, "cpu_s": 90.0}))
    (run / "learner_cpu.json").write_text(json.dumps({"cpu_s": 80.0}))
    (run / "run_time.json").write_text(json.dumps({"wall_s": 120.0, "cpu_s": 110.0}))
    (run / "provenance.json").write_text(json.dumps({
        "date": "2026-12-07", "commits": ["abc1234", "def5678"], "machine": "a machine",
        "command": "python benchmarks/bench_drlhp.py pong"}))
    record = tmp_path / "drlhp_pong.csv"
    bench.record_pong(record, tmp_path, ["a2c_oracle", "a2c_true"], [0], 16000)
    row = pd.read_csv(record).iloc[0]
    assert row["final_score"] == pytest.approx(np.mean(returns[-10:]))  # the last 10 episodes
    assert row["last_eval"] == 2.5 and row["heldout_accuracy"] == 0.9
    assert row["agent_cpu_s"] == 90.0 and row["learner_cpu_s"] == 80.0
    assert (row["run_wall_s"], row["run_cpu_s"]) == (120.0, 110.0)  # the run's own
    assert row["commit"] == "abc1234 def5678" and row["date"] == "2026-12-07"
    assert len(pd.read_csv(record)) == 1  # a2c_true has no finished run


def test_a_pong_curve_record_holds_every_run_so_far_with_its_own_provenance(tmp_path):
    """The measurement the agent is chosen from: each run's curve, finished or not."""
    bench = _bench()
    run = tmp_path / "pong" / "a2c_true" / "seed0"
    run.mkdir(parents=True)
    steps = np.arange(1, 41) * 6000  # an episode every 6000 steps, up to 240k
    pd.DataFrame({"step": steps, "episode_reward": np.where(steps > 100_000, -10.0, -21.0),
                  "entropy": 1.7}).to_csv(run / "train.csv", index=False)
    (run / "provenance.json").write_text(json.dumps({
        "date": "2026-12-07", "commits": ["abc1234"], "machine": "AMD EPYC, 2 cores",
        "command": "python benchmarks/bench_drlhp.py pong --variants a2c_true"}))
    path = tmp_path / "drlhp_pong_curves.csv"
    bench.record_curves(path, tmp_path, ["a2c_true", "ppo_true"], [0])
    rows = pd.read_csv(path)
    assert rows["step"].tolist() == [100_000, 200_000]  # every 100k steps reached
    assert rows["return_last10"].tolist() == [-21.0, -10.0]  # the last 10 episodes by then
    assert set(rows["commit"]) == {"abc1234"} and set(rows["variant"]) == {"a2c_true"}
    assert "heldout_pearson" not in rows  # no reward.csv: a run on the true reward
    bench.record_curves(path, tmp_path, ["a2c_true"], [0])  # again: replaced, not doubled
    assert len(pd.read_csv(path)) == 2
    # a new run of the same variant and seed (its start date) replaces the earlier run's rows,
    # also at the steps it has not reached yet; other variants' rows stay
    pd.concat([pd.read_csv(path), pd.read_csv(path).assign(variant="ppo_true")]).to_csv(
        path, index=False)
    pd.DataFrame({"step": steps[:20], "episode_reward": -5.0, "entropy": 1.7}).to_csv(
        run / "train.csv", index=False)
    (run / "provenance.json").write_text(json.dumps({
        "date": "2026-12-08", "commits": ["bcd2345"], "machine": "AMD EPYC, 2 cores",
        "command": "python benchmarks/bench_drlhp.py pong --variants a2c_true"}))
    bench.record_curves(path, tmp_path, ["a2c_true"], [0])
    rows = pd.read_csv(path)
    new = rows[rows["variant"] == "a2c_true"]
    assert new["step"].tolist() == [100_000] and set(new["date"]) == {"2026-12-08"}
    assert len(rows[rows["variant"] == "ppo_true"]) == 2


def test_a_pong_curve_of_a_run_that_learns_its_reward_carries_r_hat_held_out(tmp_path):
    """The mean of the last 5 rounds' held-out accuracy and Pearson correlation by each step
    (a round without a measurement, NaN, is left out)."""
    bench = _bench()
    run = tmp_path / "run"
    run.mkdir()
    steps = np.arange(1, 41) * 6000
    pd.DataFrame({"step": steps, "episode_reward": -21.0, "entropy": 1.7}).to_csv(
        run / "train.csv", index=False)
    pd.DataFrame({"step": [60_000, 80_000, 120_000, 140_000, 160_000, 180_000, 190_000],
                  "heldout_accuracy": [np.nan, 0.5, 1.0, 1.0, 1.0, 1.0, 0.5],
                  "heldout_pearson": [0.9, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]}).to_csv(
        run / "reward.csv", index=False)
    rows = bench.curve_rows(run)
    assert [r["heldout_accuracy"] for r in rows] == [0.5, 0.9]  # 0.5 alone; the last 5
    assert [r["heldout_pearson"] for r in rows] == [0.5, 0.4]  # (0.9 + 0.1) / 2; 0.2 ... 0.6
