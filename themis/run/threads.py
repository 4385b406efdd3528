"""PyTorch's intra-op threads for a run: ``torch_threads=auto`` and the contention watcher.

The rule comes from ``scripts/bench_contention.py`` and ``scripts/bench_update.py`` (README,
"Threads"), on a 2-core x86 CPU: the main job (SAC 2×128 with its 3×256 reward ensemble and the
state-entropy k-NN) ran 320 steps/s alone on two threads against 279 on one, wider SAC networks
gain more (2×256: 95 → 129 steps/s), and so do CNNs; PPO's small vector networks do not need a
second thread. But two runs that both use two threads on two cores collapse to a fifth of their
speed (intra-op threads spin-wait for each other across hundreds of tiny operations per step:
54 steps/s each), while two one-thread runs keep theirs. libgomp's passive wait policy
(``OMP_WAIT_POLICY=passive``) avoids the collapse but also removed the whole gain of the second
thread alone, and a short spin count (``GOMP_SPINCOUNT``) did not prevent the collapse; so
Themis keeps the default wait policy and instead never runs more than one thread while other
processes use the cores:

* :func:`auto_threads` — the number of threads a run starts with: 1 on CUDA and for small
  vector networks, ``min(cores, 4)`` for CNN encoders and wide networks. SAC's small networks
  run on one thread and its feedback rounds (reward training, query scoring, relabelling) on
  ``min(cores, 4)`` while the other cores are free (:func:`round_threads`): with the
  state-entropy k-NN cached, the main job's first 60 s ran 303 steps/s on one thread against
  284 on two, and the whole job 5 min 15 s on two against 5 min 30 s on one (its rounds).
* :class:`ThreadGovernor` — when a run starts with more than one thread, a daemon thread reads
  ``/proc/stat`` every 2 s; while other processes leave fewer free cores than the run's threads
  the run drops to one thread, and it goes back when the cores are free again. The switch
  happens in the training loop (:meth:`ThreadGovernor.poll`), never inside a PyTorch operation.

``torch_threads=N`` pins ``N`` threads (no watcher: bitwise reproducible runs need a fixed thread
count), ``torch_threads=0`` keeps PyTorch's default (all cores), and ``THEMIS_THREADS=N`` in the
environment overrides the key.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

# Work per update above which a second thread pays for PPO's networks too: batch × width² of
# SAC's 2×256 at batch 256 ran 1.36× faster on two threads than on one.
WIDE_WORK = 256 * 128 * 128
MAX_AUTO_THREADS = 4
"""More intra-op threads than this did not pay for Themis's networks (small batches)."""


def allowed_cpus() -> list[int] | None:
    """The CPUs this process may run on (its affinity mask); ``None`` where unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return None


def cgroup_cpu_limit() -> float | None:
    """The cgroup v2 CPU quota in cores (``docker --cpus``, Kubernetes limits); ``None``: none."""
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        return None if quota == "max" else max(1.0, int(quota) / int(period))
    except (OSError, ValueError):
        return None


def available_cores() -> int:
    """CPU cores this process may use: its affinity mask, capped by a cgroup v2 CPU quota."""
    cpus = allowed_cpus()
    cores = len(cpus) if cpus else (os.cpu_count() or 1)
    limit = cgroup_cpu_limit()
    return max(1, min(cores, int(limit)) if limit is not None else cores)


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count a run starts with and why (printed in the banner).

    Attributes:
        threads: intra-op threads to set (``0``: leave PyTorch's default).
        reason: a few words for the banner, e.g. ``"auto: small vector networks"``.
        adaptive: start a :class:`ThreadGovernor` (only ``auto`` with more than one thread).
        round_threads: threads for feedback rounds while the other cores are free
            (:func:`round_threads`); ``0``: the rounds keep ``threads``.
    """

    threads: int
    reason: str
    adaptive: bool = False
    round_threads: int = 0

    def describe(self) -> str:
        """``"1 thread (auto: ...)"`` for the banner."""
        n = self.threads or torch.get_num_threads()
        adaptive = ", 1 while other processes use the cores" if self.adaptive else ""
        rounds = f"; feedback rounds on {self.round_threads} while the cores are free" \
            if self.round_threads > n else ""
        return f"{n} thread{'s' if n != 1 else ''} ({self.reason}{adaptive}{rounds})"


