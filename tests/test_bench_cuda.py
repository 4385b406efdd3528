"""The prepared CUDA-path benchmark runs on the CPU and records what it measured (issue 84 item
6: it is run the first time a GPU is at hand; until then the suite keeps it working)."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import load_file


@pytest.mark.slow
def test_the_cuda_path_benchmark_measures_every_piece_on_the_cpu(tmp_path):
    bench = load_file("benchmarks/bench_cuda.py")
    record = tmp_path / "cuda_path.csv"
    assert bench.main(["--devices", "cpu", "--quick", "--record", str(record)]) == 0
    rows = pd.read_csv(record)
    assert sorted(rows["piece"]) == sorted(bench.PIECES)
    assert (rows["device"] == "cpu").all() and (rows["rate"] > 0).all()
    assert rows["commit"].notna().all() and rows["machine"].str.contains("cores").all()
    assert set(rows["unit"]) == {"agent steps/s", "label-passes/s", "frames/s"}


def test_asking_for_cuda_without_a_gpu_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    bench = load_file("benchmarks/bench_cuda.py")
    assert bench.main(["--devices", "cuda"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
