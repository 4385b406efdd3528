"""A fixed seed gives the recorded numbers: a tiny SAC run and a tiny PPO run reproduce the
``eval.csv`` and preference labels recorded in ``tests/fixtures/`` before the redesign of the
loops, and a tiny run of every method (SAC; RUNE and RIME also on PPO) the ``eval.csv``,
labels and ``reward.csv`` numbers recorded before the methods became plug-ins (issue 36).
A change that alters numbers on purpose re-records them:
``THEMIS_RECORD_FIXTURES=1 scripts/test.sh tests/test_fixed_seed_fixture.py``.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pandas as pd
import pytest

from tests.conftest import ROOT, TINY_PENDULUM
from themis.cli.train import make_workspace
from themis.reward import PreferenceDataset

FIXTURES = ROOT / "tests" / "fixtures"
# float32 everywhere: bfloat16 products (precision=auto on CPUs that have them) round
# differently from one CPU to another
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
def test_fixed_seed_reproduces_the_recorded_run(compose, tmp_path, name):
    ws = make_workspace(compose(RUNS[name]), tmp_path)
    ws.run()
    ws.finish()
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
