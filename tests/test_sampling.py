"""Query samplers registry (uniform so far) and feed_type spelling."""

from __future__ import annotations

import numpy as np
import pytest

from themis.buffers import SegmentPairs
from themis.reward import RewardEnsemble
from themis.sampling import FEED_TYPES, resolve_feed_type, uniform


def test_uniform_picks_k_distinct_candidates_evenly():
    n = 20
    pairs = SegmentPairs(np.zeros((n, 2, 3, 1)), np.zeros((n, 2, 3, 1)), np.zeros((n, 2, 3)),
                         np.zeros((n, 2), dtype=np.int64))
    rng = np.random.default_rng(0)
    counts = np.zeros(n)
    for _ in range(2000):
        idx = uniform(pairs, RewardEnsemble(1, 1, 1, 4, 1), 5, rng)
        assert len(set(idx.tolist())) == 5 and idx.max() < n
        counts[idx] += 1
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()


def test_feed_type_spellings():
    assert resolve_feed_type(0) == "uniform"
    assert resolve_feed_type("0") == "uniform"
    assert resolve_feed_type("uniform") == "uniform"
    assert FEED_TYPES[5] == "kcenter_entropy"
    with pytest.raises(ValueError, match="feed_type=7 is unknown"):
        resolve_feed_type(7)
    with pytest.raises(ValueError, match="unknown"):
        resolve_feed_type("random")
    with pytest.raises(ValueError, match="not supported yet"):
        resolve_feed_type("entropy")
