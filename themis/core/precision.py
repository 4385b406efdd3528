"""Matrix products in bfloat16 on CPUs that have bf16 instructions: ``precision=auto|fp32|bf16``.

Inside :func:`autocast` PyTorch runs linear layers, batched matmuls and convolutions in
bfloat16 (parameters, gradients and optimiser state stay float32; ``torch.autocast``). Output
layers — Q values, rewards, policy means — are computed in float32
(:class:`themis.agents.networks.FullPrecisionLinear`, ``EnsembleLinear(full_precision=True)``) so
that a TD error or a Bradley–Terry logit is not rounded to bfloat16's 8 significant bits. On a
CPU with AVX-512 BF16 or AMX, SAC's update ran about 2× faster (``benchmarks/bench_throughput.py``,
docs/benchmarks/throughput.md).

``auto`` picks bfloat16 on such CPUs and float32 elsewhere (CPUs without bf16 instructions emulate
it slowly; on CUDA the default networks are too small to gain).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import numpy as np
import torch

PRECISIONS = ("auto", "fp32", "bf16")


@functools.cache
def cpu_has_bf16() -> bool:
    """The CPU executes bfloat16 matrix products natively (AVX-512 BF16 or AMX-BF16 on x86,
    BF16 on Arm), as listed in ``/proc/cpuinfo``."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set()
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_precision(value: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``precision=value`` on ``device``; ``None`` for float32.

    Raises:
        ValueError: ``value`` is not one of :data:`PRECISIONS`.
    """
    if value not in PRECISIONS:
        raise ValueError(f"precision={value} is not one of {', '.join(PRECISIONS)}")
    if value == "fp32":
        return None
    if value == "bf16":
        return torch.bfloat16
    return torch.bfloat16 if device.type == "cpu" and cpu_has_bf16() else None


@contextlib.contextmanager
def autocast(dtype: torch.dtype | None, device: torch.device) -> Iterator[None]:
    """``torch.autocast`` to ``dtype`` on ``device``'s type; nothing when ``dtype`` is ``None``."""
    if dtype is None:
        yield
        return
    with torch.autocast(device.type, dtype=dtype):
        yield


def flush_denormals() -> bool:
    """Flush subnormal float32 values to zero in this process's CPU arithmetic.

    Adam's moments of a ReLU unit that no longer fires decay geometrically below float32's
    smallest normal number (1.2e-38) and stay there; x86 CPUs compute on such subnormal values
    through a slow microcode path, which slowed long runs' optimiser steps several-fold
    (measured in docs/benchmarks/throughput.md). Flushed, such a value is 0: in
    Adam's step m / (√v + ε) with ε 1e-8 it contributed less than 1e-30.
    ``torch.set_flush_denormal`` (SSE3's flush-to-zero and denormals-are-zero): a setting of the
    whole process, made by a run's workspace and the online learner process (not on import),
    kept after the run as its thread count is. Code that needs subnormals later in the same
    process (Hypothesis draws floats only with them) calls ``torch.set_flush_denormal(False)``.

    NumPy's float limits are computed first: ``np.finfo`` measures the smallest subnormal
    number, and measured with subnormals flushed (as ``numpy.ma`` does on import, e.g. through
    pandas) it warns that it is zero; its cache keeps the values measured here.

    Returns:
        whether the CPU supports it (``False``: nothing changed).
    """
    for kind in (np.half, np.single, np.double, np.longdouble):
        np.finfo(kind)
    return bool(torch.set_flush_denormal(True))
