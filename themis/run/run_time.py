"""The run's own time: wall-clock and CPU seconds of its training process, the segments before
a resume included (``run_time.json`` in the run folder, written with each checkpoint).

A run stopped and resumed many times (or killed with its session) still reports what it cost:
the checkpoint keeps the time as of that checkpoint, and the resumed run counts on from it. A
background learner process (``reward_training=async``) counts its own CPU time
(``learner_cpu.json``, :mod:`themis.online.learner_process`).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

RUN_TIME_FILE = "run_time.json"


class RunClock:
    """Wall-clock (``time.monotonic``) and CPU (``time.process_time``) seconds of a run.

    Attributes:
        before: ``{"wall_s", "cpu_s"}`` of the segments before this process's (zeros for a new
            run; a resumed run's checkpoint's).
    """

    def __init__(self) -> None:
        self.before = {"wall_s": 0.0, "cpu_s": 0.0}
        self.start = (time.monotonic(), time.process_time())

    def seconds(self) -> dict[str, float]:
        """The run's ``{"wall_s", "cpu_s"}`` so far, earlier segments included."""
        return {"wall_s": self.before["wall_s"] + time.monotonic() - self.start[0],
                "cpu_s": self.before["cpu_s"] + time.process_time() - self.start[1]}

    def resume(self, state: dict[str, Any]) -> None:
        """Count on from a checkpoint's ``run_time`` (zeros for an older checkpoint without
        it, or where a value is not a finite non-negative number)."""
        saved = state.get("run_time")
        self.before = {"wall_s": 0.0, "cpu_s": 0.0}
        if isinstance(saved, dict):
            for key in self.before:
                value = saved.get(key)
                if isinstance(value, int | float) and math.isfinite(value) and value >= 0:
                    self.before[key] = float(value)
        self.start = (time.monotonic(), time.process_time())

    @staticmethod
    def write(run_dir: Path, seconds: dict[str, float]) -> None:
        """``run_time.json`` in ``run_dir`` (replaced whole): ``seconds`` rounded to ms."""
        tmp = run_dir / (RUN_TIME_FILE + ".tmp")
        tmp.write_text(json.dumps({k: round(float(v), 3) for k, v in seconds.items()}))
        os.replace(tmp, run_dir / RUN_TIME_FILE)
