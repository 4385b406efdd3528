"""Query samplers: which candidate segment pairs are shown to the teacher (B-Pref, Sec. 3.2).

``feed_type`` integers are the user-facing spelling (BPref); they map to named samplers in one
registry, :data:`SAMPLERS`. Every sampler has the signature
``(candidates, reward_model, labelled_features, k, rng) -> indices into candidates``:

- ``candidates``: :class:`~themis.agents.buffers.SegmentPairs`, ``reward_batch * large_batch`` pairs
  (``reward_batch`` for uniform);
- ``reward_model``: the current :class:`~themis.reward.RewardEnsemble`;
- ``labelled_features``: ``(m, d)`` pair features of the queries already labelled (k-center);
- ``k``: how many queries to pick;
- keyword ``features``: maps segment observations ``(n, 2, H, *obs_shape)`` to pair features
  ``(n, d)`` for k-center (default :func:`pair_features`; pixel and grid envs pass encoder
  features).

Sources: Lee, Smith & Abbeel 2021 (PEBBLE, Sec. 4.3) and Lee et al. 2021 (B-Pref, Sec. 3.2),
whose reference code (``reward_model.py``) the semantics below follow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from themis.agents.buffers import SegmentPairs
from themis.reward.ensemble import RewardEnsemble

Sampler = Callable[..., np.ndarray]
Features = Callable[[np.ndarray], np.ndarray]

FEED_TYPES: Mapping[int, str] = {
    0: "uniform",
    1: "disagreement",
    2: "entropy",
    3: "kcenter",
    4: "kcenter_disagreement",
    5: "kcenter_entropy",
}


# ------------------------------------------------------------------------- scores
def pair_features(observations: np.ndarray) -> np.ndarray:
    """k-center features of query pairs: both segments' observations, flattened.

    Shapes: ``(n, 2, H, *obs_shape) -> (n, 2 * H * prod(obs_shape))`` float32.
    """
    width = int(np.prod(observations.shape[1:]))  # explicit: -1 fails when n == 0
    return observations.reshape(len(observations), width).astype(np.float32, copy=False)


def disagreement_scores(candidates: SegmentPairs, reward_model: RewardEnsemble) -> np.ndarray:
    """Std over ensemble members of P[segment 2 ≻ segment 1] (B-Pref "disagreement").

    Returns:
        ``(n,)`` scores; higher = members disagree more.
    """
    p = reward_model.preference_probabilities(candidates.observations, candidates.actions)
    return p.std(axis=0)


def entropy_scores(candidates: SegmentPairs, reward_model: RewardEnsemble) -> np.ndarray:
    """Mean over members of the binary entropy ``H(p) = -p log p - (1-p) log(1-p)``.

    Returns:
        ``(n,)`` scores in [0, log 2]; higher = the model is less sure of the answer.
    """
    p = reward_model.preference_probabilities(candidates.observations, candidates.actions)
    p = np.clip(p.astype(np.float64), 1e-12, 1 - 1e-12)
    return (-(p * np.log(p) + (1 - p) * np.log(1 - p))).mean(axis=0)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest scores, largest first (ties broken by lower index)."""
    return np.argsort(-scores, kind="stable")[:k]


# ----------------------------------------------------------------------- k-center
def _min_sq_dist(x: torch.Tensor, x_sq: torch.Tensor, ref: torch.Tensor,
                 chunk: int = 512) -> torch.Tensor:
    """Squared distance from each row of ``x`` to its nearest row of ``ref``.

    Uses ``|x - r|² = |x|² + |r|² - 2 x·r`` so that the work is matrix products (chunks of
    ``chunk`` reference rows bound the memory to ``n × chunk``); ``x_sq`` = ``|x|²`` per row.
    """
    best = torch.full((len(x),), float("inf"), dtype=x.dtype, device=x.device)
    for lo in range(0, len(ref), chunk):
        r = ref[lo:lo + chunk]
        d = (x_sq[:, None] + r.square().sum(1)[None, :] - 2.0 * (x @ r.T)).clamp_min_(0.0)
        best = torch.minimum(best, d.min(dim=1).values)
    return best


def kcenter_greedy(candidates: np.ndarray, selected: np.ndarray, k: int) -> np.ndarray:
    """Greedy k-center (farthest-point) selection (Sener & Savarese 2018; B-Pref Sec. 3.2).

    Repeatedly picks the candidate farthest (Euclidean) from everything selected so far: the
    ``selected`` rows (the pairs already labelled) plus the candidates picked in earlier steps.
    The distance of each candidate to its nearest selected point is kept in a cache and lowered
    after each pick, so the work is O(n·(m + k)·d) rather than BPref's O(n·k·(m + k)·d), done as
    matrix products (squared distances from norms and dot products, float32). With no
    ``selected`` rows the first pick is the candidate farthest from the candidates' mean.

    Args:
        candidates: ``(n, d)`` features.
        selected: ``(m, d)`` features already covered (``m`` may be 0).
        k: number of picks (``<= n``).

    Returns:
        ``(k,)`` int64 row indices into ``candidates``, in pick order, all distinct.

    Raises:
        ValueError: ``k > n``, or feature sizes differ.
    """
    n = len(candidates)
    if k > n:
        raise ValueError(f"k-center cannot pick {k} of {n} candidates")
    if len(selected) and selected.shape[1:] != candidates.shape[1:]:
        raise ValueError(f"candidate features {candidates.shape[1:]} and selected features "
                         f"{selected.shape[1:]} differ")
    x = torch.as_tensor(np.asarray(candidates, dtype=np.float32)).reshape(n, -1)
    x_sq = x.square().sum(1)
    if len(selected):
        ref = torch.as_tensor(np.asarray(selected, dtype=np.float32)).reshape(len(selected), -1)
        min_dist = _min_sq_dist(x, x_sq, ref)
    else:  # nothing covered yet: only used to make the first pick the point farthest from the mean
        min_dist = (x - x.mean(0)).square().sum(1)
    picks = np.empty(k, dtype=np.int64)
    for j in range(k):
        i = int(torch.argmax(min_dist))
        picks[j] = i
        dist_to_pick = (x_sq + x_sq[i] - 2.0 * (x @ x[i])).clamp_min_(0.0)
        min_dist = torch.minimum(min_dist, dist_to_pick) if j or len(selected) else dist_to_pick
        min_dist[i] = -1.0  # never pick the same row twice (duplicates have distance 0)
    return picks


