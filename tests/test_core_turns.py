"""Runs take turns on the cores (themis/run/core_turns.py): a run alone never waits, more runs
than cores take turns and never hold one core together, a dead run's core is free, a core held
by a run that does not step costs the others at most ``patience``, and a workspace holds a core
only inside ``run``."""

from __future__ import annotations

import fcntl
import stat
import subprocess
import sys
import threading
import time

import torch

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


def test_a_dead_waiting_runs_pipe_is_removed_and_a_stale_one_replaced(tmp_path):
    """A run killed while it waited leaves its pipe; the next run giving a core up removes it
    (nobody reads it). A file left under a new run's pipe name (a dead run with the same pid)
    is replaced by a pipe, so the waiting run does not spin on a regular file."""
    holder = CoreTurns(cores=1, directory=tmp_path)
    holder.poll()
    waiter = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]);"
         "from themis.run.core_turns import CoreTurns;"
         "CoreTurns(cores=1, directory=sys.argv[2], patience=60).poll()",
         str(ROOT), str(tmp_path)])
    try:
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("wake-*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(list(tmp_path.glob("wake-*"))) == 1
    finally:
        waiter.kill()
        waiter.wait()
    holder.release()  # wakes the waiting runs: the dead one's pipe goes
    assert not list(tmp_path.glob("wake-*"))
    holder.poll()
    fresh = CoreTurns(cores=1, directory=tmp_path, patience=0.3, rest=30.0)
    fresh._wake_path.write_text("a regular file")
    start = time.monotonic()
    fresh.poll()  # waits out its patience on a real pipe
    assert not fresh.holding and 0.3 <= time.monotonic() - start < 2
    assert stat.S_ISFIFO(fresh._wake_path.stat().st_mode)
    fresh.close()
    holder.close()


def test_the_run_that_waits_longest_gets_the_next_free_core(tmp_path):
    """Runs waiting for one core get it in the order they started waiting (woken together,
    the same run won every race and the other waited out its patience and left the turns)."""
    holder = CoreTurns(cores=1, directory=tmp_path)
    holder.poll()
    first, second = (CoreTurns(cores=1, directory=tmp_path, patience=30.0) for _ in range(2))
    first.LOOK = second.LOOK = 10.0  # no safety looks: only the wake-ups decide
    order: list[str] = []

    def wait(run: CoreTurns, name: str) -> None:
        run.poll()
        order.append(name)
        time.sleep(0.2)  # a turn
        run.release()

    threads = [threading.Thread(target=wait, args=(second, "second"))]
    threads[0].start()
    time.sleep(0.1)
    threads.append(threading.Thread(target=wait, args=(first, "first")))
    threads[1].start()  # starts waiting later, in the other name order
    time.sleep(0.1)
    holder.release()
    for t in threads:
        t.join()
    assert order == ["second", "first"]
    for run in (holder, first, second):
        run.close()
    assert not list(tmp_path.glob("*wake-*"))


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


def test_a_round_keeps_its_core_with_a_synthetic_teacher_and_gives_it_up_for_people(
        compose, tmp_path, monkeypatch):
    """With a synthetic teacher the reward model trains on the core the run holds and takes
    turns between its epochs (given up, the round computed beside the runs that took the
    cores); where a person may answer, the core is given up for the round."""
    monkeypatch.setenv("THEMIS_THREADS", "1")
    ws = make_workspace(compose([*TINY_PENDULUM, "device=cpu"]), tmp_path)
    turns, learner = ws.core_turns, ws.learner
    assert turns is not None and learner is not None
    held, hooked, looked_from = [], [], set()
    train, between = learner.trainer.train, ws._between_batches

    def watched(*args, **kwargs):
        held.append(turns.holding)
        hooked.append(learner.model.between_chunks is not None
                      and learner.selector.between_chunks is not None)
        return train(*args, **kwargs)

    def watched_between() -> None:
        looked_from.add(sys._getframe(1).f_code.co_name)
        between()

    monkeypatch.setattr(learner.trainer, "train", watched)
    monkeypatch.setattr(ws, "_between_batches", watched_between)
    ws.run(until=800)  # the first round (step 400) and one more (700)
    assert len(held) >= 2 and all(held) and all(hooked)
    # turns between the reward model's minibatch steps and the chunks of the relabel
    assert {"train_epoch", "predict_members"} <= looked_from
    # the hooks are the round's only: a model or selector pickled later carries no workspace
    assert learner.model.between_chunks is None and learner.selector.between_chunks is None
    polls, poll = [], turns.poll
    monkeypatch.setattr(turns, "poll", lambda: polls.append(1))
    assert learner.trainer.between_batches is not None
    learner.trainer.between_batches()  # takes turns between minibatches
    assert polls == [1]
    monkeypatch.setattr(turns, "poll", poll)
    turns.poll()
    assert turns.holding
    monkeypatch.setattr(learner, "channel", object())  # e.g. the terminal or the web page
    with ws.round_threads():
        assert not turns.holding
    ws.finish()


def test_a_round_takes_more_cores_only_when_no_other_run_holds_or_waits_for_one(tmp_path):
    """The cores' locks decide a round's extra threads: two runs entering rounds at once
    (each would see the other idle, measuring load) get one core each; a run alone gets
    both, and gives them up when another run waits or the round ends."""
    a, b = CoreTurns(cores=2, directory=tmp_path), CoreTurns(cores=2, directory=tmp_path)
    a.poll()
    b.poll()
    assert a.holding and b.holding
    assert a.take_more(1) == 0 and b.take_more(1) == 0 and a.more == b.more == 0
    b.release()
    assert a.take_more(1) == 1 and a.more == 1
    c = CoreTurns(cores=2, directory=tmp_path)
    assert c._try_slots() is None  # both cores are a's
    a.give_more_back()
    free = c._try_slots()
    assert free is not None
    fcntl.flock(free, fcntl.LOCK_UN)
    fcntl.flock(c._waiting, fcntl.LOCK_SH)  # c waits in line: no more cores for a round
    assert a.take_more(1) == 0 and a.more == 0
    fcntl.flock(c._waiting, fcntl.LOCK_UN)
    assert a.take_more(1) == 1
    a.release()  # the end of the run's turn frees every core it held
    assert a.more == 0 and not a.holding and c._try_slots() is not None
    for turns in (a, b, c):
        turns.close()


def test_a_round_beside_other_runs_stays_on_one_thread(compose, tmp_path, monkeypatch):
    """A run whose round could use every core (``round_threads``) keeps one thread while the
    other runs of this user step on the other cores; alone, its threads match the cores it
    took, and both are back to one after the round."""
    monkeypatch.delenv("THEMIS_THREADS", raising=False)
    before = torch.get_num_threads()
    ws = make_workspace(compose([*TINY_PENDULUM, "device=cpu"]), tmp_path)
    turns = ws.core_turns
    assert turns is not None and ws.thread_choice.threads == 1
    others = [CoreTurns() for _ in range(turns.cores - 1)]  # stepping on every other core
    try:
        for other in others:
            other.poll()
            assert other.holding
        with ws.round_threads() as used:
            assert used == 1 == torch.get_num_threads() and turns.more == 0 and turns.holding
    finally:
        for other in others:
            other.close()
    try:
        with ws.round_threads() as used:  # alone (other programs permitting): more cores
            assert torch.get_num_threads() == used == turns.more + 1
            assert used <= max(1, ws.thread_choice.round_threads)
        assert torch.get_num_threads() == 1 and turns.more == 0 and not turns.holding
    finally:
        ws.finish()
        torch.set_num_threads(before)


def test_a_waiting_run_sleeps_until_a_core_is_given_up_and_takes_it_at_once(tmp_path):
    """The waiting run sleeps on its pipe through the holder's 0.4 s turn (no looks every few
    ms, each pre-empting a stepping run), is woken when the holder gives its core up, takes it
    within milliseconds, and its pipe is gone after ``close``."""
    holder = CoreTurns(cores=1, directory=tmp_path, turn=0.4, patience=0.2, rest=30.0)
    holder.poll()
    waiter = CoreTurns(cores=1, directory=tmp_path, patience=30.0)
    tries, try_slots = [0], waiter._try_slots
    released: list[float] = []
    release = holder.release

    def counted() -> int | None:
        tries[0] += 1
        return try_slots()

    def timed_release() -> None:
        released.append(time.monotonic())
        release()

    waiter._try_slots = counted  # type: ignore[method-assign]
    holder.release = timed_release  # type: ignore[method-assign]

    def step() -> None:  # the holder steps until it has handed its core over
        while holder.handovers == 0:
            holder.poll()
            time.sleep(0.003)  # a step

    t = threading.Thread(target=step)
    start = time.monotonic()
    t.start()
    waiter.poll()  # waits for the core
    got = time.monotonic()
    t.join()  # the holder waited out its patience (the waiter does not step)
    assert waiter.holding and holder.handovers == 1
    assert 0.35 < got - start < 0.9
    assert tries[0] <= 9, tries  # a safety look every 0.1 s; looks every 5 ms: 80
    assert released and 0 <= got - released[0] < 0.02
    assert waiter._wake_path.exists()  # (the holder's too: it waited out its patience)
    holder.close()
    waiter.close()
    assert not list(tmp_path.glob("*wake-*"))


def test_a_woken_run_that_finds_no_free_core_sleeps_again(tmp_path):
    """A wake-up whose core another run took first (here: a wake with no core free) puts the
    waiting run back to sleep; it does not spin on its pipe (a pipe whose last writer closed
    reads as ready for ever)."""
    holder = CoreTurns(cores=1, directory=tmp_path)
    holder.poll()
    waiter = CoreTurns(cores=1, directory=tmp_path, patience=0.6, rest=30.0)
    tries, try_slots = [0], waiter._try_slots

    def counted() -> int | None:
        tries[0] += 1
        return try_slots()

    waiter._try_slots = counted  # type: ignore[method-assign]
    for delay in (0.1, 0.2):
        threading.Timer(delay, holder._wake_waiting).start()
    waiter.poll()  # woken twice, never finds the core, waits out its patience
    assert not waiter.holding
    assert 3 <= tries[0] <= 11, tries  # 2 at the start, 2 wakes, a safety look per 0.1 s
    holder.close()
    waiter.close()


def test_a_pipe_removed_by_a_tmp_cleaner_is_made_again(tmp_path):
    """The waiting run's pipe deleted between two waits (e.g. by a /tmp cleaner): the next
    wait makes a new one and is still woken when the core is given up."""
    holder = CoreTurns(cores=1, directory=tmp_path, patience=0.1, rest=30.0)
    waiter = CoreTurns(cores=1, directory=tmp_path, patience=30.0)
    waiter.LOOK = 10.0  # only a wake-up can end the wait in time
    holder.poll()
    threading.Timer(0.1, holder.release).start()
    waiter.poll()  # first wait: makes the pipe
    waiter.release()
    waiter._wake_path.unlink()
    holder._resting_until = 0.0
    holder.poll()
    released: list[float] = []

    def give_up() -> None:
        released.append(time.monotonic())
        holder.release()

    threading.Timer(0.2, give_up).start()
    waiter.poll()
    assert waiter.holding and time.monotonic() - released[0] < 0.5
    assert stat.S_ISFIFO(waiter._wake_path.stat().st_mode)
    waiter.close()
    holder.close()


def test_a_governed_run_takes_turns_and_ppo_looks_between_minibatches(compose, tmp_path,
                                                                     monkeypatch):
    """A run whose governor picks between several threads alone and one beside other runs (CNN
    encoders, wide networks) takes turns too; PPO's update, seconds long on pixels, looks for
    waiting runs after every minibatch."""
    from themis.run import workspace as workspace_module
    from themis.run.threads import ThreadChoice

    monkeypatch.delenv("THEMIS_THREADS", raising=False)
    monkeypatch.setattr(workspace_module, "choose_threads",
                        lambda *a, **k: ThreadChoice(2, "test: a CNN", adaptive=True))
    cfg = compose(["domain=Classic", "env=CartPole-v1", "learn_reward=false", "device=cpu",
                   "num_train_steps=256", "num_seed_steps=0", "num_unsup_steps=0",
                   "ppo.num_envs=4", "ppo.num_steps=32", "segment=8", "ppo.update_epochs=2",
                   "ppo.num_minibatches=4", "eval_frequency=100000", "num_eval_episodes=1",
                   "log_frequency=1024"])
    ws = make_workspace(cfg, tmp_path)
    try:
        assert ws.thread_governor is not None and ws.core_turns is not None
        inside, polls = [False], []
        poll, update = ws.core_turns.poll, ws.agent.update

        def watched_poll() -> None:
            poll()
            polls.append((inside[0], ws.core_turns.holding))

        def watched_update(rollout):
            inside[0] = True
            try:
                return update(rollout)
            finally:
                inside[0] = False

        monkeypatch.setattr(ws.core_turns, "poll", watched_poll)
        monkeypatch.setattr(ws.agent, "update", watched_update)
        ws.run(until=256)
        updates = 256 // (4 * 32)
        # every minibatch of every epoch of every update, each with the core held
        assert sum(1 for during, _ in polls if during) == updates * 2 * 4
        assert all(held for _, held in polls) and not ws.core_turns.holding
    finally:
        ws.finish()
    monkeypatch.setattr(workspace_module, "choose_threads",
                        lambda *a, **k: ThreadChoice(2, "test: pinned"))  # not adaptive
    pinned = make_workspace(cfg, tmp_path / "pinned")
    assert pinned.core_turns is None  # a pinned thread count runs on its own
    pinned.finish()
