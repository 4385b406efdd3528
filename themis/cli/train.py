"""Hydra entry point of ``./themis_train.sh``: PEBBLE (or SAC on the true reward) end to end.

    python -m themis.cli.train env=HalfCheetah-v5 max_feedback=1000
    python -m themis.cli.train pretrained_snapshot=runs/.../snapshot.pt
"""

from __future__ import annotations

import difflib
import errno
import gc
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from themis.builder import earlier_run, make_workspace
from themis.cli.key_check import save_env_lists
from themis.core.choices import unknown_choice
from themis.core.foreign_keys import foreign_key
from themis.environments.domains import LISTED
from themis.online.learner_client import PreferenceLearnerError
from themis.run.closing import finish, stop
from themis.run.config import (
    CONFIG_DIR,
    TrainConfig,
    register_configs,
    removed_key,
    resume_target,
    schema_keys,
)
from themis.run.hints import (
    composition_hint,
    flag_hint,
    help_command,
    resume_problem,
    unknown_flag,
)
from themis.run.received_config import mark_config
from themis.run.resolve import config_yaml
from themis.run.threads import available_cores, parse_threads
from themis.run.workspace import Workspace
from themis.utils import ConfigError

register_configs()


class RaiseInstead:
    """Whether :func:`fail` raises :class:`themis.utils.ConfigError` with the line instead of
    ending the program (the Python API, :func:`themis.cli.api.train`, sets :attr:`on` while it
    validates). A plain object, not a context variable: a sweep's launcher pickles this
    module's functions with their globals (cloudpickle), and a ``ContextVar`` cannot be
    pickled."""

    on = False


RAISE_INSTEAD = RaiseInstead()


def fail(message: str) -> None:
    """End the program before any training: one line on stderr, exit code 2 (in the Python API,
    :data:`RAISE_INSTEAD`: raise :class:`ConfigError` with the line).

    ``THEMIS_DEBUG=1`` also prints the traceback of the exception being handled, if any.
    """
    if RAISE_INSTEAD.on:
        raise ConfigError(message) from None
    if os.environ.get("THEMIS_DEBUG", "") not in ("", "0") and sys.exc_info()[0] is not None:
        traceback.print_exc()
    print(f"themis: error: {message}", file=sys.stderr)
    sys.exit(2)


