"""Send a run's rows and files to experiment trackers without ever holding up the run.

Each tracker gets a worker thread and a queue: the training loop only enqueues. A tracker that
fails (a server gone mid-run, no network for W&B online, a full disk) costs one warning line;
its worker then drops everything after, and the run goes on with its CSV and TensorBoard files.
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

STATE_FILE = "tracking.json"
"""In the run dir: each tracker's run id, so that ``resume=`` continues the same tracked run."""


@dataclass
class RunInfo:
    """What a tracker is told about the run when it starts.

    Args:
        run_dir: the run dir (a tag, and where W&B's offline files go).
        config: the resolved config, nested (parameters).
        name: the run's name in the tracker (the run dir's name).
        tags: ``themis.*`` tags: run dir, Hydra job id and number, env, title.
        group: the sweep dir of a multirun job (W&B group), else None.
        resume: the run continues from a checkpoint (``resume=``).
    """

    run_dir: Path
    config: dict[str, Any]
    name: str
    tags: dict[str, str] = field(default_factory=dict)
    group: str | None = None
    resume: bool = False


@dataclass
class RunFiles:
    """Files uploaded at the end of a run: the learning curve, the run report folder and a
    few query clips (each ``None`` / empty when the run has none)."""

    curve: Path | None = None
    report: Path | None = None
    clips: list[Path] = field(default_factory=list)


class Tracker(Protocol):
    """One experiment tracker behind :class:`TrackingHub` (its calls come from one thread)."""

    NAME: str

    def start(self, info: RunInfo, previous: dict[str, Any] | None) -> dict[str, Any]:
        """Open the tracked run (``previous``: what this returned before, on resume); return
        what resume needs (stored in ``tracking.json``)."""
        ...

    def log_metrics(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """``(step, {key: value})`` rows in order of logging."""
        ...

    def log_files(self, files: RunFiles, step: int) -> None: ...

    def finish(self, status: str) -> None:
        """``status``: FINISHED, KILLED or FAILED."""
        ...

    def describe(self) -> str:
        """A short line: where the tracked run is (an id, a URI, a folder to sync)."""
        ...


def metrics_of(stream: str, row: Mapping[str, Any]) -> tuple[int, dict[str, float]] | None:
    """A CSV row as tracker metrics: ``(row["step"], {"<stream>/<column>": value})`` for its
    finite numbers (text columns such as ``phase`` and NaN before a first update are left out);
    ``None`` for a row without a step."""
    if "step" not in row:
        return None
    metrics = {}
    for key, value in row.items():
        if hasattr(value, "item"):
            value = value.item()
        if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            metrics[f"{stream}/{key}"] = float(value)
    return int(row["step"]), metrics


def read_state(run_dir: Path) -> dict[str, Any]:
    """``tracking.json`` of a run dir as ``{tracker: {key: str}}``; a missing or malformed file
    (a received run folder is not trusted) reads as ``{}``, its strange entries are dropped."""
    path = run_dir / STATE_FILE
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {name: {k: v for k, v in entry.items() if isinstance(k, str) and isinstance(v, str)}
            for name, entry in raw.items() if isinstance(name, str) and isinstance(entry, dict)}


_state_lock = threading.Lock()


def write_state(run_dir: Path, name: str, entry: dict[str, Any]) -> None:
    """Set ``tracking.json[name] = entry`` (atomically: a crash leaves the old file)."""
    with _state_lock:
        state = read_state(run_dir)
        state[name] = {k: str(v) for k, v in entry.items()}
        tmp = run_dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, run_dir / STATE_FILE)


