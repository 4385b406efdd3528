"""The main job's learning record guards the default path (issue 82).

A fixed-seed fixture pins the default path's numbers on a tiny run; it cannot say whether the
main job still learns. So re-recording the default path's fixture (``tests/fixtures/sac``; any
change that moves the default path's numbers re-records it) comes with a new learning record of
the main job over five seeds in ``results/main_job.csv``, written by the benchmark itself:

    python benchmarks/bench_main_job.py --jobs 2 --threads 1 --record results/main_job.csv

and the front pages' main-job numbers come from that record.
"""

from __future__ import annotations

import re
from argparse import Namespace

import numpy as np
import pandas as pd
import pytest

from tests.conftest import ROOT, load_file

RECORD = ROOT / "results" / "main_job.csv"
SEEDS = {0, 1, 2, 3, 4}


bench = load_file("benchmarks/bench_main_job.py")


def test_todays_fixture_has_a_five_seed_learning_record_of_the_main_job():
    record = bench.read_record(RECORD)
    fixture = bench.fixture_digest(ROOT)
    rows = bench.default_record(record, fixture)
    assert SEEDS <= set(rows["seed"]), (
        f"tests/fixtures/sac (digest {fixture}) has no learning record of the main job over "
        "seeds 0-4 in results/main_job.csv: the default path's numbers moved. Run `python "
        "benchmarks/bench_main_job.py --jobs 2 --threads 1 --record results/main_job.csv` "
        "(docs/developing/tests.md) and commit the rows with the fixture")
    for _, row in rows.iterrows():
        assert row["steps"] == 80_000 and row["env"] == "HalfCheetah-v5" \
            and row["budget"] == 1000, row.to_dict()
        for column in ("recorded", "commit", "machine", "command"):
            assert str(row[column]) not in ("", "nan", "unknown"), column
        assert row["wall_clock_s"] > 0


def test_front_pages_quote_the_record():
    rows = bench.default_record(bench.read_record(RECORD), bench.fixture_digest(ROOT))
    finals = rows.sort_values("seed")["final"].to_numpy(float)
    iqm, lo, hi = bench.load_summarize().iqm_with_ci(finals, 2000)
    quoted = f"IQM {iqm:.0f} [95 % CI {lo:.0f}, {hi:.0f}] over seeds 0–4"
    for page in ("README.md", "docs/index.md", "docs/results/index.md",
                 "docs/results/main-job.md"):
        assert quoted in (ROOT / page).read_text(), f"{page} does not say '{quoted}'"


def test_fixture_digest_follows_every_byte_of_the_fixture(tmp_path):
    assert bench.fixture_digest(tmp_path) == "none"
    folder = tmp_path / bench.FIXTURE
    folder.mkdir(parents=True)
    (folder / "eval.csv").write_text("step,episode_reward\n600,-812.42\n")
    first = bench.fixture_digest(tmp_path)
    (folder / "eval.csv").write_text("step,episode_reward\n600,-810.16\n")
    assert bench.fixture_digest(tmp_path) != first
    (folder / "eval.csv").write_text("step,episode_reward\n600,-812.42\n")
    assert bench.fixture_digest(tmp_path) == first
    (folder / "labels.csv").write_text("label\n1\n")
    assert bench.fixture_digest(tmp_path) != first


def _row(seed: int, commit: str, final: int, command: str = "python x.py",
         fixture: str = "f1") -> dict:
    return {"env": "HalfCheetah-v5", "budget": 1000, "method": "pebble", "seed": seed,
            "final": final, "steps": 80000, "curve": f"80000:{final}", "wall_clock_s": 400,
            "peak_rss_gb": 1.0, "recorded": "2026-12-07", "commit": commit,
            "machine": "a CPU", "command": command, "fixture": fixture}


def test_a_run_recorded_again_replaces_its_row_and_others_stay(tmp_path):
    path = tmp_path / "record.csv"
    merged = bench.write_record(path, bench.read_record(path),
                                [_row(s, "aaa1111", 1000 + s) for s in range(3)])
    merged = bench.write_record(path, merged, [_row(1, "aaa1111", 5), _row(1, "bbb2222", 7)])
    back = bench.read_record(path)
    assert len(back) == len(merged) == 4
    mine = back[back["commit"] == "aaa1111"].set_index("seed")["final"].to_dict()
    assert mine == {0: 1000, 1: 5, 2: 1002}
    assert back[back["commit"] == "bbb2222"]["final"].tolist() == [7]


def test_the_guard_takes_the_plain_command_of_todays_fixture_only():
    record = pd.DataFrame(
        [_row(s, "old0000", 3000, fixture="f0") for s in range(5)]
        + [_row(s, "new1111", 2000 + s, command="python b.py --jobs 2") for s in range(5)]
        + [_row(s, "new1111", 9, command="python b.py -- method=rune") for s in range(5)])
    rows = bench.default_record(record, "f1")
    assert set(rows["seed"]) == SEEDS and (rows["final"] >= 2000).all()
    assert bench.default_record(record, "f2").empty


def test_recorded_command_names_what_ran_not_where_it_went():
    ran = Namespace(at=["260cd38", "b981352"], jobs=2, threads=1, extra=["method=rune"],
                    seeds=[0, 1], out="/tmp/x", record="r.csv", reps=10)
    assert bench.recorded_command(ran) == ("python benchmarks/bench_main_job.py --at 260cd38 "
                                           "b981352 --jobs 2 --threads 1 -- method=rune")
    plain = Namespace(at=None, jobs=1, threads=None, extra=[], seeds=[3], out=None)
    assert bench.recorded_command(plain) == "python benchmarks/bench_main_job.py"


@pytest.mark.parametrize("finals", [[3424, 3271, 3537, 2295, 3956]])
def test_record_table_gives_mean_and_standard_error(finals):
    record = pd.DataFrame([_row(s, "aaa1111", f) for s, f in enumerate(finals)])
    line = bench.record_table(record, 200)[-1]
    se = np.std(finals, ddof=1) / np.sqrt(len(finals))
    assert f"| {np.mean(finals):.0f} ± {se:.0f} |" in line
    assert re.search(r"\| 0 1 2 3 4 \| 3424 3271 3537 2295 3956 \|", line)
