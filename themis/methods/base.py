"""The method interface: a preference-learning method is one object with optional hooks.

PEBBLE (Lee, Smith & Abbeel, ICML 2021) is the loop every method shares: queries from the
replay buffer, an ensemble trained with the Bradley–Terry loss, the agent on the relabelled
r̂. A successor changes that loop at a few named points. :class:`Method` names those points;
a method overrides the hooks it needs and inherits no-ops for the rest. The learner
(:mod:`themis.feedback.learner`), the reward trainer (:mod:`themis.reward.trainer`), the
query selector and the loops call the hooks of every method a run switches on, in the order
of :data:`themis.methods.registry.REGISTRY` (by first publication: the older paper first);
none of them names a method.

Points of one feedback round and one agent step, in the order they come:

==========================  =================================================================
hook                        called
==========================  =================================================================
``select_queries``          later rounds: pick ``n`` of the candidate pairs (replaces the
                            ``feed_type`` sampler; the first round stays uniform)
``after_queries``           after the round's queries are chosen (e.g. more pairs, unlabelled)
``augmentation``            reward training: a temporal crop of every pair (one at most)
``stop_rule``               reward training: accuracy to stop above, least epochs
``round_epochs``            reward training: the epochs of this round (default: up to
                            ``reward_update``, stopped by ``stop_rule``)
``round_steps``             reward training: the round in gradient steps instead, with a stop
                            on the accuracy accumulated over them (replaces the two above)
``select_labels``           reward training, each epoch: keep / flip / leave out labels
``start_epoch``/``end_epoch``  reward training, around each epoch
``batch_loss``              reward training, each batch: an extra loss (e.g. pseudo-labels)
``reward_bonus``            the agent's reward: added to the ensemble mean r̂
``pretraining_step``        unsupervised pretraining, after each agent update
``between_rounds``          every agent step after pretraining: a change of r̂ (then relabel)
``replay``                  where the off-policy agent's batches come from
==========================  =================================================================

A method also brings its keys: :attr:`Method.Config`, a dataclass with a docstring under each
field (``--help`` reads them), whose first field is ``enabled`` (``config/method/<name>.yaml``
sets it); :attr:`Method.RANGES` for its numeric keys; and :meth:`Method.check`, which refuses
with one line what cannot run with it (another agent, rating feedback, the online wrapper).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import torch

from themis.core.ranges import Range
from themis.core.run_keys import RunKeys


@dataclass
class MethodContext:
    """What a method may read when a run builds it.

    Attributes:
        segment: steps per segment (``segment``).
        obs_dim, action_dim: flattened observation size and action size.
        obs_dtype: float32, or uint8 for pixels.
        clock: the current environment step.
        on_policy: the agent is PPO (rewards per rollout, no replay buffer).
    """

    segment: int = 50
    obs_dim: int = 1
    action_dim: int = 1
    obs_dtype: Any = np.float32
    clock: Callable[[], int] = lambda: 0
    on_policy: bool = False


WHERE = ("loop", "async", "wrapper")
"""Where a method runs: Themis's own loops with the learner inside (``loop``), the loops with
the background learner (``reward_training=async``), or :class:`themis.PreferenceLearningWrapper`
around another library's agent (``wrapper``)."""


ConfigT = TypeVar("ConfigT")
"""A method's :attr:`Method.Config` (``class SURF(Method[SURFConfig])``)."""


