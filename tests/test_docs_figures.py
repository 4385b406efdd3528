"""``scripts/docs_figures.py`` draws each method's seeds once: the rows of the README's table,
not every run recorded beside them (issue 84 item 3)."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import ROOT, load_file

figures = load_file("scripts/docs_figures.py")


def test_the_walker_walk_figure_takes_one_run_per_method_and_seed():
    table = pd.read_csv(ROOT / "results" / "ppe_walker_walk.csv")
    assert table.duplicated(["method", "seed"]).any()  # the record keeps runs side by side
    rows = figures.table_rows(table)
    assert not rows.duplicated(["method", "seed"]).any()
    seeds = rows.groupby("method")["seed"].apply(sorted).to_dict()
    assert seeds["pebble"] == [0, 1, 2, 3, 4] and seeds["qpa"] == [0, 1, 2, 3]
    assert rows[rows["method"] == "qpa"]["command"].str.contains("qpa.iterations=true").all()
    assert not rows["command"].str.contains("precision=fp32").any()


def test_a_seed_recorded_twice_under_the_tables_command_is_refused():
    row = {"method": "pebble", "seed": 0, "curve": "1000:5", "command": "seed=0"}
    table = pd.DataFrame([row, {**row, "curve": "1000:7"}, {**row, "seed": 1}])
    with pytest.raises(ValueError, match=r"\('pebble', 0\)"):
        figures.table_rows(table)
    fp32 = pd.DataFrame([row, {**row, "command": "seed=0 precision=fp32"}])
    assert figures.table_rows(fp32)["command"].tolist() == ["seed=0"]


def test_the_figures_are_drawn_from_the_records(tmp_path):
    figures.ppe_walker_walk(ROOT / "results" / "ppe_walker_walk.csv", tmp_path / "ppe.png")
    figures.main_job(ROOT / "results" / "main_job.csv", tmp_path / "main_job.png")
    figures.pong(ROOT / "results" / "drlhp_pong_curves.csv", tmp_path / "pong.png",
                 ROOT / "results" / "drlhp_pong_curves_first_run.csv")
    for name in ("ppe.png", "main_job.png", "pong.png"):
        assert (tmp_path / name).stat().st_size > 10_000
