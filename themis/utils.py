"""Small helpers shared by the agents and the Workspace (pytorch_sac / drqv2 tradition)."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import nn


class ConfigError(ValueError):
    """A configuration value is invalid; the message says what is wrong and how to fix it."""


def set_seed_everywhere(seed: int) -> None:
    """Seed Python, NumPy and PyTorch (CPU and CUDA) random number generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def get_device(device: str = "auto") -> torch.device:
    """Resolve a device spelling into a ``torch.device``.

    Args:
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Raises:
        ConfigError: CUDA is asked for explicitly but is not available, or the spelling is unknown.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device={device} but CUDA is not available on this machine; "
                "use device=cpu or device=auto"
            )
        return torch.device(device)
    raise ConfigError(f"device={device!r} is not one of auto, cpu, cuda, cuda:N")


def memory_limit() -> int | None:
    """Bytes of memory this process may use: the machine's physical memory, or its cgroup's
    limit when lower (a container); ``None`` where neither can be read."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for cgroup in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):  # "max": no limit (ValueError)
            limits.append(int(Path(cgroup).read_text().strip()))
    return min(limits) if limits else None


def check_memory(what: str, nbytes: int) -> None:
    """Refuse an allocation that cannot fit in :func:`memory_limit` before it is tried (with
    memory overcommit the allocation itself may succeed and the process be killed later).

    Args:
        what: what the memory is for, e.g. ``"a replay buffer of 1000000 steps"``.
        nbytes: bytes it needs.

    Raises:
        MemoryError: ``nbytes`` is more than the memory this process may use.
    """
    limit = memory_limit()
    if limit is not None and nbytes > limit:
        raise MemoryError(f"{what} needs {nbytes / 2**30:,.1f} GiB of memory, more than the "
                          f"{limit / 2**30:,.1f} GiB of this machine")

MODE_DEPENDENT = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm,
                  nn.modules.instancenorm._InstanceNorm)
"""Layers whose output differs between train and eval mode."""


def mode_dependent(model: nn.Module) -> bool:
    """Whether ``model`` has a layer whose output depends on train or eval mode (dropout, batch
    or instance norm): without one, :func:`eval_mode` around it changes nothing but costs a
    walk of its module tree twice."""
    return any(isinstance(m, MODE_DEPENDENT) for m in model.modules())


@contextlib.contextmanager
def eval_mode(*models: nn.Module) -> Iterator[None]:
    """Put modules in eval mode inside the block and restore their previous modes after it."""
    prev = [m.training for m in models]
    for m in models:
        m.train(False)
    try:
        yield
    finally:
        for m, mode in zip(models, prev, strict=True):
            m.train(mode)


@torch.no_grad()
def polyak_update(params: Iterable[torch.Tensor], target_params: Iterable[torch.Tensor],
                  tau: float) -> None:
    """Soft target update ``target <- (1 - tau) * target + tau * param`` (SAC, Haarnoja 2018).

    Uses one fused ``torch._foreach_lerp_`` call instead of a Python loop over tensors.
    """
    targets = list(target_params)
    torch._foreach_lerp_(targets, list(params), tau)


def make_adam(params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
              lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam with the fused kernel (one kernel for all parameters; CPU and CUDA). ``params``:
    tensors, or parameter groups (dicts with their own ``lr``); ``eps``: Adam's ε.

    Falls back to the multi-tensor implementation where the fused one is unavailable.
    """
    given: list[Any] = list(params)
    try:
        return torch.optim.Adam(given, lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(given, lr=lr, eps=eps, foreach=True)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (a rename in it) to disk: after ``os.replace`` the new name
    survives a power loss only once its directory is synced (POSIX; a no-op where directories
    cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_private(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open ``path`` for writing (created or truncated), readable and writable by its owner
    only (mode 0600, also when it existed with another mode): for files that hold people's
    answers (``labels.csv``, query segments), like ``labels.sqlite``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:  # e.g. a file system without modes
        pass
    return os.fdopen(fd, "wb")


def replace_durably(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """``os.replace(tmp, path)`` and sync ``path``'s directory, so the rename is on disk."""
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def save_durably(obj: object, path: str | os.PathLike[str]) -> None:
    """``torch.save(obj, path)`` crash-safe: into ``path.tmp``, fsynced, then renamed over
    ``path`` (:func:`replace_durably`). A crash leaves the old file or the new one, never a
    torn one."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:  # streamed to disk: no second in-memory copy
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    replace_durably(tmp, path)
