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
in line itself. A waiting run sleeps on its own named pipe, queued by when it started waiting
(``wake-<ns>-<pid>-<n>``), and a run that gives a core up writes a byte into the pipe of the run
that waits longest: the core changes hands within microseconds, in the order the runs came, and
waiting runs do not wake for nothing (a safety look every ``LOOK`` seconds). Before, waiting
runs looked for a free core every 5 ms, each look pre-empting a stepping run: four main-job runs
on two cores had about 6,000 involuntary context switches each in their first 8000 steps, about
2,000 now. A run's ``patience`` counts from the last time any run took a core, so a long line of
waiting runs is not mistaken for a stuck one. Alone, or with no more runs than cores, a run
never waits and the check costs one system call per turn. The kernel drops a dead process's
locks, so a crashed run blocks nobody; a run that waits longer than ``patience`` seconds
(another run holding its core without stepping, e.g. stopped in a debugger) stops taking turns
for ``rest`` seconds and just runs. A run gives its core up for feedback rounds a person may
answer (for minutes) and whenever its ``Workspace.run`` call returns; with a synthetic teacher
it keeps it and takes turns between the reward model's minibatch steps
(:meth:`themis.run.workspace.Workspace.round_threads`).

For runs on the CPU with one PyTorch thread in their loop (``torch_threads``), and for runs
whose :class:`themis.run.threads.ThreadGovernor` chooses between several threads alone and one
next to other runs (CNN encoders, wide networks): such a run holds one core's lock, and its
governor sees the other holders' load and keeps it at one thread; waiting runs sleep and leave
the cores to the holders. PPO gives its core up between minibatches too
(:attr:`themis.agents.ppo.PPO.between_minibatches`): a pixel rollout's update takes seconds, longer
than a waiting run's ``patience``. Four Breakout PPO runs on two cores did 7 % fewer steps
together than two when the kernel time-sliced them (README, "Threads").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import selectors
import struct
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
        patience: seconds without any run taking a core (one held by a run that does not
            step) after which a waiting run stops taking turns for ``rest``.
        rest: seconds without turns after a wait ran out of patience.

    Attributes:
        handovers: how often this run gave its core to a waiting run.
        waited: seconds this run spent waiting for a core.

    Raises:
        OSError: the lock directory cannot be created or is not this user's.
    """

    LOOK = 0.1
    """Seconds a waiting run sleeps at most between two looks for a free core (a safety net:
    every run that gives a core up wakes the run that waits longest)."""
    HANDOVER = 0.01
    """Seconds a run that gave its core up waits before it looks for one (the waiting run it
    woke takes the core first)."""
    _instances = itertools.count()

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
        # this run's pipe lives under a name the others ignore; while the run waits it is
        # renamed into the queue, ``wake-<monotonic ns>-...``: the earliest is woken first
        self._wake_path = self.directory / f".wake-{os.getpid()}-{next(self._instances)}"
        self._queued: Path | None = None
        self._wake = self._wake_writer = -1  # this run's pipe, made at its first wait
        self._selector: selectors.BaseSelector | None = None
        self._held: int | None = None
        self._more: list[int] = []  # more cores, held for a feedback round's threads
        self._next_look = 0.0
        self._resting_until = 0.0
        self.handovers = 0
        self.waited = 0.0

    @property
    def holding(self) -> bool:
        """Whether this run holds a core now."""
        return self._held is not None

    @property
    def more(self) -> int:
        """Cores held besides this run's own (:meth:`take_more`)."""
        return len(self._more)

    def take_more(self, n: int) -> int:
        """Take ``n`` more cores besides the one held, for a feedback round's threads: all or
        none, and none while another run waits for a core or no core is held. Returns how many
        were taken (``n`` or 0); :meth:`give_more_back` (or :meth:`release`) frees them.

        Two runs that measure the machine's load at the same moment each see the other idle
        (it is measuring too) and both take two threads: four threads on two cores spin-wait
        on each other (a round of 3 s of CPU took 10–16 s). The cores' locks decide instead,
        atomically: while another run steps on a core, it cannot be taken.
        """
        if self._held is None or n <= 0 or self._others_wait():
            return 0
        while len(self._more) < n and (
                fd := self._try_slots(skip=(self._held, *self._more))) is not None:
            self._more.append(fd)
        if len(self._more) < n:
            self.give_more_back()
            return 0
        return n

    def give_more_back(self) -> None:
        """Free the cores of :meth:`take_more` (a waiting run is woken for each)."""
        more, self._more = self._more, []
        for fd in more:
            fcntl.flock(fd, fcntl.LOCK_UN)
            self._wake_waiting()

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
        if self._wake >= 0:
            self._close_wake()
            with contextlib.suppress(OSError):
                self._wake_path.unlink()
        self._slots, self._waiting = [], -1
        self._next_look = self._resting_until = float("inf")  # poll() does nothing now

    def _others_wait(self) -> bool:
        try:
            fcntl.flock(self._waiting, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._waiting, fcntl.LOCK_UN)
        return False

    def _wake_waiting(self) -> None:
        """A core is free: write a byte into the pipe of the run that waits longest (the first
        ``wake-*`` name); a pipe whose run is gone (nobody reads it) is removed and the next
        one woken."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.startswith("wake-"))
        except OSError:
            return
        for name in names:
            path = self.directory / name
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            except OSError as e:  # ENXIO: no reader, the run died while it waited
                if e.errno == errno.ENXIO:
                    with contextlib.suppress(OSError):
                        path.unlink()
                continue
            with contextlib.suppress(OSError):  # EAGAIN: the pipe is full, it will look
                os.write(fd, b"!")
            os.close(fd)
            return

    def _open_wake(self) -> None:
        """Make this run's pipe (once), under its own name: a file left there by a dead run
        with this pid is replaced."""
        if self._wake < 0:
            with contextlib.suppress(FileNotFoundError):
                self._wake_path.unlink()
            os.mkfifo(self._wake_path, 0o600)
            cloexec = getattr(os, "O_CLOEXEC", 0)
            self._wake = os.open(self._wake_path, os.O_RDONLY | os.O_NONBLOCK | cloexec)
            # and for writing: a pipe whose last writer closed reads as ready (end of file)
            # from then on, and the waiting run would spin
            self._wake_writer = os.open(self._wake_path, os.O_WRONLY | os.O_NONBLOCK | cloexec)
            self._selector = selectors.DefaultSelector()  # epoll, kqueue: any fd number
            self._selector.register(self._wake, selectors.EVENT_READ)

    def _queue(self, waiting: bool) -> None:
        """Move this run's pipe into the queue of waiting runs (named by when it started
        waiting) or out of it."""
        if waiting:
            self._open_wake()
            queued = self.directory / (f"wake-{time.monotonic_ns():020d}"
                                       f"{self._wake_path.name.removeprefix('.wake')}")
            try:
                os.replace(self._wake_path, queued)
            except FileNotFoundError:  # removed by someone (a /tmp cleaner): a new one
                self._close_wake()
                self._open_wake()
                os.replace(self._wake_path, queued)
            self._queued = queued
        elif self._queued is not None:
            with contextlib.suppress(FileNotFoundError):  # the next wait makes a new one
                os.replace(self._queued, self._wake_path)
            self._queued = None

    def _last_handover(self) -> float:
        """When a core was last taken (``time.monotonic``, written by the taker into the
        core's file; ``0.0``: never)."""
        times = [struct.unpack("d", raw)[0] for fd in self._slots
                 if len(raw := os.pread(fd, 8, 0)) == 8]
        return max(times, default=0.0)

    def _close_wake(self) -> None:
        assert self._selector is not None
        self._selector.close()
        os.close(self._wake)
        os.close(self._wake_writer)
        self._wake = self._wake_writer = -1
        self._selector = None

    def _sleep(self, seconds: float) -> None:
        """Sleep until a run gives a core up (a byte in this run's pipe) or ``seconds`` pass."""
        if self._selector is None:
            time.sleep(seconds)
        elif self._selector.select(seconds):
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake, 4096)

    def _try_slots(self, skip: tuple[int, ...] = ()) -> int | None:
        """A free core's lock, taken (``skip``: cores this run holds already, whose lock a
        second ``flock`` would only take again)."""
        for fd in self._slots:
            if fd in skip:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            return fd
        return None

    def _acquire(self) -> None:
        fd = self._try_slots()
        if fd is None:
            fd = self._wait()
        self._held = fd
        if fd is not None:  # the waiting runs' patience counts from here
            os.pwrite(fd, struct.pack("d", time.monotonic()), 0)

    def _wait(self) -> int | None:
        """Wait in line for a core: the core, or ``None`` after ``patience`` seconds in which
        no run took a core (one held without stepping; this run then rests)."""
        start = time.monotonic()
        fcntl.flock(self._waiting, fcntl.LOCK_SH)  # in line: holders see a waiting run
        try:
            with contextlib.suppress(OSError):  # no pipe here: safety looks only
                self._queue(True)
            fd = self._try_slots()  # after queueing: a core given up from now on wakes us
            while fd is None:
                now = time.monotonic()
                idle = now - max(start, self._last_handover())
                if idle > self.patience:
                    self._resting_until = now + self.rest
                    break
                self._sleep(min(self.LOOK, self.patience - idle + 1e-3))
                fd = self._try_slots()
        finally:
            self._queue(False)
            fcntl.flock(self._waiting, fcntl.LOCK_UN)
            self.waited += time.monotonic() - start
        return fd

    def release(self) -> None:
        """Give the core up (the end of a ``Workspace.run`` call); the next :meth:`poll`
        takes one again."""
        if self._waiting >= 0:  # not closed
            self._next_look = 0.0
        self.give_more_back()
        if self._held is not None:
            fcntl.flock(self._held, fcntl.LOCK_UN)
            self._held = None
            self._wake_waiting()
