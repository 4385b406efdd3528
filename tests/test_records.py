"""``benchmarks/records.py``: a recorded row's provenance and the merge of rows into a record
(issue 84 item 2)."""

from __future__ import annotations

import re
import subprocess

import pandas as pd
import pytest

from tests.conftest import load_file

records = load_file("benchmarks/records.py")


def test_a_row_recorded_again_replaces_its_old_one_and_the_others_stay(tmp_path):
    path = tmp_path / "sub" / "r.csv"
    records.merge_rows(path, [{"kind": "a", "seed": 1, "final": 10.0},
                              {"kind": "a", "seed": 0, "final": 5.0}], ["kind", "seed"])
    records.merge_rows(path, [{"kind": "a", "seed": 1, "final": 12.0, "extra": "x"},
                              {"kind": "b", "seed": 0, "final": 7.0}], ["kind", "seed"])
    table = pd.read_csv(path)
    assert table[["kind", "seed", "final"]].values.tolist() == [
        ["a", 0, 5.0], ["a", 1, 12.0], ["b", 0, 7.0]]
    assert "extra" in table.columns
    with pytest.raises(ValueError, match="key column"):
        records.merge_rows(path, [{"kind": "a"}], ["kind", "seed"])
    with pytest.raises(ValueError, match="no rows"):
        records.merge_rows(path, [], ["kind"])


def test_the_commit_says_dirty_when_tracked_files_changed(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    assert records.commit(tmp_path) == "unknown"
    git("init", "-q")
    (tmp_path / "f.txt").write_text("one\n")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    clean = records.commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{7,}", clean)
    (tmp_path / "new.txt").write_text("untracked\n")  # an untracked file is not a change
    assert records.commit(tmp_path) == clean
    (tmp_path / "f.txt").write_text("two\n")
    assert records.commit(tmp_path) == clean + "-dirty"


def test_provenance_names_the_command_as_typed_and_the_run_s_wall_time():
    ran = records.command(records.ROOT / "benchmarks" / "bench_ceiling.py",
                          ["--seeds", "0", "1", "--out", "my runs"])
    assert ran == "python benchmarks/bench_ceiling.py --seeds 0 1 --out 'my runs'"
    row = records.provenance(12.345, ran)
    assert list(row) == list(records.PROVENANCE)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row["date"])
    assert row["wall_s"] == 12.3 and row["machine"].endswith(" cores")


def test_a_curve_column_reads_back_as_it_was_written():
    text = records.curve_text({20000: 599.26, 10000: 47.0})
    assert text == "10000:47.0 20000:599.3"
    assert records.parse_curve(text) == {10000: 47.0, 20000: 599.3}
