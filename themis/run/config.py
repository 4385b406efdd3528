"""Typed configuration schema (Hydra structured configs) and its composition.

Every knob of a Themis run is a field of :class:`TrainConfig`, under BPref's key names (the
flat keys on the core floor, :class:`themis.core.run_keys.RunKeys`; the key groups here), so
that a typo (``num_trian_steps=5``) or a wrong type (``num_train_steps=abc``) fails when
Hydra composes the config, before anything runs. :func:`themis.run.validation.validate` then
checks values and combinations; :mod:`themis.run.received_config` reads a config that came
from elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from themis.agents.a2c import A2CConfig
from themis.agents.ppo import PPOConfig
from themis.agents.sac import SACConfig
from themis.core.run_keys import RunKeys
from themis.methods.registry import config_fields
from themis.tracking.settings import LoggerConfig


@dataclass
class BaseTrainConfig(RunKeys):
    """Schema of ``config/train_themis.yaml`` and ``config/pretrain_themis.yaml`` without the
    methods' key groups (:data:`TrainConfig` adds one per registered method): the flat keys of
    :class:`~themis.core.run_keys.RunKeys` (each documented there), then the key groups of the
    trackers and the agents."""

    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Where rows go besides the CSV files (config group): logger=tensorboard, logger=wandb,
    logger=mlflow or several, logger=[wandb,mlflow]; settings logger.* (docs/guide/tracking.md)."""
    sac: SACConfig = field(default_factory=lambda: SACConfig(hidden_dim=128))
    """SAC hyper-parameters (hidden 128: fits the 20-min main job on 2 cores; SB3 256)."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyper-parameters (discrete actions)."""
    a2c: A2CConfig = field(default_factory=A2CConfig)
    """A2C hyper-parameters (``agent=a2c``: DRLHP's Atari agent; discrete actions)."""


if TYPE_CHECKING:
    class TrainConfig(BaseTrainConfig):
        """The whole schema (see below); a method's group is ``Method.own_keys(cfg)``."""
else:
    TrainConfig = make_dataclass("TrainConfig", config_fields(), bases=(BaseTrainConfig,))
    TrainConfig.__module__ = __name__  # pickles and reads as themis.run.config.TrainConfig
    TrainConfig.__doc__ = """Schema of ``config/train_themis.yaml`` and
    ``config/pretrain_themis.yaml``: :class:`BaseTrainConfig` and one ``<name>.*`` group per
    method of :data:`themis.methods.registry.REGISTRY` (its ``Config`` dataclass)."""


CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


def frame_size(cfg: RunKeys) -> int:
    """``human_frame_size``, or its default: 256 px when a person or a VLM labels, else 128."""
    return int(cfg.human_frame_size or (256 if cfg.human_teacher or cfg.vlm_teacher else 128))


def frame_capacity(cfg: RunKeys) -> int:
    """``human_frame_capacity``, or its default: 5000 frames at 256 px and more, else 10000
    (about 1 GB and 0.5 GB of square RGB frames)."""
    return int(cfg.human_frame_capacity or (5_000 if frame_size(cfg) >= 256 else 10_000))


REMOVED_KEYS = {
    "core_turns": "runs no longer take turns on the cores: each run has one thread "
                  "(torch_threads), and a local sweep runs at most one job per core",
}
"""Keys earlier Themis versions had -> why they went (:func:`removed_key`)."""


def removed_key(key: str) -> str | None:
    """The one line that refuses a key Themis removed (:data:`REMOVED_KEYS`), or ``None``."""
    why = REMOVED_KEYS.get(key.lstrip("+~"))
    return f"{key.lstrip('+~')} was removed from Themis ({why}); drop it" if why else None


def job_prefix() -> str:
    """``[job N] `` inside a Hydra multirun (``-m``), where parallel jobs print to one
    terminal; ``""`` otherwise (also outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return ""
    hydra_cfg = HydraConfig.get()
    return f"[job {hydra_cfg.job.num}] " if hydra_cfg.mode == RunMode.MULTIRUN else ""


def resume_target(value: object) -> str | None:
    """What ``resume=`` asks for: ``None`` (no resume: unset, false, no, 0, none, null),
    ``"here"`` (true, yes, 1: the run dir of this job) or the run dir given."""
    text = "" if value is None else str(value).strip()
    if text.lower() in ("", "false", "0", "no", "none", "null"):
        return None
    return "here" if text.lower() in ("true", "1", "yes") else text


def schema_keys() -> list[str]:
    """Every key of the schema, nested ones dotted (``sac.batch_size``): for "did you mean"
    hints on a key typo."""
    from omegaconf import OmegaConf

    def keys(node: Any, prefix: str = "") -> list[str]:
        found = []
        for key in node:
            found.append(prefix + key)
            if isinstance(node[key], DictConfig):
                found += keys(node[key], f"{prefix}{key}.")
        return found

    return keys(OmegaConf.structured(TrainConfig))


def compose(overrides: list[str] | None = None, name: str = "train_themis",
            return_hydra_config: bool = False) -> DictConfig:
    """Compose ``config/<name>.yaml`` with command-line style ``overrides``, as the launchers
    do (for scripts, tests and the entry point's preflight).

    Raises:
        hydra.errors.HydraException, omegaconf.errors.OmegaConfBaseException: bad overrides.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name=name, overrides=overrides or [],
                             return_hydra_config=return_hydra_config)


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (name ``train_schema``)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
