"""Where a recorded result came from, in one place: each row a benchmark writes into
``results/`` carries the run's own date, commit, machine, command and wall time.

A benchmark that records (``--record CSV``) builds its rows with :func:`provenance` and writes
them with :func:`merge_rows`; ``scripts/results_tables.py`` reads the same files back into the
front pages' tables. The columns are the ones a reader of a results table needs to judge and
repeat a number (DESIGN.md, "Long runs": record each finished run's row, with its own date,
commit, machine, command and wall time, as soon as it ends):

- ``date``: when the run finished, UTC, ISO 8601 to the second (``2026-12-07T11:30:05Z``);
- ``commit``: ``git rev-parse --short HEAD`` of the checkout that ran, ``-dirty`` appended
  when tracked files differed from it (what ran is then not exactly that commit);
- ``machine``: the CPU model from ``/proc/cpuinfo`` and the core count;
- ``command``: what ran, as a user types it (``python benchmarks/x.py --seeds 0 1``);
- ``wall_s``: the run's own wall-clock seconds.

The benchmarks are files, not a package: a script imports this module after putting
``benchmarks/`` on ``sys.path`` (it is there already when a benchmark runs as a script).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PROVENANCE = ("date", "commit", "machine", "command", "wall_s")
"""The provenance columns of every recorded row (:func:`provenance`), in this order."""


def utc_now() -> str:
    """The current time in UTC, ISO 8601 to the second: ``2026-12-07T11:30:05Z``."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def commit(checkout: Path = ROOT, paths: tuple[str, ...] = ()) -> str:
    """The short commit of ``checkout`` (``git rev-parse --short HEAD``), with ``-dirty`` when
    tracked files differ from it (``git status --porcelain --untracked-files=no``; only those
    under ``paths`` when given); ``unknown`` outside a git checkout."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, check=True,
                             capture_output=True, text=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                  "--", *paths], cwd=checkout, check=True,
                                 capture_output=True, text=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"
    return sha + ("-dirty" if changed else "")


def machine(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU model (``model name`` of ``/proc/cpuinfo``; ``platform.processor()`` elsewhere),
    the core count and, on Linux, the widest vector instructions it has — one model name covers
    hosts with and without AVX-512, which differ in speed and in what ``precision=auto`` picks:
    ``AMD EPYC, 2 cores, AVX-512 BF16`` or ``AMD EPYC, 2 cores, AVX2``."""
    model, flags = platform.processor() or platform.machine(), set[str]()
    with contextlib.suppress(OSError):
        cpu = cpuinfo.read_text().split("\n\n", 1)[0]  # the first processor
        fields = {key.strip(): value.strip() for key, value in
                  (line.split(":", 1) for line in cpu.splitlines() if ":" in line)}
        model = fields.get("model name", model)
        flags = set(fields.get("flags", "").split())
    isa = ("AMX" if "amx_bf16" in flags else "AVX-512 BF16" if "avx512_bf16" in flags
           else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "")
    return f"{model}, {os.cpu_count()} cores" + (f", {isa}" if isa else "")


def command(script: str | Path, argv: list[str] | None = None) -> str:
    """The command that ran, as a user types it: ``python <script relative to the repository>``
    and the arguments (``sys.argv[1:]`` unless ``argv`` is given), shell-quoted."""
    path = Path(script).resolve()
    with contextlib.suppress(ValueError):
        path = path.relative_to(ROOT)
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", str(path), *args])


def provenance(wall_s: float, ran: str, checkout: Path = ROOT) -> dict[str, Any]:
    """The provenance columns (:data:`PROVENANCE`) of a row finished now: the date, the commit of
    ``checkout``, this machine, the command ``ran`` (:func:`command`) and the run's ``wall_s``
    (rounded to 0.1 s)."""
    return {"date": utc_now(), "commit": commit(checkout), "machine": machine(),
            "command": ran, "wall_s": round(float(wall_s), 1)}


def note_run(run: Path, ran: str, date: str | None = None, sha: str | None = None) -> None:
    """Write or extend ``<run>/provenance.json`` for a start of a run: the date (UTC) and command
    it first started with, this machine, and the commit of each start (a resumed run appends
    its commit), so that a later record names the run's own provenance, not the tabling
    invocation's. ``date`` and ``sha``: the start's, when noted after it (default: now, and
    :func:`commit` of this checkout)."""
    path = run / "provenance.json"
    sha = sha or commit()
    if path.is_file():
        prov = json.loads(path.read_text())
        if sha not in prov["commits"]:
            prov["commits"].append(sha)
    else:
        prov = {"date": date or utc_now(), "commits": [sha], "machine": machine(),
                "command": ran}
    run.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(prov))


def run_provenance(run: Path) -> dict[str, Any] | None:
    """``<run>/provenance.json`` (:func:`note_run`) with the run's wall seconds over all its
    starts (``<run>/timing.json``, :func:`add_wall`) as ``wall_s``; ``None`` without one."""
    path = run / "provenance.json"
    if not path.is_file():
        return None
    prov = json.loads(path.read_text())
    timing = run / "timing.json"
    prov["wall_s"] = json.loads(timing.read_text())["wall_s"] if timing.is_file() \
        else float("nan")
    return prov


def add_wall(run: Path, wall_s: float, cpu_s: float = 0.0) -> None:
    """Add one start's wall (and CPU) seconds to ``<run>/timing.json`` (a run resumed
    several times sums them)."""
    path = run / "timing.json"
    spent = json.loads(path.read_text()) if path.is_file() else {"wall_s": 0.0, "cpu_s": 0.0}
    spent["wall_s"] += wall_s
    spent["cpu_s"] += cpu_s
    if run.is_dir():
        path.write_text(json.dumps(spent))


def curve_text(points: dict[int, float] | list[tuple[int, float]], digits: int = 1) -> str:
    """A learning curve as one compact column: ``"10000:47.0 20000:599.3"`` (step:value, steps
    ascending), the form of ``bench_methods``' ``curve``."""
    items = sorted(points.items() if isinstance(points, dict) else points)
    return " ".join(f"{int(step)}:{float(value):.{digits}f}" for step, value in items)


def parse_curve(text: str) -> dict[int, float]:
    """:func:`curve_text` read back: ``{step: value}``."""
    return {int(step): float(value) for step, value in
            (point.split(":") for point in str(text).split())}


def merge_rows(path: Path, rows: list[dict[str, Any]], key: list[str]) -> pd.DataFrame:
    """Write ``rows`` into the CSV ``path`` (made when missing): a kept row with the same values
    in the ``key`` columns is replaced by the new one (a run recorded again), every other kept
    row stays. Rows are sorted by ``key``; columns are the union, old ones first.

    Returns:
        The table written.

    Raises:
        ValueError: no rows, or a row without one of the ``key`` columns.
    """
    if not rows:
        raise ValueError(f"merge_rows: no rows to write into {path}")
    new = pd.DataFrame(rows)
    missing = [k for k in key if k not in new]
    if missing:
        raise ValueError(f"merge_rows: the rows lack the key column(s) {missing}")
    old = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=list(new.columns))
    merged = pd.concat([old, new], ignore_index=True).drop_duplicates(key, keep="last")
    merged = merged.sort_values(key, kind="stable")
    path.parent.mkdir(parents=True, exist_ok=True)
    merged.to_csv(path, index=False)
    return merged
