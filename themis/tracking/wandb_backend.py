"""Weights & Biases behind :class:`themis.tracking.hub.TrackingHub` (``logger=wandb``).

The run's files go to ``RUN_DIR/wandb/``; with ``WANDB_MODE=offline`` nothing leaves the
machine and ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads it later. ``resume=`` reopens the
same W&B run (its id is in ``RUN_DIR/tracking.json``).
"""

from __future__ import annotations

from typing import Any

from themis.tracking.hub import RunFiles, RunInfo
from themis.tracking.settings import LoggerConfig

TAG_LENGTH = 64
"""W&B's longest tag."""


class WandbTracker:
    """A W&B run: config = the resolved config, rows logged at their environment step, the
    learning curve as an image, clips as videos, curve and report as a ``run-report``
    artifact.

    Args:
        settings: the run's ``logger.*`` keys (project, entity).
    """

    NAME = "wandb"

    def __init__(self, settings: LoggerConfig) -> None:
        self.settings = settings
        self.run: Any = None

    def start(self, info: RunInfo, previous: dict[str, Any] | None) -> dict[str, Any]:
        import wandb

        run_id = (previous or {}).get("run_id")
        tags = [t[:TAG_LENGTH] for t in (f"job:{info.tags.get('themis.hydra_job_id', '-')}",
                                         info.tags.get("themis.env", ""), info.name) if t]
        self.run = wandb.init(
            project=self.settings.project, entity=self.settings.entity, dir=str(info.run_dir),
            config=info.config, name=info.name, group=info.group, tags=tags,
            notes=str(info.run_dir), id=run_id, resume="allow" if run_id else None,
            reinit="create_new", settings=wandb.Settings(console="off", silent=True))
        self.run.config.update({"themis": info.tags}, allow_val_change=True)
        self.first_step = int(self.run.step) if run_id else 0
        return {"run_id": self.run.id, "project": self.run.project or self.settings.project}

    def log_metrics(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        for step, metrics in rows:
            if step >= self.first_step:  # a resumed online run keeps its rows up to here
                self.run.log(metrics, step=step)

    def log_files(self, files: RunFiles, step: int) -> None:
        import wandb

        step = max(step, self.first_step)
        media: dict[str, Any] = {}
        if files.curve is not None:
            media["learning_curve"] = wandb.Image(str(files.curve))
        for clip in files.clips:
            media[f"clips/{clip.stem}"] = wandb.Video(
                str(clip), format="gif" if clip.suffix == ".gif" else "mp4")
        if media:
            self.run.log(media, step=step)
        if files.curve is not None or files.report is not None:
            artifact = wandb.Artifact(f"report-{self.run.id}", type="run-report")
            if files.curve is not None:
                artifact.add_file(str(files.curve))
            if files.report is not None:
                artifact.add_dir(str(files.report), name="report")
            self.run.log_artifact(artifact)

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)

    def describe(self) -> str:
        if self.run.settings.mode == "offline" or self.run.offline:
            return (f"W&B run {self.run.id} offline in {self.run.dir.rsplit('/files', 1)[0]} "
                    "(upload later with wandb sync on that folder)")
        return f"W&B run {self.run.url}"
