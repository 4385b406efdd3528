"""Messages that point the right way: the one line for command lines Hydra reads differently
from what the user meant (``--num_train_steps 1000``, ``num_train_steps=1e5``,
``env_kwargs.x=1`` without ``+``) and for run folders given to the wrong key (``resume=`` of a
pretraining run or of a finished one; ``prefs_path=RUN_DIR`` is told in
:func:`themis.feedback.factory.make_dataset`).

Each function returns the line (for :func:`themis.cli.train.fail`) or None when it has
nothing to say; none of them imports more than the standard library and OmegaConf.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

HELP = {"train_themis": "./themis_train.sh --help",
        "pretrain_themis": "./themis_pretrain.sh --help"}
"""The command that lists the keys, per config (the launchers, not ``python -m``, which needs
the venv's interpreter)."""

OPEN_KEYS = ("env_kwargs",)
"""Keys that hold a mapping of the user's own keys: a new key in them needs Hydra's ``+``."""

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def help_command(config_name: str) -> str:
    """``./themis_train.sh --help`` (or the pretraining launcher's)."""
    return HELP.get(config_name, HELP["train_themis"])


def flag_hint(argv: list[str], keys: list[str]) -> str | None:
    """``--num_train_steps 1000`` (argparse's spelling of a Themis key): Themis keys are
    ``key=value``. ``keys``: the schema's keys (:func:`themis.run.config.schema_keys`)."""
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        key, eq, value = arg[2:].partition("=")
        if key.replace("-", "_") in keys or key in keys:
            key = key if key in keys else key.replace("-", "_")
            if not eq:
                value = argv[i + 1] if i + 1 < len(argv) and "=" not in argv[i + 1] else "VALUE"
            return (f"{arg if eq else (arg + ' ' + value).strip()}: Themis keys are given as "
                    f"key=value (Hydra overrides), e.g. {key}={value}")
    return None


HYDRA_FLAGS = ("--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--resolve",
               "--package", "-p", "--run", "-r", "--multirun", "-m", "--shell-completion",
               "-sc", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
               "--experimental-rerun", "--info", "-i")
"""The flags a Hydra app takes (``hydra.main``'s argument parser)."""


def unknown_flag(argv: list[str]) -> str | None:
    """The one line for a flag Hydra does not take (``--hlep``; argparse would print its
    whole usage naming ``train.py``), with the closest flag, or ``None``."""
    import difflib

    for arg in argv:
        flag = arg.split("=", 1)[0]
        if not arg.startswith("-") or flag in HYDRA_FLAGS or _NUMBER.match(arg):
            continue
        long_flags = [f for f in HYDRA_FLAGS if f.startswith("--")]
        close = difflib.get_close_matches(flag, long_flags, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return (f"{flag} is not an option{hint}; --help lists the keys, which are given as "
                "key=value")
    return None


def integer_hint(key: str, overrides: list[str]) -> str | None:
    """``num_train_steps=1e5`` or ``=2.5e4`` for an integer key: the integer to write."""
    for override in overrides:
        name, _, value = override.lstrip("+~").partition("=")
        if name != key or not _NUMBER.match(value.strip()):
            continue
        number = float(value)
        if not math.isfinite(number):  # 1e400 reads as infinity
            return f"{key}={value} must be an integer, e.g. {key}=1 ({value} is out of range)"
        if number.is_integer():
            return (f"{key}={value} must be an integer: write {key}={int(number)} "
                    "(Hydra reads 1e5 as a float)")
        return f"{key}={value} must be an integer, e.g. {key}={round(number)}"
    return None


def plus_hint(key: str, overrides: list[str]) -> str | None:
    """``env_kwargs.continuous=false``: a new key of a mapping needs ``+``."""
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    if parent not in OPEN_KEYS:
        return None
    value = next((o.partition("=")[2] for o in overrides if o.partition("=")[0] == key), "VALUE")
    return (f"{key} adds a key to {parent}: Hydra needs a + for a new key, "
            f"+{key}={value}")


def composition_hint(error: Exception, overrides: list[str]) -> str | None:
    """The hint of a Hydra composition error, when it is one of the spellings above."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause: Any = error.__cause__ or error
    key = str(getattr(cause, "full_key", "") or "")
    if isinstance(cause, ValidationError) and "converted to Integer" in str(cause) and key:
        return integer_hint(key, overrides)
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key:
        return plus_hint(key, overrides)
    return None


def resume_problem(target: Path, overrides: list[str]) -> str | None:
    """``resume=RUN`` of a folder that is no run to continue: a pretraining run (its snapshot
    starts a training run: ``pretrained_snapshot=``) or a run that had finished (its end wrote
    ``agent.pt`` at ``num_train_steps``; a larger ``num_train_steps=`` trains on)."""
    ckpt = target / "checkpoints"
    if (target / "snapshot.pt").is_file() and not (ckpt / "state.pt").is_file() and \
            not (ckpt / "state.prev.pt").is_file():
        return (f"resume={target} is a pretraining run (snapshot.pt, no checkpoints/): start "
                f"training from it with pretrained_snapshot={target / 'snapshot.pt'}")
    for key in ("env", "domain"):  # a resumed run keeps what it was trained on
        given = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith(f"{key}=")]
        saved = _saved_value(target / "config.yaml", key)
        if given and saved is not None and given[-1] != str(saved):
            return (f"resume={target}: a resumed run keeps its {key} ({key}={saved}); start a "
                    f"new run for {key}={given[-1]}")
    if any(o.lstrip("+").startswith("num_train_steps=") for o in overrides):
        return None  # a new length: checked when the run resumes
    step = _finished_step(ckpt / "agent.pt")
    total = _saved_value(target / "config.yaml", "num_train_steps")
    if step is not None and isinstance(total, int) and step >= total:
        return (f"resume={target}: the run had finished (step {step} of num_train_steps="
                f"{total}); to train on, resume it with a larger num_train_steps=")
    return None


def _finished_step(path: Path) -> int | None:
    """The step of a run's ``checkpoints/agent.pt`` (read without pickle) when the run's end
    wrote it (``finished``; an agent.pt of an earlier version has no such key: its step), or
    None: the last evaluation's agent.pt, written before the run's end gathered the last
    answers, is not a finished run."""
    if not path.is_file():
        return None
    try:
        from themis.core.safe_loading import safe_load

        state = safe_load(path, "cpu", mmap=True)
    except Exception:  # unreadable: the resume itself says so
        return None
    if not isinstance(state, dict) or not state.get("finished", True):
        return None
    step = state.get("step")
    return step if isinstance(step, int) else None


def _saved_value(path: Path, key: str) -> Any:
    """One top-level value of a run's saved ``config.yaml`` (values only, no resolvers)."""
    try:
        from omegaconf import OmegaConf

        from themis.core.safe_loading import check_yaml_file

        check_yaml_file(path)
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False).get(key)  # type: ignore[union-attr]
    except Exception:
        return None
