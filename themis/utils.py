"""Small helpers shared by the agents and the Workspace (pytorch_sac / drqv2 tradition)."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterable, Iterator
from typing import IO

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


def set_num_threads(num_threads: int) -> None:
    """Set PyTorch's intra-op threads; ``0`` keeps the default (``THEMIS_THREADS`` overrides)."""
    num_threads = int(os.environ.get("THEMIS_THREADS", num_threads))
    if num_threads > 0:
        torch.set_num_threads(num_threads)


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


def make_adam(params: Iterable[torch.Tensor], lr: float) -> torch.optim.Adam:
    """Adam with the fused kernel (one kernel for all parameters; CPU and CUDA).

    Falls back to the multi-tensor implementation where the fused one is unavailable.
    """
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, foreach=True)


def to_torch(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """Convert a NumPy array to a tensor on ``device`` without copying on CPU when possible."""
    tensor = torch.as_tensor(array)
    return tensor.to(device, non_blocking=True) if device.type != "cpu" else tensor


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
