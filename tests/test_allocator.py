"""glibc's malloc thresholds (themis/core/allocator.py): a round's freed activations stay mapped."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from themis.core import allocator

# Epochs of a feedback round in small: six 16 MB tensors allocated and freed, 22 times over.
EPOCHS = textwrap.dedent("""
    import resource, sys
    import torch
    from themis.core.allocator import keep_freed_memory
    applied = keep_freed_memory() if sys.argv[1] == "keep" else None
    for epoch in range(22):
        if epoch == 2:  # the first epochs map the memory; then count
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        held = [torch.ones(4 << 20) for _ in range(6)]
        del held
    print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or os.environ.get(
    "MALLOC_TRIM_THRESHOLD_") is not None, reason="glibc's mallopt (Linux)")


def epochs_faults(mode: str, **env: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", EPOCHS, mode], capture_output=True, text=True,
                         check=True, env={**os.environ, **env}).stdout.split()
    return out[0], int(out[1])


@glibc
def test_freed_tensors_are_not_faulted_in_again() -> None:
    applied, kept = epochs_faults("keep")
    assert applied == "True"
    # after two epochs, kept: no tensor's pages or one or two (0, 4,096 or 8,192 faults over
    # 20 epochs)
    assert kept <= 4 * 4096
    # freed memory given back to the kernel is faulted in again, every page of every epoch. By
    # default glibc does so when the freed tensors end at the heap's top (28,672 to 486,784
    # faults over the same 20 epochs, or 8,192 when something small lies above them): the
    # contrast is measured with every tensor from mmap, returned at each free
    _, returned = epochs_faults("default", MALLOC_MMAP_THRESHOLD_="65536")
    assert returned >= 20 * 6 * 4096 * 9 // 10


@glibc
def test_a_users_own_thresholds_win() -> None:
    applied, _ = epochs_faults("keep", MALLOC_TRIM_THRESHOLD_="0")
    assert applied == "False"
    applied, _ = epochs_faults("keep", GLIBC_TUNABLES="glibc.malloc.trim_threshold=0")
    assert applied == "False"


def test_without_a_c_library_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in allocator.USER_SETTINGS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: None)
    assert allocator.keep_freed_memory.__wrapped__() is False  # type: ignore[attr-defined]
