"""The builder of a run: one validated config and a run dir -> the :class:`Workspace` with the
training loop its action space needs. Used by the entry points (:mod:`themis.cli`), the
interpretation tools, the scripts and the tests alike; it reads no command line and never ends
the program (a bad config raises :class:`themis.utils.ConfigError`)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from themis.run.config import TrainConfig, resume_target
from themis.run.snapshot import take_snapshot_schedule
from themis.run.workspace import Workspace, query_rounds
from themis.utils import ConfigError


def make_workspace(cfg: DictConfig | TrainConfig, run_dir: Path) -> Workspace:
    """The workspace of a config with the training loop its action space needs: PEBBLE with
    SAC for ``Box`` actions (:mod:`themis.loops.pebble`), PrefPPO with PPO for ``Discrete``
    (:mod:`themis.loops.prefppo`), or the one ``agent=`` names.

    Raises:
        ConfigError: an invalid config, or an agent that cannot act in the env.
    """
    from themis.agents import resolve_agent
    from themis.environments.domains import make_env
    from themis.feedback.selector import resolve_reward_batch
    from themis.loops import pebble, prefppo
    from themis.methods.registry import check_methods
    from themis.online.loop import AsyncLearner
    from themis.run.validation import validate

    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    assert isinstance(cfg, TrainConfig)
    auto_batch = cfg.reward_batch == "auto"
    if cfg.pretrained_snapshot:  # a method that cannot start from a snapshot: say so first
        check_methods(cfg)
    snapshot_note = take_snapshot_schedule(cfg) if cfg.pretrained_snapshot and \
        resume_target(cfg.resume) is None else None
    validate(cfg)
    probe = make_env(cfg.domain, cfg.env, obs_transform=cfg.obs_transform, **cfg.env_kwargs)
    try:
        name, _ = resolve_agent(cfg.agent, probe.action_space)
    except ValueError as e:
        raise ConfigError(f"{cfg.env}: {e}") from None
    finally:
        probe.close()
    check_methods(cfg, agent=name)
    if auto_batch:  # fewer than ten rounds: larger ones (docs/guide/configuration.md)
        cfg.reward_batch = resolve_reward_batch("auto", cfg.max_feedback, query_rounds(cfg, name))
    ws = Workspace(cfg, run_dir, pebble if name == "sac" else prefppo, async_learner=AsyncLearner)
    if snapshot_note is not None:
        ws.logger.info(snapshot_note, "cyan")
    return ws


RESULTS = ("train.csv", "eval.csv", "reward.csv", "checkpoints")
"""What a run writes into its run dir once it has started."""


def earlier_run(run: Path) -> str | None:
    """The first of :data:`RESULTS` already in ``run`` (a run was started there), or None."""
    return next((name for name in RESULTS if (run / name).exists()), None)


__all__ = ["RESULTS", "earlier_run", "make_workspace"]
