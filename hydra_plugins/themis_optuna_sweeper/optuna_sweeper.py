"""A Hydra sweeper that searches hyper-parameters with Optuna (``hydra/sweeper=optuna``).

Written on Optuna's current API (``create_study``, ``ask``/``tell``) instead of Hydra's
``hydra-optuna-sweeper`` 1.3.0, which pins ``optuna<3``: Optuna 2.10 cannot open an SQLite
study with SQLAlchemy 2 (README: Hyperparameter search).

    ./themis_train.sh -m hydra/sweeper=optuna hydra.sweeper.n_trials=20 \\
        'reward_lr=tag(log, interval(1e-4, 3e-3))' 'segment=choice(25, 50)' env=Hopper-v5
    ./themis_train.sh -m hydra/sweeper=reward_search env=Hopper-v5    # config/hydra/sweeper/

Each trial is one job of the launcher (joblib, Ray, SLURM): ``n_jobs`` trials at a time, each
asked of the study with the best so far in mind; its value is what the task returns (Themis:
the final true eval return). The study lives in the sweep dir (``optuna.db``, SQLite), so the
same command with the same ``hydra.sweep.dir`` continues it up to ``n_trials``; the best trial
is written to ``optuna_best.yaml`` there.

A sweep folder may come from someone else: before any trial runs, the study's direction must be
the one asked for, its enqueued and stored trials must lie in the search space, and no job
folder may be a symlink (a run would land outside the sweep folder); each is refused with one
line and exit code 2 (:func:`check_study`, :func:`check_job_folders`).
"""
# No "from __future__ import annotations": Hydra loads plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations.

import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
    Transformer,
)
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

STUDY_FILE = "optuna.db"
"""The study's SQLite file in the sweep dir."""
BEST_FILE = "optuna_best.yaml"
"""The best trial so far, in the sweep dir (``scripts/summarize.py`` marks it)."""


@dataclass
class OptunaSweeperConf:
    """``hydra.sweeper.*`` of ``hydra/sweeper=optuna``."""

    _target_: str = "hydra_plugins.themis_optuna_sweeper.optuna_sweeper.ThemisOptunaSweeper"
    direction: str = "maximize"
    """maximize or minimize the task's return value."""
    n_trials: int = 20
    """Trials of the study in all (a continued study counts the ones it has)."""
    n_jobs: int = 2
    """Trials launched together (one batch of the launcher)."""
    sampler: str = "tpe"
    """tpe (Optuna's default) or random."""
    seed: int = 0
    """The sampler's seed."""
    study_name: str = "themis"
    """The study's name in its storage."""
    storage: str | None = None
    """An Optuna storage URL; null: sqlite:///SWEEP_DIR/optuna.db."""
    params: dict[str, str] = field(default_factory=dict)
    """The search space as overrides, e.g. ``reward_lr: tag(log, interval(1e-4, 3e-3))``,
    ``segment: choice(25, 50)``, ``reward_batch: range(10, 60, 10)`` (command-line sweeps are
    added; a plain value fixes the key for every trial)."""


ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf,
                             provider="themis")


def refuse(message: str) -> None:
    """End the sweep before any trial with one line on stderr and exit code 2 (Hydra reports
    an exception from a sweeper with its traceback)."""
    print(f"themis: error: {message}", file=sys.stderr)
    sys.exit(2)


def outside(params: dict[str, Any], space: dict[str, Any]) -> str | None:
    """The first of a trial's ``params`` that the search ``space`` does not hold (a key it does
    not search, or a value outside its distribution), as ``key=value``; None if all are in."""
    for key, value in params.items():
        dist = space.get(key)
        if dist is None:
            return f"{key}={value} (not searched)"
        try:
            inside = dist._contains(dist.to_internal_repr(value))
        except (ValueError, TypeError):
            inside = False
        if not inside:
            return f"{key}={value} (outside {dist})"
    return None