def auto_threads(*, agent: str, obs_kind: str, device: str, hidden_dim: int, batch_size: int,
                 cores: int | None = None) -> ThreadChoice:
    """Themis's thread rule for ``torch_threads=auto``.

    Args:
        agent: ``"sac"`` or ``"ppo"`` (resolved, not ``auto``).
        obs_kind: ``"vector"``, ``"pixels"`` or ``"grid"``
            (:func:`themis.agents.encoders.observation_kind`).
        device: the resolved torch device type (``"cpu"`` or ``"cuda"``).
        hidden_dim: hidden width of the agent's networks.
        batch_size: SAC's batch size, or PPO's minibatch size (transitions per gradient step).
        cores: cores available (default: :func:`available_cores`).

    Returns:
        The choice: 1 thread on CUDA (the GPU does the arithmetic; CPU threads would only compete
        with the env) and for small vector networks — SAC's with ``min(cores, 4)`` for its
        feedback rounds (:func:`round_threads`; the reward ensemble's training gains from them,
        the SAC loop does not); ``min(cores, 4)``, adaptive, for CNN encoders (pixels, grids)
        and for networks whose ``batch × width²`` exceeds :data:`WIDE_WORK`.
    """
    cores = available_cores() if cores is None else cores
    if device.startswith("cuda"):
        return ThreadChoice(1, "auto: CUDA")
    if obs_kind != "vector":
        reason = f"auto: CNN encoder ({obs_kind})"
    elif batch_size * hidden_dim * hidden_dim > WIDE_WORK:
        reason = f"auto: wide {agent.upper()} networks ({hidden_dim} wide, batch {batch_size})"
    elif agent == "sac":
        rounds = min(cores, MAX_AUTO_THREADS)
        return ThreadChoice(1, "auto: small SAC networks",
                            round_threads=rounds if rounds > 1 else 0)
    else:
        return ThreadChoice(1, f"auto: small {agent.upper()} networks on vectors")
    threads = min(cores, MAX_AUTO_THREADS)
    if threads == 1:
        return ThreadChoice(1, reason + ", one core")
    return ThreadChoice(threads, reason, adaptive=True)


def parse_threads(value: object) -> int | None:
    """``torch_threads`` as given: ``None`` for ``auto``, else a count ``>= 0``.

    Raises:
        ValueError: anything else (one line for the user).
    """
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0 or str(n) != text.lstrip("+"):
        raise ValueError(f"torch_threads={value} must be auto, 0 (PyTorch's default: all cores) "
                         "or a number of threads")
    return n


def set_num_threads(num_threads: int) -> None:
    """Set PyTorch's intra-op threads for a script; ``0`` keeps the default (``THEMIS_THREADS``
    overrides, read as :func:`parse_threads` reads it; ``auto`` keeps the default).

    Raises:
        ValueError: ``THEMIS_THREADS`` is not ``auto`` or a count.
    """
    chosen = parse_threads(os.environ.get("THEMIS_THREADS", num_threads))
    if chosen:
        torch.set_num_threads(chosen)


def _cpu_busy(cpus: list[int] | None = None) -> tuple[float, float, int] | None:
    """(busy, total) jiffies and the CPU count of ``cpus`` (default: this process's affinity
    mask) from ``/proc/stat``; ``None`` where it does not exist."""
    cpus = allowed_cpus() if cpus is None else cpus
    wanted = {f"cpu{i}" for i in cpus} if cpus else None
    busy = total = 0.0
    count = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *rest = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    if count:  # the per-CPU lines come in one block
                        break
                    continue
                if wanted is not None and name not in wanted:
                    continue
                fields = [int(x) for x in rest[:8]]
                idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
                busy += sum(fields) - idle  # guest time is already counted in user
                total += sum(fields)
                count += 1
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total, count) if count else None


def other_load(interval: float,
               sample: Callable[[], tuple[float, float, int] | None] = _cpu_busy) -> float | None:
    """Cores of this process's CPUs kept busy by other processes during ``interval`` seconds
    (blocks that long).

    The busy time of the CPUs in this process's affinity mask, from ``/proc/stat``, less this
    process's own CPU time (``os.times()``, all its threads). ``None`` where ``/proc/stat`` is
    not available.
    """
    first, own0, t0 = sample(), os.times(), time.monotonic()
    if first is None:
        return None
    time.sleep(interval)
    second, own1, t1 = sample(), os.times(), time.monotonic()
    if second is None or second[1] <= first[1]:
        return None
    busy_cores = (second[0] - first[0]) / (second[1] - first[1]) * second[2]
    own_cores = ((own1.user + own1.system) - (own0.user + own0.system)) / max(t1 - t0, 1e-6)
    return max(0.0, busy_cores - own_cores)


