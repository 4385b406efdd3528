"""torch_threads=auto: the measured rule, the banner, the contention governor."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import TINY_PENDULUM, launch
from themis.cli.train import make_workspace
from themis.run.threads import (
    ThreadGovernor,
    auto_threads,
    available_cores,
    choose_threads,
    other_load,
    round_threads,
)


@pytest.fixture(autouse=True)
def keep_torch_threads(monkeypatch):
    monkeypatch.delenv("THEMIS_THREADS", raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_auto_gives_the_default_sac_one_thread_and_its_rounds_the_cores(compose, tmp_path):
    torch.set_num_threads(2)
    ws = make_workspace(compose([]), tmp_path)  # the main job: HalfCheetah, SAC 2x128, batch 256
    cores = min(available_cores(), 4)
    assert (ws.thread_choice.threads, ws.thread_choice.adaptive) == (1, False)
    assert ws.thread_choice.round_threads == (cores if cores > 1 else 0)
    assert ws.thread_governor is None and torch.get_num_threads() == 1
    seen = []
    ws.learner.round = lambda *a, **k: seen.append(torch.get_num_threads())  # type: ignore
    with ws.round_threads() as used:
        ws.feedback_round()
    assert seen == [used] and used in (1, cores) and torch.get_num_threads() == 1


def test_round_threads_only_while_the_other_cores_are_free():
    choice = auto_threads(agent="sac", obs_kind="vector", device="cpu", hidden_dim=128,
                          batch_size=256, cores=2)
    assert (choice.threads, choice.round_threads) == (1, 2)
    torch.set_num_threads(1)
    cores = available_cores()
    for load, expected in ((0.0, min(2, cores)), (cores - 1.0, 1), (None, 1)):
        with round_threads(choice, measure=lambda interval, load=load: load) as used:
            assert used == expected == torch.get_num_threads()
        assert torch.get_num_threads() == 1
    wide = auto_threads(agent="sac", obs_kind="vector", device="cpu", hidden_dim=256,
                        batch_size=256, cores=2)
    assert (wide.threads, wide.round_threads, wide.adaptive) == (2, 0, True)
    torch.set_num_threads(2)
    with round_threads(wide, measure=lambda interval: pytest.fail("no reading needed")) as used:
        assert used == 2


def test_auto_gives_small_vector_ppo_one_thread_and_no_governor(compose, tmp_path):
    torch.set_num_threads(2)
    ws = make_workspace(compose(["domain=Box2d", "env=LunarLander-v3"]), tmp_path)
    assert (ws.thread_choice.threads, ws.thread_choice.adaptive) == (1, False)
    assert ws.thread_governor is None and torch.get_num_threads() == 1


def test_auto_gives_a_pixel_ppo_config_the_cores_with_a_governor(compose, tmp_path):
    ws = make_workspace(compose(["domain=ALE", "env=Breakout-v5"]), tmp_path)
    try:
        expected = min(available_cores(), 4)
        assert ws.thread_choice.threads == expected
        assert ws.thread_choice.adaptive == (expected > 1)
        assert (ws.thread_governor is not None) == (expected > 1)
        assert torch.get_num_threads() == expected
    finally:
        if ws.thread_governor is not None:
            ws.thread_governor.stop()


@pytest.mark.parametrize("agent, hidden, batch, threads", [
    ("ppo", 128, 256, 1), ("ppo", 256, 256, 2), ("ppo", 128, 1024, 2), ("ppo", 64, 64, 1),
    ("sac", 64, 64, 1), ("sac", 256, 256, 2)])
def test_wide_vector_networks_get_more_threads(agent, hidden, batch, threads):
    choice = auto_threads(agent=agent, obs_kind="vector", device="cpu", hidden_dim=hidden,
                          batch_size=batch, cores=2)
    assert choice.threads == threads and choice.adaptive == (threads > 1)


def test_cuda_one_core_and_fixed_counts():
    assert auto_threads(agent="ppo", obs_kind="pixels", device="cuda", hidden_dim=512,
                        batch_size=256, cores=16).threads == 1
    assert auto_threads(agent="ppo", obs_kind="pixels", device="cpu", hidden_dim=512,
                        batch_size=256, cores=1) .adaptive is False
    assert auto_threads(agent="ppo", obs_kind="grid", device="cpu", hidden_dim=64,
                        batch_size=256, cores=16).threads == 4
    fixed = choose_threads("3", agent="sac", obs_kind="vector", device="cpu", hidden_dim=128,
                           batch_size=256)
    assert (fixed.threads, fixed.adaptive) == (3, False)
    assert choose_threads(0, agent="sac", obs_kind="pixels", device="cpu", hidden_dim=128,
                          batch_size=256).threads == 0


def test_themis_threads_overrides_the_key(monkeypatch):
    monkeypatch.setenv("THEMIS_THREADS", "1")
    choice = choose_threads("auto", agent="ppo", obs_kind="pixels", device="cpu", hidden_dim=512,
                            batch_size=256)
    assert (choice.threads, choice.adaptive) == (1, False)


def test_the_banner_states_the_thread_count(compose, tmp_path, capsys):
    ws = make_workspace(compose(TINY_PENDULUM), tmp_path)
    if ws.thread_governor is not None:
        ws.thread_governor.stop()
    ws.banner()
    out = capsys.readouterr()
    expected = min(available_cores(), 4)
    rounds = f"; feedback rounds on {expected} while the cores are free" if expected > 1 else ""
    assert f"1 thread (auto: small SAC networks{rounds})" in out.out + out.err


def test_a_bad_torch_threads_is_one_line_and_exit_2(tmp_path):
    proc = launch("themis_train.sh", "torch_threads=two", f"hydra.run.dir={tmp_path}",
                  threads=None)
    assert proc.returncode == 2
    assert "torch_threads=two must be auto" in proc.stderr and "Traceback" not in proc.stderr


def test_the_governor_drops_to_one_thread_under_load_and_restores_when_free():
    loads = iter([2.0, 1.0, 0.1, 0.1, 0.1])
    targets = []  # the governor's target after each reading

    torch.set_num_threads(2)
    governor = ThreadGovernor(2, cores=2)

    def fake(interval):
        targets.append(governor.target)
        return next(loads, None)  # None: no /proc/stat, the watcher stops

    governor.measure = fake
    governor.start()
    governor._thread.join(timeout=5)
    # targets before each reading: two busy readings give 1; two calm ones restore 2
    assert targets == [2, 1, 1, 1, 2, 2]
    governor.poll()
    assert torch.get_num_threads() == 2 and governor.switches == 0
    governor.target = 1
    governor.poll()
    assert torch.get_num_threads() == 1 and governor.switches == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_other_load_sees_a_busy_process():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\n"
                             "while time.time() - t < 3: pass"])
    try:
        time.sleep(0.3)
        assert other_load(1.0) > 0.6  # the spinning process keeps about one core busy
    finally:
        busy.kill()
        busy.wait()


def test_the_governor_leaves_room_for_others_on_a_bigger_machine():
    governor = ThreadGovernor(4, cores=16)  # 12 cores to spare: others may use 12.5 of them
    assert governor.busy == pytest.approx(12.5) and governor.free == pytest.approx(12.3)
