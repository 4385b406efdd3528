"""Same seed, same config, CPU: identical evaluations and identical preference labels."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import TINY_PENDULUM
from themis.builder import make_workspace
from themis.reward import PreferenceDataset
from themis.run.closing import finish


def run_once(compose, run_dir, overrides):
    ws = make_workspace(compose([*TINY_PENDULUM, *overrides]), run_dir)
    ws.run()
    finish(ws)
    return pd.read_csv(run_dir / "eval.csv"), PreferenceDataset.load(run_dir / "preferences")


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    ["feed_type=1"],
    ["feed_type=3", "teacher=noisy"],
    ["domain=Box2d", "env=LunarLander-v3", "ppo.num_envs=2", "ppo.num_steps=32", "feed_type=2"],
], ids=["sac-disagreement", "sac-kcenter-noisy", "ppo-entropy"])
def test_same_seed_gives_identical_runs(compose, tmp_path, overrides):
    eval_a, prefs_a = run_once(compose, tmp_path / "a", overrides)
    eval_b, prefs_b = run_once(compose, tmp_path / "b", overrides)
    pd.testing.assert_frame_equal(eval_a, eval_b)
    assert len(prefs_a) == len(prefs_b) == 30
    assert (prefs_a.labels == prefs_b.labels).all()
    assert (prefs_a.observations == prefs_b.observations).all()
    _, prefs_c = run_once(compose, tmp_path / "c", [*overrides, "seed=1"])
    assert not (prefs_c.observations == prefs_a.observations).all()  # the seed matters
