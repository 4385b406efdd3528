"""The ``logger.*`` config keys: which sinks a run writes to and where the trackers are.

Kept free of heavy imports: :mod:`themis.run.config` reads it for the schema.
"""

from __future__ import annotations

from dataclasses import dataclass

TRACKERS = ("wandb", "mlflow")
"""Experiment trackers a run can report to (``logger=wandb``, ``logger=mlflow``, or both:
``logger=[wandb,mlflow]``)."""


@dataclass
class LoggerConfig:
    """Schema of ``logger.*``: set by the ``logger`` config group (``config/logger/``).

    CSV files are always written; ``logger=tensorboard`` adds TensorBoard event files,
    ``logger=wandb`` / ``logger=mlflow`` a tracked run (and TensorBoard) beside them.
    """

    tensorboard: bool = False
    """TensorBoard scalars in RUN_DIR/tensorboard (logger=tensorboard, wandb and mlflow)."""
    wandb: bool = False
    """A Weights & Biases run (logger=wandb); WANDB_MODE=offline writes it to RUN_DIR/wandb
    for a later ``wandb sync``."""
    mlflow: bool = False
    """An MLflow run (logger=mlflow) at logger.tracking_uri."""
    project: str = "themis"
    """W&B project and MLflow experiment name."""
    entity: str | None = None
    """W&B entity (team or user); null: the account's default."""
    tracking_uri: str | None = None
    """MLflow: sqlite:///PATH, http://HOST:PORT or file:PATH (deprecated by MLflow); null:
    MLFLOW_TRACKING_URI, else the run's own sqlite:///RUN_DIR/mlflow.db (open it with
    ``mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db``)."""
    clips: int = 3
    """Query clips (queries/, web/clips/) uploaded to the tracker at the end of the run."""
    report: bool = True
    """Write the run report (report/report.md, scripts/inspect_reward.py) at the end of a
    tracked run and upload it."""
    finish_timeout: int = 120
    """Seconds the end of the run waits for the tracker to take what is queued."""
