"""Themis's own training loop from Python: :func:`train` and :func:`load_run`.

    import themis

    run = themis.train(env="HalfCheetah-v5", max_feedback=1000, seed=0)
    print(run.run_dir, run.metrics["episode_reward"])
    back = themis.load_run(run.run_dir)
    back.eval.tail(), back.rewards.tail(), back.reward_model, back.agent_state

:func:`train` is ``./themis_train.sh`` without the shell: the same keys (keyword arguments;
nested groups as dicts, ``sac={"hidden_dim": 64}``; config groups by name, ``domain="DMC"``,
``teacher="noisy"``), composed by Hydra's compose API from the repository's
``config/`` with the launcher's defaults (``config/train_themis.yaml``), the same validation,
and the same one-line messages, raised as :class:`TrainConfigError` (a
:class:`themis.utils.ConfigError`) instead of exit code 2.

:func:`load_run` reads a run folder back without unpickling anything: the CSV rows, the reward
model (:func:`themis.reward.ensemble.load_reward_model`, plain tensors only) and the agent's
weights (``checkpoints/agent.pt`` through :func:`themis.core.safe_loading.safe_load`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from themis.run.closing import finish
from themis.utils import ConfigError


class TrainConfigError(ConfigError):
    """Bad keys or values given to :func:`train`: the launcher's one line (the message)."""


GROUPS = ("domain", "method", "teacher", "logger", "recipe")
"""Keys that choose a config-group file (``domain=DMC`` reads ``config/domain/DMC.yaml``)."""

