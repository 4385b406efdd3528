"""Configs from elsewhere: a run folder another person sent, read without trusting it.

A received ``config.yaml`` may carry resolver calls, unknown keys or values that name code to
import; :func:`load_received_config` reads it as the schema does and refuses the first,
:func:`check_named_code` refuses the last unless the user's own command line repeats it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from themis.core.run_keys import RunKeys
from themis.core.safe_loading import UnsafeFileError, check_no_resolvers, check_yaml_file
from themis.run.config import REMOVED_KEYS, TrainConfig
from themis.utils import ConfigError


def named_code(cfg: DictConfig | Mapping[str, Any] | RunKeys) -> dict[str, str]:
    """Config values that name code for this process to import and call:
    ``obs_transform=module:function`` and ``env=module:EnvId`` (``domain=Gym`` imports the
    module). Keys with such values -> the values."""
    found = {}
    for key in ("obs_transform", "env"):
        value = cfg.get(key) if isinstance(cfg, dict | DictConfig) else getattr(cfg, key, None)
        if isinstance(value, str) and ":" in value:
            found[key] = value
    return found


def check_named_code(cfg: DictConfig | Mapping[str, Any] | RunKeys, where: str | Path,
                     given: Collection[str] = ()) -> None:
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
        check_yaml_file(path)
        raw = OmegaConf.load(path)
    except UnsafeFileError as e:
        raise ConfigError(str(e)) from None
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


# ------------------------------------------------ settings a run folder may not choose
RECEIVED_SETTINGS: dict[str, str] = {
    "label_host": "the address your labeling server listens on",
    "label_port": "the port your labeling server listens on",
    "label_instructions": "a file of this machine shown to labelers",
    "gold_path": "a path outside the run",
    "prefs_path": "a path outside the run",
    "pretrained_snapshot": "a path outside the run",
    "pretrained_policy": "a path outside the run",
    "vlm_base_url": "the endpoint your frames and your VLM key are sent to",
    "vlm_model": "the model your VLM key pays for",
    "vlm_prompt": "a file of this machine sent to the VLM endpoint",
    "vlm_cache": "a path outside the run",
    "logger.wandb": "a tracker that gets your credentials",
    "logger.mlflow": "a tracker that gets your credentials",
    "logger.tracking_uri": "the server (or folder) your tracker writes to",
    "logger.entity": "the tracker account your runs go to",
    "logger.project": "the tracker project your runs go to",
}
"""Config keys that reach the network, the file system outside the run or a tracker (with this
user's credentials): a received ``config.yaml`` does not set them (:func:`check_received_settings`).
Key -> what it chooses, for the message."""

MARK_FILE = "config.yaml.owner"
"""Beside a run's ``config.yaml``: this user's mark of it (:func:`mark_config`)."""


def mark_config(run_dir: str | Path) -> None:
    """Mark the ``config.yaml`` Themis just wrote in ``run_dir`` as this user's
    (:func:`themis.core.owner.owner_mark` of its bytes, in :data:`MARK_FILE`): resuming the run
    later trusts its network, path and tracker settings. A copy of the folder carries the mark,
    but an edited ``config.yaml`` no longer matches it, and nobody else can make one."""
    from themis.core.owner import owner_mark

    run = Path(run_dir)
    mark = owner_mark("themis-config", (run / "config.yaml").read_bytes())
    (run / MARK_FILE).write_text(mark + "\n")


def written_here(config_yaml: str | Path) -> bool:
    """Whether ``config_yaml`` is as this user's Themis wrote it (its :data:`MARK_FILE`
    verifies); a run folder received from someone else, or an edited config, is not."""
    from themis.core.owner import is_owned

    path = Path(config_yaml)
    try:
        mark = (path.parent / MARK_FILE).read_text().strip()
        data = path.read_bytes()
    except (OSError, UnicodeDecodeError):
        return False
    return is_owned(mark, "themis-config", data)


def _given(key: str, given: Collection[str]) -> bool:
    """Whether the command line sets ``key`` (``logger=wandb`` sets every ``logger.*``)."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in given for i in range(1, len(parts) + 1))


def _inside(value: str, run: Path) -> bool:
    import os

    path = Path(value).expanduser()
    return path.is_absolute() and Path(os.path.realpath(path)).is_relative_to(
        os.path.realpath(run))


def check_received_settings(cfg: DictConfig, where: str | Path,
                            given: Collection[str] = ()) -> None:
    """Refuse the :data:`RECEIVED_SETTINGS` of a received run's ``config.yaml`` (``where``):
    a copied web run that says ``label_host: 0.0.0.0`` and ``label_instructions: ~/notes.txt``
    would open your labeling page to the network and show your file; ``logger: {mlflow: true,
    tracking_uri: http://...}`` would send your tracking token to the sender's server.

    A setting passes when the config is your own (:func:`written_here`), when the command line
    sets the key (``given``: your choice), when it is the schema's default, when
    ``label_instructions`` is text rather than a file name, and when a path lies inside the run.

    Raises:
        ConfigError: every refused setting in one line, and the two ways to pass them.
    """
    from omegaconf import OmegaConf

    if written_here(where):
        return
    run = Path(where).parent
    defaults = OmegaConf.structured(TrainConfig)
    refused: list[tuple[str, Any, str, str]] = []
    for key, what in RECEIVED_SETTINGS.items():
        value = OmegaConf.select(cfg, key, default=None)
        default = OmegaConf.select(defaults, key, default=None)
        if _given(key, given) or value == default:
            continue
        if isinstance(value, str) and key == "label_instructions" and not \
                value.strip().lower().endswith((".md", ".txt", ".markdown")):
            continue  # the text itself: data, shown as text
        if isinstance(value, str) and what.startswith("a path") and _inside(value, run):
            continue
        shown = "null" if default is None else str(default).lower() \
            if isinstance(default, bool) else "''" if default == "" else str(default)
        refused.append((key, value, what, shown))
    if refused:
        settings = ", ".join(f"{key}={value} ({what})" for key, value, what, _ in refused)
        keep = " ".join(f"{key}={value}" for key, value, _, _ in refused)
        reset = " ".join(f"{key}={shown}" for key, _, _, shown in refused)
        raise ConfigError(
            f"{where} sets {settings}: chosen by a run folder that is not yours (received, or "
            f"its config.yaml edited: no mark of yours in {MARK_FILE}); pass them on the "
            f"command line to keep them ({keep}) or to use the defaults ({reset})")
