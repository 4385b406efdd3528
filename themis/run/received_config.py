"""Configs from elsewhere: a run folder another person sent, read without trusting it.

A received ``config.yaml`` may carry resolver calls, unknown keys or values that name code to
import; :func:`load_received_config` reads it as the schema does and refuses the first,
:func:`check_named_code` refuses the last unless the user's own command line repeats it.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from themis.core.safe_loading import check_no_resolvers
from themis.run.config import REMOVED_KEYS, TrainConfig
from themis.utils import ConfigError


def named_code(cfg: Any) -> dict[str, str]:
    """Config values that name code for this process to import and call:
    ``obs_transform=module:function`` and ``env=module:EnvId`` (``domain=Gym`` imports the
    module). Keys with such values -> the values."""
    found = {}
    for key in ("obs_transform", "env"):
        value = cfg.get(key) if isinstance(cfg, dict | DictConfig) else getattr(cfg, key, None)
        if isinstance(value, str) and ":" in value:
            found[key] = value
    return found


def check_named_code(cfg: Any, where: str | Path, given: Collection[str] = ()) -> None:
    """Refuse a received config (another person's run folder) that names code to import
    (:func:`named_code`): a run folder can carry a Python module of its own, and importing
    it would run it. A key the command line sets (``given``) is the user's own choice.

    Raises:
        ConfigError: the first such key, and how to confirm it.
    """
    for key, value in named_code(cfg).items():
        if key not in given:
            raise ConfigError(f"{where}: {key}={value} names code to import and run "
                              f"({value.split(':')[0]}); a received config may not: repeat "
                              f"{key}={value} on the command line if you trust it")


def load_received_config(path: str | Path) -> DictConfig:
    """A run's ``config.yaml`` as the schema reads it, refusing what a crafted file could do:
    resolver calls (:func:`themis.core.safe_loading.check_no_resolvers`), no YAML mapping,
    keys or types the schema does not know.

    Raises:
        ConfigError: one line naming the file and the problem.
    """
    from omegaconf import ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    try:
        raw = OmegaConf.load(path)
    except (OSError, UnicodeDecodeError, YAMLError, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{path} is not a readable YAML config ({first})") from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path} is not a Themis config (no key: value mapping)")
    check_no_resolvers(raw, path)
    for key in REMOVED_KEYS:  # a run of an earlier version: the key changed nothing it saved
        raw.pop(key, None)
    if isinstance(raw.get("logger"), ListConfig):  # runs before the logger group: [csv, ...]
        raw.logger = {"tensorboard": "tensorboard" in list(raw.logger)}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), raw)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "a value"
        raise ConfigError(f"{path}: {key}: {str(e).splitlines()[0]}") from None
    assert isinstance(merged, DictConfig)
    return merged
