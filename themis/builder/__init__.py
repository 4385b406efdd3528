"""The builder of a run: one validated config and a run dir -> the :class:`Workspace` with the
training loop its action space needs. Used by the entry points (:mod:`themis.cli`), the
interpretation tools, the scripts and the tests alike; it reads no command line and never ends
the program (a bad config raises :class:`themis.utils.ConfigError`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from themis.run.config import TrainConfig
from themis.run.resolve import resolve
from themis.run.workspace import Workspace


def make_workspace(cfg: DictConfig | TrainConfig, run_dir: Path, **given: Any) -> Workspace:
    """The workspace of a config with the training loop its action space needs: PEBBLE with
    SAC for ``Box`` actions (:mod:`themis.loops.pebble`), PrefPPO with PPO for ``Discrete``
    (:mod:`themis.loops.prefppo`), or the one ``agent=`` names. The config is resolved and
    checked once (:func:`themis.run.resolve.resolve`; ``given``: keys the caller has decided,
    the launcher's ``torch_threads``); ``ws.cfg`` is the resolved one.

    Raises:
        ConfigError: an invalid config, or an agent that cannot act in the env.
    """
    from themis.loops import pebble, prefppo
    from themis.online.loop import AsyncLearner

    resolved = resolve(cfg, **given)
    ws = Workspace(resolved.cfg, run_dir, pebble if resolved.agent == "sac" else prefppo,
                   async_learner=AsyncLearner)
    if resolved.note is not None:
        ws.logger.info(resolved.note, "cyan")
    return ws


RESULTS = ("train.csv", "eval.csv", "reward.csv", "checkpoints")
"""What a run writes into its run dir once it has started."""


def earlier_run(run: Path) -> str | None:
    """The first of :data:`RESULTS` already in ``run`` (a run was started there), or None."""
    return next((name for name in RESULTS if (run / name).exists()), None)


__all__ = ["RESULTS", "earlier_run", "make_workspace"]