OPEN_MAPPINGS = ("env_kwargs",)
"""Keys holding the user's own keys: each is added with Hydra's ``+``."""


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        run_dir: the run folder (``config.yaml``, ``eval.csv``, ``reward.csv``,
            ``checkpoints/``, ...); :func:`load_run` reads it back.
        metrics: the last evaluation row (``eval.csv``: ``step``, ``episode_reward`` = mean
            true return, ``total_feedback``, ...); empty when the run never evaluated.
        eval_return: the final mean true return (NaN without an evaluation), what an
            optimising sweeper gets from the launcher.
    """

    run_dir: Path
    metrics: dict[str, Any] = field(default_factory=dict)
    eval_return: float = float("nan")


@dataclass
class LoadedRun:
    """A run folder read back by :func:`load_run`.

    Attributes:
        run_dir: the folder.
        config: its saved ``config.yaml`` (values only, as a plain dict).
        eval: ``eval.csv`` (one row per evaluation: step, mean true return, ...).
        train: ``train.csv`` (the console's training rows).
        rewards: ``reward.csv``, one row per feedback round (queries, labels, skipped,
            accuracies).
        reward_model: the learned reward ensemble in eval mode, or None (no
            ``checkpoints/reward_model.pt``: a run on the true reward).
        agent_state: the agent's ``state_dict`` from ``checkpoints/agent.pt`` (plain tensors),
            or None.
        agent_step: the environment step of ``agent_state``.
    """

    run_dir: Path
    config: dict[str, Any]
    eval: Any
    train: Any
    rewards: Any
    reward_model: Any = None
    agent_state: dict[str, Any] | None = None
    agent_step: int | None = None


def override_value(value: Any) -> str:
    """A Python value as Hydra's override grammar reads it (``True`` -> ``true``, ``None``
    -> ``null``, a list -> ``[a,b]``; a string with spaces or grammar characters quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    text = str(value)
    if isinstance(value, str) and (text == "" or any(c in text for c in " ,=[]{}()'\"\\:")):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def to_overrides(keys: dict[str, Any]) -> list[str]:
    """Keyword arguments as Hydra overrides: ``sac={"hidden_dim": 64}`` ->
    ``sac.hidden_dim=64``, ``env_kwargs={"continuous": False}`` ->
    ``+env_kwargs.continuous=false``; a key already dotted (``**{"sac.lr": 1e-4}``) as is."""
    out: list[str] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and prefix.split(".")[0] not in GROUPS:
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
            return
        plus = "+" if prefix.split(".")[0] in OPEN_MAPPINGS and "." in prefix else ""
        out.append(f"{plus}{prefix}={override_value(value)}")

    for key, value in keys.items():
        walk(key, value)
    return out


def default_run_dir(env: str) -> Path:
    """``runs/DATE/TIME_train_ENV`` under the working directory: the launcher's
    ``hydra.run.dir`` pattern."""
    now = time.localtime()
    name = f"{time.strftime('%H-%M-%S', now)}_train_{env.replace('/', '_')}"
    return Path("runs") / time.strftime("%Y-%m-%d", now) / name


def train(env: str | None = None, max_feedback: int | None = None, seed: int | None = None, *,
          run_dir: str | Path | None = None, overrides: list[str] | None = None,
          config_name: str = "train_themis", **keys: Any) -> TrainResult:
    """Train one Themis run in this process, as ``./themis_train.sh KEY=VALUE ...`` would.

    Args:
        env: the environment (``env=``); with ``domain=`` for the other suites.
        max_feedback: total queries (``max_feedback=``).
        seed: the run's seed.
        run_dir: the run folder (default ``runs/DATE/TIME_train_ENV``, the launcher's); a
            folder that holds a run already is refused, as by the launcher.
        overrides: more keys in the launcher's spelling (``["sac.hidden_dim=64"]``).
        config_name: ``train_themis`` (the launcher's config).
        keys: any other Themis key (``./themis_train.sh --help`` lists them): numbers, strings,
            booleans, nested groups as dicts.

    Returns:
        the run folder and its final metrics (:class:`TrainResult`).

    Raises:
        TrainConfigError: bad keys or values, with the launcher's one line (before anything
            is trained or written).
    """
    from themis.cli import train as cli
    from themis.run.config import resume_target
    from themis.run.threads import parse_threads

    given = {k: v for k, v in (("env", env), ("max_feedback", max_feedback), ("seed", seed))
             if v is not None}
    args = [*to_overrides({**given, **keys}), *(overrides or [])]
    before, cli.RAISE_INSTEAD.on = cli.RAISE_INSTEAD.on, True
    try:
        try:
            cfg = cli.check_overrides(args, config_name)
        except ConfigError as e:
            raise TrainConfigError(str(e)) from None
        if resume_target(cfg.get("resume")) is not None:
            raise TrainConfigError("resume= is a launcher key: continue a run with "
                                   "./themis_train.sh resume=RUN_DIR")
        out = Path(run_dir) if run_dir is not None else default_run_dir(str(cfg.env))
        found = cli.earlier_run(out)
        if found is not None:
            raise TrainConfigError(f"run dir {out} already holds a run ({found}); give this "
                                   "run another run_dir=")
        try:
            fixed = parse_threads(cfg.torch_threads)
        except ValueError as e:
            raise TrainConfigError(str(e)) from None
        out.mkdir(parents=True, exist_ok=True)
        try:  # torch_threads: the launcher's single run
            ws = cli.make_workspace(cfg, out, torch_threads="auto" if fixed is None else fixed)
        except ConfigError as e:
            cli.remove_if_unused(out)
            raise TrainConfigError(str(e)) from None
    finally:
        cli.RAISE_INSTEAD.on = before
    cli.write_config(ws, out)  # resolved, and marked yours (a later resume= trusts it)
    try:
        ws.run()
    except BaseException:
        ws.logger.close()
        if ws.tracking is not None:
            ws.tracking.close("FAILED")
        raise
    finish(ws)
    return TrainResult(out, _last_row(out / "eval.csv"), float(ws.last_eval_return))


def _last_row(path: Path) -> dict[str, Any]:
    import pandas as pd

    if not path.is_file() or path.stat().st_size == 0:
        return {}
    rows = pd.read_csv(path)
    return {} if rows.empty else {k: v.item() if hasattr(v, "item") else v
                                  for k, v in rows.iloc[-1].to_dict().items()}


def load_run(path: str | Path, device: str = "cpu") -> LoadedRun:
    """Read a run folder back (one written by :func:`train` or the launchers), without
    unpickling anything: a run folder may come from someone else.

    Args:
        path: the run folder.
        device: where the reward model goes.

    Returns:
        :class:`LoadedRun`: config, eval/train/reward rows (pandas DataFrames, empty when a
        file is missing), the reward model and the agent's weights (None when missing).

    Raises:
        FileNotFoundError: ``path`` is no run folder (no ``config.yaml``).
        ValueError: a checkpoint that is not plain tensors, or not Themis's.
    """
    import pandas as pd
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    from themis.core.safe_loading import (
        UnsafeFileError,
        check_finite_tensors,
        check_yaml_file,
        safe_load,
    )
    from themis.reward.ensemble import load_reward_model

    run = Path(path)
    if not (run / "config.yaml").is_file():
        raise FileNotFoundError(f"{run} is not a Themis run folder (no config.yaml)")
    check_yaml_file(run / "config.yaml")  # UnsafeFileError is a ValueError
    try:  # a tag (!!python/...) or broken YAML: the ValueError the docstring promises
        config = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"), resolve=False)
    except (YAMLError, OmegaConfBaseException, UnicodeDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{run / 'config.yaml'} is not a readable config ({first})") from None
    except (OSError, TypeError):  # OmegaConf's refusal of a lone scalar (`0`, `x`) at the top
        raise ValueError(f"{run / 'config.yaml'} is not a Themis config (no key: value "
                         "mapping)") from None
    if not isinstance(config, dict):
        raise ValueError(f"{run / 'config.yaml'} is not a Themis config (no key: value mapping)")

    def rows(name: str) -> pd.DataFrame:
        file = run / name
        return pd.read_csv(file) if file.is_file() and file.stat().st_size else pd.DataFrame()

    ckpt = run / "checkpoints"
    model = load_reward_model(ckpt / "reward_model.pt", device) if \
        (ckpt / "reward_model.pt").is_file() else None
    agent_state, agent_step = None, None
    if (ckpt / "agent.pt").is_file():
        try:
            saved = safe_load(ckpt / "agent.pt")
            check_finite_tensors(saved, ckpt / "agent.pt")  # NaN weights would play NaN
        except UnsafeFileError as e:
            raise ValueError(f"{ckpt / 'agent.pt'}: {e}") from None
        if not isinstance(saved, dict) or not isinstance(saved.get("agent"), dict):
            raise ValueError(f"{ckpt / 'agent.pt'} is not a Themis agent checkpoint")
        agent_state, agent_step = saved["agent"], saved.get("step")
    return LoadedRun(run, {str(k): v for k, v in config.items()}, rows("eval.csv"),
                     rows("train.csv"), rows("reward.csv"), model, agent_state, agent_step)
