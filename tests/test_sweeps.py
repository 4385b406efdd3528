"""Hydra sweeps (joblib locally, submitit) and the results table of scripts/summarize.py."""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, TINY_PENDULUM, launch

SUMMARIZE = ROOT / "scripts" / "summarize.py"
# Even tinier than TINY_PENDULUM: two evals, one uniform and one active query round.
SWEEP_TINY = [*TINY_PENDULUM, "num_train_steps=800", "eval_frequency=400", "max_feedback=20"]


def summarize(sweep_dir, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SUMMARIZE), str(sweep_dir), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def fake_run(root, name, overrides, steps, returns, feedback=100):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    pd.DataFrame({"step": steps, "episode_reward": returns,
                  "total_feedback": [feedback] * len(steps)}).to_csv(run / "eval.csv", index=False)
    return run


def test_summarize_table_statistics(tmp_path):
    finals = {"0": [1.0, 2.0, 3.0, 100.0], "1": [10.0, 10.0, 10.0, 10.0]}
    for feed_type, values in finals.items():
        for seed, final in enumerate(values):
            fake_run(tmp_path, f"{feed_type}_{seed}",
                     ["num_train_steps=2000", f"feed_type={feed_type}", f"seed={seed}"],
                     [1000, 2000], [0.0, final])
    proc = summarize(tmp_path, "--reps", "500")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "summary.csv").set_index("setting")
    # the shared override num_train_steps and the seed do not make settings
    assert list(table.index) == ["feed_type=0", "feed_type=1"]
    row = table.loc["feed_type=0"]
    assert row["runs"] == 4 and row["final_step"] == 2000
    assert row["mean"] == pytest.approx(26.5)
    assert row["std"] == pytest.approx(np.std([1, 2, 3, 100], ddof=1))
    assert row["iqm"] == pytest.approx(2.5)  # middle half of 1, 2, 3, 100
    assert row["iqm_ci_low"] <= row["iqm"] <= row["iqm_ci_high"]
    constant = table.loc["feed_type=1"]
    assert constant["iqm"] == constant["iqm_ci_low"] == constant["iqm_ci_high"] == 10.0
    assert "| feed_type=0 | 4 | 2000 | 26.5 |" in (tmp_path / "summary.md").read_text()
    for png in ("learning_curves.png", "curves/feed_type=0.png", "curves/feed_type=1.png"):
        assert (tmp_path / png).stat().st_size > 1000, png


def test_summarize_aggregates_the_success_rate_of_meta_world_runs(tmp_path):
    for seed, success in enumerate([0.0, 0.5, 1.0, 1.0]):
        run = fake_run(tmp_path, f"s{seed}", ["env=door-open-v3", f"seed={seed}"],
                       [1000, 2000], [0.0, 10.0])
        curve = pd.read_csv(run / "eval.csv")
        curve["success_rate"] = [0.0, success]
        curve.to_csv(run / "eval.csv", index=False)
    proc = summarize(tmp_path, "--reps", "200")
    assert proc.returncode == 0, proc.stderr
    row = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert row["success_iqm"] == pytest.approx(0.75)  # middle half of 0, .5, 1, 1
    assert row["success_ci_low"] <= 0.75 <= row["success_ci_high"]
    assert "success rate IQM" in (tmp_path / "summary.md").read_text()


def test_summarize_marks_unfinished_runs(tmp_path):
    fake_run(tmp_path, "done", ["num_train_steps=2000", "seed=0"], [1000, 2000], [0.0, 5.0])
    stopped = fake_run(tmp_path, "stopped", ["num_train_steps=2000", "seed=1"], [1000], [3.0])
    (stopped / "config.yaml").write_text("num_train_steps: 2000\n")  # stopped at 1000
    proc = summarize(tmp_path, "--reps", "100")
    assert proc.returncode == 0, proc.stderr
    assert pd.read_csv(tmp_path / "summary.csv")["unfinished"].tolist() == [1]
    text = (tmp_path / "summary.md").read_text()
    assert "| (defaults) | 2 (1 unfinished) |" in text and "Unfinished runs" in text


def test_summarize_reports_a_folder_without_runs(tmp_path):
    proc = summarize(tmp_path)
    assert proc.returncode == 2
    assert "no run with an eval.csv" in proc.stderr


