"""Query samplers on constructed inputs whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from themis.agents.buffers import SegmentPairs
from themis.feedback.sampling import (
    FEED_TYPES,
    SAMPLERS,
    disagreement,
    entropy,
    entropy_scores,
    kcenter,
    kcenter_disagreement,
    kcenter_entropy,
    kcenter_greedy,
    pair_features,
    resolve_feed_type,
    uniform,
)
from themis.reward import RewardEnsemble


class FixedProbabilities:
    """A stand-in reward model whose members' P[segment 2 preferred] are given."""

    def __init__(self, p: np.ndarray) -> None:
        self.p = p  # (E, n)

    def preference_probabilities(self, obs, act):
        assert len(obs) == self.p.shape[1]
        return self.p


def make_pairs(n: int, horizon: int = 3, obs_dim: int = 2, seed: int = 0) -> SegmentPairs:
    rng = np.random.default_rng(seed)
    return SegmentPairs(rng.normal(size=(n, 2, horizon, obs_dim)).astype(np.float32),
                        np.zeros((n, 2, horizon, 1), np.float32), np.zeros((n, 2, horizon)),
                        np.zeros((n, 2), dtype=np.int64))


def no_labels(d: int) -> np.ndarray:
    return np.zeros((0, d), dtype=np.float32)


def brute_force_kcenter(candidates: np.ndarray, selected: np.ndarray, k: int) -> list[int]:
    """B-Pref's KCenterGreedy: recompute every distance each round."""
    picks: list[int] = []
    for _ in range(k):
        ref = np.concatenate([selected, candidates[picks]])
        best, best_i = -1.0, -1
        for i in range(len(candidates)):
            if i in picks:
                continue
            d = np.sqrt(((ref - candidates[i]) ** 2).sum(1)).min()
            if d > best:
                best, best_i = d, i
        picks.append(best_i)
    return picks


def test_uniform_picks_k_distinct_candidates_evenly():
    pairs = make_pairs(20)
    rng = np.random.default_rng(0)
    counts = np.zeros(20)
    for _ in range(2000):
        idx = uniform(pairs, None, no_labels(12), 5, rng)
        assert len(set(idx.tolist())) == 5 and idx.max() < 20
        counts[idx] += 1
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()


def test_disagreement_picks_the_highest_std_pairs():
    p = np.array([[0.5, 0.1, 0.9, 0.5, 0.2],
                  [0.5, 0.9, 0.1, 0.6, 0.2],
                  [0.5, 0.5, 0.5, 0.4, 0.2]])
    idx = disagreement(make_pairs(5), FixedProbabilities(p), no_labels(12), 2, None)
    assert sorted(idx.tolist()) == [1, 2]  # std ~0.33 each; pair 3 has 0.08, pairs 0, 4 zero


def test_entropy_picks_the_most_uncertain_pairs():
    p = np.array([[0.5, 0.99, 0.6, 0.01, 0.3]] * 3)
    idx = entropy(make_pairs(5), FixedProbabilities(p), no_labels(12), 2, None)
    assert idx.tolist() == [0, 2]  # closest to 0.5 first
    scores = entropy_scores(make_pairs(5), FixedProbabilities(p))
    assert scores[0] == pytest.approx(np.log(2))


@pytest.mark.parametrize("m", [0, 1, 15])
def test_kcenter_matches_brute_force(m):
    rng = np.random.default_rng(m)
    cand = rng.normal(size=(60, 4)).astype(np.float32)
    sel = rng.normal(size=(m, 4)).astype(np.float32)
    ours = kcenter_greedy(cand, sel, 10)
    assert len(set(ours.tolist())) == 10
    if m == 0:
        # no labelled pairs: start from the candidate farthest from the mean
        first = int(np.argmax(((cand - cand.mean(0)) ** 2).sum(1)))
        assert ours[0] == first
        assert ours.tolist() == [first, *brute_force_kcenter(cand, cand[[first]], 9)]
    else:
        assert ours.tolist() == brute_force_kcenter(cand, sel, 10)


def test_kcenter_picks_the_farthest_point_first():
    cand = np.array([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0], [5.0, 0.0]], dtype=np.float32)
    sel = np.array([[0.0, 0.0]], dtype=np.float32)
    assert kcenter_greedy(cand, sel, 2).tolist() == [2, 3]
    # k = n (feed_type 4/5 with large_batch=2: the top half is reward_batch pairs): all of them
    assert kcenter_greedy(cand, sel, 4).tolist() == [2, 3, 1, 0]
    with pytest.raises(ValueError, match="cannot pick 5 of 4"):
        kcenter_greedy(cand, sel, 5)


def test_kcenter_sampler_uses_both_segments_and_avoids_labelled_pairs():
    pairs = make_pairs(30, seed=1)
    feats = pair_features(pairs.observations)
    assert feats.shape == (30, 2 * 3 * 2)
    # pairs 0-9 are already labelled (duplicated in the labelled set): k-center avoids them
    idx = kcenter(pairs, None, feats[:10], 10, None)
    assert not set(idx.tolist()) & set(range(10))


