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


@pytest.mark.parametrize(("flags", "isa"), [("fpu sse2 avx2 fma", ", AVX2"),
                                             ("avx2 avx512f avx512bw", ", AVX-512"),
                                             ("avx2 avx512f avx512_bf16", ", AVX-512 BF16"),
                                             ("avx512f avx512_bf16 amx_bf16", ", AMX"),
                                             ("neon", "")])
def test_the_machine_names_the_cpu_its_cores_and_its_widest_vector_instructions(tmp_path, flags,
                                                                               isa):
    """Hosts with one model name differ in AVX-512 (speed, and what ``precision=auto`` picks)."""
    cpu = "processor\t: {}\nmodel name\t: AMD EPYC\nflags\t\t: {}\n"
    info = tmp_path / "cpuinfo"
    info.write_text(cpu.format(0, flags) + "\n" + cpu.format(1, "other"))
    assert re.fullmatch(rf"AMD EPYC, \d+ cores{isa}", records.machine(info))


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
    assert row["wall_s"] == 12.3 and re.search(r", \d+ cores(, |$)", row["machine"])


def test_a_curve_column_reads_back_as_it_was_written():
    text = records.curve_text({20000: 599.26, 10000: 47.0})
    assert text == "10000:47.0 20000:599.3"
    assert records.parse_curve(text) == {10000: 47.0, 20000: 599.3}


# ---- each benchmark's --record writes its finished runs' rows --------------------------------

def fake_worker(monkeypatch, module, stdout_for):
    """Replace ``module``'s worker processes by ``stdout_for(cmd)``'s printed line (git still
    runs: the rows' commit)."""
    real = subprocess.run

    def run(cmd, *args, **kwargs):
        if cmd[0] == "git":
            return real(cmd, *args, **kwargs)
        return subprocess.CompletedProcess(cmd, 0, stdout_for(cmd) + "\n", "")
    monkeypatch.setattr(module.subprocess, "run", run)


def test_bench_ceiling_records_each_finished_run_and_not_one_cut_short(tmp_path, monkeypatch):
    bench = load_file("benchmarks/bench_ceiling.py")
    # seed 1 of SB3 stopped before its last evaluation
    fake_worker(monkeypatch, bench, lambda cmd: '{"10000": 5.0}' if cmd[3] == "sb3_cpu"
                and cmd[6] == "1" else '{"10000": 5.0, "20000": 7.5}')
    record = tmp_path / "ceiling.csv"
    argv = ["--steps", "20000", "--seeds", "0", "1", "--jobs", "1", "--out",
            str(tmp_path / "runs"), "--record", str(record)]
    assert bench.main(argv) == 0
    rows = pd.read_csv(record)
    assert sorted(zip(rows["kind"], rows["seed"], strict=True)) == [
        ("sb3_cpu", 0), ("themis", 0), ("themis", 1)]
    assert rows["final"].tolist() == [7.5] * 3 and rows["curve"].iloc[0] == "10000:5 20000:8"
    assert rows["command"].iloc[0] == "python benchmarks/bench_ceiling.py " + " ".join(argv)
    assert rows["library"].str.startswith(("stable-baselines3 ", "-")).all()
    assert set(records.PROVENANCE) <= set(rows.columns)


def test_bench_ceiling_goes_on_where_a_stopped_session_left_it(tmp_path, monkeypatch):
    """A run that finished is not run again; a Themis run with a checkpoint is resumed."""
    bench = load_file("benchmarks/bench_ceiling.py")
    ran = []
    fake_worker(monkeypatch, bench, lambda cmd: ran.append((cmd[3], cmd[6])) or
                '{"10000": 5.0, "20000": 7.5}')
    out = tmp_path / "runs"
    out.mkdir()
    (out / "sb3_cpu0.json").write_text('{"10000": 1.0, "20000": 2.0}')  # finished
    (out / "sb3_cpu1.json").write_text('{"10000": 1.0}')  # stopped: starts again
    (out / "themis0").mkdir()
    pd.DataFrame({"step": [10000, 20000], "episode_reward": [3.0, 4.0]}).to_csv(
        out / "themis0" / "eval.csv", index=False)
    assert bench.main(["--steps", "20000", "--seeds", "0", "1", "--jobs", "1",
                       "--out", str(out)]) == 0
    assert sorted(ran) == [("sb3_cpu", "1"), ("themis", "1")]
    commands = []
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, **kw: commands.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0, "", ""))
    (out / "themis0" / "checkpoints").mkdir()
    assert bench.themis_run("HalfCheetah-v5", 20000, 0, out / "themis0") == {10000: 3.0,
                                                                              20000: 4.0}
    assert f"resume={out / 'themis0'}" in commands[0]
    assert not any(c.startswith("hydra.run.dir=") for c in commands[0])


