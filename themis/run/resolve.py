"""A composed config -> the run's settings, once: everything derived from the keys (the
pretraining schedule a snapshot ran, ``reward_batch=auto``, the agent the action space needs,
``resume`` normalised) is computed here, the whole config is checked once, and the result is a
new :class:`~themis.run.config.TrainConfig` that nothing assigns to afterwards. The builder
(:func:`themis.builder.make_workspace`) calls it; ``config.yaml`` is written from its result.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from themis.run.config import TrainConfig, resume_target
from themis.utils import ConfigError


@dataclass(frozen=True)
class Resolved:
    """A run's settings after :func:`resolve`.

    Attributes:
        cfg: the config with every derived value filled in (``reward_batch`` an integer,
            ``resume`` ``None`` or a target, a snapshot's ``num_seed_steps`` /
            ``num_unsup_steps``); the ``agent`` key keeps what the user wrote.
        agent: ``"sac"`` or ``"ppo"``, the agent the env's action space needs (or ``agent=``).
        note: a console line about the settings taken from ``pretrained_snapshot``, if any.
    """

    cfg: TrainConfig
    agent: str
    note: str | None = None


def resolve(cfg: DictConfig | TrainConfig, **given: Any) -> Resolved:
    """Resolve and check a composed config (see the module docstring).

    Args:
        cfg: a composed config (Hydra's ``DictConfig`` or the typed object); not modified.
        **given: keys the caller has decided already (the launcher's ``torch_threads``).

    Raises:
        ConfigError: one line for the first bad key or combination, an unreadable snapshot,
            or an agent that cannot act in the env.
    """
    from themis.agents import resolve_agent
    from themis.environments.domains import make_env
    from themis.feedback.selector import resolve_reward_batch
    from themis.run.plan import query_rounds
    from themis.run.snapshot import snapshot_schedule
    from themis.run.validation import check_start, validate

    typed = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg
    assert isinstance(typed, TrainConfig)
    resume = resume_target(typed.resume)
    changes: dict[str, Any] = {**given, "resume": None if resume is None else typed.resume}
    note = None
    if typed.pretrained_snapshot:  # a method that cannot start from a snapshot: say so first
        check_start(typed)
        if resume is None:
            seed, unsup, note = snapshot_schedule(typed)
            changes.update(num_seed_steps=seed, num_unsup_steps=unsup)
    typed = dataclasses.replace(typed, **changes)
    validate(typed)
    probe = make_env(typed.domain, typed.env, obs_transform=typed.obs_transform,
                     **typed.env_kwargs)
    try:
        agent, _ = resolve_agent(typed.agent, probe.action_space)
    except ValueError as e:
        raise ConfigError(f"{typed.env}: {e}") from None
    finally:
        probe.close()
    check_start(typed, agent=agent)
    # reward_batch=auto: ten rounds, fewer and larger when the schedule holds fewer
    # (docs/guide/configuration.md)
    batch = resolve_reward_batch(typed.reward_batch, typed.max_feedback,
                                 query_rounds(typed, agent))
    return Resolved(dataclasses.replace(typed, reward_batch=batch), agent, note)


def config_yaml(cfg: TrainConfig) -> str:
    """A resolved config as the run's ``config.yaml`` (what ``resume=`` reads back)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


__all__ = ["Resolved", "config_yaml", "resolve"]