def test_kcenter_samplers_run_when_no_pair_is_labelled_yet():
    # every earlier query skipped (teacher=skip): the labelled set is empty, shape (0, d)
    pairs = make_pairs(20, seed=4)
    empty = pair_features(pairs.observations[:0])
    assert empty.shape == (0, 2 * 3 * 2)
    model = RewardEnsemble(2, 1, ensemble_size=3, hidden_dim=8, hidden_depth=1)
    for name in ("kcenter", "kcenter_disagreement", "kcenter_entropy"):
        idx = SAMPLERS[name](pairs, model, empty, 5, np.random.default_rng(0))
        assert len(set(idx.tolist())) == 5, name


@pytest.mark.parametrize("sampler", [kcenter_disagreement, kcenter_entropy])
def test_kcenter_variants_choose_from_the_top_half(sampler):
    n = 40
    pairs = make_pairs(n, seed=2)
    # pairs 0-19: members split (0.3 / 0.7 / 0.5) -> high std and high entropy;
    # pairs 20-39: all members say 0.99 -> zero std, low entropy. Only 0-19 are in the top half.
    p = np.tile(np.where(np.arange(n) < 20, 0.5, 0.99), (3, 1))
    p[0, :20] = 0.3
    p[1, :20] = 0.7
    idx = sampler(pairs, FixedProbabilities(p), no_labels(12), 8, None)
    assert len(set(idx.tolist())) == 8
    assert idx.max() < 20


def _brute_force_kcenter(features: np.ndarray, labelled: np.ndarray, k: int) -> list[int]:
    """B-Pref's k-center: recompute every distance at every pick (no cache)."""
    chosen: list[int] = []
    for _ in range(k):
        ref = np.concatenate([labelled, features[chosen]]) if chosen or len(labelled) else None
        if ref is None:
            dist = ((features - features.mean(0)) ** 2).sum(1)
        else:
            dist = ((features[:, None, :] - ref[None]) ** 2).sum(-1).min(1)
        dist[chosen] = -1
        chosen.append(int(np.argmax(dist)))
    return chosen


@pytest.mark.parametrize("name,scores", [("kcenter_disagreement", "std"),
                                         ("kcenter_entropy", "entropy")])
def test_hybrid_samplers_pick_brute_force_kcenter_on_the_top_half(name, scores):
    n, k = 60, 6
    pairs = make_pairs(n, seed=5)
    p = np.random.default_rng(6).uniform(0.05, 0.95, size=(3, n))
    model = FixedProbabilities(p)
    labelled = pair_features(make_pairs(4, seed=7).observations)
    if scores == "std":
        score = p.std(0)
    else:
        score = (-(p * np.log(p) + (1 - p) * np.log(1 - p))).mean(0)
    half = np.argsort(-score, kind="stable")[: n // 2]
    feats = pair_features(pairs.observations)[half]
    want = half[_brute_force_kcenter(feats, labelled, k)]
    got = SAMPLERS[name](pairs, model, labelled, k, np.random.default_rng(0))
    np.testing.assert_array_equal(got, want)
    # and not merely the k best scores: k-center spreads the picks
    assert set(got.tolist()) != set(half[:k].tolist())


def test_every_sampler_on_a_real_ensemble_picks_what_its_scores_say():
    pairs = make_pairs(50)
    model = RewardEnsemble(2, 1, ensemble_size=3, hidden_dim=8, hidden_depth=1)
    labelled = pair_features(make_pairs(7, seed=3).observations)
    p = model.preference_probabilities(pairs.observations, pairs.actions)
    feats = pair_features(pairs.observations)
    ent = (-(p * np.log(p) + (1 - p) * np.log(1 - p))).mean(0)
    want = {
        "disagreement": set(np.argsort(-p.std(0), kind="stable")[:10].tolist()),
        "entropy": set(np.argsort(-ent, kind="stable")[:10].tolist()),
        "kcenter": set(_brute_force_kcenter(feats, labelled, 10)),
    }
    for name, sampler in SAMPLERS.items():
        idx = sampler(pairs, model, labelled, 10, np.random.default_rng(0))
        assert len(idx) == 10 and len(set(idx.tolist())) == 10, name
        if name in want:
            assert set(idx.tolist()) == want[name], name


def test_feed_type_spellings():
    assert [resolve_feed_type(i) for i in range(6)] == list(FEED_TYPES.values())
    assert resolve_feed_type("2") == "entropy"
    assert resolve_feed_type("kcenter_entropy") == "kcenter_entropy"
    with pytest.raises(ValueError, match="feed_type=7 is unknown"):
        resolve_feed_type(7)
    with pytest.raises(ValueError, match="unknown"):
        resolve_feed_type("random")
