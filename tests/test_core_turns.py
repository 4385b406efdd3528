"""Runs take turns on the cores (themis/run/core_turns.py): a run alone never waits, more runs
than cores take turns and never hold one core together, a dead run's core is free, a core held
by a run that does not step costs the others at most ``patience``, and a workspace holds a core
only inside ``run``."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from tests.conftest import ROOT, TINY_PENDULUM
from themis.cli.train import make_workspace
from themis.run.core_turns import CoreTurns


def test_a_run_alone_takes_a_core_and_never_waits(tmp_path):
    turns = CoreTurns(cores=2, directory=tmp_path, turn=0.01)
    assert not turns.holding
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        turns.poll()
        assert turns.holding
    assert turns.handovers == 0 and turns.waited < 0.05
    turns.release()
    assert not turns.holding
    turns.close()
    turns.poll()  # closed: nothing happens
    assert not turns.holding


def test_more_runs_than_cores_take_turns_and_never_share_a_core(tmp_path):
    """Three runs on two cores for 1.5 s: each steps in turn, at most two at any time."""
    inside, overlap, lock = [0], [0], threading.Lock()
    steps = [0, 0, 0]
    runs = [CoreTurns(cores=2, directory=tmp_path, turn=0.03) for _ in range(3)]

    def run(i: int) -> None:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            runs[i].poll()
            with lock:
                inside[0] += 1
                overlap[0] = max(overlap[0], inside[0])
            time.sleep(0.001)  # a step
            steps[i] += 1
            with lock:
                inside[0] -= 1
        runs[i].release()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlap[0] <= 2
    assert all(r.handovers > 0 for r in runs), [r.handovers for r in runs]
    assert min(steps) > 0.4 * max(steps), steps  # each got its share
    for r in runs:
        r.close()


def test_a_dead_runs_core_is_free(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]);"
         "from themis.run.core_turns import CoreTurns;"
         "t = CoreTurns(cores=1, directory=sys.argv[2]); t.poll(); print('held', flush=True);"
         "time.sleep(60)", str(ROOT), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        turns = CoreTurns(cores=1, directory=tmp_path, patience=30.0)
        threading.Timer(0.3, holder.kill).start()
        start = time.monotonic()
        turns.poll()  # waits for the core until the holder dies
        assert turns.holding and 0.2 < time.monotonic() - start < 10
        turns.close()
    finally:
        holder.kill()
        holder.wait()


def test_a_core_held_without_stepping_costs_the_others_at_most_patience(tmp_path):
    stuck = CoreTurns(cores=1, directory=tmp_path)
    stuck.poll()  # holds the only core and never polls again
    turns = CoreTurns(cores=1, directory=tmp_path, patience=0.2, rest=30.0)
    start = time.monotonic()
    turns.poll()
    assert not turns.holding and 0.2 <= time.monotonic() - start < 2
    start = time.monotonic()
    for _ in range(100):  # resting: no more waiting
        turns.poll()
    assert time.monotonic() - start < 0.1
    stuck.close()
    turns.close()


def test_a_workspace_holds_a_core_only_inside_run(compose, tmp_path, monkeypatch):
    monkeypatch.setenv("THEMIS_THREADS", "1")
    ws = make_workspace(compose([*TINY_PENDULUM, "device=cpu"]), tmp_path / "on")
    assert ws.core_turns is not None
    seen = []
    poll = ws.core_turns.poll

    def watched() -> None:
        poll()
        seen.append(ws.core_turns.holding)

    monkeypatch.setattr(ws.core_turns, "poll", watched)
    ws.run(until=300)
    assert seen and all(seen) and not ws.core_turns.holding
    ws.finish()
    off = make_workspace(compose([*TINY_PENDULUM, "device=cpu", "core_turns=false"]),
                         tmp_path / "off")
    assert off.core_turns is None
    off.finish()
