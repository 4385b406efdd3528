"""A fixed seed gives the recorded numbers: a tiny SAC run and a tiny PPO run reproduce the
``eval.csv`` and preference labels recorded in ``tests/fixtures/`` before the redesign of the
loops, and a tiny run of every method (SAC; RUNE and RIME also on PPO) the ``eval.csv``,
labels and ``reward.csv`` numbers recorded before the methods became plug-ins (issue 36).
A change that alters numbers on purpose re-records them:
``THEMIS_RECORD_FIXTURES=1 scripts/test.sh tests/test_fixed_seed_fixture.py``.

Each run is made in a child process whose kernels do not depend on the CPU: one seed's
float32 numbers otherwise differ in their last bits between CPUs (MKL picks its kernels by
vendor and generation, ATen and NumPy by vector width, glibc's libm by FMA), SAC's updates
carry such bits on, and a near tie in a sampler then picks another pair: fixtures recorded on
an AMD EPYC (Zen 4) gave episode returns 0.12 % apart on an Intel Xeon with AMX, and a label
flipped with MKL limited to AVX2. The child pins MKL to its COMPATIBLE branch (MKL_CBWR),
ATen to its default kernels, NumPy to its SSE3 baseline, libm to its plain x86-64 variants,
and one thread, and checks that the pins hold before it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tests.conftest import ROOT, TINY_PENDULUM
from themis.reward import PreferenceDataset

FIXTURES = ROOT / "tests" / "fixtures"
# float32 everywhere: bfloat16 products (precision=auto on CPUs that have them) round
# differently from one CPU to another
_NUMPY_DISPATCH = ("SSSE3 SSE41 POPCNT SSE42 AVX F16C FMA3 AVX2 AVX512F AVX512CD AVX512_KNL "
                   "AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR")
PINNED_KERNELS = {
    "MKL_CBWR": "COMPATIBLE",  # MKL's branch for Intel and compatible CPUs alike
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "NPY_DISABLE_CPU_FEATURES": _NUMPY_DISPATCH.replace(" ", ","),
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX,-AVX2,-FMA,-FMA4,-AVX512F,-AVX512DQ,-AVX512BW,"
                      "-AVX512VL",
    "THEMIS_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
}
_CHILD = """
import json, sys
import numpy._core._multiarray_umath as npcore
import torch
assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
assert not any(npcore.__cpu_features__[f] for f in ("AVX", "AVX2", "FMA3", "AVX512F"))
from themis.builder import make_workspace
from themis.run.closing import finish
from themis.run.config import compose
ws = make_workspace(compose(json.loads(sys.argv[1])), sys.argv[2])
ws.run()
finish(ws)
"""


def run_pinned(overrides: list[str], run_dir) -> None:
    """Run ``overrides`` to the end in a child process with CPU-independent kernels."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("MKL_", "NPY_", "GLIBC_", "ATEN_", "ONEDNN_"))}
    env.update(PINNED_KERNELS)
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(overrides), str(run_dir)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


RUNS = {
    "sac": [*TINY_PENDULUM, "feed_type=4", "teacher=noisy", "precision=fp32"],
    "ppo": [*TINY_PENDULUM, "domain=Box2d", "env=LunarLander-v3", "ppo.num_envs=2",
            "ppo.num_steps=32", "feed_type=2", "precision=fp32"],
}
PPO_TINY = ["domain=Box2d", "env=LunarLander-v3", "ppo.num_envs=2", "ppo.num_steps=32"]
for _method in ("surf", "rune", "qpa", "rime", "mrn"):
    RUNS[f"sac_{_method}"] = [*TINY_PENDULUM, f"method={_method}", "precision=fp32",
                              "mrn.meta_steps=250", "surf.inv_label_ratio=4"]
for _method in ("rune", "rime"):
    RUNS[f"ppo_{_method}"] = [*TINY_PENDULUM, *PPO_TINY, f"method={_method}", "precision=fp32"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_fixed_seed_reproduces_the_recorded_run(tmp_path, name):
    run_pinned(RUNS[name], tmp_path)
    expected = FIXTURES / name
    if os.environ.get("THEMIS_RECORD_FIXTURES"):
        expected.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "eval.csv", expected / "eval.csv")
        shutil.copy(tmp_path / "preferences" / "labels.csv", expected / "labels.csv")
        if "_" in name:
            shutil.copy(tmp_path / "reward.csv", expected / "reward.csv")
    got_eval = pd.read_csv(tmp_path / "eval.csv")
    want_eval = pd.read_csv(expected / "eval.csv")
    assert list(got_eval.columns) == list(want_eval.columns)
    for column in ("step", "total_feedback", "labeled_feedback"):
        assert got_eval[column].tolist() == want_eval[column].tolist()
    np.testing.assert_allclose(got_eval["episode_reward"], want_eval["episode_reward"],
                               rtol=1e-4)
    got_labels = pd.read_csv(tmp_path / "preferences" / "labels.csv")
    want_labels = pd.read_csv(expected / "labels.csv")
    assert got_labels["label"].tolist() == want_labels["label"].tolist()
    assert got_labels["labeler"].tolist() == want_labels["labeler"].tolist()
    assert len(PreferenceDataset.load(tmp_path / "preferences")) == len(want_labels)
    if "_" in name:  # a method's run: its reward-training numbers too
        got_rounds = pd.read_csv(tmp_path / "reward.csv")
        want_rounds = pd.read_csv(expected / "reward.csv")
        assert list(got_rounds.columns) == list(want_rounds.columns)
        for column in want_rounds.columns:  # every number, the method's own columns too
            if pd.api.types.is_numeric_dtype(want_rounds[column]):
                np.testing.assert_allclose(got_rounds[column].astype(float),
                                           want_rounds[column].astype(float), rtol=1e-5,
                                           equal_nan=True, err_msg=column)
            else:
                assert got_rounds[column].tolist() == want_rounds[column].tolist(), column
