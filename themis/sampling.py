"""Query samplers: which candidate segment pairs are shown to the teacher.

``feed_type`` integers are the user-facing spelling (BPref); they map to named samplers in one
registry. Each sampler has the signature
``(candidates, reward_model, k, rng) -> indices into candidates``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from themis.buffers import SegmentPairs
from themis.reward.ensemble import RewardEnsemble

Sampler = Callable[[SegmentPairs, RewardEnsemble, int, np.random.Generator], np.ndarray]

FEED_TYPES: Mapping[int, str] = {
    0: "uniform",
    1: "disagreement",
    2: "entropy",
    3: "kcenter",
    4: "kcenter_disagreement",
    5: "kcenter_entropy",
}


def uniform(candidates: SegmentPairs, reward_model: RewardEnsemble, k: int,
            rng: np.random.Generator) -> np.ndarray:
    """Pick ``k`` candidates uniformly without replacement (BPref ``uniform_sampling``)."""
    return rng.choice(len(candidates), size=min(k, len(candidates)), replace=False)


SAMPLERS: Mapping[str, Sampler] = {"uniform": uniform}


def resolve_feed_type(feed_type: int | str) -> str:
    """Map a ``feed_type`` (0-5 or a sampler name) to the sampler name.

    Raises:
        ValueError: unknown feed type, or a sampler that is not implemented yet.
    """
    if isinstance(feed_type, str) and feed_type.strip().lstrip("-").isdigit():
        feed_type = int(feed_type)
    if isinstance(feed_type, int):
        if feed_type not in FEED_TYPES:
            raise ValueError(
                f"feed_type={feed_type} is unknown; use 0-5 "
                f"({', '.join(f'{k}={v}' for k, v in FEED_TYPES.items())})"
            )
        name = FEED_TYPES[feed_type]
    else:
        name = str(feed_type)
        if name not in FEED_TYPES.values():
            raise ValueError(f"feed_type={name!r} is unknown; use 0-5 or one of "
                             f"{', '.join(FEED_TYPES.values())}")
    if name not in SAMPLERS:
        raise ValueError(f"feed_type={name} is not supported yet; use feed_type=0 (uniform)")
    return name


def needs_large_batch(name: str) -> bool:
    """Whether the sampler chooses among ``reward_batch * large_batch`` candidates."""
    return name != "uniform"