def check_study(study: Any, space: dict[str, Any], direction: str, where: str) -> None:
    """Refuse a stored study that would steer this sweep: another direction (a study saved as
    "minimize" continued by a maximising sweep), or a trial — enqueued (``WAITING``: it would
    run its fixed values) or finished (it steers the sampler) — with a parameter outside the
    search space (:func:`outside`), e.g. an enqueued ``reward_lr=1e6`` for ``interval(1e-4,
    3e-3)``, or a finished trial whose value is not a finite number (``+inf`` would be the
    best trial of every maximising search; a run's IQM is finite).

    Raises:
        SystemExit: code 2, after one line (:func:`refuse`).
    """
    from optuna.trial import TrialState

    stored = [d.name.lower() for d in study.directions]
    if stored != [direction]:
        refuse(f"{where}: the study {study.study_name!r} is stored to {'/'.join(stored)}, not "
               f"to {direction}: give hydra.sweeper.direction={'/'.join(stored)} to continue "
               "it, or another hydra.sweeper.study_name or hydra.sweep.dir")
    for trial in study.get_trials(deepcopy=False):
        if trial.state == TrialState.WAITING:
            params = dict(trial.system_attrs.get("fixed_params", {}))
            kind = "an enqueued"
        elif trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            params, kind = dict(trial.params), "a stored"
        else:
            continue
        values = list(trial.values or []) if trial.state == TrialState.COMPLETE else []
        if any(not math.isfinite(float(v)) for v in values):
            refuse(f"{where}: the stored trial #{trial.number} of study {study.study_name!r} "
                   f"has the value {values[0]}, which no run returns; start another "
                   "hydra.sweeper.study_name or hydra.sweep.dir")
        found = outside(params, space)
        if found is not None:
            refuse(f"{where}: {kind} trial #{trial.number} of study {study.study_name!r} has "
                   f"{found}, which this sweep does not search; continue it with its search "
                   "space, or start another hydra.sweeper.study_name or hydra.sweep.dir")


def check_job_folders(sweep_dir: Path) -> None:
    """Refuse a sweep folder holding a symlink where a job folder goes: the job's run (its
    config, checkpoints, labels) would be written wherever the link points.

    Raises:
        SystemExit: code 2, after one line (:func:`refuse`).
    """
    for entry in sorted(sweep_dir.iterdir()):
        if entry.is_symlink():
            refuse(f"{sweep_dir}: {entry.name} is a symlink (to {entry.readlink()}); a job "
                   "folder must be inside the sweep folder: remove the link or choose another "
                   "hydra.sweep.dir")


def distribution(override: Override) -> Any:
    """The Optuna distribution of a sweep override: ``choice`` -> categorical, ``range`` ->
    integer (or float) steps, ``interval`` -> float (integer when both ends are integers),
    log-uniform when tagged ``log``.

    Raises:
        ValueError: a sweep Optuna cannot search (e.g. ``glob``).
    """
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    value = override.value()
    if isinstance(value, ChoiceSweep):
        choices = [str(v) for v in override.sweep_iterator(transformer=Transformer.encode)]
        return CategoricalDistribution(choices)  # override text: "25", "'a b'", "[1,2]"
    if isinstance(value, RangeSweep):
        start, stop, step = value.start, value.stop, value.step
        assert start is not None and stop is not None
        last = start + (math.ceil((stop - start) / step) - 1) * step  # stop is left out
        if all(isinstance(v, int) for v in (start, stop, step)):
            return IntDistribution(int(start), int(last), step=int(step))
        return FloatDistribution(float(start), float(last), step=float(step))
    if isinstance(value, IntervalSweep):
        low, high = value.start, value.end
        assert low is not None and high is not None
        log_scale = "log" in value.tags
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log_scale)
        return FloatDistribution(float(low), float(high), log=log_scale)
    raise ValueError(f"{override.input_line}: Optuna searches choice(...), range(...) and "
                     "interval(...), tag(log, interval(...))")