def describe_composition_error(error: Exception, config_name: str = "train_themis") -> str:
    """One line for a Hydra composition error: a key typo (with the closest key), a wrong type,
    an unknown config-group option (domain, teacher), or Hydra's own first line."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError


    text, cause = str(error), error.__cause__
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and "not in" in str(cause):
        key = getattr(cause, "full_key", None) or str(cause).split("'")[1]
        if (removed := removed_key(key) or foreign_key(key)) is not None:
            return removed
        close = difflib.get_close_matches(key, schema_keys(),
                                          n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"{key} is not a Themis config key{hint}; {help_command(config_name)} lists them"
    if isinstance(cause, ValidationError):
        key = getattr(cause, "full_key", "") or "a value"
        return f"{key}: {str(cause).splitlines()[0]}"
    if "Could not find '" in text:
        group, option = text.split("Could not find '")[1].split("'")[0].split("/", 1)
        if group == "domain":
            from themis.environments.domains import get_domain

            try:
                get_domain(option)
            except ConfigError as e:
                return str(e)
        listing = text.split("Available options in")[-1].split("Config search path")[0]
        options = [line.strip() for line in listing.splitlines()[1:] if line.strip()]
        return unknown_choice(group, option, options)
    if "Could not load '" in text:  # an option inside a list: logger=[wandb,neptune]
        group, option = text.split("Could not load '")[1].split("'")[0].split("/", 1)
        options = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
        if options:
            return unknown_choice(group, option, options)
    first = text.splitlines()[0]
    if first.startswith(("no viable alternative", "mismatched input", "extraneous input",
                         "token recognition error", "missing ")):  # Hydra's parser
        return (f"{first}: an override Hydra cannot read; close every bracket and quote (a "
                "list: key=[a,b]; a value with spaces: key='a b')")
    if first.startswith("Ambiguous value"):
        return f"{first}: add -m to sweep over the values, or write a list as key=[a,b]"
    return first


def repeated_key(overrides: list[str]) -> str | None:
    """The one line that says a key was given twice with different values (Hydra keeps the
    last one silently), naming both, or ``None``."""
    seen: dict[str, str] = {}
    for arg in overrides:
        if "=" not in arg or arg.startswith("~"):
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+")
        if key in seen and seen[key] != value:
            return (f"{key} is given twice ({key}={seen[key]}, then {key}={value}); the last "
                    f"one, {key}={value}, is used")
        seen[key] = value
    return None


def preflight(config_name: str, argv: list[str]) -> None:
    """Check the command line before Hydra starts the job, so that bad input ends with one line
    and exit code 2 instead of a Hydra report: compose the config as Hydra will, build the typed
    config, and check that the run dir is writable. Sweeps (``-m``) and flags (``--help``, ...)
    are left to Hydra.
    """
    if any(a in ("--help", "-h") for a in argv):  # the keys with their descriptions
        from themis.run.config import compose
        from themis.run.config_help import help_text

        print(help_text(compose([a for a in argv if "=" in a], config_name)))
        sys.exit(0)
    flags = {a for a in argv if a.startswith("-")}
    overrides = [a for a in argv if not a.startswith(("-", "hydra.", "hydra/", "+hydra",
                                                      "~hydra"))]
    if (repeated := repeated_key(overrides)) is not None:  # a note, with the run's console:
        print(f"themis: warning: {repeated}", flush=True)  # stderr stays for what ends a run
    if flags - {"-m", "--multirun"} and (hint := flag_hint(argv, schema_keys())
                                         or unknown_flag(argv)):
        fail(hint)  # --num_train_steps 1000: a key written as a flag; --hlep
    if flags and flags <= {"-m", "--multirun"}:  # a sweep: every job's overrides, checked
        for job in sweep_variants(overrides):
            check_overrides(job, config_name)
        return
    if flags:  # other Hydra flags (--cfg, --info, ...): Hydra's own
        return
    cfg = check_overrides(overrides, config_name)
    resume = resume_target(cfg.get("resume"))
    if resume not in (None, "here") and not (Path(str(resume)) / "config.yaml").is_file():
        fail(f"resume={resume}: no Themis run there (config.yaml missing); point resume= at "
             "the run dir of the run to continue")
    if resume not in (None, "here") and (problem := resume_problem(Path(str(resume)), overrides)):
        fail(problem)  # a pretraining run, or one that had finished
    run_dir_value = next((a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")),
                         None)
    target = Path(run_dir_value) if run_dir_value else Path.cwd()
    # what this run creates (a refused run removes only that): the run dir and its missing
    # parents, or the default's day folder runs/DATE (hydra.run.dir in train_themis.yaml)
    CREATED_DIRS.update(missing_dirs(target if run_dir_value else
                                     Path("runs", time.strftime("%Y-%m-%d"))))
    if run_dir_value and target.is_dir():
        USER_DIRS.add(Path(os.path.abspath(target)))
    try:  # Hydra creates the run dir next anyway
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as e:
        fail(f"run dir {target} cannot be created or written ({e.strerror}); choose another "
             "with hydra.run.dir=PATH")


def check_overrides(overrides: list[str], config_name: str) -> DictConfig:
    """Compose ``overrides`` as Hydra will and build the typed config; bad input ends the
    program with one line (:func:`fail`). Returns the composed config. The schema's keys
    are saved for the launchers' quick check first (:mod:`themis.cli.key_check`)."""
    from themis.cli.key_check import save_index
    from themis.run.config import compose
    from themis.run.key_index import key_index

    save_index(key_index)  # built once per code version, not per sweep job

    try:
        cfg = compose(overrides, config_name)
        OmegaConf.to_object(cfg)
    except Exception as e:  # Hydra and OmegaConf raise many types; all are bad input here
        fail(composition_hint(e, overrides) or describe_composition_error(e, config_name))
    known = set(OmegaConf.structured(TrainConfig).keys())
    for name in map(str, cfg):
        if name not in known:
            if (removed := removed_key(name) or foreign_key(name)) is not None:
                fail(removed)
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            fail(f"{name} is not a Themis config key{hint}; {help_command(config_name)} "
                 "lists them")
    return cfg


