"""Entry points of offline runs: ``./themis_train.sh mode=offline dataset=PATH [key=value ...]``
(the launcher hands ``mode=offline`` command lines to ``python -m themis.offline.main``) and
:func:`train_offline` from Python.

    ./themis_train.sh mode=offline dataset=runs/sac_cheetah env=HalfCheetah-v5 max_feedback=500
    ./themis_train.sh mode=offline dataset=minari:mujoco/halfcheetah/medium-v0 reward_net=pt
    ./themis_train.sh mode=offline dataset=... hydra.run.dir=runs/off1   # the run folder
    ./themis_train.sh resume=runs/off1          # continue it (its config.yaml says mode: offline)

The keys are :class:`themis.offline.config.OfflineConfig`'s (defaults in
``config/offline_themis.yaml``), composed by Hydra's compose API; the run folder is
``hydra.run.dir`` (default ``runs/offline/DATE/TIME``). Bad input (an unknown key, a bad value,
an unreadable dataset or label file) ends with one line on stderr and exit code 2 before any
training; :func:`train_offline` raises :class:`themis.utils.ConfigError` with the same line.
"""

from __future__ import annotations

import difflib
import os
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from themis.agents.iql import IQLConfig
from themis.offline.config import OfflineConfig, key_names, register, validate
from themis.utils import ConfigError

CONFIG_NAME = "offline_themis"
REWARD_KEYS = ("reward", "reward_net", "segment", "max_feedback", "reward_batch", "feed_type",
               "teacher", "labels", "seed", "reward_scale")
"""Keys a resumed run keeps: its labels, reward model and relabelled rewards were made with
them."""
CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


@dataclass
class OfflineResult:
    """What :func:`train_offline` returns: the run folder and its last ``eval.csv`` row
    (``episode_reward``: mean true return; ``normalised_return`` when references are known)."""

    run_dir: Path
    metrics: dict[str, Any] = field(default_factory=dict)


