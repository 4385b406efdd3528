"""PyTorch's intra-op threads for a run: ``torch_threads=auto`` is one thread on every device.

One thread is what the codebases of the field set (CleanRL's ``torch.set_num_threads(1)``,
imitation's scripts, Stable-Baselines3's documentation): measured with
``benchmarks/bench_contention.py`` on a 2-core x86 CPU, two runs that both use two threads on two
cores collapse to a fifth of their speed (intra-op threads spin-wait for each other across the
hundreds of tiny operations of each step), while two one-thread runs each keep their speed.
A fixed thread count also keeps a run's last bits independent of what else the machine runs.

More threads pay for one run alone with the cores to itself where an update's operations are
large: CNN encoders (Breakout PPO: 107 against 81 steps/s on two threads) and wide networks
(SAC 2×256 at batch 256: 3.3 against 4.6 ms per update). ``auto`` keeps one thread for them too
and the banner names ``torch_threads=N`` (:attr:`ThreadChoice.hint`): the user knows whether the
run has the cores to itself.

``torch_threads=N`` sets ``N`` threads, ``torch_threads=0`` keeps PyTorch's default (all cores),
``THEMIS_THREADS=N`` in the environment overrides the key, and a local ``-m`` sweep shares the
cores among its jobs (:func:`themis.cli.train.threads_per_job`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from themis.agents import on_policy_config

if TYPE_CHECKING:
    from themis.run.config import TrainConfig
from themis.utils import ConfigError

WIDE_WORK = 256 * 128 * 128
"""Work per update (batch × width²) above which more threads paid for one run alone: SAC's
2×256 at batch 256 ran 1.4× faster on two threads than on one."""
MAX_HINT_THREADS = 4
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
    """The thread count a run uses and why (printed in the banner).

    Attributes:
        threads: intra-op threads to set (``0``: leave PyTorch's default).
        reason: a few words for the banner, e.g. ``"auto: one per run"``.
        hint: where more threads would pay for this run alone, the count to try
            (``torch_threads=N``); ``0``: none.
    """

    threads: int
    reason: str
    hint: int = 0

    def describe(self) -> str:
        """``"1 thread (auto: ...)"`` for the banner, with the hint if there is one."""
        n = self.threads or torch.get_num_threads()
        hint = f"; alone on the cores torch_threads={self.hint} is faster" if self.hint else ""
        return f"{n} thread{'s' if n != 1 else ''} ({self.reason}{hint})"


def auto_threads(*, agent: str, obs_kind: str, device: str, hidden_dim: int, batch_size: int,
                 cores: int | None = None) -> ThreadChoice:
    """Themis's thread rule for ``torch_threads=auto``: one thread.

    Args:
        agent: ``"sac"`` or ``"ppo"`` (resolved, not ``auto``).
        obs_kind: ``"vector"``, ``"pixels"`` or ``"grid"``
            (:func:`themis.agents.encoders.observation_kind`).
        device: the resolved torch device type (``"cpu"`` or ``"cuda"``).
        hidden_dim: hidden width of the agent's networks.
        batch_size: SAC's batch size, or PPO's minibatch size (transitions per gradient step).
        cores: cores available (default: :func:`available_cores`).

    Returns:
        One thread (on CUDA the GPU does the arithmetic; CPU threads would only compete with the
        env); on a CPU with more than one core, CNN encoders (pixels, grids) and networks whose
        ``batch × width²`` exceeds :data:`WIDE_WORK` get a hint of ``min(cores, 4)`` threads.
    """
    if device.startswith("cuda"):
        return ThreadChoice(1, "auto: CUDA")
    cores = available_cores() if cores is None else cores
    more = min(cores, MAX_HINT_THREADS)
    if obs_kind != "vector":
        return ThreadChoice(1, f"auto: CNN encoder ({obs_kind})", hint=more if more > 1 else 0)
    if batch_size * hidden_dim * hidden_dim > WIDE_WORK:
        return ThreadChoice(1, f"auto: wide {agent.upper()} networks ({hidden_dim} wide, batch "
                            f"{batch_size})", hint=more if more > 1 else 0)
    return ThreadChoice(1, f"auto: small {agent.upper()} networks")


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


def apply_threads(choice: ThreadChoice) -> None:
    """Set the chosen thread count (``0``: PyTorch's default is left as it is)."""
    if choice.threads > 0:
        torch.set_num_threads(choice.threads)


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


def run_threads(cfg: TrainConfig, agent: str, obs_kind: str, device: str) -> ThreadChoice:
    """The :class:`ThreadChoice` of a run's config (:func:`choose_threads` with its agent's
    hidden width and update batch: SAC's ``batch_size``, PPO's minibatch), applied.

    Raises:
        ConfigError: ``torch_threads`` or ``THEMIS_THREADS`` is not ``auto`` or a count.
    """
    if agent == "sac":
        hidden_dim, batch = cfg.sac.hidden_dim, cfg.sac.batch_size
    else:
        net = on_policy_config(cfg)
        hidden_dim, batch = net.hidden_dim, net.num_envs * net.num_steps // net.num_minibatches
    try:
        choice = choose_threads(cfg.torch_threads, agent=agent, obs_kind=obs_kind, device=device,
                                hidden_dim=hidden_dim, batch_size=batch)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    apply_threads(choice)
    return choice
