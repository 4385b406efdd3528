"""Run logging: console lines, CSV files a person can open, and a learning-curve plot."""

from __future__ import annotations

import csv
import math
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from termcolor import colored
from tqdm import tqdm

from themis.core.figures import pyplot, save_figure


class CSVLog:
    """Append rows to a CSV file; the columns are fixed by the first row.

    Args:
        path: the file (created with a header; appended to if it exists with one).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fieldnames: list[str] | None = None
        self._file: TextIO | None = None
        if path.exists() and path.stat().st_size > 0:
            with path.open() as f:
                self._fieldnames = next(csv.reader(f))

    def write(self, row: Mapping[str, Any]) -> None:
        if self._file is None:
            new = self._fieldnames is None
            if new:
                self._fieldnames = list(row)
            self._file = self.path.open("a", newline="")
            self._writer = csv.DictWriter(self._file, fieldnames=self._fieldnames or list(row),
                                          extrasaction="ignore")
            if new:
                self._writer.writeheader()
        self._writer.writerow({k: _plain(v) for k, v in row.items()})
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _plain(value: Any) -> Any:
    """Convert tensors and NumPy scalars to plain Python numbers for CSV: floats to six
    decimals, or to six significant digits below 1e-4 in magnitude, which six decimals would
    write as 0 (an L2 coefficient of 1e-5 / 1.5^20 is 3e-9)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.6g}") if 0 < abs(value) < 1e-4 else round(value, 6)
    return value


LOGGER_BACKENDS = ("csv", "tensorboard")
"""File backends of :class:`Logger` (``logger.tensorboard``). CSV files are always written;
trackers (W&B, MLflow) come as a :class:`themis.tracking.TrackingHub`."""


class MetricLog:
    """One stream of rows (``train``, ``eval`` or ``reward``): a CSV file and, optionally,
    TensorBoard scalars ``<name>/<column>`` at global step ``row["step"]``.

    Args:
        name: the stream name (CSV file stem and TensorBoard tag prefix).
        run_dir: where ``<name>.csv`` goes.
        tensorboard: a ``torch.utils.tensorboard.SummaryWriter`` or None.
        tracker: a :class:`themis.tracking.TrackingHub` (W&B, MLflow) or None: every row is
            queued for it as metrics ``<name>/<column>`` at step ``row["step"]``.
    """

    def __init__(self, name: str, run_dir: Path, tensorboard: Any = None,
                 tracker: Any = None) -> None:
        self.name = name
        self.csv = CSVLog(run_dir / f"{name}.csv")
        self.tensorboard = tensorboard
        self.tracker = tracker

    def write(self, row: Mapping[str, Any]) -> None:
        self.csv.write(row)
        if self.tracker is not None:
            self.tracker.log_row(self.name, row)
        if self.tensorboard is not None and "step" in row:
            step = int(row["step"])
            for key, value in row.items():
                value = _plain(value)
                if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                    self.tensorboard.add_scalar(f"{self.name}/{key}", value, step)

    def close(self) -> None:
        self.csv.close()


class Logger:
    """Owns ``train.csv``, ``eval.csv`` and ``reward.csv`` in the run dir; prints console lines.

    Agents never see the logger: the Workspace hands it metric dicts.

    Args:
        run_dir: the run dir.
        stream: console stream (default: ``sys.stdout`` when the logger is made).
        backends: subset of :data:`LOGGER_BACKENDS`; ``"tensorboard"`` adds event files in
            ``run_dir/tensorboard`` (``tensorboard --logdir runs/``).
        purge_step: a resumed run's checkpoint step: TensorBoard events written after it by
            the interrupted run are dropped (the CSVs are cut by the workspace).
        prefix: put before every console line (``[job 3] `` in a sweep, whose parallel jobs
            share one terminal).
        tracker: a :class:`themis.tracking.TrackingHub` the rows also go to, or None (the
            workspace closes it).

    Raises:
        ValueError: an unknown backend.
    """

    def __init__(self, run_dir: Path, stream: TextIO | None = None,
                 backends: tuple[str, ...] | list[str] = ("csv",),
                 purge_step: int | None = None, prefix: str = "", tracker: Any = None) -> None:
        unknown = sorted(set(backends) - set(LOGGER_BACKENDS))
        if unknown:
            raise ValueError(f"logger={','.join(backends)}: unknown backend {unknown[0]!r}; "
                             f"choose from {', '.join(LOGGER_BACKENDS)}")
        self.run_dir, self.prefix = run_dir, prefix
        self.stream = stream if stream is not None else sys.stdout  # the current one, not import's
        self.tensorboard = None
        if "tensorboard" in backends:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(log_dir=str(run_dir / "tensorboard"),
                                             purge_step=purge_step)
        self.tracker = tracker
        self.train = MetricLog("train", run_dir, self.tensorboard, tracker)
        self.eval = MetricLog("eval", run_dir, self.tensorboard, tracker)
        self.reward = MetricLog("reward", run_dir, self.tensorboard, tracker)

    def attach(self, tracker: Any) -> None:
        """Send every later row also to ``tracker`` (a :class:`themis.tracking.TrackingHub`)."""
        self.tracker = tracker
        for log in (self.train, self.eval, self.reward):
            log.tracker = tracker

    def info(self, message: str, color: str | None = None) -> None:
        tqdm.write(self.prefix + (colored(message, color) if color else message),
                   file=self.stream)
        self.stream.flush()

    def console(self, kind: str, row: Mapping[str, Any]) -> None:
        """One line such as ``train | step 5000 | fps 180 | episode_reward -12.3 | ...``."""
        parts = [colored(f"{kind:5s}", "yellow" if kind == "train" else "green")]
        for key, value in row.items():
            value = _plain(value)
            if isinstance(value, float):
                value = f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}" \
                    if 0 < abs(value) < 1e-3 else f"{value:.3f}"
            parts.append(f"{key} {value}")
        self.info(" | ".join(parts))

    def close(self) -> None:
        for log in (self.train, self.eval, self.reward):
            log.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


def plot_learning_curve(eval_csv: Path, out_png: Path, title: str = "") -> None:
    """Plot mean true eval return (and total feedback) against environment steps."""
    import pandas as pd

    plt = pyplot()

    df = pd.read_csv(eval_csv)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(df["step"], df["episode_reward"], marker="o", color="tab:blue", label="true return")
    if "episode_reward_std" in df:
        ax.fill_between(df["step"], df["episode_reward"] - df["episode_reward_std"],
                        df["episode_reward"] + df["episode_reward_std"], alpha=0.2,
                        color="tab:blue", label="± std over the eval episodes")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("mean true episode return (eval)")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if "total_feedback" in df and df["total_feedback"].max() > 0:  # no axis without queries
        ax2 = ax.twinx()
        ax2.plot(df["step"], df["total_feedback"], color="tab:orange", linestyle="--",
                 label="queries asked (total)")
        ax2.set_ylabel("queries asked", color="tab:orange")
        more = ax2.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, fontsize=8, loc="best")
    ax.set_title(textwrap.fill(title, 80), fontsize=10)  # env: method · sampler · teacher
    save_figure(fig, out_png, dpi=120)