class ThreadGovernor:
    """Drop to one intra-op thread while other processes use the cores; restore when they stop.

    A daemon thread measures :func:`other_load` every ``interval`` seconds and sets a target; the
    training loop calls :meth:`poll` (a flag read) and the thread count changes there, between
    PyTorch operations. Contended when other processes leave fewer than ``threads`` of this
    process's cores free, with ``busy`` cores of slack (on 2 cores with 2 threads: others use
    more than half a core); free again after two measurements with ``free`` cores more room.

    Args:
        threads: the thread count when the machine is free (``> 1``).
        interval: seconds per measurement.
        busy, free: the hysteresis thresholds in cores.
        cores: this process's cores (default :func:`available_cores`).
        measure: the load probe (tests pass a fake one).
    """

    def __init__(self, threads: int, interval: float = 2.0, busy: float = 0.5, free: float = 0.3,
                 cores: int | None = None,
                 measure: Callable[[float], float | None] = other_load) -> None:
        self.threads, self.interval = threads, interval
        spare = (available_cores() if cores is None else cores) - threads  # cores we leave over
        self.busy, self.free = spare + busy, spare + free
        self.measure = measure
        self.target = self.current = threads
        self.switches = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="themis-threads", daemon=True)

    def start(self) -> ThreadGovernor:
        """Start watching (returns ``self``)."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (the thread count stays where it is)."""
        self._stop.set()

    def _watch(self) -> None:
        calm, interval = 0, min(self.interval, 0.5)  # the first reading soon: runs start together
        while not self._stop.is_set():
            load = self.measure(interval)
            interval = self.interval
            if load is None:  # no /proc/stat: keep the start value
                return
            if load > self.busy:
                self.target, calm = 1, 0
            elif load < self.free:
                calm += 1
                if calm >= 2:
                    self.target = self.threads
            # in between: keep the current target

    def poll(self) -> None:
        """Apply the current target (call from the training loop; costs a comparison)."""
        target = self.target
        if target != self.current:
            torch.set_num_threads(target)
            self.current = target
            self.switches += 1


@contextlib.contextmanager
def round_threads(choice: ThreadChoice, busy: float = 0.5, interval: float = 0.1,
                  measure: Callable[[float], float | None] = other_load) -> Iterator[int]:
    """Run the block (a feedback round) on ``choice.round_threads`` threads when the other
    processes leave that many of this process's cores free; yields the thread count used.

    One :func:`other_load` reading of ``interval`` seconds decides (free: others keep fewer than
    ``cores − round_threads + busy`` cores busy, as :class:`ThreadGovernor`); afterwards the
    thread count is restored. Nothing changes without ``round_threads`` or where ``/proc/stat``
    cannot be read.
    """
    before = torch.get_num_threads()
    wanted = choice.round_threads
    if wanted <= before:
        yield before
        return
    load = measure(interval)
    if load is None or load > available_cores() - wanted + busy:
        yield before
        return
    torch.set_num_threads(wanted)
    try:
        yield wanted
    finally:
        torch.set_num_threads(before)


def apply_threads(choice: ThreadChoice) -> ThreadGovernor | None:
    """Set the chosen thread count; start and return a :class:`ThreadGovernor` if adaptive."""
    if choice.threads > 0:
        torch.set_num_threads(choice.threads)
    if choice.adaptive and choice.threads > 1:
        return ThreadGovernor(choice.threads).start()
    return None


def choose_threads(value: object, *, agent: str, obs_kind: str, device: str, hidden_dim: int,
                   batch_size: int) -> ThreadChoice:
    """The run's :class:`ThreadChoice` from ``torch_threads`` (and ``THEMIS_THREADS``).

    ``THEMIS_THREADS=N`` in the environment wins, then a fixed ``torch_threads=N``, ``0`` keeps
    PyTorch's default, and ``auto`` applies :func:`auto_threads` to the other arguments.

    Raises:
        ValueError: ``torch_threads`` or ``THEMIS_THREADS`` is not ``auto`` or a count.
    """
    env = os.environ.get("THEMIS_THREADS")
    if env:
        n = parse_threads(env)
        if n is not None:
            return ThreadChoice(n, "THEMIS_THREADS" if n else "THEMIS_THREADS=0: PyTorch's default")
    n = parse_threads(value)
    if n is None:
        return auto_threads(agent=agent, obs_kind=obs_kind, device=device, hidden_dim=hidden_dim,
                            batch_size=batch_size)
    return ThreadChoice(n, f"torch_threads={n}" if n else "torch_threads=0: PyTorch's default")