def unknown_key(override: str) -> str | None:
    """The one line for an override whose key is not an offline run's, or ``None``."""
    key = override.lstrip("+~").split("=", 1)[0]
    top, _, inner = key.partition(".")
    names = key_names()
    if top == "iql" and inner:
        names, top = [f.name for f in fields(IQLConfig)], inner
    if top in names:
        return None
    close = difflib.get_close_matches(top, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{key} is not a key of offline runs{hint}; themis/offline/config.py lists them"


def compose(overrides: list[str], saved: Path | None = None) -> OfflineConfig:
    """The run's keys: ``config/offline_themis.yaml``, a resumed run's saved ``config.yaml``
    (values only), then ``overrides``; validated.

    Raises:
        ConfigError: one line.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"{override}: write each setting as key=value")
        if (line := unknown_key(override)) is not None:
            raise ConfigError(line)
    register()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name=CONFIG_NAME)
        # the command line merged as values: domain= and teacher= are keys here, not the
        # online runs' config groups of the same names
        layers = [_saved_values(saved)] if saved is not None else []
        merged = OmegaConf.merge(cfg, *layers, _as_strings(overrides))
        typed = OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except Exception as e:  # Hydra and OmegaConf raise many types; all are bad input here
        key = getattr(e.__cause__ or e, "full_key", "")
        first = str(e.__cause__ or e).strip().splitlines()[0]
        raise ConfigError(f"{key}: {first}" if key else first) from None
    assert isinstance(typed, OfflineConfig)
    validate(typed)
    return typed


def _as_strings(overrides: list[str]) -> dict[str, Any]:
    """``["a=1", "iql.b=x"]`` -> ``{"a": "1", "iql": {"b": "x"}}``: each value as typed, for the
    schema to convert (``reward=true`` stays the word, ``seed=3`` becomes the number)."""
    out: dict[str, Any] = {}
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def _saved_values(path: Path) -> Any:
    """A run's ``config.yaml`` as plain values (no resolver calls, no keys of another kind).

    Raises:
        ConfigError: unreadable, or values that call resolvers.
    """
    from omegaconf import DictConfig, OmegaConf

    from themis.core.safe_loading import UnsafeFileError, check_no_resolvers, check_yaml_file

    try:
        check_yaml_file(path)
        raw = OmegaConf.load(path)
    except UnsafeFileError as e:
        raise ConfigError(str(e)) from None
    except Exception as e:  # YAML and OmegaConf errors
        raise ConfigError(f"{path} is not a readable YAML config ({str(e).splitlines()[0]})"
                          ) from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path} is not a Themis config (no key: value mapping)")
    check_no_resolvers(raw, path)
    for key in list(raw):
        if str(key) not in key_names():
            raise ConfigError(f"{path}: {key} is not a key of offline runs")
    return raw


def prepare(overrides: list[str], run_dir: Path | None) -> tuple[OfflineConfig, Path]:
    """The keys and run folder of a new or resumed run. A resumed run's saved dataset path is
    trusted only when this user's Themis wrote its ``config.yaml``; otherwise ``dataset=`` must
    be given again.

    Raises:
        ConfigError: one line (bad keys, a run folder that holds another run, a resume target
            without a run).
    """
    from themis.run.received_config import written_here

    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("resume=")), "")
    overrides = [o for o in overrides if not o.startswith("resume=")]
    if resume:
        out = Path(resume)
        saved = out / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"resume={resume}: no offline run there (config.yaml missing)")
        before = compose([], saved)
        cfg = compose(overrides, saved)
        given = {o.split("=", 1)[0] for o in overrides}
        changed = [k for k in REWARD_KEYS if getattr(cfg, k) != getattr(before, k)]
        if changed:  # its labels, reward model and relabelled rewards were made with the old
            raise ConfigError(f"resume={resume}: {changed[0]}={getattr(cfg, changed[0])} "
                              f"changes the reward the run learned ({changed[0]}="
                              f"{getattr(before, changed[0])}); start a new run for it")
        if not written_here(saved):  # a received folder chooses no path and no code
            chosen = [key for key, value in (("dataset", cfg.dataset), ("labels", cfg.labels),
                                             ("env", cfg.env if ":" in cfg.env else ""))
                      if value and key not in given]
            if chosen:
                raise ConfigError(f"resume={resume}: its config.yaml was not written by your "
                                  f"Themis; give {'= and '.join(chosen)}= again to continue it")
    else:
        out = run_dir or Path("runs", "offline", time.strftime("%Y-%m-%d"),
                              time.strftime("%H-%M-%S"))
        cfg = compose(overrides)
        if (out / "config.yaml").is_file():
            raise ConfigError(f"run dir {out} already holds a run; continue it with "
                              f"resume={out}, or give this run another hydra.run.dir")
    return cfg, out


def write_config(cfg: OfflineConfig, out: Path) -> None:
    """The run folder with its ``config.yaml``, marked as this user's (a later ``resume=``
    trusts its dataset path). Written once the dataset has been read, so that a refused run
    leaves no folder behind.

    Raises:
        ConfigError: the folder cannot be created or written.
    """
    from omegaconf import OmegaConf

    from themis.run.received_config import mark_config

    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    except OSError as e:
        raise ConfigError(f"run dir {out} cannot be created or written ({e.strerror})") from None
    mark_config(out)


def train_offline(run_dir: str | os.PathLike[str] | None = None, **keys: Any) -> OfflineResult:
    """An offline run from Python: the launcher's keys as keyword arguments (``iql`` as a
    dict: ``iql={"expectile": 0.9}``; ``resume=RUN_DIR`` continues a run).

    Returns:
        :class:`OfflineResult`.

    Raises:
        ConfigError: the launcher's one line (bad keys, values, dataset or label file).
    """
    from themis.offline.loop import OfflineRun

    overrides = []
    for key, value in keys.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for inner, v in items:
            name = f"{key}.{inner}" if inner else key
            overrides.append(f"{name}={'' if v is None else v}")
    cfg, out = prepare(overrides, Path(run_dir) if run_dir is not None else None)
    run = OfflineRun(cfg, out)
    write_config(cfg, out)
    return OfflineResult(out, run.run())


def help_text() -> str:
    """``--help``: every key of an offline run with its default and description."""
    from omegaconf import OmegaConf

    from themis.run.config_help import field_descriptions

    described = {**field_descriptions(OfflineConfig), **field_descriptions(IQLConfig, "iql.")}
    lines = ["Themis offline: ./themis_train.sh mode=offline dataset=PATH [key=value ...]; "
             "-m sweeps comma lists (seed=0,1,2) one run after another", ""]
    flat = OmegaConf.to_container(OmegaConf.structured(OfflineConfig))
    assert isinstance(flat, dict)
    items = [(str(k), v) for k, v in flat.items() if k != "iql"]
    items += [(f"iql.{k!s}", v) for k, v in flat["iql"].items()]
    for key, value in items:
        lines.append(f"  {key}={value}" + (f"  # {described[key]}" if key in described else ""))
    return "\n".join(lines)


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """``-m``: every combination of the comma-separated values (``seed=0,1,2
    reward_net=bpref,pt``: six jobs), in order; other overrides in each job."""
    import itertools

    choices = [[f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")]
               if "," in o.partition("=")[2] else [o] for o in overrides]
    return [list(job) for job in itertools.product(*choices)]


def main(argv: list[str]) -> int:
    """``python -m themis.offline.main KEY=VALUE ...``: 0 when the run (every run of a ``-m``
    sweep) ends, 2 on bad input (one line on stderr, before any training), 130 on Ctrl-C."""
    from themis.offline.loop import OfflineRun

    if any(a in ("--help", "-h") for a in argv):
        print(help_text())
        return 0
    run_dir = next((Path(a.split("=", 1)[1]) for a in argv if a.startswith("hydra.run.dir=")),
                   None)
    sweep = any(a in ("-m", "--multirun") for a in argv)
    overrides = [a for a in argv if not a.startswith(("hydra.", "hydra/", "+hydra", "~hydra",
                                                      "-"))]
    jobs = sweep_jobs(overrides) if sweep else [overrides]
    base = run_dir or Path("multirun" if sweep else "runs", "offline",
                           time.strftime("%Y-%m-%d"), time.strftime("%H-%M-%S"))
    runs = []
    try:  # every job is checked (keys, values, dataset) before the first one trains
        for number, job in enumerate(jobs):
            cfg, out = prepare(job, base / str(number) if sweep else base)
            runs.append((cfg, out, OfflineRun(cfg, out)))
        for cfg, out, _ in runs:
            write_config(cfg, out)
    except ConfigError as e:
        print(f"themis: error: {e}", file=sys.stderr)
        return 2
    for _, out, run in runs:
        try:
            last = run.run()
        except ConfigError as e:  # found only once data is read (checked upfront where it can)
            print(f"themis: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"themis: stopped; continue with ./themis_train.sh mode=offline resume={out}",
                  file=sys.stderr)
            return 130
        print(f"themis: offline run done in {out}"
              + (f": true return {last['episode_reward']:.1f}" if last else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
