"""QPA: query-policy alignment.

Hu, Li, Zhan, Jia & Zhang, "Query-Policy Misalignment in Preference-Based Reinforcement
Learning", ICLR 2024; official code huxiao09/QPA ``train_QPA.py``, ``reward_model.py``
(``get_queries`` over the last ``max_reward_buffer_size`` episodes, ``train_reward_iter``
with ``get_cropping_mask``), ``agent/sac.py`` (``update_onpolicy_sample``),
``config/train_QPA.yaml`` and ``run_QPA.sh``. Three mechanisms:

- policy-aligned queries: uniform segment pairs from the last ``recent_episodes`` episodes
  only (the selector's query pool, ``query_pool_episodes``; uniform sampler);
- hybrid experience replay (:class:`HybridReplay`): while feedback is open, ``her_ratio`` of
  every SAC batch comes uniformly from the transitions of those recent episodes, the rest
  uniformly from the whole buffer;
- data augmentation: each labelled pair is tiled ``data_aug_ratio`` times, each copy cropped
  to H − 15 … H − 5 steps (:class:`themis.methods.crop.TemporalCrop`).

**Reward training** (``train_QPA.py`` ``learn_reward`` lines 136–145, ``reward_model.py``
``train_reward_iter``): off Meta-World (the official runs: DeepMind Control) each round takes
``num_iters = ceil(reward_update × labels / 128)`` gradient steps, ``labels`` all labels so far,
each a batch of 128 from a per-member permutation of the labels (reshuffled once walked, the
last batch of a pass the rest of it), and stops after the first step at which the accuracy
accumulated over the round's steps so far — correct / counted over every cropped copy and
member, each batch's predictions taken before its step — is at least 0.98
(``qpa.stop_accuracy``). With ``reward_update=2000`` (``run_QPA.sh``, DMC) that is 157 steps
at 10 labels and 1563 at 100, until the stop. ``qpa.iterations=false`` trains as B-Pref instead
(up to ``reward_update`` epochs, stopped at the first epoch above 97 %: what Themis did on every
domain before 2026-12-01).

The official runs use one reward network (``ensemble_size=1``); ``config/method/qpa.yaml`` sets
that, the uniform sampler and the query pool. On Meta-World (``run_QPA.sh``; ``method=qpa
domain=MetaWorld``, ``config/method_domain/qpa/MetaWorld.yaml``) the reward model trains
without crops (``train_QPA.py`` calls ``train_reward``, not ``train_reward_iter``, for
``metaworld`` envs: ``data_aug_ratio=0`` here) for up to 200 epochs with the 97 % stop
(``reward_update=200``, ``qpa.iterations=false``), and the pool holds the last 30 episodes
(``max_reward_buffer_size`` 30 for drawer-open and door-unlock, 60 for door-open).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from themis.agents.buffers import ReplayBuffer, ReplayBufferSamples
from themis.core.ranges import NON_NEGATIVE, POSITIVE, UNIT, Range
from themis.core.run_keys import RunKeys
from themis.methods.base import Method, MethodContext
from themis.methods.crop import TemporalCrop
from themis.utils import ConfigError


@dataclass
class QPAConfig:
    """``qpa.*`` keys (``method=qpa`` sets ``enabled``); defaults: ``config/train_QPA.yaml``."""

    enabled: bool = False
    """Switch QPA on (``method=qpa``)."""
    recent_episodes: int = 10
    """Episodes of the query pool and of the recent half of SAC batches
    (``max_reward_buffer_size``)."""
    her_ratio: float = 0.5
    """Share of each SAC batch drawn from the recent episodes (hybrid experience replay)."""
    data_aug_ratio: int = 20
    """Cropped copies of each labelled pair in reward training (0: no crops, as on
    Meta-World)."""
    iterations: bool = True
    """Reward training as ``train_QPA.py`` off Meta-World: ``ceil(reward_update × labels /
    reward_train_batch)`` gradient steps a round, stopped once the accuracy accumulated over
    the round reaches ``stop_accuracy``; false: B-Pref's epochs with the 97 % stop (as
    ``train_QPA.py`` on Meta-World)."""
    stop_accuracy: float = 0.98
    """Accuracy accumulated over a round's steps at which its training stops (with
    ``iterations``)."""


class HybridReplay:
    """SAC batches with ``her_ratio`` of their transitions from the last ``recent_episodes``
    episodes (uniform over those transitions) while ``active()``; plain uniform batches after.

    Args:
        buffer: the replay buffer (episodes are stored in order, so the recent episodes are
            the newest slots).
        cfg: the ``qpa.*`` keys.
        active: whether feedback is still open (the official code mixes only until the
            budget is spent).
    """

    def __init__(self, buffer: ReplayBuffer, cfg: QPAConfig, active: Callable[[], bool]) -> None:
        self.buffer, self.cfg, self.active = buffer, cfg, active
        self._episode = -1
        self._span = 0

    def recent_span(self) -> int:
        """Transitions stored for the last ``recent_episodes`` episodes (current included):
        the earlier ones counted once per episode, the current one from its step counter."""
        b = self.buffer
        if not len(b):
            return 0
        last = (b.ptr - 1) % b.capacity
        current = int(b.episode[last])
        if current != self._episode:
            first = current - self.cfg.recent_episodes + 1
            episodes = b.episode[: len(b)]
            self._span = int(((episodes >= first) & (episodes < current)).sum())
            self._episode = current
        return min(len(b), self._span + int(b.t[last]) + 1)

    def sample(self, batch_size: int, rng: np.random.Generator) -> ReplayBufferSamples:
        """One SAC batch (``batch_size`` transitions as tensors)."""
        b = self.buffer
        if not self.active():
            return b.sample(batch_size, rng)
        recent = int(batch_size * self.cfg.her_ratio)
        span = self.recent_span()
        back = rng.integers(0, span, size=recent) if span else np.zeros(0, np.int64)
        idx = np.concatenate([b.sample_indices(batch_size - recent, rng),
                              (b.ptr - 1 - back) % b.capacity])
        return b.samples(idx)


class QPA(Method[QPAConfig]):
    """QPA as a method (module docstring): hybrid experience replay and ``data_aug_ratio``
    crops of every pair (its query pool is ``query_pool_episodes``, set by its config file)."""

    name, title, published = "qpa", "QPA", "2023-05"
    Config = QPAConfig
    RANGES: ClassVar[Mapping[str, Range]] = {
        "recent_episodes": POSITIVE, "her_ratio": UNIT, "data_aug_ratio": NON_NEGATIVE,
        "stop_accuracy": UNIT}
    inside_agent = "mixes recent episodes into SAC's replay batches"
    augmentation_priority = 1  # with SURF: QPA's crops

    def __init__(self, cfg: QPAConfig, context: MethodContext) -> None:
        super().__init__(cfg, context)
        self.augmentation = TemporalCrop(context.segment - 15, context.segment - 5,
                                         cfg.data_aug_ratio) if cfg.data_aug_ratio else None

    @classmethod
    def check(cls, run_cfg: RunKeys, agent: str | None, where: str) -> None:
        """SAC only (PPO has no replay buffer); crops need segments of 16 steps or more."""
        if agent in ("ppo", "a2c"):
            raise ConfigError("method=qpa mixes recent episodes into SAC's replay batches; PPO "
                              "trains on fresh rollouts only: use it with SAC (Box actions)")
        if cls.own_keys(run_cfg).data_aug_ratio and run_cfg.segment <= 15:
            raise ConfigError(f"method=qpa crops segments to segment-15..segment-5 steps: "
                              f"segment={run_cfg.segment} is too short (at least 16)")

    def round_steps(self, labels: int, reward_update: int,
                    batch_size: int) -> tuple[int, float] | None:
        """``(ceil(reward_update × labels / batch_size), stop_accuracy)`` with ``iterations``
        (``train_QPA.py``: ``num_iters``, ``train_reward_iter``'s stop); ``None`` (B-Pref's
        epochs) without."""
        if not self.cfg.iterations or labels < 1:
            return None
        return math.ceil(reward_update * labels / batch_size), self.cfg.stop_accuracy

    def replay(self, buffer: Any, active: Callable[[], bool]) -> HybridReplay:
        return HybridReplay(buffer, self.cfg, active)


__all__ = ["QPA", "HybridReplay", "QPAConfig"]