@pytest.mark.parametrize("sweep,message", [
    (["sed=0,1"], "sed is not a Themis config key (did you mean seed?)"),
    (["seed=0,1", "teacher=oracle,skp"], "teacher=skp is unknown"),
    (["seed=0,abc"], "seed: Value 'abc'"),  # a later value of a sweep is checked too
])
def test_a_typo_inside_a_sweep_is_one_line_and_exit_2(tmp_path, sweep, message):
    proc = launch("themis_train.sh", "-m", *sweep, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("themis: error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "sweep").exists()  # no job started


def test_slurm_launcher_config_composes():
    from themis.run.config import compose

    cfg = compose(["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                  return_hydra_config=True)
    default = compose(return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.partition == "gpu"
    assert cfg.hydra.launcher.cpus_per_task == 4
    assert default.hydra.launcher._target_.endswith("JoblibLauncher")


@pytest.mark.xdist_group("busy")  # two sweep jobs at once
@pytest.mark.slow
def test_joblib_multirun_then_summarize(tmp_path):
    sweep = tmp_path / "sweep"
    proc = launch("themis_train.sh", "-m", *SWEEP_TINY, "feed_type=uniform,disagreement",
                  f"hydra.sweep.dir={sweep}", threads=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()  # parallel jobs share the terminal: each line says whose
    for job in (0, 1):
        assert any(line.startswith(f"[job {job}] ") and "eval " in line for line in lines)
    assert not [line for line in lines if "| step " in line and not line.startswith("[job ")]
    runs = sorted(p.parent for p in sweep.rglob("eval.csv"))
    assert len(runs) == 2
    for run in runs:
        config = (run / "config.yaml").read_text()
        assert "torch_threads: 1\n" in config or "torch_threads: 2\n" in config
        assert pd.read_csv(run / "eval.csv")["step"].tolist() == [400, 800]
    samplers = {pd.read_csv(run / "reward.csv")["sampler"].iloc[-1] for run in runs}
    assert samplers == {"uniform", "disagreement"}

    proc = summarize(sweep, "--reps", "200")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(sweep / "summary.csv")
    assert table["setting"].tolist() == ["feed_type=disagreement", "feed_type=uniform"]
    assert table["total_feedback"].tolist() == [20, 20]
    assert (sweep / "learning_curves.png").is_file()
    assert "feed_type=uniform" in (sweep / "summary.md").read_text()


@pytest.mark.xdist_group("busy")  # two sweep jobs at once
@pytest.mark.slow
def test_submitit_local_multirun(tmp_path):
    sweep = tmp_path / "sweep"
    proc = launch("themis_train.sh", "-m", "hydra/launcher=submitit_local",
                  "hydra.launcher.timeout_min=10", *SWEEP_TINY, "seed=0,1",
                  f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    finals = [pd.read_csv(p)["episode_reward"].iloc[-1] for p in sorted(sweep.rglob("eval.csv"))]
    assert len(finals) == 2 and finals[0] != finals[1]  # two seeds, two different runs
    proc = summarize(sweep, "--reps", "200")
    assert proc.returncode == 0, proc.stderr
    row = pd.read_csv(sweep / "summary.csv").iloc[0]
    assert row["runs"] == 2 and row["mean"] == pytest.approx(np.mean(finals))


def test_bench_methods_table_only_tables_the_finished_runs_and_runs_nothing(tmp_path):
    """A partial grid (a session's worth of a 72-run benchmark) gets its table without runs."""
    clean = tmp_path / "clean" / "HalfCheetah-v5"
    fake_run(clean, "sac/seed0", [], [50_000, 100_000], [0.0, 9000.0])  # the old ceiling
    for name, final in (("plain_sac/seed0", 4000.0), ("500/pebble/seed0", 3000.0),
                        ("500/pebble/seed1", 1000.0)):
        fake_run(clean, name, [], [50_000, 100_000], [0.0, final])
    fake_run(clean, "500/qpa/seed0", [], [50_000], [2000.0])  # interrupted: not finished
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_methods.py"),
                           "--envs", "HalfCheetah-v5", "--methods", "sac", "pebble", "qpa",
                           "--budgets", "500", "--seeds", "0", "1", "--out", str(tmp_path),
                           "--reps", "100", "--table-only"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "6 runs, 3 already done, 3 to go" in proc.stdout
    rows = {line.split(" | ")[2]: line.split(" | ")
            for line in proc.stdout.splitlines() if line.startswith("| HalfCheetah-v5")}
    assert set(rows) == {"sac", "pebble"}  # qpa has no finished run
    assert rows["sac"][3] == "1" and rows["pebble"][3] == "2"
    assert rows["pebble"][4].startswith("2000 ")  # IQM of two seeds is their mean
    assert rows["pebble"][5] == "0.50 |"
    assert not (clean / "plain_sac" / "seed1").exists()  # nothing was started
    assert not (clean / "500" / "qpa" / "seed0.log").exists()


def test_bench_methods_resumes_an_interrupted_run_or_starts_it_again(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_methods",
                                                  ROOT / "benchmarks" / "bench_methods.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    calls = []
    monkeypatch.setattr(bench.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    checkpointed, early = tmp_path / "a" / "seed0", tmp_path / "b" / "seed0"
    (checkpointed / "checkpoints").mkdir(parents=True)
    (checkpointed / "checkpoints" / "state.pt").write_bytes(b"x")
    early.mkdir(parents=True)
    (early / "train.csv").write_text("step\n100\n")  # stopped before its first checkpoint
    for run in (checkpointed, early):
        bench.run_one(run, ["seed=0"], tmp_path / "log", threads=1)
    assert "resume=true" in calls[0] and (checkpointed / "checkpoints" / "state.pt").exists()
    assert "resume=true" not in calls[1] and not early.exists()  # a fresh start, a clean dir


def test_bench_methods_ceiling_is_plain_sac_on_the_true_reward_with_the_methods_networks(
        compose):
    spec = importlib.util.spec_from_file_location("bench_methods",
                                                  ROOT / "benchmarks" / "bench_methods.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    extra = ["sac.hidden_dim=1024", "num_unsup_steps=9000", "reset_update=100"]
    sac = bench.overrides("DMC", "walker_walk", 500_000, 100, "sac", 0, 10, 1, False, extra)
    pebble = bench.overrides("DMC", "walker_walk", 500_000, 100, "pebble", 0, 10, 1, False,
                             extra)
    cfg = compose(sac)  # the last value of a key wins, as on the command line
    assert (cfg.learn_reward, cfg.num_unsup_steps, cfg.reset_update) == (False, 0, 0)
    assert cfg.sac == compose(pebble).sac  # the same networks as the methods'
    assert compose(pebble).num_unsup_steps == 9000


def test_bench_ceiling_tables_the_curves_runs_left_even_when_cut_short(tmp_path):
    """``--table-only --out``: SB3's per-evaluation JSON and Themis's eval.csv, one row per
    device and seed, '-' where a run stopped before an evaluation."""
    (tmp_path / "sb3_cpu0.json").write_text(json.dumps({"10000": -98.2, "20000": 26.0}))
    (tmp_path / "sb3_cuda0.json").write_text(json.dumps({"10000": -124.0}))
    fake_run(tmp_path, "themis0", [], [10_000, 20_000], [47.0, 599.0])
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_ceiling.py"),
                           "--seeds", "0", "--sb3-devices", "cpu", "cuda", "--out",
                           str(tmp_path), "--table-only"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == "| method | seed | 10k | 20k |"
    assert "| SB3 SAC | 0 | -98 | 26 |" in rows
    assert "| SB3 SAC (CUDA) | 0 | -124 | - |" in rows
    assert "| Themis SAC | 0 | 47 | 599 |" in rows


def test_bench_methods_ppe_protocol_gives_each_method_its_official_walker_settings(compose):
    """``--protocol ppe``: PPE's Table 1 schedule for every run, each method's own official
    walker_walk settings on top, and plain SAC without the protocol's pretraining."""
    spec = importlib.util.spec_from_file_location("bench_methods",
                                                  ROOT / "benchmarks" / "bench_methods.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ppe = bench.PROTOCOLS["ppe"]
    extra = [*ppe["extra"], "sac.hidden_dim=128", "sac.batch_size=256"]

    def cfg(method):
        return compose(bench.overrides(ppe["domain"], "walker_walk", ppe["steps"], 100, method, 0,
                                       10, 1, False, extra, ppe["method_extra"]))

    pebble, surf, rune, qpa, sac = (cfg(m) for m in ("pebble", "surf", "rune", "qpa", "sac"))
    for run in (pebble, surf, rune, qpa):
        assert (run.max_feedback, run.reward_batch, run.num_interact, run.segment,
                run.num_unsup_steps) == (100, 10, 20_000, 50, 9000)
        assert (run.sac.actor_lr, run.sac.critic_lr, run.sac.alpha_lr,
                run.sac.critic_target_update_frequency) == (5e-4, 5e-4, 1e-4, 2)
    assert (pebble.feed_type, pebble.reward_update) == (1, 50)
    assert (surf.surf.enabled, surf.surf.mu, surf.surf.inv_label_ratio, surf.reward_update,
            surf.feed_type) == (True, 4, 100, 1000, 1)
    assert rune.rune.enabled and rune.reward_update == 50 and rune.feed_type == 1
    assert (qpa.qpa.enabled, qpa.ensemble_size, qpa.reward_update, qpa.qpa.recent_episodes,
            qpa.qpa.data_aug_ratio, qpa.qpa.iterations) == (True, 1, 2000, 10, 20, True)
    assert (sac.learn_reward, sac.num_unsup_steps, sac.reset_update) == (False, 0, 0)
    assert sac.sac == pebble.sac and sac.num_eval_episodes == 10


def test_bench_methods_window_open_protocol_runs_the_papers_meta_world_sac(compose):
    """``--protocol ppe_window_open``: B-Pref's Meta-World SAC (3×256, batch 512, learning
    rates 3e-4, QPA's 1e-4), PPE's schedule (400 queries, 10 every 5000 steps), each method's
    official Meta-World settings, fp32; the table reads the success rate in %."""
    spec = importlib.util.spec_from_file_location("bench_methods",
                                                  ROOT / "benchmarks" / "bench_methods.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    wo = bench.PROTOCOLS["ppe_window_open"]
    extra = [*wo["extra"], f"sac.hidden_dim={wo['sac_width']}",
             f"sac.batch_size={wo['sac_batch']}"]

    def cfg(method):
        return compose(bench.overrides(wo["domain"], "window-open-v3", wo["steps"], 400, method,
                                       0, wo["rounds"], 1, False, extra, wo["method_extra"]))

    pebble, surf, rune, qpa, sac = (cfg(m) for m in ("pebble", "surf", "rune", "qpa", "sac"))
    for run in (pebble, surf, rune, qpa, sac):
        assert (run.domain, run.env, run.num_train_steps) == ("MetaWorld", "window-open-v3",
                                                              500_000)
        assert (run.sac.hidden_dim, run.sac.hidden_depth, run.sac.batch_size) == (256, 3, 512)
        assert (run.sac.alpha_lr, run.sac.critic_target_update_frequency) == (1e-4, 2)
        assert (run.precision, run.num_eval_episodes, run.eval_frequency) == ("fp32", 10, 50_000)
        assert dict(run.env_kwargs) == {"freeze_rand_vec": False, "partially_observable": True}
    for run in (pebble, surf, rune, qpa):
        assert (run.max_feedback, run.reward_batch, run.num_interact, run.segment,
                run.num_unsup_steps, run.num_seed_steps) == (400, 10, 5000, 50, 9000, 1000)
    for run in (pebble, surf, rune, sac):
        assert (run.sac.actor_lr, run.sac.critic_lr) == (3e-4, 3e-4)
    assert (qpa.sac.actor_lr, qpa.sac.critic_lr) == (1e-4, 1e-4)  # run_QPA.sh, Meta-World
    assert (pebble.feed_type, pebble.reward_update, pebble.ensemble_size) == (1, 10, 3)
    assert (surf.reward_update, surf.surf.inv_label_ratio, surf.surf.mu) == (20, 10, 4)
    assert rune.rune.enabled and rune.reward_update == 10 and rune.feed_type == 1
    assert (qpa.reward_update, qpa.qpa.iterations, qpa.qpa.data_aug_ratio,
            qpa.qpa.recent_episodes, qpa.ensemble_size) == (200, False, 0, 30, 1)
    assert (sac.learn_reward, sac.num_unsup_steps) == (False, 0)
    assert wo["metric"] == "success_rate" and wo["scale"] == 100.0


def test_bench_methods_window_open_table_reads_success_in_percent(tmp_path):
    clean = tmp_path / "clean" / "window-open-v3"
    for name, final in (("400/pebble/seed0", 0.8), ("400/pebble/seed1", 1.0),
                        ("400/pebble/seed2", 0.9)):
        run = fake_run(clean, name, [], [250_000, 500_000], [0.0, 0.0])
        curve = pd.read_csv(run / "eval.csv").assign(success_rate=[0.0, final])
        curve.to_csv(run / "eval.csv", index=False)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_methods.py"),
                           "--protocol", "ppe_window_open", "--methods", "pebble", "--seeds",
                           "0", "1", "2", "--out", str(tmp_path), "--reps", "100",
                           "--table-only"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    # 80, 100, 90 %: mean 90, SE 10 / √3 = 5.8; the paper's 87.1 ± 17.1 / 2 = 8.6
    assert ("| pebble | 87.1 ± 17.1 | 87.1 ± 8.6 | 90.0 ± 5.8 | 3 | 80.0, 100.0, 90.0 | 0.28 |"
            in proc.stdout)
    assert "final success rate (%)" in proc.stdout


def test_compare_with_published_against_a_hand_computation():
    spec = importlib.util.spec_from_file_location("summarize", SUMMARIZE)
    summ = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summ)
    # ours 1, 2, 3: mean 2, sample std 1, SE 1/√3; paper 5 ± 2, population std over 5 seeds:
    # sample std 2·√(5/4) = √5, SE √5/√5 = 2/√4 = 1. t = -3 / √(1/3 + 1) = -2.598;
    # Welch df = (1/3 + 1)² / ((1/3)²/2 + 1²/4) = 64/11; p = 2·P[T_{64/11} > 2.598] = 0.0419
    c = summ.compare_with_published([1.0, 2.0, 3.0], 5.0, 2.0, 5)
    assert (c.mean, c.se, c.n, c.published_se, c.published_n) == pytest.approx(
        (2.0, 1 / np.sqrt(3), 3, 1.0, 5))
    assert c.gap_se == pytest.approx(-3 / np.sqrt(4 / 3))
    from scipy import stats
    assert c.p == pytest.approx(2 * stats.t.sf(3 / np.sqrt(4 / 3), 64 / 11))
    assert c.p == pytest.approx(0.0419, abs=1e-4) and c.inside is False
    sample = summ.compare_with_published([1.0, 2.0, 3.0], 5.0, 2.0, 5, published_ddof=1)
    assert sample.published_se == pytest.approx(2 / np.sqrt(5))  # a sample std: s / √n
    assert summ.compare_with_published([4.0, 5.0, 6.0], 5.0, 2.0, 5).inside is True  # p = 1
    one = summ.compare_with_published([7.0], 5.0, 2.0, 5)
    assert np.isnan(one.se) and np.isnan(one.p) and one.inside is None
    with pytest.raises(ValueError, match="at least 2 published seeds"):
        summ.compare_with_published([1.0, 2.0], 5.0, 2.0, 1)


def test_bench_methods_ppe_table_sets_themis_beside_the_published_row(tmp_path):
    clean = tmp_path / "clean" / "walker_walk"
    for name, final in (("100/pebble/seed0", 300.0), ("100/pebble/seed1", 500.0),
                        ("100/qpa/seed0", 100.0), ("plain_sac/seed0", 950.0)):
        fake_run(clean, name, [], [250_000, 500_000], [0.0, final])
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_methods.py"),
                           "--protocol", "ppe", "--seeds", "0", "1", "--out", str(tmp_path),
                           "--reps", "100", "--table-only"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "10 runs, 4 already done, 6 to go" in proc.stdout
    rows = {line.split(" | ")[0][2:]: line for line in proc.stdout.split("beside PPE")[1]
            .splitlines() if line.startswith("| ")}
    # pebble: SE 141.4 / √2 = 100 beside 159 / √4 = 79.5 (population std over 5 seeds);
    # t = -53 / √(100² + 79.5²) = -0.41, Welch df 2.42, p 0.712
    assert rows["pebble"] == ("| pebble | 453 ± 159 | 453 ± 80 | 400 ± 100 | 2 | 300, 500 | "
                              "-0.41 | 0.712 | inside |")
    assert rows["qpa"] == "| qpa | 796 ± 148 | 796 ± 74 | 100 ± - | 1 | 100 | - | - | - |"
    assert rows["surf"] == "| surf | 661 ± 92 | - | - | 0 | - | - | - | - |"
    assert rows["sac (true reward)"].startswith("| sac (true reward) | - | - | 950 ± - | 1 |")
    assert "its population std over 5 seeds as σ/√4" in proc.stdout
    assert "ordering, paper: qpa > surf > pebble > rune; Themis: pebble > qpa" in proc.stdout


def test_bench_methods_record_keeps_finished_runs_for_a_later_session(tmp_path):
    """``--record``: finished runs go into a CSV with their curve and command; once their run
    folders are gone (a new checkout), the same command tables them from the CSV, and a row
    recorded under other settings is not mixed in."""
    first, record = tmp_path / "first", tmp_path / "record.csv"
    clean = first / "clean" / "walker_walk"
    fake_run(clean, "100/pebble/seed0", [], [250_000, 500_000], [100.0, 300.0])
    fake_run(clean, "100/qpa/seed1", [], [250_000, 500_000], [200.0, 700.0])
    fake_run(clean, "100/qpa/seed0", [], [250_000], [50.0])  # interrupted: not recorded

    def table(out: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_methods.py"),
                               "--protocol", "ppe", "--seeds", "0", "1", "--out", str(out),
                               "--reps", "100", "--table-only", "--record", str(record),
                               *extra], capture_output=True, text=True, timeout=120, cwd=ROOT)

    proc = table(first)
    assert proc.returncode == 0, proc.stderr
    assert "2 finished runs here, 0 from" in proc.stdout
    rows = pd.read_csv(record)
    assert sorted(zip(rows["method"], rows["seed"], rows["final"], strict=True)) == [
        ("pebble", 0, 300.0), ("qpa", 1, 700.0)]
    assert rows["curve"].tolist() == ["250000:100.0 500000:300.0", "250000:200.0 500000:700.0"]
    assert "method=qpa" in rows["command"].iloc[1] and "seed=1" in rows["command"].iloc[1]
    assert "torch_threads" not in rows["command"].iloc[0]
    proc = table(tmp_path / "new")  # a new checkout: no run folders, the record only
    assert proc.returncode == 0, proc.stderr
    assert "0 finished runs here, 2 from" in proc.stdout
    assert "| pebble | 453 ± 159 | 453 ± 80 | 300 ± - | 1 | 300 |" in proc.stdout
    assert "| qpa | 796 ± 148 | 796 ± 74 | 700 ± - | 1 | 700 |" in proc.stdout
    proc = table(tmp_path / "new", "--sac-width", "1024")  # other settings: not these runs
    assert "0 finished runs here, 0 from" in proc.stdout and proc.returncode == 1
    wide = tmp_path / "wide" / "clean" / "walker_walk"  # the same cell under other settings
    fake_run(wide, "100/pebble/seed0", [], [250_000, 500_000], [100.0, 400.0])
    proc = table(tmp_path / "wide", "--sac-width", "256")
    assert proc.returncode == 0 and "1 finished runs here, 0 from" in proc.stdout
    rows = pd.read_csv(record)  # recorded beside the 2x128 run, not over it
    assert sorted(zip(rows["method"], rows["seed"], rows["final"], strict=True)) == [
        ("pebble", 0, 300.0), ("pebble", 0, 400.0), ("qpa", 1, 700.0)]
    assert "| pebble | 453 ± 159 | 453 ± 80 | 300 ± - | 1 | 300 |" in table(
        tmp_path / "new").stdout


@pytest.mark.xdist_group("busy")  # runs two at a time
@pytest.mark.slow
def test_bench_methods_runs_a_grid_prints_the_table_and_resumes(tmp_path):
    tiny = [o for o in TINY_PENDULUM if not o.startswith(("domain=", "env=", "num_train_steps",
                                                          "max_feedback", "reward_batch",
                                                          "eval_frequency"))]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_methods.py"), "--domain", "Classic",
           "--envs", "Pendulum-v1", "--steps", "1000", "--budgets", "20", "--seeds", "0",
           "--methods", "sac", "rune", "--rounds", "2", "--noisy", "Pendulum-v1",
           "--out", str(tmp_path), "--reps", "100", "--jobs", "2", "--", *tiny]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "4 runs, 0 already done, 4 to go (2 at a time," in first.stdout
    table = [line for line in first.stdout.splitlines() if line.startswith("| Pendulum-v1")]
    assert [line.split(" | ")[2] for line in table] == ["sac", "rune"]
    assert table[0].endswith("| - |")  # Pendulum's returns are negative: no ratio
    noisy = first.stdout.split("noisy labels")[1]
    assert "| pebble | 1 |" in noisy and "| rime | 1 |" in noisy
    overrides = (tmp_path / "noisy" / "Pendulum-v1" / "20" / "rime" / "seed0" / ".hydra" /
                 "overrides.yaml").read_text()
    assert "teacher_eps_mistake=0.3" in overrides and "method=rime" in overrides
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "4 already done, 0 to go" in again.stdout


@pytest.mark.xdist_group("busy")  # times its runs
@pytest.mark.slow
def test_bench_main_job_times_each_seed_prints_the_target_and_resumes(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_main_job.py"), "--seeds", "0",
           "--out", str(tmp_path), "--reps", "100", "--target-return=-1e9", "--",
           *TINY_PENDULUM]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "THEMIS_THREADS": "1"})
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    timing = json.loads((tmp_path / "seed0.json").read_text())
    assert 0 < timing["wall_s"] < 600 and timing["peak_rss_mb"] > 50  # torch alone is > 50 MB
    assert "| seed | wall clock | peak RSS | 0.6k | 1.2k | target |" in first.stdout
    finals = pd.read_csv(tmp_path / "seed0" / "eval.csv")["episode_reward"]
    row = next(line for line in first.stdout.splitlines() if line.startswith("| 0 |"))
    assert row.endswith(f"| {finals.iloc[-1]:.0f} | met |")
    assert "target met on 1 of 1" in first.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "1 seeds, 1 already done" in again.stdout
    assert row in again.stdout

def _mutation_report():
    spec = importlib.util.spec_from_file_location("mutation_report",
                                                  ROOT / "scripts" / "mutation_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mutation_sample_is_seeded_per_module_and_has_a_wilson_interval():
    report = _mutation_report()
    names = ([f"themis.a.x_f__mutmut_{i}" for i in range(1, 41)]
             + [f"themis.b.xǁCǁm__mutmut_{i}" for i in range(1, 4)])
    sample = report.pick(names, 5, seed=0)
    assert sample == report.pick(list(reversed(names)), 5, seed=0)  # order of listing is moot
    assert sample != report.pick(names, 5, seed=1)
    assert sum(report.module_of(n) == "themis.a" for n in sample) == 5
    assert [n for n in sample if report.module_of(n) == "themis.b"] == names[40:]  # all 3
    row = report._row("m", collections.Counter(killed=8, timeout=1, survived=1), ci=True)
    # 9 of 10 killed: 90 %, 8 by a failing test; Wilson 95 % interval [59.6 %, 98.2 %]
    assert "| 90.0 % | 80.0 % | 60–98 % |" in row


def test_mutation_report_without_mutmut_is_one_line(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no mutmut on the PATH
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "mutation_report.py")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("mutation_report: error: mutmut is not installed; "
                                   "scripts/mutation.sh installs it and makes the mutants this "
                                   "script reports on")


# ------------------------------------------------------------------ sweeps on a Ray cluster
def _pids_of(marker: str) -> set[int]:
    """Processes whose command line holds ``marker``, and their descendants."""
    procs: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        procs[int(entry)] = (ppid, cmdline)
    found = {pid for pid, (_, cmd) in procs.items() if marker in cmd}
    while True:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in found} - found
        if not more:
            return found
        found |= more


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def _listening_addresses(pids: set[int]) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* write them) on which ``pids`` listen."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                addresses.add(fields[1].split(":")[0])
    return addresses


@pytest.fixture
def ray_head(isolated_home):
    """A real Ray cluster on this machine: ``ray start --head --block`` on 127.0.0.1 with 2
    CPUs, in its own process group; stopped (the group, then anything left of its session)
    at the end. ``HOME`` is a fresh folder for the cluster and the test's launches alike
    (no ``~/.ray/auth_token`` of an earlier Ray session)."""
    import socket
    import tempfile
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="themis-ray-", dir="/tmp")  # Ray's socket paths are short
    env = {k: v for k, v in os.environ.items() if k != "THEMIS_THREADS"}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # the node address stays the loopback
               RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT))
    log = open(os.path.join(temp, "head.log"), "w")
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
         "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
         "--include-dashboard=false", "--disable-usage-stats", "--temp-dir", temp],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in open(log.name).read():
            assert head.poll() is None and time.monotonic() < deadline, open(log.name).read()
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", temp
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGTERM)
            try:
                head.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(head.pid, signal.SIGKILL)
        time.sleep(1)
        for pid in _pids_of(temp):  # a worker that outlived the head
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        log.close()


@pytest.mark.xdist_group("busy")  # a Ray cluster, two jobs
@pytest.mark.slow
def test_ray_launcher_runs_a_two_job_sweep_on_a_local_cluster_then_summarize(tmp_path,
                                                                              ray_head):
    address, temp = ray_head
    listening = _listening_addresses(_pids_of(temp))
    assert listening and listening <= LOOPBACK  # nothing of the cluster listens beyond
    sweep = tmp_path / "sweep"
    proc = launch("themis_train.sh", "-m", "hydra/launcher=ray",
                  f"hydra.launcher.address={address}", "hydra.launcher.num_cpus=1",
                  *SWEEP_TINY, "seed=0,1", f"hydra.sweep.dir={sweep}", threads=None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "Ray: launching 2 jobs (1 CPU each)" in out
    workers = {line.split("pid=")[1].split(")")[0] for line in out.splitlines()
               if "(_run_job pid=" in line}
    assert len(workers) == 2  # two Ray workers ran the two jobs
    runs = sorted(p.parent for p in sweep.rglob("eval.csv"))
    assert [r.name for r in runs] == ["0", "1"]
    for run in runs:
        assert pd.read_csv(run / "eval.csv")["step"].tolist() == [400, 800]
        assert "torch_threads: 1\n" in (run / "config.yaml").read_text()  # = num_cpus
        hydra_yaml = (run / ".hydra" / "hydra.yaml").read_text()
        assert "id: ray_" in hydra_yaml  # the Ray task's id is the Hydra job id
    proc = summarize(sweep, "--reps", "100")
    assert proc.returncode == 0, proc.stderr
    row = pd.read_csv(sweep / "summary.csv").iloc[0]
    assert row["runs"] == 2 and row["final_step"] == 800


def test_ray_launcher_is_a_hydra_plugin_with_its_config(compose):
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher

    names = [c.__name__ for c in Plugins.instance().discover(Launcher)]
    assert "ThemisRayLauncher" in names
    cfg = compose(["hydra/launcher=ray", "hydra.launcher.num_cpus=2",
                   "hydra.launcher.address=auto"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("themis_ray_launcher.ray_launcher."
                                                "ThemisRayLauncher")
    assert (cfg.hydra.launcher.num_cpus, cfg.hydra.launcher.address) == (2, "auto")


# ------------------------------------------------------------------ hyper-parameter search
def test_optuna_search_space_from_hydra_sweeps():
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    from hydra_plugins.themis_optuna_sweeper.optuna_sweeper import ThemisOptunaSweeper

    sweeper = ThemisOptunaSweeper(params={"reward_lr": "tag(log, interval(1e-4, 3e-3))",
                                          "segment": "choice(25, 50)", "seed": "3"})
    fixed, space = sweeper.search_space(["reward_batch=range(10, 60, 20)", "segment=choice(5,6)",
                                         "env=Hopper-v5"])
    assert fixed == ["seed=3", "env=Hopper-v5"]
    assert space["reward_lr"] == FloatDistribution(1e-4, 3e-3, log=True)
    assert space["reward_batch"] == IntDistribution(10, 50, step=20)  # 10, 30, 50
    assert isinstance(space["segment"], CategoricalDistribution)  # the command line wins
    assert [int(c) for c in space["segment"].choices] == [5, 6]
    with pytest.raises(ValueError, match=r"nothing to search|Optuna searches"):
        ThemisOptunaSweeper().search_space(["x=glob(*)"])


@pytest.mark.xdist_group("busy")  # two trials at once
@pytest.mark.slow
def test_optuna_sweeper_runs_a_two_trial_study_saved_in_the_sweep_dir_then_summarize(tmp_path):
    import optuna
    import yaml

    sweep = tmp_path / "sweep"
    search = [*SWEEP_TINY, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2",
              "hydra.sweeper.n_jobs=2", "reward_lr=tag(log,interval(1e-4,1e-2))",
              "segment=choice(10,20)", "reward_batch=range(5,15,5)",
              f"hydra.sweep.dir={sweep}"]
    proc = launch("themis_train.sh", "-m", *search, threads=None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = optuna.load_study(study_name="themis", storage=f"sqlite:///{sweep / 'optuna.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    for trial in study.trials:  # each trial is a run; its value is the run's final return
        run = sweep / str(trial.number)
        final = pd.read_csv(run / "eval.csv")["episode_reward"].iloc[-1]
        assert trial.value == pytest.approx(final, abs=1e-5)
        overrides = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())
        assert f"segment={trial.params['segment']}" in overrides
        assert f"reward_lr={trial.params['reward_lr']}" in overrides
        assert 1e-4 <= trial.params["reward_lr"] <= 1e-2
    best = yaml.safe_load((sweep / "optuna_best.yaml").read_text())
    assert best["value"] == pytest.approx(max(t.value for t in study.trials))
    assert best["trial"] == study.best_trial.number

    proc = summarize(sweep, "--reps", "100")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(sweep / "summary.csv")
    assert len(table) == 2 and table["optuna_best"].sum() == 1
    marked = table[table["optuna_best"]].iloc[0]
    assert marked["mean"] == pytest.approx(best["value"], abs=1e-3)
    text = (sweep / "summary.md").read_text()
    assert f"| {marked['setting']} ★ |" in text and f"best trial: #{best['trial']}" in text

    # the same command with more trials continues the study in the sweep dir
    proc = launch("themis_train.sh", "-m", *search, "hydra.sweeper.n_trials=3", threads=None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = optuna.load_study(study_name="themis", storage=f"sqlite:///{sweep / 'optuna.db'}")
    assert len(study.trials) == 3 and (sweep / "2" / "eval.csv").is_file()


def test_optuna_example_search_composes(compose):
    cfg = compose(["hydra/sweeper=reward_search"], return_hydra_config=True)
    assert cfg.hydra.sweeper._target_.endswith("ThemisOptunaSweeper")
    assert set(cfg.hydra.sweeper.params) == {"reward_lr", "segment", "reward_batch"}


def test_ray_launcher_gives_one_line_when_the_cluster_refuses_its_token(monkeypatch, capsys):
    """A ``~/.ray/auth_token`` of another cluster: Ray's AuthenticationError is one line
    and exit code 2, not a traceback."""
    import ray
    from ray.exceptions import AuthenticationError

    from hydra_plugins.themis_ray_launcher.ray_launcher import ThemisRayLauncher

    def refuse(**kwargs):
        raise AuthenticationError("Authentication failed: InvalidAuthToken")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(SystemExit) as stop:
        ThemisRayLauncher(address="127.0.0.1:6379").start_ray()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("themis: error: the Ray cluster at "
                                                   "127.0.0.1:6379 refused"), err
    assert "Traceback" not in err

    def other(**kwargs):
        raise ConnectionError("no cluster at 127.0.0.1:6379")

    monkeypatch.setattr(ray, "init", other)  # other errors stay Ray's own
    with pytest.raises(ConnectionError):
        ThemisRayLauncher(address="127.0.0.1:6379").start_ray()


def test_bench_methods_record_names_the_settings_a_run_ran_not_the_tabling_command(tmp_path):
    """A run folder does not encode the ``--`` extras: a run made with ``-- precision=bf16``
    and tabled without them is recorded with its own overrides (threads and resume left out),
    so the record never claims settings the run did not have."""
    record = tmp_path / "record.csv"
    clean = tmp_path / "clean" / "walker_walk"
    fake_run(clean, "100/pebble/seed0", ["env=walker_walk", "seed=0", "torch_threads=1",
                                         "precision=bf16", "method=pebble", "resume=true"],
             [250_000, 500_000], [100.0, 300.0])
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_methods.py"),
                           "--protocol", "ppe", "--seeds", "0", "--out", str(tmp_path),
                           "--reps", "100", "--table-only", "--record", str(record)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = pd.read_csv(record)
    assert rows["command"].tolist() == ["env=walker_walk seed=0 precision=bf16 method=pebble"]
