"""The MovingDot table of ``benchmarks/bench_drlhp.py``: standard errors and the recorded CSV."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd

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