SWEEP_CHECKS = 32
"""At most this many jobs of a sweep are composed before it starts (each value once)."""


def sweep_variants(overrides: list[str]) -> list[list[str]]:
    """Override lists that together try every value of a sweep (``seed=0,1,2``,
    ``range(...)``, ``choice(...)``) once: the first value of each swept key, then each other
    value with the rest at their first (at most :data:`SWEEP_CHECKS` lists). A sweep Hydra
    cannot list (an interval for an optimising sweeper) is left to Hydra, as is a line Hydra
    cannot parse (:func:`fail` with its first line)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:  # Hydra's parser errors: bad input
        fail(str(e).splitlines()[0])
    values: list[list[str]] = []
    for override in parsed:
        key = override.get_key_element()
        if not override.is_sweep_override():
            values.append([f"{key}={override.get_value_element_as_str()}"])
            continue
        try:
            values.append([f"{key}={v}" for v in override.sweep_string_iterator()] or
                          [f"{key}="])
        except Exception:  # e.g. interval(0, 1): no values to list
            return []
    first = [v[0] for v in values]
    jobs = [first]
    for i, options in enumerate(values):
        jobs += [[*first[:i], option, *first[i + 1:]] for option in options[1:]]
    return jobs[:SWEEP_CHECKS]


def run_dir() -> Path:
    """The Hydra run dir of this job (``hydra.run.dir`` or the sweep's job dir)."""
    return Path(HydraConfig.get().runtime.output_dir)


def threads_per_job(cfg: DictConfig) -> int | str:
    """``torch_threads`` for this job: as given, or a share of the cores in a joblib sweep.

    ``-m`` sweeps run ``hydra.launcher.n_jobs`` jobs side by side on this machine (-1, the
    default = one per core, joblib's convention); with ``torch_threads`` ``auto`` or ``0`` each
    job then gets ``cores // n_jobs`` threads (at least 1) so parallel jobs do not oversubscribe
    the CPU, and more jobs than cores, asked for on purpose, get one warning line (job 0's);
    with the Ray launcher (``hydra/launcher=ray``) each job gets the ``num_cpus`` Ray reserved.
    Single runs and SLURM jobs keep the key (``auto``: :func:`themis.run.threads.auto_threads`).
    """
    try:
        fixed = parse_threads(cfg.torch_threads)
    except ValueError as e:
        fail(str(e))
    if fixed is not None and fixed > 0:
        return fixed
    hydra_cfg = HydraConfig.get()
    target = str(hydra_cfg.launcher.get("_target_", ""))
    if hydra_cfg.mode == RunMode.MULTIRUN and target.endswith("ThemisRayLauncher"):
        return max(1, int(hydra_cfg.launcher.get("num_cpus", 1)))  # the CPUs Ray reserved
    if hydra_cfg.mode != RunMode.MULTIRUN or "joblib" not in target:
        return "auto" if fixed is None else fixed
    cores = available_cores()
    n_jobs = int(hydra_cfg.launcher.get("n_jobs", -1))
    n_jobs = n_jobs if n_jobs > 0 else max(1, cores + 1 + n_jobs)
    if n_jobs > cores and getattr(hydra_cfg.job, "num", 0) == 0:
        print(f"themis: warning: hydra.launcher.n_jobs={n_jobs} runs up to {n_jobs} CPU runs at "
              f"once on {cores} cores, each slower than alone (the default, -1: one per core)",
              file=sys.stderr)
    return max(1, cores // n_jobs)


def resumed_config(cfg: DictConfig, out: Path) -> tuple[Path, DictConfig]:
    """The run dir and config of a resumed run: the run's saved ``config.yaml`` with this
    command line's overrides (other than ``resume`` and ``hydra.*``) on top. A saved config
    that calls resolvers (``${oc.env:...}``) or does not fit the schema ends the program with
    one line (:func:`themis.run.received_config.load_received_config`)."""
    from themis.run.received_config import (
        check_named_code,
        check_received_settings,
        load_received_config,
    )

    target = resume_target(cfg.resume)
    if target not in (None, "here"):
        out = Path(str(target))
    saved = out / "config.yaml"
    if not saved.is_file():
        fail(f"resume={cfg.resume}: {saved} not found; point resume= at a Themis run dir")
    keys: list[str] = []  # config keys this command line sets, group choices expanded
    for override in HydraConfig.get().overrides.task:
        key, _, choice = override.lstrip("+").partition("=")
        if override.startswith(("resume=", "hydra", "+hydra", "~")):
            continue
        group_file = CONFIG_DIR / key / f"{choice}.yaml"
        if "." not in key and group_file.is_file():  # e.g. teacher=oracle, method=NAME
            # a group file's Hydra defaults list (a method's per-domain settings) is
            # no config key; those settings are in the saved config already
            keys += [str(k) for k in OmegaConf.load(group_file) if k != "defaults"]
        else:
            keys.append(key)
    on_top = OmegaConf.create()
    for key in keys:
        OmegaConf.update(on_top, key, OmegaConf.select(cfg, key), force_add=True)
    try:  # a received run folder: values only, no ${oc.env:...} (it would be written back),
        received = load_received_config(saved)  # and no code of its own to import
        check_named_code(received, saved, given=keys)
        check_received_settings(received, saved, given=keys)  # no address, path or tracker
    except ConfigError as e:
        fail(f"resume: {e}")
    merged = OmegaConf.merge(received, on_top)
    merged.resume = "true"
    assert isinstance(merged, DictConfig)
    return out, merged


CREATED_DIRS: set[Path] = set()
"""Folders that did not exist before this process (:func:`preflight` records them; absolute)."""
USER_DIRS: set[Path] = set()
"""A ``hydra.run.dir`` that existed before this process (the user's folder; absolute)."""


def missing_dirs(path: Path) -> set[Path]:
    """``path`` and those of its parents that do not exist yet (absolute)."""
    path = Path(os.path.abspath(path))
    return {p for p in (path, *path.parents) if not p.exists()}


def remove_if_unused(run: Path) -> None:
    """Delete what Hydra wrote before the job was rejected — only what this run created: the
    run dir when it holds nothing else (a folder the user made beforehand, :data:`USER_DIRS`,
    stays, emptied of Hydra's files), and its parent (runs/DATE/) only when this run created
    it (:data:`CREATED_DIRS`) and it is empty now."""
    import shutil

    hydra_files = {".hydra", "train.log", "pretrain.log"}
    if not (run.is_dir() and {p.name for p in run.iterdir()} <= hydra_files):
        return
    if Path(os.path.abspath(run)) not in USER_DIRS:
        shutil.rmtree(run, ignore_errors=True)
    else:  # the user's folder: keep it, without what Hydra put there
        for name in hydra_files:
            path = run / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else \
                path.unlink(missing_ok=True)
    for parent in Path(os.path.abspath(run)).parents:  # runs/DATE/ too, if this run made it
        if parent not in CREATED_DIRS:
            break
        try:
            parent.rmdir()
        except OSError:  # not empty: another run's
            break


def build_workspace(cfg: DictConfig) -> Workspace:
    """Create the Workspace; a bad config ends the program with one line and exit code 2,
    and so does a new run in a run dir where a run was started (its rows would be appended
    to the other run's CSVs, and its labels are not ours to overwrite)."""
    out = run_dir()
    if resume_target(cfg.resume) is not None:
        out, cfg = resumed_config(cfg, out)
    elif (found := earlier_run(out)) is not None:
        fail(f"run dir {out} already holds a run ({found}); continue it with resume={out}, "
             "or give this run another hydra.run.dir")
    try:
        ws = make_workspace(cfg, out, torch_threads=threads_per_job(cfg))
    except ConfigError as e:
        if resume_target(cfg.resume) is None:
            remove_if_unused(out)
        fail(str(e))
    finally:  # the env names listed, for the launchers' quick check of env= (key_check.py)
        save_env_lists(LISTED)
    write_config(ws, out)
    return ws


def write_config(ws: Workspace, out: Path) -> None:
    """The run's resolved ``config.yaml`` (what the run uses) and this user's mark of it: a
    later ``resume=`` of the run trusts its addresses, paths and trackers
    (:func:`themis.run.received_config.mark_config`). For the launchers and :func:`themis.train`
    alike."""
    (out / "config.yaml").write_text(config_yaml(ws.cfg))
    mark_config(out)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a cluster's pre-emption, ``kill``): stopped as Ctrl-C stops a run."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated


def run_or_stop(ws: Workspace, launcher: str, until: int | None = None) -> None:
    """``ws.run(until)``; Ctrl-C ends the program with one line on stderr (the step reached,
    the last checkpoint, the ``resume=`` command) and exit code 130, not a traceback (SIGTERM
    the same, exit code 143: the last checkpoint is at most ``checkpoint_minutes`` old); a
    :class:`ConfigError` found when the run starts (a labeling port taken) with :func:`fail`;
    a failed background learner (``reward_training=async``) or a full disk with one line and
    exit code 1."""
    try:
        ws.run(until)
    except ConfigError as e:
        ws.logger.close()
        if ws.tracking is not None:
            ws.tracking.close("FAILED")
        fail(str(e))
    except KeyboardInterrupt as e:
        print(f"themis: {stop(ws, launcher)}", file=sys.stderr)
        sys.exit(143 if isinstance(e, Terminated) else 130)
    except PreferenceLearnerError as e:  # reward_training=async: its learner process failed
        print(f"themis: error: {e}; {stop(ws, launcher)}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # a full disk: checkpoints and labels are written atomically, so the last checkpoint
        # and every saved label are whole; one line, not a traceback
        try:
            where = stop(ws, launcher)
        except OSError:  # closing the logs writes too
            where = f"stopped at step {ws.step}; continue with {launcher} resume={ws.run_dir}"
        print(f"themis: error: the disk is full ({e.filename or 'writing the run'}): {where}; "
              "free some space first", file=sys.stderr)
        sys.exit(1)


def main_or_stop(main: Any) -> None:
    """Run a Hydra main; Ctrl-C before the run starts ends with one line and exit code 130.

    When it returns or exits, the objects alive are frozen out of the garbage collector
    (:func:`gc.freeze`): the interpreter's last collections at exit would walk the few hundred
    thousand objects of PyTorch and ``torch._dynamo`` for about a second of CPU, and the
    memory goes back to the system with the process anyway. Everything a run writes is closed
    (and its labels synced) before this; ``atexit`` handlers and ``weakref.finalize`` clean-ups
    still run."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)
    try:
        main()
    except KeyboardInterrupt as e:
        print("themis: stopped before training started", file=sys.stderr)
        sys.exit(143 if isinstance(e, Terminated) else 130)
    finally:
        gc.freeze()


@hydra.main(version_base="1.3", config_path="../../config", config_name="train_themis")
def main(cfg: DictConfig) -> float:
    """One training run; returns its final true eval return (NaN without an evaluation): the
    value an optimising sweeper (``hydra/sweeper=optuna``) gets for the job."""
    ws = build_workspace(cfg)
    run_or_stop(ws, "./themis_train.sh")
    finish(ws)
    return ws.last_eval_return


if __name__ == "__main__":
    preflight("train_themis", sys.argv[1:])
    main_or_stop(main)
