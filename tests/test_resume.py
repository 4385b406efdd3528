"""Checkpoints and resume: a SIGKILL loses no label, duplicates nothing, counters continue."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import ROOT, TINY_PENDULUM, launch
from themis.reward import PreferenceDataset
from themis.run.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    truncate_csv,
)


def test_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    save_checkpoint({"step": 100, "w": torch.ones(3)}, tmp_path)
    save_checkpoint({"step": 200, "w": torch.zeros(3)}, tmp_path)
    state, path = load_checkpoint(tmp_path)
    assert state["step"] == 200 and path.name == "state.pt"
    data = (tmp_path / "state.pt").read_bytes()
    (tmp_path / "state.pt").write_bytes(data[: len(data) // 2])  # truncated by a crash
    state, path = load_checkpoint(tmp_path)
    assert state["step"] == 100 and path.name == "state.prev.pt"
    assert "corrupt" in caplog.text
    (tmp_path / "state.prev.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        load_checkpoint(tmp_path)


def test_truncate_csv_drops_rows_after_the_checkpoint_and_torn_lines(tmp_path):
    path = tmp_path / "eval.csv"
    path.write_text("step,episode_reward\r\n100,1.0\r\n200,2.0\r\n300,3.0\r\n40")
    assert truncate_csv(path, 200) == 2
    assert pd.read_csv(path)["step"].tolist() == [100, 200]


def _pair_keys(data: PreferenceDataset) -> set[bytes]:
    return {data.observations[i].tobytes() for i in range(len(data))}


@pytest.mark.slow
@pytest.mark.parametrize("agent", [
    [],
    ["domain=Box2d", "env=LunarLander-v3", "ppo.num_envs=2", "ppo.num_steps=32"],
], ids=["sac", "ppo"])
def test_sigkill_then_resume_continues_the_run(tmp_path, agent):
    run = tmp_path / "run"
    overrides = [*TINY_PENDULUM, "num_train_steps=2400", "max_feedback=60",
                 "checkpoint_frequency=200", "log_frequency=200", *agent,
                 f"hydra.run.dir={run}"]
    env = {**os.environ, "THEMIS_THREADS": "1"}
    proc = subprocess.Popen([str(ROOT / "themis_train.sh"), *overrides], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (run / "checkpoints" / "state.pt.sha256").exists():  # first full checkpoint
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(random.Random(len(agent)).uniform(0.5, 2.5))  # a fixed kill point per agent
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = pd.read_csv(run / "train.csv")["step"].max() if (run / "train.csv").exists() \
        else 0
    assert killed_at < 2400, "the run ended before it was killed: make it longer"

    resumed = launch("themis_train.sh", f"resume={run}")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout

    evals = pd.read_csv(run / "eval.csv")
    # no duplicate, none missing: SAC evaluates at multiples of 600, PPO after the rollout
    # (64 steps) that crosses one
    expected = [600, 1200, 1800, 2400] if not agent else [640, 1216, 1856, 2432]
    assert evals["step"].tolist() == expected
    rounds = pd.read_csv(run / "reward.csv")
    assert rounds["round"].tolist() == list(range(1, 7))
    assert rounds["total_feedback"].tolist() == [10, 20, 30, 40, 50, 60]
    train = pd.read_csv(run / "train.csv")
    assert train["step"].is_monotonic_increasing and train["episode"].is_unique
    assert train["step"].max() <= expected[-1]
    prefs = PreferenceDataset.load(run / "preferences")
    assert len(prefs) == rounds["labeled_feedback"].iloc[-1] == 60
    assert len(_pair_keys(prefs)) == 60  # no labelled pair duplicated
    assert np.isin(prefs.labels[:60], (0.0, 0.5, 1.0)).all()


def test_resume_keeps_later_human_labels_and_drops_later_synthetic_ones(compose, tmp_path):
    from themis.builder import make_workspace

    overrides = [*TINY_PENDULUM, "checkpoint_frequency=100000"]
    ws = make_workspace(compose(overrides), tmp_path)
    ws.run(until=800)  # rounds at steps 400 and 700, each followed by a full checkpoint
    ws.logger.close()
    state, _ = load_checkpoint(tmp_path / "checkpoints")
    counted = state["dataset_size"]
    assert counted == len(ws.learner.dataset) == 20 and state["total_feedback"] == 20
    # labels that reached the disk after the checkpoint: one synthetic, one from a person
    data = PreferenceDataset.load(tmp_path / "preferences", capacity=counted + 2)
    for i, labeler in ((0, "synthetic(beta=-1.0)"), (1, "alice")):
        data.labels[counted + i] = 1.0
        data.observations[counted + i] = data.observations[i] + 100.0  # a new pair
        data.labelers[counted + i] = labeler
    data.size = counted + 2
    data.save(tmp_path / "preferences")

    resumed = make_workspace(compose([*overrides, "resume=true"]), tmp_path)
    assert resumed.step == state["step"]
    assert len(resumed.learner.dataset) == counted + 1
    assert resumed.learner.dataset.labelers[counted] == "alice"
    np.testing.assert_array_equal(resumed.learner.dataset.observations[counted],
                                  data.observations[counted + 1])
    assert resumed.total_feedback == resumed.labeled_feedback == counted + 1
    resumed.logger.close()


@pytest.mark.slow
def test_resume_with_the_original_command_line_and_a_longer_budget(tmp_path):
    """Config groups on the command line (domain=, teacher=, and ``method=surf``, whose config
    file includes its per-domain settings through a Hydra defaults list) are accepted again on
    resume; the group's keys and later overrides keep their composed values, new keys apply on
    top. (A method's defaults list ended the resume with a ConfigKeyError on ``defaults``,
    losing every interrupted SURF, QPA, RIME or MRN run.)"""
    run = tmp_path / "run"
    first = [*TINY_PENDULUM, "teacher=mistake", "teacher_eps_mistake=0.2", "method=surf",
             "surf.inv_label_ratio=2", f"hydra.run.dir={run}"]
    done = launch("themis_train.sh", *first)
    assert done.returncode == 0, done.stderr[-2000:]
    longer = [o for o in first if not o.startswith("num_train_steps=")]
    resumed = launch("themis_train.sh", *longer, "num_train_steps=1800", "resume=true")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    cfg = OmegaConf.load(run / "config.yaml")
    assert cfg.teacher_eps_mistake == 0.2 and cfg.teacher_beta == -1
    assert cfg.surf.enabled and cfg.surf.inv_label_ratio == 2 and cfg.feed_type == 1
    assert cfg.env == "Pendulum-v1" and cfg.num_train_steps == 1800
    assert pd.read_csv(run / "eval.csv")["step"].tolist() == [600, 1200, 1800]


@pytest.mark.slow
def test_a_run_killed_after_its_last_evaluation_resumes_and_ends(tmp_path):
    """The last evaluation writes agent.pt at num_train_steps before the run's end gathers the
    last answers and writes the final checkpoint: a run killed in between is no finished run
    (resume= was refused with "the run had finished", leaving web answers out of
    preferences/). It resumes from its last checkpoint and ends; then it is finished."""
    from themis.core.safe_loading import safe_load
    from themis.run.hints import resume_problem

    run = tmp_path / "run"
    done = launch("themis_train.sh", *TINY_PENDULUM, "checkpoint_frequency=500",
                  f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-2000:]
    ckpt = run / "checkpoints"
    agent = safe_load(ckpt / "agent.pt")
    assert agent["finished"] is True and agent["step"] == 1200
    assert "the run had finished (step 1200" in (resume_problem(run, []) or "")
    # as a kill after the evaluation at step 1200 leaves it: its agent.pt, the checkpoint of 1000
    torch.save({**agent, "finished": False}, ckpt / "agent.pt")
    for name in ("state.pt", "state.pt.sha256"):
        (ckpt / name).unlink()
    assert resume_problem(run, []) is None
    resumed = launch("themis_train.sh", f"resume={run}")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and "step 1000" in resumed.stdout
    assert safe_load(ckpt / "agent.pt")["finished"] is True
    assert pd.read_csv(run / "eval.csv")["step"].tolist() == [600, 1200]
    assert "the run had finished" in (resume_problem(run, []) or "")


def test_a_checkpoint_is_read_onto_the_cpu_whatever_the_run_device(compose, tmp_path):
    """A run on CUDA read its checkpoint onto the GPU, and torch refused the CPU generator's
    state from there ("RNG state must be a torch.ByteTensor"): resume=... device=cuda failed.
    The meta device stands in for the GPU here; modules and optimisers copy to their device."""
    from themis.builder import make_workspace
    from themis.run.checkpoint import resume_state

    ws = make_workspace(compose([*TINY_PENDULUM, "checkpoint_frequency=100000"]), tmp_path)
    ws.run(until=300)
    ws.maybe_checkpoint(force=True)
    ws.logger.close()
    ws.device = torch.device("meta")  # as if the run were on another device than the CPU
    state, _ = resume_state(ws.run_dir, ws.facts.env_id)
    devices = {t.device.type for t in _tensors(state)}
    assert devices == {"cpu"}, devices
    ws.load_state_dict(state)  # restores the global generators from the CPU tensors
    assert ws.step == state["step"] == 300


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def test_resume_from_a_checkpoint_with_no_label_keeps_the_labels_given_after_it(compose,
                                                                                 tmp_path):
    """A checkpoint written before the first round counts 0 pairs; a person's terminal labels
    saved after it are kept and counted on resume, and stay on disk at the next save."""
    from themis.agents.buffers import SegmentPairs
    from themis.builder import make_workspace

    overrides = [*TINY_PENDULUM, "checkpoint_frequency=300"]
    ws = make_workspace(compose(overrides), tmp_path)
    ws.run(until=350)  # a checkpoint at step 300, before the first round (step 400)
    ws.logger.close()
    state, _ = load_checkpoint(tmp_path / "checkpoints")
    assert state["dataset_size"] == 0
    rng = np.random.default_rng(0)
    given = PreferenceDataset(2, 20, 3, 1)  # two answers of a person, saved as given
    given.add(SegmentPairs(rng.normal(size=(2, 2, 20, 3)).astype(np.float32),
                           rng.uniform(-1, 1, (2, 2, 20, 1)).astype(np.float32),
                           np.zeros((2, 2, 20), np.float32), np.zeros((2, 2), np.int64)),
              np.array([0.0, 1.0]), labeler="human:alice")
    given.save(tmp_path / "preferences")

    resumed = make_workspace(compose([*overrides, "resume=true"]), tmp_path)
    data = resumed.learner.dataset
    assert len(data) == 2 and list(data.labelers[:2]) == ["human:alice"] * 2
    np.testing.assert_array_equal(data.observations[:2], given.observations[:2])
    assert resumed.total_feedback == resumed.labeled_feedback == 2
    resumed.learner.dataset.save(tmp_path / "preferences")  # the next save keeps them
    assert len(PreferenceDataset.load(tmp_path / "preferences")) == 2
    resumed.logger.close()


def _crash_at(monkeypatch, k: int) -> list[int]:
    """Make the ``k``-th ``os.replace`` from now on raise (a crash before that rename)."""
    real, calls = os.replace, [0]

    def replace(src, dst, *args, **kwargs):
        calls[0] += 1
        if calls[0] == k + 1:
            raise OSError("simulated crash")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    return calls


class _SignalsWhilePickled:
    """Sends ``signum`` to this process while ``torch.save`` pickles it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __reduce__(self):
        os.kill(os.getpid(), self.signum)
        return (int, (3,))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_a_checkpoint_is_written_stops_once_it_is_on_disk(tmp_path, signum,
                                                                              capsys):
    """SIGTERM (a cluster's pre-emption) or Ctrl-C while the checkpoint is written (Pong's is
    840 MB): the launcher's handler runs once the checkpoint is in place. Inside ``torch.save``
    the interrupted zip writer had turned it into a RuntimeError (a traceback instead of the
    one-line stop) and left a partial ``state.pt.tmp.tmp``."""

    class Stop(Exception):
        pass

    def stop(got, frame):
        raise Stop(got)

    previous = signal.signal(signum, stop)
    try:
        with pytest.raises(Stop):
            save_checkpoint({"step": 7, "x": _SignalsWhilePickled(signum),
                             "big": np.zeros(100_000)}, tmp_path)
        assert signal.getsignal(signum) is stop  # the launcher's handler is back
    finally:
        signal.signal(signum, previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt", "state.pt.sha256"]
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    assert state["step"] == 7 and state["x"] == 3
    assert capsys.readouterr().err.strip() == \
        "themis: stopping once the checkpoint being written is on disk"


def test_a_crash_at_any_step_of_save_checkpoint_leaves_an_intact_checkpoint(tmp_path,
                                                                             monkeypatch):
    """Every rename of a checkpoint save fails in turn: resume then finds the new checkpoint or
    the one before it, and the next save leaves two intact ones again."""
    import shutil

    from themis.run.checkpoint import _verify

    base = tmp_path / "base"
    for step in (1, 2):
        save_checkpoint({"step": step, "w": torch.full((3,), float(step))}, base)
    shutil.copytree(base, tmp_path / "count")
    calls = _crash_at(monkeypatch, 10 ** 6)  # count the renames of one save
    save_checkpoint({"step": 3}, tmp_path / "count")
    renames = calls[0]
    monkeypatch.undo()
    assert renames >= 3
    for k in range(renames + 1):
        ckpt = tmp_path / f"crash{k}"
        shutil.copytree(base, ckpt)
        _crash_at(monkeypatch, k)
        if k < renames:
            with pytest.raises(OSError, match="simulated crash"):
                save_checkpoint({"step": 3}, ckpt)
        else:
            save_checkpoint({"step": 3}, ckpt)
        monkeypatch.undo()
        state, _ = load_checkpoint(ckpt)
        assert state["step"] in (2, 3), k
        if k == renames:
            assert state["step"] == 3
        save_checkpoint({"step": 4}, ckpt)  # the run goes on after its resume
        assert load_checkpoint(ckpt)[0]["step"] == 4
        assert _verify(ckpt / "state.pt") and _verify(ckpt / "state.prev.pt"), k


def test_a_checkpoint_renamed_without_its_checksum_by_an_earlier_version_still_loads(tmp_path):
    """Earlier versions renamed ``state.pt`` to ``state.prev.pt`` and then its ``.sha256``: a
    crash between the two left an intact file beside the other one's checksum."""
    save_checkpoint({"step": 1}, tmp_path)
    save_checkpoint({"step": 2}, tmp_path)
    os.replace(tmp_path / "state.pt", tmp_path / "state.prev.pt")  # the first rename only
    state, path = load_checkpoint(tmp_path)
    assert state["step"] == 2 and path.name == "state.prev.pt"
    save_checkpoint({"step": 3}, tmp_path)  # the next save repairs the checksums
    os.remove(tmp_path / "state.pt")
    assert load_checkpoint(tmp_path)[0]["step"] == 2


def test_agent_and_reward_model_files_survive_a_crash_while_they_are_written(compose, tmp_path,
                                                                             monkeypatch):
    import io

    from themis.builder import make_workspace
    from themis.core.safe_loading import safe_load
    from themis.reward import load_reward_model

    ws = make_workspace(compose(TINY_PENDULUM), tmp_path)
    ws.save_checkpoints()
    ws.step = 123
    real = torch.save

    def torn(obj, f, *args, **kwargs):  # half the bytes reach the file, then the crash
        buffer = io.BytesIO()
        real(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()[: len(buffer.getvalue()) // 2]
        if hasattr(f, "write"):
            f.write(data)
        else:
            with open(f, "wb") as out:
                out.write(data)
        raise OSError("simulated crash")

    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(OSError, match="simulated crash"):
        ws.save_checkpoints()
    with pytest.raises(OSError, match="simulated crash"):
        from themis.reward import save_reward_model
        save_reward_model(ws.learner.model, tmp_path / "checkpoints" / "reward_model.pt")
    monkeypatch.undo()
    assert safe_load(tmp_path / "checkpoints" / "agent.pt")["step"] == 0
    load_reward_model(tmp_path)  # the previous one, whole
    ws.logger.close()


@pytest.mark.slow
def test_ctrl_c_prints_one_line_and_the_run_resumes_from_it(tmp_path):
    import re
    import signal

    import pexpect

    run = tmp_path / "run"
    # 2400 steps: a Ctrl-C that arrives late (a loaded machine) still lands inside the run;
    # SIGINT with Python's handler in place, as in a terminal (a test runner started in the
    # background, e.g. `.ci/run &`, passes SIGINT ignored to its children)
    child = pexpect.spawn(str(ROOT / "themis_train.sh"),
                          [*TINY_PENDULUM, "num_train_steps=2400", "checkpoint_frequency=300",
                           f"hydra.run.dir={run}"],
                          cwd=str(ROOT), env={**os.environ, "THEMIS_THREADS": "1"},
                          encoding="utf-8", timeout=300, dimensions=(50, 200),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    child.expect_exact("step 800")  # past the checkpoints of steps 400 and 700
    child.sendintr()  # Ctrl-C in the terminal
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    tail = child.before[child.before.rindex("^C"):]
    lines = [line for line in re.split(r"[\r\n]+", tail) if line.strip(" ^C")]
    assert len(lines) == 1, tail
    found = re.fullmatch(r"themis: stopped at step (\d+); last checkpoint at step (\d+); "
                         r"continue with \./themis_train\.sh resume=(\S+)", lines[0].strip())
    assert found, lines[0]
    stopped, last = int(found.group(1)), int(found.group(2))
    # 700, or a later one when a loaded machine let the run pass it before the Ctrl-C arrived
    assert stopped >= 800 and 700 <= last <= stopped
    assert found.group(3) == str(run.resolve())

    resumed = launch("themis_train.sh", f"resume={found.group(3)}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and f"at step {last}" in resumed.stdout
    assert pd.read_csv(run / "eval.csv")["step"].tolist() == [600, 1200, 1800, 2400]


def test_sigterm_stops_a_run_as_ctrl_c_does_and_it_resumes(tmp_path):
    """A cluster's pre-emption (SIGTERM): the Ctrl-C line and exit code 143, not a silent
    death (issue 85 item 16). Sent once the first checkpoint (step 300) is on disk, it lands
    long before the run's 1200 steps end."""
    run = tmp_path / "run"
    proc = subprocess.Popen([str(ROOT / "themis_train.sh"), *TINY_PENDULUM,
                             "checkpoint_frequency=300",
                             f"hydra.run.dir={run}"], cwd=ROOT,
                            env={**os.environ, "THEMIS_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (run / "checkpoints" / "state.pt.sha256").exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("themis:")]
    assert len(lines) == 1 and "continue with ./themis_train.sh resume=" in lines[0], err
    resumed = launch("themis_train.sh", f"resume={run}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert pd.read_csv(run / "eval.csv")["step"].tolist() == [600, 1200]


def test_resume_messages_point_the_right_way(tmp_path):
    """Issue 85 item 14: a smaller num_train_steps, another env, and a run stopped before its
    first checkpoint each get a line that says what to do."""
    run = tmp_path / "run"
    done = launch("themis_train.sh", *TINY_PENDULUM, "checkpoint_frequency=400",
                  f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-2000:]
    (run / "checkpoints" / "agent.pt").unlink()  # as if killed before its end
    smaller = launch("themis_train.sh", f"resume={run}", "num_train_steps=700")
    assert smaller.returncode == 2
    assert "this run is at step 1200; num_train_steps=700 must be larger" in smaller.stderr
    other = launch("themis_train.sh", f"resume={run}", "env=HalfCheetah-v5")
    assert other.returncode == 2
    assert "a resumed run keeps its env (env=Pendulum-v1)" in other.stderr
    early = tmp_path / "early"
    early.mkdir()
    (early / "config.yaml").write_text((run / "config.yaml").read_text())
    (early / "config.yaml.owner").write_text((run / "config.yaml.owner").read_text())
    start = launch("themis_train.sh", f"resume={early}")
    assert start.returncode == 2
    assert "stopped before its first checkpoint" in start.stderr
    assert "run its command again to start over" in start.stderr
    for out in (smaller, other, start):
        assert out.stderr.strip().count("\n") == 0, out.stderr
