"""Themis runs on one machine take turns on its cores when there are more runs than cores.

K one-thread runs on C < K cores are time-sliced by the kernel every few milliseconds, and each
switch refills the caches with the other run's working set (weights, activations, optimiser
state). Measured on a 2-core x86 machine (README, "Threads"): K copies of a bare SAC update
loop did 557 updates/s together at K = 4 against 640–727 at K = 2, while a pure-Python loop lost
nothing; four main-job runs did 10–25 % fewer steps together than two. Taking turns in 0.5 s
slices gives four main-job runs 10–12 % more steps together (418 and 410 against 375 and 373
steps/s, ``scripts/bench_contention.py --steps 8000``).

Each core is a lock file (``flock``) in a per-user directory. A run holds one while it steps;
every ``turn`` seconds of stepping it looks whether another run waits for a core (waiters hold a
shared lock on the ``waiting`` file while they wait), and only then gives its core up and waits
in line itself. Alone, or with no more runs than cores, a run never waits and the check costs
one system call per turn. The kernel drops a dead process's locks, so a crashed run blocks
nobody; a run that waits longer than ``patience`` seconds (another run holding its core
without stepping, e.g. stopped in a debugger) stops taking turns for ``rest`` seconds and just
runs. A run gives its core up for its feedback rounds (a person may answer for minutes) and
whenever its ``Workspace.run`` call returns.

Only for runs on the CPU with one PyTorch thread in their loop (``torch_threads``): a run that
uses several threads already has the :class:`themis.run.threads.ThreadGovernor`.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path


def default_dir() -> Path:
    """The per-user lock directory: ``$TMPDIR/themis-core-turns-<uid>``."""
    return Path(tempfile.gettempdir()) / f"themis-core-turns-{os.getuid()}"


class CoreTurns:
    """Take turns on ``cores`` cores with the other Themis runs of this user on this machine.

    Args:
        cores: cores to share (default: the CPUs this process may run on).
        directory: where the lock files live (default :func:`default_dir`).
        turn: seconds of stepping between two looks for waiting runs.
        patience: seconds a run waits for a core before it stops taking turns for ``rest``.
        rest: seconds without turns after a wait ran out of patience.

    Attributes:
        handovers: how often this run gave its core to a waiting run.
        waited: seconds this run spent waiting for a core.

    Raises:
        OSError: the lock directory cannot be created or is not this user's.
    """

    LOOK = 0.005
    """Seconds between a waiting run's looks for a free core."""
    HANDOVER = 0.01
    """Seconds a run that gave its core up waits before it looks for one (two looks of the
    waiting runs: one of them takes the core)."""

    def __init__(self, cores: int | None = None, directory: Path | None = None,
                 turn: float = 0.5, patience: float = 5.0, rest: float = 60.0) -> None:
        affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every CPU
        self.cores = cores or (len(affinity(0)) if affinity else os.cpu_count() or 1)
        self.directory = Path(directory or default_dir())
        self.directory.mkdir(mode=0o700, exist_ok=True)
        if self.directory.stat().st_uid != os.getuid():
            raise OSError(f"{self.directory} belongs to another user")
        self.turn, self.patience, self.rest = turn, patience, rest
        flags = os.O_CREAT | os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        self._slots = [os.open(self.directory / f"core-{i}", flags, 0o600)
                       for i in range(self.cores)]
        self._waiting = os.open(self.directory / "waiting", flags, 0o600)
        self._held: int | None = None
        self._next_look = 0.0
        self._resting_until = 0.0
        self.handovers = 0
        self.waited = 0.0

    @property
    def holding(self) -> bool:
        """Whether this run holds a core now."""
        return self._held is not None

    def poll(self) -> None:
        """Call between steps: takes a core when none is held, and after each ``turn`` of
        stepping hands it to a waiting run (and waits for the next free core)."""
        now = time.monotonic()
        if now < self._next_look:
            return
        if now < self._resting_until:
            self._next_look = self._resting_until
            return
        if self._held is not None:
            if not self._others_wait():
                self._next_look = now + self.turn
                return
            self.release()
            self.handovers += 1
            time.sleep(self.HANDOVER)  # the waiting run takes the core first
        self._acquire()
        self._next_look = time.monotonic() + self.turn

    def close(self) -> None:
        """Give the core up and close the lock files."""
        if self._waiting < 0:
            return
        self.release()
        for fd in (*self._slots, self._waiting):
            os.close(fd)
        self._slots, self._waiting = [], -1
        self._next_look = self._resting_until = float("inf")  # poll() does nothing now

    def _others_wait(self) -> bool:
        try:
            fcntl.flock(self._waiting, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._waiting, fcntl.LOCK_UN)
        return False

    def _try_slots(self) -> int | None:
        for fd in self._slots:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            return fd
        return None

    def _acquire(self) -> None:
        fd = self._try_slots()
        if fd is not None:
            self._held = fd
            return
        start = time.monotonic()
        fcntl.flock(self._waiting, fcntl.LOCK_SH)  # in line: holders see a waiting run
        try:
            while fd is None:
                if time.monotonic() - start > self.patience:
                    self._resting_until = time.monotonic() + self.rest
                    break
                time.sleep(self.LOOK)
                fd = self._try_slots()
        finally:
            fcntl.flock(self._waiting, fcntl.LOCK_UN)
            self.waited += time.monotonic() - start
        self._held = fd

    def release(self) -> None:
        """Give the core up (the end of a ``Workspace.run`` call); the next :meth:`poll`
        takes one again."""
        if self._waiting >= 0:  # not closed
            self._next_look = 0.0
        if self._held is not None:
            fcntl.flock(self._held, fcntl.LOCK_UN)
            self._held = None