class ThemisOptunaSweeper(Sweeper):
    """Hydra's Sweeper interface over an Optuna study (see the module docstring).

    Args: the fields of :class:`OptunaSweeperConf`.
    """

    def __init__(self, direction: str = "maximize", n_trials: int = 20, n_jobs: int = 2,
                 sampler: str = "tpe", seed: int = 0, study_name: str = "themis",
                 storage: str | None = None, params: Any = None) -> None:
        if direction not in ("maximize", "minimize"):
            raise ValueError(f"hydra.sweeper.direction={direction}: maximize or minimize")
        if sampler not in ("tpe", "random"):
            raise ValueError(f"hydra.sweeper.sampler={sampler}: tpe or random")
        self.direction, self.n_trials, self.n_jobs = direction, n_trials, max(1, n_jobs)
        self.sampler, self.seed, self.study_name = sampler, seed, study_name
        self.storage = storage
        self.params = {str(k): str(v) for k, v in (params or {}).items()}
        self.config: DictConfig | None = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def search_space(self, arguments: list[str]) -> tuple[list[str], dict[str, Any]]:
        """The fixed overrides of every trial and the distributions of the searched keys
        (``hydra.sweeper.params`` first, the command line on top)."""
        parser = OverridesParser.create()
        lines = [f"{k}={v}" for k, v in self.params.items()] + list(arguments)
        fixed: dict[str, str] = {}
        space: dict[str, Any] = {}
        for override in parser.parse_overrides(lines):
            key = override.get_key_element()
            space.pop(key, None)
            fixed.pop(key, None)
            if override.is_sweep_override():
                space[key] = distribution(override)
            else:
                fixed[key] = override.input_line or f"{key}={override.value()}"
        return list(fixed.values()), space

    def sweep(self, arguments: list[str]) -> Any:
        import optuna

        assert self.config is not None and self.launcher is not None
        try:
            fixed, space = self.search_space(arguments)
        except ValueError as e:
            refuse(str(e).splitlines()[0])
        if not space:
            refuse("hydra/sweeper=optuna: nothing to search; give a key a "
                   "choice(...), range(...) or interval(...)")
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        storage = self.storage or f"sqlite:///{(sweep_dir / STUDY_FILE).resolve()}"
        sampler = optuna.samplers.RandomSampler(seed=self.seed) if self.sampler == "random" \
            else optuna.samplers.TPESampler(seed=self.seed)
        try:
            study = optuna.create_study(study_name=self.study_name, storage=storage,
                                        sampler=sampler,
                                        direction="maximize" if self.direction == "maximize"
                                        else "minimize",
                                        load_if_exists=True)
        except Exception as e:  # SQLAlchemy / Optuna: not a study database
            text = str(e).strip().splitlines()
            refuse(f"{storage}: not an Optuna study ({text[0][:200] if text else type(e).__name__})"
                   "; choose another hydra.sweep.dir or hydra.sweeper.storage")
        check_study(study, space, self.direction, storage)  # a received sweep folder
        check_job_folders(sweep_dir)
        waiting = optuna.trial.TrialState.WAITING  # enqueued: run next, not done yet
        done = sum(t.state != waiting for t in study.get_trials(deepcopy=False))
        log.info(f"Optuna: study {self.study_name} in {storage} ({done} trials so far), "
                 f"{self.direction} over {', '.join(space)}")
        while done < self.n_trials:
            trials = [study.ask(space) for _ in range(min(self.n_jobs, self.n_trials - done))]
            jobs = [[*fixed, *(f"{k}={v}" for k, v in trial.params.items())] for trial in trials]
            returns = self.launcher.launch(jobs, initial_job_idx=done)
            for trial, ret in zip(trials, returns, strict=True):
                try:
                    value = float(ret.return_value)
                except Exception as e:  # the job failed: the trial did
                    log.warning(f"Optuna: trial {trial.number} failed ({e})")
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    continue
                if math.isfinite(value):
                    study.tell(trial, value)
                else:
                    log.warning(f"Optuna: trial {trial.number} returned {value}")
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
            done += len(trials)
            write_best(study, sweep_dir)
        best = study.best_trial if any(t.value is not None for t in study.trials) else None
        if best is not None:
            log.info(f"Optuna: best trial {best.number}: {best.value:g} with {best.params}")
        return best


def write_best(study: Any, sweep_dir: Path) -> None:
    """``optuna_best.yaml``: the best trial's number (= its job number and run dir name),
    value and parameters (nothing while no trial has a value)."""
    finished = [t for t in study.trials if t.value is not None]
    if not finished:
        return
    best = study.best_trial
    (sweep_dir / BEST_FILE).write_text(OmegaConf.to_yaml({
        "study": study.study_name, "direction": study.direction.name.lower(),
        "trial": best.number, "value": float(best.value),
        "params": {k: v for k, v in best.params.items()},
        "run_dir": str((sweep_dir / str(best.number)).resolve()),
        "trials": len(study.trials), "finished": len(finished)}))