class Method(Generic[ConfigT]):
    """A preference-learning method: its keys and its hooks (module docstring).

    Class attributes (set by each method):
        name: the ``method=`` name and the key prefix (``surf`` → ``surf.mu``).
        title: the name in titles and banners (``SURF``).
        published: ``YYYY-MM`` of the paper's first public version (arXiv or OpenReview): the
            order methods run and show in.
        Config: the dataclass of its keys (first field ``enabled``).
        RANGES: the values each numeric key takes, by key without the prefix.
        ratings: works with ``feedback=rating`` (numeric ratings instead of pairs).
        inside_agent: what it does inside the agent, in a few words (``""``: nothing); such a
            method runs only where the learner reaches the agent (Themis's own loops, sync).

    Args:
        cfg: the method's keys (an instance of :attr:`Config`).
        context: shapes and clock of the run.
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    published: ClassVar[str] = ""
    Config: ClassVar[type] = object
    RANGES: ClassVar[Mapping[str, Range]] = {}
    ratings: ClassVar[bool] = False
    inside_agent: ClassVar[str] = ""

    def __init__(self, cfg: ConfigT, context: MethodContext) -> None:
        self.cfg, self.context = cfg, context

    # ------------------------------------------------------------------ configuration
    @classmethod
    def own_keys(cls, run_cfg: RunKeys) -> ConfigT:
        """This method's keys in a run's config: its ``<name>.*`` group (an instance of
        :attr:`Config`), which :class:`themis.run.config.TrainConfig` adds to the flat keys."""
        keys: ConfigT = getattr(run_cfg, cls.name)
        return keys

    @classmethod
    def check(cls, run_cfg: RunKeys, agent: str | None, where: str) -> None:
        """Refuse what cannot run with this method, as one line.

        Args:
            run_cfg: the whole run config (this method's keys: :meth:`own_keys`).
            agent: ``sac`` or ``ppo``, or ``None`` when not known yet.
            where: one of :data:`WHERE`.

        Raises:
            themis.utils.ConfigError: what cannot run and how to fix it.
        """

    def bind(self, model: Any, optimizer: torch.optim.Optimizer) -> None:
        """The reward ensemble and its optimiser exist (built after the method, since the
        trainer takes the method's hooks)."""

    # ------------------------------------------------------------------ queries
    def select_queries(self, candidates: Any, reward_model: Any, n: int,
                       rng: np.random.Generator) -> np.ndarray | None:
        """Later rounds: the indices of ``n`` pairs among ``candidates`` (a
        :class:`themis.agents.buffers.SegmentPairs` of ``n × large_batch`` pairs), or ``None`` to
        leave the choice to the ``feed_type`` sampler."""
        return None

    def after_queries(self, pick: Callable[[int], Any], n: int) -> None:
        """The round's ``n`` queries are chosen; ``pick(k)`` cuts ``k`` uniform pairs from
        the same query pool (:class:`themis.agents.buffers.SegmentPairs`)."""

    # ------------------------------------------------------------------ reward training
    augmentation: Any = None
    """A :class:`themis.methods.crop.TemporalCrop` applied to every pair in training, or
    ``None``; with several, the one of the highest :attr:`augmentation_priority`."""
    augmentation_priority: ClassVar[int] = 0

    def stop_rule(self) -> tuple[float, int] | None:
        """``(target_accuracy, min_epochs)`` of reward training, or ``None`` for the
        trainer's own (B-Pref: 0.97, 0)."""
        return None

    def round_epochs(self, labels: int, reward_update: int, batch_size: int) -> int | None:
        """The epochs of one round's reward training over ``labels`` labelled pairs in
        batches of ``batch_size``, given ``reward_update``; ``None``: up to ``reward_update``
        (B-Pref)."""
        return None

    def round_steps(self, labels: int, reward_update: int,
                    batch_size: int) -> tuple[int, float] | None:
        """One round's reward training counted in gradient steps: ``(steps, stop_accuracy)``
        for ``labels`` labelled pairs in batches of ``batch_size``, given ``reward_update``.

        The trainer walks each member's permutation of the labels ``batch_size`` at a time
        (a fresh permutation when one is used up, the last batch of a pass the rest) for
        ``steps`` steps, and stops after the first step at which the accuracy accumulated over
        the round's steps so far (correct / counted predictions before each step, crops
        included, every member) is at least ``stop_accuracy`` (``math.inf``: never). Replaces
        :meth:`round_epochs` and :meth:`stop_rule` for the round; ``None``: epochs (default).
        """
        return None

    def select_labels(self, model: Any, obs: torch.Tensor, act: torch.Tensor,
                      labels: torch.Tensor, oracle: np.ndarray | None,
                      ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each epoch: ``(rows, labels)`` to train on (a subset, some labels flipped), from
        pairs ``obs (n, 2, H, d)``, ``act``, labels ``(n,)`` and the true-return labels
        ``(n,)`` (statistics only); ``None``: every label as given."""
        return None

    def start_epoch(self) -> None:
        """A reward-training epoch starts."""

    def end_epoch(self) -> None:
        """A reward-training epoch ended."""

    def batch_loss(self, model: Any, batch_size: int, rng: np.random.Generator,
                   pair_returns: Callable[..., tuple[torch.Tensor, ...]],
                   ) -> torch.Tensor | None:
        """An extra loss of one training step (backpropagated with the batch's), or
        ``None``. ``pair_returns(obs, act, labels)`` gives the trainer's predicted returns
        (augmentation included); ``pair_returns(obs, act, labels, steps=(r¹, r²))`` uses
        per-step rewards ``(E, n, H)`` of both segments already computed (one forward pass)."""
        return None

    # ------------------------------------------------------------------ the agent
    def reward_bonus(self, members: np.ndarray) -> np.ndarray | None:
        """Added to the ensemble mean r̂ the agent sees: ``(E, n) -> (n,)`` float32 from the
        members' rewards, or ``None``."""
        return None

    def pretraining_step(self, draw: Callable[[], Any]) -> None:
        """Unsupervised pretraining, after each agent update; ``draw()`` gives a fresh batch
        of states with their novelty (:class:`themis.agents.intrinsic.NoveltySample`)."""

    def between_rounds(self, agent: Any, step: int, sample: Callable[[], Any],
                       dataset: Any, reward_batch: int) -> bool:
        """Every agent step after pretraining while feedback is open and labels exist: change
        r̂ if due (``sample()`` draws a replay batch); returns whether it did (the loop then
        relabels)."""
        return False

    def replay(self, buffer: Any, active: Callable[[], bool]) -> Any:
        """Where the off-policy agent's batches come from (an object with
        ``sample(batch_size, rng)``), or ``None`` for the whole buffer; ``active()``: feedback
        is still open."""
        return None

    # ------------------------------------------------------------------ bookkeeping
    def stats(self) -> dict[str, float]:
        """The method's ``reward.csv`` columns (column names start with its own words)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps, by checkpoint key."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (keys it does not find keep their start)."""


def overrides(method: Method, hook: str) -> bool:
    """Whether ``method`` has its own ``hook`` (not :class:`Method`'s no-op): callers skip
    work a hook would not use (e.g. the true-return labels :meth:`Method.select_labels`
    reads)."""
    return getattr(type(method), hook) is not getattr(Method, hook)


def choose_augmentation(methods: Sequence[Method]) -> Any:
    """The temporal crop of reward training: the :attr:`Method.augmentation` of the method
    with the highest :attr:`Method.augmentation_priority` among those that have one
    (``None`` without)."""
    offered = [m for m in methods if m.augmentation is not None]
    if not offered:
        return None
    return max(offered, key=lambda m: m.augmentation_priority).augmentation


def total_bonus(methods: Sequence[Method], members: np.ndarray) -> np.ndarray | None:
    """The sum of the methods' :meth:`Method.reward_bonus` for members ``(E, n)``, or ``None``
    when none adds one."""
    out = None
    for method in methods:
        bonus = method.reward_bonus(members)
        if bonus is not None:
            out = bonus if out is None else out + bonus
    return out


def reward_with_bonus(methods: Sequence[Method], members: np.ndarray) -> np.ndarray | None:
    """The agent's reward from members' rewards ``(E, n)``: their mean plus
    :func:`total_bonus`, ``(n,)`` float32; ``None`` when no method adds a bonus (the caller
    takes r̂ itself)."""
    bonus = total_bonus(methods, members)
    return None if bonus is None else (members.mean(0) + bonus).astype(np.float32)


__all__ = ["WHERE", "Method", "MethodContext", "choose_augmentation", "overrides",
           "reward_with_bonus", "total_bonus"]