def test_bench_throughput_records_every_measurement_of_a_session(tmp_path, monkeypatch):
    bench = load_file("benchmarks/bench_throughput.py")
    fake_worker(monkeypatch, bench, lambda cmd: '{"steps_per_s": 123.456, "threads": 1}')
    record = tmp_path / "throughput.csv"
    assert bench.main(["--variants", "sb3:1,sac:auto:bf16", "--steps", "10", "--warmup", "1",
                       "--repeats", "2", "--record", str(record)]) == 0
    rows = pd.read_csv(record, dtype={"threads": str})
    assert len(rows) == 4 and rows["session"].nunique() == 1
    assert sorted(zip(rows["kind"], rows["repeat"], strict=True)) == [
        ("sac", 0), ("sac", 1), ("sb3", 0), ("sb3", 1)]
    assert rows["steps_per_s"].tolist() == [123.46] * 4
    assert set(records.PROVENANCE) <= set(rows.columns)


def test_bench_wrapper_sb3_records_each_job_beside_its_ceiling(tmp_path, monkeypatch):
    import json

    bench = load_file("benchmarks/bench_wrapper_sb3.py")
    fake_worker(monkeypatch, bench, lambda cmd: json.dumps({
        "job": cmd[cmd.index("--worker") + 1], "seed": int(cmd[cmd.index("--seed") + 1]),
        "return": 1000.04, "seconds": 60.0}))
    record = tmp_path / "wrapper.csv"
    bench.main(["--out", str(tmp_path / "out"), "--only", "sac,sac-true", "--seeds", "0", "1",
                "--jobs", "1", "--record", str(record)])
    rows = pd.read_csv(record)
    assert sorted(zip(rows["job"], rows["seed"], rows["queries"], strict=True)) == [
        ("sac", 0, 500), ("sac", 1, 500), ("sac-true", 0, 0), ("sac-true", 1, 0)]
    assert (rows["final"] == 1000.0).all() and (rows["wall_s"] == 60.0).all()


def test_simulate_crowd_records_a_mode_with_its_run_s_seed_and_crowd(tmp_path):
    crowd = load_file("scripts/simulate_crowd.py")
    args = crowd.main.__globals__["argparse"].Namespace(
        careful=6, random=2, adversaries=1, careful_mistakes=0.1, labels_per_query=3,
        gold_fraction=0.1, min_gold_answers=5, extra=["seed=3"])
    (tmp_path / "config.yaml").write_text("seed: 3\n")
    row = crowd.record_row(tmp_path, {
        "mode": "filter", "flagged": "labeler9 (adversary)",
        "gold answers when flagged": "labeler9: 5", "training labels": 415,
        "agreement with true returns": 0.83412, "held-out accuracy": 0.8,
        "final true return": -99.0}, args, 540.0, "python scripts/simulate_crowd.py --record")
    assert row["seed"] == 3 and row["agreement"] == 0.8341 and row["training_labels"] == 415
    assert row["crowd"].startswith("careful=6 random=2 adversaries=1") and "seed=3" in row["crowd"]
    assert row["wall_s"] == 540.0


def test_a_run_folder_keeps_its_own_provenance_across_resumes(tmp_path):
    run = tmp_path / "run"
    assert records.run_provenance(run) is None
    records.note_run(run, "python benchmarks/x.py --seeds 0")
    records.add_wall(run, 100.0, 90.0)
    first = records.run_provenance(run)
    records.note_run(run, "python benchmarks/x.py --seeds 0 1")  # resumed by another command
    records.add_wall(run, 50.0)
    again = records.run_provenance(run)
    assert again["command"] == "python benchmarks/x.py --seeds 0"  # the one it started with
    assert again["date"] == first["date"] and again["commits"] == first["commits"]
    assert again["wall_s"] == 150.0 and re.search(r", \d+ cores(, |$)", again["machine"])
