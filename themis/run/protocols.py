"""What the Workspace is handed and does not import: the training loop (:class:`Driver`, a
module of :mod:`themis.loops`) and, with ``reward_training=async``, the background learner
(:class:`RemoteLearner`, :class:`themis.online.loop.AsyncLearner`). Both sit on a higher floor
than :mod:`themis.run` and read the workspace; these protocols say what the workspace asks of
them."""

from __future__ import annotations

from collections.abc import Sized
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from themis.agents import Agent
    from themis.agents.buffers import EpisodeStore


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


class RemoteLearner(Protocol):
    """The background learner of ``reward_training=async`` as the workspace uses it
    (:class:`themis.online.loop.AsyncLearner`; it also answers what the loops ask of a
    :class:`themis.feedback.PreferenceLearner`)."""

    @property
    def dataset(self) -> Sized:
        """``len()``: the labels of the version in use."""

    def start(self) -> None: ...
    def checkpoint(self) -> None: ...
    def newer(self) -> bool: ...
    def take(self, wait: bool = False) -> int | None: ...
    def first_model_pending(self) -> bool: ...
    def close(self) -> None: ...
    # the agent side (the loops): each step of sub-env ``i`` goes to the learner process
    def record(self, i: int, obs: np.ndarray, action: np.ndarray, true_reward: float,
               terminated: bool, frame: np.ndarray | None = None) -> None: ...
    def end_episode(self, i: int) -> None: ...
    def stepped(self, n: int) -> None: ...
