"""MLflow behind :class:`themis.tracking.hub.TrackingHub` (``logger=mlflow``).

Without ``logger.tracking_uri`` (and ``MLFLOW_TRACKING_URI``) the run's own SQLite store,
``sqlite:///RUN_DIR/mlflow.db`` (:func:`default_store`); open it with ``mlflow ui
--backend-store-uri sqlite:///RUN_DIR/mlflow.db``.

Any tracking URI MLflow takes: a local store (``sqlite:///PATH``, or ``file:PATH``, which
MLflow 3 keeps in maintenance mode and refuses unless ``MLFLOW_ALLOW_FILE_STORE=true``: a
``file:`` URI given here sets that) or a server (``http://127.0.0.1:5000``). ``resume=``
reopens the same MLflow run (its id is in ``RUN_DIR/tracking.json``, with the URI it lives
at).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from themis.tracking.hub import RunFiles, RunInfo
from themis.tracking.settings import LoggerConfig

HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
"""MLflow retries a request to a server 7 times with growing waits (minutes): a server gone
mid-run is told after seconds instead. Set these variables to keep MLflow's own."""

PARAM_LENGTH = 6000
"""MLflow's longest parameter value."""


def flatten(node: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"sac": {"batch_size": 512}}`` -> ``{"sac.batch_size": "512"}`` (values as text,
    cut to :data:`PARAM_LENGTH`; an empty mapping is ``{}``)."""
    out: dict[str, str] = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:PARAM_LENGTH]
    return out


def default_store(run_dir: Path) -> str:
    """The store of a run without ``logger.tracking_uri`` and ``MLFLOW_TRACKING_URI``: an
    SQLite database in the run dir, ``sqlite:///RUN_DIR/mlflow.db`` (the store MLflow
    recommends; its file store is deprecated). One per run: parallel jobs of a sweep never
    write one database at once. ``mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db``
    opens it."""
    return f"sqlite:///{(Path(run_dir) / 'mlflow.db').resolve()}"


class MlflowTracker:
    """An MLflow run in the experiment ``logger.project``: parameters = the resolved config
    (flattened, ``sac.batch_size``), metrics = every CSV row at its step, tags = ``themis.*``,
    artifacts = learning curve, ``report/`` and ``clips/``.

    Args:
        settings: the run's ``logger.*`` keys (project, tracking_uri).
    """

    NAME = "mlflow"

    def __init__(self, settings: LoggerConfig) -> None:
        self.settings = settings
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        self.client: Any = None
        self.run_id = ""
        self.uri = ""

    def start(self, info: RunInfo, previous: dict[str, Any] | None) -> dict[str, Any]:
        import mlflow
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.uri = self.settings.tracking_uri or (
            mlflow.get_tracking_uri() if os.environ.get("MLFLOW_TRACKING_URI")
            else default_store(info.run_dir))
        if self.uri.startswith("file:"):  # asked for by name: MLflow 3 refuses it otherwise
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.uri)
        params = flatten(info.config)
        tags = dict(info.tags)
        known: dict[str, str] = {}
        if previous and previous.get("tracking_uri") == self.uri and previous.get("run_id"):
            run = self.client.get_run(previous["run_id"])
            self.run_id = run.info.run_id
            known = dict(run.data.params)
            self.client.update_run(self.run_id, status="RUNNING")
            changed = {k: v for k, v in params.items() if k in known and known[k] != v}
            tags.update({f"themis.resumed_with.{k}": v[:PARAM_LENGTH] for k, v in
                         changed.items()})  # MLflow parameters cannot change
        else:
            experiment = self.client.get_experiment_by_name(self.settings.project)
            experiment_id = experiment.experiment_id if experiment is not None else \
                self.client.create_experiment(self.settings.project)
            self.run_id = self.client.create_run(experiment_id, run_name=info.name).info.run_id
        new = [Param(k, v) for k, v in params.items() if k not in known]
        for i in range(0, max(len(new), 1), 100):  # MLflow takes 100 parameters per call
            self.client.log_batch(self.run_id, params=new[i:i + 100],
                                  tags=[RunTag(k, v) for k, v in tags.items()] if i == 0
                                  else [], synchronous=True)
        return {"run_id": self.run_id, "tracking_uri": self.uri}

    def log_metrics(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for step, row in rows for k, v in row.items()]
        for i in range(0, len(metrics), 1000):  # MLflow takes 1000 metrics per call
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000], synchronous=True)

    def log_files(self, files: RunFiles, step: int) -> None:
        if files.curve is not None:
            self.client.log_artifact(self.run_id, str(files.curve))
        if files.report is not None:
            self.client.log_artifacts(self.run_id, str(files.report), "report")
        for clip in files.clips:
            self.client.log_artifact(self.run_id, str(clip), "clips")

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)

    def describe(self) -> str:
        where = f"at {self.uri}" if not self.uri.startswith(("sqlite:", "file:")) else \
            f"at {self.uri} (open it with: mlflow ui --backend-store-uri {self.uri})"
        return f"MLflow run {self.run_id} in experiment {self.settings.project} {where}"
