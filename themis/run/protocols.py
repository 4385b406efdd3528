"""What the Workspace holds and the loops call without knowing the class: the training loop
(:class:`Driver`, a module of :mod:`themis.loops`, on a higher floor: it reads the workspace)
and the preference learner (:class:`RunLearner`: the synchronous
:class:`themis.feedback.PreferenceLearner` or the loop's end of the learner process,
:class:`themis.online.loop.AsyncLearner`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from themis.agents import Agent
    from themis.agents.buffers import EpisodeStore
    from themis.feedback.learner import QueryPool


class Driver(Protocol):
    """A training loop (a module: :mod:`themis.loops.pebble`, :mod:`themis.loops.prefppo`);
    ``ws`` is the :class:`themis.run.workspace.Workspace` (typed ``Any`` here: the workspace
    imports this module)."""

    NAME: str
    METHOD: str

    def make_agent(self, ws: Any) -> Agent: ...
    def store(self, ws: Any) -> EpisodeStore: ...
    def run(self, ws: Any, until: int) -> None: ...
    def eval_action(self, ws: Any, obs: np.ndarray) -> Any: ...
    def resumed(self, ws: Any) -> None: ...


class RunLearner(Protocol):
    """The preference learner as the loops and the Workspace use it, whatever its nature:
    :class:`themis.feedback.PreferenceLearner` (``reward_training=sync``: feedback rounds in
    the loop's process, the loop waits) or :class:`themis.online.loop.AsyncLearner`
    (``reward_training=async``: the loop's end of the learner process, which asks, labels and
    trains beside the loop and publishes reward-model versions). Calls that only one of them
    needs are no-ops on the other (marked below), so no loop asks which one it has.
    """

    model: Any
    """The reward ensemble r̂ the agent's rewards come from."""
    schedule: Any
    """``query_schedule=decay``: queries per round by step (the banner reads it), else ``None``."""
    checkpoint_after_round: bool
    """Whether the loop takes a full checkpoint after each of its feedback rounds: sync, yes
    (the round's labels and r̂ live in the run's checkpoint; a crash after a round then asks
    nobody twice); async, no (the loop's round only loads a published version, 4 times per
    ``num_interact`` steps under DRLHP's passes; the learner process checkpoints its own
    rounds, and the periodic checkpoints keep the two at one step)."""

    @property
    def dataset(self) -> Any:
        """The labels so far (``len()``; ``save(folder)``; async: the learner's count)."""
    @property
    def stats(self) -> Any:
        """``as_dict()``: the label statistics of an ``eval.csv`` row."""
    @property
    def total_feedback(self) -> int: ...
    @property
    def labeled_feedback(self) -> int: ...
    @property
    def reward_accuracy(self) -> float: ...

    # the agent's reward: r̂ of a batch, ``(n, *obs_shape), (n, action_dim) -> (n,)``
    def reward(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray: ...
    def fit_normaliser(self, store: Any, most: int = 10_000) -> None: ...

    # the run's steps (async: sent to the learner process; sync: no-ops, the loop's store is
    # the learner's)
    def observe(self, i: int, obs: np.ndarray, action: np.ndarray, true_reward: float,
                terminated: bool, ended: bool, frame: np.ndarray | None = None) -> None: ...
    def stepped(self, n: int) -> None: ...

    # feedback rounds
    def round_due(self, steps_since_round: int, every: int) -> bool: ...
    def feedback_round(self, pool: QueryPool, first: bool = False, ask: bool = True,
                       final: bool = False) -> bool: ...
    def first_model_pending(self) -> bool: ...
    def is_open(self) -> bool: ...
    def pending(self) -> int: ...
    def unsaved_answers(self) -> bool: ...
    def fit_saved_labels(self, source: str) -> None: ...

    # the methods' hooks (async: no-ops; the methods that need them are refused there)
    def warm_start(self, draw: Callable[[], Any]) -> None: ...
    def replay(self, buffer: Any) -> Any: ...
    def update_between_rounds(self, agent: Any, step: int, sample: Callable[[], Any]) -> bool:
        ...
    def keep_training(self, steps: int) -> bool: ...

    # its life beside the run (sync: no-ops; its state is in the run's checkpoint)
    def start(self) -> None: ...
    def checkpoint(self) -> None: ...
    def close(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