# ----------------------------------------------------------------------- samplers
def uniform(candidates: SegmentPairs, reward_model: RewardEnsemble,
            labelled_features: np.ndarray, k: int, rng: np.random.Generator,
            features: Features | None = None) -> np.ndarray:
    """``k`` candidates uniformly at random without replacement (feed_type 0)."""
    return rng.choice(len(candidates), size=min(k, len(candidates)), replace=False)


def disagreement(candidates: SegmentPairs, reward_model: RewardEnsemble,
                 labelled_features: np.ndarray, k: int, rng: np.random.Generator,
            features: Features | None = None) -> np.ndarray:
    """The ``k`` candidates with the largest ensemble disagreement (feed_type 1)."""
    return top_k(disagreement_scores(candidates, reward_model), k)


def entropy(candidates: SegmentPairs, reward_model: RewardEnsemble,
            labelled_features: np.ndarray, k: int, rng: np.random.Generator,
            features: Features | None = None) -> np.ndarray:
    """The ``k`` candidates with the largest mean preference entropy (feed_type 2)."""
    return top_k(entropy_scores(candidates, reward_model), k)


def kcenter(candidates: SegmentPairs, reward_model: RewardEnsemble,
            labelled_features: np.ndarray, k: int, rng: np.random.Generator,
            features: Features | None = None) -> np.ndarray:
    """k-center on pair features against the labelled pairs (feed_type 3)."""
    return kcenter_greedy((features or pair_features)(candidates.observations),
                          labelled_features, k)


def _kcenter_on_top_half(scores: np.ndarray, candidates: SegmentPairs,
                         labelled_features: np.ndarray, k: int,
                         features: Features | None) -> np.ndarray:
    """Keep the top half of the candidates by ``scores``, then k-center on those (B-Pref)."""
    half = top_k(scores, max(k, len(scores) // 2))
    picks = kcenter_greedy((features or pair_features)(candidates.observations[half]),
                           labelled_features, k)
    return half[picks]


def kcenter_disagreement(candidates: SegmentPairs, reward_model: RewardEnsemble,
                         labelled_features: np.ndarray, k: int,
                         rng: np.random.Generator, features: Features | None = None) -> np.ndarray:
    """Top half by disagreement, then k-center (feed_type 4)."""
    return _kcenter_on_top_half(disagreement_scores(candidates, reward_model), candidates,
                                labelled_features, k, features)


def kcenter_entropy(candidates: SegmentPairs, reward_model: RewardEnsemble,
                    labelled_features: np.ndarray, k: int,
                    rng: np.random.Generator, features: Features | None = None) -> np.ndarray:
    """Top half by entropy, then k-center (feed_type 5)."""
    return _kcenter_on_top_half(entropy_scores(candidates, reward_model), candidates,
                                labelled_features, k, features)


SAMPLERS: Mapping[str, Sampler] = {
    "uniform": uniform,
    "disagreement": disagreement,
    "entropy": entropy,
    "kcenter": kcenter,
    "kcenter_disagreement": kcenter_disagreement,
    "kcenter_entropy": kcenter_entropy,
}


def resolve_feed_type(feed_type: int | str) -> str:
    """Map a ``feed_type`` (0-5 or a sampler name) to the sampler name.

    Raises:
        ValueError: unknown feed type.
    """
    if isinstance(feed_type, str) and feed_type.strip().lstrip("-").isdigit():
        feed_type = int(feed_type)
    if isinstance(feed_type, int):
        if feed_type not in FEED_TYPES:
            raise ValueError(
                f"feed_type={feed_type} is unknown; use 0-5 "
                f"({', '.join(f'{k}={v}' for k, v in FEED_TYPES.items())})"
            )
        return FEED_TYPES[feed_type]
    name = str(feed_type)
    if name not in SAMPLERS:
        raise ValueError(f"feed_type={name!r} is unknown; use 0-5 or one of "
                         f"{', '.join(FEED_TYPES.values())}")
    return name


def needs_large_batch(name: str) -> bool:
    """Whether the sampler chooses among ``reward_batch * large_batch`` candidates."""
    return name != "uniform"


def uses_labelled_features(name: str) -> bool:
    """Whether the sampler needs the features of the already-labelled pairs (k-center)."""
    return name.startswith("kcenter")
