"""Experiment trackers (``logger=wandb``, ``logger=mlflow``): a run's config, CSV rows and
files, sent beside the CSV and TensorBoard files the run always writes.

    hub = start_tracking(cfg, cfg.logger, run_dir, env_id, title, warn)  # None: no tracker
    hub.log_row("eval", row)                                   # (the logger does this)
    hub.close("FINISHED", run_files(cfg.logger, run_dir, warn))
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from themis.core.run_keys import RunKeys
from themis.tracking.hub import STATE_FILE, RunFiles, RunInfo, Tracker, TrackingHub
from themis.tracking.settings import TRACKERS, LoggerConfig

__all__ = ["STATE_FILE", "TRACKERS", "LoggerConfig", "RunFiles", "RunInfo", "TrackingHub",
           "hydra_tags", "pick_clips", "run_files", "start_tracking"]


def hydra_tags() -> dict[str, str]:
    """The Hydra job's id and number and its sweep dir (``{}`` outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {}
    job: Any = HydraConfig.get().job  # a DictConfig at run time
    tags = {"themis.hydra_job_id": str(job.get("id") or job.name),
            "themis.hydra_job_num": str(job.get("num", 0))}
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        tags["themis.sweep_dir"] = str(Path(HydraConfig.get().sweep.dir).resolve())
    return tags


def start_tracking(cfg: RunKeys, settings: LoggerConfig, run_dir: Path, env_id: str, title: str,
                   warn: Callable[[str], None]) -> TrackingHub | None:
    """The trackers ``settings`` switches on, started (each on its own thread), or None.

    Args:
        cfg: the run's config, a :class:`themis.run.config.TrainConfig` (its ``resume`` key;
            the whole config becomes the tracked run's parameters).
        settings: its ``logger.*`` keys.
        run_dir: the run dir.
        env_id, title: tags (the env and the method · sampler · teacher line).
        warn: one console line (a tracker that fails says so once).
    """
    trackers: list[Tracker] = []
    if settings.wandb:
        from themis.tracking.wandb_backend import WandbTracker

        trackers.append(WandbTracker(settings))
    if settings.mlflow:
        from themis.tracking.mlflow_backend import MlflowTracker

        trackers.append(MlflowTracker(settings))
    if not trackers:
        return None
    run_dir = Path(run_dir).resolve()
    tags = {"themis.run_dir": str(run_dir), "themis.env": env_id, "themis.title": title,
            **hydra_tags()}
    info = RunInfo(run_dir=run_dir, config=dataclasses.asdict(cfg), name=run_dir.name,
                   tags=tags, group=tags.get("themis.sweep_dir"),
                   resume=cfg.resume is not None)
    return TrackingHub(trackers, info, warn, finish_timeout=settings.finish_timeout)


def pick_clips(run_dir: Path, count: int) -> list[Path]:
    """``count`` query clips of the run (``queries/query_*.mp4`` of synthetic teachers with
    explanations, ``web/clips/round*.mp4`` of people), spread from the first to the last."""
    clips = sorted((run_dir / "queries").glob("query_*.mp4")) + \
        sorted((run_dir / "web" / "clips").glob("round*.mp4"))
    if count <= 0 or not clips:
        return []
    if len(clips) <= count:
        return clips
    if count == 1:
        return [clips[-1]]
    return [clips[round(i * (len(clips) - 1) / (count - 1))] for i in range(count)]


def write_report(run_dir: Path, timeout: float = 600.0) -> Path:
    """Write the run report (``report/report.md``, :func:`themis.interpret.inspection.inspect_run`)
    in a child process (the inspection rebuilds a workspace of its own) and return its folder.

    Raises:
        RuntimeError: the child failed or ran past ``timeout`` seconds (its last line).
    """
    code = ("import sys; from themis.interpret.inspection import inspect_run; "
            "inspect_run(sys.argv[1])")
    root = Path(__file__).resolve().parents[2]
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True,
                              text=True, timeout=timeout, cwd=root)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"no report within {timeout:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["exit code " + str(proc.returncode)])[-1]
        raise RuntimeError(last)
    return run_dir / "report"


def run_files(settings: LoggerConfig, run_dir: Path, warn: Callable[[str], None]) -> RunFiles:
    """What a finished run uploads: its learning curve, the run report (written now when
    ``logger.report``; a report that fails costs a warning) and ``logger.clips`` clips."""
    curve = run_dir / "learning_curve.png"
    report = None
    if settings.report:
        try:
            report = write_report(run_dir)
        except RuntimeError as e:
            warn(f"tracking: the run report was not written ({e}); "
                 f"python scripts/inspect_reward.py {run_dir} tries again")
    return RunFiles(curve=curve if curve.is_file() else None, report=report,
                    clips=pick_clips(run_dir, settings.clips))
