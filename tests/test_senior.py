"""SENIOR's query selection (themis/methods/senior.py) on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.conftest import TINY_PENDULUM
from themis.agents.buffers import SegmentPairs
from themis.methods.base import MethodContext
from themis.methods.senior import SENIOR, SENIORConfig, main_directions, motion_scores
from themis.run.closing import finish
from themis.utils import ConfigError

H = 50
STATIC = np.zeros((H, 3))
ALONG_X = np.stack([np.arange(H, dtype=float), np.zeros(H), np.zeros(H)], 1)  # 1.0 apart
ALONG_Y = ALONG_X[:, [1, 0, 2]]


def pairs(*segments: tuple[np.ndarray, np.ndarray]) -> SegmentPairs:
    obs = np.stack([np.stack([a, b]) for a, b in segments]).astype(np.float32)  # (n, 2, H, 3)
    n = len(obs)
    return SegmentPairs(obs, np.zeros((n, 2, H, 1), np.float32),
                        np.zeros((n, 2, H), np.float32), np.zeros((n, 2), np.int64))


def senior(**keys) -> SENIOR:
    return SENIOR(SENIORConfig(enabled=True, **keys), MethodContext(segment=H, obs_dim=3))


def test_motion_score_is_the_summed_log_density_of_a_segments_own_positions():
    # static: every kernel at distance 0: 50 * log((2 pi h^2)^-1.5) = 50 * log(507.949)
    # moving 1.0 per step: only the own kernel counts (e^-200): 50 * log(507.949 / 50)
    k = motion_scores(np.stack([STATIC, ALONG_X]), 0.05)
    np.testing.assert_allclose(k, [311.519, 115.918], atol=1e-3)


def test_stage_one_keeps_the_pairs_that_move_most_and_the_bug_flag_mirrors_it():
    candidates = pairs((STATIC, STATIC), (ALONG_X, STATIC), (ALONG_X, ALONG_X + 5.0))
    # sample_ratio 0.3 with 3 candidates per query: r = max(1, int(0.9)) = 1, stage 1 alone
    assert senior().select_queries(candidates, None, 1, np.random.default_rng(0)).tolist() \
        == [2]
    assert senior(mirror_index_bug=True).select_queries(
        candidates, None, 1, np.random.default_rng(0)).tolist() == [0]


def test_stage_two_asks_about_segments_that_move_in_different_directions():
    candidates = pairs((ALONG_X, ALONG_X + 3.0), (ALONG_X, ALONG_Y))  # angles 0 and pi/2
    method = senior(sample_ratio=1.0)  # 2 candidates per query: r = 2, both pass stage 1
    assert method.select_queries(candidates, None, 1, np.random.default_rng(0)).tolist() == [1]
    assert senior(sample_ratio=1.0, mirror_index_bug=True).select_queries(
        candidates, None, 1, np.random.default_rng(0)).tolist() == [0]
    v = main_directions(np.stack([ALONG_X, -ALONG_Y]))
    np.testing.assert_allclose(v, [[1, 0, 0], [0, 1, 0]], atol=1e-12)  # sign: largest > 0


def test_position_dims_outside_the_observation_are_refused_with_one_line(compose):
    with pytest.raises(ConfigError, match=r"senior.position_dims=\[0, 5\] must name"):
        SENIOR(SENIORConfig(enabled=True, position_dims=[0, 5]),
               MethodContext(segment=H, obs_dim=3))
    from themis.run.validation import validate

    with pytest.raises(ConfigError, match="must be distinct observation dims"):
        validate(compose(["method=senior", "senior.position_dims=[1,1]"]))


def test_a_run_with_senior_asks_its_queries_after_the_first_round(compose, tmp_path):
    from themis.builder import make_workspace

    ws = make_workspace(compose([*TINY_PENDULUM, "method=senior"]), tmp_path)
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["sampler"].tolist()[0] == "uniform"
    assert set(rounds["sampler"].tolist()[1:]) == {"senior"}
    assert rounds["labeled_feedback"].iloc[-1] == ws.cfg.max_feedback