class _Worker:
    """One tracker's thread: starts the tracked run, then takes operations from its queue."""

    def __init__(self, tracker: Tracker, info: RunInfo, warn: Callable[[str], None]) -> None:
        self.tracker, self.info, self.warn = tracker, info, warn
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.failed = False
        self.last_step = 0
        self.thread = threading.Thread(target=self._loop, name=f"themis-{tracker.NAME}",
                                       daemon=True)
        self.thread.start()

    def put(self, op: str, payload: Any = None) -> None:
        if not self.failed or op == "finish":  # a failed worker still has to end its loop
            self.queue.put((op, payload))

    def _fail(self, error: BaseException) -> None:
        self.failed = True
        text = str(error).strip().splitlines()
        what = f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__
        self.warn(f"tracking: {self.tracker.NAME} failed ({what}); the run goes on without it "
                  f"(CSV{', TensorBoard' if (self.info.run_dir / 'tensorboard').is_dir() else ''}"
                  f" files keep every row in {self.info.run_dir})")

    def _loop(self) -> None:
        try:
            previous = read_state(self.info.run_dir).get(self.tracker.NAME) \
                if self.info.resume else None
            entry = self.tracker.start(self.info, previous)
            write_state(self.info.run_dir, self.tracker.NAME, entry)
            self.warn(f"tracking: {self.tracker.describe()}")
        except Exception as e:  # no tracker may stop the run
            self._fail(e)
        pending: tuple[str, Any] | None = None
        while True:
            op, payload = pending if pending is not None else self.queue.get()
            pending = None
            if self.failed:
                if op == "finish":
                    return
                continue
            try:
                if op == "metrics":
                    rows = [payload]
                    while len(rows) < 1000:  # one batch of what has piled up
                        try:
                            nxt = self.queue.get_nowait()
                        except queue.Empty:
                            break
                        if nxt[0] != "metrics":
                            pending = nxt  # next, in its place
                            break
                        rows.append(nxt[1])
                    self.tracker.log_metrics(rows)
                elif op == "finish":
                    files, status = payload
                    if files is not None:
                        self.tracker.log_files(files, self.last_step)
                    self.tracker.finish(status)
                    return
            except Exception as e:
                self._fail(e)
                if op == "finish":
                    return


class TrackingHub:
    """The run's trackers, fed from the logger and closed by the workspace.

    Args:
        trackers: started now, each on its own thread.
        info: what they are told about the run.
        warn: prints one console line (the logger's ``info`` in yellow).
        finish_timeout: seconds :meth:`close` waits for each tracker.
    """

    def __init__(self, trackers: list[Tracker], info: RunInfo,
                 warn: Callable[[str], None], finish_timeout: float = 120.0) -> None:
        self.info, self.warn, self.finish_timeout = info, warn, finish_timeout
        self.workers = [_Worker(t, info, warn) for t in trackers]
        self.closed = False

    @property
    def active(self) -> bool:
        """Whether a tracker is still taking rows (not all have failed)."""
        return any(not w.failed for w in self.workers)

    def log_row(self, stream: str, row: Mapping[str, Any]) -> None:
        """Queue one ``train``/``eval``/``reward`` CSV row (see :func:`metrics_of`)."""
        item = metrics_of(stream, row)
        if item is None or not item[1]:
            return
        for worker in self.workers:
            worker.last_step = max(worker.last_step, item[0])
            worker.put("metrics", item)

    def close(self, status: str = "FINISHED", files: RunFiles | None = None) -> None:
        """Upload ``files``, end the tracked runs with ``status`` and wait for the workers (at
        most ``finish_timeout`` s in all: a tracker still busy then is left behind with a
        warning). Idempotent."""
        if self.closed:
            return
        self.closed = True
        for worker in self.workers:
            worker.put("finish", (files, status))
        deadline = time.monotonic() + self.finish_timeout
        for worker in self.workers:
            worker.thread.join(max(0.0, deadline - time.monotonic()))
            if worker.thread.is_alive():
                self.warn(f"tracking: {worker.tracker.NAME} did not finish within "
                          f"{self.finish_timeout:.0f} s (logger.finish_timeout); what it had "
                          "not sent is in the run dir's CSV files")
